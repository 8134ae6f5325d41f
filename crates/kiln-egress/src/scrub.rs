//! Keeps a service's secrets out of what the jail receives: response
//! headers that carry one are dropped, and in a response body every piece
//! of one is overwritten with `*` (same length, so `Content-Length` stays
//! true) while the body streams through, without buffering it.
//!
//! What counts as a piece of a secret (the guarantee, `docs/egress.md`):
//! any [`FRAGMENT`] consecutive bytes of it, in any ASCII case, as they are
//! or hex- or percent-encoded, and any [`B64_FRAGMENT`] characters of its
//! base64 (standard or URL-safe alphabet, at any of the three alignments).
//! So a reflected secret cannot be rebuilt from slices unless the upstream
//! hands out slices shorter than that (which Range requests would, so the
//! forwarder drops them unless a service allows them).

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use bytes::{Bytes, BytesMut};

use crate::registry::MIN_SCRUBBED_SECRET;

/// Consecutive bytes of a secret that never reach the jail (as they are,
/// hex- or percent-encoded).
pub const FRAGMENT: usize = MIN_SCRUBBED_SECRET;
/// Consecutive base64 characters of a secret that never reach the jail
/// (11 characters carry 8 bytes).
pub const B64_FRAGMENT: usize = 11;

const B64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn hex(bytes: &[u8]) -> Vec<u8> {
    bytes
        .iter()
        .flat_map(|b| format!("{b:02x}").into_bytes())
        .collect()
}

/// Every byte but RFC 3986's unreserved ones as `%XX`.
fn percent(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// The base64 characters of `secret` preceded by `align` other bytes that
/// depend on the secret's bits alone.
fn base64_core(secret: &[u8], align: usize, alphabet: &[u8; 64]) -> Vec<u8> {
    let bits: Vec<bool> = std::iter::repeat_n(0u8, align)
        .chain(secret.iter().copied())
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1 == 1))
        .collect();
    let (first, end) = (8 * align, bits.len());
    bits.chunks(6)
        .enumerate()
        .filter(|(i, c)| 6 * i >= first && 6 * i + 6 <= end && c.len() == 6)
        .map(|(_, c)| alphabet[c.iter().fold(0usize, |v, &b| v << 1 | usize::from(b))])
        .collect()
}

/// What is looked for: every piece of every form of `secret`.
fn pieces(secret: &[u8], out: &mut Vec<Vec<u8>>) {
    for w in secret.windows(FRAGMENT) {
        out.push(w.to_vec());
        out.push(hex(w));
        out.push(percent(w));
    }
    for align in 0..3 {
        for alphabet in [B64_STD, B64_URL] {
            let core = base64_core(secret, align, alphabet);
            out.extend(
                core.windows(B64_FRAGMENT.min(core.len()))
                    .map(<[u8]>::to_vec),
            );
        }
    }
}

/// Streaming redaction of a set of byte strings.
#[derive(Debug)]
pub struct Scrubber {
    matcher: Option<AhoCorasick>,
    /// Bytes held back, as received, because a piece could start in them.
    carry: BytesMut,
    /// Ranges of `carry` that a piece found earlier covers.
    pending: Vec<(usize, usize)>,
    /// Longest piece minus one: what must be held back.
    keep: usize,
    /// Places overwritten so far (overlapping pieces count once).
    pub hits: u64,
}

impl Scrubber {
    /// Scrubs `secrets` (those shorter than [`MIN_SCRUBBED_SECRET`] are
    /// ignored).
    pub fn new(secrets: &[Vec<u8>]) -> Scrubber {
        let mut needles = Vec::new();
        for s in secrets.iter().filter(|s| s.len() >= MIN_SCRUBBED_SECRET) {
            pieces(s, &mut needles);
        }
        needles.sort();
        needles.dedup();
        let keep = needles.iter().map(Vec::len).max().unwrap_or(1) - 1;
        let matcher = (!needles.is_empty()).then(|| {
            AhoCorasickBuilder::new()
                .ascii_case_insensitive(true)
                .match_kind(MatchKind::Standard)
                .build(&needles)
                .expect("a few hundred short patterns always build")
        });
        Scrubber {
            matcher,
            carry: BytesMut::new(),
            pending: Vec::new(),
            keep,
            hits: 0,
        }
    }

    /// Whether `value` contains a piece of a secret.
    pub fn contains_secret(&self, value: &[u8]) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(value))
    }

    /// Scrubs the held-back bytes plus `chunk` up to `cut` (`None`: all of
    /// them) and returns that part. Pieces are searched in the bytes as
    /// received, so one overwritten piece never hides an overlapping one.
    fn scrub(&mut self, chunk: &[u8], cut: impl Fn(usize) -> usize) -> Bytes {
        self.carry.extend_from_slice(chunk);
        let raw = std::mem::take(&mut self.carry);
        let cut = cut(raw.len());
        let mut out = BytesMut::from(&raw[..cut]);
        let mut covered = 0;
        for (start, end) in std::mem::take(&mut self.pending) {
            out[start.min(cut)..end.min(cut)].fill(b'*');
            covered = covered.max(end);
            if end > cut {
                self.pending.push((start.saturating_sub(cut), end - cut));
            }
        }
        let mut spans: Vec<(usize, usize)> = self
            .matcher
            .as_ref()
            .map(|m| {
                m.find_overlapping_iter(&raw[..])
                    .map(|f| (f.start(), f.end()))
                    // one starting at `cut` or later is found again next time
                    .filter(|&(start, _)| start < cut)
                    .collect()
            })
            .unwrap_or_default();
        spans.sort_unstable();
        for (start, end) in spans {
            if start >= covered {
                self.hits += 1;
            }
            covered = covered.max(end);
            out[start..end.min(cut)].fill(b'*');
            if end > cut {
                self.pending.push((start.saturating_sub(cut), end - cut));
            }
        }
        self.carry = BytesMut::from(&raw[cut..]);
        out.freeze()
    }

    /// Feeds one chunk; returns what can be passed on now (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.matcher.is_none() {
            return Bytes::copy_from_slice(chunk);
        }
        let keep = self.keep;
        self.scrub(chunk, |len| len.saturating_sub(keep))
    }

    /// The held-back tail at the end of the body.
    pub fn finish(&mut self) -> Bytes {
        self.scrub(&[], |len| len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secrets: &[&str], chunks: &[&[u8]]) -> (Vec<u8>, u64) {
        let secrets: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
        let mut s = Scrubber::new(&secrets);
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&s.push(c));
        }
        out.extend_from_slice(&s.finish());
        (out, s.hits)
    }

    #[test]
    fn a_secret_is_overwritten_with_the_same_length() {
        let (out, hits) = run(
            &["sk-123456789"],
            &[b"key=sk-123456789; again sk-123456789"],
        );
        assert_eq!(out, b"key=************; again ************");
        assert_eq!(hits, 2);
    }

    #[test]
    fn a_secret_split_across_chunks_is_caught() {
        let body = b"prefix sk-123456789 suffix";
        for split in 0..body.len() {
            for split2 in split..body.len() {
                let (out, hits) = run(
                    &["sk-123456789"],
                    &[&body[..split], &body[split..split2], &body[split2..]],
                );
                assert_eq!(out, b"prefix ************ suffix", "{split} {split2}");
                assert_eq!(hits, 1);
            }
        }
    }

    #[test]
    fn bodies_without_secrets_pass_byte_for_byte() {
        let body: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let chunks: Vec<&[u8]> = body.chunks(4096).collect();
        let (out, hits) = run(&["DeepL-Auth-Key 5f2c9a7e-0b1d:fx"], &chunks);
        assert_eq!(out, body);
        assert_eq!(hits, 0);
    }

    const KEY: &str = "fake-deepl-key-5f2c9a7e-0b1d:fx";

    #[test]
    fn eight_bytes_of_a_secret_are_overwritten_and_seven_pass() {
        let piece = &KEY[3..15];
        let (out, hits) = run(&[KEY], &[format!("a {piece} b").as_bytes()]);
        assert_eq!(out, format!("a {} b", "*".repeat(piece.len())).as_bytes());
        assert_eq!(hits, 1);
        let seven = &KEY[3..10];
        let (out, hits) = run(&[KEY], &[format!("a {seven} b").as_bytes()]);
        assert_eq!(out, format!("a {seven} b").as_bytes());
        assert_eq!(hits, 0);
    }

    #[test]
    fn the_tail_of_a_secret_split_over_chunks_is_overwritten_too() {
        let body = format!("<{KEY}>");
        let b = body.as_bytes();
        for split in 1..b.len() {
            let (out, hits) = run(&[KEY], &[&b[..split], &b[split..]]);
            assert_eq!(
                out,
                format!("<{}>", "*".repeat(KEY.len())).as_bytes(),
                "{split}"
            );
            assert_eq!(hits, 1, "{split}");
        }
    }

    #[test]
    fn a_secret_in_another_case_hex_base64_or_percent_encoded_is_overwritten() {
        use base64::Engine as _;
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let hex: String = KEY.bytes().map(|b| format!("{b:02x}")).collect();
        let mut forms = vec![
            KEY.to_ascii_uppercase(),
            hex.clone(),
            hex.to_ascii_uppercase(),
            KEY.replace(':', "%3A"),
            KEY.replace(':', "%3a"),
        ];
        for prefix in ["", "x", "xy"] {
            let raw = format!("{prefix}{KEY}");
            forms.push(STANDARD.encode(&raw));
            forms.push(URL_SAFE_NO_PAD.encode(&raw));
        }
        for form in forms {
            let (out, hits) = run(&[KEY], &[format!("[{form}]").as_bytes()]);
            let inner = &out[1..out.len() - 1];
            // at most the characters shared with neighbouring bytes stay
            let kept = inner.iter().filter(|&&c| c != b'*').count();
            assert!(kept <= 4, "{form}: {}", String::from_utf8_lossy(&out));
            assert!(hits >= 1, "{form}");
        }
    }

    #[test]
    fn short_secrets_are_ignored_and_headers_are_checked() {
        let (out, _) = run(&["abc"], &[b"abcabc"]);
        assert_eq!(out, b"abcabc");
        let s = Scrubber::new(&[b"longsecret-1".to_vec()]);
        assert!(s.contains_secret(b"Bearer longsecret-1"));
        assert!(!s.contains_secret(b"Bearer other"));
    }
}
