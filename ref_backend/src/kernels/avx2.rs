//! The AVX2 micro-kernels: `vpmovsxbw` widens 16 i8 weights to i16, and either AVX2's
//! `vpmaddwd` + `vpaddd` (`dot_tile`) or AVX-VNNI's 256-bit `vpdpwssd` (`dot_tile_vnni`, one
//! instruction) multiplies them with 16 i16 activations, adding adjacent products into 8 i32
//! lanes: twice the SSE4.1 kernel's width (`kernels/x86.rs`).
//!
//! Picked at run time on CPUs with AVX2 and no AVX-512 VNNI (Intel since Haswell, AMD since
//! Zen 2 without the 128-bit split of Zen 1; AVX-VNNI on Intel since Alder Lake, AMD since
//! Zen 4), or forced with `HTPKV_ISA=avx2` / `HTPKV_ISA=avxvnni` (see [`super::Isa`]).
//!
//! Prefetch: as the SSE4.1 kernel, one `prefetcht0` per 64-byte line of the next tile's rows,
//! on the first token's pass.
//!
//! Exactness: a lane adds two products per step and [`RUN`]` / 8 = 256` products per run: at
//! most `256 * 128 * 32768 = 2^30` in magnitude even for the weight -128 (which the matrices
//! never hold), so no lane overflows; a run's lanes are summed in i64, and so are the runs. The
//! result is the exact sum, like the portable kernel's.

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _MM_HINT_T0, _mm_prefetch, _mm256_add_epi32, _mm256_add_epi64,
    _mm256_add_ps, _mm256_castsi256_si128, _mm256_cvtepi8_epi16, _mm256_cvtepi32_epi64,
    _mm256_cvtph_ps, _mm256_dpwssd_avx_epi32, _mm256_extracti128_si256, _mm256_madd_epi16,
    _mm256_mul_ps, _mm256_setzero_ps, _mm256_setzero_si256,
};

use super::ROW_TILE;

/// Weight bytes per cache line: the prefetch step.
const LINE: usize = 64;
const _: () = assert!(LINE.is_multiple_of(LANES));

/// Elements per vector step.
const LANES: usize = 16;

/// Elements summed in i32 lanes before they go to i64 (one run per dot product up to 2048
/// columns: SmolLM2's 576 and 1536 included).
const RUN: usize = 2048;
const _: () =
    assert!(RUN.is_multiple_of(LINE) && (RUN / 8) as i64 * 128 * 32768 <= i32::MAX as i64);

/// `acc + w · a` by adjacent pairs with AVX2: `vpmaddwd` then `vpaddd`.
#[target_feature(enable = "avx2")]
fn madd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
}

/// `acc + w · a` by adjacent pairs with AVX-VNNI's `vpdpwssd` (no saturation: the same sums).
#[target_feature(enable = "avx2,avxvnni")]
fn madd_vnni(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    _mm256_dpwssd_avx_epi32(acc, w, a)
}

/// The tile loop, once per multiply-add: `$name` with the target features `$features`.
macro_rules! dot_tile_with {
    ($(#[$doc:meta])* $name:ident, $features:literal, $madd:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name<const T: usize>(
            w: [&[i8]; ROW_TILE],
            act: [&[i16]; T],
            prefetch: bool,
        ) -> [[i64; ROW_TILE]; T] {
            let len = act[0].len();
            assert!(act.iter().all(|a| a.len() == len), "activation rows differ");
            let body = len / LANES * LANES;
            // Row r of the next tile starts ROW_TILE rows after row r of this one.
            let ahead = ROW_TILE * len;
            let mut acc = [[0i64; ROW_TILE]; T];
            let mut start = 0;
            while start < body {
                let end = (start + RUN).min(body);
                let mut sums = [[_mm256_setzero_si256(); ROW_TILE]; T];
                let mut i = start;
                while i < end {
                    if prefetch && i % LINE == 0 {
                        for row in w {
                            // Prefetching never faults, so the address may lie past the matrix.
                            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(i + ahead));
                        }
                    }
                    let av = act.map(|a| load_acts(&a[i..i + LANES]));
                    for r in 0..ROW_TILE {
                        let wv = _mm256_cvtepi8_epi16(load_weights(&w[r][i..i + LANES]));
                        for t in 0..T {
                            sums[t][r] = $madd(sums[t][r], wv, av[t]);
                        }
                    }
                    i += LANES;
                }
                for t in 0..T {
                    for r in 0..ROW_TILE {
                        acc[t][r] += sum_lanes(sums[t][r]);
                    }
                }
                start = end;
            }
            for t in 0..T {
                for r in 0..ROW_TILE {
                    acc[t][r] += super::dot1(&w[r][body..len], &act[t][body..]);
                }
            }
            acc
        }
    };
}

dot_tile_with!(
    /// Exact dot products of [`ROW_TILE`] weight rows with `T` activation rows of equal length
    /// (`out[t][r] = w[r] · act[t]`), as the SSE4.1 kernel's `dot_tile` (same contract, same
    /// prefetching), 16 elements per step with `vpmaddwd`.
    ///
    /// # Panics
    /// If `T == 0`, the activation rows differ in length, or a weight row is shorter than them.
    dot_tile,
    "avx2",
    madd
);

dot_tile_with!(
    /// [`dot_tile`] with AVX-VNNI's `vpdpwssd` for the multiply-add: the same sums.
    ///
    /// # Panics
    /// As [`dot_tile`].
    dot_tile_vnni,
    "avx2,avxvnni",
    madd_vnni
);

/// The exact sum of 8 i32 lanes, in i64.
#[target_feature(enable = "avx2")]
fn sum_lanes(v: __m256i) -> i64 {
    let lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    let hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(v));
    let s: [i64; 4] = bytemuck::cast(_mm256_add_epi64(lo, hi));
    s.iter().sum()
}

/// 16 i16 activations as one vector (an unaligned 32-byte load).
#[inline(always)]
fn load_acts(a: &[i16]) -> __m256i {
    let a: [i16; LANES] = a.try_into().expect("a whole vector step");
    bytemuck::cast(a)
}

/// 16 i8 weights as one 128-bit vector (an unaligned 16-byte load).
#[inline(always)]
fn load_weights(w: &[i8]) -> __m128i {
    let w: [i8; LANES] = w.try_into().expect("a whole vector step");
    bytemuck::cast(w)
}

// The plain loops of `quantize_i16`, `rescale`, `dot_f32`, `dot_f64` and `add_scaled` compiled
// with AVX2 (Rust never fuses a multiply and an add, so FMA changes no value).
super::vector_loops!("avx2,fma,f16c");

/// [`super::dot_f16`] with F16C: eight weights widened per `vcvtph2ps`, then a multiply and an
/// add per lane (not fused), the lanes and the tail added as the plain loop adds them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f16(w: &[super::F16Le], x: &[f32]) -> f32 {
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    let mut acc = _mm256_setzero_ps();
    for (a, b) in wc.zip(xc) {
        // Eight weights' little-endian bytes: the lanes' u16 bits on this (x86) host.
        let bits = <[u8; 16]>::try_from(a.as_flattened()).expect("eight weights");
        let wv = _mm256_cvtph_ps(bytemuck::cast(bits));
        let xv: __m256 = bytemuck::cast(<[f32; 8]>::try_from(b).expect("eight inputs"));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wv, xv));
    }
    super::f16_tail(super::lanes_sum(bytemuck::cast(acc)), wr, xr)
}
