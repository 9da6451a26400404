use super::*;

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

fn rope_cfg(theta: f32, pairing: RopePairing) -> RopeConfig {
    RopeConfig {
        theta,
        scaling: None,
        pairing,
        ..RopeConfig::default()
    }
}

#[test]
fn rmsnorm_matches_formula_in_f64() {
    let x = [1.0f32, -2.0, 3.0, 0.5];
    let w = [0.5f32, 1.0, 2.0, -1.0];
    for eps in [1e-5f32, 1e-6, 0.5] {
        let mut out = [0.0; 4];
        rmsnorm(&mut out, &x, &w, eps);
        let ms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 4.0 + f64::from(eps);
        for i in 0..4 {
            let want = f64::from(w[i]) * f64::from(x[i]) / ms.sqrt();
            assert!(
                close(out[i], want as f32, 1e-6),
                "{i}: {} vs {want}",
                out[i]
            );
        }
        let mut y = x;
        rmsnorm_inplace(&mut y, &w, eps);
        assert_eq!(y, out);
    }
}

/// f64 rotation of one head with the given pair layout and per-pair frequencies.
fn rotate_f64(v: &[f32], pos: usize, freqs: &[f64], half_split: bool) -> Vec<f64> {
    let hd = v.len();
    let mut out: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    for (k, f) in freqs.iter().enumerate() {
        let (i, j) = if half_split {
            (k, k + hd / 2)
        } else {
            (2 * k, 2 * k + 1)
        };
        let t = pos as f64 * f;
        let (a, b) = (f64::from(v[i]), f64::from(v[j]));
        out[i] = a * t.cos() - b * t.sin();
        out[j] = a * t.sin() + b * t.cos();
    }
    out
}

#[test]
fn rope_rotates_adjacent_and_half_split_pairs() {
    let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
    for (pairing, half) in [
        (RopePairing::Adjacent, false),
        (RopePairing::HalfSplit, true),
    ] {
        let rope = Rope::new(8, &rope_cfg(1e5, pairing));
        let mut v = orig.clone();
        rope.rotate(&mut v, 0);
        assert_eq!(v, orig);
        rope.rotate(&mut v, 7);
        let freqs: Vec<f64> = (0..4)
            .map(|k| 1e5f64.powf(-(2.0 * k as f64) / 8.0))
            .collect();
        for head in 0..2 {
            let want = rotate_f64(&orig[head * 8..head * 8 + 8], 7, &freqs, half);
            for i in 0..8 {
                assert!(
                    close(v[head * 8 + i], want[i] as f32, 1e-5),
                    "{pairing:?} {head} {i}"
                );
            }
        }
    }
    assert_eq!(rope_frequency(1e4, 0, 8), 1.0);
}

#[test]
fn llama3_scaling_keeps_high_divides_low_and_blends_between() {
    let s = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192,
    };
    // wavelen 2π/f: short (< 2048) kept, long (> 8192) divided by 8.
    let high = 2.0 * std::f32::consts::PI / 100.0;
    assert_eq!(llama3_scaled(high, &s), high);
    let low = 2.0 * std::f32::consts::PI / 10000.0;
    assert_eq!(llama3_scaled(low, &s), low / 8.0);
    // wavelen 4096: smooth = (8192/4096 - 1) / 3 = 1/3.
    let mid = 2.0 * std::f32::consts::PI / 4096.0;
    let want = (2.0 / 3.0) * mid / 8.0 + mid / 3.0;
    assert!(close(llama3_scaled(mid, &s), want, 1e-6));
    let cfg = RopeConfig {
        theta: 5e5,
        scaling: Some(s),
        pairing: RopePairing::Adjacent,
        ..RopeConfig::default()
    };
    let rope = Rope::new(64, &cfg);
    for (k, &f) in rope.frequencies().iter().enumerate() {
        assert_eq!(f, llama3_scaled(rope_frequency(5e5, k, 64), &s));
    }
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

fn naive(w: &[f32], x: &[f32]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|r| {
            r.iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum()
        })
        .collect()
}

#[test]
fn matmul_matches_naive_f64_small_and_parallel() {
    // 5 x 19 runs serially; 300 x 301 crosses PARALLEL_MIN_MACS and runs on the pool.
    for (rows, n) in [(5usize, 19usize), (300, 301)] {
        let w: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x: Vec<f32> = (0..n).map(|i| (i as f32 - 9.0) / 3.0).collect();
        let mut out = vec![0.0; rows];
        matmul(&mut out, &x, &w);
        let want = naive(&w, &x);
        for r in 0..rows {
            assert!(
                close(out[r], want[r] as f32, 1e-4),
                "{r}: {} vs {}",
                out[r],
                want[r]
            );
            // Each row equals the serial dot product exactly.
            assert_eq!(out[r], dot(&w[r * n..(r + 1) * n], &x));
        }
    }
}

#[test]
fn matmul_rows_equals_matmul_of_each_row() {
    // Serial and parallel sizes, one and several rows, a scratch longer than needed.
    for (rows, cols, n) in [(5usize, 19usize, 3usize), (300, 301, 4), (7, 8, 1)] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0)
            .collect();
        let mut out = vec![f32::NAN; n * rows];
        let mut scratch = vec![f32::NAN; n * rows + 5];
        matmul_rows(&mut out, &x, &w, cols, &mut scratch);
        for (i, xr) in x.chunks_exact(cols).enumerate() {
            let mut want = vec![0.0; rows];
            matmul(&mut want, xr, &w);
            assert_eq!(
                &out[i * rows..(i + 1) * rows],
                &want[..],
                "{rows}x{cols}, row {i}"
            );
        }
    }
}

#[test]
#[should_panic(expected = "matmul_rows: shapes do not fit")]
fn matmul_rows_rejects_a_short_scratch() {
    let mut out = vec![0.0; 4];
    matmul_rows(&mut out, &[1.0; 4], &[1.0; 4], 2, &mut [0.0; 3]);
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

#[test]
fn kl_of_logits_is_zero_for_equal_distributions_and_matches_a_hand_value() {
    use super::kl_logits;
    // A shift of every logit leaves the distribution unchanged.
    assert!(kl_logits(&[1.0, 2.0, 3.0], &[11.0, 12.0, 13.0]).abs() < 1e-12);
    // p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3).
    let q = [0.0f32, 3f32.ln()];
    let want = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
    assert!((kl_logits(&[0.0, 0.0], &q) - want).abs() < 1e-7);
}
