//! Finding our own cgroups from `/proc/self/mountinfo` and `/proc/self/cgroup`
//! (never by guessing paths). Pure parsing; the callers read the files.

use std::path::PathBuf;

/// One cgroup filesystem mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Path inside the hierarchy that is mounted (mountinfo field 4).
    pub root: String,
    pub mount_point: PathBuf,
    /// `true` for cgroup2.
    pub v2: bool,
    /// Super options (for v1: the controllers, e.g. `memory`, `name=systemd`).
    pub options: Vec<String>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
pub(crate) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup and cgroup2 mounts listed in a mountinfo text.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = *post.first()?;
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                root: unescape(pre.get(3)?),
                mount_point: PathBuf::from(unescape(pre.get(4)?)),
                v2,
                options: post
                    .get(2)
                    .map(|o| o.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub hierarchy: u32,
    /// Empty for the cgroup2 line.
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn memberships(proc_cgroup: &str) -> Vec<Membership> {
    proc_cgroup
        .lines()
        .filter_map(|line| {
            let mut it = line.splitn(3, ':');
            let hierarchy = it.next()?.parse().ok()?;
            let controllers = it.next()?;
            let path = it.next()?.to_owned();
            Some(Membership {
                hierarchy,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path,
            })
        })
        .collect()
}

/// Joins a mount point and a cgroup path that is relative to the hierarchy's
/// root, taking into account a mount of a sub-tree (mount root ≠ `/`).
fn group_dir(mount: &CgroupMount, path: &str) -> PathBuf {
    let rel = if mount.root != "/" {
        path.strip_prefix(mount.root.as_str()).unwrap_or(path)
    } else {
        path
    };
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rel)
    }
}

/// Our own group directory in the v1 hierarchy holding `controller`.
pub fn v1_group(
    mounts: &[CgroupMount],
    members: &[Membership],
    controller: &str,
) -> Option<PathBuf> {
    let mount = mounts
        .iter()
        .find(|m| !m.v2 && m.options.iter().any(|o| o == controller))?;
    let member = members
        .iter()
        .find(|m| m.hierarchy != 0 && m.controllers.iter().any(|c| c == controller))?;
    Some(group_dir(mount, &member.path))
}

/// Our own group directory in the cgroup2 hierarchy.
pub fn v2_group(mounts: &[CgroupMount], members: &[Membership]) -> Option<PathBuf> {
    let mount = mounts.iter().find(|m| m.v2)?;
    let member = members
        .iter()
        .find(|m| m.hierarchy == 0 && m.controllers.is_empty())?;
    Some(group_dir(mount, &member.path))
}

/// Controllers listed in a `cgroup.controllers` file.
pub fn parse_controllers(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

/// The value of `key` in a flat keyed file such as `memory.events` or
/// `memory.oom_control` (`key value` lines).
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(char::is_whitespace)?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/18617d86
1:cpu:/
0::/
";

    #[test]
    fn hybrid_host_resolves_v1_memory_and_pids_groups() {
        let mounts = cgroup_mounts(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 5);
        let members = memberships(HYBRID_CGROUP);
        assert_eq!(
            v1_group(&mounts, &members, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/18617d86"))
        );
        assert_eq!(
            v1_group(&mounts, &members, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(v1_group(&mounts, &members, "cpuset"), None);
        assert_eq!(
            v2_group(&mounts, &members),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn pure_v2_host_resolves_the_unified_group() {
        let mounts = cgroup_mounts(
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        );
        let members = memberships("0::/system.slice/kiln.service\n");
        assert_eq!(
            v2_group(&mounts, &members),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/kiln.service"))
        );
        assert_eq!(v1_group(&mounts, &members, "memory"), None);
    }

    #[test]
    fn subtree_mount_strips_the_mount_root() {
        let mounts = cgroup_mounts(
            "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
        );
        let members = memberships("4:memory:/docker/abc/inner\n");
        assert_eq!(
            v1_group(&mounts, &members, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/inner"))
        );
    }

    #[test]
    fn escaped_mount_points_are_unescaped() {
        let mounts = cgroup_mounts("35 31 0:32 / /sys/fs/cg\\040roup rw - cgroup2 cgroup2 rw\n");
        assert_eq!(mounts[0].mount_point, PathBuf::from("/sys/fs/cg roup"));
    }

    #[test]
    fn keyed_values_are_found_by_exact_key() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(oom, "oom_kill"), Some(3));
        assert_eq!(keyed_value(oom, "oom"), None);
        let events = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(1));
    }

    #[test]
    fn controllers_are_split_on_whitespace() {
        assert_eq!(
            parse_controllers("cpuset cpu io memory pids\n"),
            vec!["cpuset", "cpu", "io", "memory", "pids"]
        );
    }
}
