//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use model::llama2c::ModelFiles;

/// `<workspace root>/../shared/models/stories260K`, derived from this crate's manifest dir.
pub fn shared_model_dir() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let workspace = crate_dir.parent().unwrap_or(&crate_dir).to_path_buf();
    workspace.join("../shared/models/stories260K")
}

/// The model files ($HTPKV_MODEL_DIR or the shared dir), or `None` after printing why the
/// calling test is skipped.
pub fn model_files(test: &str) -> Option<ModelFiles> {
    match ModelFiles::discover_with(None, &[shared_model_dir()]) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("SKIPPED {test}: the stories260K model is absent.\n{e}");
            None
        }
    }
}
