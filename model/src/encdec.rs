//! A small encoder-decoder transformer over the one forward ([`crate::forward::run`]): the model
//! that proves static cross-attention K/V end to end (`kv_manager`'s `CrossSpec`).
//!
//! - **Encoder**: the Llama layers of [`EncDecConfig::encoder`] (RMSNorm, GQA attention with RoPE
//!   at positions `0..E`, SwiGLU FFN) over exactly E = [`EncDecConfig::source_len`] source tokens,
//!   attending **bidirectionally** (every row sees every row), then the encoder's final RMSNorm
//!   (its `OutputNorm`). Its output is projected, per decoder layer, to the cross keys and values
//!   ([`CrossKv`]; no RoPE on cross keys).
//! - **Decoder**: the Llama layers of [`EncDecConfig::decoder`] with one more sub-block per layer,
//!   between self-attention and the FFN: `x += O · attend(Q · rmsnorm(x), cross K, cross V)` over
//!   the E encoder rows ([`cross_block`], run through [`Kernels::cross_attention`]).
//!
//! Self-attention, RMSNorm, RoPE and the FFN are the shared ops of the Llama forward; only the
//! bidirectional encoder attention and the cross block are new, written once here and used by the
//! float oracle ([`EncDecModel`]) and by `ref_backend`'s executor alike ([`WithCross`]).
//!
//! The test model's weights are **generated deterministically from a seed**
//! ([`EncDecWeights::from_seed`], xorshift64*, uniform in ±1/sqrt(fan-in)): it is an untrained
//! model, for checking the wiring and the numerics, not for producing text.

use std::sync::Arc;

use crate::forward::{
    Activations, FloatCache, FloatKernels, Input, Kernels, Output, Pass, Positions, linear_rows,
    run,
};
use crate::ops::{Rope, argmax, attend, rmsnorm};
use crate::{
    Error, LlamaConfig, NoTap, RopeConfig, SpecialTokens, Tensor, WeightSource, Weights,
    check_weights,
};

/// An encoder-decoder model: the decoder's description, the encoder depth and source length.
#[derive(Debug, Clone, PartialEq)]
pub struct EncDecConfig {
    /// The decoder (its dims are the encoder's too).
    pub decoder: LlamaConfig,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// E: source tokens per request (the static encoder length; shorter sources are padded by the
    /// caller).
    pub source_len: usize,
}

impl EncDecConfig {
    /// The test model: 2 encoder and 2 decoder layers, dim 32, 4 heads over 2 KV heads of 8,
    /// FFN 64, vocabulary 64, decoder context 32, source length 8.
    pub fn tiny() -> EncDecConfig {
        EncDecConfig {
            decoder: LlamaConfig {
                n_layers: 2,
                dim: 32,
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 8,
                hidden_dim: 64,
                vocab_size: 64,
                context_length: 32,
                rms_eps: 1e-5,
                rope: RopeConfig {
                    theta: 10000.0,
                    ..RopeConfig::default()
                },
                tied_output: false,
                block: crate::Block::default(),
                embed_scale: None,
                final_softcap: None,
                special: SpecialTokens::default(),
                layer_windows: Vec::new(),
            },
            encoder_layers: 2,
            source_len: 8,
        }
    }

    /// The encoder's description: the decoder's dims, `encoder_layers` layers, a tied (unused)
    /// classifier, context E.
    pub fn encoder(&self) -> LlamaConfig {
        LlamaConfig {
            n_layers: self.encoder_layers,
            context_length: self.source_len,
            tied_output: true,
            ..self.decoder.clone()
        }
    }

    /// Checks both descriptions.
    pub fn validate(&self) -> Result<(), Error> {
        self.decoder.validate()?;
        self.encoder().validate()
    }
}

/// The cross-attention weights of one decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossLayer {
    /// RMSNorm before the cross block, `(dim)`.
    pub norm: Vec<f32>,
    /// Query projection, `(q_dim, dim)`.
    pub q: Vec<f32>,
    /// Cross key projection of the encoder output, `(kv_dim, dim)`.
    pub k: Vec<f32>,
    /// Cross value projection of the encoder output, `(kv_dim, dim)`.
    pub v: Vec<f32>,
    /// Output projection, `(dim, q_dim)`.
    pub o: Vec<f32>,
}

/// All weights of an encoder-decoder model.
#[derive(Debug, Clone, PartialEq)]
pub struct EncDecWeights {
    /// Encoder embedding, layers and final norm (`OutputNorm`).
    pub encoder: Weights,
    /// Decoder embedding, layers, final norm and classifier.
    pub decoder: Weights,
    /// One cross block per decoder layer.
    pub cross: Vec<CrossLayer>,
}

/// xorshift64* stream of uniform values.
struct Seeded(u64);

impl Seeded {
    fn uniform(&mut self, bound: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
    }

    fn matrix(&mut self, rows: usize, cols: usize) -> Vec<f32> {
        let bound = 1.0 / (cols as f32).sqrt();
        (0..rows * cols).map(|_| self.uniform(bound)).collect()
    }

    fn norm(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| 1.0 + self.uniform(0.1)).collect()
    }
}

impl EncDecWeights {
    /// Weights generated deterministically from `seed` (the same seed gives the same bits on
    /// every platform): matrices uniform in ±1/sqrt(columns), norms 1 ± 0.1, embeddings ±1.
    pub fn from_seed(c: &EncDecConfig, seed: u64) -> Result<EncDecWeights, Error> {
        c.validate()?;
        let mut rng = Seeded(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut side = |lc: &LlamaConfig| -> Result<Weights, Error> {
            let mut w = Weights::with_layers(lc.n_layers);
            for t in Tensor::required(lc) {
                let shape = t.shape(lc);
                let data = match (t, shape.as_slice()) {
                    (Tensor::TokenEmbedding, &[r, d]) => {
                        (0..r * d).map(|_| rng.uniform(1.0)).collect()
                    }
                    (_, &[r, cols]) => rng.matrix(r, cols),
                    (_, &[len]) => rng.norm(len),
                    _ => unreachable!("weight tensors are vectors or matrices"),
                };
                w.set(t, data)?;
            }
            Ok(w)
        };
        let encoder = side(&c.encoder())?;
        let decoder = side(&c.decoder)?;
        let d = &c.decoder;
        let cross = (0..d.n_layers)
            .map(|_| CrossLayer {
                norm: rng.norm(d.dim),
                q: rng.matrix(d.q_dim(), d.dim),
                k: rng.matrix(d.kv_dim(), d.dim),
                v: rng.matrix(d.kv_dim(), d.dim),
                o: rng.matrix(d.dim, d.q_dim()),
            })
            .collect();
        Ok(EncDecWeights {
            encoder,
            decoder,
            cross,
        })
    }

    /// Checks every tensor's presence and size against `c`.
    pub fn check(&self, c: &EncDecConfig) -> Result<(), Error> {
        c.validate()?;
        check_weights(&c.encoder(), &self.encoder)?;
        check_weights(&c.decoder, &self.decoder)?;
        let d = &c.decoder;
        let bad = |what: &str, found: usize| Error::InvalidPass {
            reason: format!("cross weights: {what} has {found} entries"),
        };
        if self.cross.len() != d.n_layers {
            return Err(bad("the layer list", self.cross.len()));
        }
        for x in &self.cross {
            for (what, v, len) in [
                ("norm", &x.norm, d.dim),
                ("q", &x.q, d.q_dim() * d.dim),
                ("k", &x.k, d.kv_dim() * d.dim),
                ("v", &x.v, d.kv_dim() * d.dim),
                ("o", &x.o, d.dim * d.q_dim()),
            ] {
                if v.len() != len {
                    return Err(bad(what, v.len()));
                }
            }
        }
        Ok(())
    }
}

/// The cross keys and values of one request: per decoder layer, `[E, kv_dim]` rows.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossKv {
    /// E.
    pub rows: usize,
    /// Width of one row (`n_kv_heads * head_dim`).
    pub kv_dim: usize,
    /// `[layer][E][kv_dim]`.
    pub keys: Vec<f32>,
    /// `[layer][E][kv_dim]`.
    pub values: Vec<f32>,
}

impl CrossKv {
    /// Zeroed rows for `layers` layers.
    pub fn zeros(layers: usize, rows: usize, kv_dim: usize) -> CrossKv {
        CrossKv {
            rows,
            kv_dim,
            keys: vec![0.0; layers * rows * kv_dim],
            values: vec![0.0; layers * rows * kv_dim],
        }
    }

    /// The `[E, kv_dim]` keys and values of `layer`.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let n = self.rows * self.kv_dim;
        (
            &self.keys[layer * n..(layer + 1) * n],
            &self.values[layer * n..(layer + 1) * n],
        )
    }

    /// Mutable keys and values of `layer`.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        let n = self.rows * self.kv_dim;
        (
            &mut self.keys[layer * n..(layer + 1) * n],
            &mut self.values[layer * n..(layer + 1) * n],
        )
    }
}

/// Scratch of [`cross_block`] for one row.
#[derive(Debug, Clone)]
pub struct CrossScratch {
    xb: Vec<f32>,
    q: Vec<f32>,
    att: Vec<f32>,
    out: Vec<f32>,
    scores: Vec<f32>,
}

impl CrossScratch {
    /// Scratch for model `c` and `rows` encoder rows.
    pub fn new(c: &LlamaConfig, rows: usize) -> CrossScratch {
        CrossScratch {
            xb: vec![0.0; c.dim],
            q: vec![0.0; c.q_dim()],
            att: vec![0.0; c.q_dim()],
            out: vec![0.0; c.dim],
            scores: vec![0.0; rows],
        }
    }
}

/// The cross-attention sub-block on the rows of `x` (`[n, dim]`): per row, RMSNorm, the query
/// projection, attention of every query head over the `rows` cross keys/values (`[rows,
/// kv_dim]`, GQA as in self-attention, no mask), the output projection, added to `x`.
pub fn cross_block(
    c: &LlamaConfig,
    w: &CrossLayer,
    keys: &[f32],
    values: &[f32],
    s: &mut CrossScratch,
    x: &mut [f32],
) {
    let (hd, kvd, kv_mul, qd) = (c.head_dim, c.kv_dim(), c.kv_mul(), c.q_dim());
    let rows = keys.len() / kvd.max(1);
    for xr in x.chunks_exact_mut(c.dim) {
        rmsnorm(&mut s.xb, xr, &w.norm, c.rms_eps);
        linear_rows(&w.q, qd, c.dim, &s.xb, &mut s.q);
        for h in 0..c.n_heads {
            let off = (h / kv_mul) * hd;
            let row = |t: usize| t * kvd + off..t * kvd + off + hd;
            attend(
                &s.q[h * hd..(h + 1) * hd],
                rows,
                |t| &keys[row(t)],
                |t| &values[row(t)],
                |_| 0.0,
                &mut s.scores,
                &mut s.att[h * hd..(h + 1) * hd],
            );
        }
        linear_rows(&w.o, c.dim, qd, &s.att, &mut s.out);
        for (a, b) in xr.iter_mut().zip(&s.out) {
            *a += b;
        }
    }
}

/// Any [`Kernels`] plus the cross-attention sub-block over a request's [`CrossKv`]: the decoder
/// of the float oracle (`base` = [`FloatKernels`]) and of the executor.
#[derive(Debug)]
pub struct WithCross<'a, K> {
    /// Embedding, linear layers, self-attention and logits.
    pub base: K,
    /// The decoder's description.
    pub config: &'a LlamaConfig,
    /// Cross weights per decoder layer.
    pub weights: &'a [CrossLayer],
    /// The request's cross keys and values.
    pub cross: &'a CrossKv,
    /// Scratch.
    pub scratch: &'a mut CrossScratch,
}

impl<K: Kernels> Kernels for WithCross<'_, K> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        self.base.embed(token, out)
    }
    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        self.base.linear(w, x, out)
    }
    fn vector(&self, v: Tensor) -> &[f32] {
        self.base.vector(v)
    }
    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        self.base.attention(layer, q, k, v, out)
    }
    fn cross_attention(&mut self, layer: usize, x: &mut [f32]) {
        let (keys, values) = self.cross.layer(layer);
        cross_block(
            self.config,
            &self.weights[layer],
            keys,
            values,
            self.scratch,
            x,
        );
    }
    fn logits(&mut self, row: usize, logits: &[f32]) {
        self.base.logits(row, logits)
    }
}

/// The encoder's kernels: f32 weights, bidirectional attention over the pass's rows.
struct EncoderKernels<'a> {
    config: &'a LlamaConfig,
    weights: &'a Weights,
    scores: Vec<f32>,
}

impl EncoderKernels<'_> {
    fn tensor(&self, t: Tensor) -> &[f32] {
        self.weights
            .tensor(t)
            .expect("EncDecWeights::check checked every tensor")
    }
}

impl Kernels for EncoderKernels<'_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        let (d, t) = (out.len(), token as usize);
        out.copy_from_slice(&self.tensor(Tensor::TokenEmbedding)[t * d..(t + 1) * d]);
    }
    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let shape = w.shape(self.config);
        linear_rows(self.tensor(w), shape[0], shape[1], x, out);
    }
    fn vector(&self, v: Tensor) -> &[f32] {
        self.tensor(v)
    }
    fn attention(&mut self, _layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = self.config;
        let (hd, qd, kvd, kv_mul) = (c.head_dim, c.q_dim(), c.kv_dim(), c.kv_mul());
        let rows = k.len() / kvd;
        for (i, qr) in q.chunks_exact(qd).enumerate() {
            for h in 0..c.n_heads {
                let off = (h / kv_mul) * hd;
                let row = |t: usize| t * kvd + off..t * kvd + off + hd;
                attend(
                    &qr[h * hd..(h + 1) * hd],
                    rows,
                    |t| &k[row(t)],
                    |t| &v[row(t)],
                    |_| 0.0,
                    &mut self.scores,
                    &mut out[i * qd + h * hd..i * qd + (h + 1) * hd],
                );
            }
        }
    }
    fn logits(&mut self, _row: usize, _logits: &[f32]) {}
}

/// Runs the encoder over `source` (exactly E tokens below the vocabulary) and projects its output
/// to every decoder layer's cross keys and values.
pub fn encode(c: &EncDecConfig, w: &EncDecWeights, source: &[u32]) -> Result<CrossKv, Error> {
    w.check(c)?;
    let ec = c.encoder();
    if source.len() != c.source_len {
        return Err(Error::InvalidPass {
            reason: format!(
                "{} source tokens, the encoder takes exactly {}",
                source.len(),
                c.source_len
            ),
        });
    }
    let mut k = EncoderKernels {
        config: &ec,
        weights: &w.encoder,
        scores: vec![0.0; source.len()],
    };
    let mut acts = Activations::new(&ec, source.len());
    let positions: Vec<usize> = (0..source.len()).collect();
    let pass = Pass {
        layers: 0..ec.n_layers,
        input: Input::Tokens(source),
        positions: Positions::Ids(&positions),
        output: Output::Hidden,
    };
    let rope = Rope::new(ec.head_dim, &ec.rope);
    run(&ec, &rope, &mut k, &mut acts, &pass, &mut NoTap)?;
    let norm = k.tensor(Tensor::OutputNorm);
    let mut h = vec![0.0; acts.hidden().len()];
    for (o, x) in h
        .chunks_exact_mut(ec.dim)
        .zip(acts.hidden().chunks_exact(ec.dim))
    {
        rmsnorm(o, x, norm, ec.rms_eps);
    }
    let d = &c.decoder;
    let mut cross = CrossKv::zeros(d.n_layers, source.len(), d.kv_dim());
    for (l, x) in w.cross.iter().enumerate() {
        let (keys, values) = cross.layer_mut(l);
        linear_rows(&x.k, d.kv_dim(), d.dim, &h, keys);
        linear_rows(&x.v, d.kv_dim(), d.dim, &h, values);
    }
    Ok(cross)
}

/// The float oracle of an encoder-decoder model: the encoder, then decoder steps with an f32
/// self-attention cache ([`FloatCache`]) and the request's f32 cross K/V.
#[derive(Debug)]
pub struct EncDecModel {
    config: EncDecConfig,
    weights: Arc<EncDecWeights>,
    rope: Rope,
    cache: FloatCache,
    cross: Option<CrossKv>,
    acts: Activations,
    scratch: CrossScratch,
    scores: Vec<f32>,
    logits: Vec<f32>,
    transposed: Vec<f32>,
}

impl EncDecModel {
    /// Checks the weights and allocates a decoder cache of `context` positions.
    pub fn new(
        config: EncDecConfig,
        weights: Arc<EncDecWeights>,
        context: usize,
    ) -> Result<EncDecModel, Error> {
        weights.check(&config)?;
        let d = &config.decoder;
        if context == 0 || context > d.context_length {
            let why = format!("must be in 1..={}", d.context_length);
            return Err(Error::config("context", context, why));
        }
        Ok(EncDecModel {
            rope: Rope::new(d.head_dim, &d.rope),
            cache: FloatCache::new(d, context)?,
            cross: None,
            acts: Activations::new(d, 1),
            scratch: CrossScratch::new(d, config.source_len),
            scores: vec![0.0; context],
            logits: vec![0.0; d.vocab_size],
            transposed: Vec::new(),
            weights,
            config,
        })
    }

    /// Starts a request: runs the encoder over `source` and keeps its cross K/V.
    pub fn encode(&mut self, source: &[u32]) -> Result<&CrossKv, Error> {
        let cross = encode(&self.config, &self.weights, source)?;
        Ok(self.cross.insert(cross))
    }

    /// One decoder token at `pos` (positions fed in order from 0; feeding an earlier one
    /// truncates there). Needs [`EncDecModel::encode`] first.
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<&[f32], Error> {
        let Some(cross) = &self.cross else {
            return Err(Error::InvalidPass {
                reason: "no encoder output: call encode first".into(),
            });
        };
        if pos >= self.scores.len() {
            let context = self.scores.len();
            return Err(Error::PositionOutOfRange { pos, context });
        }
        let d = &self.config.decoder;
        let base = FloatKernels {
            config: d,
            weights: &self.weights.decoder,
            cache: &mut self.cache,
            pos0: pos,
            scores: &mut self.scores,
            logits: &mut self.logits,
            transposed: &mut self.transposed,
        };
        let mut k = WithCross {
            base,
            config: d,
            weights: &self.weights.cross,
            cross,
            scratch: &mut self.scratch,
        };
        let pass = Pass {
            layers: 0..d.n_layers,
            input: Input::Tokens(&[token]),
            positions: Positions::Ids(&[pos]),
            output: Output::Logits,
        };
        run(d, &self.rope, &mut k, &mut self.acts, &pass, &mut NoTap)?;
        Ok(&self.logits)
    }

    /// Greedy decoding of one request: encodes `source`, feeds `prompt` (at least one token) and
    /// appends `max_new` argmax tokens (fewer when the cache fills). Returns the generated tokens
    /// and the logits of every generating step.
    pub fn generate_greedy(
        &mut self,
        source: &[u32],
        prompt: &[u32],
        max_new: usize,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>), Error> {
        self.encode(source)?;
        let (mut out, mut all) = (Vec::new(), Vec::new());
        let Some((&last, head)) = prompt.split_last() else {
            return Ok((out, all));
        };
        for (pos, &t) in head.iter().enumerate() {
            self.forward(t, pos)?;
        }
        let (mut token, mut pos) = (last, head.len());
        while out.len() < max_new && pos < self.scores.len() {
            let logits = self.forward(token, pos)?;
            all.push(logits.to_vec());
            token = argmax(logits) as u32;
            out.push(token);
            pos += 1;
        }
        Ok((out, all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> (EncDecConfig, Arc<EncDecWeights>) {
        let c = EncDecConfig::tiny();
        let w = Arc::new(EncDecWeights::from_seed(&c, 7).unwrap());
        (c, w)
    }

    #[test]
    fn seeded_weights_are_deterministic_and_seed_dependent() {
        let c = EncDecConfig::tiny();
        let a = EncDecWeights::from_seed(&c, 7).unwrap();
        assert_eq!(a, EncDecWeights::from_seed(&c, 7).unwrap());
        assert_ne!(a, EncDecWeights::from_seed(&c, 8).unwrap());
        a.check(&c).unwrap();
    }

    #[test]
    fn the_decoder_reads_the_source_through_cross_attention() {
        let (c, w) = model();
        let mut m = EncDecModel::new(c.clone(), w, 16).unwrap();
        let (a, _) = m
            .generate_greedy(&[1, 2, 3, 4, 5, 6, 7, 8], &[3], 6)
            .unwrap();
        let (b, _) = m
            .generate_greedy(&[9, 9, 9, 9, 9, 9, 9, 9], &[3], 6)
            .unwrap();
        let logits_a = {
            m.encode(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
            m.forward(3, 0).unwrap().to_vec()
        };
        m.encode(&[9, 9, 9, 9, 9, 9, 9, 9]).unwrap();
        let logits_b = m.forward(3, 0).unwrap();
        assert_ne!(logits_a, logits_b, "the source must change the logits");
        assert_eq!(a.len(), 6);
        assert_eq!(b.len(), 6);
    }

    #[test]
    fn encoder_attention_is_bidirectional() {
        let (c, w) = model();
        let base = encode(&c, &w, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let last_changed = encode(&c, &w, &[1, 2, 3, 4, 5, 6, 7, 9]).unwrap();
        // Row 0 sees the last token: causal attention would leave it unchanged.
        let kvd = base.kv_dim;
        assert_ne!(base.keys[..kvd], last_changed.keys[..kvd]);
    }

    #[test]
    fn bad_requests_are_errors() {
        let (c, w) = model();
        let mut m = EncDecModel::new(c.clone(), w.clone(), 16).unwrap();
        assert!(m.forward(1, 0).is_err());
        assert!(m.encode(&[1, 2]).is_err());
        assert!(m.encode(&[1, 2, 3, 4, 5, 6, 7, 64]).is_err());
        assert!(EncDecModel::new(c.clone(), w, 33).is_err());
        let mut broken = EncDecWeights::from_seed(&c, 1).unwrap();
        broken.cross[1].o.pop();
        assert!(broken.check(&c).is_err());
    }
}
