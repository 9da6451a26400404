//! Where Qualcomm's QNN libraries fetched by `scripts/fetch-qnn.sh` live: `$HTPKV_QNN_DIR`, else
//! `$XDG_CACHE_HOME/htpkv/qnn-2.51` (or `~/.cache/htpkv/qnn-2.51`), with the libraries under
//! `onnxruntime_qnn/` (their libc++ beside it, as the wheel ships them).

use std::path::PathBuf;

/// The directory the fetch script fills.
pub fn dir() -> Option<PathBuf> {
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

/// The fetched library `name` (e.g. `libQnnHtp.so`), when it is there.
pub fn fetched(name: &str) -> Option<PathBuf> {
    let p = dir()?.join("onnxruntime_qnn").join(name);
    p.is_file().then_some(p)
}
