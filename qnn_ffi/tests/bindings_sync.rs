// Its own binary: built only with `--features check-bindings` (bindgen needs libclang), and the generated bindings name it.
//! Keeps `src/bindings.rs` in sync with `include/htpkv_qnn.h`: regenerates the bindings with
//! bindgen (pinned options from `bindgen_config.rs`; needs libclang, e.g. `apt-get install
//! libclang-dev`) and fails when they differ from the checked-in file, ignoring whitespace.
//! `HTPKV_BLESS_BINDINGS=1` rewrites the checked-in file instead.

include!("../bindgen_config.rs");

use std::path::Path;

fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = dir.join("include").join("htpkv_qnn.h");
    let bindings = htpkv_bindgen_builder(
        &header.display().to_string(),
        "x86_64-unknown-linux-gnu",
        Some(".*htpkv_qnn\\.h"),
    )
    .generate()
    .unwrap_or_else(|e| {
        panic!(
            "bindgen could not process {}: {e} (is libclang installed? apt-get install libclang-dev)",
            header.display()
        )
    });
    format!("{BINDINGS_BANNER}\n\n{bindings}")
}

fn normalized(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn checked_in_bindings_match_the_header() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("bindings.rs");
    let fresh = generate();
    if std::env::var_os("HTPKV_BLESS_BINDINGS").is_some() {
        std::fs::write(&path, &fresh).expect("write src/bindings.rs");
        return;
    }
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    if normalized(&checked_in) != normalized(&fresh) {
        let first_diff = checked_in
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a.trim() != b.trim())
            .unwrap_or(checked_in.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is out of date with include/htpkv_qnn.h (first difference near line {}); \
             regenerate with HTPKV_BLESS_BINDINGS=1 cargo test -p qnn_ffi --test bindings_sync",
            path.display(),
            first_diff + 1
        );
    }
}

#[test]
fn normalization_ignores_only_whitespace() {
    assert_eq!(normalized("a b\n c"), normalized("abc"));
    assert_ne!(normalized("pub a: u32"), normalized("pub a: u64"));
}
