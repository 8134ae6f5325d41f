//! Runtime images: `runtime_image` (every language's, by default) and `runtime_images`, the
//! image of each language named there (docs/runtimes.md).

use std::collections::BTreeMap;

use anyhow::bail;
use kiln_core::Language;
use serde::{Deserialize, Serialize};

use super::{Config, DEFAULT_IMAGE, HOST_IMAGE};

/// `runtime_images`: a table (`[runtime_images]` with `r = "import-…"`) or, as environment
/// variables carry it, one line of `lang=image` pairs separated by commas
/// (`KILN_RUNTIME_IMAGES="r=import-…,py=default"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RuntimeImages {
    Table(BTreeMap<String, String>),
    Line(String),
}

impl Default for RuntimeImages {
    fn default() -> Self {
        RuntimeImages::Table(BTreeMap::new())
    }
}

impl RuntimeImages {
    /// The `(language, image)` pairs as written.
    fn pairs(&self) -> anyhow::Result<Vec<(String, String)>> {
        match self {
            RuntimeImages::Table(t) => Ok(t.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            RuntimeImages::Line(line) => line
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => Ok((k.trim().to_owned(), v.trim().to_owned())),
                    None => bail!("runtime_images: {p:?} is not lang=image"),
                })
                .collect(),
        }
    }
}

/// Checks what `key` (`runtime_image`, `runtime_images.<lang>`) names: `default`, `host`, an
/// image id or an absolute path.
pub(super) fn check_image_name(key: &str, image: &str) -> anyhow::Result<()> {
    if !(image == DEFAULT_IMAGE
        || image == HOST_IMAGE
        || crate::runtime::is_image_id(image)
        || image.starts_with('/'))
    {
        bail!(
            "{key} must be `default`, `host`, an image id (recipe-…, import-…; `kiln runtime list`) or an absolute path, not {image:?}"
        );
    }
    Ok(())
}

impl Config {
    /// The image `runtime_image` names (`default`, an image id or a root's path); `None` for
    /// `host`: jails run from the host's `/usr`.
    pub fn runtime_image(&self) -> Option<&str> {
        (self.runtime_image != HOST_IMAGE).then_some(self.runtime_image.as_str())
    }

    /// The languages `runtime_images` gives an image of their own, with it (`None`: `host`),
    /// in table order. Refuses a name the language table does not know, a language named
    /// twice (by its name and an alias, say) and an image name `runtime_image` would refuse.
    pub fn runtime_images(&self) -> anyhow::Result<Vec<(Language, Option<String>)>> {
        let mut out: Vec<(Language, Option<String>)> = Vec::new();
        for (name, image) in self.runtime_images.pairs()? {
            let Some(lang) = Language::resolve(&name) else {
                let known: Vec<&str> = Language::all().map(|l| l.name()).collect();
                bail!(
                    "runtime_images: no language is called {name:?} (languages: {})",
                    known.join(", ")
                );
            };
            if out.iter().any(|(l, _)| *l == lang) {
                bail!(
                    "runtime_images: {} is named twice ({name:?} is one of its names)",
                    lang.name()
                );
            }
            check_image_name(&format!("runtime_images.{name}"), &image)?;
            out.push((lang, (image != HOST_IMAGE).then_some(image)));
        }
        out.sort_by_key(|(l, _)| Language::all().position(|o| o == *l));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(images: RuntimeImages) -> Config {
        Config {
            runtime_images: images,
            ..Config::default()
        }
    }

    /// `runtime_images()` by language name.
    fn named(c: &Config) -> Result<Vec<(&'static str, Option<String>)>, String> {
        Ok(c.runtime_images()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(l, i)| (l.name(), i))
            .collect())
    }

    #[test]
    fn a_table_and_a_line_name_each_languages_image_and_host_is_none() {
        let table = with(RuntimeImages::Table(BTreeMap::from([
            ("R".to_owned(), "import-0123456789abcdef".to_owned()),
            ("python".to_owned(), "host".to_owned()),
        ])));
        let line = with(RuntimeImages::Line(
            " r=import-0123456789abcdef, python = host ,".to_owned(),
        ));
        for c in [table, line] {
            c.validate().unwrap();
            assert_eq!(
                named(&c).unwrap(),
                [
                    ("py", None),
                    ("r", Some("import-0123456789abcdef".to_owned()))
                ]
            );
        }
        assert!(Config::default().runtime_images().unwrap().is_empty());
    }

    #[test]
    fn unknown_languages_twice_named_ones_and_bad_image_names_are_refused_in_one_line() {
        for (images, says) in [
            (
                "cobol=default",
                "no language is called \"cobol\" (languages: py, js",
            ),
            ("py=default,python=host", "py is named twice"),
            (
                "r=debian:13",
                "runtime_images.r must be `default`, `host`, an image id",
            ),
            ("r=rootfs", "runtime_images.r must be"),
            ("r", "\"r\" is not lang=image"),
        ] {
            let err = with(RuntimeImages::Line(images.to_owned()))
                .validate()
                .unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains(says), "{images}: {msg}");
            assert!(!msg.contains('\n'), "{images}: one line: {msg}");
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn the_environment_variable_takes_the_line_form_and_the_file_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.toml");
        std::fs::write(
            &file,
            "[runtime_images]\nr = \"import-0123456789abcdef\"\njs = \"/srv/node-root\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&file)).unwrap();
        assert_eq!(
            named(&c).unwrap(),
            [
                ("js", Some("/srv/node-root".to_owned())),
                ("r", Some("import-0123456789abcdef".to_owned()))
            ]
        );
        figment::Jail::expect_with(|jail| {
            jail.set_env("KILN_RUNTIME_IMAGES", "r=host,go=/srv/go-root");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                named(&c)?,
                [("go", Some("/srv/go-root".to_owned())), ("r", None)]
            );
            jail.set_env("KILN_RUNTIME_IMAGES", "klingon=default");
            let err = format!("{:#}", Config::load(None).unwrap_err());
            assert!(err.contains("no language is called \"klingon\""), "{err}");
            Ok(())
        });
    }
}
