//! Where the executor's error comes from: the f32 forward (`model::forward::run`) with the
//! executor's quantization applied at one site at a time, teacher-forced over the text, each
//! site's mean KL against the unquantized forward.
//!
//! The quantization is the executor's own, taken from the compiled model: its i8 weights with one
//! scale per output channel ([`CompiledModel::i8_matrix`]), the static i16 encoding of each matrix
//! product's input ([`CompiledModel::matrix_products`]) and the fixed-point K/V encodings
//! ([`CompiledModel::kv_spec`]). Everything else stays f32, as in the executor (norms, RoPE,
//! attention scores and softmax, the residual stream). The row with every site quantized is
//! held against the executor's own figure (the grid's): if the two disagree, the executor
//! quantizes something this list does not name.

use std::collections::HashMap;

use model::forward::{
    self, Activations, FloatCache, FloatKernels, Input, Kernels, Output, Pass, Positions,
};
use model::ops::{Rope, argmax, kl_logits};
use model::{LayerTensor, LlamaConfig, NoTap, Overlay, Tensor, WeightSource};
use quant::{QuantSpec, ScaleOffset, quantize_value};
use ref_backend::CompiledModel;

use crate::Error;

/// One group of sites quantized together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The i8 weights of one kind of matrix, every layer.
    Weights(LayerTensor),
    /// The i8 embedding table (also the classifier of a tied model).
    Embedding,
    /// The classifier's own i8 weights (untied models).
    Classifier,
    /// The i16 input of one kind of matrix product, every layer.
    Input(LayerTensor),
    /// The i16 input of the classifier (the final RMSNorm's output).
    ClassifierInput,
    /// The fixed-point keys, or values, every layer and head.
    Keys,
    Values,
}

impl Site {
    /// Every site of `c`, in report order.
    pub fn all(c: &LlamaConfig) -> Vec<Site> {
        use LayerTensor as L;
        let kinds = [L::Q, L::K, L::V, L::O, L::Gate, L::Up, L::Down];
        let mut sites: Vec<Site> = kinds.iter().map(|&k| Site::Weights(k)).collect();
        sites.push(Site::Embedding);
        if !c.tied_output {
            sites.push(Site::Classifier);
        }
        // Q, K and V read one input (one encoding), as do Gate and Up.
        sites.extend([L::Q, L::O, L::Gate, L::Down].map(Site::Input));
        sites.extend([Site::ClassifierInput, Site::Keys, Site::Values]);
        sites
    }

    pub fn label(self) -> String {
        match self {
            Site::Weights(k) => format!("weights {k:?}"),
            Site::Embedding => "weights embedding".into(),
            Site::Classifier => "weights classifier".into(),
            Site::Input(LayerTensor::Q) => "input of Q/K/V (attention norm)".into(),
            Site::Input(LayerTensor::O) => "input of O (attention output)".into(),
            Site::Input(LayerTensor::Gate) => "input of gate/up (FFN norm)".into(),
            Site::Input(LayerTensor::Down) => "input of down (silu(gate) x up)".into(),
            Site::Input(k) => format!("input of {k:?}"),
            Site::ClassifierInput => "input of the classifier (final norm)".into(),
            Site::Keys => "K cache".into(),
            Site::Values => "V cache".into(),
        }
    }

    /// Whether this site covers matrix `t`'s weights.
    fn has_weights(self, t: Tensor) -> bool {
        match (self, t) {
            (Site::Weights(k), Tensor::Layer(_, l)) => k == l,
            (Site::Embedding, Tensor::TokenEmbedding) | (Site::Classifier, Tensor::Output) => true,
            _ => false,
        }
    }

    /// Whether this site covers the input of matrix `t`.
    fn has_input(self, t: Tensor) -> bool {
        use LayerTensor as L;
        let group = |l: L| match l {
            L::K | L::V => L::Q,
            L::Up => L::Gate,
            other => other,
        };
        match (self, t) {
            (Site::Input(k), Tensor::Layer(_, l)) => group(l) == k,
            (Site::ClassifierInput, Tensor::TokenEmbedding | Tensor::Output) => true,
            _ => false,
        }
    }
}

/// Groups of sites left unquantized, each against every other site quantized: what keeping
/// matrices in f16 (their products then read unquantized inputs) would buy. The rows behind
/// `--weights i8f16` ([`ref_backend::I8F16_KEPT_AT_F16`]).
pub fn kept_in_float() -> Vec<(&'static str, Vec<Site>)> {
    use LayerTensor as L;
    let (v, down) = (Site::Weights(L::V), Site::Weights(L::Down));
    let down_in = Site::Input(L::Down);
    let classifier = [Site::Embedding, Site::ClassifierInput];
    vec![
        ("V", vec![v]),
        ("down (weights and input)", vec![down, down_in]),
        (
            "the embedding/classifier (weights and input)",
            classifier.to_vec(),
        ),
        ("V and down", vec![v, down, down_in]),
        (
            "V, down and the classifier",
            [v, down, down_in].into_iter().chain(classifier).collect(),
        ),
    ]
}

/// How every matrix's weights are quantized for [`rule_logits`]: QNN encodings HTP has for
/// FullyConnected weights, compared in the f32 forward before one is built into the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightRule {
    /// i8, one scale per output channel from its largest magnitude (the executor's today).
    Channel,
    /// i8, one scale per output channel, the clipping chosen per channel by least squared error.
    ChannelMse,
    /// i8, one float scale per block of `n` input channels (QNN's block encoding).
    Block(usize),
    /// i8, one float scale per output channel times a 4-bit integer per block of `n` input
    /// channels (QNN's blockwise expansion, AI Hub's "LPBQ").
    Lpbq(usize),
    /// 4 bits, one float scale per block of `n` input channels, symmetric: levels `-8..=7`
    /// times `max|w| / 7` (llama.cpp's Q4_0 grid; no QNN encoding).
    Sym4(usize),
    /// 4 bits, one float scale and one minimum per block of `n` input channels: levels `0..=15`
    /// times `(max - min) / 15` plus `min` (llama.cpp's Q4_1 grid, which Q4_K's sub-blocks
    /// approach; no QNN encoding).
    Asym4(usize),
    /// [`WeightRule::Asym4`] with the block's step on the LPBQ grid (a float scale per output
    /// channel times a 4-bit multiplier per block, rounded up so the block's range is covered)
    /// and the block's float minimum kept: what an HTP product plus a second product of the
    /// minimums by the input's block sums would compute.
    LpbqAsym4(usize),
}

impl std::str::FromStr for WeightRule {
    type Err = String;
    fn from_str(s: &str) -> Result<WeightRule, String> {
        let block = |t: &str| t.parse::<usize>().map_err(|e| format!("`{s}`: {e}"));
        match s.split_once(':') {
            None if s == "channel" => Ok(WeightRule::Channel),
            None if s == "channel-mse" => Ok(WeightRule::ChannelMse),
            Some(("block", n)) => Ok(WeightRule::Block(block(n)?)),
            Some(("lpbq", n)) => Ok(WeightRule::Lpbq(block(n)?)),
            Some(("sym4", n)) => Ok(WeightRule::Sym4(block(n)?)),
            Some(("asym4", n)) => Ok(WeightRule::Asym4(block(n)?)),
            Some(("lpbq-asym4", n)) => Ok(WeightRule::LpbqAsym4(block(n)?)),
            _ => Err(format!(
                "unknown weight rule `{s}` (channel, channel-mse, block:N, lpbq:N, sym4:N, asym4:N, \
                 lpbq-asym4:N)"
            )),
        }
    }
}

/// `x` rounded to the symmetric i8 grid of step `scale` (`[-127, 127]`).
fn round_i8(x: &mut [f32], scale: f32) {
    if scale > 0.0 {
        for v in x {
            *v = (*v / scale).round().clamp(-127.0, 127.0) * scale;
        }
    }
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The squared error of `x` rounded with step `scale`.
fn sq_err(x: &[f32], scale: f32) -> f64 {
    let mut y = x.to_vec();
    round_i8(&mut y, scale);
    x.iter()
        .zip(&y)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum()
}

/// One output channel's weights rounded by `rule`.
fn quantize_row(row: &mut [f32], rule: WeightRule) {
    match rule {
        WeightRule::Channel => round_i8(row, absmax(row) / 127.0),
        WeightRule::ChannelMse => {
            let full = absmax(row) / 127.0;
            let best = (50..=100)
                .map(|p| full * p as f32 / 100.0)
                .min_by(|&a, &b| sq_err(row, a).total_cmp(&sq_err(row, b)))
                .unwrap_or(full);
            round_i8(row, best);
        }
        WeightRule::Block(n) => {
            for b in row.chunks_mut(n) {
                round_i8(b, absmax(b) / 127.0);
            }
        }
        WeightRule::Lpbq(n) => {
            // Channel scale: the largest block reaches multiplier 15.
            let channel = absmax(row) / (127.0 * 15.0);
            for b in row.chunks_mut(n) {
                let k = (absmax(b) / (127.0 * channel)).ceil().clamp(1.0, 15.0);
                round_i8(b, channel * k);
            }
        }
        WeightRule::Sym4(n) => row.chunks_mut(n).for_each(|b| {
            let step = absmax(b) / 7.0;
            round_levels(b, (step, 0.0), (-8.0, 7.0));
        }),
        WeightRule::Asym4(n) => row.chunks_mut(n).for_each(|b| {
            let (lo, step) = asym4_grid(b);
            round_levels(b, (step, lo), (0.0, 15.0));
        }),
        WeightRule::LpbqAsym4(n) => {
            let channel = row
                .chunks(n)
                .map(|b| asym4_grid(b).1)
                .fold(0.0f32, f32::max)
                / 15.0;
            for b in row.chunks_mut(n) {
                let (lo, step) = asym4_grid(b);
                let k = (step / channel).ceil().clamp(1.0, 15.0);
                round_levels(b, (channel * k, lo), (0.0, 15.0));
            }
        }
    }
}

/// A block's asymmetric 4-bit grid: its minimum and `(max - min) / 15`.
fn asym4_grid(b: &[f32]) -> (f32, f32) {
    let lo = b.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let hi = b.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (lo, (hi - lo) / 15.0)
}

/// `x` rounded to the levels `q * step + base`, `q` an integer in `lo..=hi`.
fn round_levels(x: &mut [f32], (step, base): (f32, f32), (lo, hi): (f32, f32)) {
    if step > 0.0 {
        for v in x {
            *v = ((*v - base) / step).round().clamp(lo, hi) * step + base;
        }
    }
}

/// Every position's logits of `tokens` with every matrix's weights quantized by `rule` (the
/// embedding included; by the i8 rule under the 4-bit ones) and nothing else quantized.
pub fn rule_logits(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    q: &CompiledModel,
    rule: WeightRule,
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>, Error> {
    let mut replaced = HashMap::new();
    for (t, _) in q.matrix_products() {
        let cols = t.shape(c)[1];
        let mut data = w.tensor(t).ok_or("a matrix is missing")?.to_vec();
        // The 4-bit grids are for the layer matrices; the embedding keeps i8, as `i4` builds.
        let layer = matches!(t, Tensor::Layer(..));
        let rule = match rule {
            WeightRule::Sym4(_) | WeightRule::Asym4(_) | WeightRule::LpbqAsym4(_) if !layer => {
                WeightRule::Channel
            }
            r => r,
        };
        for row in data.chunks_exact_mut(cols) {
            quantize_row(row, rule);
        }
        replaced.insert(t, data);
    }
    run_overlay(c, w, q, replaced, (&[], 1.0), tokens)
}

/// The f32 kernels with the chosen inputs and K/V rounded to the executor's encodings; every
/// row's logits are kept.
struct FakeQuant<'a> {
    inner: FloatKernels<'a, Overlay<'a>>,
    inputs: &'a HashMap<Tensor, ScaleOffset>,
    kv: Option<(bool, bool, &'a CompiledModel)>,
    scratch: Vec<f32>,
    rows: Vec<Vec<f32>>,
    /// Matrix inputs rounded, and how many fell outside their encoding's range (clipped).
    clipped: (usize, usize),
    /// Rows of the pass, and the worst clipped input: how far past its range's end (as a
    /// multiple of it), at which row, in which matrix.
    inner_rows: usize,
    worst: (f32, usize, Tensor),
}

/// `x` rounded to the grid of `spec`.
fn round_to(x: &mut [f32], dtype: quant::DataType, so: ScaleOffset) {
    for v in x {
        *v = so.dequantize_i32(quantize_value(*v, dtype, so));
    }
}

impl FakeQuant<'_> {
    fn round_kv(&self, layer: usize, value: bool, rows: &mut [f32]) {
        let Some((k, v, q)) = self.kv else { return };
        if !(if value { v } else { k }) {
            return;
        }
        let d = self.inner.config.head_dim;
        let heads = self.inner.config.n_kv_heads;
        for row in rows.chunks_exact_mut(d * heads) {
            for (h, head) in row.chunks_exact_mut(d).enumerate() {
                let spec: &QuantSpec = q.kv_spec(layer, h, value).expect("a K/V encoding");
                if let quant::Encoding::PerTensor(so) = spec.encoding
                    && spec.dtype.integer_range().is_some()
                {
                    round_to(head, spec.dtype, so);
                }
            }
        }
    }
}

impl Kernels for FakeQuant<'_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        self.inner.embed(token, out);
    }

    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        match self.inputs.get(&w) {
            Some(&so) => {
                self.scratch.clear();
                self.scratch.extend_from_slice(x);
                if let Some((lo, hi)) = so.representable_range(quant::DataType::I16) {
                    let cols = x.len() / self.inner_rows.max(1);
                    for (i, &v) in x.iter().enumerate() {
                        if v < lo || v > hi {
                            self.clipped.0 += 1;
                            let reach = if v > hi { v / hi } else { v / lo };
                            if reach > self.worst.0 {
                                self.worst = (reach, i / cols.max(1), w);
                            }
                        }
                    }
                    self.clipped.1 += x.len();
                }
                round_to(&mut self.scratch, quant::DataType::I16, so);
                self.inner.linear(w, &self.scratch, out);
            }
            None => self.inner.linear(w, x, out),
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.inner.vector(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let (mut k, mut v) = (k.to_vec(), v.to_vec());
        self.round_kv(layer, false, &mut k);
        self.round_kv(layer, true, &mut v);
        self.inner.attention(layer, q, &k, &v, out);
    }

    fn logits(&mut self, _row: usize, logits: &[f32]) {
        self.rows.push(logits.to_vec());
    }
}

/// Every position's logits of `tokens` (one causal pass) with `sites` quantized as `q` does, the
/// matrix inputs' i16 ranges stretched `widen` times (1: as calibrated).
pub fn logits(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    q: &CompiledModel,
    (sites, widen): (&[Site], f32),
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>, Error> {
    let mut replaced = HashMap::new();
    for (t, _) in q.matrix_products() {
        let Some(m) = q
            .i8_matrix(t)
            .filter(|_| sites.iter().any(|s| s.has_weights(t)))
        else {
            continue;
        };
        let (rows, cols) = (t.shape(c)[0], t.shape(c)[1]);
        let mut data = vec![0.0; rows * cols];
        for (r, row) in data.chunks_exact_mut(cols).enumerate() {
            m.row_into(r, row);
        }
        replaced.insert(t, data);
    }
    run_overlay(c, w, q, replaced, (sites, widen), tokens)
}

/// `so`'s i16 range with both ends `widen` times as far from zero.
fn widened(so: ScaleOffset, widen: f32) -> Option<ScaleOffset> {
    let (lo, hi) = so.representable_range(quant::DataType::I16)?;
    let (dtype, sym) = (quant::DataType::I16, quant::Symmetry::Asymmetric);
    ScaleOffset::from_range(lo * widen, hi * widen, dtype, sym).ok()
}

/// Every position's logits of `tokens` over `w` with `replaced` matrices, the inputs and K/V of
/// `sites` rounded to `q`'s encodings.
fn run_overlay(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    q: &CompiledModel,
    replaced: HashMap<Tensor, Vec<f32>>,
    (sites, widen): (&[Site], f32),
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>, Error> {
    let inputs: HashMap<Tensor, ScaleOffset> = q
        .matrix_products()
        .into_iter()
        .filter(|(t, _)| sites.iter().any(|s| s.has_input(*t)))
        .filter_map(|(t, so)| Some((t, widened(so?, widen)?)))
        .collect();
    let (keys, values) = (sites.contains(&Site::Keys), sites.contains(&Site::Values));
    let overlay = Overlay::new(w, replaced);
    let rope = Rope::new(c.head_dim, &c.rope);
    let mut cache = FloatCache::new(c, tokens.len())?;
    let (mut scores, mut last) = (vec![0.0; tokens.len()], vec![0.0; c.vocab_size]);
    let mut transposed = Vec::new();
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let pass = Pass {
        layers: 0..c.n_layers,
        input: Input::Tokens(tokens),
        positions: Positions::Ids(&positions),
        output: Output::Logits,
    };
    let mut k = FakeQuant {
        inner: FloatKernels {
            config: c,
            weights: &overlay,
            cache: &mut cache,
            pos0: 0,
            scores: &mut scores,
            logits: &mut last,
            transposed: &mut transposed,
        },
        inputs: &inputs,
        kv: (keys || values).then_some((keys, values, q)),
        scratch: Vec::new(),
        rows: Vec::new(),
        clipped: (0, 0),
        inner_rows: tokens.len(),
        worst: (0.0, 0, Tensor::OutputNorm),
    };
    let mut acts = Activations::new(c, tokens.len());
    forward::run(c, &rope, &mut k, &mut acts, &pass, &mut NoTap)?;
    if k.clipped.0 > 0 {
        eprintln!(
            "  ({} of {} matrix inputs outside their calibrated range; the worst {:.2}x its end, at \
             position {} into {})",
            k.clipped.0, k.clipped.1, k.worst.0, k.worst.1, k.worst.2
        );
    }
    Ok(k.rows)
}

/// Top-1 agreement and mean KL of `got` against `want`, position by position.
pub fn score(want: &[Vec<f32>], got: &[Vec<f32>]) -> (f64, f64) {
    let (mut agree, mut kl) = (0usize, 0.0f64);
    for (w, g) in want.iter().zip(got) {
        agree += usize::from(argmax(w) == argmax(g));
        kl += kl_logits(w, g);
    }
    let n = want.len().max(1) as f64;
    (agree as f64 / n, kl / n)
}
