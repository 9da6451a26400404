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
//! On x86-64 the micro-kernel is written with intrinsics and picked at run time from CPUID
//! ([`Isa`]): with AVX512BW + AVX512-VNNI, `kernels/avx512.rs` (`vpmovsxbw` + `vpdpwssd`, 32
//! products per instruction); otherwise with AVX2, `kernels/avx2.rs` (`vpmovsxbw` and 16
//! products per AVX-VNNI `vpdpwssd` where the CPU has it, else per `vpmaddwd`); otherwise with
//! SSE4.1 (every x86-64 CPU since 2008), `kernels/x86.rs` (`pmovsxbw` + `pmaddwd`, 8). LLVM
//! does not form `pmaddwd` from the plain loop (it widens both operands to i32 and multiplies
//! with `pmulld`, about 3x slower). Elsewhere the plain loop runs, a row at a time. No
//! `-C target-cpu` flag is needed for speed or correctness; `HTPKV_ISA` ([`ISA_VAR`]) forces
//! a kernel the CPU has. The `unsafe` of this module is the calls into those functions after
//! the feature checks.
//!
//! Matrices are split by output rows over rayon's pool (one thread per core); a row's sum does
//! not depend on which thread computes it, so neither does the result. Matrices that read the
//! same activations go to the pool as one job ([`matmul_i8_i16_many`]), and the executor runs a
//! whole step inside the pool with the other threads spinning for work ([`on_busy_pool`]).
//! The x86 micro-kernels take four rows at a time so one activation load feeds four weight
//! rows, and two or four tokens so one weight load feeds them all; for several tokens
//! (prefill) every weight row is read from memory once per call, not once per token.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Longest run of i8 x i16 products whose sum provably fits an i32:
/// `516 * 127 * 32768 = 2_147_352_576 <= 2^31 - 1` (517 would not fit). (Weights are clamped to `[-127, 127]`,
/// activations are i16, so `|product| <= 127 * 32768`.)
pub const I32_CHUNK: usize = 516;

/// Elements summed in one i32 run: the largest multiple of 64 (a whole number of vector
/// iterations at any width) whose sum fits an i32 for every i8 weight, -128 included (which
/// the matrices never hold): `448 * 128 * 32768 = 1_879_048_192`.
pub const KERNEL_CHUNK: usize = (i32::MAX as usize / (128 * 32768)) / 64 * 64;
const _: () = assert!(KERNEL_CHUNK > 0 && KERNEL_CHUNK <= I32_CHUNK);

/// Below this many multiply-adds a matrix runs on the calling thread (handing rows to other
/// threads would cost more than it saves).
pub const PARALLEL_MIN_MACS: usize = 1 << 15;

/// `with_min_len` for a parallel iterator over `work` units: 1 (split freely) from `threshold`
/// on, else every item in one task, so a small job runs on the calling thread through the same
/// code path.
pub(crate) fn min_len_for(work: usize, threshold: usize) -> usize {
    if work >= threshold { 1 } else { usize::MAX }
}

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

/// The micro-kernels, fastest first. The running CPU's best is picked at run time from CPUID
/// (std caches it), so no `-C target-cpu` flag is needed for speed or correctness; the
/// environment variable [`ISA_VAR`] forces one by name ([`Isa::NAMES`]), so that each kernel
/// can be measured and tested on any CPU that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// `kernels/avx512.rs`: AVX512BW + AVX512-VNNI, 32 products per instruction (and
    /// AVX512F/DQ/VL, which every CPU with VNNI has, for the vectorized scalar loops).
    Avx512Vnni,
    /// `kernels/avx2.rs` with AVX-VNNI's 256-bit `vpdpwssd`: 16 products per instruction.
    AvxVnni,
    /// `kernels/avx2.rs`: AVX2, 16 products per `vpmaddwd` (with FMA and F16C, which every
    /// AVX2 CPU has, for the vectorized scalar loops).
    Avx2,
    /// `kernels/x86.rs`: SSE4.1, 8 products per `pmaddwd`.
    Sse41,
    /// The plain loop, a row at a time.
    Portable,
}

/// The environment variable that forces a kernel: one of [`Isa::NAMES`].
pub const ISA_VAR: &str = "HTPKV_ISA";

/// A kernel forced through [`ISA_VAR`] that this build or CPU cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// The value names no kernel.
    #[error("{ISA_VAR}={value}: unknown kernel (expected one of {})", Isa::NAMES.join(", "))]
    Unknown { value: String },
    /// The CPU lacks features the kernel needs.
    #[error("{ISA_VAR}={isa}: this CPU lacks {}", missing.join(", "))]
    Missing {
        isa: &'static str,
        missing: Vec<&'static str>,
    },
}

impl Isa {
    /// Every kernel, fastest first.
    pub const ALL: [Isa; 5] = [
        Isa::Avx512Vnni,
        Isa::AvxVnni,
        Isa::Avx2,
        Isa::Sse41,
        Isa::Portable,
    ];

    /// The names [`ISA_VAR`] takes, in the order of [`Isa::ALL`].
    pub const NAMES: [&str; 5] = ["avx512", "avxvnni", "avx2", "sse41", "portable"];

    /// The name [`ISA_VAR`] takes for this kernel.
    pub fn name(self) -> &'static str {
        Self::NAMES[Self::ALL.iter().position(|&i| i == self).unwrap_or(4)]
    }

    /// The CPU features (as `is_x86_feature_detected!` names them) the kernel needs.
    fn features(self) -> &'static [&'static str] {
        match self {
            Isa::Avx512Vnni => &["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vnni"],
            Isa::AvxVnni => &["avx2", "fma", "f16c", "avxvnni"],
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Sse41 => &["sse4.1"],
            Isa::Portable => &[],
        }
    }

    /// The features of [`Isa::features`] the running CPU lacks (all of them off x86-64,
    /// except for the portable loop, which needs none).
    fn missing(self) -> Vec<&'static str> {
        self.features()
            .iter()
            .copied()
            .filter(|&f| !cpu_has(f))
            .collect()
    }

    /// The kernels the running CPU can run, fastest first (the portable loop always).
    pub fn available() -> Vec<Isa> {
        Self::ALL
            .into_iter()
            .filter(|i| i.missing().is_empty())
            .collect()
    }

    /// The fastest kernel the running CPU has.
    pub fn detect() -> Isa {
        Self::available()[0]
    }

    /// `value` of [`ISA_VAR`] checked against the running CPU.
    ///
    /// # Errors
    /// If `value` names no kernel, or the CPU lacks a feature the kernel needs.
    pub fn forced(value: &str) -> Result<Isa, IsaError> {
        let isa = Self::NAMES
            .iter()
            .position(|&n| n == value)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| IsaError::Unknown {
                value: value.to_owned(),
            })?;
        match isa.missing() {
            missing if missing.is_empty() => Ok(isa),
            missing => Err(IsaError::Missing {
                isa: isa.name(),
                missing,
            }),
        }
    }

    /// The kernel in use: the one [`ISA_VAR`] forces, else the fastest the CPU has (read
    /// once per process; [`isa`] reports a refused value).
    fn current() -> Isa {
        isa().unwrap_or_else(|_| Isa::detect())
    }
}

/// The kernel this process runs: [`ISA_VAR`]'s if set (read once), else the fastest the CPU
/// has. Programs call it once at start, so that a refused value stops them with its error
/// (the kernels themselves fall back to the fastest kernel: every kernel gives the same
/// results).
///
/// # Errors
/// [`IsaError`] when [`ISA_VAR`] names no kernel or one the CPU cannot run.
pub fn isa() -> Result<Isa, IsaError> {
    static CHOSEN: OnceLock<Result<Isa, IsaError>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| match std::env::var(ISA_VAR) {
            Ok(v) if !v.is_empty() => Isa::forced(&v),
            _ => Ok(Isa::detect()),
        })
        .clone()
}

/// Whether the running CPU has `feature` (a name of `is_x86_feature_detected!`).
fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        match feature {
            "avx512f" => has!("avx512f"),
            "avx512bw" => has!("avx512bw"),
            "avx512dq" => has!("avx512dq"),
            "avx512vl" => has!("avx512vl"),
            "avx512vnni" => has!("avx512vnni"),
            "avxvnni" => has!("avxvnni"),
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "f16c" => has!("f16c"),
            "sse4.1" => has!("sse4.1"),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

impl Isa {
    /// Exact dot products of [`ROW_TILE`] weight rows with `T` activation rows
    /// (`out[t][r] = rows[r] · a[t]`). `self` must be one of [`Isa::available`].
    #[inline(always)]
    fn dot_tile<const T: usize>(
        self,
        rows: [&[i8]; ROW_TILE],
        a: [&[i16]; T],
        prefetch: bool,
    ) -> [[i64; ROW_TILE]; T] {
        match self {
            // SAFETY: `avx512::dot_tile` enables AVX512BW and AVX512-VNNI only, and the CPU
            // has them (and F/DQ/VL): `self` is one of `Isa::available`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { avx512::dot_tile(rows, a, prefetch) },
            // SAFETY: `avx2::dot_tile_vnni` enables AVX2 and AVX-VNNI; the CPU has them.
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => unsafe { avx2::dot_tile_vnni(rows, a, prefetch) },
            // SAFETY: `avx2::dot_tile` enables AVX2 only; the CPU has it.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::dot_tile(rows, a, prefetch) },
            // SAFETY: `x86::dot_tile` enables SSE4.1 only; the CPU has it.
            #[cfg(target_arch = "x86_64")]
            Isa::Sse41 => unsafe { x86::dot_tile(rows, a, prefetch) },
            // The plain loop leaves prefetching to the hardware.
            _ => a.map(|at| rows.map(|row| dot1(row, at))),
        }
    }
}

/// `out[r * n + t] = Σ_c w[r * cols + c] · a[t * cols + c]` for every row `r` of `w` and token
/// `t` of `a` (`n = a.len() / cols`), exactly, on the calling thread.
///
/// Tokens are multiplied `TT` at a time (prefill), so each weight vector loaded from L1 feeds
/// that many activation rows: 4 with AVX-512's 32 registers (1.3x faster than 2 on one core,
/// `kernel_bench --tokens 128`; 8 was slower), 2 with the 16 of SSE and AVX2.
fn dots_block(isa: Isa, w: &[i8], a: &[i16], cols: usize, out: &mut [i64]) {
    match isa {
        Isa::Avx512Vnni => dots_block_tiled::<4>(isa, w, a, cols, out),
        _ => dots_block_tiled::<2>(isa, w, a, cols, out),
    }
}

/// [`dots_block`] with `TT` tokens per micro-kernel call.
#[inline(always)]
fn dots_block_tiled<const TT: usize>(isa: Isa, w: &[i8], a: &[i16], cols: usize, out: &mut [i64]) {
    let n = a.len() / cols;
    let mut tiles = w.chunks_exact(ROW_TILE * cols);
    let mut outs = out.chunks_exact_mut(ROW_TILE * n);
    for (wt, ot) in (&mut tiles).zip(&mut outs) {
        let rows: [&[i8]; ROW_TILE] = std::array::from_fn(|k| &wt[k * cols..(k + 1) * cols]);
        let mut put = |t: usize, v: [i64; ROW_TILE]| {
            for (k, v) in v.into_iter().enumerate() {
                ot[k * n + t] = v;
            }
        };
        // The next tile is prefetched while the first tokens read this one.
        let mut groups = a.chunks_exact(TT * cols);
        for (p, at) in (&mut groups).enumerate() {
            let acts = std::array::from_fn(|k| &at[k * cols..(k + 1) * cols]);
            let sums = isa.dot_tile::<TT>(rows, acts, p == 0);
            for (k, v) in sums.into_iter().enumerate() {
                put(p * TT + k, v);
            }
        }
        let done = n - n % TT;
        for (t, at) in groups.remainder().chunks_exact(cols).enumerate() {
            let [v] = isa.dot_tile::<1>(rows, [at], done == 0);
            put(done + t, v);
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

/// `out[i] = quant::quantize::<i16>(x[i], so)` (the activations of a matmul), with the running
/// CPU's widest vectors: the one rounding rule ([`quantize_loop`]), compiled for AVX-512 where
/// the CPU has it.
///
/// # Panics
/// If the lengths differ.
pub fn quantize_i16(x: &[f32], so: quant::ScaleOffset, out: &mut [i16]) {
    quantize_on(Isa::current(), x, so, out);
}

/// [`quantize_i16`] compiled for `isa` (one of [`Isa::available`]).
fn quantize_on(isa: Isa, x: &[f32], so: quant::ScaleOffset, out: &mut [i16]) {
    assert_eq!(x.len(), out.len(), "quantize_i16: lengths differ");
    match isa {
        // SAFETY: `avx512::quantize_i16` enables AVX512F/BW/DQ/VL; the CPU has them all
        // (`Isa::current` is one of `Isa::available`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::quantize_i16(x, so, out) },
        // SAFETY: `avx2::quantize_i16` enables AVX2/FMA/F16C; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::quantize_i16(x, so, out) },
        _ => quantize_loop(x, so, out),
    }
}

/// The vectorized copies of the plain loops for one ISA's module: each the same function
/// compiled with `$features`, so the same operations and the same values.
macro_rules! vector_loops {
    ($features:literal) => {
        /// [`super::quantize_loop`] compiled for this ISA: the same codes.
        #[target_feature(enable = $features)]
        pub(super) fn quantize_i16(x: &[f32], so: quant::ScaleOffset, out: &mut [i16]) {
            super::quantize_loop(x, so, out);
        }

        /// [`super::rescale_loop`] compiled for this ISA: the same values.
        #[target_feature(enable = $features)]
        pub(super) fn rescale(sums: &[i64], shift: i64, scales: (f32, f32), out: &mut [f32]) {
            super::rescale_loop(sums, shift, scales, out);
        }

        /// [`super::dot_loop`] in f32 compiled for this ISA: the same value.
        #[target_feature(enable = $features)]
        pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            super::dot_loop::<f32, 16>(a, b)
        }

        /// [`super::dot_loop`] in f64 compiled for this ISA: the same value.
        #[target_feature(enable = $features)]
        pub(super) fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
            super::dot_loop::<f64, 8>(a, b)
        }

        /// [`super::add_scaled_loop`] compiled for this ISA: the same values.
        #[target_feature(enable = $features)]
        pub(super) fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
            super::add_scaled_loop(y, a, x);
        }
    };
}
use vector_loops;

/// The loop of [`quantize_i16`], inlined into each ISA's copy.
#[inline(always)]
fn quantize_loop(x: &[f32], so: quant::ScaleOffset, out: &mut [i16]) {
    for (d, &v) in out.iter_mut().zip(x) {
        *d = quant::quantize::<i16>(v, so);
    }
}

/// `Σ a[i] b[i]` in f32 (GPTQ's rounding, [`crate::Rounding::Gptq`]) in one fixed order on
/// every CPU: lane `k` of sixteen sums the products `k, k + 16, …` (a multiply, then an add:
/// Rust never fuses them), the lanes are added in order, then the tail. Compiled for AVX-512
/// where the CPU has it: the same operations, so the same value, and the rounding a compile
/// makes does not depend on the machine.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_on(Isa::current(), a, b)
}

/// [`dot_f32`] compiled for `isa` (one of [`Isa::available`]).
fn dot_f32_on(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    match isa {
        // SAFETY: `avx512::dot_f32` enables AVX512F/BW/DQ/VL; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::dot_f32(a, b) },
        // SAFETY: `avx2::dot_f32` enables AVX2/FMA/F16C; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::dot_f32(a, b) },
        _ => dot_loop::<f32, 16>(a, b),
    }
}

/// [`dot_f32`] in f64 with eight lanes (GPTQ's Cholesky factor).
pub fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    dot_f64_on(Isa::current(), a, b)
}

/// [`dot_f64`] compiled for `isa` (one of [`Isa::available`]).
fn dot_f64_on(isa: Isa, a: &[f64], b: &[f64]) -> f64 {
    match isa {
        // SAFETY: `avx512::dot_f64` enables AVX512F/BW/DQ/VL; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::dot_f64(a, b) },
        // SAFETY: `avx2::dot_f64` enables AVX2/FMA/F16C; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::dot_f64(a, b) },
        _ => dot_loop::<f64, 8>(a, b),
    }
}

/// `y[i] += a * x[i]` (a multiply, then an add) over the shorter length: the Gram matrices of
/// GPTQ's calibration, compiled for AVX-512 where the CPU has it.
pub fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    add_scaled_on(Isa::current(), y, a, x);
}

/// [`add_scaled`] compiled for `isa` (one of [`Isa::available`]).
fn add_scaled_on(isa: Isa, y: &mut [f32], a: f32, x: &[f32]) {
    match isa {
        // SAFETY: `avx512::add_scaled` enables AVX512F/BW/DQ/VL; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::add_scaled(y, a, x) },
        // SAFETY: `avx2::add_scaled` enables AVX2/FMA/F16C; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::add_scaled(y, a, x) },
        _ => add_scaled_loop(y, a, x),
    }
}

/// The loop of [`dot_f32`] and [`dot_f64`], inlined into each ISA's copy.
#[inline(always)]
fn dot_loop<T, const L: usize>(a: &[T], b: &[T]) -> T
where
    T: Copy + Default + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    let mut acc = [T::default(); L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..L {
            acc[k] = acc[k] + x[k] * y[k];
        }
    }
    let lanes = acc.iter().fold(T::default(), |s, &v| s + v);
    ra.iter().zip(rb).fold(lanes, |s, (&x, &y)| s + x * y)
}

/// The loop of [`add_scaled`], inlined into each ISA's copy.
#[inline(always)]
fn add_scaled_loop(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `out[i] = (sums[i] + shift) as f32 * a * b`: how an i8 matmul's exact sums become its
/// outputs (the one rounding after the activation quantization is the i64 -> f32 conversion),
/// with the running CPU's widest vectors (for runs of at least 16 tokens).
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn rescale(sums: &[i64], shift: i64, scales: (f32, f32), out: &mut [f32]) {
    // A decode step's runs are one token long: not worth a call.
    let isa = if sums.len() < 16 {
        Isa::Portable
    } else {
        Isa::current()
    };
    rescale_on(isa, sums, shift, scales, out);
}

/// [`rescale`] compiled for `isa` (one of [`Isa::available`]).
fn rescale_on(isa: Isa, sums: &[i64], shift: i64, scales: (f32, f32), out: &mut [f32]) {
    assert_eq!(sums.len(), out.len(), "rescale: lengths differ");
    match isa {
        // SAFETY: `avx512::rescale` enables AVX512F/BW/DQ/VL; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::rescale(sums, shift, scales, out) },
        // SAFETY: `avx2::rescale` enables AVX2/FMA/F16C; the CPU has them all.
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::rescale(sums, shift, scales, out) },
        _ => rescale_loop(sums, shift, scales, out),
    }
}

/// The loop of [`rescale`], inlined into each ISA's copy.
#[inline(always)]
fn rescale_loop(sums: &[i64], shift: i64, (a, b): (f32, f32), out: &mut [f32]) {
    for (o, &acc) in out.iter_mut().zip(sums) {
        *o = (acc + shift) as f32 * a * b;
    }
}

/// An f16 weight as a compiled file stores it: its two little-endian bytes. Its alignment is 1,
/// so f16 matrices are read in place from a file's bytes wherever they start.
pub type F16Le = [u8; 2];

/// The value of an [`F16Le`], widened to f32 (exactly).
#[inline(always)]
pub fn widen_f16(h: F16Le) -> f32 {
    half::f16::from_le_bytes(h).to_f32()
}

/// `Σ w[i] · x[i]` of an f16 weight row with f32 inputs: exactly `model::ops::dot` of the row
/// widened to f32 (the widening is exact, and the sum has `ops::dot`'s order: eight lanes of
/// a multiply then an add, the lanes added pairwise, then the tail), without keeping the
/// widened row in memory. With F16C (every AVX2 kernel), eight weights per `vcvtph2ps`.
///
/// # Panics
/// If the lengths differ.
pub fn dot_f16(w: &[F16Le], x: &[f32]) -> f32 {
    dot_f16_on(Isa::current(), w, x)
}

/// [`dot_f16`] for `isa` (one of [`Isa::available`]).
#[inline(always)]
fn dot_f16_on(isa: Isa, w: &[F16Le], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot_f16: lengths differ");
    match isa {
        // SAFETY: `avx2::dot_f16` enables AVX2/FMA/F16C; the CPU has them all (every kernel
        // from AVX2 up needs them: `Isa::features`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni | Isa::AvxVnni | Isa::Avx2 => unsafe { avx2::dot_f16(w, x) },
        _ => dot_f16_loop(w, x),
    }
}

/// The plain form of [`dot_f16`].
fn dot_f16_loop(w: &[F16Le], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for k in 0..8 {
            acc[k] += widen_f16(a[k]) * b[k];
        }
    }
    f16_tail(lanes_sum(acc), wr, xr)
}

/// The lanes of [`dot_f16`] added in `model::ops::dot`'s order.
#[inline(always)]
fn lanes_sum(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// `s` plus the tail products of [`dot_f16`], in order.
#[inline(always)]
fn f16_tail(s: f32, w: &[F16Le], x: &[f32]) -> f32 {
    w.iter().zip(x).fold(s, |s, (&a, &b)| s + widen_f16(a) * b)
}

/// `out[t * rows + r] = dot_f16(w[r], x[t])` for every row `r` of the f16 matrix `w` (`rows x
/// cols`) and token `t` of `x` (`n x cols`), token-major like `model::ops::matmul_rows`, the
/// same values as `ops::matmul_rows` of the widened matrix. Rows are split over rayon's pool
/// (the result does not depend on the split); with `n > 1`, `scratch` holds at least
/// `out.len()` f32 (the row-major products before the transpose).
///
/// # Panics
/// If `cols == 0`, the lengths are not `rows x cols`, `n x cols`, `n x rows`, or `scratch` is
/// short.
pub fn matmul_f16(out: &mut [f32], x: &[f32], w: &[F16Le], cols: usize, scratch: &mut [f32]) {
    let (rows, n) = (w.len() / cols.max(1), x.len() / cols.max(1));
    assert!(
        cols > 0 && w.len() == rows * cols && x.len() == n * cols && out.len() == n * rows,
        "matmul_f16: shapes do not fit (w {}, x {}, out {}, cols {cols})",
        w.len(),
        x.len(),
        out.len()
    );
    if n <= 1 {
        return rows_f16(out, x, w, cols);
    }
    let t = &mut scratch[..out.len()];
    rows_f16(t, x, w, cols);
    for (r, t) in t.chunks_exact(n).enumerate() {
        for (i, &v) in t.iter().enumerate() {
            out[i * rows + r] = v;
        }
    }
}

/// [`matmul_f16`] row-major (`t[r * n + i]`), over rayon's pool.
fn rows_f16(t: &mut [f32], x: &[f32], w: &[F16Le], cols: usize) {
    let isa = Isa::current();
    let n = x.len() / cols;
    let per_task = (PARALLEL_MIN_MACS / (cols * n).max(1)).max(1);
    t.par_chunks_mut(per_task * n.max(1))
        .zip(w.par_chunks(per_task * cols))
        .with_min_len(min_len_for(w.len() * n, PARALLEL_MIN_MACS))
        .for_each(|(t, wc)| {
            for (t, row) in t.chunks_exact_mut(n.max(1)).zip(wc.chunks_exact(cols)) {
                for (t, xr) in t.iter_mut().zip(x.chunks_exact(cols)) {
                    *t = dot_f16_on(isa, row, xr);
                }
            }
        });
}

/// How long an idle pool thread keeps looking for work inside [`on_busy_pool`] before it goes
/// back to rayon's sleep: longer than the serial stretches of a decode step (a layer's
/// attention, norms and activation quantization), short enough to give the cores back soon
/// after a step that ended in a panic.
const SPIN_IDLE: Duration = Duration::from_micros(500);

/// Runs `step` on one of rayon's threads while the pool's other threads spin, looking for the
/// step's parallel work, instead of sleeping between its matmuls.
///
/// A decode step hands ~150 small matmuls to the pool; a sleeping thread takes tens of
/// microseconds to wake (more in a VM), which cost a third of the decode time on 2 threads.
/// With the step inside the pool, each matmul's halves are taken by a spinning thread at once;
/// the caller sleeps once per step. Results do not depend on it (see the module docs).
pub fn on_busy_pool<R: Send>(step: impl FnOnce() -> R + Send) -> R {
    let others = rayon::current_num_threads().saturating_sub(1);
    if others == 0 {
        return step();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 0..others {
            s.spawn(|_| spin_for_work(&done));
        }
        let r = step();
        done.store(true, Ordering::Release);
        r
    })
}

/// Executes the pool's pending jobs until `done`, or until nothing came for [`SPIN_IDLE`].
fn spin_for_work(done: &AtomicBool) {
    let mut last_work = Instant::now();
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => last_work = Instant::now(),
            _ if last_work.elapsed() > SPIN_IDLE => return,
            _ => std::hint::spin_loop(),
        }
    }
}

/// Exact integer products of a row-major i8 matrix `w` (`rows x cols`, `rows = w.len() / cols`)
/// with `n` i16 activation rows `a` (`n x cols`), then `finish(row, sums, out)` turns a run of
/// one row's sums (consecutive tokens) into the values written to `out[row * n + token]`
/// (row-major by weight row): one call per row and block of tokens, not per product.
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
    finish: impl Fn(usize, &[i64], &mut [T]) + Sync,
) {
    matmul_i8_i16_many(
        a,
        cols,
        vec![Product {
            w,
            out,
            finish: &finish,
        }],
    );
}

/// One matrix of [`matmul_i8_i16_many`]: its i8 weights (`rows x cols`, row-major), its
/// results (`rows * n`, row-major by weight row) and how a row's exact sums become results.
#[allow(missing_debug_implementations)]
pub struct Product<'a, T> {
    /// The weights, `rows x cols`.
    pub w: &'a [i8],
    /// The results, `out[row * n + token]`.
    pub out: &'a mut [T],
    /// `finish(row, sums, out)`: the results of `row`'s exact sums (a run of its tokens).
    pub finish: &'a Finish<'a, T>,
}

/// How a row's exact sums for a run of tokens become its results: `(row, sums, out)`.
pub type Finish<'a, T> = dyn Fn(usize, &[i64], &mut [T]) + Sync + 'a;

/// A run of rows of one [`Product`]: the unit of work handed to a thread.
struct Task<'a, T> {
    w: &'a [i8],
    out: &'a mut [T],
    finish: &'a Finish<'a, T>,
    row0: usize,
}

/// [`matmul_i8_i16`] for several matrices that multiply the same activations (a layer's Q, K
/// and V; its gate and up projections), as one parallel job: one hand-off to the pool instead
/// of one per matrix.
///
/// # Panics
/// As [`matmul_i8_i16`], for each product.
pub fn matmul_i8_i16_many<T: Send>(a: &[i16], cols: usize, products: Vec<Product<'_, T>>) {
    matmul_many_on(Isa::current(), a, cols, products);
}

/// [`matmul_i8_i16_many`] with the micro-kernel `isa` (one of [`Isa::available`]).
fn matmul_many_on<T: Send>(isa: Isa, a: &[i16], cols: usize, products: Vec<Product<'_, T>>) {
    assert!(
        cols > 0 && a.len().is_multiple_of(cols),
        "matmul_i8_i16: {} activations are not rows of {cols}",
        a.len()
    );
    let n = a.len() / cols;
    let mut rows = 0;
    for p in &products {
        assert!(
            p.w.len().is_multiple_of(cols),
            "matmul_i8_i16: {} weights are not rows of {cols}",
            p.w.len()
        );
        assert_eq!(
            p.out.len(),
            p.w.len() / cols * n,
            "matmul_i8_i16: output length"
        );
        rows += p.w.len() / cols;
    }
    if n == 0 || rows == 0 {
        return;
    }
    // Rows per task: a multiple of the tile, enough work to pay for the hand-off, and no more
    // tasks than two per thread (each hand-off costs more than a few rows of a decode step).
    let per_thread = rows.div_ceil(2 * rayon::current_num_threads());
    let per_task = (PARALLEL_MIN_MACS / (cols * n))
        .max(per_thread)
        .next_multiple_of(ROW_TILE);
    let tasks = products.into_iter().flat_map(|p| {
        let finish = p.finish;
        p.w.chunks(per_task * cols)
            .zip(p.out.chunks_mut(per_task * n))
            .enumerate()
            .map(move |(i, (w, out))| Task {
                w,
                out,
                finish,
                row0: i * per_task,
            })
    });
    let run = |t: Task<'_, T>| run_task(isa, t, a, cols);
    if rows * cols * n < PARALLEL_MIN_MACS {
        tasks.for_each(run);
    } else {
        tasks.collect::<Vec<_>>().into_par_iter().for_each(run);
    }
}

/// The rows of one task, on the calling thread.
fn run_task<T>(isa: Isa, t: Task<'_, T>, a: &[i16], cols: usize) {
    let n = a.len() / cols;
    // Sums in stack-sized blocks of rows x tokens: no heap allocation per task.
    let mut sums = [0i64; SUMS];
    let tokens = n.min(SUMS / ROW_TILE);
    let rows_per_block = SUMS / tokens / ROW_TILE * ROW_TILE;
    for (b, wb) in t.w.chunks(rows_per_block * cols).enumerate() {
        let r0 = b * rows_per_block;
        for (tb, ab) in a.chunks(tokens * cols).enumerate() {
            let nt = ab.len() / cols;
            let s = &mut sums[..wb.len() / cols * nt];
            dots_block(isa, wb, ab, cols, s);
            for (i, sums) in s.chunks_exact(nt).enumerate() {
                let at = (r0 + i) * n + tb * tokens;
                (t.finish)(t.row0 + r0 + i, sums, &mut t.out[at..at + nt]);
            }
        }
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
        matmul_i8_i16(w, a, cols, &mut out, |_, s, o| o.copy_from_slice(s));
        out
    }

    /// [`run`] with the micro-kernel `isa`.
    fn run_on(isa: Isa, w: &[i8], a: &[i16], cols: usize) -> Vec<i64> {
        let mut out = vec![0i64; w.len() / cols * (a.len() / cols)];
        let finish = |_: usize, s: &[i64], o: &mut [i64]| o.copy_from_slice(s);
        let product = Product {
            w,
            out: &mut out,
            finish: &finish,
        };
        matmul_many_on(isa, a, cols, vec![product]);
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
        // Every product at its extreme: a single i32 over all columns would overflow. Longer
        // than two of the AVX-512 kernel's runs of 8192 (each lane of a run then holds
        // exactly I32_CHUNK - 4 extreme products).
        // The weight -128 too, which no matrix holds.
        let (rows, cols) = (5, 2 * 8192 + 3 * I32_CHUNK + 7);
        let pairs = [
            (-127i8, i16::MIN),
            (127, i16::MIN),
            (127, i16::MAX),
            (-128, i16::MIN),
        ];
        for isa in kernels_here() {
            for (wv, av) in pairs {
                let got = run_on(isa, &vec![wv; rows * cols], &vec![av; cols], cols);
                let want = cols as i64 * i64::from(wv) * i64::from(av);
                assert!(want.abs() > i64::from(i32::MAX));
                assert_eq!(got, vec![want; rows], "{} {wv} x {av}", isa.name());
            }
        }
    }

    /// Every kernel the CPU has, with the ones it lacks named on stderr (a test run on a CPU
    /// without AVX-512 says so instead of passing silently).
    fn kernels_here() -> Vec<Isa> {
        for isa in Isa::ALL {
            if !isa.missing().is_empty() {
                eprintln!(
                    "{}: not run here (CPU lacks {:?})",
                    isa.name(),
                    isa.missing()
                );
            }
        }
        Isa::available()
    }

    /// Weights where every other run of eight is at an extreme (-128 included, which no
    /// matrix holds but every kernel sums exactly) and activations likewise.
    fn extreme_rows(seed: u64, len: usize) -> (Vec<i8>, Vec<i16>) {
        let mut w = weights(seed, len);
        let mut a = acts(seed + 1, len);
        for (i, (w, a)) in w.iter_mut().zip(a.iter_mut()).enumerate() {
            match (i / 8) % 4 {
                0 => (*w, *a) = (-128, i16::MIN),
                1 => (*w, *a) = (127, i16::MAX),
                2 => (*w, *a) = (-128, i16::MAX),
                _ => {}
            }
        }
        (w, a)
    }

    #[test]
    fn every_tile_equals_the_scalar_definition() {
        let isas = kernels_here();
        assert!(isas.contains(&Isa::Portable));
        let lens = [
            1, 7, 8, 9, 15, 16, 17, 31, 33, 448, 449, 511, 512, 513, 576, 1100,
        ];
        let lens = lens
            .into_iter()
            .chain([2047, 2048, 2064, 4096, 4127, 8224, 16391]);
        for (i, cols) in lens.enumerate() {
            let w: Vec<i8> = (0..ROW_TILE)
                .flat_map(|r| extreme_rows(i as u64 * 7 + r as u64, cols).0)
                .collect();
            let rows: [&[i8]; ROW_TILE] = std::array::from_fn(|r| &w[r * cols..(r + 1) * cols]);
            let acts: [Vec<i16>; 4] =
                std::array::from_fn(|t| extreme_rows(i as u64 * 5 + 60 + t as u64, cols).1);
            let want: [[i64; ROW_TILE]; 4] =
                std::array::from_fn(|t| rows.map(|row| reference(row, &acts[t], cols)[0]));
            let [a0, a1, ..] = acts.each_ref().map(|a| &a[..]);
            for isa in &isas {
                for prefetch in [false, true] {
                    let what = format!("{} cols {cols}", isa.name());
                    assert_eq!(isa.dot_tile(rows, [a0], prefetch), [want[0]], "{what}");
                    assert_eq!(isa.dot_tile(rows, [a0, a1], prefetch), want[..2], "{what}");
                    let four = acts.each_ref().map(|a| &a[..]);
                    assert_eq!(isa.dot_tile(rows, four, prefetch), want, "{what}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_sums_every_shape_exactly_at_the_extremes() {
        for isa in kernels_here() {
            for (i, &(rows, cols, n)) in SHAPES.iter().enumerate() {
                let w = extreme_rows(i as u64 + 1, rows * cols).0;
                let a = extreme_rows(i as u64 + 100, n * cols).1;
                let what = format!("{} rows {rows} cols {cols} n {n}", isa.name());
                assert_eq!(run_on(isa, &w, &a, cols), reference(&w, &a, cols), "{what}");
            }
        }
    }

    #[test]
    fn a_forced_kernel_is_checked_against_the_cpu_by_name() {
        for isa in Isa::ALL {
            match Isa::forced(isa.name()) {
                Ok(got) => assert!(got == isa && isa.missing().is_empty()),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.starts_with(&format!("HTPKV_ISA={}: this CPU lacks ", isa.name())));
                    assert!(
                        !isa.missing().is_empty() && msg.contains(isa.missing()[0]),
                        "{msg}"
                    );
                }
            }
        }
        assert_eq!(Isa::forced("portable"), Ok(Isa::Portable));
        let unknown = Isa::forced("avx3").unwrap_err().to_string();
        assert_eq!(
            unknown,
            "HTPKV_ISA=avx3: unknown kernel (expected one of avx512, avxvnni, avx2, sse41, portable)"
        );
        assert_eq!(Isa::detect(), Isa::available()[0]);
    }

    #[test]
    fn every_kernels_vector_loops_equal_the_scalar_rules() {
        let so = quant::ScaleOffset {
            scale: 3.7e-4,
            offset: -1234,
        };
        let mut x: Vec<f32> = values(5, 4099)
            .into_iter()
            .map(|v| (v >> 11) as i32 as f32 * 1.1e-9 - 0.3)
            .collect();
        // Ties, NaN, infinities and values past the range.
        x.extend([
            0.5 * so.scale,
            -0.5 * so.scale,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e9,
        ]);
        let want: Vec<i16> = x.iter().map(|&v| quant::quantize::<i16>(v, so)).collect();
        let sums: Vec<i64> = values(9, 1001)
            .into_iter()
            .map(|v| (v as i64) >> (v % 40))
            .collect();
        let y: Vec<f32> = x.iter().map(|v| v.clamp(-1e3, 1e3) * 0.7).collect();
        let (y, z) = (&y[..4099], &y[1..4100]);
        let wide = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        for isa in kernels_here() {
            let mut got = vec![0i16; x.len()];
            quantize_on(isa, &x, so, &mut got);
            assert_eq!(got, want, "{}", isa.name());
            for len in [1, 15, 16, 17, 1001] {
                let mut got = vec![0.0f32; len];
                rescale_on(isa, &sums[..len], -77, (1.3e-4, 0.021), &mut got);
                for (g, &s) in got.iter().zip(&sums) {
                    assert_eq!(g.to_bits(), ((s + -77) as f32 * 1.3e-4 * 0.021).to_bits());
                }
            }
            for len in [0, 1, 15, 16, 17, 4099] {
                let (a, b) = (&y[..len], &z[..len]);
                let f = dot_f32_on(isa, a, b).to_bits();
                assert_eq!(f, dot_loop::<f32, 16>(a, b).to_bits(), "{}", isa.name());
                let (a, b) = (wide(a), wide(b));
                let d = dot_f64_on(isa, &a, &b).to_bits();
                assert_eq!(d, dot_loop::<f64, 8>(&a, &b).to_bits(), "{}", isa.name());
                let (mut got, mut want) = (y[..len].to_vec(), y[..len].to_vec());
                add_scaled_on(isa, &mut got, 0.37, &z[..len]);
                add_scaled_loop(&mut want, 0.37, &z[..len]);
                assert_eq!(got, want, "{}", isa.name());
            }
        }
    }

    #[test]
    fn f16_products_equal_the_widened_f32_products_bit_for_bit() {
        let f = |seed: u64, len: usize, scale: f32| -> Vec<f32> {
            values(seed, len)
                .into_iter()
                .map(|v| (v >> 40) as i32 as f32 * scale - 1.0)
                .collect()
        };
        // Extremes of f16 (its largest finite and its smallest subnormal) among the weights.
        let mut wf = f(3, 37 * 45, 1.7e-7);
        wf[..4].copy_from_slice(&[65504.0, -65504.0, 6.0e-8, -6.0e-8]);
        let w: Vec<F16Le> = wf
            .iter()
            .map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let wide: Vec<f32> = w.iter().map(|&v| widen_f16(v)).collect();
        for isa in kernels_here() {
            for len in [0, 1, 7, 8, 9, 16, 45] {
                let x = f(5 + len as u64, len, 3.1e-7);
                let got = dot_f16_on(isa, &w[..len], &x).to_bits();
                let want = model::ops::dot(&wide[..len], &x).to_bits();
                assert_eq!(got, want, "{} len {len}", isa.name());
            }
        }
        for n in [1, 2, 5] {
            let (cols, rows) = (45, 37);
            let x = f(9 + n as u64, n * cols, 2.3e-7);
            let (mut got, mut want) = (vec![0.0; n * rows], vec![0.0; n * rows]);
            let mut scratch = vec![0.0; n * rows];
            matmul_f16(&mut got, &x, &w, cols, &mut scratch);
            model::ops::matmul_rows(&mut want, &x, &wide, cols, &mut scratch);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n {n}");
        }
    }

    #[test]
    fn several_products_equal_one_call_each_and_the_busy_pool_changes_nothing() {
        let (cols, n) = (576, 1);
        let ws: Vec<Vec<i8>> = [576, 192, 192, 5]
            .iter()
            .map(|&r| weights(r as u64, r * cols))
            .collect();
        let a = acts(3, n * cols);
        let each = |r: usize, v: i64| v * 3 + r as i64;
        let finish = |r: usize, s: &[i64], o: &mut [i64]| {
            for (o, &v) in o.iter_mut().zip(s) {
                *o = each(r, v);
            }
        };
        let mut outs: Vec<Vec<i64>> = ws.iter().map(|w| vec![0; w.len() / cols * n]).collect();
        let products = ws
            .iter()
            .zip(outs.iter_mut())
            .map(|(w, out)| Product {
                w,
                out,
                finish: &finish,
            })
            .collect();
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        threads.install(|| on_busy_pool(|| matmul_i8_i16_many(&a, cols, products)));
        for (w, got) in ws.iter().zip(&outs) {
            let want: Vec<i64> = reference(w, &a, cols)
                .into_iter()
                .enumerate()
                .map(|(r, v)| each(r, v))
                .collect();
            assert_eq!(got, &want);
        }
        assert_eq!(threads.install(|| on_busy_pool(|| 7)), 7);
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
