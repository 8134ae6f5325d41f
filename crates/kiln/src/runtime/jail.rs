//! Jails on a runtime image: the sandbox takes `/usr`, the merged-/usr links and the `/etc`
//! entries runtimes read from beneath the image's root instead of the host's.

use std::path::{Path, PathBuf};

use kiln_sandbox::SandboxConfig;

use super::Store;
use crate::config::Config;

/// `/etc` entries of an image bound into jails on top of the sandbox's defaults and the
/// language table's (whose versioned names, `python3.11`, `java-17-openjdk`, are the host's):
/// every entry whose name starts with one of these, so the image's own versions come along.
const IMAGE_ETC_FAMILIES: &[&str] = &[
    "python3",      // python3, python3.13: sitecustomize and friends
    "java-",        // java-21-openjdk: the JDK's conf/ and security/ are links into it
    "php",          // php/8.4/cli/php.ini and conf.d
    "R",            // Rprofile.site, Renviron, ldpaths
    "ImageMagick-", // policy.xml
    "libreoffice",  // sofficerc and the registry LibreOffice starts from
    "fonts",        // fontconfig
    "papersize",    // libpaper: LibreOffice, R
    "gtk-3.0",      // LibreOffice's VCL reads it even headless
    "mime.types",
    "gitconfig",
];

/// The image jails run from, unless `runtime_image` is `host`: sets it on `sc` (and the
/// image's `/etc` entries) and returns its root and id.
pub fn configure(config: &Config, sc: &mut SandboxConfig) -> anyhow::Result<Option<ImageRef>> {
    let Some(name) = config.runtime_image() else {
        return Ok(None);
    };
    let store = Store::new(&config.runtime_dir);
    let root = store.resolve(name)?;
    for e in image_etc_entries(&root) {
        if !sc.etc_binds.contains(&e) {
            sc.etc_binds.push(e);
        }
    }
    sc.image_root = Some(root.clone());
    let id = root
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .filter(|n| super::is_image_id(n))
        .map_or_else(|| root.display().to_string(), str::to_owned);
    let digest = store.get(&id).map(|i| i.info.digest);
    Ok(Some(ImageRef { id, digest, root }))
}

/// The image a server runs its jails from: what `/health`, `kiln doctor` and the start-up log
/// name.
#[derive(Debug, Clone)]
pub struct ImageRef {
    /// The image id, or the root's path for a root given by path.
    pub id: String,
    /// The full recipe or archive digest, for an image of the store.
    pub digest: Option<String>,
    pub root: PathBuf,
}

/// Names in the image's `/etc` of the [`IMAGE_ETC_FAMILIES`].
fn image_etc_entries(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root.join("etc"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| IMAGE_ETC_FAMILIES.iter().any(|f| n.starts_with(f)))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_etc_entries_take_the_images_versions_and_nothing_secret() {
        let t = tempfile::tempdir().unwrap();
        for n in [
            "python3.13",
            "java-21-openjdk",
            "R",
            "shadow",
            "passwd",
            "ssh",
            "php",
        ] {
            std::fs::create_dir_all(t.path().join("etc").join(n)).unwrap();
        }
        assert_eq!(
            image_etc_entries(t.path()),
            vec!["R", "java-21-openjdk", "php", "python3.13"]
        );
    }
}
