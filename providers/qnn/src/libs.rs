//! Qualcomm's QNN 2.51 libraries for x86_64 Linux as `scripts/fetch-qnn.sh` places them (from the
//! PyPI wheel `onnxruntime-qnn==2.7.0`; the user's download, never committed):
//!
//! ```text
//! $HTPKV_QNN_DIR/onnxruntime_qnn/       libQnnHtp.so libQnnSystem.so libGenie.so ...
//! $HTPKV_QNN_DIR/onnxruntime_qnn.libs/  their libc++ (found through RPATH $ORIGIN/../onnxruntime_qnn.libs)
//! ```
//!
//! `HTPKV_QNN_DIR` defaults to `${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/qnn-2.51`. The CLI's
//! `--qnn-backend`/`--qnn-system` default to these libraries when they are present. Presence is a
//! file check only: the script checks the hashes.

use std::path::{Path, PathBuf};

/// The environment variable naming the folder `scripts/fetch-qnn.sh` fills.
pub const ENV_QNN_DIR: &str = "HTPKV_QNN_DIR";

/// How to get the libraries, for messages.
pub const FETCH_QNN: &str =
    "run scripts/fetch-qnn.sh to fetch Qualcomm's QNN 2.51 libraries (onnxruntime-qnn 2.7.0 wheel)";

/// The fetched libraries' folder (`$HTPKV_QNN_DIR`), whose `onnxruntime_qnn/` holds the libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QnnLibs {
    /// `$HTPKV_QNN_DIR`.
    pub root: PathBuf,
}

impl QnnLibs {
    /// The folder of the libraries (`onnxruntime_qnn/`): what `LD_LIBRARY_PATH` must reach for
    /// libraries that load their siblings by bare name (Genie loads `libQnnHtp.so`).
    pub fn lib_dir(&self) -> PathBuf {
        self.root.join("onnxruntime_qnn")
    }

    /// `libQnnHtp.so`: the HTP backend (emulated on x86).
    pub fn backend(&self) -> PathBuf {
        self.lib_dir().join("libQnnHtp.so")
    }

    /// `libQnnSystem.so`.
    pub fn system(&self) -> PathBuf {
        self.lib_dir().join("libQnnSystem.so")
    }

    /// `libGenie.so` (Genie 1.21).
    pub fn genie(&self) -> PathBuf {
        self.lib_dir().join("libGenie.so")
    }

    /// `libQnnSaver.so`: records every QNN call a client makes.
    pub fn saver(&self) -> PathBuf {
        self.lib_dir().join("libQnnSaver.so")
    }

    /// Whether `path` is this folder's backend library (so its system library is the default).
    pub fn is_backend(&self, path: &Path) -> bool {
        path == self.backend()
    }

    /// The fetched libraries, from `$HTPKV_QNN_DIR` or the default cache folder: `Some` when
    /// `libQnnHtp.so`, `libQnnSystem.so` and `libGenie.so` are there.
    pub fn fetched() -> Option<QnnLibs> {
        let root = match std::env::var_os(ENV_QNN_DIR) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => default_root()?,
        };
        let libs = QnnLibs { root };
        [libs.backend(), libs.system(), libs.genie()]
            .iter()
            .all(|p| p.is_file())
            .then_some(libs)
    }
}

/// The QNN backend library a command uses: `explicit` (its `--qnn-backend`), else
/// `$HTPKV_QNN_BACKEND`, else the fetched `libQnnHtp.so`; `None` when there is none.
pub fn backend_library(explicit: Option<&Path>) -> Option<PathBuf> {
    qnn_ffi::resolve_path(explicit, qnn_ffi::ENV_BACKEND, "backend")
        .ok()
        .or_else(|| QnnLibs::fetched().map(|l| l.backend()))
}

/// The QNN system library to go with `backend`: `explicit` (its `--qnn-system`), else
/// `$HTPKV_QNN_SYSTEM`, else the fetched `libQnnSystem.so` when `backend` is the fetched
/// `libQnnHtp.so`; `None` leaves the choice to the caller (e.g. the backend library itself).
pub fn system_library(explicit: Option<&Path>, backend: &Path) -> Option<PathBuf> {
    qnn_ffi::resolve_path(explicit, qnn_ffi::ENV_SYSTEM, "system")
        .ok()
        .or_else(|| {
            let libs = QnnLibs::fetched()?;
            libs.is_backend(backend).then(|| libs.system())
        })
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/qnn-2.51`, as the script computes it.
fn default_root() -> Option<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty())?).join(".cache"),
    };
    Some(cache.join("htpkv").join("qnn-2.51"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_paths_sit_in_onnxruntime_qnn_beside_onnxruntime_qnn_libs() {
        let libs = QnnLibs {
            root: PathBuf::from("/c/qnn"),
        };
        assert_eq!(
            libs.backend(),
            Path::new("/c/qnn/onnxruntime_qnn/libQnnHtp.so")
        );
        assert_eq!(
            libs.system(),
            Path::new("/c/qnn/onnxruntime_qnn/libQnnSystem.so")
        );
        assert_eq!(
            libs.genie(),
            Path::new("/c/qnn/onnxruntime_qnn/libGenie.so")
        );
        assert!(libs.is_backend(Path::new("/c/qnn/onnxruntime_qnn/libQnnHtp.so")));
        assert!(!libs.is_backend(Path::new("/c/libhtpkv_ref_qnn.so")));
    }
}
