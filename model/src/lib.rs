//! Llama-family models for htpkv: one model description, the loaders that fill it, the float
//! kernels and the f32 reference forward (the numerical oracle), HF tokenizers and chat
//! templates.
//!
//! - [`LlamaConfig`]: layers, widths, heads and KV heads (GQA), head width, RMSNorm epsilon,
//!   RoPE theta, Llama 3 scaling and pair layout ([`RopePairing`]), tied output, Q/K/V biases,
//!   special ids. [`LlamaConfig::validate`] bounds every dimension ([`limits`]) and checks
//!   divisibility; every loader calls it.
//! - Weights: [`Tensor`] names each tensor and gives its shape from the description (one
//!   place); the forward reads them through [`WeightSource`] (owned [`Weights`], or a
//!   llama2.c checkpoint, [`llama2c::Checkpoint`], without a copy).
//! - Loaders: [`gguf`] (GGUF v2/v3, the architectures of [`family::REGISTRY`]; F32, F16, BF16,
//!   Q4_0, Q4_1, Q8_0, Q4_K, Q6_K dequantized to f32 on load) and [`hf`] (`config.json` +
//!   safetensors shards in f32/f16/bf16, the families' `model_type`s), each through the file's
//!   family ([`family`]). GGUF stores Q/K with adjacent RoPE pairs (llama.cpp's converter permutes
//!   them), HF with half-split pairs; the description records which. [`llama2c`] reads llama2.c
//!   checkpoints and tokenizers (the stories models of the tests).
//! - [`forward`]: the Llama forward pass, written once ([`forward::run`]): a layer range, token
//!   or hidden-state input, RoPE from position ids or cos/sin tables, hidden-state or logits
//!   output; implementations supply [`forward::Kernels`] (the float model here, the quantized
//!   executor in `ref_backend`).
//! - [`FloatModel`]: one token at a time with its own KV cache; a [`Tap`] sees intermediate
//!   values (calibration). Matrix-vector products run on rayon's pool, split by output rows
//!   (results do not depend on the thread count).
//! - [`load`] and [`describe`] take either format (a GGUF file or an HF folder) and give the
//!   model with its tokenizer and chat template, or only its description.
//! - [`HfTokenizer`] (the `tokenizers` crate, pure Rust: `fancy-regex`, no C toolchain) from a
//!   `tokenizer.json` or from GGUF metadata; [`ChatTemplate`] renders the model's Jinja chat
//!   template with minijinja.
//!
//! Policies:
//! - Hostile files give typed errors ([`Error`], [`gguf::GgufError`]): every count, length,
//!   dimension product, offset and size in a GGUF header is checked against the file before
//!   anything is allocated for it; metadata takes a small multiple of the bytes it came from.
//!   Hand-parsed formats (GGUF here, compiled models and saved sessions elsewhere) read their
//!   fields through the one bounded little-endian reader, [`le::LeReader`].
//! - Unsupported features are errors, never a silently different model: other architectures,
//!   RoPE scaling other than `llama3` (GGUF's `rope_freqs` tensors included) and Phi's
//!   `longrope`, tensor types
//!   outside the list above, pre-tokenizers other than `gpt2`, `smollm`/`starcoder`,
//!   `llama-bpe`/`llama3` and `qwen2`.
//!
//! The test model is SmolLM2-135M-Instruct (GGUF Q4_1), fetched by `scripts/fetch-smollm2.sh`
//! into `models/smollm2-135m-instruct/`. Its tests fail when the file is missing and `CI` is
//! set, and are skipped with a message otherwise (the rule of the workspace's unpublished
//! `test_support::fetched`). Try it with
//! `cargo run --release -p model --example chat -- models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?"`.
//!
//! ```no_run
//! use model::gguf::GgufModel;
//! use model::{ChatTemplate, FloatModel, HfTokenizer, Message};
//! # fn main() -> Result<(), model::Error> {
//! let m = GgufModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let tok = HfTokenizer::from_gguf(&m.file)?;
//! let prompt = ChatTemplate::from_gguf(&m.file)?
//!     .render_chat(&[Message::new("user", "What is the capital of France?")], true)?;
//! let mut fm = FloatModel::new(m.config.clone(), m.weights.clone(), 512)?;
//! let answer = fm.generate_greedy(&tok.encode(&prompt, true)?, 64, &m.config.special.stop_tokens())?;
//! println!("{}", tok.decode(&answer, true)?);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod chat;
pub mod checksum;
mod config;
pub mod encdec;
mod error;
pub mod family;
pub mod forward;
pub mod fsio;
pub mod gguf;
mod gguf_file;
pub mod hf;
pub mod le;
pub mod llama2c;
mod load;
pub mod ops;
mod tokenizer;
mod weights;

pub use chat::{ChatTemplate, Message};
pub use config::{
    Activation, Block, Llama3Scaling, LlamaConfig, LongRope, RopeConfig, RopePairing,
    SpecialTokens, full_rope_only, limits, valid_rotated,
};
pub use error::Error;
pub use forward::{FloatModel, NoTap, Site, Tap};
pub use load::{LoadedModel, ModelFormat, ModelText, describe, format_of, load, load_text};
pub use tokenizer::{HfTokenizer, TextStream};
pub use weights::{
    LayerTensor, LayerWeights, Overlay, Tensor, WeightSource, Weights, check_weights,
};
