//! Rounding weights by the model's error instead of to nearest (GPTQ; issue #23).
//!
//! Rounding each weight of a row to its nearest grid value minimizes the weights' own error,
//! not the error of the row's output over the inputs the model sees. With `H = Σ x xᵀ` over the
//! calibration positions of the matrix product's input `x`, the output error of a row rounded
//! from `w` to `ŵ` is `Σ_x (x·(w - ŵ))² = zᵀ H z` with `z = w - ŵ`. With the Cholesky factor
//! `H = Rᵀ R` (`R` upper triangular) that is `|R z|²`, and rounding the columns from last to
//! first, each towards the value that zeroes its own term given the columns already rounded
//! (`ŵ_i ≈ w_i + Σ_{j>i} R_ij z_j / R_ii`, "nearest plane"), is GPTQ's sequential error
//! feedback. The columns are ordered so that those with the largest inputs (the largest
//! diagonal of `H`) are rounded first, while the most columns are left to compensate them
//! (GPTQ's "act order"). Only the integer values change: every grid (the row's scale, an LPBQ
//! block's multiplier) is fixed from the weights first, exactly as to-nearest rounding fixes it,
//! so the encodings, and what the HTP runs, are the same.
//!
//! `H` comes from calibration's float pass (the four matmul inputs of every layer; the down
//! projection's in the FFN smoothing's coordinates, `H_ij / (s_i s_j)`). It is damped by
//! [`GPTQ_DAMPING`] times its mean diagonal (a never-seen input channel gets a diagonal of 1),
//! so the factor exists. The embedding (the tied classifier) is rounded to nearest: measured,
//! rounding it by the classifier's inputs did not help. The arithmetic is one fixed order on
//! every CPU ([`crate::kernels::dot_f32`]), so a compile's file does not depend on the machine.

use rayon::prelude::*;

use crate::kernels::{add_scaled, dot_f32, dot_f64};

/// How integer weights are rounded onto their grids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Each value to its nearest grid value.
    Nearest,
    /// By the output error over calibration ([`mod@crate::gptq`]): the default.
    Gptq,
}

/// The damping added to the diagonal of `H`, as a fraction of its mean: 1, where GPTQ usually
/// adds 1%. Chosen by measured KL (README, "Rounding by the model's error"): the calibration's
/// ~1,300 positions are fewer than the down projection's 1,536 inputs, and weakly damped
/// rounding fits them at the cost of other text.
pub const GPTQ_DAMPING: f64 = 1.0;

/// `H = Σ x xᵀ` of one matrix product's input over the calibration positions: row-major
/// `n x n`, only the upper triangle (`j >= i`) kept.
#[derive(Debug, Clone)]
pub(crate) struct Gram {
    n: usize,
    h: Vec<f32>,
    /// Positions observed and not yet added ([`GRAM_BATCH`] at most).
    pending: Vec<f32>,
}

/// Positions added to a Gram matrix at once: each row of `H` is read once for all of them.
const GRAM_BATCH: usize = 64;

impl Gram {
    pub(crate) fn new(n: usize) -> Gram {
        Gram {
            n,
            h: vec![0.0; n * n],
            pending: Vec::with_capacity(n * GRAM_BATCH),
        }
    }

    /// Adds the positions of `x` (rows of `n` values); a row with a non-finite value is
    /// skipped.
    pub(crate) fn observe(&mut self, x: &[f32]) {
        let n = self.n.max(1);
        for row in x
            .chunks_exact(n)
            .filter(|r| r.iter().all(|v| v.is_finite()))
        {
            self.pending.extend_from_slice(row);
            if self.pending.len() >= GRAM_BATCH * n {
                self.flush();
            }
        }
    }

    /// Adds the pending positions to `H`.
    pub(crate) fn flush(&mut self) {
        let (n, pending) = (self.n, &self.pending);
        if pending.is_empty() {
            return;
        }
        self.h.par_chunks_mut(n).enumerate().for_each(|(i, h)| {
            for r in pending.chunks_exact(n) {
                add_scaled(&mut h[i..], r[i], &r[i..]);
            }
        });
        self.pending.clear();
    }

    /// The factor of `H` damped (after [`Gram::flush`]), for inputs divided per channel by `divisors` (the FFN
    /// smoothing: `H_ij / (d_i d_j)`); `None` if it is not positive definite even so.
    pub(crate) fn factor(&self, divisors: Option<&[f32]>) -> Option<Factor> {
        let n = self.n;
        let d = |i: usize| {
            divisors
                .and_then(|d| d.get(i))
                .map_or(1.0, |&v| f64::from(v))
        };
        let h = |i: usize, j: usize| {
            let (i, j) = (i.min(j), i.max(j));
            let v = f64::from(self.h[i * n + j]) / (d(i) * d(j));
            if i == j && v <= 0.0 { 1.0 } else { v }
        };
        // The columns with the largest inputs are rounded first (last in this order).
        let mut perm: Vec<usize> = (0..n).collect();
        perm.sort_by(|&a, &b| h(a, a).total_cmp(&h(b, b)));
        let mut a = vec![0.0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = h(perm[i], perm[j]);
            }
        }
        let mean = (0..n).map(|i| a[i * n + i]).sum::<f64>() / n.max(1) as f64;
        (0..n).for_each(|i| a[i * n + i] += GPTQ_DAMPING * mean);
        Factor::cholesky(a, n, perm)
    }
}

/// `R` with `H = Rᵀ R`, upper triangular, row-major, in f32.
#[derive(Debug, Clone)]
pub(crate) struct Factor {
    n: usize,
    r: Vec<f32>,
    /// Column `perm[k]` of the matrix is column `k` of `R`.
    perm: Vec<usize>,
}

impl Factor {
    /// Cholesky `a = L Lᵀ` in f64, column by column (each column's rows in parallel: row `i`
    /// of column `j` needs the first `j` values of rows `i` and `j`), stored as `R = Lᵀ`.
    fn cholesky(mut a: Vec<f64>, n: usize, perm: Vec<usize>) -> Option<Factor> {
        for j in 0..n {
            let (top, below) = a.split_at_mut((j + 1) * n);
            let lj = &mut top[j * n..];
            let d = lj[j] - dot_f64(&lj[..j], &lj[..j]);
            if d.is_nan() || d <= 0.0 {
                return None;
            }
            lj[j] = d.sqrt();
            let lj = &top[j * n..(j + 1) * n];
            below.par_chunks_mut(n).for_each(|li| {
                li[j] = (li[j] - dot_f64(&li[..j], &lj[..j])) / lj[j];
            });
        }
        let mut r = vec![0.0f32; n * n];
        for i in 0..n {
            for j in 0..=i {
                r[j * n + i] = a[i * n + j] as f32;
            }
        }
        Some(Factor { n, r, perm })
    }

    /// The columns of one row of `n` values.
    pub(crate) fn n(&self) -> usize {
        self.n
    }
}

/// One row's grid: column `c` may take `q * scale * mult[c / block]` for an integer `q` in
/// `lo..=hi`, stored as the i8 `q * mult[c / block]`.
#[derive(Debug, Clone)]
pub(crate) struct RowGrid {
    pub(crate) scale: f32,
    pub(crate) mult: Vec<f32>,
    pub(crate) block: usize,
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}

impl RowGrid {
    fn step(&self, c: usize) -> f32 {
        self.scale * self.mult[c / self.block.max(1)]
    }

    /// The integer `q` nearest to `v / step` in column `c`, clamped to `lo..=hi`.
    pub(crate) fn level(&self, c: usize, v: f32) -> f32 {
        (v / self.step(c)).round().clamp(self.lo, self.hi)
    }

    /// The stored i8 of level `q` in column `c`: `q` times its block's multiplier.
    pub(crate) fn code(&self, c: usize, q: f32) -> i8 {
        (q * self.mult[c / self.block.max(1)]) as i8
    }
}

/// Rows rounded together: each row of `R` is read once for all of them.
const ROWS_PER_TASK: usize = 16;

/// Rounds rows `w` (row-major, `grids.len()` rows of `f.n()` columns) onto their grids by the
/// nearest-plane order of the module docs; the stored i8 values. Every row is rounded on its
/// own: rounding them together only shares the reads of `R`.
pub(crate) fn round_block(w: &[f32], f: &Factor, grids: &[RowGrid]) -> Vec<i8> {
    let n = f.n;
    let mut z = vec![0.0f32; n * grids.len()];
    let mut out = vec![0i8; n * grids.len()];
    for k in (0..n).rev() {
        let (r, c) = (&f.r[k * n..(k + 1) * n], f.perm[k]);
        for (row, g) in grids.iter().enumerate() {
            let z = &mut z[row * n..(row + 1) * n];
            let w = w[row * n + c];
            let q = g.level(c, w + dot_f32(&r[k + 1..], &z[k + 1..]) / r[k]);
            z[k] = w - q * g.step(c);
            out[row * n + c] = g.code(c, q);
        }
    }
    out
}

/// [`round_block`] over blocks of [`ROWS_PER_TASK`] rows in parallel.
pub(crate) fn round_rows(w: &[f32], f: &Factor, grids: &[RowGrid]) -> Vec<i8> {
    let block = ROWS_PER_TASK * f.n.max(1);
    let blocks: Vec<Vec<i8>> = w
        .par_chunks(block)
        .zip(grids.par_chunks(ROWS_PER_TASK))
        .map(|(w, g)| round_block(w, f, g))
        .collect();
    blocks.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output error `Σ_x (x·(w - ŵ))²` of a row over inputs `xs`.
    fn output_error(xs: &[Vec<f32>], w: &[f32], q: &[i8], scale: f32) -> f64 {
        xs.iter()
            .map(|x| {
                let e: f64 = x
                    .iter()
                    .zip(w.iter().zip(q))
                    .map(|(&x, (&w, &q))| f64::from(x) * f64::from(w - f32::from(q) * scale))
                    .sum();
                e * e
            })
            .sum()
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn the_factor_reproduces_the_damped_gram_in_the_rounding_order() {
        let (n, mut seed) = (5, 7u64);
        let xs: Vec<f32> = (0..40).map(|_| lcg(&mut seed)).collect();
        let mut g = Gram::new(n);
        g.observe(&xs);
        g.flush();
        let f = g.factor(None).expect("positive definite");
        let mean = (0..n)
            .map(|i| xs.chunks(n).map(|x| f64::from(x[i] * x[i])).sum::<f64>())
            .sum::<f64>()
            / n as f64;
        for i in 0..n {
            for j in 0..n {
                let rtr: f64 = (0..n)
                    .map(|k| f64::from(f.r[k * n + i]) * f64::from(f.r[k * n + j]))
                    .sum();
                // R is in the rounding order: column k of R is column perm[k] of H.
                let (pi, pj) = (f.perm[i], f.perm[j]);
                let mut h: f64 = xs.chunks(n).map(|x| f64::from(x[pi] * x[pj])).sum();
                if i == j {
                    h += GPTQ_DAMPING * mean;
                }
                assert!(
                    (rtr - h).abs() < 1e-4 * (1.0 + h.abs()),
                    "({i},{j}): {rtr} vs {h}"
                );
            }
        }
    }

    #[test]
    fn rounding_by_the_output_error_beats_rounding_to_nearest_on_correlated_inputs() {
        // Inputs whose channels are correlated (a shared component), as activations are.
        let (n, mut seed) = (32, 3u64);
        let xs: Vec<Vec<f32>> = (0..256)
            .map(|_| {
                let common = lcg(&mut seed) * 4.0;
                (0..n).map(|_| common + lcg(&mut seed)).collect()
            })
            .collect();
        let mut g = Gram::new(n);
        g.observe(&xs.concat());
        g.flush();
        let f = g.factor(None).expect("positive definite");
        let (mut gptq, mut nearest) = (0.0, 0.0);
        for _ in 0..16 {
            let w: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let scale = 0.5 / 7.0;
            let grid = RowGrid {
                scale,
                mult: vec![1.0],
                block: n,
                lo: -8.0,
                hi: 7.0,
            };
            let near: Vec<i8> = w
                .iter()
                .map(|&v| (v / scale).round().clamp(-8.0, 7.0) as i8)
                .collect();
            gptq += output_error(
                &xs,
                &w,
                &round_block(&w, &f, std::slice::from_ref(&grid)),
                scale,
            );
            nearest += output_error(&xs, &w, &near, scale);
        }
        assert!(
            gptq < 0.5 * nearest,
            "GPTQ {gptq} against nearest {nearest}"
        );
    }

    #[test]
    fn without_correlation_or_feedback_it_rounds_to_nearest() {
        // H diagonal: no column's error can be compensated by another's.
        let n = 4;
        let mut g = Gram::new(n);
        g.observe(&[1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0]);
        g.flush();
        let f = g.factor(None).expect("positive definite");
        let w = [0.26, -0.74, 0.49, 1.9];
        let grid = RowGrid {
            scale: 0.5,
            mult: vec![1.0, 2.0],
            block: 2,
            lo: -8.0,
            hi: 7.0,
        };
        // Steps 0.5, 0.5, 1.0, 1.0: nearest levels 1, -1, 0, 2, stored times the multiplier.
        assert_eq!(
            round_block(&w, &f, std::slice::from_ref(&grid)),
            vec![1, -1, 0, 4]
        );
    }
}
