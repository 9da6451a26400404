//! The Llama forward pass, written once over a [`LlamaConfig`]: the f32 oracle
//! ([`FloatModel`]), calibration (the oracle seen through a [`Tap`]) and the quantized executor
//! (`ref_backend`) all run [`run`], differing only in their [`Kernels`]: how a linear layer
//! is applied, how an embedding row is read, and how keys/values are stored and attended over.
//!
//! A [`Pass`] runs `n` rows (tokens) through a layer range `[a, b)`, from token ids (the
//! embedding) or a hidden state, with RoPE angles from position ids (the description's theta,
//! Llama 3 scaling and pairing) or from precomputed cos/sin tables, and ends with the hidden
//! state or with the logits (final RMSNorm and classifier).

use std::sync::Arc;

use std::ops::Range;

use crate::ops::{
    Rope, activate, argmax, attend_scaled, matmul, matmul_rows, rmsnorm, rmsnorm_inplace,
    rope_apply_heads, softcap,
};
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

/// Where the rows of a [`Pass`] come from.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// Token ids, one per row (looked up in the embedding; each below `vocab_size`).
    Tokens(&'a [u32]),
    /// Hidden states `[n, dim]` (the residual stream entering the first layer of the range).
    Hidden(&'a [f32]),
}

/// The RoPE angles of the rows of a [`Pass`].
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// Position ids, one per row: angles from the description (theta, scaling).
    Ids(&'a [usize]),
    /// Precomputed tables `[n, rotated / 2]`: the cosine and sine of each row's angle per pair
    /// (models whose sliding-window layers rotate with a base of their own take ids).
    Table {
        /// Cosines.
        cos: &'a [f32],
        /// Sines.
        sin: &'a [f32],
    },
}

/// What a [`Pass`] ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The hidden state after the last layer of the range, in [`Activations::hidden`].
    Hidden,
    /// Final RMSNorm and classifier; each row's logits go to [`Kernels::logits`].
    Logits,
    /// Final RMSNorm and classifier of the last row only (a prefill that consumes no other
    /// row's logits): its logits go to [`Kernels::logits`] as row 0.
    LastLogits,
}

/// One forward pass over `n` rows.
#[derive(Debug, Clone)]
pub struct Pass<'a> {
    /// Layers to run, `a..b` with `a <= b <= n_layers`.
    pub layers: Range<usize>,
    /// Input rows.
    pub input: Input<'a>,
    /// RoPE angles of the rows.
    pub positions: Positions<'a>,
    /// What to end with.
    pub output: Output,
}

impl Pass<'_> {
    /// Number of rows.
    pub fn rows(&self, c: &LlamaConfig) -> usize {
        match self.input {
            Input::Tokens(t) => t.len(),
            Input::Hidden(h) => h.len() / c.dim.max(1),
        }
    }

    /// Checks every length against `c` and `capacity` rows; returns the row count.
    fn check(&self, c: &LlamaConfig, capacity: usize) -> Result<usize, Error> {
        let bad = |reason: String| Err(Error::InvalidPass { reason });
        let n = self.rows(c);
        if n == 0 || n > capacity {
            return bad(format!("{n} rows, expected 1..={capacity}"));
        }
        if let Input::Hidden(h) = self.input
            && h.len() != n * c.dim
        {
            return bad(format!(
                "hidden input of {} values is not n x {}",
                h.len(),
                c.dim
            ));
        }
        if let Input::Tokens(t) = self.input
            && let Some(&token) = t.iter().find(|&&t| t as usize >= c.vocab_size)
        {
            let vocab_size = c.vocab_size;
            return Err(Error::TokenOutOfRange { token, vocab_size });
        }
        let half = c.rope.rotated_dims(c.head_dim) / 2;
        match self.positions {
            Positions::Ids(p) if p.len() != n => bad(format!("{} positions for {n} rows", p.len())),
            Positions::Table { .. } if c.rope.window_theta.is_some() => bad(
                "RoPE tables give one base, and this model's sliding-window layers rotate with \
                 a base of their own: pass position ids"
                    .into(),
            ),
            Positions::Table { cos, sin } if cos.len() != n * half || sin.len() != n * half => {
                bad(format!(
                    "cos/sin tables of {}/{} values, expected {n} x {half}",
                    cos.len(),
                    sin.len()
                ))
            }
            _ if self.layers.start > self.layers.end || self.layers.end > c.n_layers => bad(
                format!("layers {:?} outside 0..{}", self.layers, c.n_layers),
            ),
            _ => Ok(n),
        }
    }
}

/// How one implementation of the forward applies its weights and keeps its KV cache. Slices
/// hold `n` rows back to back.
pub trait Kernels {
    /// The embedding row of `token` (`< vocab_size`, checked) into `out` (`dim`).
    fn embed(&mut self, token: u32, out: &mut [f32]);

    /// `out = W x` row by row for matrix `w`: a layer's `Q`, `K`, `V`, `O`, `Gate`, `Up`,
    /// `Down`, or the classifier (`Output`, or `TokenEmbedding` when tied). `x` is
    /// `[n, cols]`, `out` `[n, rows]` ([`Tensor::shape`]).
    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]);

    /// [`Kernels::linear`] for matrices that read the same `x` (a layer's `Q`/`K`/`V`, its
    /// `Gate`/`Up`), `outs[i] = ws[i] x`: an implementation may run them as one job. The
    /// results must equal separate `linear` calls.
    fn linear_many(&mut self, ws: &[Tensor], x: &[f32], outs: &mut [&mut [f32]]) {
        for (&w, out) in ws.iter().zip(outs) {
            self.linear(w, x, out);
        }
    }

    /// An f32 vector: RMSNorm weights (the attention, FFN and final norms, a block's q/k and
    /// post norms) and Q/K/V biases.
    fn vector(&self, v: Tensor) -> &[f32];

    /// Stores the step's keys and values of `layer` (`k`, `v`: `[n, kv_dim]`, after bias and
    /// RoPE) and attends: every query head of every row of `q` (`[n, q_dim]`) over the past and
    /// the visible new rows (GQA: query head `h` reads KV head `h / kv_mul`), into `out`
    /// (`[n, q_dim]`). Implementations use [`attend`](crate::ops::attend) with the model's
    /// [`LlamaConfig::attention_scale`].
    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]);

    /// The cross-attention sub-block of `layer`, between self-attention and the FFN: adds its
    /// output to the residual stream `x` (`[n, dim]`). Decoder-only models have none (the
    /// default); an encoder-decoder's decoder runs [`crate::encdec::cross_block`].
    fn cross_attention(&mut self, layer: usize, x: &mut [f32]) {
        let _ = (layer, x);
    }

    /// The logits of `row` (with [`Output::Logits`]).
    fn logits(&mut self, row: usize, logits: &[f32]);
}

/// The activations of a forward pass for up to `capacity` rows, allocated once; [`run`] does
/// not allocate.
#[derive(Debug, Clone)]
pub struct Activations {
    capacity: usize,
    /// Rows the logits buffer holds: `capacity`, or 1 for passes that end with
    /// [`Output::LastLogits`] ([`Activations::last_row`]).
    logit_rows: usize,
    rows: usize,
    x: Vec<f32>,
    xb: Vec<f32>,
    xb2: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att_out: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The sliding-window layers' tables when they rotate with a base of their own (else empty).
    cos_w: Vec<f32>,
    sin_w: Vec<f32>,
    logits: Vec<f32>,
}

impl Activations {
    /// Buffers for `capacity` rows of model `c`.
    pub fn new(c: &LlamaConfig, capacity: usize) -> Activations {
        Activations::with_logit_rows(c, capacity, capacity)
    }

    /// Buffers for `capacity` rows of model `c` with logits for one row: passes ending with
    /// [`Output::Hidden`] or [`Output::LastLogits`].
    pub fn last_row(c: &LlamaConfig, capacity: usize) -> Activations {
        Activations::with_logit_rows(c, capacity, 1)
    }

    fn with_logit_rows(c: &LlamaConfig, capacity: usize, logit_rows: usize) -> Activations {
        let z = |w: usize| vec![0.0; capacity * w];
        let half = c.rope.rotated_dims(c.head_dim) / 2;
        let half_w = if c.rope.window_theta.is_some() {
            half
        } else {
            0
        };
        Activations {
            capacity,
            logit_rows,
            rows: 0,
            x: z(c.dim),
            xb: z(c.dim),
            xb2: z(c.dim),
            q: z(c.q_dim()),
            k: z(c.kv_dim()),
            v: z(c.kv_dim()),
            att_out: z(c.q_dim()),
            hb: z(c.hidden_dim),
            hb2: z(c.hidden_dim),
            cos: z(half),
            sin: z(half),
            cos_w: z(half_w),
            sin_w: z(half_w),
            logits: vec![0.0; logit_rows * c.vocab_size],
        }
    }

    /// Rows this value holds buffers for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The residual stream `[n, dim]` after the last pass (its output with [`Output::Hidden`]).
    pub fn hidden(&self) -> &[f32] {
        &self.x[..self.rows * (self.x.len() / self.capacity.max(1))]
    }

    /// Bytes of all buffers.
    pub fn bytes(&self) -> usize {
        let v = [
            &self.x,
            &self.xb,
            &self.xb2,
            &self.q,
            &self.k,
            &self.v,
            &self.att_out,
            &self.hb,
            &self.hb2,
            &self.cos,
            &self.sin,
            &self.cos_w,
            &self.sin_w,
            &self.logits,
        ];
        v.iter().map(|b| b.len() * 4).sum()
    }
}

/// Runs `pass` with kernels `k` over activations `a` (`rope` built from `c`). Checks the pass
/// first ([`Error::InvalidPass`], [`Error::TokenOutOfRange`]) and then cannot fail.
pub fn run(
    c: &LlamaConfig,
    rope: &Rope,
    k: &mut dyn Kernels,
    a: &mut Activations,
    pass: &Pass<'_>,
    tap: &mut dyn Tap,
) -> Result<(), Error> {
    let n = pass.check(c, a.capacity)?;
    if pass.output == Output::Logits && n > a.logit_rows {
        return Err(Error::InvalidPass {
            reason: format!(
                "{n} rows of logits, and the activations hold {}",
                a.logit_rows
            ),
        });
    }
    a.rows = n;
    embed_rows(c, k, a, pass.input, n);
    rope_tables(rope, a, pass.positions, n);
    for l in pass.layers.clone() {
        attention_block(c, l, n, k, a, tap);
        k.cross_attention(l, &mut a.x[..n * c.dim]);
        ffn_block(c, l, n, k, a, tap);
        observe_rows(tap, l, Site::Residual, &a.x[..n * c.dim], c.dim);
    }
    match pass.output {
        Output::Hidden => {}
        Output::Logits => classify(c, 0..n, k, a, tap),
        Output::LastLogits => classify(c, n - 1..n, k, a, tap),
    }
    Ok(())
}

/// The residual stream of the pass's rows: embedding rows (times the model's embedding scale)
/// or the given hidden state.
fn embed_rows(
    c: &LlamaConfig,
    k: &mut dyn Kernels,
    a: &mut Activations,
    input: Input<'_>,
    n: usize,
) {
    let dim = c.dim;
    match input {
        Input::Tokens(t) => {
            for (&tok, x) in t.iter().zip(a.x.chunks_exact_mut(dim)) {
                k.embed(tok, x);
                if let Some(s) = c.embed_scale {
                    x.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
        Input::Hidden(h) => a.x[..n * dim].copy_from_slice(h),
    }
}

/// Each row's RoPE tables (and the sliding-window layers' own, when they have a base of their
/// own), from position ids or given.
fn rope_tables(rope: &Rope, a: &mut Activations, positions: Positions<'_>, n: usize) {
    let half = rope.frequencies().len();
    match positions {
        Positions::Ids(p) => {
            let rows = a
                .cos
                .chunks_exact_mut(half)
                .zip(a.sin.chunks_exact_mut(half));
            for (&pos, (cos, sin)) in p.iter().zip(rows) {
                rope.cos_sin(pos, cos, sin);
            }
            if rope.has_window_base() {
                let rows = a
                    .cos_w
                    .chunks_exact_mut(half)
                    .zip(a.sin_w.chunks_exact_mut(half));
                for (&pos, (cos, sin)) in p.iter().zip(rows) {
                    rope.cos_sin_of(true, pos, cos, sin);
                }
            }
        }
        Positions::Table { cos, sin } => {
            a.cos[..n * half].copy_from_slice(cos);
            a.sin[..n * half].copy_from_slice(sin);
        }
    }
}

fn observe_rows(tap: &mut dyn Tap, layer: usize, site: Site, values: &[f32], width: usize) {
    for row in values.chunks_exact(width) {
        tap.observe(layer, site, row);
    }
}

/// RMSNorm of each row of `x` into `out`.
fn norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for (o, xr) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        rmsnorm(o, xr, weight, eps);
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// A layer's Q, K and V projections of the rows of `x` (+ their biases when the model has them).
fn project_qkv(c: &LlamaConfig, k: &mut dyn Kernels, l: usize, x: &[f32], outs: [&mut [f32]; 3]) {
    use LayerTensor as L;
    let mut outs = outs;
    k.linear_many(
        &[L::Q, L::K, L::V].map(|t| Tensor::Layer(l, t)),
        x,
        &mut outs,
    );
    if c.block.qkv_bias {
        for (out, bias) in outs.into_iter().zip([L::QBias, L::KBias, L::VBias]) {
            let b = k.vector(Tensor::Layer(l, bias));
            for row in out.chunks_exact_mut(b.len()) {
                add(row, b);
            }
        }
    }
}

/// RMSNorm of every head (`w.len()` wide) of every row of `x` in place, with weights `w`.
fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(w.len()) {
        rmsnorm_inplace(head, w, eps);
    }
}

/// Queries and keys of the `n` rows: per-head RMSNorm when the block has it, then RoPE with the
/// layer's tables (its window's when it is a sliding-window layer with a base of its own).
fn qk_rotate(c: &LlamaConfig, l: usize, k: &mut dyn Kernels, a: &mut Activations, n: usize) {
    use LayerTensor as L;
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    let (q, kk) = (&mut a.q[..n * qd], &mut a.k[..n * kvd]);
    if c.block.qk_norm {
        norm_heads(q, k.vector(Tensor::Layer(l, L::QNorm)), c.rms_eps);
        norm_heads(kk, k.vector(Tensor::Layer(l, L::KNorm)), c.rms_eps);
    }
    let half = c.rope.rotated_dims(hd) / 2;
    let own = c.rope.window_theta.is_some() && c.layer_window(l).is_some();
    let (cos, sin) = if own {
        (&a.cos_w, &a.sin_w)
    } else {
        (&a.cos, &a.sin)
    };
    let tables = cos.chunks_exact(half).zip(sin.chunks_exact(half));
    let rows = q.chunks_exact_mut(qd).zip(kk.chunks_exact_mut(kvd));
    for ((qr, kr), (cos, sin)) in rows.zip(tables) {
        rope_apply_heads(qr, hd, cos, sin, c.rope.pairing);
        rope_apply_heads(kr, hd, cos, sin, c.rope.pairing);
    }
}

/// `x += out`, with `out` RMS-normalized first by `post` when the block has that norm.
fn add_residual(
    c: &LlamaConfig,
    k: &dyn Kernels,
    post: Option<Tensor>,
    x: &mut [f32],
    out: &mut [f32],
) {
    if let Some(t) = post {
        let w = k.vector(t);
        for row in out.chunks_exact_mut(c.dim) {
            rmsnorm_inplace(row, w, c.rms_eps);
        }
    }
    add(x, out);
}

/// Attention block of layer `l` for the `n` rows.
fn attention_block(
    c: &LlamaConfig,
    l: usize,
    n: usize,
    k: &mut dyn Kernels,
    a: &mut Activations,
    tap: &mut dyn Tap,
) {
    use LayerTensor as L;
    let (dim, qd, kvd) = (c.dim, c.q_dim(), c.kv_dim());
    let (x, xb) = (&a.x[..n * dim], &mut a.xb[..n * dim]);
    norm_rows(xb, x, k.vector(Tensor::Layer(l, L::AttnNorm)), c.rms_eps);
    observe_rows(tap, l, Site::AttnInput, xb, dim);
    let (q, kk, v) = (&mut a.q[..n * qd], &mut a.k[..n * kvd], &mut a.v[..n * kvd]);
    project_qkv(c, k, l, xb, [&mut *q, &mut *kk, &mut *v]);
    qk_rotate(c, l, k, a, n);
    let (q, kk, v) = (&a.q[..n * qd], &a.k[..n * kvd], &a.v[..n * kvd]);
    observe_rows(tap, l, Site::Query, q, qd);
    observe_rows(tap, l, Site::Key, kk, kvd);
    observe_rows(tap, l, Site::Value, v, kvd);
    let att = &mut a.att_out[..n * qd];
    k.attention(l, q, kk, v, att);
    observe_rows(tap, l, Site::AttnOutput, att, qd);
    let xb2 = &mut a.xb2[..n * dim];
    k.linear(Tensor::Layer(l, L::O), att, xb2);
    let post = c
        .block
        .post_attention_norm
        .then_some(Tensor::Layer(l, L::PostAttnNorm));
    add_residual(c, k, post, &mut a.x[..n * dim], xb2);
}

/// Gated feed-forward block of layer `l` for the `n` rows: `down(act(gate) * up)`.
fn ffn_block(
    c: &LlamaConfig,
    l: usize,
    n: usize,
    k: &mut dyn Kernels,
    a: &mut Activations,
    tap: &mut dyn Tap,
) {
    use LayerTensor as L;
    let (dim, hd) = (c.dim, c.hidden_dim);
    let (x, xb) = (&a.x[..n * dim], &mut a.xb[..n * dim]);
    norm_rows(xb, x, k.vector(Tensor::Layer(l, L::FfnNorm)), c.rms_eps);
    observe_rows(tap, l, Site::FfnInput, xb, dim);
    let (hb, hb2) = (&mut a.hb[..n * hd], &mut a.hb2[..n * hd]);
    k.linear_many(
        &[Tensor::Layer(l, L::Gate), Tensor::Layer(l, L::Up)],
        xb,
        &mut [&mut *hb, &mut *hb2],
    );
    let act = c.block.activation;
    for (g, u) in hb.iter_mut().zip(hb2.iter()) {
        *g = activate(act, *g) * u;
    }
    observe_rows(tap, l, Site::FfnHidden, hb, hd);
    k.linear(Tensor::Layer(l, L::Down), hb, xb);
    let post = c
        .block
        .post_ffn_norm
        .then_some(Tensor::Layer(l, L::PostFfnNorm));
    add_residual(c, k, post, &mut a.x[..n * dim], xb);
}

/// Final RMSNorm and classifier (the embedding when tied) of `rows`, in one matmul; their
/// logits go to [`Kernels::logits`] as rows `0..rows.len()`.
fn classify(
    c: &LlamaConfig,
    rows: Range<usize>,
    k: &mut dyn Kernels,
    a: &mut Activations,
    tap: &mut dyn Tap,
) {
    let (dim, last) = (c.dim, c.n_layers);
    let cls = Tensor::classifier(c);
    let n = rows.len();
    let xb = &mut a.xb[..n * dim];
    let x = &a.x[rows.start * dim..rows.end * dim];
    norm_rows(xb, x, k.vector(Tensor::OutputNorm), c.rms_eps);
    observe_rows(tap, last, Site::FinalNorm, xb, dim);
    let v = c.vocab_size;
    let logits = &mut a.logits[..n * v];
    k.linear(cls, xb, logits);
    if let Some(cap) = c.final_softcap {
        softcap(logits, cap);
    }
    for (i, row) in logits.chunks_exact(v).enumerate() {
        tap.observe(last, Site::Logits, row);
        k.logits(i, row);
    }
}

/// Plain f32 decoder over shared weights with a KV cache laid out `[layer][pos][kv_dim]` (keys
/// after RoPE), sized for `context` positions: [`run`] with [`FloatKernels`]. Buffers are
/// allocated once in [`FloatModel::new`]; [`FloatModel::forward`] does not allocate.
///
/// Positions must be fed in order: `forward(token, pos)` needs positions `0..pos` in the cache,
/// so `pos` may be at most the number of cached positions. Feeding an earlier position
/// overwrites it and truncates the cache there (rollback).
#[derive(Debug, Clone)]
pub struct FloatModel<W: ?Sized> {
    config: LlamaConfig,
    rope: Rope,
    cache: FloatCache,
    filled: usize,
    acts: Activations,
    att: Vec<f32>,
    logits: Vec<f32>,
    /// Scratch of multi-row passes.
    transposed: Vec<f32>,
    weights: Arc<W>,
}

/// The f32 KV cache of a [`FloatModel`]: `[layer][pos][kv_dim]` keys and values.
#[derive(Debug, Clone)]
pub struct FloatCache {
    context: usize,
    kv_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl FloatCache {
    /// A zeroed cache of `context` positions for model `c`.
    pub fn new(c: &LlamaConfig, context: usize) -> Result<FloatCache, Error> {
        Ok(FloatCache {
            context,
            kv_dim: c.kv_dim(),
            keys: kv_cache(c, context)?,
            values: kv_cache(c, context)?,
        })
    }

    fn offset(&self, layer: usize, pos: usize) -> usize {
        (layer * self.context + pos) * self.kv_dim
    }
}

/// The f32 [`Kernels`]: weights read from a [`WeightSource`], keys and values stored in a
/// [`FloatCache`] at positions `pos0, pos0 + 1, ...` (row `i` at `pos0 + i`), causal attention
/// over positions `0..=pos0 + i`, or over the last `W` of them in a sliding-window layer
/// ([`LlamaConfig::layer_window`]).
#[derive(Debug)]
pub struct FloatKernels<'a, W: ?Sized> {
    /// Model description.
    pub config: &'a LlamaConfig,
    /// Weights (checked with [`check_weights`]).
    pub weights: &'a W,
    /// The KV cache.
    pub cache: &'a mut FloatCache,
    /// Cache position of row 0.
    pub pos0: usize,
    /// Attention score scratch, at least `pos0 + n` long.
    pub scores: &'a mut [f32],
    /// Receives the logits of the last row.
    pub logits: &'a mut [f32],
    /// Scratch of the multi-row matmul (grown as needed).
    pub transposed: &'a mut Vec<f32>,
}

impl<W: WeightSource + ?Sized> FloatKernels<'_, W> {
    /// A tensor checked present and sized by [`check_weights`].
    fn tensor(&self, t: Tensor) -> &[f32] {
        self.weights
            .tensor(t)
            .expect("FloatModel::new checked that every required tensor is present")
    }
}

impl<W: WeightSource + ?Sized> Kernels for FloatKernels<'_, W> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        let d = out.len();
        let t = token as usize;
        out.copy_from_slice(&self.tensor(Tensor::TokenEmbedding)[t * d..(t + 1) * d]);
    }

    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let cols = w.shape(self.config)[1];
        let m = self
            .weights
            .tensor(w)
            .expect("FloatModel::new checked that every required tensor is present");
        if x.len() == cols {
            matmul(out, x, m);
        } else {
            // Several rows (a prefill): each weight row is read once for all of them.
            if self.transposed.len() < out.len() {
                self.transposed.resize(out.len(), 0.0);
            }
            matmul_rows(out, x, m, cols, self.transposed);
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.tensor(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = self.config;
        let (hd, qd, kvd, kv_mul) = (c.head_dim, c.q_dim(), c.kv_dim(), c.kv_mul());
        let rows = q
            .chunks_exact(qd)
            .zip(k.chunks_exact(kvd))
            .zip(v.chunks_exact(kvd));
        for (i, ((qr, kr), vr)) in rows.enumerate() {
            let pos = self.pos0 + i;
            let at = self.cache.offset(layer, pos);
            self.cache.keys[at..at + kvd].copy_from_slice(kr);
            self.cache.values[at..at + kvd].copy_from_slice(vr);
            // A sliding-window layer sees positions `pos + 1 - W ..= pos` only.
            let first = c
                .layer_window(layer)
                .map_or(0, |w| (pos + 1).saturating_sub(w));
            let base = self.cache.offset(layer, first);
            let (keys, values) = (&self.cache.keys[base..], &self.cache.values[base..]);
            for h in 0..c.n_heads {
                let off = (h / kv_mul) * hd;
                let row = |t: usize| t * kvd + off..t * kvd + off + hd;
                attend_scaled(
                    &qr[h * hd..(h + 1) * hd],
                    c.attention_scale(),
                    pos + 1 - first,
                    |t| &keys[row(t)],
                    |t| &values[row(t)],
                    |_| 0.0,
                    self.scores,
                    &mut out[i * qd + h * hd..i * qd + (h + 1) * hd],
                );
            }
        }
    }

    fn logits(&mut self, _row: usize, logits: &[f32]) {
        self.logits.copy_from_slice(logits);
    }
}

impl<W: WeightSource + ?Sized> FloatModel<W> {
    /// Validates `config`, checks that `weights` holds every tensor it needs with the right
    /// size, and allocates a KV cache of `context` positions (`1..=config.context_length`):
    /// `2 · n_layers · context · kv_dim` floats, so choose `context` for the memory at hand
    /// (SmolLM2-135M: 46 KiB per position). The description is bound to that context
    /// ([`LlamaConfig::for_context`]: LongRoPE's factors).
    pub fn new(config: LlamaConfig, weights: Arc<W>, context: usize) -> Result<Self, Error> {
        let config = config.for_context(context);
        config.validate()?;
        check_weights(&config, &*weights)?;
        if context == 0 || context > config.context_length {
            let why = format!("must be in 1..={}", config.context_length);
            return Err(Error::config("context", context, why));
        }
        let c = &config;
        Ok(FloatModel {
            rope: Rope::new(c.head_dim, &c.rope),
            cache: FloatCache::new(c, context)?,
            filled: 0,
            acts: Activations::new(c, 1),
            att: vec![0.0; context],
            logits: vec![0.0; c.vocab_size],
            transposed: Vec::new(),
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
        self.cache.context
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
        self.cache_row(&self.cache.keys, layer, pos)
    }

    /// Values of `layer` at `pos` (`kv_dim` floats), or `None` if not cached.
    pub fn value_cache(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        self.cache_row(&self.cache.values, layer, pos)
    }

    fn cache_row<'a>(&self, cache: &'a [f32], layer: usize, pos: usize) -> Option<&'a [f32]> {
        if layer >= self.config.n_layers || pos >= self.filled {
            return None;
        }
        let off = self.cache.offset(layer, pos);
        cache.get(off..off + self.cache.kv_dim)
    }

    /// Logits of the last successful forward call.
    pub fn logits(&self) -> &[f32] {
        &self.logits
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
        let pass = Pass {
            layers: 0..self.config.n_layers,
            input: Input::Tokens(&[token]),
            positions: Positions::Ids(&[pos]),
            output: Output::Logits,
        };
        self.run_pass(pos, &pass, tap)?;
        self.filled = pos + 1;
        Ok(&self.logits)
    }

    /// Runs any [`Pass`] with this model's weights and cache, row `i` stored at cache position
    /// `pos0 + i` and attending causally over positions `0..=pos0 + i` (with a layer range,
    /// only those layers' cache rows are written). With [`Output::Logits`], [`logits`]
    /// (Self::logits) holds the last row's; the hidden state is [`hidden`](Self::hidden).
    /// Grows its activation buffers when the pass has more rows than any before. Does not
    /// change [`cached_len`](Self::cached_len).
    ///
    /// Errors: those of [`run`], and [`Error::PositionOutOfRange`] when `pos0 + n > context`.
    pub fn run_pass(
        &mut self,
        pos0: usize,
        pass: &Pass<'_>,
        tap: &mut dyn Tap,
    ) -> Result<(), Error> {
        let n = pass.rows(&self.config);
        let context = self.cache.context;
        if pos0 + n > context {
            let pos = pos0 + n - 1;
            return Err(Error::PositionOutOfRange { pos, context });
        }
        if n > self.acts.capacity() {
            self.acts = Activations::new(&self.config, n);
        }
        let mut k = FloatKernels {
            config: &self.config,
            weights: &*self.weights,
            cache: &mut self.cache,
            pos0,
            scores: &mut self.att,
            logits: &mut self.logits,
            transposed: &mut self.transposed,
        };
        run(&self.config, &self.rope, &mut k, &mut self.acts, pass, tap)
    }

    /// The hidden state `[n, dim]` after the last pass.
    pub fn hidden(&self) -> &[f32] {
        self.acts.hidden()
    }

    fn check_step(&self, token: u32, pos: usize) -> Result<(), Error> {
        let vocab_size = self.config.vocab_size;
        if token as usize >= vocab_size {
            return Err(Error::TokenOutOfRange { token, vocab_size });
        }
        if pos >= self.cache.context {
            let context = self.cache.context;
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
        while out.len() < max_new && pos < self.cache.context {
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

/// `out = m x` row by row: `m` is `[rows, cols]`, `x` `[n, cols]`, `out` `[n, rows]`.
pub fn linear_rows(m: &[f32], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    for (o, xr) in out.chunks_exact_mut(rows).zip(x.chunks_exact(cols)) {
        matmul(o, xr, m);
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

#[cfg(test)]
pub(crate) mod tests;
