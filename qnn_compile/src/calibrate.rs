//! The ranges of the matrix products' outputs, observed on the one forward (`model::forward::run`
//! with the f32 kernels): HTP's W8A16 `FullyConnected` writes u16, so each product needs an
//! output encoding (the reference executor's products keep f32 and need none).

use std::collections::HashMap;

use model::forward::Positions;
use model::forward::{self, Activations, FloatCache, FloatKernels, Input, Kernels, Output, Pass};
use model::ops::Rope;
use model::{Error, LlamaConfig, NoTap, Tensor, WeightSource};

/// The observed `(min, max)` of each matrix product's output, keyed by its weight tensor.
pub type Ranges = HashMap<Tensor, (f32, f32)>;

/// The f32 kernels, recording the range of every `linear` output.
struct Observed<'a, W: ?Sized> {
    inner: FloatKernels<'a, W>,
    ranges: &'a mut Ranges,
}

impl<W: WeightSource + ?Sized> Kernels for Observed<'_, W> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        self.inner.embed(token, out);
    }

    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        self.inner.linear(w, x, out);
        let r = self.ranges.entry(w).or_insert((f32::MAX, f32::MIN));
        for &v in out.iter().filter(|v| v.is_finite()) {
            *r = (r.0.min(v), r.1.max(v));
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.inner.vector(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        self.inner.attention(layer, q, k, v, out);
    }

    fn logits(&mut self, row: usize, logits: &[f32]) {
        self.inner.logits(row, logits);
    }
}

/// Runs each of `sequences` (token ids, each at most `context` long and at most the model's
/// context) through the f32 forward as one causal pass from position 0 and returns the range of
/// every matrix product's output. Errors: those of [`forward::run`] (a token out of range).
pub fn linear_ranges(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    sequences: &[Vec<u32>],
    context: usize,
) -> Result<Ranges, Error> {
    let rope = Rope::new(c.head_dim, &c.rope);
    let mut cache = FloatCache::new(c, context)?;
    let (mut scores, mut logits) = (vec![0.0; context], vec![0.0; c.vocab_size]);
    let mut transposed = Vec::new();
    let mut ranges = Ranges::new();
    for seq in sequences.iter().filter(|s| !s.is_empty()) {
        let seq = &seq[..seq.len().min(context)];
        let positions: Vec<usize> = (0..seq.len()).collect();
        let pass = Pass {
            layers: 0..c.n_layers,
            input: Input::Tokens(seq),
            positions: Positions::Ids(&positions),
            output: Output::Logits,
        };
        let mut k = Observed {
            inner: FloatKernels {
                config: c,
                weights: w,
                cache: &mut cache,
                pos0: 0,
                scores: &mut scores,
                logits: &mut logits,
                transposed: &mut transposed,
            },
            ranges: &mut ranges,
        };
        let mut acts = Activations::new(c, seq.len());
        forward::run(c, &rope, &mut k, &mut acts, &pass, &mut NoTap)?;
    }
    Ok(ranges)
}
