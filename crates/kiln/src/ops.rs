//! What the sandbox knows, for the operator's status page
//! (`GET /v1/admin/status`, [`kiln_api::admin`]).

use kiln_api::admin::{ForkServerView, Operations, SandboxView, WarmProfileView};
use kiln_sandbox::{CgroupSupport, JailSource};

/// The status of a server's jails: the host report the sandbox was set up
/// with, the warm pool's counters, the fork-server.
pub(crate) struct SandboxOps(pub JailSource);

impl Operations for SandboxOps {
    fn sandbox(&self) -> SandboxView {
        let sandbox = self.0.sandbox();
        let r = sandbox.report();
        SandboxView {
            kernel: r.kernel.clone(),
            root: r.root,
            user_namespaces: r.user_namespaces,
            cgroup: match &r.cgroup {
                CgroupSupport::V2 { group, controllers } => {
                    format!("v2 at {}: {}", group.display(), controllers.join(" "))
                }
                CgroupSupport::V1 { memory, pids, .. } => format!(
                    "v1: memory at {}, pids at {}",
                    memory.display(),
                    pids.display()
                ),
                CgroupSupport::None => "no memory and pids controllers".to_owned(),
            },
            cgroup_limits: r.cgroup_limits,
            seccomp: r.seccomp,
            landlock_abi: r.landlock_abi,
            workspace_quota: r.workspace_quota.to_string(),
            enforceable: r.enforceable(),
            problems: r.problems.clone(),
            warnings: r.warnings.clone(),
            degraded: r.degraded.clone(),
        }
    }

    fn warm(&self) -> Vec<WarmProfileView> {
        let Some(pool) = self.0.warm_pool() else {
            return Vec::new();
        };
        let mut out: Vec<WarmProfileView> = pool
            .stats()
            .into_iter()
            .map(|(profile, s)| WarmProfileView {
                profile,
                ready: s.ready,
                target: s.target,
                hits: s.hits,
                misses: s.misses,
                built: s.built,
                build_failures: s.build_failures,
            })
            .collect();
        out.sort_by(|a, b| a.profile.cmp(&b.profile));
        out
    }

    fn fork_servers(&self) -> Vec<ForkServerView> {
        let sandbox = self.0.sandbox();
        sandbox
            .zygote_infos()
            .into_iter()
            .map(|(template, z)| ForkServerView {
                alive: sandbox.has_zygote(&template),
                template,
                pid: z.pid,
                preload_ms: z.preload_ms,
                rss_bytes: z.rss_bytes,
            })
            .collect()
    }
}
