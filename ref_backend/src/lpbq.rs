//! 4-bit weights on QNN's blockwise-expansion encoding ("LPBQ", what AI Hub ships W4A16 models
//! with): per row (output channel) a float scale, per block of [`LPBQ_BLOCK`] inputs a 4-bit
//! integer multiplier in `[1, 15]`, values in `[-8, 7]`. The executor stores each value times its
//! block's multiplier (at most 120 in magnitude, an exact i8) with the row's scale, so the i8
//! kernels multiply it unchanged; the HTP lowering recovers the multipliers
//! ([`crate::lpbq_multipliers`]) and writes the values and multipliers QNN reads.

use model::{LayerTensor, Tensor, WeightSource};
use quant::{QuantError, ScaleOffset};

use crate::error::CompileError;
use crate::gptq::RowGrid;
use crate::model::{I8Matrix, Matrix, finite_absmax};
use crate::types::WeightType;

/// Inputs per block of the 4-bit weights ([`WeightType::I4`]), chosen by measurement (README,
/// "Accuracy on SmolLM2").
pub const LPBQ_BLOCK: usize = 32;

/// Whether matrix `t` (of `cols` inputs) of a `weights` build is on the LPBQ grid: in an `i4`
/// build, every layer matrix but [`I4_KEPT_AT_8_BITS`], when its inputs are whole blocks (QNN's
/// blockwise expansion has whole blocks only). The rest keep the i8 grid: the embedding (also
/// the tied classifier), as AI Hub's W4A16 models keep their LM head at 8 bits and llama.cpp's
/// 4-bit types keep it at 6; V and down, as llama.cpp's Q4_K_M keeps them at 6 bits (measured
/// on SmolLM2: README, "4-bit weights").
pub fn is_lpbq(weights: WeightType, t: Tensor, cols: usize) -> bool {
    let four_bit_kind =
        |lt| crate::model::LayerData::MATRICES.contains(&lt) && !I4_KEPT_AT_8_BITS.contains(&lt);
    weights == WeightType::I4
        && cols.is_multiple_of(LPBQ_BLOCK)
        && matches!(t, Tensor::Layer(_, lt) if four_bit_kind(lt))
}

/// The layer matrices an `i4` build keeps on the i8 grid: the two whose 4-bit error costs the
/// model most (README, "4-bit weights": V alone 4-bit against 8-bit moves SmolLM2's mean KL by
/// 0.12, down by 0.21).
pub const I4_KEPT_AT_8_BITS: [LayerTensor; 2] = [LayerTensor::V, LayerTensor::Down];

/// The LPBQ grid of one row ([`quantize_lpbq`]): each block of `block` inputs gets the
/// scale `max|w| / 7`; the row's scale is the largest of them over 15 and each block's
/// multiplier is its scale over the row's, rounded into `[1, 15]`; values in `[-8, 7]`.
pub(crate) fn lpbq_grid(row: &[f32], block: usize) -> Result<RowGrid, QuantError> {
    let block = block.max(1);
    let blocks: Vec<f32> = row.chunks(block).map(|b| finite_absmax(b) / 7.0).collect();
    let top = blocks.iter().fold(0.0f32, |a, &b| a.max(b));
    let (scale, mult) = if top == 0.0 {
        (1.0, vec![1.0; blocks.len()])
    } else {
        let scale = top / 15.0;
        ScaleOffset::new(scale, 0)?;
        let mult = blocks.iter().map(|&b| (b / scale).round().clamp(1.0, 15.0));
        (scale, mult.collect())
    };
    Ok(RowGrid {
        scale,
        mult,
        block,
        lo: -8.0,
        hi: 7.0,
    })
}

/// One row of [`quantize_lpbq`]: the row's scale and the values times their block's
/// multiplier, each rounded to nearest.
pub(crate) fn lpbq_row(row: &[f32], block: usize) -> Result<(f32, Vec<i8>), QuantError> {
    let g = lpbq_grid(row, block)?;
    let out = row.iter().enumerate().map(|(c, &v)| {
        let v = if v.is_finite() { v } else { 0.0 };
        g.code(c, g.level(c, v))
    });
    Ok((g.scale, out.collect()))
}

/// Quantizes `w` to 4 bits with QNN's blockwise-expansion encoding ("LPBQ"): per row, each
/// block of `block` inputs gets the scale `max|w| / 7`; the row's scale is the largest of them
/// over 15, and each block's 4-bit multiplier `m` in `[1, 15]` is its scale over the row's,
/// rounded; values are `round(w / (row scale * m))` in `[-8, 7]`. The matrix holds `q * m` (at
/// most 120 in magnitude, an exact i8) with the row's scale, so `w = q * m * scale` is what
/// the i8 kernels multiply.
pub(crate) fn quantize_lpbq(
    w: &[f32],
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<Matrix, QuantError> {
    let mut scales = Vec::with_capacity(rows);
    let mut q = Vec::with_capacity(rows * cols);
    for row in w.chunks_exact(cols.max(1)).take(rows) {
        let (scale, values) = lpbq_row(row, block)?;
        scales.push(scale);
        q.extend(values);
    }
    Ok(Matrix::from_i8(rows, cols, scales, q))
}

/// The block multipliers of the stored matrix `m` of tensor `t` (of a `weights` build) when it
/// is on the LPBQ grid ([`is_lpbq`]): `cols / LPBQ_BLOCK` per row, row-major, recomputed from
/// `source`'s f32 values of `t` (the grid is a function of them; rounding by error changes only
/// the values) and checked against the stored values: each must be its block's multiplier times
/// a value in `[-8, 7]`. `Ok(None)` for a matrix on the i8 grid. Public as
/// [`crate::lpbq_multipliers`], which finds `m` in a compiled model.
pub(crate) fn matrix_multipliers(
    (m, weights): (Option<I8Matrix<'_>>, WeightType),
    t: Tensor,
    source: &dyn WeightSource,
) -> Result<Option<Vec<u8>>, CompileError> {
    let mismatch = |reason: String| CompileError::WeightsMismatch {
        tensor: t.to_string(),
        reason,
    };
    let m = m.ok_or_else(|| mismatch("the compiled model holds no integer matrix".into()))?;
    if !is_lpbq(weights, t, m.cols) {
        return Ok(None);
    }
    let w = source
        .tensor(t)
        .filter(|w| w.len() == m.rows * m.cols)
        .ok_or_else(|| {
            mismatch(format!(
                "the weights hold no {} x {} tensor",
                m.rows, m.cols
            ))
        })?;
    let mut out = Vec::with_capacity(m.rows * m.cols.div_ceil(LPBQ_BLOCK));
    for (r, (row, q)) in w
        .chunks_exact(m.cols)
        .zip(m.q.chunks_exact(m.cols))
        .enumerate()
    {
        let g = lpbq_grid(row, LPBQ_BLOCK).map_err(|source| CompileError::Quant {
            what: format!("the LPBQ grid of {t}, row {r}"),
            source,
        })?;
        if g.scale != m.scales[r] {
            return Err(mismatch(format!("row {r}'s scale is not its LPBQ grid's")));
        }
        check_levels(&g, q)
            .map_err(|c| mismatch(format!("row {r}, column {c} is off its grid")))?;
        out.extend(g.mult.iter().map(|&m| m as u8));
    }
    Ok(Some(out))
}

/// `Err(column)` of the first stored value that is not its block's multiplier times a level.
fn check_levels(g: &RowGrid, q: &[i8]) -> Result<(), usize> {
    q.iter().enumerate().try_for_each(|(c, &v)| {
        let level = f32::from(v) / g.mult[c / g.block];
        let ok = level.fract() == 0.0 && (g.lo..=g.hi).contains(&level);
        ok.then_some(()).ok_or(c)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Matrix;

    /// Deterministic xorshift values, uniform in [-0.5, 0.5).
    fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }
    }

    /// Every value is within half a step of its block's grid, unless it is the block's largest and
    /// the multiplier's rounding clipped it; the products fit an i8 and are multiples of the
    /// block's multiplier.
    #[test]
    fn rounding_by_error_keeps_each_lpbq_grid() {
        // Two rows of 64 with a quiet block, inputs with a shared component (correlated).
        let mut rand = uniform(0x9e37_79b9_7f4a_7c15);
        let w: Vec<f32> = (0..128)
            .map(|i| rand() * if (i % 64) / 32 == 1 { 0.1 } else { 1.0 })
            .collect();
        let mut gram = crate::gptq::Gram::new(64);
        for _ in 0..200 {
            let common = rand();
            let x: Vec<f32> = (0..64).map(|_| common + 0.3 * rand()).collect();
            gram.observe(&x);
        }
        gram.flush();
        let f = gram.factor(None).unwrap();
        let grid = |row: &[f32]| lpbq_grid(row, 32);
        let by_error = Matrix::quantize_by_error(&w, (2, 64), grid, &f).unwrap();
        let nearest = quantize_lpbq(&w, 2, 64, 32).unwrap();
        let (a, b) = (by_error.as_i8().unwrap(), nearest.as_i8().unwrap());
        assert_eq!(a.scales, b.scales);
        assert_ne!(a.q, b.q, "nothing was rounded differently");
        for (r, row) in w.chunks(64).enumerate() {
            let g = lpbq_grid(row, 32).unwrap();
            for (c, &v) in a.q[r * 64..(r + 1) * 64].iter().enumerate() {
                let m = g.mult[c / 32];
                let level = f32::from(v) / m;
                assert!(
                    level.fract() == 0.0 && (-8.0..=7.0).contains(&level),
                    "{r},{c}: {v}"
                );
            }
        }
    }

    #[test]
    fn lpbq_rows_stay_within_half_a_step() {
        let mut rand = uniform(0x1234_5678_9abc_def0);
        let row: Vec<f32> = (0..256)
            .map(|i| rand() * if i / 64 == 2 { 0.05 } else { 1.0 })
            .collect();
        let (scale, q) = lpbq_row(&row, 64).unwrap();
        let mut worst = 0.0f32;
        for (b, (wb, qb)) in row.chunks(64).zip(q.chunks(64)).enumerate() {
            let bmax = wb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let m = ((bmax / 7.0) / scale).round().clamp(1.0, 15.0);
            for (&w, &v) in wb.iter().zip(qb) {
                assert_eq!(f32::from(v) % m, 0.0, "block {b}");
                let err = (w - f32::from(v) * scale).abs();
                worst = worst.max(err / (bmax / 7.0));
            }
        }
        assert!(worst < 0.75, "worst error {worst} block steps");
    }
}
