//! Runtime images: root filesystems jails use for `/usr` and their system files instead of
//! the host's (see docs/runtimes.md).
//!
//! An image lives in `<runtime dir>/<id>/`: `rootfs/` (the filesystem), `build.log` and,
//! written last, `image.json` (its [`ImageInfo`]); a directory without `image.json` is an
//! interrupted build or import and is never used. A built image's id is the first 16 hex
//! digits of its recipe's SHA-256 (`recipe-…`), an imported one's those of the archive's
//! (`import-…`), so the same recipe or archive always names the same image.

mod build;
mod import;
pub mod jail;
pub mod node;

mod progress;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use build::build;
pub use import::import;

/// The default recipe, compiled in: `kiln runtime build` without `--recipe` builds it, and
/// `runtime_image = "default"` names its image.
pub const DEFAULT_RECIPE: &str = include_str!("../../../../resources/runtime/recipe.toml");

/// The marker file of a complete image.
const MARKER: &str = "image.json";

/// What an image is built from: a Debian release bootstrapped with `debootstrap`, packages,
/// PyPI wheels, the official Node.js build and setup commands.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub suite: String,
    pub mirror: String,
    #[serde(default = "minbase")]
    pub variant: String,
    #[serde(default)]
    pub packages: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub setup: Vec<String>,
    /// The official Node.js build, installed after the packages (see [`node`]).
    #[serde(default)]
    pub node: Option<node::NodeRecipe>,
    /// JavaScript packages installed for every program, after node (see [`node::NpmRecipe`]).
    #[serde(default)]
    pub npm: Option<node::NpmRecipe>,
    /// SHA-256 of the recipe's text, hex.
    #[serde(skip)]
    pub digest: String,
}

fn minbase() -> String {
    "minbase".to_owned()
}

impl Recipe {
    /// Parses a recipe's text. Package and wheel names are checked to be plain words, so none
    /// can smuggle an option or a shell word into the commands they are passed to.
    pub fn parse(text: &str) -> anyhow::Result<Recipe> {
        let mut r: Recipe = toml_from_str(text).context("read the runtime recipe")?;
        for name in r
            .packages
            .iter()
            .chain(&r.pip)
            .chain([&r.suite, &r.variant])
        {
            let plain = !name.is_empty()
                && !name.starts_with('-')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._+-=:<>~".contains(c));
            if !plain {
                bail!("recipe: {name:?} is not a package name");
            }
        }
        if !(r.mirror.starts_with("http://") || r.mirror.starts_with("https://")) {
            bail!("recipe: mirror must be an http(s) URL");
        }
        if let Some(node) = &r.node {
            node.validate()?;
        }
        if let Some(npm) = &r.npm {
            if r.node.is_none() {
                bail!("recipe: [npm] needs the [node] table (its packages run on that node)");
            }
            npm.validate()?;
        }
        r.digest = hex(&Sha256::digest(text.as_bytes()));
        Ok(r)
    }

    /// The id of the image this recipe builds.
    pub fn image_id(&self) -> String {
        format!("recipe-{}", &self.digest[..16])
    }
}

fn toml_from_str<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    use figment::Figment;
    use figment::providers::{Format, Toml};
    Ok(Figment::from(Toml::string(text)).extract()?)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An image's identity and facts, as written in its `image.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ImageInfo {
    /// `recipe-<hex>` or `import-<hex>`: the directory name.
    pub id: String,
    /// Full SHA-256 of the recipe text or of the imported archive.
    pub digest: String,
    /// `recipe` or the kind of archive imported (`tar`, `docker-archive`, `oci-archive`).
    pub source: String,
    /// The Debian suite of a built image; empty for an import.
    #[serde(default)]
    pub suite: String,
    /// Unix seconds when it was completed.
    pub created: u64,
    /// Seconds the build or import took.
    pub seconds: u64,
    /// Bytes the root filesystem takes on disk.
    pub bytes: u64,
}

/// A complete image on disk.
#[derive(Debug, Clone)]
pub struct Image {
    pub info: ImageInfo,
    pub root: PathBuf,
}

/// The directory images live in.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    fn image_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The complete image `id`, if there is one.
    pub fn get(&self, id: &str) -> Option<Image> {
        if !is_image_id(id) {
            return None;
        }
        let dir = self.image_dir(id);
        let info: ImageInfo =
            serde_json::from_slice(&std::fs::read(dir.join(MARKER)).ok()?).ok()?;
        (info.id == id).then(|| Image {
            info,
            root: dir.join("rootfs"),
        })
    }

    /// Every complete image, by id.
    pub fn list(&self) -> anyhow::Result<Vec<Image>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).with_context(|| format!("read {}", self.dir.display())),
        };
        for entry in entries.flatten() {
            if let Some(img) = entry.file_name().to_str().and_then(|id| self.get(id)) {
                out.push(img);
            }
        }
        out.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(out)
    }

    /// What `runtime_image` names: `default` (the compiled-in recipe's image), an image id,
    /// or an absolute path to a root filesystem (used as it is).
    pub fn resolve(&self, name: &str) -> anyhow::Result<PathBuf> {
        if name.starts_with('/') {
            let root = PathBuf::from(name);
            if !root.join("usr").is_dir() {
                bail!("runtime_image {name}: no usr directory there");
            }
            return Ok(root);
        }
        let id = if name == "default" {
            Recipe::parse(DEFAULT_RECIPE)?.image_id()
        } else {
            name.to_owned()
        };
        match self.get(&id) {
            Some(img) => Ok(img.root),
            None if name == "default" => bail!(
                "the default runtime image {id} is not built in {}: run `kiln runtime build` once \
                 (about 15 minutes and 4 GB; scripts/serve.sh does it), or set runtime_image = \
                 \"host\" to run jails from the host's /usr",
                self.dir.display()
            ),
            None => bail!(
                "runtime image {id} is not in {}: build it with `kiln runtime build --recipe`, \
                 or import it with `kiln runtime import` (`kiln runtime list` shows what is there)",
                self.dir.display()
            ),
        }
    }

    /// Writes `info` as the image's marker: the last step of a build or an import.
    fn complete(&self, info: &ImageInfo) -> anyhow::Result<()> {
        let dir = self.image_dir(&info.id);
        let tmp = dir.join(".image.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(info)?)?;
        std::fs::rename(&tmp, dir.join(MARKER))?;
        Ok(())
    }
}

/// `recipe-` or `import-` and 16 hex digits: nothing that could leave the store's directory.
pub fn is_image_id(id: &str) -> bool {
    let hex_part = id
        .strip_prefix("recipe-")
        .or_else(|| id.strip_prefix("import-"));
    hex_part.is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Bytes `path` takes on disk (allocated blocks), not following symlinks; hard links once.
pub(crate) fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        total += m.blocks() * 512;
        if m.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
    total
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `1.2 GB`-style size.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_recipe_parses_and_its_hash_names_the_image() {
        let r = Recipe::parse(DEFAULT_RECIPE).unwrap();
        assert_eq!(r.suite, "trixie");
        assert!(r.packages.iter().any(|p| p == "python3-pandas"));
        assert!(is_image_id(&r.image_id()));
        let changed = Recipe::parse(&format!("{DEFAULT_RECIPE}\n# changed\n")).unwrap();
        assert_ne!(r.image_id(), changed.image_id());
    }

    #[test]
    fn recipe_rejects_option_or_shell_words_as_package_names() {
        for bad in ["-o=APT::x", "foo;rm", "a b", "$(x)", ""] {
            let text = format!(
                "suite = \"trixie\"\nmirror = \"http://deb.debian.org/debian\"\npackages = [{bad:?}]\n"
            );
            assert!(Recipe::parse(&text).is_err(), "{bad:?} accepted");
        }
        let bad_mirror = "suite = \"trixie\"\nmirror = \"file:///etc\"\n";
        assert!(Recipe::parse(bad_mirror).is_err());
    }

    #[test]
    fn image_ids_cannot_name_a_path_outside_the_store() {
        assert!(is_image_id("recipe-0123456789abcdef"));
        assert!(is_image_id("import-0123456789abcdef"));
        for bad in [
            "../etc",
            "recipe-../../x",
            "recipe-0123",
            "other-0123456789abcdef",
        ] {
            assert!(!is_image_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_missing_default_image_names_the_build_command_and_the_host_opt_out() {
        let dir = tempfile::tempdir().unwrap();
        let err = Store::new(dir.path()).resolve("default").unwrap_err();
        let msg = format!("{err:#}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert!(msg.contains("`kiln runtime build`"), "{msg}");
        assert!(msg.contains("runtime_image = \"host\""), "{msg}");
        let id = Recipe::parse(DEFAULT_RECIPE).unwrap().image_id();
        assert!(msg.contains(&id), "{msg}");
    }

    #[test]
    fn an_image_without_its_marker_is_not_listed_or_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let id = "recipe-0123456789abcdef";
        std::fs::create_dir_all(dir.path().join(id).join("rootfs/usr")).unwrap();
        assert!(store.list().unwrap().is_empty());
        assert!(store.resolve(id).is_err());
        let info = ImageInfo {
            id: id.to_owned(),
            digest: "0123456789abcdef".repeat(4),
            source: "recipe".to_owned(),
            suite: "trixie".to_owned(),
            created: 1,
            seconds: 2,
            bytes: 3,
        };
        store.complete(&info).unwrap();
        assert_eq!(store.list().unwrap().len(), 1);
        assert_eq!(
            store.resolve(id).unwrap(),
            dir.path().join(id).join("rootfs")
        );
    }
}
