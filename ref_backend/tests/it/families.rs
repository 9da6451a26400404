//! A model whose description holds every property a family adds to the Llama block (Gemma 3's
//! four norms, q/k norms, GELU-tanh, scaled embedding, its own attention scale, window layers
//! with a RoPE base of their own, plus partial rotary, LongRoPE and a soft-cap): the executor's
//! f32 graphs reproduce the float model, quantized graphs stay close to it, and the compiled file
//! keeps the description (format version 6, key–value metadata).

use std::collections::HashMap;
use std::sync::Arc;

use model::llama2c::Checkpoint;
use model::{Activation, FloatModel, LayerTensor as L, LlamaConfig, Overlay, RopePairing, Tensor};
use quant::DataType;
use ref_backend::format::DESC_FORMAT_VERSION;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use test_support::harness::{logits_ar4_then_ar1, max_abs_diff};

const CONTEXT: usize = 32;

/// The synthetic checkpoint's description with every block property; window 6 on layer 0.
fn described(ckpt: &Checkpoint) -> LlamaConfig {
    let mut c = model::llama2c::llama_config(&ckpt.config).with_layer_windows(&[0], 6);
    let b = &mut c.block;
    (b.qk_norm, b.post_attention_norm, b.post_ffn_norm) = (true, true, true);
    b.activation = Activation::GeluTanh;
    b.attention_scale = Some(0.3);
    c.embed_scale = Some((c.dim as f32).sqrt());
    c.final_softcap = Some(8.0);
    c.rope.pairing = RopePairing::HalfSplit;
    c.rope.rotated = Some(c.head_dim / 2);
    c.rope.theta = 1e6;
    c.rope.window_theta = Some(100.0);
    // LongRoPE, bound to its short set: the graphs' context is within the original context.
    let pairs = c.head_dim / 4;
    let short: Vec<f32> = (0..pairs).map(|i| 1.0 + 0.25 * i as f32).collect();
    c.rope.freq_factors = Some(short.clone());
    c.rope.long_rope = Some(model::LongRope {
        short,
        long: vec![4.0; pairs],
        original_context: CONTEXT,
    });
    c.rope.attn_factor = Some(1.2);
    c
}

/// Norm weights near 1 for the tensors the checkpoint lacks.
fn with_norms(c: &LlamaConfig) -> HashMap<Tensor, Vec<f32>> {
    let mut extra = HashMap::new();
    for l in 0..c.n_layers {
        for lt in [L::QNorm, L::KNorm, L::PostAttnNorm, L::PostFfnNorm] {
            let t = Tensor::Layer(l, lt);
            let v = (0..t.len(c)).map(|i| 1.0 + ((i * 7 + l * 3) % 11) as f32 / 20.0);
            extra.insert(t, v.collect());
        }
    }
    extra
}

fn compile(c: &LlamaConfig, w: &Overlay<'_>, kv: DataType, wt: WeightType) -> CompiledModel {
    let mut o = CompileOptions::new(CONTEXT, vec![1, 4]);
    (o.kv_dtype, o.weights, o.calibration_tokens) = (kv, wt, 16);
    let prompts = test_support::stories::synthetic_prompts(64);
    ref_backend::compile(c, w, &prompts, &o, [7; 32], &mut |_| {}).unwrap()
}

fn tokens() -> Vec<u32> {
    (0..20u32).map(|i| (i * 37 + 1) % 64).collect()
}

fn oracle(c: &LlamaConfig, w: Overlay<'static>, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut fm = FloatModel::new(c.clone(), Arc::new(w), CONTEXT).unwrap();
    (tokens.iter().enumerate())
        .map(|(p, &t)| fm.forward(t, p).unwrap().to_vec())
        .collect()
}

fn worst(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    (got.iter().zip(want))
        .map(|(g, w)| max_abs_diff(g, w))
        .fold(0.0, f32::max)
}

#[test]
fn every_block_property_runs_in_the_executor_as_in_the_float_model() {
    let ckpt: &'static Checkpoint = Box::leak(Box::new(test_support::stories::synthetic(true)));
    let c = described(ckpt);
    let w = || Overlay::new(ckpt, with_norms(&c));
    let tokens = tokens();
    let want = oracle(&c, w(), &tokens);
    let plain = oracle(&model::llama2c::llama_config(&ckpt.config), w(), &tokens);
    let effect = worst(&plain, &want);
    assert!(
        effect > 0.5,
        "the properties must change the logits ({effect})"
    );
    let f32_model = compile(&c, &w(), DataType::F32, WeightType::F32);
    let d = worst(&logits_ar4_then_ar1(&f32_model, &tokens), &want);
    assert!(d < 1e-4, "f32 graphs: max |logit diff| {d}");
    let q = compile(&c, &w(), DataType::U16, WeightType::I8);
    let d = worst(&logits_ar4_then_ar1(&q, &tokens), &want);
    eprintln!("u16/i8: max |logit diff| {d} (the properties' own effect {effect})");
    assert!(
        d < effect / 4.0,
        "u16/i8: {d} against the properties' effect {effect}"
    );
}

#[test]
fn the_file_keeps_the_description_as_version_6() {
    let ckpt: &'static Checkpoint = Box::leak(Box::new(test_support::stories::synthetic(true)));
    let c = described(ckpt);
    let model = compile(
        &c,
        &Overlay::new(ckpt, with_norms(&c)),
        DataType::U16,
        WeightType::I8,
    );
    let bytes = model.to_bytes();
    assert_eq!(bytes[8..12], DESC_FORMAT_VERSION.to_le_bytes());
    let back = CompiledModel::from_bytes(&bytes, "families").unwrap();
    assert_eq!(back.config(), &c);
    assert_eq!(back.to_bytes(), bytes);
    // A Llama-block model keeps the older layout (its caches stay valid).
    let plain = model::llama2c::llama_config(&ckpt.config);
    let m = compile(
        &plain,
        &Overlay::new(ckpt, HashMap::new()),
        DataType::U16,
        WeightType::I8,
    );
    assert_ne!(m.to_bytes()[8..12], DESC_FORMAT_VERSION.to_le_bytes());
}

/// LongRoPE past its original context: a description loaded with its short factors, compiled for
/// a longer context, runs the long ones in the graphs, as the float model of that context does.
#[test]
fn a_context_past_the_original_one_runs_the_long_factors() {
    let ckpt: &'static Checkpoint = Box::leak(Box::new(test_support::stories::synthetic(true)));
    let short = described(ckpt);
    let mut c = short.clone();
    if let Some(l) = c.rope.long_rope.as_mut() {
        l.original_context = CONTEXT / 2;
    }
    let w = || Overlay::new(ckpt, with_norms(&c));
    let tokens = tokens();
    let want = oracle(&c, w(), &tokens);
    let effect = worst(&oracle(&short, w(), &tokens), &want);
    assert!(
        effect > 0.1,
        "long and short factors must differ ({effect})"
    );
    let f32_model = compile(&c, &w(), DataType::F32, WeightType::F32);
    let d = worst(&logits_ar4_then_ar1(&f32_model, &tokens), &want);
    assert!(d < 1e-4, "f32 graphs past the original context: {d}");
}
