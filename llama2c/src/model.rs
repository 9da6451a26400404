//! The f32 reference forward pass (llama2.c semantics), one token at a time with its own KV cache.

use std::sync::Arc;

use crate::ops::{dot, matmul, rmsnorm, rope_rotate, silu, softmax};
use crate::{Checkpoint, Config, ModelError, Tokenizer};

/// Plain f32 Llama decoder over a shared [`Checkpoint`], with a KV cache laid out
/// `[layer][pos][kv_dim]` (keys after RoPE). All scratch buffers are allocated once in
/// [`FloatModel::new`]; [`FloatModel::forward`] does not allocate.
///
/// Positions must be fed in order: `forward(token, pos)` needs positions `0..pos` in the cache,
/// so `pos` may be at most the number of cached positions. Feeding an earlier position
/// overwrites it and truncates the cache there (rollback).
#[derive(Debug, Clone)]
pub struct FloatModel {
    ckpt: Arc<Checkpoint>,
    key_cache: Vec<f32>,
    value_cache: Vec<f32>,
    filled: usize,
    x: Vec<f32>,
    xb: Vec<f32>,
    xb2: Vec<f32>,
    q: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    att: Vec<f32>,
    logits: Vec<f32>,
}

impl FloatModel {
    /// Allocates the KV cache (`2 · n_layers · seq_len · kv_dim` floats) and scratch buffers.
    pub fn new(ckpt: Arc<Checkpoint>) -> Self {
        let c = ckpt.config;
        let cache = c.n_layers * c.seq_len * c.kv_dim();
        FloatModel {
            key_cache: vec![0.0; cache],
            value_cache: vec![0.0; cache],
            filled: 0,
            x: vec![0.0; c.dim],
            xb: vec![0.0; c.dim],
            xb2: vec![0.0; c.dim],
            q: vec![0.0; c.dim],
            hb: vec![0.0; c.hidden_dim],
            hb2: vec![0.0; c.hidden_dim],
            att: vec![0.0; c.seq_len],
            logits: vec![0.0; c.vocab_size],
            ckpt,
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.ckpt.config
    }

    /// The shared checkpoint.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.ckpt
    }

    /// Forgets all cached positions (the next call must use `pos == 0`).
    pub fn reset(&mut self) {
        self.filled = 0;
    }

    /// Number of positions currently in the KV cache.
    pub fn cached_len(&self) -> usize {
        self.filled
    }

    /// Keys of `layer` at `pos` (`kv_dim` floats, after RoPE), or `None` if not cached.
    pub fn key_cache(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        self.cache_row(&self.key_cache, layer, pos)
    }

    /// Values of `layer` at `pos` (`kv_dim` floats), or `None` if not cached.
    pub fn value_cache(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        self.cache_row(&self.value_cache, layer, pos)
    }

    fn cache_row<'a>(&self, cache: &'a [f32], layer: usize, pos: usize) -> Option<&'a [f32]> {
        let c = &self.ckpt.config;
        if layer >= c.n_layers || pos >= self.filled {
            return None;
        }
        let kv = c.kv_dim();
        let off = (layer * c.seq_len + pos) * kv;
        cache.get(off..off + kv)
    }

    /// Logits of the last successful [`forward`](Self::forward) call.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Runs one token at position `pos` and returns the `vocab_size` logits.
    ///
    /// Errors (nothing is modified): [`ModelError::TokenOutOfRange`],
    /// [`ModelError::PositionOutOfRange`] (`pos >= seq_len`), [`ModelError::PositionGap`]
    /// (`pos > cached_len()`).
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<&[f32], ModelError> {
        let c = self.ckpt.config;
        if token as usize >= c.vocab_size {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab_size: c.vocab_size,
            });
        }
        if pos >= c.seq_len {
            return Err(ModelError::PositionOutOfRange {
                pos,
                seq_len: c.seq_len,
            });
        }
        if pos > self.filled {
            return Err(ModelError::PositionGap {
                pos,
                filled: self.filled,
            });
        }
        let FloatModel {
            ckpt,
            key_cache,
            value_cache,
            filled,
            x,
            xb,
            xb2,
            q,
            hb,
            hb2,
            att,
            logits,
        } = self;
        let w = &ckpt.weights;
        let (hd, kv_dim, kv_mul) = (c.head_dim(), c.kv_dim(), c.kv_mul());
        let scale = 1.0 / (hd as f32).sqrt();

        x.copy_from_slice(w.embedding(token as usize));
        for l in 0..c.n_layers {
            rmsnorm(xb, x, w.rms_att(l));
            let base = l * c.seq_len * kv_dim;
            let row = base + pos * kv_dim;
            matmul(q, xb, w.wq(l));
            let k = &mut key_cache[row..row + kv_dim];
            matmul(k, xb, w.wk(l));
            rope_rotate(k, pos, hd);
            matmul(&mut value_cache[row..row + kv_dim], xb, w.wv(l));
            rope_rotate(q, pos, hd);

            let keys = &key_cache[base..base + (pos + 1) * kv_dim];
            let vals = &value_cache[base..base + (pos + 1) * kv_dim];
            for h in 0..c.n_heads {
                let qh = &q[h * hd..(h + 1) * hd];
                let kv_off = (h / kv_mul) * hd;
                let a = &mut att[..=pos];
                for (t, s) in a.iter_mut().enumerate() {
                    let kt = &keys[t * kv_dim + kv_off..t * kv_dim + kv_off + hd];
                    *s = dot(qh, kt) * scale;
                }
                softmax(a);
                let out = &mut xb[h * hd..(h + 1) * hd];
                out.fill(0.0);
                for (t, &p) in a.iter().enumerate() {
                    let vt = &vals[t * kv_dim + kv_off..t * kv_dim + kv_off + hd];
                    for (o, &v) in out.iter_mut().zip(vt) {
                        *o += p * v;
                    }
                }
            }
            matmul(xb2, xb, w.wo(l));
            for (a, b) in x.iter_mut().zip(xb2.iter()) {
                *a += b;
            }

            rmsnorm(xb, x, w.rms_ffn(l));
            matmul(hb, xb, w.w1(l));
            matmul(hb2, xb, w.w3(l));
            for (g, u) in hb.iter_mut().zip(hb2.iter()) {
                *g = silu(*g) * u;
            }
            matmul(xb, hb, w.w2(l));
            for (a, b) in x.iter_mut().zip(xb.iter()) {
                *a += b;
            }
        }
        rmsnorm(xb, x, &w.rms_final);
        matmul(logits, xb, ckpt.classifier());
        *filled = pos + 1;
        Ok(&self.logits)
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
        let steps = steps.min(self.ckpt.config.seq_len);
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
