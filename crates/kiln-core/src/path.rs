//! Relative file names inside `/mnt/data`.
//!
//! Every name that crosses the API (upload filenames, `files[].name`, walker
//! output) is a [`RelPath`]: relative, POSIX, canonical, bounded. Anything
//! that could escape the workspace or confuse a filesystem is rejected.

use std::fmt;

/// Longest accepted name, in bytes.
pub const MAX_PATH_LEN: usize = 256;
/// Deepest accepted name, in directories (a file at depth 10 has 10 parents).
pub const MAX_DEPTH: usize = 10;

/// A validated relative path such as `reports/q1.csv`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("name is empty")]
    Empty,
    #[error("name is longer than {MAX_PATH_LEN} bytes")]
    TooLong,
    #[error("name is nested deeper than {MAX_DEPTH} directories")]
    TooDeep,
    #[error("name must be relative")]
    Absolute,
    #[error("name must not contain '.' or '..' segments or empty segments")]
    NotCanonical,
    #[error("name contains a forbidden character")]
    ForbiddenChar,
}

impl RelPath {
    pub fn parse(s: &str) -> Result<Self, PathError> {
        validate(s)?;
        Ok(RelPath(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// Parent directories, outermost first (`a/b/c.txt` → `a`, `a/b`).
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0.match_indices('/').map(move |(i, _)| &self.0[..i])
    }

    /// Number of parent directories.
    pub fn depth(&self) -> usize {
        self.0.matches('/').count()
    }

    /// Lower-cased extension including the dot (`.csv`), if any.
    pub fn extension(&self) -> Option<String> {
        let name = self.file_name();
        let dot = name.rfind('.')?;
        if dot == 0 && name.len() > 1 {
            // a dotfile: the whole name is the "extension" (`.gitignore`)
            return Some(name.to_ascii_lowercase());
        }
        Some(name[dot..].to_ascii_lowercase())
    }
}

fn validate(s: &str) -> Result<(), PathError> {
    if s.is_empty() {
        return Err(PathError::Empty);
    }
    if s.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong);
    }
    if s.starts_with('/') {
        return Err(PathError::Absolute);
    }
    if s.chars().any(forbidden_char) {
        return Err(PathError::ForbiddenChar);
    }
    let mut segments = 0usize;
    for seg in s.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(PathError::NotCanonical);
        }
        segments += 1;
    }
    if segments - 1 > MAX_DEPTH {
        return Err(PathError::TooDeep);
    }
    Ok(())
}

/// NUL, backslash, control characters, and Unicode that renders invisibly or
/// reorders text (bidi overrides, zero-width joiners, BOM).
fn forbidden_char(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}' | '\u{FFFD}')
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelPath({:?})", self.0)
    }
}

impl AsRef<str> for RelPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: &str) -> Result<(), PathError> {
        RelPath::parse(s).map(|_| ())
    }

    #[test]
    fn accepts_plain_and_nested_names() {
        assert!(check("data.csv").is_ok());
        assert!(check("reports/q1.csv").is_ok());
        assert!(check("pptx/editing.md").is_ok());
        assert!(check("my file (1).txt").is_ok());
        assert!(check("données/日本語.txt").is_ok());
        assert!(check(".gitignore").is_ok());
        assert!(check("a..b.txt").is_ok());
    }

    #[test]
    fn rejects_traversal_absolute_and_odd_names() {
        assert_eq!(check(""), Err(PathError::Empty));
        assert_eq!(check("/etc/passwd"), Err(PathError::Absolute));
        assert_eq!(check("../x"), Err(PathError::NotCanonical));
        assert_eq!(check("a/../../x"), Err(PathError::NotCanonical));
        assert_eq!(check("a//b"), Err(PathError::NotCanonical));
        assert_eq!(check("a/"), Err(PathError::NotCanonical));
        assert_eq!(check("./a"), Err(PathError::NotCanonical));
        assert_eq!(check("a\\b"), Err(PathError::ForbiddenChar));
        assert_eq!(check("a\0b"), Err(PathError::ForbiddenChar));
        assert_eq!(check("a\nb"), Err(PathError::ForbiddenChar));
        assert_eq!(check("evil\u{202E}txt.exe"), Err(PathError::ForbiddenChar));
        assert_eq!(check(&"a".repeat(257)), Err(PathError::TooLong));
        let deep = (0..11).map(|_| "d").collect::<Vec<_>>().join("/") + "/f.txt";
        assert_eq!(check(&deep), Err(PathError::TooDeep));
        let ok_deep = (0..10).map(|_| "d").collect::<Vec<_>>().join("/") + "/f.txt";
        assert!(check(&ok_deep).is_ok());
    }

    #[test]
    fn extension_and_ancestors() {
        let p = RelPath::parse("a/b/Chart.PNG").unwrap();
        assert_eq!(p.extension().as_deref(), Some(".png"));
        assert_eq!(p.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(p.depth(), 2);
        assert_eq!(RelPath::parse("Dockerfile").unwrap().extension(), None);
        assert_eq!(
            RelPath::parse(".env").unwrap().extension().as_deref(),
            Some(".env")
        );
    }
}
