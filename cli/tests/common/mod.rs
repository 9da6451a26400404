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

/// A SentencePiece-style tokenizer.json of stories260K's 512 pieces (byte fallback, no merges),
/// written into `dir`: enough for a bundle that is fed token ids (Genie loads it; `--bundle`
/// decodes with it).
pub fn stories_tokenizer_json(dir: &Path) -> PathBuf {
    let tok = model::llama2c::Tokenizer::load(&model_dir().join("tok512.bin"), 512).unwrap();
    let mut vocab = serde_json::Map::new();
    for id in 0..512u32 {
        let piece = match id {
            0 => "<unk>".to_string(),
            1 => "<s>".to_string(),
            2 => "</s>".to_string(),
            3..=258 => format!("<0x{:02X}>", id - 3),
            _ => String::from_utf8_lossy(tok.piece(id).unwrap()).replace(' ', "\u{2581}"),
        };
        vocab.entry(piece).or_insert(id.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "vocab": vocab, "merges": []},
    });
    let path = dir.join("tokenizer-src.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// `htpkv compile --context 64 --ar 1,8 --convention aihub --tokenizer-json … --out dir/name`
/// with `extra` options (`--parts N`, `--split S`, …), stories260K, compiled models cached in
/// `dir/cache`.
pub fn compile_aihub(dir: &Path, name: &str, extra: &[&str]) -> std::process::Output {
    let tok = stories_tokenizer_json(dir);
    let out = dir.join(name);
    let mut args = vec![
        "compile",
        "--context",
        "64",
        "--ar",
        "1,8",
        "--convention",
        "aihub",
    ];
    args.extend(extra);
    args.extend(["--tokenizer-json", tok.to_str().unwrap()]);
    args.extend(["--out", out.to_str().unwrap()]);
    htpkv(&args, &dir.join("cache"))
}

/// A cdylib cargo built for this test run (dev-dependencies land in `target/<profile>/deps`).
pub fn library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.to_path_buf(), deps.join("..")]
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not built next to {}", exe.display()))
}
