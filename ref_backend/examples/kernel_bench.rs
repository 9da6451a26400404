//! Speed of one matrix-vector product on SmolLM2-135M's shapes, in one run:
//! - `scalar`: the plain i8 x i16 loop summed in i32 runs (the executor's kernel before the
//!   vectorized one), on one thread;
//! - `i8_1t` / `i8`: [`ref_backend::kernels::matmul_i8_i16`] on one thread / on rayon's pool;
//! - `f32`: the float model's kernel ([`model::ops::matmul`], rayon's pool).
//!
//! Figures are microseconds per product and weight bytes per nanosecond (GB/s).
//! `cargo run --release -p ref_backend --example kernel_bench [-- --tokens N]`: with N > 1 the
//! i8 kernels multiply N tokens at once (prefill) and the figures are per token.

use std::hint::black_box;
use std::time::Instant;

use ref_backend::kernels::{I32_CHUNK, matmul_i8_i16};

/// (rows, cols, name): the matrices of one SmolLM2-135M layer, and the tied classifier.
const SHAPES: [(usize, usize, &str); 5] = [
    (576, 576, "wq/wo"),
    (192, 576, "wk/wv"),
    (1536, 576, "w1/w3"),
    (576, 1536, "w2"),
    (49152, 576, "classifier"),
];

fn scalar(w: &[i8], a: &[i16], out: &mut [i64]) {
    let cols = a.len();
    for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
        let mut acc = 0i64;
        for (wc, ac) in row.chunks(I32_CHUNK).zip(a.chunks(I32_CHUNK)) {
            let mut s = 0i32;
            for (&x, &y) in wc.iter().zip(ac) {
                s += i32::from(x) * i32::from(y);
            }
            acc += i64::from(s);
        }
        *o = acc;
    }
}

/// Seconds per call of `f`, the best of 5 batches (other processes share the machine).
fn time(macs: usize, mut f: impl FnMut()) -> f64 {
    let reps = (100_000_000 / macs).max(2);
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut tokens = 1usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tokens" => tokens = args.next().ok_or("--tokens N")?.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let tokens = tokens.max(1);
    let threads = rayon::current_num_threads();
    println!("{threads} threads, {tokens} token(s) per call; us per token (GB/s of weights)");
    println!(
        "{:<11} {:>11} {:>18} {:>18} {:>18} {:>18}",
        "matrix", "shape", "scalar", "i8_1t", "i8", "f32"
    );
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    for (rows, cols, name) in SHAPES {
        let w: Vec<i8> = (0..rows * cols)
            .map(|i| ((i * 37 % 255) as i32 - 127) as i8)
            .collect();
        let a: Vec<i16> = (0..tokens * cols)
            .map(|i| (i * 131 % 65536) as u16 as i16)
            .collect();
        let wf: Vec<f32> = w.iter().map(|&v| f32::from(v) / 127.0).collect();
        let xf: Vec<f32> = a.iter().map(|&v| f32::from(v) / 32768.0).collect();
        let mut sums = vec![0i64; rows * tokens];
        let mut outf = vec![0f32; rows];
        let macs = rows * cols * tokens;
        let per_token = |s: f64| s / tokens as f64;
        let t_scalar = per_token(time(macs, || {
            for at in a.chunks_exact(cols) {
                scalar(black_box(&w), at, &mut sums[..rows]);
            }
        }));
        let kernel = |sums: &mut [i64]| {
            matmul_i8_i16(black_box(&w), &a, cols, sums, |_, s, o| {
                o.copy_from_slice(s)
            })
        };
        let t_1t = per_token(one.install(|| time(macs, || kernel(&mut sums))));
        let t_mt = per_token(time(macs, || kernel(&mut sums)));
        let t_f32 = per_token(time(macs, || {
            for xt in xf.chunks_exact(cols) {
                model::ops::matmul(&mut outf, xt, black_box(&wf));
            }
        }));
        let cell = |s: f64| format!("{:>8.1} ({:>5.2})", s * 1e6, (rows * cols) as f64 / s / 1e9);
        println!(
            "{name:<11} {:>11} {:>18} {:>18} {:>18} {:>18}",
            format!("{rows}x{cols}"),
            cell(t_scalar),
            cell(t_1t),
            cell(t_mt),
            cell(t_f32)
        );
    }
    Ok(())
}
