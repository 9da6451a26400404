//! Replays a fuzz target's corpus (`fuzz/corpus/<target>/`) through its check, so that a normal
//! `cargo test` runs every input the fuzzer kept.

use std::path::PathBuf;

pub fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    for f in &files {
        let data = std::fs::read(f).expect("corpus file");
        let run = std::panic::catch_unwind(|| check(&data));
        assert!(run.is_ok(), "{} fails its check", f.display());
    }
}
