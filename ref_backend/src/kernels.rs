//! Integer kernels of the W8A16 matmuls: i8 weights × i16 activations, exact integer sums.
//! Public for benchmarks (`examples/kernel_bench.rs`); the executor calls them through its
//! weight matrices.
//!
//! # Arithmetic
//! Every dot product is summed exactly: products are accumulated in i32 over runs of at most
//! [`KERNEL_CHUNK`] elements (`<=` [`I32_CHUNK`], the longest run that provably fits an i32, so
//! no partial sum of any subset of a run can overflow either), and the runs are summed in i64.
//! Integer addition is associative, so any summation order, vector width or thread split gives
//! the same i64: results are bit-identical to the plain scalar loop on every machine.
//!
//! # Speed
//! The inner loops are plain Rust that LLVM turns into `pmaddwd` (SSE2) / `vpmaddwd` (AVX2).
//! The default x86_64 target has no `pmovsxbw` (SSE4.1), and without it LLVM widens i8 weights
//! so badly that the loop runs about 10x slower, so the entry points are compiled several
//! times by [`multiversion`] (AVX2+FMA, SSE4.1, baseline) and the best one for the running CPU
//! is picked once at run time. No `-C target-cpu` flag is needed for speed or correctness.
//!
//! Matrices are split by output rows over rayon's pool (one thread per core); a row's sum does
//! not depend on which thread computes it, so neither does the result. Rows are processed four
//! at a time so one activation load feeds four weight rows; for several tokens (prefill) every
//! weight row is read from memory once per call, not once per token.

use multiversion::multiversion;
use rayon::prelude::*;

pub use crate::model::I32_CHUNK;

/// Elements summed in one i32 run: the largest multiple of 64 (a whole number of vector
/// iterations at any width) not above [`I32_CHUNK`].
pub const KERNEL_CHUNK: usize = I32_CHUNK / 64 * 64;
const _: () = assert!(KERNEL_CHUNK > 0 && KERNEL_CHUNK <= I32_CHUNK);

/// Below this many multiply-adds a matrix runs on the calling thread (handing rows to other
/// threads would cost more than it saves).
pub const PARALLEL_MIN_MACS: usize = 1 << 15;

/// Rows computed together by the micro-kernel.
const ROW_TILE: usize = 4;

/// i64 sums buffered on the stack per block of rows x tokens.
const SUMS: usize = 1024;

/// Exact `Σ w[i] · a[i]` over equal-length slices.
#[inline(always)]
fn dot1(w: &[i8], a: &[i16]) -> i64 {
    let mut acc = 0i64;
    for (wc, ac) in w.chunks(KERNEL_CHUNK).zip(a.chunks(KERNEL_CHUNK)) {
        let s: i32 = wc
            .iter()
            .zip(ac)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        acc += i64::from(s);
    }
    acc
}

/// Exact dot products of four weight rows with one activation row (one load of `a` per
/// element feeds four products).
#[inline(always)]
fn dot4(w: [&[i8]; ROW_TILE], a: &[i16]) -> [i64; ROW_TILE] {
    let mut acc = [0i64; ROW_TILE];
    let mut start = 0;
    while start < a.len() {
        let end = (start + KERNEL_CHUNK).min(a.len());
        let ac = &a[start..end];
        let (w0, w1, w2, w3) = (
            &w[0][start..end],
            &w[1][start..end],
            &w[2][start..end],
            &w[3][start..end],
        );
        let mut s = [0i32; ROW_TILE];
        for i in 0..ac.len() {
            let y = i32::from(ac[i]);
            s[0] += i32::from(w0[i]) * y;
            s[1] += i32::from(w1[i]) * y;
            s[2] += i32::from(w2[i]) * y;
            s[3] += i32::from(w3[i]) * y;
        }
        for (a, s) in acc.iter_mut().zip(s) {
            *a += i64::from(s);
        }
        start = end;
    }
    acc
}

/// `out[r * n + t] = Σ_c w[r * cols + c] · a[t * cols + c]` for every row `r` of `w` and token
/// `t` of `a` (`n = a.len() / cols`), exactly, on the calling thread.
#[multiversion(targets("x86_64+avx2+fma", "x86_64+sse4.1", "aarch64+neon"))]
fn dots_block(w: &[i8], a: &[i16], cols: usize, out: &mut [i64]) {
    let n = a.len() / cols;
    let mut tiles = w.chunks_exact(ROW_TILE * cols);
    let mut outs = out.chunks_exact_mut(ROW_TILE * n);
    for (wt, ot) in (&mut tiles).zip(&mut outs) {
        let rows: [&[i8]; ROW_TILE] = std::array::from_fn(|k| &wt[k * cols..(k + 1) * cols]);
        for (t, at) in a.chunks_exact(cols).enumerate() {
            for (k, v) in dot4(rows, at).into_iter().enumerate() {
                ot[k * n + t] = v;
            }
        }
    }
    for (row, or) in tiles
        .remainder()
        .chunks_exact(cols)
        .zip(outs.into_remainder().chunks_exact_mut(n))
    {
        for (o, at) in or.iter_mut().zip(a.chunks_exact(cols)) {
            *o = dot1(row, at);
        }
    }
}

/// Exact integer products of a row-major i8 matrix `w` (`rows x cols`, `rows = w.len() / cols`)
/// with `n` i16 activation rows `a` (`n x cols`), then `finish(row, token, sum)` turns each sum
/// into the value written to `out[row * n + token]` (row-major by weight row).
///
/// Large matrices are split by rows over rayon's pool; the result does not depend on the split.
///
/// # Panics
/// If `cols == 0`, `w.len()` or `a.len()` is not a multiple of `cols`, or `out.len() != rows * n`.
pub fn matmul_i8_i16<T: Send>(
    w: &[i8],
    a: &[i16],
    cols: usize,
    out: &mut [T],
    finish: impl Fn(usize, i64) -> T + Sync,
) {
    assert!(
        cols > 0 && w.len().is_multiple_of(cols) && a.len().is_multiple_of(cols),
        "matmul_i8_i16: {} weights / {} activations are not rows of {cols}",
        w.len(),
        a.len()
    );
    let (rows, n) = (w.len() / cols, a.len() / cols);
    assert_eq!(out.len(), rows * n, "matmul_i8_i16: output length");
    if n == 0 || rows == 0 {
        return;
    }
    // Rows per task: a multiple of the tile, enough work to pay for the hand-off.
    let per_task = (PARALLEL_MIN_MACS / (cols * n))
        .max(1)
        .next_multiple_of(ROW_TILE);
    let run = |(task, (wc, oc)): (usize, (&[i8], &mut [T]))| {
        // Sums in stack-sized blocks of rows x tokens: no heap allocation per call.
        let mut sums = [0i64; SUMS];
        let tokens = n.min(SUMS / ROW_TILE);
        let rows_per_block = SUMS / tokens / ROW_TILE * ROW_TILE;
        for (b, wb) in wc.chunks(rows_per_block * cols).enumerate() {
            let r0 = b * rows_per_block;
            for (tb, ab) in a.chunks(tokens * cols).enumerate() {
                let nt = ab.len() / cols;
                let s = &mut sums[..wb.len() / cols * nt];
                dots_block(wb, ab, cols, s);
                for (i, &v) in s.iter().enumerate() {
                    let (r, t) = (r0 + i / nt, tb * tokens + i % nt);
                    oc[r * n + t] = finish(task * per_task + r, v);
                }
            }
        }
    };
    if rows * cols * n < PARALLEL_MIN_MACS {
        run((0, (w, out)));
    } else {
        w.par_chunks(per_task * cols)
            .zip(out.par_chunks_mut(per_task * n))
            .enumerate()
            .for_each(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic xorshift values covering the full ranges (extremes included).
    fn values(seed: u64, len: usize) -> Vec<u64> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            })
            .collect()
    }

    fn weights(seed: u64, len: usize) -> Vec<i8> {
        values(seed, len)
            .into_iter()
            .map(|v| match v % 8 {
                0 => -127,
                1 => 127,
                _ => ((v >> 8) % 255) as i8,
            })
            .map(|v: i8| v.clamp(-127, 127))
            .collect()
    }

    fn acts(seed: u64, len: usize) -> Vec<i16> {
        values(seed, len)
            .into_iter()
            .map(|v| match v % 8 {
                0 => i16::MIN,
                1 => i16::MAX,
                _ => (v >> 16) as i16,
            })
            .collect()
    }

    /// The plain scalar definition, summed in i64.
    fn reference(w: &[i8], a: &[i16], cols: usize) -> Vec<i64> {
        let n = a.len() / cols;
        let mut out = Vec::new();
        for row in w.chunks_exact(cols) {
            for at in a.chunks_exact(cols) {
                out.push(
                    row.iter()
                        .zip(at)
                        .map(|(&x, &y)| i64::from(x) * i64::from(y))
                        .sum(),
                );
            }
        }
        assert_eq!(out.len(), w.len() / cols * n);
        out
    }

    /// The kernel with the identity `finish`: the exact sums.
    fn run(w: &[i8], a: &[i16], cols: usize) -> Vec<i64> {
        let mut out = vec![0i64; w.len() / cols * (a.len() / cols)];
        matmul_i8_i16(w, a, cols, &mut out, |_, v| v);
        out
    }

    const SHAPES: [(usize, usize, usize); 12] = [
        (1, 1, 1),
        (3, 7, 1),
        (5, 511, 2),
        (9, 512, 3),
        (4, 513, 1),
        (6, 516, 4),
        (7, 517, 5),
        (13, 1100, 1),
        (8, 1536, 2),
        (70, 64, 1),
        (3, 5, 300),
        (600, 64, 9),
    ];

    #[test]
    fn sums_are_exact_for_every_shape() {
        for (i, &(rows, cols, n)) in SHAPES.iter().enumerate() {
            let w = weights(i as u64 + 1, rows * cols);
            let a = acts(i as u64 + 100, n * cols);
            assert_eq!(
                run(&w, &a, cols),
                reference(&w, &a, cols),
                "rows {rows} cols {cols} n {n}"
            );
        }
    }

    #[test]
    fn worst_case_magnitudes_do_not_overflow() {
        // Every product at its extreme: a single i32 over all columns would overflow.
        let (rows, cols) = (5, 3 * I32_CHUNK + 7);
        for (wv, av) in [(-127i8, i16::MIN), (127, i16::MIN), (127, i16::MAX)] {
            let got = run(&vec![wv; rows * cols], &vec![av; cols], cols);
            let want = cols as i64 * i64::from(wv) * i64::from(av);
            assert!(want.abs() > i64::from(i32::MAX));
            assert_eq!(got, vec![want; rows]);
        }
    }

    #[test]
    fn result_does_not_depend_on_the_thread_count() {
        let (rows, cols, n) = (1000, 576, 3);
        assert!(
            rows * cols * n > 8 * PARALLEL_MIN_MACS,
            "must split over threads"
        );
        let w = weights(7, rows * cols);
        let a = acts(8, n * cols);
        let with = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| run(&w, &a, cols))
        };
        let one = with(1);
        assert_eq!(one, reference(&w, &a, cols));
        assert_eq!(with(2), one);
        assert_eq!(with(5), one);
    }
}
