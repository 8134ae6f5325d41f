//! Keeps a service's secrets out of what the jail receives: response
//! headers that contain one are dropped, and every occurrence in a response
//! body is overwritten with `*` (same length, so `Content-Length` stays
//! true) while the body streams through, without buffering it.

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use crate::registry::MIN_SCRUBBED_SECRET;

/// Streaming redaction of a set of byte strings.
#[derive(Debug)]
pub struct Scrubber {
    finders: Vec<memmem::Finder<'static>>,
    /// Bytes held back because a secret could start in them.
    carry: BytesMut,
    /// Longest secret minus one: what must be held back.
    keep: usize,
    /// Occurrences overwritten so far.
    pub hits: u64,
}

impl Scrubber {
    /// Scrubs `secrets` (those shorter than [`MIN_SCRUBBED_SECRET`] are
    /// ignored).
    pub fn new(secrets: &[Vec<u8>]) -> Scrubber {
        let finders: Vec<memmem::Finder<'static>> = secrets
            .iter()
            .filter(|s| s.len() >= MIN_SCRUBBED_SECRET)
            .map(|s| memmem::Finder::new(s).into_owned())
            .collect();
        let keep = finders.iter().map(|f| f.needle().len()).max().unwrap_or(1) - 1;
        Scrubber {
            finders,
            carry: BytesMut::new(),
            keep,
            hits: 0,
        }
    }

    /// Whether `value` contains a secret.
    pub fn contains_secret(&self, value: &[u8]) -> bool {
        self.finders.iter().any(|f| f.find(value).is_some())
    }

    fn overwrite(&mut self, buf: &mut [u8]) {
        for f in &self.finders {
            let n = f.needle().len();
            let mut from = 0;
            while let Some(i) = f.find(&buf[from..]) {
                let at = from + i;
                buf[at..at + n].fill(b'*');
                self.hits += 1;
                from = at + n;
            }
        }
    }

    /// Feeds one chunk; returns what can be passed on now (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.finders.is_empty() {
            return Bytes::copy_from_slice(chunk);
        }
        self.carry.extend_from_slice(chunk);
        let mut buf = std::mem::take(&mut self.carry);
        self.overwrite(&mut buf);
        // any occurrence starting before `cut` ended inside `buf` and is
        // overwritten; one starting later may still be completed
        let cut = buf.len().saturating_sub(self.keep);
        self.carry = buf.split_off(cut);
        buf.freeze()
    }

    /// The held-back tail at the end of the body.
    pub fn finish(&mut self) -> Bytes {
        let mut buf = std::mem::take(&mut self.carry);
        self.overwrite(&mut buf);
        buf.freeze()
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
        let (out, hits) = run(&["DeepL-Auth-Key abcdefgh"], &chunks);
        assert_eq!(out, body);
        assert_eq!(hits, 0);
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
