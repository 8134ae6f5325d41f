//! Request paths from the jail: normalised strictly, then matched against a
//! service's allow-list.
//!
//! A path is accepted only in one canonical shape, so that what is checked
//! is exactly what the upstream receives: every segment is non-empty,
//! percent-decoded once to UTF-8 without `/`, `\`, `%` (double encoding),
//! `;` (path parameters, `..;/` tricks), control characters, and is not `.`
//! or `..`. The forwarded path is re-encoded from the decoded segments, so
//! an encoded trick can never reach the upstream in a form that the check
//! did not see.
//!
//! Patterns (`allowed_paths`) are absolute paths whose segments are literal
//! or `*`: a `*` in the middle matches exactly one segment; a `*` as the
//! last segment matches one or more segments (`/v2/document/*` allows
//! `/v2/document/ID` and `/v2/document/ID/result`, not `/v2/document`).

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// Longest path accepted (after the service name).
pub const MAX_PATH_BYTES: usize = 2048;
/// Most segments accepted.
pub const MAX_SEGMENTS: usize = 32;

/// What is percent-encoded when a decoded segment is forwarded: everything
/// but RFC 3986's unreserved characters and the sub-delimiters that are
/// harmless inside a segment.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b';')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A path that passed normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanPath {
    /// Decoded segments.
    segments: Vec<String>,
}

impl CleanPath {
    /// Parses the raw (still percent-encoded) path of a request, relative
    /// to the service (`/v2/document`). `Err` says why in words.
    pub fn parse(raw: &str) -> Result<CleanPath, String> {
        if raw.len() > MAX_PATH_BYTES {
            return Err(format!("the path is longer than {MAX_PATH_BYTES} bytes"));
        }
        let Some(rest) = raw.strip_prefix('/') else {
            return Err("the path must start with /".to_owned());
        };
        if rest.is_empty() {
            return Ok(CleanPath {
                segments: Vec::new(),
            });
        }
        let mut segments = Vec::new();
        for raw_seg in rest.split('/') {
            if segments.len() == MAX_SEGMENTS {
                return Err(format!("the path has more than {MAX_SEGMENTS} segments"));
            }
            if raw_seg.is_empty() {
                return Err("the path has an empty segment (// or a trailing /)".to_owned());
            }
            if raw_seg.contains('\\') {
                return Err("the path contains a backslash".to_owned());
            }
            let decoded = percent_decode_str(raw_seg)
                .decode_utf8()
                .map_err(|_| "the path is not UTF-8 once percent-decoded".to_owned())?;
            if let Some(c) = decoded
                .chars()
                .find(|c| matches!(c, '/' | '\\' | '%' | ';'))
            {
                return Err(format!(
                    "the path segment {raw_seg:?} contains {c:?} (encoded or not): not allowed"
                ));
            }
            if decoded.chars().any(char::is_control) {
                return Err("the path contains a control character".to_owned());
            }
            if decoded == "." || decoded == ".." {
                return Err("the path contains a . or .. segment".to_owned());
            }
            segments.push(decoded.into_owned());
        }
        Ok(CleanPath { segments })
    }

    /// The path as forwarded: each segment percent-encoded, `/`-joined,
    /// with a leading `/` (`/` when empty).
    pub fn encoded(&self) -> String {
        if self.segments.is_empty() {
            return "/".to_owned();
        }
        let mut out = String::new();
        for s in &self.segments {
            out.push('/');
            out.extend(utf8_percent_encode(s, SEGMENT));
        }
        out
    }

    pub fn segments(&self) -> &[String] {
        &self.segments
    }
}

impl std::fmt::Display for CleanPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encoded())
    }
}

/// One entry of `allowed_paths`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Seg>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Literal(String),
    Any,
}

impl PathPattern {
    /// Parses a pattern; it must itself be a clean path (with `*` allowed
    /// as a whole segment).
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let clean = CleanPath::parse(text).map_err(|e| format!("allowed path {text:?}: {e}"))?;
        if clean.encoded() != text {
            return Err(format!(
                "allowed path {text:?} is not in canonical form (write {:?})",
                clean.encoded()
            ));
        }
        let segments = clean
            .segments
            .into_iter()
            .map(|s| {
                if s == "*" {
                    Ok(Seg::Any)
                } else if s.contains('*') {
                    Err(format!(
                        "allowed path {text:?}: * must be a whole segment (\"/a/*/b\")"
                    ))
                } else {
                    Ok(Seg::Literal(s))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, path: &CleanPath) -> bool {
        let p = &path.segments;
        let n = self.segments.len();
        if n == 0 {
            return p.is_empty();
        }
        let tail_any = self.segments[n - 1] == Seg::Any;
        if tail_any {
            if p.len() < n {
                return false;
            }
        } else if p.len() != n {
            return false;
        }
        self.segments.iter().zip(p).all(|(s, got)| match s {
            Seg::Any => true,
            Seg::Literal(l) => l == got,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> CleanPath {
        CleanPath::parse(raw).unwrap_or_else(|e| panic!("{raw:?} refused: {e}"))
    }

    #[test]
    fn ordinary_paths_pass_and_forward_unchanged() {
        for raw in [
            "/v2/document",
            "/v2/document/A1B2C3",
            "/v2/document/A1B2C3/result",
            "/v1/files/my-file_1.2~x",
            "/",
        ] {
            assert_eq!(ok(raw).encoded(), raw);
        }
        // a harmless encoded character is decoded and re-encoded canonically
        assert_eq!(ok("/a%20b/%41").encoded(), "/a%20b/A");
    }

    #[test]
    fn traversal_and_encoding_tricks_are_refused() {
        for raw in [
            "/v2/../admin",
            "/v2/./document",
            "/v2/%2e%2e/admin",
            "/v2/%2E%2E/admin",
            "/v2/.%2e/admin",
            "/v2/document%2f..%2fadmin",
            "/v2/document%2F..",
            "/v2/%252e%252e/admin",
            "/v2/document%5c..%5cadmin",
            "/v2\\..\\admin",
            "/v2/..;/admin",
            "/v2/document;jsessionid=1",
            "/v2//document",
            "/v2/document/",
            "/v2/%00",
            "/v2/a%0d%0aHost:%20evil",
            "/v2/%ff",
            "v2/document",
            "",
        ] {
            assert!(CleanPath::parse(raw).is_err(), "{raw:?} accepted");
        }
    }

    #[test]
    fn very_long_or_deep_paths_are_refused() {
        assert!(CleanPath::parse(&format!("/{}", "a".repeat(MAX_PATH_BYTES))).is_err());
        assert!(CleanPath::parse(&"/a".repeat(MAX_SEGMENTS + 1)).is_err());
        assert!(CleanPath::parse(&"/a".repeat(MAX_SEGMENTS)).is_ok());
    }

    #[test]
    fn the_seed_patterns_allow_the_deepl_document_flow_only() {
        let pats: Vec<PathPattern> = ["/v2/document", "/v2/document/*"]
            .iter()
            .map(|p| PathPattern::parse(p).expect("pattern"))
            .collect();
        let allowed = |raw: &str| pats.iter().any(|p| p.matches(&ok(raw)));
        assert!(allowed("/v2/document"));
        assert!(allowed("/v2/document/ABC"));
        assert!(allowed("/v2/document/ABC/result"));
        assert!(!allowed("/v2/documents"));
        assert!(!allowed("/v2/usage"));
        assert!(!allowed("/v2"));
        assert!(!allowed("/"));
        assert!(!allowed("/v3/document/ABC"));
    }

    #[test]
    fn a_star_in_the_middle_is_exactly_one_segment() {
        let p = PathPattern::parse("/v1/items/*/meta").expect("pattern");
        assert!(p.matches(&ok("/v1/items/7/meta")));
        assert!(!p.matches(&ok("/v1/items/7/8/meta")));
        assert!(!p.matches(&ok("/v1/items/meta")));
        assert!(!p.matches(&ok("/v1/items/7/meta/x")));
    }

    #[test]
    fn patterns_must_be_canonical() {
        for bad in ["v2/document", "/v2/../x", "/v2/doc*", "/v2/", "/v2//x"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PathPattern::parse("/").expect("root").matches(&ok("/")));
    }
}
