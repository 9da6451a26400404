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

/// A fresh, empty scratch directory for one test (named after the test file and `name`).
pub fn scratch(file: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("htpkv-{file}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the `htpkv` binary with compiled models cached in `cache` and no model override.
pub fn htpkv(args: &[&str], cache: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_htpkv"))
        .args(args)
        .env("HTPKV_CACHE_DIR", cache)
        .env_remove("HTPKV_MODEL_DIR")
        .output()
        .expect("runs")
}

/// The arguments of a quick compile of the llama2.c model in `dir` into `out` (small context,
/// short calibration), then `extra`.
pub fn compile_args(dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let mut v: Vec<String> = ["compile", "--model"].map(String::from).to_vec();
    v.push(path(&dir.join("stories260K.bin")));
    v.push("--tokenizer".into());
    v.push(path(&dir.join("tok512.bin")));
    v.extend(
        [
            "--context",
            "64",
            "--ar",
            "1,8",
            "--calibration-tokens",
            "16",
            "--out",
        ]
        .map(String::from),
    );
    v.push(path(out));
    v.extend(extra.iter().map(|a| a.to_string()));
    v
}
