//! Float kernels of the Llama forward pass, shared by the float oracle, calibration and the
//! quantized executor.
//!
//! These are programmer-facing kernels: slice lengths are preconditions and a mismatch panics
//! (documented per function); they never see untrusted input directly.

use rayon::prelude::*;

use crate::config::{Llama3Scaling, RopeConfig, RopePairing};

/// `out[j] = weight[j] * x[j] / sqrt(mean(x²) + eps)`.
///
/// # Panics
/// If `out`, `x` and `weight` differ in length.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    assert!(
        out.len() == x.len() && x.len() == weight.len(),
        "rmsnorm: out {} / x {} / weight {} lengths differ",
        out.len(),
        x.len(),
        weight.len()
    );
    let inv = rms_inverse(x, eps);
    for ((o, &xv), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (inv * xv);
    }
}

/// In-place variant of [`rmsnorm`].
///
/// # Panics
/// If `x` and `weight` differ in length.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    assert_eq!(x.len(), weight.len(), "rmsnorm_inplace: lengths differ");
    let inv = rms_inverse(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (inv * *v);
    }
}

/// `1 / sqrt(mean(x²) + eps)` (1 for an empty slice).
fn rms_inverse(x: &[f32], eps: f32) -> f32 {
    if x.is_empty() {
        return 1.0;
    }
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps;
    1.0 / ss.sqrt()
}

/// Unscaled frequency of RoPE pair `k` of a head: `1 / theta^(2k / head_dim)`.
pub fn rope_frequency(theta: f32, k: usize, head_dim: usize) -> f32 {
    1.0 / theta.powf((2 * k) as f32 / head_dim as f32)
}

/// Llama 3's `llama3` rescaling of one frequency: long wavelengths are divided by `factor`,
/// short ones kept, and the band between interpolated smoothly.
pub fn llama3_scaled(freq: f32, s: &Llama3Scaling) -> f32 {
    let old = s.original_context as f32;
    let wavelen = 2.0 * std::f32::consts::PI / freq;
    let low_freq_wavelen = old / s.low_freq_factor;
    let high_freq_wavelen = old / s.high_freq_factor;
    if wavelen < high_freq_wavelen {
        freq
    } else if wavelen > low_freq_wavelen {
        freq / s.factor
    } else {
        let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

/// Rotary position embedding for one head width: the per-pair frequencies (scaling and
/// frequency factors applied) of the global layers and, when the model rotates its
/// sliding-window layers with another base, of those; the pair layout; the rotated width.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    head_dim: usize,
    freqs: Vec<f32>,
    window_freqs: Option<Vec<f32>>,
    pairing: RopePairing,
    /// Multiplier of the cosines and sines ([`RopeConfig::attn_factor`]).
    scale: f32,
}

/// The frequencies of the `rotated / 2` pairs of base `theta` under `cfg`'s scaling and factors.
fn frequencies(cfg: &RopeConfig, theta: f32, rotated: usize) -> Vec<f32> {
    (0..rotated / 2)
        .map(|k| {
            let f = rope_frequency(theta, k, rotated);
            let f = cfg.scaling.as_ref().map_or(f, |s| llama3_scaled(f, s));
            cfg.freq_factors.as_ref().map_or(f, |d| f / d[k])
        })
        .collect()
}

impl Rope {
    /// Frequencies for heads `head_dim` wide (even, checked by
    /// [`crate::LlamaConfig::validate`], as are the rotated width and the factors' count).
    pub fn new(head_dim: usize, cfg: &RopeConfig) -> Rope {
        let rotated = cfg.rotated_dims(head_dim);
        Rope {
            head_dim,
            freqs: frequencies(cfg, cfg.theta, rotated),
            window_freqs: cfg.window_theta.map(|t| frequencies(cfg, t, rotated)),
            pairing: cfg.pairing,
            scale: cfg.attn_factor.unwrap_or(1.0),
        }
    }

    /// The frequency of each rotated pair of the global layers, `rotated / 2` values.
    pub fn frequencies(&self) -> &[f32] {
        &self.freqs
    }

    /// The frequencies of a layer: the sliding-window ones when `windowed` and the model has
    /// them.
    pub fn layer_frequencies(&self, windowed: bool) -> &[f32] {
        match &self.window_freqs {
            Some(w) if windowed => w,
            _ => &self.freqs,
        }
    }

    /// Whether sliding-window layers rotate with frequencies of their own.
    pub fn has_window_base(&self) -> bool {
        self.window_freqs.is_some()
    }

    /// The pair layout.
    pub fn pairing(&self) -> RopePairing {
        self.pairing
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The rotation of position `pos`: `cos`/`sin` of `pos · freq[k]` for each pair `k` of the
    /// global layers ([`Rope::cos_sin_of`] for a layer's), times the model's
    /// [`RopeConfig::attn_factor`] (a rotation and a scaling: a re-rotation by a position delta
    /// uses [`Rope::frequencies`] alone).
    ///
    /// # Panics
    /// If `cos` or `sin` is not `rotated / 2` long.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        self.cos_sin_of(false, pos, cos, sin);
    }

    /// [`Rope::cos_sin`] with the frequencies of a layer ([`Rope::layer_frequencies`]).
    ///
    /// # Panics
    /// If `cos` or `sin` is not `rotated / 2` long.
    pub fn cos_sin_of(&self, windowed: bool, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let freqs = self.layer_frequencies(windowed);
        assert!(
            cos.len() == freqs.len() && sin.len() == freqs.len(),
            "Rope::cos_sin: tables must hold rotated / 2 = {} values",
            freqs.len()
        );
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(freqs) {
            let (sn, cs) = (pos as f32 * f).sin_cos();
            (*s, *c) = (sn * self.scale, cs * self.scale);
        }
    }

    /// Rotates every head in `vec` (one or more heads back to back) to position `pos` with the
    /// global layers' frequencies.
    ///
    /// # Panics
    /// If `vec.len()` is not a multiple of the head width.
    pub fn rotate(&self, vec: &mut [f32], pos: usize) {
        let half = self.freqs.len();
        let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
        self.cos_sin(pos, &mut cos, &mut sin);
        rope_apply_heads(vec, self.head_dim, &cos, &sin, self.pairing);
    }
}

/// Rotates every head in `vec` (heads back to back, width `2 · cos.len()`) by the angles whose
/// cosines and sines are `cos`/`sin` (one per pair): [`rope_apply_heads`] of whole heads.
///
/// # Panics
/// As [`rope_apply_heads`].
pub fn rope_apply(vec: &mut [f32], cos: &[f32], sin: &[f32], pairing: RopePairing) {
    rope_apply_heads(vec, 2 * cos.len(), cos, sin, pairing);
}

/// Rotates the first `2 · cos.len()` dimensions of every head in `vec` (heads back to back,
/// `head_dim` wide) by the angles whose cosines and sines are `cos`/`sin` (one per pair); the
/// other dimensions pass through (partial rotary). The one RoPE apply of the crate, whether
/// the angles come from position ids ([`Rope::cos_sin`]) or from precomputed tables. Pairs are
/// `(2k, 2k+1)` ([`RopePairing::Adjacent`]) or `(k, k + rotated/2)` ([`RopePairing::HalfSplit`]).
///
/// # Panics
/// If `cos` and `sin` differ in length, are empty, rotate more than `head_dim`, or `vec.len()`
/// is not a multiple of `head_dim`.
pub fn rope_apply_heads(
    vec: &mut [f32],
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    pairing: RopePairing,
) {
    let half = cos.len();
    assert!(
        half == sin.len() && half > 0 && 2 * half <= head_dim && vec.len().is_multiple_of(head_dim),
        "rope_apply: cos {} / sin {} pairs do not fit heads of {head_dim} in len {}",
        cos.len(),
        sin.len(),
        vec.len()
    );
    for head in vec.chunks_exact_mut(head_dim) {
        for (k, (&c, &s)) in cos.iter().zip(sin).enumerate() {
            let (i, j) = match pairing {
                RopePairing::Adjacent => (2 * k, 2 * k + 1),
                RopePairing::HalfSplit => (k, k + half),
            };
            let (a, b) = (head[i], head[j]);
            head[i] = a * c - b * s;
            head[j] = a * s + b * c;
        }
    }
}

/// Scaled dot-product attention of one query head over `n` rows with the usual scale
/// `1 / sqrt(len(q))`: [`attend_scaled`].
///
/// # Panics
/// As [`attend_scaled`].
pub fn attend<'a>(
    q: &[f32],
    n: usize,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    bias: impl Fn(usize) -> f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let scale = 1.0 / (q.len() as f32).sqrt();
    attend_scaled(q, scale, n, key, value, bias, scores, out);
}

/// Scaled dot-product attention of one query head over `n` rows:
/// `out = Σ_t p_t · value(t)` with `p = softmax(q · key(t) · scale + bias(t))` (`scale` is the
/// model's, [`crate::LlamaConfig::attention_scale`]). `scores` is scratch of at least `n`. The
/// float model and the executor both attend through this function; the executor's `bias` is
/// the additive mask, the float model's is zero.
///
/// # Panics
/// If `scores` is shorter than `n` or a key/value row differs in length from `q`/`out`.
#[allow(clippy::too_many_arguments)]
pub fn attend_scaled<'a>(
    q: &[f32],
    scale: f32,
    n: usize,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    bias: impl Fn(usize) -> f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let scores = &mut scores[..n];
    for (t, sc) in scores.iter_mut().enumerate() {
        *sc = dot(q, key(t)) * scale + bias(t);
    }
    softmax(scores);
    out.fill(0.0);
    for (t, &p) in scores.iter().enumerate() {
        for (o, &v) in out.iter_mut().zip(value(t)) {
            *o += p * v;
        }
    }
}

/// In-place softmax. Entries equal to `-inf` get probability 0 (masking). If every entry is
/// `-inf` (nothing to attend to) the output is all zeros rather than NaN. An empty slice is a no-op.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Dot product of two equal-length slices (8 partial sums, so it vectorizes).
///
/// # Panics
/// If the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Matrices with fewer multiply-adds than this run on the calling thread: below it, handing
/// rows to other threads costs more than it saves.
pub const PARALLEL_MIN_MACS: usize = 1 << 15;

/// Matrix-vector product with a row-major `(out.len(), x.len())` matrix:
/// `out[i] = Σ_j w[i·n + j] · x[j]`, `n = x.len()`. Large matrices are split by output rows
/// over rayon's pool (one thread per core); every row is computed the same way either way, so
/// the result does not depend on the thread count.
///
/// # Panics
/// If `w.len() != out.len() * x.len()`.
pub fn matmul(out: &mut [f32], x: &[f32], w: &[f32]) {
    let n = x.len();
    assert_eq!(
        w.len(),
        out.len() * n,
        "matmul: w has {} elements, expected {} x {}",
        w.len(),
        out.len(),
        n
    );
    if n == 0 {
        out.fill(0.0);
        return;
    }
    if w.len() < PARALLEL_MIN_MACS {
        for (o, row) in out.iter_mut().zip(w.chunks_exact(n)) {
            *o = dot(row, x);
        }
        return;
    }
    let rows_per_task = (PARALLEL_MIN_MACS / n).max(1);
    out.par_chunks_mut(rows_per_task)
        .zip(w.par_chunks(rows_per_task * n))
        .for_each(|(o, wc)| {
            for (o, row) in o.iter_mut().zip(wc.chunks_exact(n)) {
                *o = dot(row, x);
            }
        });
}

/// [`matmul`] of every row of `x` (`[n, cols]`) at once into `out` (`[n, rows]`), reading each
/// weight row once for all `n` rows; every element equals what [`matmul`] gives for its row.
/// `scratch` holds the transposed result (its first `n · rows` elements are overwritten).
///
/// # Panics
/// If `w.len() != rows · cols`, `x.len() != n · cols`, `out.len() != n · rows` or `scratch` is
/// shorter than `out`.
pub fn matmul_rows(out: &mut [f32], x: &[f32], w: &[f32], cols: usize, scratch: &mut [f32]) {
    let rows = w.len().checked_div(cols).unwrap_or(0);
    let n = x.len().checked_div(cols).unwrap_or(0);
    assert!(
        cols > 0
            && w.len() == rows * cols
            && x.len() == n * cols
            && out.len() == n * rows
            && scratch.len() >= out.len(),
        "matmul_rows: shapes do not fit (w {}, x {}, out {}, scratch {}, cols {cols})",
        w.len(),
        x.len(),
        out.len(),
        scratch.len()
    );
    if n == 0 {
        return;
    }
    let scratch = &mut scratch[..n * rows];
    let rows_per_task = (PARALLEL_MIN_MACS / (cols * n)).max(1);
    scratch
        .par_chunks_mut(rows_per_task * n)
        .zip(w.par_chunks(rows_per_task * cols))
        .for_each(|(t, wc)| {
            for (t, row) in t.chunks_exact_mut(n).zip(wc.chunks_exact(cols)) {
                for (t, xr) in t.iter_mut().zip(x.chunks_exact(cols)) {
                    *t = dot(row, xr);
                }
            }
        });
    for (r, t) in scratch.chunks_exact(n).enumerate() {
        for (i, &v) in t.iter().enumerate() {
            out[i * rows + r] = v;
        }
    }
}

/// GELU with the tanh approximation: `x/2 · (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The gate activation `act` of the FFN, `act(x)`.
pub fn activate(act: crate::Activation, x: f32) -> f32 {
    match act {
        crate::Activation::Silu => silu(x),
        crate::Activation::GeluTanh => gelu_tanh(x),
    }
}

/// `c · tanh(x / c)`: the final logit soft-cap.
pub fn softcap(x: &mut [f32], c: f32) {
    for v in x {
        *v = c * (*v / c).tanh();
    }
}

/// SiLU (swish): `x · sigmoid(x) = x / (1 + e^-x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ln Σ exp(x)` in f64, stable for large logits.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

/// KL(p ‖ q) in nats of the softmax distributions of two logit vectors of one length: how far a
/// quantized or emulated run's next-token distribution (`q`) is from the f32 model's (`p`).
pub fn kl_logits(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_sum_exp(p_logits), log_sum_exp(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let (la, lb) = (a as f64 - lp, b as f64 - lq);
            la.exp() * (la - lb)
        })
        .sum()
}

/// Index of the largest element (the first one on ties; NaNs are never chosen unless all are
/// NaN). Returns 0 for an empty slice.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

#[cfg(test)]
mod tests;
