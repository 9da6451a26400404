//! Float building blocks of the Llama forward pass, shared with the quantized executor.
//!
//! These are programmer-facing kernels: slice lengths are preconditions and a mismatch panics
//! (documented per function); they never see untrusted input directly.

/// RMSNorm epsilon used by llama2.c models.
pub const RMS_EPS: f32 = 1e-5;

/// RoPE base frequency used by llama2.c models.
pub const ROPE_THETA: f32 = 10000.0;

/// `out[j] = weight[j] * x[j] / sqrt(mean(x²) + 1e-5)`.
///
/// # Panics
/// If `out`, `x` and `weight` differ in length.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32]) {
    assert!(
        out.len() == x.len() && x.len() == weight.len(),
        "rmsnorm: out {} / x {} / weight {} lengths differ",
        out.len(),
        x.len(),
        weight.len()
    );
    if x.is_empty() {
        return;
    }
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + RMS_EPS;
    let inv = 1.0 / ss.sqrt();
    for ((o, &xv), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (inv * xv);
    }
}

/// In-place variant of [`rmsnorm`].
///
/// # Panics
/// If `x` and `weight` differ in length.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32]) {
    assert_eq!(x.len(), weight.len(), "rmsnorm_inplace: lengths differ");
    if x.is_empty() {
        return;
    }
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + RMS_EPS;
    let inv = 1.0 / ss.sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (inv * *v);
    }
}

/// Frequency of the RoPE pair starting at element `i` (even) within a head:
/// `1 / 10000^(i / head_dim)`, i.e. `1/10000^(2k/head_dim)` for pair `k`.
pub fn rope_frequency(i: usize, head_dim: usize) -> f32 {
    1.0 / ROPE_THETA.powf(i as f32 / head_dim as f32)
}

/// Rotates consecutive pairs `(v[2k], v[2k+1])` of every head in `vec` by angle
/// `pos · rope_frequency(2k mod head_dim, head_dim)` (llama2.c's RoPE layout, theta 10000).
/// `vec` holds one or more heads back to back (e.g. all query heads, or all KV heads).
///
/// # Panics
/// If `head_dim` is zero or odd, or `vec.len()` is not a multiple of `head_dim`.
pub fn rope_rotate(vec: &mut [f32], pos: usize, head_dim: usize) {
    assert!(
        head_dim > 0 && head_dim.is_multiple_of(2) && vec.len().is_multiple_of(head_dim),
        "rope_rotate: head_dim {head_dim} must be even and divide len {}",
        vec.len()
    );
    for head in vec.chunks_exact_mut(head_dim) {
        for (k, pair) in head.chunks_exact_mut(2).enumerate() {
            let angle = pos as f32 * rope_frequency(2 * k, head_dim);
            let (s, c) = angle.sin_cos();
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
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

/// Matrix-vector product with a row-major `(out.len(), x.len())` matrix:
/// `out[i] = Σ_j w[i·n + j] · x[j]`, `n = x.len()`.
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
    for (o, row) in out.iter_mut().zip(w.chunks_exact(n)) {
        *o = dot(row, x);
    }
}

/// SiLU (swish): `x · sigmoid(x) = x / (1 + e^-x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
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
mod tests {
    use super::*;

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn rmsnorm_matches_formula_in_f64() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [0.5f32, 1.0, 2.0, -1.0];
        let mut out = [0.0; 4];
        rmsnorm(&mut out, &x, &w);
        let ms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 4.0 + 1e-5;
        for i in 0..4 {
            let want = f64::from(w[i]) * f64::from(x[i]) / ms.sqrt();
            assert!(
                close(out[i], want as f32, 1e-6),
                "{i}: {} vs {want}",
                out[i]
            );
        }
        let mut y = x;
        rmsnorm_inplace(&mut y, &w);
        assert_eq!(y, out);
    }

    #[test]
    fn rope_is_identity_at_zero_and_rotates_pairs() {
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut v = orig.clone();
        rope_rotate(&mut v, 0, 8);
        assert_eq!(v, orig);
        let pos = 7;
        rope_rotate(&mut v, pos, 8);
        for head in 0..2 {
            for k in 0..4 {
                let i = head * 8 + 2 * k;
                let theta = pos as f64 / 10000f64.powf((2 * k) as f64 / 8.0);
                let (a, b) = (f64::from(orig[i]), f64::from(orig[i + 1]));
                let want0 = a * theta.cos() - b * theta.sin();
                let want1 = a * theta.sin() + b * theta.cos();
                assert!(close(v[i], want0 as f32, 1e-5), "{i}");
                assert!(close(v[i + 1], want1 as f32, 1e-5), "{i}");
            }
        }
        // The first pair of each head rotates by exactly `pos` radians (frequency 1).
        assert_eq!(rope_frequency(0, 8), 1.0);
    }

    #[test]
    fn softmax_normalizes_and_masks() {
        let mut x = [1.0f32, 2.0, 3.0];
        softmax(&mut x);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!(close(x[i], (e[i] / s) as f32, 1e-6));
        }
        let mut m = [f32::NEG_INFINITY, 5.0, f32::NEG_INFINITY];
        softmax(&mut m);
        assert_eq!(m, [0.0, 1.0, 0.0]);
        let mut all = [f32::NEG_INFINITY; 3];
        softmax(&mut all);
        assert_eq!(all, [0.0; 3]);
        let mut big = [1000.0f32, 1000.0];
        softmax(&mut big);
        assert_eq!(big, [0.5, 0.5]);
        softmax(&mut []);
    }

    #[test]
    fn matmul_matches_naive_f64() {
        let (rows, n) = (5, 19); // odd n exercises the remainder path
        let w: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x: Vec<f32> = (0..n).map(|i| (i as f32 - 9.0) / 3.0).collect();
        let mut out = vec![0.0; rows];
        matmul(&mut out, &x, &w);
        for r in 0..rows {
            let want: f64 = (0..n)
                .map(|j| f64::from(w[r * n + j]) * f64::from(x[j]))
                .sum();
            assert!(
                close(out[r], want as f32, 1e-5),
                "{r}: {} vs {want}",
                out[r]
            );
        }
    }

    #[test]
    fn silu_and_argmax() {
        assert_eq!(silu(0.0), 0.0);
        assert!(close(
            silu(1.0),
            (1.0 / (1.0 + (-1.0f64).exp())) as f32,
            1e-7
        ));
        assert!(close(
            silu(-3.0),
            (-3.0 / (1.0 + 3.0f64.exp())) as f32,
            1e-6
        ));
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 2.0]), 1);
        assert_eq!(argmax(&[]), 0);
    }
}
