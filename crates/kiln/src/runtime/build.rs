//! `kiln runtime build`: a [`Recipe`] becomes an image. `debootstrap` makes the base system
//! from the recipe's Debian mirror, then, in a chroot of it (inside a private mount namespace,
//! so `/proc` and `/dev` mounted for the package scripts vanish with the step), `apt-get`
//! installs the packages, pip the wheels, the official Node.js build is downloaded, verified
//! and installed (`node.rs`), and the setup commands run; apt's caches and lists
//! are removed and `image.json` is written last.
//!
//! Resuming: a finished bootstrap leaves `.stage-base`; with it an interrupted build starts
//! again at the packages (apt and pip are idempotent), without it from scratch.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use super::progress::Progress;
use super::{Image, ImageInfo, Recipe, Store, disk_usage, now_secs};

const STAGE_BASE: &str = ".stage-base";
/// Keeps package scripts from starting services in the chroot.
const POLICY_RC: &str = "#!/bin/sh\nexit 101\n";
/// The host's CA bundle, trusted by pip during the build only.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the build puts that copy inside the image (removed after the pip step).
const BUILD_CA: &str = "/tmp/kiln-build-ca.crt";
const CHROOT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A command that runs `script` with `/bin/sh` inside a chroot of `root`, in a mount
/// namespace of its own with `/proc` and the host's `/dev` mounted.
pub(super) fn in_chroot(root: &Path, script: &str) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(
            "mount -t proc proc \"$1/proc\" && mount --rbind /dev \"$1/dev\" && \
             exec chroot \"$1\" /usr/bin/env -i PATH=\"$2\" HOME=/root LANG=C.UTF-8 \
             DEBIAN_FRONTEND=noninteractive /bin/sh -c \"$3\"",
        )
        .arg("sh")
        .arg(root)
        .arg(CHROOT_PATH)
        .arg(script);
    c
}

/// Quotes `word` for `/bin/sh` (recipe names are already plain words; this is belt and braces).
fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Builds `recipe`'s image in `store` unless a complete one is there; returns it.
pub fn build(store: &Store, recipe: &Recipe) -> anyhow::Result<Image> {
    let id = recipe.image_id();
    if let Some(img) = store.get(&id) {
        eprintln!(
            "kiln runtime: image {id} is up to date ({})",
            img.root.display()
        );
        return Ok(img);
    }
    if !nix_is_root() {
        bail!("building a runtime image needs root (debootstrap, chroot, mounts)");
    }
    for tool in ["debootstrap", "unshare", "chroot"] {
        if which(tool).is_none() {
            bail!("`{tool}` is not installed (Debian: apt-get install debootstrap util-linux)");
        }
    }
    let dir = store.dir.join(&id);
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("build.log"))?;
    let started = Instant::now();
    let steps = 2
        + usize::from(!recipe.pip.is_empty())
        + recipe.node.as_ref().map_or(0, |_| super::node::STEPS)
        + recipe.npm.as_ref().map_or(0, |_| super::node::NPM_STEPS)
        + recipe.setup.len();
    let mut p = Progress::new(log, steps);
    p.say(&format!(
        "building image {id} (Debian {} from {}) in {}; log: {}",
        recipe.suite,
        recipe.mirror,
        dir.display(),
        dir.join("build.log").display()
    ));

    let base_done = dir.join(STAGE_BASE).exists() && root.join("usr/bin/apt-get").exists();
    if base_done {
        p.say("base system already bootstrapped: going on from the packages");
        p.run("debootstrap (done before)", &mut Command::new("true"))?;
    } else {
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("remove the interrupted {}", root.display()))?;
        }
        p.run(
            &format!("debootstrap {} ({})", recipe.suite, recipe.variant),
            Command::new("debootstrap")
                .arg(format!("--variant={}", recipe.variant))
                .arg("--include=ca-certificates")
                .arg(&recipe.suite)
                .arg(&root)
                .arg(&recipe.mirror),
        )?;
        std::fs::write(dir.join(STAGE_BASE), b"")?;
    }

    // The chroot's network names and the no-services policy, for the package steps only.
    std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))
        .context("copy /etc/resolv.conf into the image for apt")?;
    std::fs::write(root.join("usr/sbin/policy-rc.d"), POLICY_RC)?;
    set_mode(&root.join("usr/sbin/policy-rc.d"), 0o755)?;
    // slim images drop man pages, and openjdk's postinst fails without this directory
    std::fs::create_dir_all(root.join("usr/share/man/man1"))?;

    let packages: Vec<String> = recipe.packages.iter().map(|s| sh_quote(s)).collect();
    p.run(
        &format!(
            "apt-get install ({} packages and what they need)",
            packages.len()
        ),
        &mut in_chroot(
            &root,
            &format!(
                "apt-get -q update && apt-get -q -y -o Dpkg::Use-Pty=0 install \
                 --no-install-recommends {}",
                packages.join(" ")
            ),
        ),
    )?;
    if !recipe.pip.is_empty() {
        let cert = host_ca_copy(&root)?.map_or_else(String::new, |ca| format!("--cert {ca} "));
        let wheels: Vec<String> = recipe.pip.iter().map(|s| sh_quote(s)).collect();
        let done = p.run(
            &format!("pip install {}", recipe.pip.join(" ")),
            &mut in_chroot(
                &root,
                &format!(
                    "python3 -m pip install {cert}--no-cache-dir --break-system-packages \
                     --root-user-action=ignore --disable-pip-version-check --only-binary=:all: {}",
                    wheels.join(" ")
                ),
            ),
        );
        remove_host_ca_copy(&root);
        done?;
    }
    if let Some(node) = &recipe.node {
        super::node::install(&mut p, &root, node)?;
        if let Some(npm) = &recipe.npm {
            let ca = host_ca_copy(&root)?;
            let done = super::node::install_packages(&mut p, &root, node, npm, ca);
            remove_host_ca_copy(&root);
            done?;
        }
    }
    for (i, script) in recipe.setup.iter().enumerate() {
        let short: String = script.chars().take(50).collect();
        p.run(
            &format!("setup {} ({short}…)", i + 1),
            &mut in_chroot(&root, script),
        )?;
    }
    std::fs::remove_file(root.join("usr/sbin/policy-rc.d"))?;
    // what package scripts left in /tmp (the JVM's hsperfdata) is not part of the image
    if let Ok(rd) = std::fs::read_dir(root.join("tmp")) {
        for e in rd.flatten() {
            let _ = kiln_sandbox::remove_tree(&e.path());
        }
    }
    std::fs::write(root.join("etc/resolv.conf"), b"")?;

    let info = ImageInfo {
        id: id.clone(),
        digest: recipe.digest.clone(),
        source: "recipe".to_owned(),
        suite: recipe.suite.clone(),
        created: now_secs(),
        seconds: started.elapsed().as_secs(),
        bytes: disk_usage(&root),
    };
    store.complete(&info)?;
    let _ = std::fs::remove_file(dir.join(STAGE_BASE));
    p.say(&format!(
        "image {id} built in {}s, {} on disk",
        info.seconds,
        super::human_bytes(info.bytes)
    ));
    Ok(Image { info, root })
}

/// Copies the host's CA bundle into the image at `root` for a step that downloads (pip and
/// npm trust what the host trusts: a TLS-inspecting proxy's CA); the path inside the image, or
/// `None` when the host has no bundle. [`remove_host_ca_copy`] removes it after the step: it
/// is never part of the image.
fn host_ca_copy(root: &Path) -> anyhow::Result<Option<&'static str>> {
    let host_ca = Path::new(HOST_CA_BUNDLE);
    if !host_ca.is_file() {
        return Ok(None);
    }
    std::fs::copy(host_ca, root.join(BUILD_CA.trim_start_matches('/')))
        .context("copy the host's CA bundle into the image for a download step")?;
    Ok(Some(BUILD_CA))
}

/// Removes what [`host_ca_copy`] put into the image.
fn remove_host_ca_copy(root: &Path) {
    let _ = std::fs::remove_file(root.join(BUILD_CA.trim_start_matches('/')));
}

pub(crate) fn nix_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // the owner of our own /proc entry is our effective uid
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

pub(crate) fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(tool))
        .find(|c| c.is_file())
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}
