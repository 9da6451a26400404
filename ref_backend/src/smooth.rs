//! SmoothQuant folded into the FFN of i8-weight models (issue #23).
//!
//! The down projection's input `x = silu(gate) * up` has a few channels far larger than the
//! rest, so its one static i16 scale per tensor leaves the others few levels. Channel `c` of
//! layer `l`'s down input is therefore divided by
//!
//! `s_c = max|x_c|^alpha / max|W_down[:, c]|^(1 - alpha)`
//!
//! (`max|x_c|` over the calibration pass): row `c` of `Up` is divided by `s_c` (its output, and
//! so `x_c`, is divided by it; `Up`'s per-row i8 scale absorbs the change) and column `c` of
//! `Down` is multiplied by it. In real arithmetic the model is unchanged; in f32 it is within
//! rounding. The fold is done on the f32 weights before the i8 quantization.
//!
//! **The down input's encoding from the same pass.** Calibration observes each channel's
//! `(min_c, max_c)` of the *unsmoothed* `x` (it runs the original float model). Since `s_c > 0`,
//! the smoothed channel `x_c / s_c` ranges over exactly `[min_c / s_c, max_c / s_c]`, so the
//! smoothed tensor's range is `[min_c(min_c / s_c), max_c(max_c / s_c)]`: no second float pass.
//! That range is then widened [`FfnSmoothing::margin`] times (both ends), because after
//! smoothing every channel sits near the range's ends and values beyond calibration's positions
//! (128 tokens per sequence; use goes to the context) would clip; the margin was chosen by
//! measured KL (README, "Where the i8 error comes from").

use std::collections::HashMap;

use model::{LayerTensor, LlamaConfig, Overlay, Tensor, WeightSource};

use crate::compiled::CompiledModel;
use crate::model::Matrix;
use crate::types::WeightType;

/// How the FFN's down input is smoothed: the migration strength and the range margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FfnSmoothing {
    /// Exponent `alpha` of `s_c = max|x_c|^alpha / max|W_down[:, c]|^(1 - alpha)`: 0 leaves the
    /// activation alone (only the weights' columns are equalized), 1 moves all of its range into
    /// the weights.
    pub alpha: f32,
    /// The smoothed input's calibrated range, both ends multiplied by this (>= 1).
    pub margin: f32,
}

/// The smoothing every i8-weight compile applies ([`crate::compile`]), chosen on SmolLM2-135M
/// by measured KL against the f32 model (README).
pub const FFN_SMOOTHING: FfnSmoothing = FfnSmoothing {
    alpha: 0.45,
    margin: 4.0,
};

/// Whether a compile with weights `wt` smooths the FFN: only i8 weights (W8A16), where the
/// down input's i16 resolution is what the fold buys and `Up`'s per-row scales absorb it.
pub(crate) fn applies(wt: WeightType) -> bool {
    wt == WeightType::I8
}

/// Per-channel `(min, max)` of the finite values of one layer's down input.
pub(crate) struct ChannelRanges {
    min: Vec<f32>,
    max: Vec<f32>,
}

impl ChannelRanges {
    pub(crate) fn new(width: usize) -> ChannelRanges {
        ChannelRanges {
            min: vec![f32::INFINITY; width],
            max: vec![f32::NEG_INFINITY; width],
        }
    }

    /// Observes one row (one position) of the down input.
    pub(crate) fn observe(&mut self, row: &[f32]) {
        let ranges = self.min.iter_mut().zip(self.max.iter_mut());
        for ((lo, hi), &v) in ranges.zip(row).filter(|(_, v)| v.is_finite()) {
            *lo = lo.min(v);
            *hi = hi.max(v);
        }
    }

    /// `max|x_c|` of channel `c` (0 when nothing finite was observed).
    fn absmax(&self, c: usize) -> f32 {
        if self.min[c] > self.max[c] {
            return 0.0;
        }
        self.min[c].abs().max(self.max[c].abs())
    }

    /// The smoothing factors of this layer: `s_c` as in the module docs, 1 for a channel that
    /// was never seen non-zero or whose `Down` column is zero (it contributes nothing), or
    /// where the factor is not a normal float. `down` is `Down` row-major `[dim, hidden]`.
    pub(crate) fn factors(&self, down: &[f32], alpha: f32) -> Vec<f32> {
        let hidden = self.min.len();
        let mut wmax = vec![0.0f32; hidden];
        for row in down.chunks_exact(hidden.max(1)) {
            for (m, v) in wmax.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
        (0..hidden)
            .map(|c| {
                let s = self.absmax(c).powf(alpha) / wmax[c].powf(1.0 - alpha);
                if s.is_normal() && s > 0.0 { s } else { 1.0 }
            })
            .collect()
    }

    /// The range of the smoothed values `x_c / s_c` over all channels, both ends multiplied by
    /// `margin`; `None` when nothing was observed.
    pub(crate) fn smoothed_range(&self, factors: &[f32], margin: f32) -> Option<(f32, f32)> {
        let mut out: Option<(f32, f32)> = None;
        for ((&lo, &hi), &s) in self.min.iter().zip(&self.max).zip(factors) {
            if lo > hi {
                continue;
            }
            let (a, b) = out.unwrap_or((lo / s, hi / s));
            out = Some((a.min(lo / s), b.max(hi / s)));
        }
        out.map(|(lo, hi)| (lo * margin, hi * margin))
    }
}

/// Folds `factors` into a copy of matrix `t` (row-major `[rows, cols]`): `Up`'s row `c` divided
/// by `factors[c]`, `Down`'s column `c` multiplied by it; `None` for every other matrix.
pub(crate) fn fold(t: LayerTensor, data: &[f32], cols: usize, factors: &[f32]) -> Option<Vec<f32>> {
    let mut out = data.to_vec();
    match t {
        LayerTensor::Up => {
            for (row, &s) in out.chunks_exact_mut(cols.max(1)).zip(factors) {
                row.iter_mut().for_each(|v| *v /= s);
            }
        }
        LayerTensor::Down => {
            for row in out.chunks_exact_mut(cols.max(1)) {
                row.iter_mut().zip(factors).for_each(|(v, &s)| *v *= s);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The smoothing factors `model` folded into each of its layers, recovered from its i8 `Up`
/// scales and the original f32 weights `base` it was compiled from: `s_c` is the scale row `c`
/// of the original `Up` quantizes to over the scale the model holds (exact up to f32
/// rounding, since dividing a row by `s_c` divides its largest magnitude by `s_c`). All ones
/// for a layer that was not smoothed or that `model` (a part) does not hold; empty when
/// `model`'s weights are not i8.
pub fn ffn_smoothing_factors(model: &CompiledModel, base: &dyn WeightSource) -> Vec<Vec<f32>> {
    let c = model.config();
    if !applies(model.options().weights) {
        return Vec::new();
    }
    (0..c.n_layers)
        .map(|l| layer_factors(c, model, base, l).unwrap_or_else(|| vec![1.0; c.hidden_dim]))
        .collect()
}

fn layer_factors(
    c: &LlamaConfig,
    model: &CompiledModel,
    base: &dyn WeightSource,
    l: usize,
) -> Option<Vec<f32>> {
    let t = Tensor::Layer(l, LayerTensor::Up);
    let held = model.i8_matrix(t)?;
    let original = Matrix::quantize_i8(base.tensor(t)?, c.hidden_dim, c.dim).ok()?;
    let original = original.as_i8()?;
    let ratio = |(&a, &b): (&f32, &f32)| if b > 0.0 { a / b } else { 1.0 };
    Some(original.scales.iter().zip(held.scales).map(ratio).collect())
}

/// The f32 weights a compiled i8 model was quantized from: `base` with each layer's `Up` and
/// `Down` smoothed by the factors the model holds ([`ffn_smoothing_factors`]); everything else
/// is `base`'s (all of it when `model` has no fold). What a consumer that runs the float model
/// beside the compiled one needs (the HTP lowering observes its matrix products' output ranges
/// on these: `Up`'s change with the fold).
pub fn smoothed_weights<'a>(model: &CompiledModel, base: &'a dyn WeightSource) -> Overlay<'a> {
    let c = model.config();
    let mut replaced = HashMap::new();
    for (l, factors) in ffn_smoothing_factors(model, base).iter().enumerate() {
        for lt in [LayerTensor::Up, LayerTensor::Down] {
            let t = Tensor::Layer(l, lt);
            let cols = t.shape(c)[1];
            if let Some(data) = base.tensor(t).and_then(|d| fold(lt, d, cols, factors)) {
                replaced.insert(t, data);
            }
        }
    }
    Overlay::new(base, replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_follow_the_formula_and_guard_dead_channels() {
        let mut r = ChannelRanges::new(3);
        r.observe(&[4.0, -0.5, 0.0]);
        r.observe(&[-9.0, 0.25, 0.0]);
        // Down [2, 3]: column maxima 1, 0.25, 2.
        let down = [1.0, -0.25, 2.0, -0.5, 0.1, 0.0];
        let s = r.factors(&down, 0.5);
        assert_eq!(s[0], 3.0); // sqrt(9) / sqrt(1)
        assert!((s[1] - 2.0f32.sqrt()).abs() < 1e-6); // sqrt(0.5) / sqrt(0.25)
        assert_eq!(s[2], 1.0); // never non-zero
        let (lo, hi) = r.smoothed_range(&s, 2.0).expect("observed");
        assert_eq!((lo, hi), (-6.0, 2.0 * 4.0 / 3.0));
    }

    #[test]
    fn folding_up_and_down_leaves_the_product_unchanged() {
        // x = Up h (hidden 2, dim 2), y = Down x (dim 2, hidden 2).
        let up = [1.0, 2.0, -3.0, 0.5];
        let down = [0.5, -1.0, 2.0, 0.25];
        let s = [4.0, 0.5];
        let (up2, down2) = (
            fold(LayerTensor::Up, &up, 2, &s).expect("up"),
            fold(LayerTensor::Down, &down, 2, &s).expect("down"),
        );
        let h = [0.3, -0.7];
        let mv = |m: &[f32], v: &[f32]| -> Vec<f32> {
            m.chunks(2).map(|r| r[0] * v[0] + r[1] * v[1]).collect()
        };
        let (want, got) = (mv(&down, &mv(&up, &h)), mv(&down2, &mv(&up2, &h)));
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() < 1e-6, "{want:?} {got:?}");
        }
        assert!(fold(LayerTensor::Gate, &up, 2, &s).is_none());
    }
}
