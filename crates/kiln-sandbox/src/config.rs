//! Sandbox configuration and its defaults.

use std::path::{Component, Path, PathBuf};

use kiln_core::Language;

use crate::error::SandboxError;
use crate::quota::QuotaMode;
use crate::spec::ID_RANGE;

/// Host `/etc` entries bound read-only into every jail when they exist.
pub const DEFAULT_ETC_BINDS: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "fonts",
    "mime.types",
    "localtime",
    "python3",
    "python3.11",
    "matplotlibrc",
    "java-17-openjdk",
    "R",
    "magic",
    "magic.mime",
    "gai.conf",
    "ldc2.conf",
    "php",
];

/// The system one language's jails run from, when it is not the default
/// one (see [`SandboxConfig::language_images`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanguageImage {
    pub language: Language,
    /// Its runtime image's root filesystem; `None`: the host's.
    pub image_root: Option<PathBuf>,
    /// Names under that system's `/etc` bound read-only when present.
    pub etc_binds: Vec<String>,
}

/// What a jail's mounts come from: a runtime image's root (`None`: the
/// host's `/`) and the `/etc` entries bound from beneath it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JailSystem<'a> {
    pub image_root: Option<&'a Path>,
    pub etc_binds: &'a [String],
}

impl JailSystem<'_> {
    /// Where a jail's `path` (absolute, as the jail sees it) comes from on
    /// the host: beneath the image when there is one.
    pub fn source_of(&self, path: &Path) -> PathBuf {
        crate::jail::plan::source_of(self.image_root, path)
    }
}

/// Smallest workspace filesystem accepted (ext4 needs a few MiB itself).
pub const MIN_WORKSPACE_BYTES: u64 = 16 << 20;
/// Smallest inode count accepted.
pub const MIN_WORKSPACE_INODES: u64 = 128;

/// How jails are built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Binary run as `<helper> __jail` (the kiln binary itself).
    pub helper: PathBuf,
    /// Empty directory used as the jail root's mount point (created if
    /// missing). Every ancestor must be searchable by others (`o+x`).
    pub root_dir: PathBuf,
    /// First host uid/gid of slot 0.
    pub uid_base: u32,
    /// Number of uid ranges = maximum number of concurrent jails.
    pub slots: u32,
    /// How many of `slots` (the last ones) are kept for live kernels
    /// ([`crate::Sandbox::acquire_kernel_slot`]): their workspace
    /// filesystems exist only while a kernel holds them.
    pub kernel_slots: u32,
    /// Host directories bound read-only at the same path.
    pub ro_binds: Vec<PathBuf>,
    /// Names under the host's `/etc` bound read-only when present.
    pub etc_binds: Vec<String>,
    /// A runtime image's root filesystem: jails take `ro_binds`, the
    /// merged-/usr links and `etc_binds` from beneath it instead of from the
    /// host (see `JailSpec::image_root`). `None`: the host's.
    pub image_root: Option<PathBuf>,
    /// Languages whose jails run from another system than `image_root` and
    /// `etc_binds` (the default one): their runs, parked jails, kernels and
    /// fork-servers take [`LanguageImage::image_root`] and its
    /// `etc_binds` instead. A language not listed takes the default.
    pub language_images: Vec<LanguageImage>,
    /// Directory of the slots' workspace filesystems (`<i>.img` images and
    /// `<i>/` mount points); created if missing, must be root's. `None`:
    /// `slots` next to `root_dir`.
    pub slots_dir: Option<PathBuf>,
    /// Size of each slot's workspace filesystem (the quota of one job).
    pub workspace_bytes: u64,
    /// Files and directories each slot's workspace filesystem can hold.
    pub workspace_inodes: u64,
    /// How the workspace quota is enforced.
    pub workspace_quota: QuotaMode,
    /// CPU quota of one run, in thousandths of a core (cgroup `cpu`
    /// controller; default one core).
    pub cpu_per_run_millis: u32,
    /// CPU quota of every run together, in thousandths of a core; `None`:
    /// all cores but half a core, which the server keeps (at least half a
    /// core). A run never gets more than this.
    pub cpu_all_runs_millis: Option<u32>,
    /// Development only: start even when a protection is missing (cgroup
    /// limits, seccomp, workspace quota), logging an ERROR per missing
    /// protection at start and a WARN per run. Namespaces and root remain
    /// required: without them there is no jail at all.
    pub allow_degraded: bool,
    /// Keep a one-shot `py` jail per fixed uid slot for the slot's next
    /// run (`sandbox/kept.rs`) instead of building a new one each time
    /// (where the host can: `probe::keep_jails_blocker`).
    pub keep_jails: bool,
    /// The file that must open for writing for jails to be kept: the one
    /// a kept jail's program writes (`/proc/sys/kernel/ns_last_pid`). Only
    /// tests name another, to stand for a host that refuses it.
    pub ns_last_pid: PathBuf,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            helper: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            root_dir: PathBuf::from("/run/kiln/jail-root"),
            uid_base: 200_000,
            slots: 4,
            kernel_slots: 0,
            ro_binds: vec![PathBuf::from("/usr")],
            etc_binds: DEFAULT_ETC_BINDS.iter().map(|s| (*s).to_owned()).collect(),
            image_root: None,
            language_images: Vec::new(),
            slots_dir: None,
            workspace_bytes: 1 << 30,
            workspace_inodes: 65_536,
            workspace_quota: QuotaMode::Auto,
            cpu_per_run_millis: 1000,
            cpu_all_runs_millis: None,
            allow_degraded: false,
            keep_jails: true,
            ns_last_pid: PathBuf::from(crate::probe::NS_LAST_PID),
        }
    }
}

fn is_clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Smallest CPU quota accepted, in thousandths of a core (the kernel's
/// minimum is 1 ms per 100 ms period).
pub const MIN_CPU_MILLIS: u32 = 10;

impl SandboxConfig {
    /// The CPU quotas runs get: `cpu_all_runs_millis` or all cores of this
    /// machine but half a core; one run gets at most that.
    pub fn cpu_limits(&self) -> crate::cgroup::CpuLimits {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = u32::try_from(cores * 1000)
            .unwrap_or(u32::MAX)
            .saturating_sub(500)
            .max(500);
        let all = self.cpu_all_runs_millis.unwrap_or(auto);
        crate::cgroup::CpuLimits {
            per_run_millis: self.cpu_per_run_millis.min(all),
            all_runs_millis: all,
        }
    }

    /// The system jails of `lang` run from: its entry of
    /// `language_images`, else (and for `None`, a jail of no language yet,
    /// such as a generic parked one) the default one.
    pub fn system_of(&self, lang: Option<Language>) -> JailSystem<'_> {
        match lang.and_then(|l| self.language_images.iter().find(|i| i.language == l)) {
            Some(i) => JailSystem {
                image_root: i.image_root.as_deref(),
                etc_binds: &i.etc_binds,
            },
            None => JailSystem {
                image_root: self.image_root.as_deref(),
                etc_binds: &self.etc_binds,
            },
        }
    }

    /// Every distinct system jails run from, the default one first, each
    /// with the first language (if any) that runs from it.
    pub fn systems(&self) -> Vec<(Option<Language>, JailSystem<'_>)> {
        let mut out = vec![(None, self.system_of(None))];
        for i in &self.language_images {
            let s = self.system_of(Some(i.language));
            if !out.iter().any(|(_, o)| *o == s) {
                out.push((Some(i.language), s));
            }
        }
        out
    }

    /// Where the slots' workspace filesystems live.
    pub fn slots_dir(&self) -> PathBuf {
        self.slots_dir.clone().unwrap_or_else(|| {
            self.root_dir
                .parent()
                .unwrap_or(Path::new("/"))
                .join("slots")
        })
    }

    /// Checks the values that do not need the host.
    pub fn validate(&self) -> Result<(), SandboxError> {
        let bad = |m: String| Err(SandboxError::Config(m));
        if self.slots == 0 {
            return bad("slots must be at least 1".into());
        }
        if self.kernel_slots >= self.slots {
            return bad(format!(
                "kernel_slots ({}) must leave at least one of the {} slots to runs",
                self.kernel_slots, self.slots
            ));
        }
        if self.uid_base == 0 {
            return bad("uid_base 0 would map the jail onto host root".into());
        }
        let end = u64::from(self.uid_base) + u64::from(self.slots) * u64::from(ID_RANGE);
        if end > u64::from(u32::MAX) {
            return bad(format!(
                "uid_base {} + {} slots x 65536 exceeds the uid space",
                self.uid_base, self.slots
            ));
        }
        let roots = self.language_images.iter().map(|i| &i.image_root);
        if let Some(r) = std::iter::once(&self.image_root)
            .chain(roots)
            .flatten()
            .find(|r| !is_clean_absolute(r) || *r == Path::new("/"))
        {
            return bad(format!(
                "image_root {} must be an absolute path other than / without . or ..",
                r.display()
            ));
        }
        if !is_clean_absolute(&self.root_dir) || self.root_dir == Path::new("/") {
            return bad(format!(
                "root_dir {} must be an absolute path other than /",
                self.root_dir.display()
            ));
        }
        for b in &self.ro_binds {
            if !is_clean_absolute(b) || b == Path::new("/") {
                return bad(format!(
                    "ro_bind {} must be an absolute path other than / without . or ..",
                    b.display()
                ));
            }
            for reserved in ["/proc", "/dev", "/sys", "/tmp", "/mnt", "/etc"] {
                if b.starts_with(reserved) {
                    return bad(format!(
                        "ro_bind {} collides with the jail's own {reserved}",
                        b.display()
                    ));
                }
            }
        }
        for e in &self.etc_binds {
            if e.is_empty() || e == "." || e == ".." || e.contains('/') || e.contains('\0') {
                return bad(format!("etc_bind {e:?} must be a single file name"));
            }
        }
        let slots_dir = self.slots_dir();
        if !is_clean_absolute(&slots_dir)
            || slots_dir == Path::new("/")
            || self.root_dir.starts_with(&slots_dir)
            || slots_dir.starts_with(&self.root_dir)
        {
            return bad(format!(
                "slots_dir {} must be an absolute path other than /, apart from root_dir",
                slots_dir.display()
            ));
        }
        if self.workspace_bytes < MIN_WORKSPACE_BYTES {
            return bad(format!(
                "workspace_bytes {} is below the minimum of {MIN_WORKSPACE_BYTES}",
                self.workspace_bytes
            ));
        }
        if self.cpu_per_run_millis < MIN_CPU_MILLIS
            || self.cpu_all_runs_millis.is_some_and(|m| m < MIN_CPU_MILLIS)
        {
            return bad(format!(
                "CPU quotas must be at least {MIN_CPU_MILLIS} thousandths of a core"
            ));
        }
        if self.workspace_inodes < MIN_WORKSPACE_INODES {
            return bad(format!(
                "workspace_inodes {} is below the minimum of {MIN_WORKSPACE_INODES}",
                self.workspace_inodes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_binds_only_usr() {
        let c = SandboxConfig::default();
        c.validate().expect("default valid");
        assert_eq!(c.ro_binds, vec![PathBuf::from("/usr")]);
        assert!(c.etc_binds.iter().any(|e| e == "ld.so.cache"));
        assert!(!c.etc_binds.iter().any(|e| e == "passwd" || e == "shadow"));
        assert_eq!(c.workspace_bytes, 1 << 30);
        assert_eq!(c.workspace_inodes, 65_536);
        assert!(!c.allow_degraded);
        assert_eq!(c.slots_dir(), PathBuf::from("/run/kiln/slots"));
        assert_eq!(c.cpu_per_run_millis, 1000);
    }

    #[test]
    fn a_run_gets_at_most_one_core_by_default_and_never_more_than_all_runs() {
        let c = SandboxConfig::default();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let l = c.cpu_limits();
        assert_eq!(l.all_runs_millis, (cores * 1000 - 500).max(500));
        assert_eq!(l.per_run_millis, 1000.min(l.all_runs_millis));
        let c = SandboxConfig {
            cpu_per_run_millis: 4000,
            cpu_all_runs_millis: Some(1500),
            ..SandboxConfig::default()
        };
        let l = c.cpu_limits();
        assert_eq!((l.per_run_millis, l.all_runs_millis), (1500, 1500));
    }

    #[test]
    fn validation_rejects_dangerous_values() {
        let ok = SandboxConfig::default();
        let cases: Vec<SandboxConfig> = vec![
            SandboxConfig {
                slots: 0,
                ..ok.clone()
            },
            SandboxConfig {
                kernel_slots: ok.slots,
                ..ok.clone()
            },
            SandboxConfig {
                uid_base: 0,
                ..ok.clone()
            },
            SandboxConfig {
                uid_base: u32::MAX - 10,
                ..ok.clone()
            },
            SandboxConfig {
                root_dir: "/".into(),
                ..ok.clone()
            },
            SandboxConfig {
                root_dir: "rel".into(),
                ..ok.clone()
            },
            SandboxConfig {
                ro_binds: vec!["/".into()],
                ..ok.clone()
            },
            SandboxConfig {
                ro_binds: vec!["/usr/../etc".into()],
                ..ok.clone()
            },
            SandboxConfig {
                ro_binds: vec!["/etc".into()],
                ..ok.clone()
            },
            SandboxConfig {
                ro_binds: vec!["/proc/1".into()],
                ..ok.clone()
            },
            SandboxConfig {
                etc_binds: vec!["../shadow".into()],
                ..ok.clone()
            },
            SandboxConfig {
                etc_binds: vec!["".into()],
                ..ok.clone()
            },
            SandboxConfig {
                slots_dir: Some("/".into()),
                ..ok.clone()
            },
            SandboxConfig {
                slots_dir: Some("/run/kiln/jail-root/slots".into()),
                ..ok.clone()
            },
            SandboxConfig {
                slots_dir: Some("relative".into()),
                ..ok.clone()
            },
            SandboxConfig {
                workspace_bytes: 1 << 20,
                ..ok.clone()
            },
            SandboxConfig {
                workspace_inodes: 10,
                ..ok.clone()
            },
            SandboxConfig {
                cpu_per_run_millis: 0,
                ..ok.clone()
            },
            SandboxConfig {
                cpu_all_runs_millis: Some(5),
                ..ok.clone()
            },
        ];
        for c in cases {
            assert!(c.validate().is_err(), "accepted {c:?}");
        }
    }
}
