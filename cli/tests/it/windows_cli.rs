//! `--layer-window LAYERS:W` on `htpkv generate` and `htpkv compile`: sliding-window layers set on
//! stories260K (which has none), compiled, cached apart from the unwindowed model and run.

use std::process::Output;

use crate::htpkv;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// `generate` on stories260K at context 64, AR 1,4, with `extra` options.
fn generate(cache: &std::path::Path, extra: &[&str]) -> Output {
    let dir = stories260k_dir();
    let mut args = vec![
        "generate",
        "--model-dir",
        dir.to_str().unwrap(),
        "--context",
        "64",
        "--ar",
        "1,4",
        "--steps",
        "50",
    ];
    args.extend_from_slice(extra);
    htpkv(&args, cache)
}

#[test]
fn generate_with_layer_windows_runs_a_windowed_model_cached_apart() {
    let cache = ScratchDir::new("windows-generate");
    let plain = ok(&generate(&cache, &[]));
    let shift = ok(&generate(&cache, &["--layer-window", "0,2,4:16"]));
    let naive = ok(&generate(
        &cache,
        &[
            "--layer-window",
            "0,2:16",
            "--layer-window",
            "4:16",
            "--update",
            "naive",
        ],
    ));
    assert_eq!(
        shift, naive,
        "one window spec or two, shift or naive: the same model"
    );
    assert_ne!(shift, plain, "the windows change the story");
    assert!(shift.starts_with("Once upon a time"), "{shift}");
    let cached = std::fs::read_dir(&cache).unwrap().count();
    assert_eq!(
        cached, 2,
        "the windowed model is cached apart from the plain one"
    );

    // smart_mask cannot serve a sliding layer: kv_manager's reason.
    let e = err(&generate(
        &cache,
        &["--layer-window", "0:16", "--update", "smart_mask"],
    ));
    assert!(
        e.contains("sliding-window layers need left-padded windows"),
        "{e}"
    );
    // Bad specs are refused before anything is compiled.
    let e = err(&generate(&cache, &["--layer-window", "9:16"]));
    assert!(
        e.contains("--layer-window: layer 9 is outside the model's 5 layers"),
        "{e}"
    );
    let e = err(&generate(&cache, &["--layer-window", "0:2"]));
    assert!(
        e.contains("layer 0: window 2 must be between the largest AR variant 4"),
        "{e}"
    );
    let e = err(&generate(&cache, &["--layer-window", "0-2:16"]));
    assert!(e.contains("layer window `0-2:16`"), "{e}");
}

#[test]
fn compile_with_layer_windows_writes_a_file_generate_runs() {
    let cache = ScratchDir::new("windows-compile");
    let out = cache.join("w.htpkv");
    let dir = stories260k_dir();
    let o = htpkv(
        &[
            "compile",
            "--model",
            dir.join("stories260K.bin").to_str().unwrap(),
            "--tokenizer",
            dir.join("tok512.bin").to_str().unwrap(),
            "--context",
            "64",
            "--ar",
            "1,4",
            "--kv-dtype",
            "u16",
            "--layer-window",
            "0,2,4:16",
            "--out",
            out.to_str().unwrap(),
        ],
        &cache,
    );
    let report = ok(&o);
    assert!(
        report.contains("per-layer windows: 16 global 16 global 16"),
        "{report}"
    );
    let from_file = ok(&generate(&cache, &["--compiled", out.to_str().unwrap()]));
    let compiled_here = ok(&generate(&cache, &["--layer-window", "0,2,4:16"]));
    assert_eq!(from_file, compiled_here);
}
