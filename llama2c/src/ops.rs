//! Float building blocks of the Llama forward pass with llama2.c's constants. The kernels live
//! in [`model::ops`]; this module re-exports them and fixes RMSNorm's epsilon and RoPE's theta
//! and pair layout to llama2.c's for the callers written against them.

pub use ::model::ops::{PARALLEL_MIN_MACS, argmax, dot, matmul, silu, softmax};
use ::model::ops::{Rope, rope_frequency as frequency};
use ::model::{RopeConfig, RopePairing};

/// RMSNorm epsilon used by llama2.c models.
pub const RMS_EPS: f32 = 1e-5;

/// RoPE base frequency used by llama2.c models.
pub const ROPE_THETA: f32 = 10000.0;

/// `out[j] = weight[j] * x[j] / sqrt(mean(x²) + 1e-5)`.
///
/// # Panics
/// If `out`, `x` and `weight` differ in length.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32]) {
    ::model::ops::rmsnorm(out, x, weight, RMS_EPS);
}

/// In-place variant of [`rmsnorm`].
///
/// # Panics
/// If `x` and `weight` differ in length.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32]) {
    ::model::ops::rmsnorm_inplace(x, weight, RMS_EPS);
}

/// Frequency of the RoPE pair starting at element `i` (even) within a head:
/// `1 / 10000^(i / head_dim)`, i.e. `1/10000^(2k/head_dim)` for pair `k`.
pub fn rope_frequency(i: usize, head_dim: usize) -> f32 {
    frequency(ROPE_THETA, i / 2, head_dim)
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
    let cfg = RopeConfig {
        theta: ROPE_THETA,
        scaling: None,
        pairing: RopePairing::Adjacent,
    };
    Rope::new(head_dim, &cfg).rotate(vec, pos);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotate_equals_the_general_rope_with_llama2c_constants() {
        let cfg = ::model::RopeConfig {
            theta: ROPE_THETA,
            scaling: None,
            pairing: RopePairing::Adjacent,
        };
        let rope = ::model::ops::Rope::new(8, &cfg);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let (mut a, mut b) = (orig.clone(), orig);
        rope_rotate(&mut a, 7, 8);
        rope.rotate(&mut b, 7);
        assert_eq!(a, b);
        assert_eq!(rope_frequency(0, 8), 1.0);
        assert_eq!(rope_frequency(2, 8), rope.frequencies()[1]);
    }

    #[test]
    fn rmsnorm_uses_llama2c_epsilon() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [0.5f32, 1.0, 2.0, -1.0];
        let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
        rmsnorm(&mut a, &x, &w);
        ::model::ops::rmsnorm(&mut b, &x, &w, 1e-5);
        assert_eq!(a, b);
    }
}
