//! llama2.c checkpoints and tokenizers, validated, and the f32 forward over a checkpoint.
//!
//! A checkpoint ([`Checkpoint`]) is a 28-byte header and f32 weights; it is a [`crate::WeightSource`]
//! read in place, and [`llama_config`] gives its [`crate::LlamaConfig`] (RMSNorm epsilon 1e-5, RoPE
//! theta 10000 with adjacent pairs, BOS 1, EOS 2). [`FloatModel`] runs [`crate::FloatModel`] over it
//! with llama2.c's errors: the numerical oracle the runtime's tests compare against. The tokenizer
//! ([`Tokenizer`]) is llama2.c's SentencePiece-style BPE with byte fallback. [`ModelFiles`] finds a
//! model directory (stories260K in the tests).
//!
//! ```no_run
//! use std::sync::Arc;
//! use model::llama2c::{FloatModel, ModelFiles};
//! # fn main() -> Result<(), model::llama2c::ModelError> {
//! let files = ModelFiles::discover(None)?;
//! let (ckpt, tok) = files.load()?;
//! let mut model = FloatModel::new(Arc::new(ckpt));
//! let seq = model.generate_greedy(&tok.encode("Once upon a time", true, false), 64)?;
//! println!("{}", String::from_utf8_lossy(&tok.decode(&seq)));
//! # Ok(()) }
//! ```

mod checkpoint;
mod error;
mod files;
mod float;
mod tokenizer;

pub use checkpoint::{Checkpoint, Config, HEADER_BYTES, Weights, limits};
pub use error::ModelError;
pub use files::{
    CHECKPOINT_NAME, EMBEDDED_MODEL_DIR, GENERIC_CHECKPOINT_NAME, GENERIC_TOKENIZER_NAME,
    MODEL_DIR_ENV, ModelFiles, STORIES260K_BYTES, STORIES260K_SHA256, TOK512_BYTES, TOK512_SHA256,
    TOKENIZER_NAME, hex, sha256, sha256_hex,
};
pub use float::{FloatModel, RMS_EPS, ROPE_THETA, llama_config};
pub use tokenizer::Tokenizer;
