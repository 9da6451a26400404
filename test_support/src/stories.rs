//! The committed stories260K model (`models/stories260K`), tiny synthetic checkpoints and
//! calibration prompts.

use std::path::{Path, PathBuf};

use model::llama2c::{Checkpoint, Config, ModelFiles, Tokenizer};

/// The stories260K model files, found as the runtime finds them ([`ModelFiles::discover`]:
/// `$HTPKV_MODEL_DIR`, else the copy committed under `models/stories260K`), so these tests always
/// run.
///
/// # Panics
/// When no model is found: the model is committed, so absence is a broken checkout.
pub fn stories260k() -> ModelFiles {
    ModelFiles::discover(None).unwrap_or_else(|e| {
        panic!("the stories260K model is missing (it is committed under models/stories260K): {e}")
    })
}

/// The directory of [`stories260k`].
pub fn stories260k_dir() -> PathBuf {
    stories260k().dir
}

/// [`stories260k`] loaded: its checkpoint and tokenizer.
pub fn stories260k_loaded() -> (Checkpoint, Tokenizer) {
    stories260k().load().expect("the stories260K model loads")
}

/// A small synthetic checkpoint (dim 32, 2 layers, 4 heads over 2 KV heads, vocabulary 64,
/// context 64), with or without a classifier of its own.
pub fn synthetic(shared_classifier: bool) -> Checkpoint {
    let config = Config {
        dim: 32,
        hidden_dim: 48,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        vocab_size: 64,
        seq_len: 64,
        shared_classifier,
    };
    Checkpoint::synthetic(config, 7).expect("valid synthetic config")
}

/// The default calibration prompts, tokenized with BOS.
pub fn default_prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|p| tok.encode(p, true, false))
        .collect()
}

/// Synthetic calibration prompts for a synthetic model.
pub fn synthetic_prompts(vocab: usize) -> Vec<Vec<u32>> {
    (0..3u32)
        .map(|p| {
            (0..6u32)
                .map(|i| (1 + p * 7 + i * 5) % vocab as u32)
                .collect()
        })
        .collect()
}

/// A SentencePiece-style tokenizer.json of stories260K's 512 pieces (byte fallback, no merges),
/// written into `dir`: enough for a bundle that is fed token ids (Genie loads it; `--bundle`
/// decodes with it).
pub fn stories_tokenizer_json(dir: &Path) -> PathBuf {
    let tok = Tokenizer::load(&stories260k_dir().join("tok512.bin"), 512).unwrap();
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
