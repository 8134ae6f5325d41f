//! Jails on a runtime image: the sandbox takes `/usr`, the merged-/usr links and the `/etc`
//! entries runtimes read from beneath the image's root instead of the host's.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kiln_core::Language;
use kiln_sandbox::{LanguageImage, SandboxConfig};

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

/// The images jails run from: `runtime_image` (the default system, set on `sc` with the
/// image's `/etc` entries) and each language's of `runtime_images` (added to
/// `sc.language_images`). Refuses an image that is not there, naming the key.
pub fn configure(config: &Config, sc: &mut SandboxConfig) -> anyhow::Result<Images> {
    let store = Store::new(&config.runtime_dir);
    // the host's entries (defaults and the language table's): what an image adds to
    let host_etc = sc.etc_binds.clone();
    let default = config
        .runtime_image()
        .map(|name| open(&store, name))
        .transpose()?;
    if let Some(img) = &default {
        sc.image_root = Some(img.root.clone());
        sc.etc_binds = etc_binds_of(&host_etc, Some(&img.root));
    }
    let mut by_language = Vec::new();
    for (lang, name) in config.runtime_images()? {
        let img = name
            .as_deref()
            .map(|n| open(&store, n))
            .transpose()
            .with_context(|| format!("runtime_images.{}", lang.name()))?;
        let root = img.as_ref().map(|i| i.root.clone());
        sc.language_images.push(LanguageImage {
            language: lang,
            etc_binds: etc_binds_of(&host_etc, root.as_deref()),
            image_root: root,
        });
        by_language.push((lang, img));
    }
    Ok(Images {
        default,
        by_language,
    })
}

/// The image `name` names (`default`, an image id or a root's path), with its identity.
fn open(store: &Store, name: &str) -> anyhow::Result<ImageRef> {
    let root = store.resolve(name)?;
    let id = root
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .filter(|n| super::is_image_id(n))
        .map_or_else(|| root.display().to_string(), str::to_owned);
    let digest = store.get(&id).map(|i| i.info.digest);
    Ok(ImageRef { id, digest, root })
}

/// The `/etc` entries bound into jails of a system: the host's list, plus on an image its
/// own [`IMAGE_ETC_FAMILIES`] entries.
fn etc_binds_of(host: &[String], image: Option<&Path>) -> Vec<String> {
    let mut out = host.to_vec();
    for e in image.map(image_etc_entries).unwrap_or_default() {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// The images a server's jails run from: what `/health`, `kiln doctor` and the start-up
/// log name.
#[derive(Debug, Clone, Default)]
pub struct Images {
    /// `runtime_image`'s; `None`: the host's `/usr`.
    pub default: Option<ImageRef>,
    /// The languages of `runtime_images`, each with its own (`None`: the host's `/usr`).
    pub by_language: Vec<(Language, Option<ImageRef>)>,
}

impl Images {
    /// The image jails of `lang` run from; `None`: the host's `/usr`.
    pub fn of(&self, lang: Language) -> Option<&ImageRef> {
        match self.by_language.iter().find(|(l, _)| *l == lang) {
            Some((_, own)) => own.as_ref(),
            None => self.default.as_ref(),
        }
    }
}

/// One image jails run from.
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
