//! Readers for llama2.c checkpoints and tokenizers, and the plain f32 reference forward pass.
//!
//! This crate is htpkv's numerical oracle: quantized executors are checked against
//! [`FloatModel`], and they reuse the float building blocks in [`ops`] (re-exported at the
//! crate root) for their non-quantized parts.
//!
//! ```no_run
//! use std::sync::Arc;
//! use llama2c::{FloatModel, ModelFiles};
//! # fn main() -> Result<(), llama2c::ModelError> {
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
pub use ::model::fsio;
mod model;
pub mod ops;
mod tokenizer;

pub use checkpoint::{Checkpoint, Config, HEADER_BYTES, Weights, limits};
pub use error::ModelError;
pub use files::{
    CHECKPOINT_NAME, EMBEDDED_MODEL_DIR, GENERIC_CHECKPOINT_NAME, GENERIC_TOKENIZER_NAME,
    MODEL_DIR_ENV, ModelFiles, STORIES260K_BYTES, STORIES260K_SHA256, TOK512_BYTES, TOK512_SHA256,
    TOKENIZER_NAME, hex, sha256, sha256_hex,
};
pub use model::{FloatModel, llama_config};
pub use ops::{argmax, dot, matmul, rmsnorm, rmsnorm_inplace, rope_rotate, silu, softmax};
pub use tokenizer::Tokenizer;
