//! The f32 reference forward pass over a llama2.c checkpoint: [`crate::FloatModel`] with the
//! checkpoint as its weights and llama2.c's description (RMSNorm epsilon 1e-5, RoPE theta 10000
//! with adjacent pairs, BOS 1, EOS 2).

use std::sync::Arc;

use crate::{LayerTensor, LlamaConfig, RopeConfig, SpecialTokens, Tensor, WeightSource};

use super::{Checkpoint, Config, ModelError, Tokenizer};

/// RMSNorm epsilon used by llama2.c models.
pub const RMS_EPS: f32 = 1e-5;

/// RoPE base frequency used by llama2.c models.
pub const ROPE_THETA: f32 = 10000.0;

/// The model description of a llama2.c checkpoint with this header.
pub fn llama_config(c: &Config) -> LlamaConfig {
    LlamaConfig {
        n_layers: c.n_layers,
        dim: c.dim,
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim(),
        hidden_dim: c.hidden_dim,
        vocab_size: c.vocab_size,
        context_length: c.seq_len,
        rms_eps: RMS_EPS,
        rope: RopeConfig {
            theta: ROPE_THETA,
            ..RopeConfig::default()
        },
        tied_output: c.shared_classifier,
        block: crate::Block::default(),
        embed_scale: None,
        final_softcap: None,
        special: SpecialTokens {
            bos: Some(Tokenizer::BOS),
            eos: Some(Tokenizer::EOS),
            ..SpecialTokens::default()
        },
        layer_windows: Vec::new(),
    }
}

/// One layer's slice of a tensor stored concatenated over `n_layers` layers.
fn layer_slice(v: &[f32], n_layers: usize, layer: usize) -> Option<&[f32]> {
    let per = v.len() / n_layers.max(1);
    v.get(layer * per..(layer + 1) * per)
}

impl WeightSource for Checkpoint {
    fn tensor(&self, t: Tensor) -> Option<&[f32]> {
        let w = &self.weights;
        let all = match t {
            Tensor::TokenEmbedding => return Some(&w.token_embedding),
            Tensor::OutputNorm => return Some(&w.rms_final),
            Tensor::Output => return w.wcls.as_deref(),
            Tensor::Layer(_, lt) => match lt {
                LayerTensor::AttnNorm => &w.rms_att,
                LayerTensor::Q => &w.wq,
                LayerTensor::K => &w.wk,
                LayerTensor::V => &w.wv,
                LayerTensor::O => &w.wo,
                LayerTensor::FfnNorm => &w.rms_ffn,
                LayerTensor::Gate => &w.w1,
                LayerTensor::Up => &w.w3,
                LayerTensor::Down => &w.w2,
                // llama2.c checkpoints hold the Llama block only.
                _ => return None,
            },
        };
        let Tensor::Layer(l, _) = t else { return None };
        (l < self.config.n_layers)
            .then(|| layer_slice(all, self.config.n_layers, l))
            .flatten()
    }
}

/// Plain f32 Llama decoder over a shared [`Checkpoint`], with a KV cache laid out
/// `[layer][pos][kv_dim]` (keys after RoPE) for `seq_len` positions. All scratch buffers are
/// allocated once in [`FloatModel::new`]; [`FloatModel::forward`] does not allocate.
///
/// Positions must be fed in order: `forward(token, pos)` needs positions `0..pos` in the cache,
/// so `pos` may be at most the number of cached positions. Feeding an earlier position
/// overwrites it and truncates the cache there (rollback).
#[derive(Debug, Clone)]
pub struct FloatModel {
    inner: crate::FloatModel<Checkpoint>,
}

fn weight_error(e: crate::Error) -> ModelError {
    let (expected, found) = match &e {
        crate::Error::TensorShape {
            expected, found, ..
        } => (expected.iter().product(), found.iter().product()),
        _ => (0, 0),
    };
    ModelError::WeightShape {
        tensor: "checkpoint weights",
        expected,
        found,
    }
}

fn step_error(e: crate::Error) -> ModelError {
    match e {
        crate::Error::TokenOutOfRange { token, vocab_size } => {
            ModelError::TokenOutOfRange { token, vocab_size }
        }
        crate::Error::PositionOutOfRange { pos, context } => ModelError::PositionOutOfRange {
            pos,
            seq_len: context,
        },
        crate::Error::PositionGap { pos, filled } => ModelError::PositionGap { pos, filled },
        other => weight_error(other),
    }
}

impl FloatModel {
    /// Allocates the KV cache (`2 · n_layers · seq_len · kv_dim` floats) and scratch buffers.
    ///
    /// # Panics
    /// If the checkpoint's weights do not match its config, which [`Checkpoint::new`] and
    /// [`Checkpoint::from_bytes`] guarantee; use [`FloatModel::try_new`] for hand-made ones.
    pub fn new(ckpt: Arc<Checkpoint>) -> Self {
        Self::try_new(ckpt).expect("a validated checkpoint has weights matching its config")
    }

    /// [`FloatModel::new`] that reports inconsistent weights as [`ModelError::WeightShape`].
    pub fn try_new(ckpt: Arc<Checkpoint>) -> Result<Self, ModelError> {
        let desc = llama_config(&ckpt.config);
        let context = ckpt.config.seq_len;
        let inner = crate::FloatModel::new(desc, ckpt, context).map_err(weight_error)?;
        Ok(FloatModel { inner })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.inner.weights().config
    }

    /// The shared checkpoint.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        self.inner.weights()
    }

    /// The general forward this model runs on.
    pub fn float_model(&self) -> &crate::FloatModel<Checkpoint> {
        &self.inner
    }

    /// Forgets all cached positions (the next call must use `pos == 0`).
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    /// Number of positions currently in the KV cache.
    pub fn cached_len(&self) -> usize {
        self.inner.cached_len()
    }

    /// Keys of `layer` at `pos` (`kv_dim` floats, after RoPE), or `None` if not cached.
    pub fn key_cache(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        self.inner.key_cache(layer, pos)
    }

    /// Values of `layer` at `pos` (`kv_dim` floats), or `None` if not cached.
    pub fn value_cache(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        self.inner.value_cache(layer, pos)
    }

    /// Logits of the last successful [`forward`](Self::forward) call.
    pub fn logits(&self) -> &[f32] {
        self.inner.logits()
    }

    /// Runs one token at position `pos` and returns the `vocab_size` logits.
    ///
    /// Errors (nothing is modified): [`ModelError::TokenOutOfRange`],
    /// [`ModelError::PositionOutOfRange`] (`pos >= seq_len`), [`ModelError::PositionGap`]
    /// (`pos > cached_len()`).
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<&[f32], ModelError> {
        self.inner.forward(token, pos).map_err(step_error)
    }

    /// [`forward`](Self::forward) that shows intermediate values to `tap` (calibration).
    pub fn forward_tapped(
        &mut self,
        token: u32,
        pos: usize,
        tap: &mut dyn crate::Tap,
    ) -> Result<&[f32], ModelError> {
        self.inner
            .forward_tapped(token, pos, tap)
            .map_err(step_error)
    }

    /// Greedy (argmax) generation with llama2.c's loop: at most `steps` forward calls (clamped
    /// to `seq_len`) at positions `0, 1, ...`; while inside `prompt` the next token is the
    /// prompt's, afterwards it is the argmax, and generation stops when that is BOS or EOS
    /// (which is not appended). Returns the whole sequence including the prompt, so at most
    /// `steps + 1` tokens (the last one not yet fed). Prompt tokens beyond `steps` are returned
    /// unprocessed. Resets the cache first. An empty prompt means `[BOS]`.
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        steps: usize,
    ) -> Result<Vec<u32>, ModelError> {
        self.reset();
        let steps = steps.min(self.config().seq_len);
        let mut seq: Vec<u32> = if prompt.is_empty() {
            vec![Tokenizer::BOS]
        } else {
            prompt.to_vec()
        };
        let mut pos = 0;
        while pos < steps {
            let logits = self.forward(seq[pos], pos)?;
            pos += 1;
            if pos < seq.len() {
                continue; // still consuming the prompt
            }
            let next = crate::ops::argmax(logits) as u32;
            if next == Tokenizer::BOS || next == Tokenizer::EOS {
                break;
            }
            seq.push(next);
        }
        Ok(seq)
    }
}
