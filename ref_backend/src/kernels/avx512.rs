//! The AVX-512 micro-kernel: `vpmovsxbw` widens 32 i8 weights to i16 and VNNI's `vpdpwssd`
//! multiplies them with 32 i16 activations, adding adjacent products into 16 i32 lanes in one
//! instruction (the SSE4.1 kernel needs `pmaddwd` + `paddd` for 8 products).
//!
//! Picked at run time when the CPU has AVX512BW and AVX512-VNNI (Intel since Cascade Lake, AMD
//! since Zen 4). On this project's benchmark machine (a 2-core Xeon KVM guest with AVX-512 VNNI)
//! it multiplies a 128-token prefill's matrices about 3x faster than the SSE4.1 loop on one core
//! (`examples/kernel_bench.rs --tokens 128`, `i8_1t`).
//!
//! Prefetch: as the SSE4.1 kernel, one `prefetcht0` per 64-byte line of the next tile's rows,
//! on the first token's pass.
//!
//! Exactness: a lane adds two products per step and at most [`RUN`]` / 16` products per run
//! (256: at most `2^30` in magnitude even for the weight -128), so no lane overflows; a run's lanes are summed in i64, and so
//! are the runs. The result is the exact sum, like the portable kernel's. Runs this long (one
//! per dot product for SmolLM2's 576 and 1536 columns) keep the horizontal sums out of the
//! loop: with runs of `KERNEL_CHUNK` they cost about a third as much as the products.

use std::arch::x86_64::{
    __m256i, __m512i, _MM_HINT_T0, _mm_prefetch, _mm512_add_epi64, _mm512_castsi512_si256,
    _mm512_cvtepi8_epi16, _mm512_cvtepi32_epi64, _mm512_dpwssd_epi32, _mm512_extracti64x4_epi64,
    _mm512_reduce_add_epi64, _mm512_setzero_si512,
};

use super::ROW_TILE;

/// Weight bytes per cache line: the prefetch step.
const LINE: usize = 64;
const _: () = assert!(LINE.is_multiple_of(LANES));

/// Elements per vector step.
const LANES: usize = 32;

/// Elements summed in i32 lanes before they go to i64: each of the 16 lanes takes two products
/// per step, so a lane holds `RUN / 16` products.
const RUN: usize = 4096;
const _: () =
    assert!(RUN.is_multiple_of(LINE) && (RUN / 16) as i64 * 128 * 32768 <= i32::MAX as i64);

/// Exact dot products of [`ROW_TILE`] weight rows with `T` activation rows of equal length
/// (`out[t][r] = w[r] · act[t]`), as the SSE4.1 kernel's `dot_tile` (same contract, same
/// prefetching), 32 elements per step.
///
/// # Panics
/// If `T == 0`, the activation rows differ in length, or a weight row is shorter than them.
#[target_feature(enable = "avx512bw,avx512vnni")]
pub(super) fn dot_tile<const T: usize>(
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
        let mut sums = [[_mm512_setzero_si512(); ROW_TILE]; T];
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
                let wv = _mm512_cvtepi8_epi16(load_weights(&w[r][i..i + LANES]));
                for t in 0..T {
                    sums[t][r] = _mm512_dpwssd_epi32(sums[t][r], wv, av[t]);
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

/// The exact sum of 16 i32 lanes, in i64.
#[target_feature(enable = "avx512f")]
fn sum_lanes(v: __m512i) -> i64 {
    let lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
    let hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(v));
    _mm512_reduce_add_epi64(_mm512_add_epi64(lo, hi))
}

/// 32 i16 activations as one vector (an unaligned 64-byte load).
#[inline(always)]
fn load_acts(a: &[i16]) -> __m512i {
    let a: [i16; LANES] = a.try_into().expect("a whole vector step");
    bytemuck::cast(a)
}

/// 32 i8 weights as one 256-bit vector (an unaligned 32-byte load).
#[inline(always)]
fn load_weights(w: &[i8]) -> __m256i {
    let w: [i8; LANES] = w.try_into().expect("a whole vector step");
    bytemuck::cast(w)
}

// The plain loops of `quantize_i16`, `rescale`, `dot_f32`, `dot_f64` and `add_scaled` compiled
// with AVX-512: LLVM vectorizes the one rounding rule (eight f64 quotients per `vdivpd`,
// `vcvttpd2qq` for the truncation) and converts eight i64 sums at once (`vcvtqq2ps`).
super::vector_loops!("avx512f,avx512bw,avx512dq,avx512vl");
