//! Stable counterpart of the `relpath` fuzz target: thousands of generated
//! and mutated names through `RelPath::parse`, checked against the shared
//! invariant in `fuzz/checks/relpath.rs` (so the property is enforced by
//! `cargo test` even where nightly and cargo-fuzz are unavailable).

#[path = "../../../fuzz/checks/relpath.rs"]
mod relpath;

use kiln_core::RelPath;
use proptest::prelude::*;
use relpath::check_relpath;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Pieces that tend to matter to a path validator.
fn tricky_piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a",
        "b.txt",
        "/",
        "//",
        "..",
        ".",
        "../",
        "./",
        "\\",
        "\0",
        "\n",
        "\t",
        " ",
        "é",
        "日本",
        "\u{202E}",
        "\u{200B}",
        "\u{FEFF}",
        "\u{FFFD}",
        "\u{7F}",
        "%2e%2e",
        "C:",
        "~",
        "-",
        ".gitignore",
        "a..b",
    ])
    .prop_map(str::to_owned)
    .boxed()
    .prop_union(
        prop::string::string_regex("[a-z]{20,60}")
            .expect("regex")
            .boxed(),
    )
}

/// One safe segment: never `.` or `..` (it starts with a non-dot).
fn safe_segment() -> impl Strategy<Value = String> {
    prop::string::string_regex("[A-Za-z0-9_é日][A-Za-z0-9_. ()-]{0,20}").expect("regex")
}

/// Names that must be accepted: safe segments, depth ≤ 10, ≤ 256 bytes.
fn valid_name() -> impl Strategy<Value = String> {
    prop::collection::vec(safe_segment(), 1..=11)
        .prop_map(|segs| segs.join("/"))
        .prop_filter("at most 256 bytes", |s| s.len() <= 256)
}

/// `name` with `c` inserted at the char boundary at or before byte `at`.
fn insert_at(name: &str, at: usize, c: char) -> String {
    let at = (0..=at.min(name.len()))
        .rev()
        .find(|&k| name.is_char_boundary(k))
        .unwrap_or(0);
    format!("{}{c}{}", &name[..at], &name[at..])
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn arbitrary_text_is_accepted_only_when_safe(s in "(?s).{0,300}") {
        check_relpath(&s);
    }

    #[test]
    fn concatenated_tricky_pieces_are_accepted_only_when_safe(
        pieces in prop::collection::vec(tricky_piece(), 0..24)
    ) {
        check_relpath(&pieces.concat());
    }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn safe_names_are_accepted(name in valid_name()) {
        prop_assert!(check_relpath(&name), "rejected the safe name {:?}", name);
    }

    #[test]
    fn a_safe_name_made_unsafe_is_rejected(
        name in valid_name(),
        at in any::<prop::sample::Index>(),
        how in 0u8..7,
    ) {
        let segs: Vec<&str> = name.split('/').collect();
        let i = at.index(segs.len() + 1);
        let mut bad: Vec<String> = segs.iter().map(|s| (*s).to_owned()).collect();
        let broken = match how {
            0 => { bad.insert(i, "..".into()); bad.join("/") }
            1 => { bad.insert(i, ".".into()); bad.join("/") }
            2 => { bad.insert(i, String::new()); bad.join("/") }
            3 => format!("/{name}"),
            4 => insert_at(&name, at.index(name.len() + 1), '\0'),
            5 => insert_at(&name, at.index(name.len() + 1), '\\'),
            _ => format!("{name}{}", "/x".repeat(11)),
        };
        prop_assert!(RelPath::parse(&broken).is_err(), "accepted {:?}", broken);
        check_relpath(&broken);
    }
}
