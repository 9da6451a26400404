//! Shared helpers: locating the built shared libraries, the model, and a compiled model.
#![allow(dead_code)]

use std::path::PathBuf;

use model::llama2c::{Checkpoint, ModelFiles, Tokenizer};
use ref_backend::{CompileOptions, CompiledModel, compile};

/// Path of a shared library cargo built for this test run. Cargo builds this package's cdylib
/// (`libhtpkv_ref_qnn.so`) and the dev-dependency's cdylib (`libqnn_ffi_testlib.so`) into
/// `target/<profile>/deps/` (next to the test binary) and copies this package's to
/// `target/<profile>/`.
pub fn built_library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary directory");
    for dir in [deps.to_path_buf(), deps.join("..")] {
        let p = dir.join(file);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{file} was not found next to {} (cargo builds it with `cargo test -p ref_backend_qnn`)",
        exe.display()
    )
}

/// The reference backend library.
pub fn ref_library() -> PathBuf {
    built_library("libhtpkv_ref_qnn.so")
}

/// The stories260K model, or `None` (with a message) when absent.
pub fn real_model() -> Option<(Checkpoint, Tokenizer)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let extra = [root.join("../shared/models/stories260K")];
    match ModelFiles::discover_with(None, &extra).and_then(|f| f.load()) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!(
                "SKIPPED: the stories260K model is not available (set HTPKV_MODEL_DIR or put it in ../shared/models/stories260K): {e}"
            );
            None
        }
    }
}

/// stories260K compiled for context `s` with AR-1 (u8 KV, i8 weights, short calibration), and
/// its serialized bytes.
pub fn compiled(ckpt: &Checkpoint, tok: &Tokenizer, s: usize) -> (CompiledModel, Vec<u8>) {
    let mut o = CompileOptions::new(s, vec![1]);
    o.calibration_tokens = 12;
    let prompts = [tok.encode("Once upon a time", true, false)];
    let c = model::llama2c::llama_config(&ckpt.config);
    let model = compile(&c, ckpt, &prompts, &o, ckpt.sha256(), &mut |_| {}).expect("compile");
    let bytes = model.to_bytes();
    (model, bytes)
}
