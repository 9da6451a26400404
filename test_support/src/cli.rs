//! The arguments of the `htpkv` commands the CLI tests share.

use std::path::Path;

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
