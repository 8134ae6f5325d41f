//! Limits: one run's (`timeout_secs`, `memory_mb`, …), CPU quotas, the run
//! registry's concurrency, retention and rate limits (`rate_*`), live
//! kernels (`session_*`, `max_sessions*`) and programmatic tool calling
//! (`ptc_*`).

use std::time::Duration;

use kiln_core::Limits;

use super::Config;

impl Config {
    /// `cpus_per_run` and `cpus_all_runs` in thousandths of a core, as the
    /// sandbox takes them (`None`: the sandbox's automatic value).
    pub fn cpu_millis(&self) -> (u32, Option<u32>) {
        let millis = |c: f64| (c * 1000.0).round() as u32;
        let all = (self.cpus_all_runs > 0.0).then(|| millis(self.cpus_all_runs));
        (millis(self.cpus_per_run), all)
    }

    /// Limits of one run.
    pub fn limits(&self) -> Limits {
        Limits {
            wall_time: Duration::from_secs(self.timeout_secs),
            cpu_time: Duration::from_secs(self.cpu_secs),
            memory_bytes: self.memory_mb * 1024 * 1024,
            pids: self.pids,
            file_size_bytes: self.file_size_mb * 1024 * 1024,
            open_files: self.open_files,
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
            tmp_bytes: self.tmp_mb * 1024 * 1024,
        }
    }

    /// Settings of the run registry.
    pub fn runs(&self) -> kiln_exec::RunsConfig {
        kiln_exec::RunsConfig {
            concurrency: self.max_concurrency as usize,
            keep_finished: Duration::from_secs(self.run_retention_secs),
            keep_finished_bytes: usize::try_from(self.run_retention_mb * 1024 * 1024)
                .unwrap_or(usize::MAX),
            rate_limit: (self.rate_limit_runs > 0).then(|| {
                (
                    self.rate_limit_runs,
                    Duration::from_secs(self.rate_limit_window_secs),
                )
            }),
            max_waiting: self.max_queued_runs,
            // opened by `build` (a file sink is IO)
            audit: None,
        }
    }

    /// The per-principal limits of LibreChat's routes (`rate_*`).
    pub fn rate_rules(&self) -> anyhow::Result<kiln_api::rate::RateRules> {
        let rule = |key: &str, v: &str| -> anyhow::Result<Option<kiln_api::rate::Rule>> {
            if matches!(v.trim(), "off" | "0" | "") {
                return Ok(None);
            }
            let r = kiln_egress::Rate::parse(v).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
            Ok(Some(kiln_api::rate::Rule {
                max: r.count,
                window: r.per,
            }))
        };
        Ok(kiln_api::rate::RateRules {
            exec: rule("rate_exec", &self.rate_exec)?,
            upload: rule("rate_upload", &self.rate_upload)?,
            download: rule("rate_download", &self.rate_download)?,
            fetch: rule("rate_list", &self.rate_list)?,
            delete: rule("rate_delete", &self.rate_delete)?,
            cancel: rule("rate_cancel", &self.rate_cancel)?,
        })
    }

    /// The sandbox bridge's registry settings (`/v1/sandbox`); `None`: off.
    pub fn sandboxes(&self) -> Option<kiln_exec::sandboxes::SandboxesConfig> {
        (self.bridge_sandboxes_max > 0).then(|| kiln_exec::sandboxes::SandboxesConfig {
            per_principal: self.bridge_sandboxes_per_user,
            total: self.bridge_sandboxes_max,
            idle_ttl: Duration::from_secs(self.bridge_idle_ttl_secs),
        })
    }

    /// The live kernels' registry settings (`/v1/sessions`).
    pub fn kernels(&self) -> kiln_exec::kernels::KernelsConfig {
        kiln_exec::kernels::KernelsConfig {
            idle_ttl: Duration::from_secs(self.session_idle_ttl_secs),
            max_age: Duration::from_secs(self.session_max_age_secs),
            max_total: self.max_sessions as usize,
            max_per_owner: self.max_sessions_per_user,
            busy_wait: Duration::from_millis(self.session_busy_wait_ms),
            grace: Duration::from_secs(self.session_interrupt_grace_secs),
            limits: self.limits(),
            parked_per_language: self.parked_kernels as usize,
        }
    }

    /// Programmatic tool calling's settings (`ptc_*`).
    pub fn ptc_settings(&self) -> kiln_api::programmatic::PtcSettings {
        let ttl = std::time::Duration::from_secs(self.ptc_state_ttl_secs.max(1));
        let max_active = match self.ptc_max_active {
            0 => (self.max_concurrency as usize / 2).max(1),
            n => n,
        };
        kiln_api::programmatic::PtcSettings {
            secret: self
                .ptc_secret
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec()),
            max_active,
            max_per_user: match self.ptc_max_per_user {
                0 => (max_active / 2).max(1),
                n => n,
            },
            limits: kiln_exec::ptc::PtcLimits {
                state_ttl: ttl,
                // the client's 20 round trips, each with the whole TTL
                max_paused: ttl * 20,
                ..kiln_exec::ptc::PtcLimits::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_per_class_and_turn_off() {
        let c = Config {
            rate_exec: "20/min".into(),
            rate_cancel: "off".into(),
            ..Config::default()
        };
        let r = c.rate_rules().unwrap();
        assert_eq!(r.exec, Some(kiln_api::rate::Rule::new(20, 60)));
        assert_eq!(r.cancel, None);
        assert_eq!(r.download, Some(kiln_api::rate::Rule::new(1200, 60)));
        let bad = Config {
            rate_upload: "lots".into(),
            ..Config::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn cpu_quotas_default_to_one_core_per_run_and_auto_for_all() {
        let c = Config::default();
        assert_eq!(c.cpu_millis(), (1000, None));
        c.validate().expect("defaults are valid");
        let c = Config {
            cpus_per_run: 0.5,
            cpus_all_runs: 1.5,
            ..Config::default()
        };
        assert_eq!(c.cpu_millis(), (500, Some(1500)));
        for (per_run, all) in [(0.0, 0.0), (f64::NAN, 0.0), (1.0, 0.001), (-1.0, 0.0)] {
            let c = Config {
                cpus_per_run: per_run,
                cpus_all_runs: all,
                ..Config::default()
            };
            assert!(c.validate().is_err(), "{per_run} {all}");
        }
    }
}
