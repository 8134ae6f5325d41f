//! Embeds the console's CodeMirror bundle and Swagger UI when they have
//! been built.
//!
//! `scripts/build-console.sh` bundles `console/` (npm + esbuild) into
//! `console/dist/editor.js` and copies Swagger UI's bundle and stylesheet to
//! `console/dist/swagger-ui.{js,css}`; `KILN_CONSOLE_EDITOR` names another
//! editor file. A file that does not exist is embedded empty: the console
//! then shows a plain `<textarea>`, and the API reference page says it was
//! not built, so `cargo build` alone never needs npm.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=KILN_CONSOLE_EDITOR");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let dist = manifest.join("../../console/dist");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let editor = std::env::var_os("KILN_CONSOLE_EDITOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dist.join("editor.js"));
    embed(
        &editor,
        &out.join("editor.js"),
        "the console uses a plain textarea",
    );
    for name in ["swagger-ui.js", "swagger-ui.css"] {
        embed(
            &dist.join(name),
            &out.join(name),
            "the API reference page is not built",
        );
    }
}

/// Copies `source` to `out` (empty when missing), watched even while absent:
/// building the bundle later re-embeds it.
fn embed(source: &Path, out: &Path, without: &str) {
    println!("cargo::rerun-if-changed={}", source.display());
    let bundle = std::fs::read(source).unwrap_or_default();
    if bundle.is_empty() {
        println!(
            "cargo::warning={} missing or empty (run scripts/build-console.sh); {without}",
            source.display()
        );
    }
    std::fs::write(out, bundle).expect("write to OUT_DIR");
}
