//! Llama-family models for htpkv: one model description ([`LlamaConfig`]), loaders that fill it
//! (GGUF, safetensors + config.json; llama2.c lives in the `llama2c` crate), the float kernels
//! ([`ops`]) and the f32 reference forward ([`FloatModel`], the numerical oracle), HF tokenizers
//! and chat templates.

pub mod chat;
mod config;
mod error;
mod forward;
pub mod gguf;
pub mod hf;
pub mod ops;
mod tokenizer;
mod weights;

pub use chat::{ChatTemplate, Message};
pub use config::{Llama3Scaling, LlamaConfig, RopeConfig, RopePairing, SpecialTokens, limits};
pub use error::Error;
pub use forward::{FloatModel, NoTap, Site, Tap};
pub use tokenizer::HfTokenizer;
pub use weights::{LayerTensor, LayerWeights, Tensor, WeightSource, Weights, check_weights};
