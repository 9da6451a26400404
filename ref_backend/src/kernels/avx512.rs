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
//! Exactness: a lane adds `KERNEL_CHUNK / 16` products per run (32, far below [`I32_CHUNK`]),
//! and a run's 16 lanes together hold `KERNEL_CHUNK <= I32_CHUNK` products, so their sum is
//! also an exact i32; runs are summed in i64. The result is the exact sum, like the portable
//! kernel's.
//!
//! [`I32_CHUNK`]: super::I32_CHUNK

use std::arch::x86_64::{
    __m256i, __m512i, _MM_HINT_T0, _mm_prefetch, _mm512_cvtepi8_epi16, _mm512_dpwssd_epi32,
    _mm512_reduce_add_epi32, _mm512_setzero_si512,
};

use super::{KERNEL_CHUNK, ROW_TILE};

/// Weight bytes per cache line: the prefetch step.
const LINE: usize = 64;
const _: () = assert!(LINE.is_multiple_of(LANES));

/// Elements per vector step.
const LANES: usize = 32;
const _: () = assert!(KERNEL_CHUNK.is_multiple_of(LANES));

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
        let end = (start + KERNEL_CHUNK).min(body);
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
                acc[t][r] += i64::from(_mm512_reduce_add_epi32(sums[t][r]));
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
