//! f32 weights + f32 KV: the graphs must reproduce model::llama2c::FloatModel, and an AR-32 prefill
//! must equal AR-1 steps (also for quantized models, where the K/V round trip through the
//! KV encoding makes them agree).

use std::sync::Arc;

use model::llama2c::{Checkpoint, FloatModel, Tokenizer};
use quant::DataType;
use ref_backend::{CompileOptions, Granularity, KLayout, WeightType};
use test_support::harness::{Harness, max_abs_diff};

const TOL: f32 = 1e-4;

fn float_options(context: usize, ar: Vec<usize>) -> CompileOptions {
    let mut o = CompileOptions::new(context, ar);
    o.kv_dtype = DataType::F32;
    o.weights = WeightType::F32;
    o
}

/// Greedy from BOS for `steps` tokens through the AR-1 graph and the float model, token for
/// token; returns the greedy sequence.
fn greedy_matches_float(ckpt: &Checkpoint, opts: &CompileOptions, steps: usize) -> Vec<u32> {
    let model = test_support::compile::compile_ckpt(ckpt, &[], opts).expect("compile");
    let g1 = model.graph_for_ar(1).expect("AR-1 graph");
    let mut harness = Harness::for_model(&model);
    let mut fm = FloatModel::new(Arc::new(ckpt.clone()));
    let mut tok = Tokenizer::BOS;
    let mut seq = vec![tok];
    let mut worst = 0.0f32;
    for pos in 0..steps {
        let want = fm.forward(tok, pos).expect("float forward").to_vec();
        let got = harness.step(g1, &[tok]);
        let diff = max_abs_diff(&want, &got);
        worst = worst.max(diff);
        assert!(
            diff <= TOL,
            "position {pos}: max |logit diff| {diff} > {TOL}"
        );
        let a = model::ops::argmax(&want);
        assert_eq!(
            a,
            model::ops::argmax(&got),
            "position {pos}: greedy token differs"
        );
        tok = a as u32;
        seq.push(tok);
    }
    eprintln!("{steps} greedy steps: max |logit diff| {worst:e}");
    seq
}

/// Runs `seq` through AR-1 only, and through AR-`n` chunks (the last one partial) for the
/// first `prefill` tokens followed by AR-1; the logits of every position must agree.
fn prefill_equals_ar1(
    ckpt: &Checkpoint,
    opts: &CompileOptions,
    prompts: &[Vec<u32>],
    n: usize,
    seq: &[u32],
    prefill: usize,
) -> f32 {
    let model = test_support::compile::compile_ckpt(ckpt, prompts, opts).expect("compile");
    let g1 = model.graph_for_ar(1).expect("AR-1 graph");
    let gn = model.graph_for_ar(n).expect("AR-n graph");
    let v = ckpt.config.vocab_size;

    let mut a = Harness::for_model(&model);
    let mut ar1 = Vec::new();
    for &t in seq {
        ar1.extend(a.step(g1, &[t]));
    }

    let mut b = Harness::for_model(&model);
    let mut mixed = Vec::new();
    for chunk in seq[..prefill].chunks(n) {
        mixed.extend(b.step(gn, chunk));
    }
    for &t in &seq[prefill..] {
        mixed.extend(b.step(g1, &[t]));
    }
    assert_eq!(ar1.len(), seq.len() * v);
    let mut worst = 0.0f32;
    for p in 0..seq.len() {
        let d = max_abs_diff(&ar1[p * v..(p + 1) * v], &mixed[p * v..(p + 1) * v]);
        assert!(
            d <= TOL,
            "position {p}: AR-{n} prefill vs AR-1 max |logit diff| {d} > {TOL}"
        );
        worst = worst.max(d);
    }
    worst
}

#[test]
fn synthetic_f32_greedy_matches_float_model() {
    for shared in [true, false] {
        let ckpt = test_support::stories::synthetic(shared);
        for (layout, gran) in [
            (KLayout::Rows, Granularity::PerHead),
            (KLayout::Transposed, Granularity::PerHead),
            (KLayout::Rows, Granularity::PerLayer),
            (KLayout::Transposed, Granularity::PerLayer),
        ] {
            let mut o = float_options(64, vec![1, 8]);
            o.k_layout = layout;
            o.granularity = gran;
            greedy_matches_float(&ckpt, &o, 40);
        }
    }
}

#[test]
fn synthetic_prefill_equals_ar1() {
    let ckpt = test_support::stories::synthetic(true);
    let seq: Vec<u32> = (0..30u32).map(|i| (i * 11 + 3) % 64).collect();
    for kv in [DataType::F32, DataType::F16, DataType::U16, DataType::U8] {
        for weights in [WeightType::F32, WeightType::I8] {
            for layout in [KLayout::Rows, KLayout::Transposed] {
                let mut o = float_options(64, vec![1, 8]);
                o.kv_dtype = kv;
                o.weights = weights;
                o.k_layout = layout;
                o.calibration_tokens = 24;
                let prompts = test_support::stories::synthetic_prompts(64);
                prefill_equals_ar1(&ckpt, &o, &prompts, 8, &seq, 20);
            }
        }
    }
}

#[test]
fn stories260k_f32_greedy_256_and_prefill() {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let opts = float_options(512, vec![1, 32]);
    let seq = greedy_matches_float(&ckpt, &opts, 256);
    let text = String::from_utf8_lossy(&tok.decode(&seq[..40])).into_owned();
    assert!(
        text.contains("Once upon a time"),
        "greedy text does not look like the known output: {text:?}"
    );
    // AR-32 prefill of 72 tokens (two full chunks and a partial one), then AR-1 to 100.
    let worst = prefill_equals_ar1(&ckpt, &opts, &[], 32, &seq[..100], 72);
    eprintln!("f32 AR-32 prefill vs AR-1: max |logit diff| {worst:e}");
    // The same with the quantized configuration.
    let mut q = opts.clone();
    q.kv_dtype = DataType::U8;
    q.weights = WeightType::I8;
    let prompts = test_support::stories::default_prompts(&tok);
    let worst = prefill_equals_ar1(&ckpt, &q, &prompts, 32, &seq[..100], 72);
    eprintln!("u8 KV / i8 weights AR-32 prefill vs AR-1: max |logit diff| {worst:e}");
}
