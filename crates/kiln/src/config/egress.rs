//! Egress: the services a run may call (`services`, `services_file`), the
//! gateway's limits (`egress_*`) and server-side URL fetches (`url_fetch_*`).

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Format, Toml};
use serde::Deserialize;

use super::Config;

impl Config {
    /// Every configured service: `services` plus those of `services_file`
    /// (a name in both is an error).
    pub fn all_services(&self) -> anyhow::Result<BTreeMap<String, kiln_egress::ServiceConfig>> {
        let mut all = self.services.clone();
        if let Some(f) = &self.services_file {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct File {
                #[serde(default)]
                services: BTreeMap<String, kiln_egress::ServiceConfig>,
            }
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read services_file {}", f.display()))?;
            let file: File = Figment::from(Toml::string(&text))
                .extract()
                .with_context(|| format!("services_file {}", f.display()))?;
            for (name, s) in file.services {
                if all.insert(name.clone(), s).is_some() {
                    bail!(
                        "service {name:?} is configured both in the configuration and in {}",
                        f.display()
                    );
                }
            }
        }
        Ok(all)
    }

    /// The gateway's settings.
    pub fn egress_settings(&self) -> kiln_egress::EgressSettings {
        kiln_egress::EgressSettings {
            max_concurrent_calls: self.egress_max_concurrent,
            max_concurrent_per_grant: self.egress_max_per_run,
            ..kiln_egress::EgressSettings::default()
        }
    }

    /// What server-side URL transfers may reach.
    pub fn url_fetch(&self) -> kiln_exec::FetchPolicy {
        kiln_exec::FetchPolicy {
            allow_private: self.url_fetch_allow_private,
            max_bytes: self.url_fetch_max_mb * 1024 * 1024,
            ..kiln_exec::FetchPolicy::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 002's registry entry, exactly as the issue writes it.
    const SEED_002: &str = r#"
[services.deepl]
upstream = "https://api.deepl.com"
allowed_methods = ["POST", "GET"]
allowed_paths = ["/v2/document", "/v2/document/*"]
inject_header = { Authorization = "DeepL-Auth-Key ${DEEPL_API_KEY}" }   # from Kiln's environment
max_body_bytes = 31457280
rate = "60/min"
"#;

    #[test]
    #[allow(clippy::result_large_err)]
    fn seed_002s_service_entry_works_as_written_with_the_key_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, SEED_002).unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("DEEPL_API_KEY", "0123456789-seed-key:fx");
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            let deepl = &c.services["deepl"];
            assert_eq!(deepl.max_body_bytes, 31_457_280);
            assert_eq!(deepl.rate.as_deref(), Some("60/min"));
            let all = c.all_services().map_err(|e| e.to_string())?;
            let reg = kiln_egress::Registry::build(&all, &|n| std::env::var(n).ok())
                .map_err(|e| e.to_string())?;
            let s = reg.get("deepl").expect("deepl");
            assert_eq!(
                s.inject_headers[0].1,
                "DeepL-Auth-Key 0123456789-seed-key:fx"
            );
            assert!(!format!("{c:?}").contains("0123456789-seed-key"));
            Ok(())
        });
        // without the variable Kiln refuses to start, naming it
        figment::Jail::expect_with(|_jail| {
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            let e = kiln_egress::Registry::build(&c.all_services().unwrap(), &|n| {
                std::env::var(n).ok()
            })
            .expect_err("unset key");
            assert!(e.to_string().contains("DEEPL_API_KEY"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn services_can_live_in_their_own_file_but_not_twice() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("services.toml");
        std::fs::write(&f, SEED_002).unwrap();
        let c = Config {
            services_file: Some(f.clone()),
            ..Config::default()
        };
        assert!(c.all_services().unwrap().contains_key("deepl"));
        let mut twice = c.clone();
        twice.services = c.all_services().unwrap();
        assert!(twice.all_services().is_err());
        std::fs::write(
            &f,
            "[services.x]
upstream = 1
",
        )
        .unwrap();
        assert!(c.all_services().is_err());
    }
}
