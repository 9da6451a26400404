//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The stories260K model: `$HTPKV_MODEL_DIR`, else the embedded copy committed in this tree
/// (`models/stories260K`), so these tests always run.
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("HTPKV_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/stories260K"));
    assert!(
        dir.join("stories260K.bin").is_file(),
        "the stories260K model is missing from {} (it is committed under models/stories260K)",
        dir.display()
    );
    dir
}
