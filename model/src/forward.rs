//! The f32 reference forward pass over a [`LlamaConfig`] and a [`WeightSource`]: one token at a
//! time with its own KV cache. This is the numerical oracle; calibration observes it through a
//! [`Tap`].

use std::sync::Arc;

use crate::ops::{Rope, argmax, dot, matmul, rmsnorm, silu, softmax};
use crate::{Error, LayerTensor, LlamaConfig, Tensor, WeightSource, check_weights};

/// A point of the forward pass whose values a [`Tap`] sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Site {
    /// Input of the Q/K/V projections (after the attention RMSNorm), `dim`.
    AttnInput,
    /// Queries after bias and RoPE, `q_dim`.
    Query,
    /// Keys as cached (after bias and RoPE), `kv_dim`.
    Key,
    /// Values as cached, `kv_dim`.
    Value,
    /// Attention output before the output projection, `q_dim`.
    AttnOutput,
    /// Input of the gate/up projections (after the FFN RMSNorm), `dim`.
    FfnInput,
    /// `silu(gate) * up`, input of the down projection, `hidden_dim`.
    FfnHidden,
    /// Residual stream at the end of the layer, `dim`.
    Residual,
    /// Input of the classifier (after the final RMSNorm), `dim`; layer = `n_layers`.
    FinalNorm,
    /// Logits, `vocab_size`; layer = `n_layers`.
    Logits,
}

/// Observer of intermediate values (calibration). Every method has a no-op default.
pub trait Tap {
    /// Called with the values at `site` of `layer` for the token being run.
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        let _ = (layer, site, values);
    }
}

/// The tap that observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTap;

impl Tap for NoTap {}

#[derive(Debug, Clone)]
struct Scratch {
    x: Vec<f32>,
    xb: Vec<f32>,
    xb2: Vec<f32>,
    q: Vec<f32>,
    att_out: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    att: Vec<f32>,
    logits: Vec<f32>,
}

/// Plain f32 decoder over shared weights with a KV cache laid out `[layer][pos][kv_dim]` (keys
/// after RoPE), sized for `context` positions. Scratch buffers are allocated once in
/// [`FloatModel::new`]; [`FloatModel::forward`] does not allocate.
///
/// Positions must be fed in order: `forward(token, pos)` needs positions `0..pos` in the cache,
/// so `pos` may be at most the number of cached positions. Feeding an earlier position
/// overwrites it and truncates the cache there (rollback).
#[derive(Debug, Clone)]
pub struct FloatModel<W: ?Sized> {
    config: LlamaConfig,
    rope: Rope,
    context: usize,
    key_cache: Vec<f32>,
    value_cache: Vec<f32>,
    filled: usize,
    s: Scratch,
    weights: Arc<W>,
}

impl<W: WeightSource + ?Sized> FloatModel<W> {
    /// Validates `config`, checks that `weights` holds every tensor it needs with the right
    /// size, and allocates a KV cache of `context` positions (`1..=config.context_length`):
    /// `2 · n_layers · context · kv_dim` floats, so choose `context` for the memory at hand
    /// (SmolLM2-135M: 46 KiB per position).
    pub fn new(config: LlamaConfig, weights: Arc<W>, context: usize) -> Result<Self, Error> {
        config.validate()?;
        check_weights(&config, &*weights)?;
        if context == 0 || context > config.context_length {
            let why = format!("must be in 1..={}", config.context_length);
            return Err(Error::config("context", context, why));
        }
        let c = &config;
        Ok(FloatModel {
            rope: Rope::new(c.head_dim, &c.rope),
            context,
            key_cache: kv_cache(c, context)?,
            value_cache: kv_cache(c, context)?,
            filled: 0,
            s: Scratch {
                x: vec![0.0; c.dim],
                xb: vec![0.0; c.dim],
                xb2: vec![0.0; c.dim],
                q: vec![0.0; c.q_dim()],
                att_out: vec![0.0; c.q_dim()],
                hb: vec![0.0; c.hidden_dim],
                hb2: vec![0.0; c.hidden_dim],
                att: vec![0.0; context],
                logits: vec![0.0; c.vocab_size],
            },
            weights,
            config,
        })
    }

    /// The model description.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<W> {
        &self.weights
    }

    /// Number of positions the KV cache holds.
    pub fn context(&self) -> usize {
        self.context
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
        if layer >= self.config.n_layers || pos >= self.filled {
            return None;
        }
        let kv = self.config.kv_dim();
        let off = (layer * self.context + pos) * kv;
        cache.get(off..off + kv)
    }

    /// Logits of the last successful forward call.
    pub fn logits(&self) -> &[f32] {
        &self.s.logits
    }

    /// Runs one token at position `pos` and returns the `vocab_size` logits.
    ///
    /// Errors (nothing is modified): [`Error::TokenOutOfRange`], [`Error::PositionOutOfRange`]
    /// (`pos >= context`), [`Error::PositionGap`] (`pos > cached_len()`).
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<&[f32], Error> {
        self.forward_tapped(token, pos, &mut NoTap)
    }

    /// [`forward`](Self::forward) that shows intermediate values to `tap`.
    pub fn forward_tapped(
        &mut self,
        token: u32,
        pos: usize,
        tap: &mut dyn Tap,
    ) -> Result<&[f32], Error> {
        self.check_step(token, pos)?;
        let FloatModel {
            config,
            rope,
            context,
            key_cache,
            value_cache,
            s,
            weights,
            ..
        } = self;
        let net = Net {
            c: config,
            w: &**weights,
            rope,
        };
        let d = config.dim;
        let t = token as usize;
        s.x.copy_from_slice(&net.tensor(Tensor::TokenEmbedding)[t * d..(t + 1) * d]);
        let kv_layer = *context * config.kv_dim();
        let caches = key_cache
            .chunks_exact_mut(kv_layer)
            .zip(value_cache.chunks_exact_mut(kv_layer));
        for (l, (keys, values)) in caches.enumerate() {
            net.attention(l, pos, keys, values, s, tap);
            net.ffn(l, s, tap);
            tap.observe(l, Site::Residual, &s.x);
        }
        net.classify(s, tap);
        self.filled = pos + 1;
        Ok(&self.s.logits)
    }

    fn check_step(&self, token: u32, pos: usize) -> Result<(), Error> {
        let vocab_size = self.config.vocab_size;
        if token as usize >= vocab_size {
            return Err(Error::TokenOutOfRange { token, vocab_size });
        }
        if pos >= self.context {
            let context = self.context;
            return Err(Error::PositionOutOfRange { pos, context });
        }
        if pos > self.filled {
            let filled = self.filled;
            return Err(Error::PositionGap { pos, filled });
        }
        Ok(())
    }

    /// Greedy decoding: feeds `prompt` from position 0 (resetting the cache), then appends the
    /// argmax until a token of `stop` comes out (not appended), `max_new` tokens were generated
    /// or the cache is full. Returns the generated tokens only.
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<Vec<u32>, Error> {
        self.reset();
        let mut out = Vec::new();
        let Some((&last, head)) = prompt.split_last() else {
            return Ok(out);
        };
        for (pos, &t) in head.iter().enumerate() {
            self.forward(t, pos)?;
        }
        let (mut token, mut pos) = (last, head.len());
        while out.len() < max_new && pos < self.context {
            let next = argmax(self.forward(token, pos)?) as u32;
            if stop.contains(&next) {
                break;
            }
            out.push(next);
            (token, pos) = (next, pos + 1);
        }
        Ok(out)
    }
}

/// The read-only side of one forward step: description, weights, RoPE table.
struct Net<'a, W: ?Sized> {
    c: &'a LlamaConfig,
    w: &'a W,
    rope: &'a Rope,
}

impl<'a, W: WeightSource + ?Sized> Net<'a, W> {
    /// A tensor checked present and sized by [`check_weights`] in [`FloatModel::new`].
    fn tensor(&self, t: Tensor) -> &'a [f32] {
        self.w
            .tensor(t)
            .expect("FloatModel::new checked that every required tensor is present")
    }

    fn layer(&self, l: usize, t: LayerTensor) -> &'a [f32] {
        self.tensor(Tensor::Layer(l, t))
    }

    /// `out = W x (+ bias when the model has Q/K/V biases)`.
    fn project(&self, out: &mut [f32], x: &[f32], l: usize, w: LayerTensor, b: LayerTensor) {
        matmul(out, x, self.layer(l, w));
        if self.c.qkv_bias {
            for (o, &bv) in out.iter_mut().zip(self.layer(l, b)) {
                *o += bv;
            }
        }
    }

    /// Attention block of layer `l` at `pos`; `keys`/`values` are this layer's caches.
    fn attention(
        &self,
        l: usize,
        pos: usize,
        keys: &mut [f32],
        values: &mut [f32],
        s: &mut Scratch,
        tap: &mut dyn Tap,
    ) {
        use LayerTensor as L;
        let kv_dim = self.c.kv_dim();
        let row = pos * kv_dim..(pos + 1) * kv_dim;
        rmsnorm(&mut s.xb, &s.x, self.layer(l, L::AttnNorm), self.c.rms_eps);
        tap.observe(l, Site::AttnInput, &s.xb);
        self.project(&mut s.q, &s.xb, l, L::Q, L::QBias);
        self.project(&mut keys[row.clone()], &s.xb, l, L::K, L::KBias);
        self.rope.rotate(&mut keys[row.clone()], pos);
        self.project(&mut values[row.clone()], &s.xb, l, L::V, L::VBias);
        self.rope.rotate(&mut s.q, pos);
        tap.observe(l, Site::Query, &s.q);
        tap.observe(l, Site::Key, &keys[row.clone()]);
        tap.observe(l, Site::Value, &values[row]);
        let visible = (pos + 1) * kv_dim;
        self.attend(&keys[..visible], &values[..visible], s);
        tap.observe(l, Site::AttnOutput, &s.att_out);
        matmul(&mut s.xb2, &s.att_out, self.layer(l, L::O));
        add(&mut s.x, &s.xb2);
    }

    /// Scaled dot-product attention of every query head over the visible `keys`/`values`
    /// (GQA: query head `h` reads KV head `h / kv_mul`), into `s.att_out`.
    fn attend(&self, keys: &[f32], values: &[f32], s: &mut Scratch) {
        let (hd, kv_dim, kv_mul) = (self.c.head_dim, self.c.kv_dim(), self.c.kv_mul());
        let n = keys.len() / kv_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        for h in 0..self.c.n_heads {
            let qh = &s.q[h * hd..(h + 1) * hd];
            let kv_off = (h / kv_mul) * hd;
            let a = &mut s.att[..n];
            for (t, sc) in a.iter_mut().enumerate() {
                let kt = &keys[t * kv_dim + kv_off..t * kv_dim + kv_off + hd];
                *sc = dot(qh, kt) * scale;
            }
            softmax(a);
            let out = &mut s.att_out[h * hd..(h + 1) * hd];
            out.fill(0.0);
            for (t, &p) in a.iter().enumerate() {
                let vt = &values[t * kv_dim + kv_off..t * kv_dim + kv_off + hd];
                for (o, &v) in out.iter_mut().zip(vt) {
                    *o += p * v;
                }
            }
        }
    }

    /// SwiGLU feed-forward block of layer `l`.
    fn ffn(&self, l: usize, s: &mut Scratch, tap: &mut dyn Tap) {
        use LayerTensor as L;
        rmsnorm(&mut s.xb, &s.x, self.layer(l, L::FfnNorm), self.c.rms_eps);
        tap.observe(l, Site::FfnInput, &s.xb);
        matmul(&mut s.hb, &s.xb, self.layer(l, L::Gate));
        matmul(&mut s.hb2, &s.xb, self.layer(l, L::Up));
        for (g, u) in s.hb.iter_mut().zip(s.hb2.iter()) {
            *g = silu(*g) * u;
        }
        tap.observe(l, Site::FfnHidden, &s.hb);
        matmul(&mut s.xb, &s.hb, self.layer(l, L::Down));
        add(&mut s.x, &s.xb);
    }

    /// Final RMSNorm and classifier (the embedding when tied).
    fn classify(&self, s: &mut Scratch, tap: &mut dyn Tap) {
        let n = self.c.n_layers;
        rmsnorm(
            &mut s.xb,
            &s.x,
            self.tensor(Tensor::OutputNorm),
            self.c.rms_eps,
        );
        tap.observe(n, Site::FinalNorm, &s.xb);
        let cls = if self.c.tied_output {
            Tensor::TokenEmbedding
        } else {
            Tensor::Output
        };
        matmul(&mut s.logits, &s.xb, self.tensor(cls));
        tap.observe(n, Site::Logits, &s.logits);
    }
}

/// One zeroed cache (keys or values) of `context` positions; a size that overflows or cannot
/// be reserved is an error naming the context, not an abort.
fn kv_cache(c: &LlamaConfig, context: usize) -> Result<Vec<f32>, Error> {
    let n = c
        .n_layers
        .checked_mul(context)
        .and_then(|n| n.checked_mul(c.kv_dim()));
    let mut v = Vec::new();
    match n.map(|n| (n, v.try_reserve_exact(n))) {
        Some((n, Ok(()))) => {
            v.resize(n, 0.0);
            Ok(v)
        }
        _ => {
            let why = format!(
                "a KV cache of {} x {context} x {} floats cannot be allocated",
                c.n_layers,
                c.kv_dim()
            );
            Err(Error::config("context", context, why))
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
pub(crate) mod tests;
