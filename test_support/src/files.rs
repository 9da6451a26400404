//! Scratch directories and the libraries cargo built for the running test.
//!
//! Every scratch directory of a test process lives under one root of its own,
//! `<temp dir>/htpkv-tests/<pid>` ([`process_root`]):
//! - [`ScratchDir`]: one test's directory, removed with everything in it when the guard drops
//!   (also when the test panics).
//! - [`shared_dir`]: a directory the tests of one test binary share (the compiled models they
//!   reuse). Tests run on parallel threads and a static never drops, so the process never removes
//!   it; instead the first use of the root in a later process removes the roots of test processes
//!   that have ended. A run thus leaves at most the root of its last test process, and a test
//!   process running in parallel is never harmed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory for one test, removed (recursively, errors ignored) when dropped.
/// Keep the guard alive as long as the test uses the directory.
#[derive(Debug)]
#[must_use = "the directory is removed when the guard drops"]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// `<process root>/<name>-<n>`: `name` says which test it serves, `n` makes it unique in the
    /// process (tests of one binary may pick the same name).
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = process_root().join(format!("{name}-{n}"));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("scratch directory {}: {e}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, rest: impl AsRef<Path>) -> PathBuf {
        self.path.join(rest)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `<process root>/<name>`, created if missing: a directory all the tests of this process share
/// (the same `name` gives the same directory). The process never removes it; a later test
/// process does, once this one has ended.
pub fn shared_dir(name: &str) -> PathBuf {
    let dir = process_root().join(name);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("shared scratch directory {}: {e}", dir.display()));
    dir
}

/// This test process's root, `<temp dir>/htpkv-tests/<pid>`. Its first use removes the roots
/// of test processes that have ended, and a root of this pid an ended process left.
pub fn process_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let all = std::env::temp_dir().join("htpkv-tests");
        remove_ended(&all);
        let mine = all.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&mine);
        std::fs::create_dir_all(&mine)
            .unwrap_or_else(|e| panic!("test scratch root {}: {e}", mine.display()));
        mine
    })
}

/// Removes the roots under `all` whose process has ended (no `/proc/<pid>`). Only where
/// `/proc` tells (Linux); elsewhere nothing is removed.
fn remove_ended(all: &Path) {
    let proc = Path::new("/proc");
    if !cfg!(target_os = "linux") || !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(all) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|s| s.parse::<u32>().is_ok()) else {
            continue;
        };
        if !proc.join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_dir_is_fresh_and_removed_on_drop_even_on_panic() {
        let (a, b) = (ScratchDir::new("same"), ScratchDir::new("same"));
        assert_ne!(a.path(), b.path());
        assert!(a.starts_with(process_root()) && a.is_dir());
        std::fs::write(a.join("f"), b"x").unwrap();
        let kept = a.to_path_buf();
        drop(a);
        assert!(!kept.exists());
        let in_panic = std::panic::catch_unwind(|| {
            let c = ScratchDir::new("panics");
            std::fs::create_dir(c.join("sub")).unwrap();
            panic!("{}", c.display());
        });
        let msg = *in_panic.unwrap_err().downcast::<String>().unwrap();
        assert!(!Path::new(&msg).exists(), "{msg}");
    }

    #[test]
    fn a_shared_dir_is_the_same_for_every_caller_and_kept() {
        let a = shared_dir("cache");
        std::fs::write(a.join("model"), b"x").unwrap();
        assert_eq!(shared_dir("cache"), a);
        assert!(a.join("model").is_file());
    }

    #[test]
    fn only_the_roots_of_ended_processes_are_removed() {
        let all = ScratchDir::new("roots");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        ended.wait().unwrap();
        let names = [child.id(), ended.id(), std::process::id()].map(|p| p.to_string());
        for name in names.iter().map(String::as_str).chain(["not-a-pid"]) {
            std::fs::create_dir_all(all.join(name).join("cache")).unwrap();
        }
        remove_ended(&all);
        child.kill().unwrap();
        child.wait().unwrap();
        let left = |name: &str| all.join(name).join("cache").is_dir();
        assert!(left(&names[0]) && left(&names[2]) && left("not-a-pid"));
        assert_eq!(left(&names[1]), !cfg!(target_os = "linux"));
    }
}
