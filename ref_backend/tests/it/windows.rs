//! Per-layer attention windows in the executor: a sliding layer's past tensors hold `W - 1` rows
//! and read their own mask `attention_mask_w{W}`; in f32 the graphs reproduce the windowed float
//! model, quantized they stay close to it, and the file records the windows (a damaged windows
//! section is a typed error).

use std::sync::Arc;

use model::llama2c::Checkpoint;
use model::{FloatModel, LlamaConfig};
use quant::DataType;
use ref_backend::format::{FORMAT_VERSION, WINDOWS_FORMAT_VERSION};
use ref_backend::{CompileOptions, CompiledModel, FormatError, IoRole, WeightType};
use test_support::harness::{logits_ar4_then_ar1, max_abs_diff};

const CONTEXT: usize = 32;
const WINDOW: usize = 8;

/// The synthetic model with window 8 on layer 0 (layer 1 global).
fn windowed(ckpt: &Checkpoint) -> LlamaConfig {
    model::llama2c::llama_config(&ckpt.config).with_layer_windows(&[0], WINDOW)
}

fn options(kv: DataType, weights: WeightType) -> CompileOptions {
    let mut o = CompileOptions::new(CONTEXT, vec![1, 4]);
    o.kv_dtype = kv;
    o.weights = weights;
    o.calibration_tokens = 16;
    o
}

fn compile(
    ckpt: &Checkpoint,
    config: &LlamaConfig,
    o: &CompileOptions,
) -> Result<CompiledModel, ref_backend::CompileError> {
    let prompts = test_support::stories::synthetic_prompts(64);
    ref_backend::compile(config, ckpt, &prompts, o, ckpt.sha256(), &mut |_| {})
}

fn tokens() -> Vec<u32> {
    (0..30u32).map(|i| (i * 37 + 1) % 64).collect()
}

/// The float model's logits at every position of `tokens`.
fn oracle(ckpt: &Checkpoint, config: &LlamaConfig, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut fm = FloatModel::new(config.clone(), Arc::new(ckpt.clone()), CONTEXT).unwrap();
    (tokens.iter().enumerate())
        .map(|(p, &t)| fm.forward(t, p).unwrap().to_vec())
        .collect()
}

#[test]
fn a_sliding_layer_takes_w_minus_1_past_rows_and_its_own_mask() {
    let ckpt = test_support::stories::synthetic(true);
    let model = compile(
        &ckpt,
        &windowed(&ckpt),
        &options(DataType::U16, WeightType::I8),
    )
    .unwrap();
    for g in model.graphs() {
        let n = g.ar();
        let masks: Vec<(&str, &[usize])> = (g.inputs().iter())
            .filter(|t| t.role == IoRole::Mask)
            .map(|t| (t.name.as_str(), t.shape.as_slice()))
            .collect();
        assert_eq!(
            masks,
            [
                ("attention_mask", &[1, 1, n, CONTEXT][..]),
                ("attention_mask_w8", &[1, 1, n, WINDOW - 1 + n][..])
            ]
        );
        for t in g.inputs().iter().filter(|t| t.role == IoRole::PastKey) {
            let rows = if t.layer == Some(0) {
                WINDOW - 1
            } else {
                CONTEXT - n
            };
            assert_eq!(t.shape[2], rows, "{}", t.name);
            assert_eq!(g.past_rows(t.layer.unwrap()), rows);
        }
    }
}

#[test]
fn f32_windowed_graphs_match_the_windowed_float_model() {
    let ckpt = test_support::stories::synthetic(true);
    let config = windowed(&ckpt);
    let model = compile(&ckpt, &config, &options(DataType::F32, WeightType::F32)).unwrap();
    let tokens = tokens();
    let want = oracle(&ckpt, &config, &tokens);
    let global = oracle(&ckpt, &model::llama2c::llama_config(&ckpt.config), &tokens);
    assert!(
        max_abs_diff(&want[29], &global[29]) > 1e-3,
        "the window must change the logits for the test to mean anything"
    );
    let got = logits_ar4_then_ar1(&model, &tokens);
    for (p, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = max_abs_diff(g, w);
        assert!(d < 1e-4, "position {p}: max |logit diff| {d}");
    }
}

/// Quantized K/V (and i8 weights) stay close to the windowed float model, much closer than the
/// windows' own effect (the distance to the global float model), so a window the executor ignored
/// or misplaced would fail. Bounds: measured worst |logit diff| (logits reach about 20) x ~1.5.
#[test]
fn quantized_windowed_graphs_stay_close_to_the_windowed_float_model() {
    let ckpt = test_support::stories::synthetic(true);
    let config = windowed(&ckpt);
    let tokens = tokens();
    let want = oracle(&ckpt, &config, &tokens);
    let global = oracle(&ckpt, &model::llama2c::llama_config(&ckpt.config), &tokens);
    let worst = |got: &[Vec<f32>], want: &[Vec<f32>]| {
        (got.iter().zip(want))
            .map(|(g, w)| max_abs_diff(g, w))
            .fold(0.0, f32::max)
    };
    let effect = worst(&global, &want);
    for (kv, weights, bound) in [
        (DataType::U16, WeightType::F32, 0.16),
        (DataType::U16, WeightType::I8, 0.23),
        (DataType::U8, WeightType::I8, 0.21),
    ] {
        let model = compile(&ckpt, &config, &options(kv, weights)).unwrap();
        let got = logits_ar4_then_ar1(&model, &tokens);
        let (near, far) = (worst(&got, &want), worst(&got, &global));
        eprintln!(
            "{kv}/{}: max |logit diff| {near} to the windowed float model, {far} to the global one \
             (windows' effect {effect})",
            weights.name()
        );
        assert!(near < bound, "{kv}/{}: {near}", weights.name());
        assert!(far > 4.0 * near, "{kv}/{}: {far} vs {near}", weights.name());
    }
}

#[test]
fn windows_the_graphs_cannot_take_are_refused_and_long_ones_are_global() {
    let ckpt = test_support::stories::synthetic(true);
    let base = model::llama2c::llama_config(&ckpt.config);
    let o = options(DataType::U16, WeightType::I8);
    // Shorter than the largest AR variant, or longer than S - max(ar) + 1 = 29 but shorter than
    // the context: it would change the answer, but no cache can serve it.
    for w in [2, 30, 31] {
        let e = compile(&ckpt, &base.clone().with_layer_windows(&[1], w), &o).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("layer 1: window {w} must be between")),
            "{text}"
        );
    }
    // A window the context never reaches is a global layer: the same graphs as without it.
    let long = compile(&ckpt, &base.clone().with_layer_windows(&[1], CONTEXT), &o).unwrap();
    let plain = compile(&ckpt, &base, &o).unwrap();
    assert_eq!(long.graphs()[0].inputs(), plain.graphs()[0].inputs());
}

/// Offset of the first u64 after the `WNDS` section's length.
fn windows_body(bytes: &[u8]) -> usize {
    let tag = bytes
        .windows(4)
        .position(|w| w == b"WNDS")
        .expect("a WNDS section");
    tag + 4 + 8
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn the_file_records_the_windows_and_refuses_a_damaged_windows_section() {
    let ckpt = test_support::stories::synthetic(true);
    let model = compile(
        &ckpt,
        &windowed(&ckpt),
        &options(DataType::U16, WeightType::I8),
    )
    .unwrap();
    let bytes = model.to_bytes();
    assert_eq!(bytes[8..12], WINDOWS_FORMAT_VERSION.to_le_bytes());
    let back = CompiledModel::from_bytes(&bytes, "x").unwrap();
    assert_eq!(back, model);
    assert_eq!(back.config().layer_windows, [Some(WINDOW), None]);
    // A model without windows keeps version 3 (older builds read it).
    let plain = compile(
        &ckpt,
        &model::llama2c::llama_config(&ckpt.config),
        &options(DataType::U16, WeightType::I8),
    )
    .unwrap();
    assert_eq!(plain.to_bytes()[8..12], FORMAT_VERSION.to_le_bytes());

    let body = windows_body(&bytes);
    let damaged = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        f(&mut b);
        match CompiledModel::from_bytes(&test_support::harness::reseal(b), "x") {
            Err(FormatError::Corrupt { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    };
    let r = damaged(&|b| put_u64(b, body, 1));
    assert_eq!(r, "1 window(s) for a model of 2 layers");
    let r = damaged(&|b| put_u64(b, body + 8, 0));
    assert_eq!(r, "a windows section whose layers are all global");
    let r = damaged(&|b| put_u64(b, body + 8, 1 << 50));
    assert!(
        r.starts_with("layer window is 1125899906842624, at most"),
        "{r}"
    );
    let r = damaged(&|b| put_u64(b, body + 16, 30));
    assert!(
        r.starts_with(
            "options do not fit the model: invalid geometry: `windows` layer 1: window 30"
        ),
        "{r}"
    );
    // Version 3 has no windows section; version 4 must have one.
    let r = damaged(&|b| b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes()));
    assert!(r.starts_with("expected section CALB"), "{r}");
    let mut b = plain.to_bytes();
    b[8..12].copy_from_slice(&WINDOWS_FORMAT_VERSION.to_le_bytes());
    match CompiledModel::from_bytes(&test_support::harness::reseal(b), "x") {
        Err(FormatError::Corrupt { reason, .. }) => {
            assert!(reason.starts_with("expected section WNDS"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}
