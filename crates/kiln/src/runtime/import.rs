//! `kiln runtime import`: an archive becomes an image. A plain tarball is a root filesystem
//! (`docker export`, `tar -C root -c .`); an archive with `manifest.json` is `docker save`'s
//! (and `podman save`'s default) format, one with `index.json` and `oci-layout` an OCI image
//! layout (`podman save --format oci-archive`). An image's layers are applied in order with
//! their whiteouts (`.wh.<name>` deletes a name of the layers below, `.wh..wh..opq` empties a
//! directory). The archive's SHA-256 names the image. The archive is the operator's and
//! trusted as such (GNU tar runs as root on it); whiteouts never reach outside the image.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::build::nix_is_root;
use super::progress::Progress;
use super::{Image, ImageInfo, Store, disk_usage, hex, now_secs};

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Member names of a tar archive (any compression GNU tar recognises).
fn members(archive: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("tar")
        .arg("-tf")
        .arg(archive)
        .output()
        .context("run tar")?;
    if !out.status.success() {
        bail!(
            "{} is not a readable tar archive: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").to_owned())
        .collect())
}

fn untar(archive: &Path, into: &Path) -> Command {
    let mut c = Command::new("tar");
    c.args(["-x", "-p", "--numeric-owner", "--exclude=.wh.*", "-f"])
        .arg(archive)
        .arg("-C")
        .arg(into);
    c
}

/// `rel` inside `root`, if no component is `..` and no directory on the way is a symlink
/// (a whiteout must not delete through a link out of the image).
fn inside(root: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel);
    let mut at = root.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for (i, c) in parts.iter().enumerate() {
        match c {
            Component::Normal(n) => at.push(n),
            Component::CurDir => continue,
            _ => return None,
        }
        if i + 1 < parts.len() {
            let m = std::fs::symlink_metadata(&at).ok()?;
            if !m.is_dir() {
                return None;
            }
        }
    }
    Some(at)
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies the whiteouts named in `names` to `root` (before the layer's own files land).
fn whiteouts(root: &Path, names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let (dir, base) = match name.rsplit_once('/') {
            Some((d, b)) => (d, b),
            None => ("", name.as_str()),
        };
        if base == ".wh..wh..opq" {
            if let Some(d) = inside(root, dir)
                && let Ok(rd) = std::fs::read_dir(&d)
            {
                for e in rd.flatten() {
                    remove_any(&e.path())?;
                }
            }
        } else if let Some(gone) = base.strip_prefix(".wh.") {
            let rel = if dir.is_empty() {
                gone.to_owned()
            } else {
                format!("{dir}/{gone}")
            };
            if let Some(p) = inside(root, &rel) {
                remove_any(&p)?;
            }
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct DockerManifest {
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct OciIndex {
    manifests: Vec<OciDescriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    #[serde(default)]
    layers: Vec<OciDescriptor>,
    #[serde(default)]
    manifests: Vec<OciDescriptor>,
}

#[derive(Deserialize)]
struct OciDescriptor {
    digest: String,
}

fn oci_blob(dir: &Path, digest: &str) -> anyhow::Result<PathBuf> {
    let hexpart = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("unsupported OCI digest {digest:?}"))?;
    Ok(dir.join("blobs/sha256").join(hexpart))
}

/// The layer files of an unpacked image archive, bottom first.
fn layers(unpacked: &Path, kind: &str) -> anyhow::Result<Vec<PathBuf>> {
    let read = |p: PathBuf| -> anyhow::Result<Vec<u8>> {
        std::fs::read(&p).with_context(|| format!("read {}", p.display()))
    };
    if kind == "docker-archive" {
        let m: Vec<DockerManifest> = serde_json::from_slice(&read(unpacked.join("manifest.json"))?)
            .context("manifest.json")?;
        let Some(first) = m.into_iter().next() else {
            bail!("manifest.json names no image");
        };
        return first
            .layers
            .iter()
            .map(|l| inside(unpacked, l).with_context(|| format!("bad layer path {l:?}")))
            .collect();
    }
    let index: OciIndex =
        serde_json::from_slice(&read(unpacked.join("index.json"))?).context("index.json")?;
    let mut desc = index
        .manifests
        .into_iter()
        .next()
        .context("empty index.json")?;
    // a multi-platform index points at another index: take its first manifest
    for _ in 0..4 {
        let m: OciManifest = serde_json::from_slice(&read(oci_blob(unpacked, &desc.digest)?)?)
            .context("OCI manifest")?;
        if !m.layers.is_empty() {
            return m
                .layers
                .iter()
                .map(|l| oci_blob(unpacked, &l.digest))
                .collect();
        }
        desc = m
            .manifests
            .into_iter()
            .next()
            .context("OCI manifest without layers")?;
    }
    bail!("OCI indexes nested too deep")
}

/// Imports `archive` into `store` unless it is there; returns the image.
pub fn import(store: &Store, archive: &Path) -> anyhow::Result<Image> {
    if !nix_is_root() {
        bail!("importing a runtime image needs root (file owners and modes are kept)");
    }
    let started = Instant::now();
    let digest = sha256_file(archive)?;
    let id = format!("import-{}", &digest[..16]);
    if let Some(img) = store.get(&id) {
        eprintln!(
            "kiln runtime: {} is already imported as {id}",
            archive.display()
        );
        return Ok(img);
    }
    let names = members(archive)?;
    let kind = if names.iter().any(|n| n == "manifest.json") {
        "docker-archive"
    } else if names.iter().any(|n| n == "index.json") && names.iter().any(|n| n == "oci-layout") {
        "oci-archive"
    } else {
        "tar"
    };
    let dir = store.dir.join(&id);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).context("remove an interrupted import")?;
    }
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    let log = std::fs::File::create(dir.join("build.log"))?;
    if kind == "tar" {
        let mut p = Progress::new(log, 1);
        p.say(&format!(
            "importing {} (a root filesystem) as {id}",
            archive.display()
        ));
        p.run("unpack", &mut untar(archive, &root))?;
    } else {
        let unpacked = dir.join("archive");
        std::fs::create_dir_all(&unpacked)?;
        let mut p = Progress::new(log, 1);
        p.say(&format!("importing {} ({kind}) as {id}", archive.display()));
        p.run("unpack the archive", &mut untar(archive, &unpacked))?;
        let layers = layers(&unpacked, kind)?;
        let mut p = Progress::new(
            std::fs::File::options()
                .append(true)
                .open(dir.join("build.log"))?,
            layers.len(),
        );
        for (i, layer) in layers.iter().enumerate() {
            whiteouts(&root, &members(layer)?)?;
            p.run(&format!("layer {}", i + 1), &mut untar(layer, &root))?;
        }
        std::fs::remove_dir_all(&unpacked)?;
    }
    if !root.join("usr").is_dir() {
        let _ = std::fs::remove_dir_all(&dir);
        bail!("{} has no /usr: not a root filesystem", archive.display());
    }
    let info = ImageInfo {
        id,
        digest,
        source: kind.to_owned(),
        suite: String::new(),
        created: now_secs(),
        seconds: started.elapsed().as_secs(),
        bytes: disk_usage(&root),
    };
    store.complete(&info)?;
    Ok(Image { info, root })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_delete_names_below_and_never_outside_the_image() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("etc/opq")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("etc/gone"), "x").unwrap();
        std::fs::write(root.join("etc/kept"), "x").unwrap();
        std::fs::write(root.join("etc/opq/a"), "x").unwrap();
        std::fs::write(outside.join("victim"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let names = [
            "etc/.wh.gone",
            "etc/opq/.wh..wh..opq",
            "link/.wh.victim",
            "../outside/.wh.victim",
        ]
        .map(String::from);
        whiteouts(&root, &names).unwrap();
        assert!(!root.join("etc/gone").exists());
        assert!(root.join("etc/kept").exists());
        assert!(root.join("etc/opq").is_dir());
        assert!(!root.join("etc/opq/a").exists());
        assert!(outside.join("victim").exists());
    }
}

#[cfg(test)]
mod archive_tests {
    use super::*;

    fn tar_dir(dir: &Path, out: &Path) {
        let st = Command::new("tar")
            .arg("-cf")
            .arg(out)
            .arg("-C")
            .arg(dir)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// A scratch directory, or `None` (skip) when not root: importing needs root.
    fn scratch() -> Option<tempfile::TempDir> {
        if !nix_is_root() {
            eprintln!("SKIP: importing needs root");
            return None;
        }
        Some(tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_docker_archive_imports_its_layers_in_order_with_whiteouts_and_once() {
        let Some(t) = scratch() else {
            return;
        };
        let w = |rel: &str, body: &str| {
            let p = t.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        };
        // layer 1: a tiny root; layer 2 deletes one file, empties a directory, adds one
        w("l1/usr/bin/tool", "v1");
        w("l1/usr/share/old", "x");
        w("l1/etc/opq/a", "x");
        w("l2/usr/share/.wh.old", "");
        w("l2/etc/opq/.wh..wh..opq", "");
        w("l2/etc/opq/b", "new");
        w("l2/usr/bin/tool", "v2");
        std::fs::create_dir_all(t.path().join("img/l1")).unwrap();
        std::fs::create_dir_all(t.path().join("img/l2")).unwrap();
        tar_dir(&t.path().join("l1"), &t.path().join("img/l1/layer.tar"));
        tar_dir(&t.path().join("l2"), &t.path().join("img/l2/layer.tar"));
        w(
            "img/manifest.json",
            r#"[{"Config":"c.json","RepoTags":["x:1"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#,
        );
        let archive = t.path().join("image.tar");
        tar_dir(&t.path().join("img"), &archive);

        let store = Store::new(t.path().join("runtimes"));
        let img = import(&store, &archive).unwrap();
        assert_eq!(img.info.source, "docker-archive");
        assert!(img.info.id.starts_with("import-"));
        let read = |rel: &str| std::fs::read_to_string(img.root.join(rel)).ok();
        assert_eq!(read("usr/bin/tool").as_deref(), Some("v2"));
        assert_eq!(read("usr/share/old"), None);
        assert_eq!(read("etc/opq/a"), None);
        assert_eq!(read("etc/opq/b").as_deref(), Some("new"));
        assert!(!img.root.join("usr/share/.wh.old").exists());
        assert_eq!(store.list().unwrap().len(), 1);
        assert_eq!(store.resolve(&img.info.id).unwrap(), img.root);
        // the same archive again is the same image, found, not unpacked again
        let again = import(&store, &archive).unwrap();
        assert_eq!(again.info, img.info);
    }

    #[test]
    fn an_archive_without_usr_is_refused_and_leaves_nothing() {
        let Some(t) = scratch() else {
            return;
        };
        std::fs::create_dir_all(t.path().join("root/etc")).unwrap();
        let archive = t.path().join("root.tar");
        tar_dir(&t.path().join("root"), &archive);
        let store = Store::new(t.path().join("runtimes"));
        let err = import(&store, &archive).unwrap_err();
        assert!(err.to_string().contains("no /usr"), "{err}");
        assert!(store.list().unwrap().is_empty());
        assert_eq!(std::fs::read_dir(&store.dir).unwrap().count(), 0);
    }
}
