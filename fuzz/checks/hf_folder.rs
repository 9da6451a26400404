//! Fuzz check of a Hugging Face model folder: the bytes are a list of files, each a 1-byte name
//! index and a 4-byte little-endian length before its bytes, written into a fresh folder (the
//! caller's: the fuzz target's or a test's scratch directory) as
//! `config.json`, `tokenizer.json`, `tokenizer_config.json` or one of three safetensors shards. A
//! folder that loads holds exactly the tensors its description needs (each shard's tensors
//! distinct from the others'), all finite; `describe` (budgets) agrees with `load` on whether the
//! description and the tensors agree.

use std::path::Path;

use model::{Tensor, WeightSource};

const NAMES: [&str; 6] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
];

/// The files the bytes describe (a later file of the same name replaces an earlier one).
pub fn files(mut data: &[u8]) -> Vec<(&'static str, &[u8])> {
    let mut out: Vec<(&'static str, &[u8])> = Vec::new();
    while data.len() >= 5 {
        let name = NAMES[usize::from(data[0]) % NAMES.len()];
        let len = u32::from_le_bytes([data[1], data[2], data[3], data[4]]) as usize;
        let body = &data[5..];
        let body = &body[..len.min(body.len())];
        data = &data[5 + body.len()..];
        out.retain(|f| f.0 != name);
        out.push((name, body));
    }
    out
}

/// Checks the folder the bytes describe, written into `dir` (an empty folder).
pub fn check(dir: &Path, data: &[u8]) {
    for (name, body) in files(data) {
        std::fs::write(dir.join(name), body).expect("write a file");
    }
    let described = model::describe(dir);
    let loaded = model::load(dir);
    if let Ok(m) = &loaded {
        assert_eq!(
            described.as_ref().ok(),
            Some(&m.config),
            "describe disagrees with load"
        );
        for t in Tensor::required(&m.config) {
            let w = m.weights.tensor(t).expect("a needed tensor");
            assert_eq!(w.len(), t.len(&m.config));
            assert!(
                w.iter().all(|v| v.is_finite()),
                "a non-finite weight loaded"
            );
        }
        let _ = m.tokenizer.encode("Once upon a time", true);
    }
}
