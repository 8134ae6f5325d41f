//! The jail's filesystem as data: an ordered list of [`Op`]s derived from the
//! [`JailSpec`] and a few facts about the host's layout, and the Landlock
//! rules ([`landlock_rules`]) that match it. The jail's starter builds both before
//! cloning (as host root, single-threaded); the jail's init executes the plan
//! (see `rootfs.rs`) and the user program's process applies the rules (see
//! `confine.rs`). Keeping them data lets the layout be tested without
//! privileges.

use std::path::{Path, PathBuf};

use crate::spec::JailSpec;
use crate::sys::{MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// Read-only, no setuid, no device nodes.
pub const RO: u64 = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

/// Where a bind mount's source lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A host path (resolved before `pivot_root`).
    Host(PathBuf),
    /// A path inside the jail being built (e.g. `/proc/sys` of the new procfs).
    Jail(PathBuf),
}

/// One step of building the root. Every `path`/`dst` is absolute inside the
/// jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Dir {
        path: PathBuf,
        mode: u32,
    },
    Symlink {
        path: PathBuf,
        target: PathBuf,
    },
    File {
        path: PathBuf,
        contents: String,
    },
    /// Bind `src` on `dst`, then set `attrs` (MOUNT_ATTR_*) on it (and on
    /// every mount below when `recursive`). The mount point is created
    /// unless `only_if_dst_exists`, in which case a missing `dst` skips it.
    Bind {
        src: Source,
        dst: PathBuf,
        recursive: bool,
        attrs: u64,
        only_if_dst_exists: bool,
    },
    Tmpfs {
        dst: PathBuf,
        options: String,
        attrs: u64,
    },
    Proc {
        dst: PathBuf,
        /// A kept jail (`JailSpec::keep`): each of its programs makes a
        /// cgroup namespace of its own.
        kept: bool,
    },
    /// Set attributes on an existing mount (not recursive).
    SetAttr {
        dst: PathBuf,
        attrs: u64,
    },
}

/// What the user program may do beneath one path once Landlock is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PathAccess {
    /// Read files, list directories, execute (runtimes, `/etc`).
    ReadExec,
    /// Read, and write to existing files (procfs: `/proc/self/...`).
    Proc,
    /// Read, write, truncate and ioctl on the few device nodes.
    Devices,
    /// Everything, including creating, removing and executing files (the
    /// mount options still apply: `/tmp` stays `noexec`).
    ReadWrite,
}

/// File types of host paths the plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// The host facts the plan needs (real filesystem in production, a table in
/// tests).
pub trait HostView {
    /// Type of `path` without following a final symlink; `None` if absent.
    fn kind(&self, path: &Path) -> Option<Kind>;
    fn read_link(&self, path: &Path) -> Option<PathBuf>;
}

/// The real host.
pub struct RealHost;

impl HostView for RealHost {
    fn kind(&self, path: &Path) -> Option<Kind> {
        let m = std::fs::symlink_metadata(path).ok()?;
        let t = m.file_type();
        Some(if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else {
            Kind::File
        })
    }

    fn read_link(&self, path: &Path) -> Option<PathBuf> {
        std::fs::read_link(path).ok()
    }
}

pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
sandbox:x:1000:1000:sandbox:/mnt/data:/bin/bash\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
pub const GROUP: &str = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n";
pub const HOSTNAME: &str = "sandbox";
pub const HOSTS: &str = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
pub const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files\n\
networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n";
/// A constant machine id: reveals nothing about the host.
pub const MACHINE_ID: &str = "00000000000000000000000000000000\n";

/// Top-level names that a merged-/usr host has as symlinks into `/usr`.
const USR_LINKS: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Other top-level links a runtime image may have, replicated when they are links: the
/// image's globally installed JavaScript packages (`/node_modules` → `usr/local/lib/…`), which
/// node's module resolution reaches from any script's directory.
const ROOT_LINKS: &[&str] = &["node_modules"];
/// Device nodes bound from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];
/// procfs entries hidden behind `/dev/null`.
const PROC_MASKED: &[&str] = &[
    "kcore",
    "sysrq-trigger",
    "keys",
    "kallsyms",
    "timer_list",
    "sched_debug",
    "latency_stats",
];
/// procfs directories made read-only.
const PROC_READONLY: &[&str] = &["sys", "irq", "bus", "fs"];

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

/// A single path component that is not hidden and not `..`.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\0'])
}

/// The host path a jail's absolute `path` comes from: the same path, or the
/// same path beneath a runtime image's root.
pub fn source_of(image_root: Option<&Path>, path: &Path) -> PathBuf {
    match image_root {
        Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

/// Builds the ordered plan for `spec`.
pub fn build(spec: &JailSpec, host: &impl HostView) -> Vec<Op> {
    let mut ops = Vec::new();
    let ro_bind = |src: PathBuf, dst: PathBuf| Op::Bind {
        src: Source::Host(src),
        dst,
        recursive: true,
        attrs: RO,
        only_if_dst_exists: false,
    };
    // the runtime image's root, or the host's: where /usr and /etc entries come from
    let source = |path: &Path| source_of(spec.image_root.as_deref(), path);

    // Runtimes, read-only.
    for b in &spec.ro_binds {
        ops.push(ro_bind(source(b), b.clone()));
    }
    // Merged /usr: replicate the top-level symlinks; bind real directories
    // that ro_binds do not already cover.
    for name in USR_LINKS {
        let path = Path::new("/").join(name);
        match host.kind(&source(&path)) {
            Some(Kind::Symlink) => {
                if let Some(target) = host.read_link(&source(&path)) {
                    ops.push(Op::Symlink { path, target });
                }
            }
            Some(Kind::Dir) if !spec.ro_binds.iter().any(|b| path.starts_with(b)) => {
                ops.push(ro_bind(source(&path), path));
            }
            _ => {}
        }
    }
    for name in ROOT_LINKS {
        let path = Path::new("/").join(name);
        if host.kind(&source(&path)) == Some(Kind::Symlink)
            && let Some(target) = host.read_link(&source(&path))
        {
            ops.push(Op::Symlink { path, target });
        }
    }

    // /etc: our own files plus selected host entries; never the whole /etc.
    ops.push(Op::Dir {
        path: p("/etc"),
        mode: 0o755,
    });
    for (name, contents) in [
        ("passwd", PASSWD),
        ("group", GROUP),
        ("hostname", "sandbox\n"),
        ("hosts", HOSTS),
        ("nsswitch.conf", NSSWITCH),
        ("resolv.conf", ""),
        ("machine-id", MACHINE_ID),
    ] {
        ops.push(Op::File {
            path: Path::new("/etc").join(name),
            contents: contents.to_owned(),
        });
    }
    for name in &spec.etc_binds {
        let path = Path::new("/etc").join(name);
        match host.kind(&source(&path)) {
            Some(Kind::Symlink) => {
                if let Some(target) = host.read_link(&source(&path)) {
                    ops.push(Op::Symlink { path, target });
                }
            }
            Some(Kind::Dir | Kind::File) => ops.push(ro_bind(source(&path), path)),
            None => {}
        }
    }

    // Files the run's runtime needs (a warm-start bootstrap), read-only.
    let etc_files: Vec<_> = spec
        .etc_files
        .iter()
        .filter(|(name, _)| is_plain_name(name))
        .collect();
    if !etc_files.is_empty() {
        ops.push(Op::Dir {
            path: p("/etc/kiln"),
            mode: 0o755,
        });
        for (name, contents) in etc_files {
            ops.push(Op::File {
                path: Path::new("/etc/kiln").join(name),
                contents: contents.clone(),
            });
        }
    }

    // The workspace, read-write.
    ops.push(Op::Dir {
        path: p("/mnt"),
        mode: 0o755,
    });
    ops.push(Op::Bind {
        src: Source::Host(spec.workspace.clone()),
        dst: p("/mnt/data"),
        recursive: false,
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        only_if_dst_exists: false,
    });
    // A persistent project's working copy, read-write.
    if let Some(project) = &spec.project {
        ops.push(Op::Dir {
            path: p(crate::PROJECT_DIR),
            mode: 0o755,
        });
        ops.push(Op::Bind {
            src: Source::Host(project.clone()),
            dst: p(crate::PROJECT_DIR),
            recursive: false,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            only_if_dst_exists: false,
        });
    }

    // Private /tmp: writable, never executable.
    let tmp = spec.limits.tmp_bytes;
    ops.push(Op::Tmpfs {
        dst: p("/tmp"),
        options: format!("size={tmp},mode=1777"),
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
    });

    // /dev: a few host nodes, the usual symlinks, /dev/shm.
    ops.push(Op::Tmpfs {
        dst: p("/dev"),
        options: "size=64k,mode=755".to_owned(),
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
    });
    for d in DEVICES {
        let path = Path::new("/dev").join(d);
        ops.push(Op::Bind {
            src: Source::Host(path.clone()),
            dst: path,
            recursive: false,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            only_if_dst_exists: false,
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(Op::Symlink {
            path: Path::new("/dev").join(name),
            target: p(target),
        });
    }
    ops.push(Op::Tmpfs {
        dst: p("/dev/shm"),
        options: format!("size={tmp},mode=1777"),
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
    });
    ops.push(Op::SetAttr {
        dst: p("/dev"),
        attrs: MOUNT_ATTR_RDONLY,
    });

    // A fresh procfs for the jail's pid namespace, with sensitive entries
    // masked and kernel tunables read-only.
    ops.push(Op::Proc {
        dst: p("/proc"),
        kept: spec.keep,
    });
    for m in PROC_MASKED {
        ops.push(Op::Bind {
            src: Source::Host(p("/dev/null")),
            dst: Path::new("/proc").join(m),
            recursive: false,
            attrs: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            only_if_dst_exists: true,
        });
    }
    for d in PROC_READONLY {
        let path = Path::new("/proc").join(d);
        ops.push(Op::Bind {
            src: Source::Jail(path.clone()),
            dst: path,
            recursive: true,
            attrs: RO | MOUNT_ATTR_NOEXEC,
            only_if_dst_exists: true,
        });
    }
    ops
}

/// The Landlock rules for a plan: read and execute beneath every read-only
/// host bind outside `/etc`, `/dev` and `/proc` (the runtimes) and beneath
/// `/etc`; procfs and the device nodes as such; read-write beneath the
/// workspace, `/tmp` and `/dev/shm`. Nothing else — not `/` itself, not
/// `/mnt` — is reachable.
pub fn landlock_rules(ops: &[Op]) -> Vec<(PathBuf, PathAccess)> {
    let mut rules = Vec::new();
    let special = |p: &Path| ["/etc", "/dev", "/proc"].iter().any(|s| p.starts_with(s));
    for op in ops {
        let rule = match op {
            Op::Bind {
                src: Source::Host(_),
                dst,
                attrs,
                ..
            } if attrs & MOUNT_ATTR_RDONLY != 0 && !special(dst) => {
                Some((dst.clone(), PathAccess::ReadExec))
            }
            Op::Bind {
                src: Source::Host(_),
                dst,
                ..
            } if dst == Path::new("/mnt/data") || dst == Path::new(crate::PROJECT_DIR) => {
                Some((dst.clone(), PathAccess::ReadWrite))
            }
            Op::Dir { path, .. } if path == Path::new("/etc") => {
                Some((path.clone(), PathAccess::ReadExec))
            }
            Op::Tmpfs { dst, .. } if dst == Path::new("/dev") => {
                Some((dst.clone(), PathAccess::Devices))
            }
            Op::Tmpfs { dst, .. } => Some((dst.clone(), PathAccess::ReadWrite)),
            Op::Proc { dst, .. } => Some((dst.clone(), PathAccess::Proc)),
            _ => None,
        };
        if let Some(rule) = rule
            && !rules.contains(&rule)
        {
            rules.push(rule);
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::spec::{CgroupAttach, JailLimits};

    struct FakeHost(HashMap<PathBuf, (Kind, Option<PathBuf>)>);

    impl HostView for FakeHost {
        fn kind(&self, path: &Path) -> Option<Kind> {
            self.0.get(path).map(|(k, _)| *k)
        }
        fn read_link(&self, path: &Path) -> Option<PathBuf> {
            self.0.get(path).and_then(|(_, t)| t.clone())
        }
    }

    fn merged_usr_host() -> FakeHost {
        let mut m = HashMap::new();
        for (n, t) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            m.insert(Path::new("/").join(n), (Kind::Symlink, Some(p(t))));
        }
        m.insert(p("/etc/ssl"), (Kind::Dir, None));
        m.insert(p("/etc/ld.so.cache"), (Kind::File, None));
        m.insert(
            p("/etc/localtime"),
            (Kind::Symlink, Some(p("/usr/share/zoneinfo/Etc/UTC"))),
        );
        FakeHost(m)
    }

    fn spec() -> JailSpec {
        JailSpec {
            root_dir: p("/run/kiln/root"),
            ro_binds: vec![p("/usr")],
            etc_binds: vec![
                "ssl".into(),
                "ld.so.cache".into(),
                "localtime".into(),
                "absent".into(),
            ],
            image_root: None,
            workspace: p("/data/ws/1"),
            project: None,
            argv: vec!["/bin/true".into()],
            env: vec![],
            id_base: 200_000,
            limits: JailLimits {
                wall_ms: 1000,
                cpu_secs: 1,
                open_files: 64,
                file_size_bytes: 1 << 20,
                nproc: 16,
                tmp_bytes: 1 << 20,
            },
            cgroup: Some(CgroupAttach::V1 { procs: vec![] }),
            seccomp_filters: Some(vec![]),
            landlock: true,
            park: None,
            etc_files: vec![],
            network: None,
            slot_netns: None,
            keep: false,
        }
    }

    fn binds(ops: &[Op]) -> Vec<(&Source, &Path, u64)> {
        ops.iter()
            .filter_map(|o| match o {
                Op::Bind {
                    src, dst, attrs, ..
                } => Some((src, dst.as_path(), *attrs)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn merged_usr_symlinks_are_replicated_not_bound() {
        let ops = build(&spec(), &merged_usr_host());
        assert!(ops.contains(&Op::Symlink {
            path: p("/bin"),
            target: p("usr/bin")
        }));
        assert!(ops.contains(&Op::Symlink {
            path: p("/lib64"),
            target: p("usr/lib64")
        }));
        assert!(!binds(&ops).iter().any(|(_, d, _)| *d == Path::new("/bin")));
    }

    #[test]
    fn split_usr_host_gets_its_bin_bound_read_only() {
        let mut host = merged_usr_host();
        host.0.insert(p("/bin"), (Kind::Dir, None));
        let ops = build(&spec(), &host);
        assert!(binds(&ops).contains(&(&Source::Host(p("/bin")), Path::new("/bin"), RO)));
    }

    #[test]
    fn etc_is_ours_with_only_listed_existing_host_entries() {
        let ops = build(&spec(), &merged_usr_host());
        let etc_binds: Vec<_> = binds(&ops)
            .into_iter()
            .filter(|(_, d, _)| d.starts_with("/etc"))
            .collect();
        assert_eq!(
            etc_binds,
            vec![
                (&Source::Host(p("/etc/ssl")), Path::new("/etc/ssl"), RO),
                (
                    &Source::Host(p("/etc/ld.so.cache")),
                    Path::new("/etc/ld.so.cache"),
                    RO
                ),
            ]
        );
        assert!(ops.contains(&Op::Symlink {
            path: p("/etc/localtime"),
            target: p("/usr/share/zoneinfo/Etc/UTC")
        }));
        assert!(ops.contains(&Op::File {
            path: p("/etc/passwd"),
            contents: PASSWD.into()
        }));
        assert!(
            !binds(&ops)
                .iter()
                .any(|(s, _, _)| **s == Source::Host(p("/etc")))
        );
    }

    #[test]
    fn an_images_node_modules_link_reaches_the_jail_and_a_directory_of_that_name_does_not() {
        let img = p("/var/lib/kiln/runtimes/recipe-0123456789abcdef/rootfs");
        let mut host = merged_usr_host();
        host.0.insert(
            img.join("node_modules"),
            (Kind::Symlink, Some(p("usr/local/lib/node_modules"))),
        );
        let mut sp = spec();
        sp.image_root = Some(img.clone());
        let links = |ops: &[Op]| -> Vec<(PathBuf, PathBuf)> {
            ops.iter()
                .filter_map(|o| match o {
                    Op::Symlink { path, target } if path == Path::new("/node_modules") => {
                        Some((path.clone(), target.clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            links(&build(&sp, &host)),
            vec![(p("/node_modules"), p("usr/local/lib/node_modules"))]
        );
        // a real directory there (a host's, or an image's) is not bound into jails
        host.0.insert(img.join("node_modules"), (Kind::Dir, None));
        let ops = build(&sp, &host);
        assert!(links(&ops).is_empty());
        assert!(
            binds(&ops)
                .iter()
                .all(|(_, d, _)| !d.starts_with("/node_modules"))
        );
    }

    #[test]
    fn with_an_image_usr_links_and_etc_entries_come_from_the_image_only() {
        let img = p("/var/lib/kiln/runtimes/recipe-0123456789abcdef/rootfs");
        // the host has its own /usr, links and /etc entries; the image has others
        let mut host = merged_usr_host();
        host.0.insert(p("/etc/java-17-openjdk"), (Kind::Dir, None));
        for (n, t) in [("bin", "usr/bin"), ("lib64", "usr/lib64")] {
            host.0.insert(img.join(n), (Kind::Symlink, Some(p(t))));
        }
        host.0.insert(img.join("etc/ssl"), (Kind::Dir, None));
        host.0
            .insert(img.join("etc/java-21-openjdk"), (Kind::Dir, None));
        let mut sp = spec();
        sp.image_root = Some(img.clone());
        sp.etc_binds
            .extend(["java-17-openjdk".into(), "java-21-openjdk".into()]);
        let ops = build(&sp, &host);
        let host_sources: Vec<_> = binds(&ops)
            .into_iter()
            .filter_map(|(s, d, _)| match s {
                Source::Host(s) if !d.starts_with("/dev") && !d.starts_with("/proc") => {
                    Some((s.clone(), d.to_path_buf()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            host_sources,
            vec![
                (img.join("usr"), p("/usr")),
                (img.join("etc/ssl"), p("/etc/ssl")),
                (img.join("etc/java-21-openjdk"), p("/etc/java-21-openjdk")),
                (p("/data/ws/1"), p("/mnt/data")),
            ]
        );
        let links: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Symlink { path, target } if !path.starts_with("/dev") => {
                    Some((path.clone(), target.clone()))
                }
                _ => None,
            })
            .collect();
        // the host's /lib and /sbin links and its /etc/localtime are not the image's
        assert_eq!(
            links,
            vec![(p("/bin"), p("usr/bin")), (p("/lib64"), p("usr/lib64"))]
        );
    }

    #[test]
    fn workspace_is_the_only_writable_host_bind() {
        let ops = build(&spec(), &merged_usr_host());
        let writable: Vec<_> = binds(&ops)
            .into_iter()
            .filter(|(s, _, a)| matches!(s, Source::Host(_)) && a & MOUNT_ATTR_RDONLY == 0)
            .map(|(_, d, _)| d.to_path_buf())
            .collect();
        let devices: Vec<PathBuf> = DEVICES.iter().map(|d| Path::new("/dev").join(d)).collect();
        let non_device: Vec<_> = writable.iter().filter(|d| !devices.contains(d)).collect();
        assert_eq!(non_device, vec![&p("/mnt/data")]);
    }

    #[test]
    fn a_project_is_bound_read_write_at_workspace_and_reachable_by_landlock() {
        let mut sp = spec();
        sp.project = Some(p("/data/ws/p1"));
        let ops = build(&sp, &merged_usr_host());
        assert!(ops.contains(&Op::Bind {
            src: Source::Host(p("/data/ws/p1")),
            dst: p("/workspace"),
            recursive: false,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            only_if_dst_exists: false,
        }));
        assert!(
            landlock_rules(&ops).contains(&(p("/workspace"), PathAccess::ReadWrite)),
            "landlock lets the program write its project"
        );
        // without a project there is no /workspace at all
        let plain = build(&spec(), &merged_usr_host());
        assert!(!plain.iter().any(|o| matches!(o,
            Op::Dir { path, .. } | Op::Bind { dst: path, .. } if path == Path::new("/workspace"))));
    }

    #[test]
    fn tmp_is_noexec_and_sized_from_the_limits() {
        let ops = build(&spec(), &merged_usr_host());
        assert!(ops.contains(&Op::Tmpfs {
            dst: p("/tmp"),
            options: "size=1048576,mode=1777".into(),
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        }));
    }

    #[test]
    fn proc_is_mounted_before_it_is_masked() {
        let ops = build(&spec(), &merged_usr_host());
        let proc_at = ops
            .iter()
            .position(|o| matches!(o, Op::Proc { dst, .. } if dst == Path::new("/proc")))
            .expect("proc mounted");
        let kcore_at = ops
            .iter()
            .position(|o| matches!(o, Op::Bind { dst, .. } if dst == Path::new("/proc/kcore")))
            .expect("kcore masked");
        assert!(proc_at < kcore_at);
        assert!(ops.iter().any(|o| matches!(o,
            Op::Bind { src: Source::Jail(s), dst, attrs, .. }
                if s == Path::new("/proc/sys") && dst == Path::new("/proc/sys") && attrs & MOUNT_ATTR_RDONLY != 0)));
    }

    #[test]
    fn landlock_reaches_runtimes_etc_proc_dev_and_the_writable_mounts_only() {
        let mut host = merged_usr_host();
        host.0.insert(p("/lib64"), (Kind::Dir, None));
        let mut sp = spec();
        sp.ro_binds.push(p("/opt/R"));
        let rules = landlock_rules(&build(&sp, &host));
        let expect = [
            ("/usr", PathAccess::ReadExec),
            ("/opt/R", PathAccess::ReadExec),
            ("/lib64", PathAccess::ReadExec),
            ("/etc", PathAccess::ReadExec),
            ("/mnt/data", PathAccess::ReadWrite),
            ("/tmp", PathAccess::ReadWrite),
            ("/dev", PathAccess::Devices),
            ("/dev/shm", PathAccess::ReadWrite),
            ("/proc", PathAccess::Proc),
        ];
        let mut got: Vec<(String, PathAccess)> = rules
            .iter()
            .map(|(path, a)| (path.display().to_string(), *a))
            .collect();
        let mut want: Vec<(String, PathAccess)> = expect
            .iter()
            .map(|(path, a)| ((*path).to_owned(), *a))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want);
        // Not `/`, not `/mnt`, and no /etc entry, masked /proc file or
        // device node widened on its own: the list above is exhaustive.
    }
}
