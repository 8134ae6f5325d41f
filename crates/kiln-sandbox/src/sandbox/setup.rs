//! The one set-up path of a jail. Every start takes it: [`Sandbox::run`]
//! builds a jail and runs it, [`Sandbox::park`] builds one and parks it, and
//! a parked jail's start ([`Sandbox::run_parked`], `Sandbox::start_kernel`)
//! goes through [`Sandbox::go`]. The steps, in order:
//!
//! 1. [`Sandbox::admit`]: refused after shutdown and for another sandbox's
//!    slot;
//! 2. [`Sandbox::prepare`]: the request checked ([`validate_request`]: argv,
//!    environment, seccomp profile; the workspace a searchable directory
//!    directly below the slot's area), the run's cgroups created (degraded:
//!    the slot's lease held instead) and the jail's spec planned
//!    ([`plan_spec`], pure);
//! 3. for a parked jail, [`Sandbox::go`]: the request checked again (the go
//!    names the program), refused if it needs what a parked jail lacks, the
//!    go encoded ([`go_line`]) and the jail's CPU clock started.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Sandbox;
use super::host::check_searchable;
use super::parked::ParkedJail;
use crate::cgroup::RunCgroups;
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::run::{RunRequest, Started};
use crate::seccomp;
use crate::slots::{Slot, SlotLease};
use crate::spec::{BpfInsns, CgroupAttach, GoMsg, JailLimits, JailSpec, ParkMode};

/// A jail set up to be built: its name, its spec, and what holds its slot
/// until it is gone (its cgroups, or without cgroups the slot's lease).
pub(super) struct Prepared {
    pub name: String,
    pub spec: JailSpec,
    pub cgroups: Option<RunCgroups>,
    pub lease: Option<SlotLease>,
}

/// A parked jail given its go: the parts its run drives, and the go line.
pub(crate) struct Going {
    pub name: String,
    pub workspace: PathBuf,
    pub started: Started,
    pub cgroups: Option<RunCgroups>,
    pub lease: Option<SlotLease>,
    pub line: Vec<u8>,
}

/// What every jail of one sandbox shares in its spec.
pub(super) struct SpecBase<'a> {
    pub cfg: &'a SandboxConfig,
    /// Compiled seccomp profiles by name (empty when degraded without).
    pub filters: &'a HashMap<String, Vec<BpfInsns>>,
    pub landlock: bool,
}

/// How a parked jail waits (`None`: the jail runs its program at once).
pub(super) struct Parking {
    pub mode: ParkMode,
    /// Files under `/etc/kiln/` in the jail.
    pub etc_files: Vec<(String, String)>,
    /// A kept jail (`JailSpec::keep`, `kept.rs`): its init stays outside
    /// the run's cgroups.
    pub keep: bool,
}

/// The limits a run's cgroups are written with. Their `pids.max` is the
/// program's `pids` plus one for the jail's init (`cgroup/v1.rs`,
/// `cgroup/v2.rs`); a kept jail's init is outside the groups
/// (`jail/start.rs`), so its program is given one fewer there, and starts
/// exactly as many processes as a cold jail's.
fn group_limits(limits: &kiln_core::Limits, keep: bool) -> kiln_core::Limits {
    kiln_core::Limits {
        pids: limits.pids.saturating_sub(u32::from(keep)),
        ..limits.clone()
    }
}

impl Sandbox {
    /// Step 1: refuses work after shutdown and under a slot of another
    /// sandbox.
    pub(super) fn admit(&self, slot: &Slot) -> Result<(), SandboxError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::ShutDown);
        }
        if !slot.belongs_to(&self.inner.slots) {
            return Err(SandboxError::ForeignSlot(slot.index()));
        }
        Ok(())
    }

    /// Step 2: checks `req`, creates the cgroups of the run `name` (or
    /// takes the slot's lease) and plans the jail's spec.
    pub(super) fn prepare(
        &self,
        slot: &Slot,
        name: String,
        req: &RunRequest,
        parking: Option<Parking>,
    ) -> Result<Prepared, SandboxError> {
        check_workspace_location(req, slot)?;
        validate_request(req)?;
        // the slot's kept jail (`kept.rs`) ends with any other use of it
        if let Some(kept) = &self.inner.kept {
            drop(kept.take(slot.index()));
        }
        // Without cgroups the lease alone keeps the slot reserved until the
        // helper (and with it the jail) is gone.
        // A one-shot jail takes its slot's kept groups where they are clean
        // (`cgroup/slot.rs`); a live kernel's slot has none.
        let limits = group_limits(&req.limits, parking.as_ref().is_some_and(|p| p.keep));
        let (cgroups, lease) = match &self.inner.cgroups {
            Some(driver) => (
                Some(match self.inner.slots.cgroups() {
                    Some(kept) => kept.take(slot.index(), &name, &limits, slot.lease())?,
                    None => driver.create_run(&name, &limits, slot.lease())?,
                }),
                None,
            ),
            None => (None, Some(slot.lease())),
        };
        let base = SpecBase {
            cfg: &self.inner.cfg,
            filters: &self.inner.filters,
            landlock: self.inner.report.landlock_abi.is_some(),
        };
        let attach = cgroups.as_ref().map(RunCgroups::attach);
        let mut spec = plan_spec(&base, slot.id_base(), req, attach, parking);
        // a jail with no network at all joins its slot's namespace, made
        // once (`slotnet.rs`); only under the profile that allows AF_UNIX
        // sockets alone
        if spec.network.is_none() && spec.seccomp_filters.is_some() {
            spec.slot_netns = slot.netns();
        }
        Ok(Prepared {
            name,
            spec,
            cgroups,
            lease,
        })
    }

    /// Step 3, for a parked jail: the go for `req` ([`go_line`]), with the
    /// jail's CPU clock started. A refused go discards the jail.
    pub(crate) async fn go(
        &self,
        jail: ParkedJail,
        req: &RunRequest,
        kernel: bool,
    ) -> Result<Going, SandboxError> {
        let line = match go_line(req, kernel) {
            Ok(line) => line,
            Err(e) => {
                self.discard(jail).await;
                return Err(e);
            }
        };
        let ParkedJail {
            name,
            workspace,
            started,
            mut cgroups,
            lease,
            ..
        } = jail;
        if let Some(c) = cgroups.as_mut() {
            c.mark_start();
        }
        Ok(Going {
            name,
            workspace,
            started,
            cgroups,
            lease,
            line,
        })
    }
}

/// A unique name for a run's cgroups and parked workspace.
pub(super) fn run_name(slot: &Slot) -> String {
    // process-wide sequence: several Sandboxes in one process (tests)
    // must never pick the same group name
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{}", std::process::id(), slot.index(), seq)
}

/// The spec of the jail that runs (or parks for) `req` under the uids from
/// `id_base`, joining the run's cgroups through `cgroup`.
pub(super) fn plan_spec(
    base: &SpecBase<'_>,
    id_base: u32,
    req: &RunRequest,
    cgroup: Option<CgroupAttach>,
    parking: Option<Parking>,
) -> JailSpec {
    let (park, etc_files) = match parking {
        Some(p) => (Some(p.mode), p.etc_files),
        None => (None, Vec::new()),
    };
    let system = base.cfg.system_of(req.language);
    JailSpec {
        root_dir: base.cfg.root_dir.clone(),
        ro_binds: base.cfg.ro_binds.clone(),
        etc_binds: system.etc_binds.to_vec(),
        image_root: system.image_root.map(Path::to_path_buf),
        workspace: req.workspace.clone(),
        project: req.project.clone(),
        argv: req.argv.clone(),
        env: req.env.clone(),
        id_base,
        limits: {
            let mut l = JailLimits::from_limits(&req.limits);
            // the jail init's backstop cannot see a pause clock: it gets
            // the whole pause budget on top (the server still stops
            // the run at its paused-aware deadline)
            if let Some(p) = &req.pause {
                let extra = u64::try_from(p.max_paused().as_millis()).unwrap_or(u64::MAX);
                l.wall_ms = l.wall_ms.saturating_add(extra);
            }
            l
        },
        cgroup,
        seccomp_filters: base
            .filters
            .get(&seccomp::variant(
                &req.seccomp_profile,
                req.network.is_some(),
            ))
            .cloned(),
        landlock: base.landlock,
        park,
        etc_files,
        network: req.network.as_ref().map(crate::netns::JailNetwork::spec),
        slot_netns: None,
        keep: false,
    }
}

/// The go line of a parked jail for `req`: its argv, environment, wall and
/// CPU time, `kernel` set for a kernel's start. Refuses a request that fails
/// [`validate_request`], and one with a services channel or a pause clock (a
/// parked jail was built without them).
pub(super) fn go_line(req: &RunRequest, kernel: bool) -> Result<Vec<u8>, SandboxError> {
    validate_request(req)?;
    if req.network.is_some() || req.pause.is_some() || req.project.is_some() {
        return Err(SandboxError::Request(
            "a parked jail has no services channel, pause clock or project: run it in a jail built for it".to_owned(),
        ));
    }
    let limits = JailLimits::from_limits(&req.limits);
    let go = GoMsg {
        argv: req.argv.clone(),
        env: req.env.clone(),
        wall_ms: limits.wall_ms,
        cpu_secs: limits.cpu_secs,
        kernel,
    };
    let mut line =
        serde_json::to_vec(&go).map_err(|e| SandboxError::Request(format!("encode go: {e}")))?;
    line.push(b'\n');
    Ok(line)
}

pub(super) fn validate_request(req: &RunRequest) -> Result<(), SandboxError> {
    let bad = |m: String| Err(SandboxError::Request(m));
    let Some(program) = req.argv.first() else {
        return bad("argv is empty".into());
    };
    if !program.starts_with('/') {
        return bad(format!("argv[0] {program:?} is not an absolute path"));
    }
    if !seccomp::is_profile(&req.seccomp_profile) {
        return bad(format!("unknown seccomp profile {:?}", req.seccomp_profile));
    }
    if req.argv.iter().any(|a| a.contains('\0')) {
        return bad("argv contains a NUL byte".into());
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad(format!("invalid environment variable {k:?}"));
        }
    }
    for dir in std::iter::once(&req.workspace).chain(&req.project) {
        if !dir.is_absolute() {
            return bad(format!("workspace {} is not absolute", dir.display()));
        }
        let meta =
            std::fs::metadata(dir).map_err(|e| SandboxError::io("stat workspace", dir, e))?;
        if !meta.is_dir() {
            return bad(format!("workspace {} is not a directory", dir.display()));
        }
        check_searchable(dir)?;
    }
    Ok(())
}

/// The workspace (and a project's working copy) must be a directory
/// directly below the slot's area, where the quota applies and which is
/// emptied when the slot is released.
pub(super) fn check_workspace_location(req: &RunRequest, slot: &Slot) -> Result<(), SandboxError> {
    let parent = slot.workspace_parent();
    for dir in std::iter::once(&req.workspace).chain(&req.project) {
        if dir.parent() != Some(parent.as_path()) {
            return Err(SandboxError::Request(format!(
                "workspace {} is not directly below the slot's workspace parent {}",
                dir.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kiln_core::Limits;

    use super::*;
    use crate::pause::PauseClock;

    fn req(argv: &[&str]) -> RunRequest {
        RunRequest {
            workspace: std::env::temp_dir(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            ..RunRequest::default()
        }
    }

    #[test]
    fn requests_with_relative_or_empty_argv_are_refused() {
        assert!(matches!(
            validate_request(&req(&[])),
            Err(SandboxError::Request(_))
        ));
        assert!(matches!(
            validate_request(&req(&["python3"])),
            Err(SandboxError::Request(_))
        ));
        assert!(validate_request(&req(&["/usr/bin/python3"])).is_ok());
    }

    #[test]
    fn requests_with_bad_environment_are_refused() {
        let mut r = req(&["/bin/true"]);
        r.env = vec![("A=B".into(), "c".into())];
        assert!(matches!(
            validate_request(&r),
            Err(SandboxError::Request(_))
        ));
        r.env = vec![("A".into(), "c\0d".into())];
        assert!(matches!(
            validate_request(&r),
            Err(SandboxError::Request(_))
        ));
    }

    /// The spec `plan_spec` gives `r` in a default-configured sandbox whose
    /// only filter is the default profile's (none when `!with_filter`).
    fn planned(
        r: &RunRequest,
        with_filter: bool,
        landlock: bool,
        parking: Option<Parking>,
    ) -> JailSpec {
        let mut filters = HashMap::new();
        if with_filter {
            filters.insert(seccomp::DEFAULT_PROFILE.to_owned(), Vec::new());
        }
        let cfg = SandboxConfig::default();
        let base = SpecBase {
            cfg: &cfg,
            filters: &filters,
            landlock,
        };
        plan_spec(&base, 200_000, r, None, parking)
    }

    #[test]
    fn the_spec_carries_the_request_the_slots_uids_and_the_parking() {
        let mut r = req(&["/usr/bin/python3", "-c", "1"]);
        r.env = vec![("HOME".into(), "/mnt/data".into())];
        let parking = Parking {
            mode: ParkMode::Prestart,
            etc_files: vec![("k.py".into(), "x = 1".into())],
            keep: false,
        };
        let spec = planned(&r, true, true, Some(parking));
        assert_eq!(spec.argv, r.argv);
        assert_eq!(spec.env, r.env);
        assert_eq!(spec.workspace, r.workspace);
        assert_eq!(spec.id_base, 200_000);
        assert_eq!(spec.root_dir, SandboxConfig::default().root_dir);
        assert_eq!(spec.park, Some(ParkMode::Prestart));
        assert_eq!(spec.etc_files, [("k.py".to_owned(), "x = 1".to_owned())]);
        assert!(spec.landlock);
        assert!(spec.seccomp_filters.is_some(), "the profile's filter");
        assert!(spec.cgroup.is_none() && spec.network.is_none());
        assert_eq!(
            spec.limits.wall_ms,
            JailLimits::from_limits(&r.limits).wall_ms
        );
    }

    #[test]
    fn a_jail_takes_its_languages_image_and_etc_entries_and_others_the_default() {
        let py = kiln_core::Language::resolve("py").unwrap();
        let r_lang = kiln_core::Language::resolve("r").unwrap();
        let cfg = SandboxConfig {
            image_root: Some(PathBuf::from("/images/a")),
            etc_binds: vec!["ssl".into(), "python3.13".into()],
            language_images: vec![crate::config::LanguageImage {
                language: r_lang,
                image_root: Some(PathBuf::from("/images/b")),
                etc_binds: vec!["ssl".into(), "R".into()],
            }],
            ..SandboxConfig::default()
        };
        let filters = HashMap::new();
        let base = SpecBase {
            cfg: &cfg,
            filters: &filters,
            landlock: false,
        };
        let spec_of = |lang: Option<kiln_core::Language>| {
            let r = RunRequest {
                language: lang,
                ..req(&["/bin/true"])
            };
            plan_spec(&base, 200_000, &r, None, None)
        };
        let r_spec = spec_of(Some(r_lang));
        assert_eq!(r_spec.image_root.as_deref(), Some(Path::new("/images/b")));
        assert_eq!(r_spec.etc_binds, ["ssl", "R"]);
        for other in [Some(py), None] {
            let s = spec_of(other);
            assert_eq!(s.image_root.as_deref(), Some(Path::new("/images/a")));
            assert_eq!(s.etc_binds, ["ssl", "python3.13"]);
        }
        // two systems: the default (for jails of no language yet) and r's
        let systems = cfg.systems();
        assert_eq!(systems.len(), 2);
        assert_eq!(systems[1].0, Some(r_lang));
    }

    #[test]
    fn a_jail_run_at_once_has_no_parking_and_an_unknown_filter_none() {
        let spec = planned(&req(&["/bin/true"]), false, false, None);
        assert_eq!(spec.park, None);
        assert!(spec.etc_files.is_empty());
        assert!(spec.seccomp_filters.is_none());
        assert!(!spec.landlock);
    }

    #[test]
    fn the_helpers_backstop_gets_the_whole_pause_budget_on_top_of_the_wall_time() {
        let mut r = req(&["/bin/true"]);
        r.limits = Limits {
            wall_time: Duration::from_secs(10),
            ..Limits::default()
        };
        r.pause = Some(PauseClock::new(Duration::from_secs(300)));
        let spec = planned(&r, true, false, None);
        assert_eq!(spec.limits.wall_ms, 310_000);
    }

    #[test]
    fn the_go_carries_argv_env_wall_and_cpu_time_and_the_kernel_flag() {
        let mut r = req(&["/usr/bin/node", "k.js"]);
        r.env = vec![("A".into(), "b".into())];
        r.limits = Limits {
            wall_time: Duration::from_millis(2500),
            cpu_time: Duration::from_millis(1500),
            ..Limits::default()
        };
        for kernel in [false, true] {
            let line = go_line(&r, kernel).expect("go");
            assert_eq!(line.last(), Some(&b'\n'));
            let go: GoMsg = serde_json::from_slice(&line).expect("a go message");
            assert_eq!(go.argv, r.argv);
            assert_eq!(go.env, r.env);
            assert_eq!(go.wall_ms, 2500);
            assert_eq!(go.cpu_secs, 2);
            assert_eq!(go.kernel, kernel);
        }
    }

    #[test]
    fn a_go_with_a_pause_clock_or_a_bad_request_is_refused() {
        let mut paused = req(&["/bin/true"]);
        paused.pause = Some(PauseClock::new(Duration::from_secs(1)));
        assert!(matches!(
            go_line(&paused, false),
            Err(SandboxError::Request(m)) if m.contains("pause clock")
        ));
        assert!(matches!(
            go_line(&req(&["true"]), true),
            Err(SandboxError::Request(m)) if m.contains("absolute")
        ));
    }
}
