//! Scratch directories and the libraries cargo built for the running test.

use std::path::PathBuf;

/// A fresh, empty scratch directory for one test (named after the test file and `name`).
pub fn scratch(file: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("htpkv-{file}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Path of a shared library cargo built for this test run: a cdylib dependency or
/// dev-dependency lands in `target/<profile>/deps/` (next to the test binary), a package's own
/// cdylib is also copied to `target/<profile>/`.
pub fn built_library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary directory");
    [deps.to_path_buf(), deps.join("..")]
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{file} was not built next to {} (a cdylib the testing package builds or takes as a dev-dependency)",
                exe.display()
            )
        })
}

/// The reference backend as a QNN library (`libhtpkv_ref_qnn.so`, `ref_backend_qnn`'s cdylib).
pub fn ref_qnn_library() -> PathBuf {
    built_library("libhtpkv_ref_qnn.so")
}
