//! The x86-64 micro-kernel: SSE4.1 `pmovsxbw` widens 8 i8 weights to i16 and `pmaddwd`
//! multiplies them with 8 i16 activations, adding adjacent products into 4 i32 lanes.
//!
//! The fallback for CPUs without AVX2 (`kernels/avx2.rs`) or AVX-512 VNNI (`kernels/avx512.rs`).
//! (On AMD Zen 1, which executes every 256-bit operation as two 128-bit halves, this loop ran
//! 1.3-1.4x faster than the same loop on AVX2 registers: force it there with
//! `HTPKV_ISA=sse41`.) LLVM does not form `pmaddwd`
//! from the portable loop (it widens both operands to i32 and multiplies with `pmulld`), which
//! is why this loop is written with intrinsics.
//!
//! Prefetch: a decode step streams every weight from DRAM once, and the hardware prefetchers
//! alone kept one core at about 4 GB/s on the 28 MB classifier; one software prefetch per line,
//! a tile ahead, took it to about 7 GB/s (12 GB/s on two threads) and SmolLM2's decode from 46
//! to 68 tokens/s (`examples/kernel_bench.rs`, `examples/decode_bench.rs`, same machine).
//! Prefetches change no result.
//!
//! Exactness: a lane adds `KERNEL_CHUNK / 4` products per run (fewer than [`I32_CHUNK`], so
//! no partial sum overflows), and the lanes are summed in i64: the result is the exact sum,
//! like the portable kernel's.
//!
//! [`I32_CHUNK`]: super::I32_CHUNK

use std::arch::x86_64::{
    __m128i, _MM_HINT_T0, _mm_add_epi32, _mm_cvtepi8_epi16, _mm_cvtsi64_si128, _mm_madd_epi16,
    _mm_prefetch, _mm_setzero_si128,
};

use super::{KERNEL_CHUNK, ROW_TILE};

/// Weight bytes per cache line: the prefetch step.
const LINE: usize = 64;
const _: () = assert!(LINE.is_multiple_of(LANES));

/// Elements per vector step.
const LANES: usize = 8;
const _: () = assert!(KERNEL_CHUNK.is_multiple_of(LANES));

/// Exact dot products of [`ROW_TILE`] weight rows with `T` activation rows of equal length
/// (`out[t][r] = w[r] · act[t]`): each activation load feeds every row, and each weight load
/// every activation row.
///
/// With `prefetch`, the rows are taken as one tile of a row-major matrix (`w[r]` starts
/// `r * len` bytes after `w[0]`) and the next tile's bytes are prefetched into L1 as this
/// tile's are read: one `prefetcht0` per 64-byte line, one tile ahead.
///
/// # Panics
/// If `T == 0`, the activation rows differ in length, or a weight row is shorter than them.
#[target_feature(enable = "sse4.1")]
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
        let mut sums = [[_mm_setzero_si128(); ROW_TILE]; T];
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
                let wv = _mm_cvtepi8_epi16(load_weights(&w[r][i..i + LANES]));
                for t in 0..T {
                    sums[t][r] = _mm_add_epi32(sums[t][r], _mm_madd_epi16(wv, av[t]));
                }
            }
            i += LANES;
        }
        for t in 0..T {
            for r in 0..ROW_TILE {
                let lanes: [i32; 4] = bytemuck::cast(sums[t][r]);
                for lane in lanes {
                    acc[t][r] += i64::from(lane);
                }
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

/// 8 i16 activations as one vector (an unaligned 16-byte load).
#[inline(always)]
fn load_acts(a: &[i16]) -> __m128i {
    let a: [i16; LANES] = a.try_into().expect("a whole vector step");
    bytemuck::cast(a)
}

/// 8 i8 weights in the low half of a vector (a 64-bit load).
#[target_feature(enable = "sse4.1")]
fn load_weights(w: &[i8]) -> __m128i {
    let w: [i8; LANES] = w.try_into().expect("a whole vector step");
    _mm_cvtsi64_si128(bytemuck::cast(w))
}
