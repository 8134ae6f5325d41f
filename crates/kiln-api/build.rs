//! Embeds the console's CodeMirror bundle when it has been built.
//!
//! `scripts/build-console.sh` bundles `console/` (npm + esbuild) into
//! `console/dist/editor.js`; `KILN_CONSOLE_EDITOR` names another file. When
//! neither exists the bundle is empty and the console shows a plain
//! `<textarea>`, so `cargo build` alone never needs npm.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=KILN_CONSOLE_EDITOR");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let source = std::env::var_os("KILN_CONSOLE_EDITOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../console/dist/editor.js"));
    // watched even while absent: building the bundle later re-embeds it
    println!("cargo::rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it")).join("editor.js");
    let bundle = std::fs::read(&source).unwrap_or_default();
    if bundle.is_empty() {
        println!(
            "cargo::warning=console editor bundle missing or empty at {} (run scripts/build-console.sh); the console uses a plain textarea",
            source.display()
        );
    }
    std::fs::write(&out, bundle).expect("write OUT_DIR/editor.js");
}
