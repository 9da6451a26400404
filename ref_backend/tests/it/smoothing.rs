//! The FFN smoothing of i8 builds ([`ref_backend::FFN_SMOOTHING`]) on stories260K: the fold
//! happens, it is exact in f32 (the folded float model's logits equal the original's), the
//! smoothed down input's encoding covers what calibration saw (and reaches it within the
//! margin), and builds other than i8 are untouched.

use std::sync::Arc;

use model::llama2c::{Checkpoint, Tokenizer};
use model::{FloatModel, LlamaConfig, Site, Tap, WeightSource};
use quant::DataType;
use ref_backend::{
    ActSite, CompileOptions, CompiledModel, FFN_SMOOTHING, Recipe, WeightType,
    ffn_smoothing_factors, smoothed_weights,
};
use test_support::harness::max_abs_diff;

/// Positions compared between the folded and the original float model.
const STEPS: usize = 64;

fn options(weights: WeightType) -> CompileOptions {
    let mut o = CompileOptions::new(256, vec![1]);
    o.kv_dtype = DataType::U16;
    o.weights = weights;
    o
}

fn stories() -> (Checkpoint, Tokenizer, LlamaConfig) {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let c = model::llama2c::llama_config(&ckpt.config);
    (ckpt, tok, c)
}

fn compiled(
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    c: &LlamaConfig,
    wt: WeightType,
) -> Arc<CompiledModel> {
    test_support::compile::compile(ckpt, tok, c, &options(wt))
}

#[test]
fn the_ffn_fold_happens_and_is_exact_in_f32() {
    let (ckpt, tok, c) = stories();
    let q = compiled(&ckpt, &tok, &c, WeightType::I8);
    let factors = ffn_smoothing_factors(&q, &ckpt);
    assert_eq!(factors.len(), c.n_layers);
    let channels = c.n_layers * c.hidden_dim;
    let moved = factors
        .iter()
        .flatten()
        .filter(|s| (*s - 1.0).abs() > 0.01)
        .count();
    assert!(
        moved * 2 > channels,
        "only {moved} of {channels} channels smoothed by more than 1%"
    );
    let folded = smoothed_weights(&q, &ckpt);
    let mut original = FloatModel::new(c.clone(), Arc::new(ckpt.clone()), STEPS).expect("float");
    let mut smoothed = FloatModel::new(c.clone(), Arc::new(folded), STEPS).expect("folded");
    let (mut token, mut worst) = (Tokenizer::BOS, 0.0f32);
    for pos in 0..STEPS {
        let want = original.forward(token, pos).expect("forward").to_vec();
        let got = smoothed.forward(token, pos).expect("forward");
        worst = worst.max(max_abs_diff(&want, got));
        token = model::ops::argmax(&want) as u32;
    }
    assert!(
        worst <= 1e-4,
        "max |logit diff| {worst} over {STEPS} positions"
    );
}

/// The folded model's down inputs, and the largest of them relative to the encoding's end on
/// its side (1 at the end), per layer.
struct Reach<'a> {
    q: &'a CompiledModel,
    outside: usize,
    reach: Vec<f32>,
}

impl Tap for Reach<'_> {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        if site != Site::FfnHidden {
            return;
        }
        let so = self
            .q
            .activation_encoding(layer, ActSite::FfnMid)
            .expect("i8");
        let (lo, hi) = so.representable_range(DataType::I16).expect("i16");
        for &v in values {
            self.outside += usize::from(v < lo || v > hi);
            let r = if v >= 0.0 { v / hi } else { v / lo };
            self.reach[layer] = self.reach[layer].max(r);
        }
    }
}

/// Calibration's sequences (the engine's prompts continued greedily by the float model to
/// `calibration_tokens`, as `ref_backend::compile` continues them) run through the folded
/// float model: every smoothed down input lies inside its encoding, and in every layer the
/// largest reaches `1 / margin` of it (the range is the observed one widened by the margin).
#[test]
fn the_smoothed_down_input_encoding_covers_calibration_by_the_margin() {
    let (ckpt, tok, c) = stories();
    let q = compiled(&ckpt, &tok, &c, WeightType::I8);
    let len = q.options().calibration_tokens.min(q.options().context);
    let folded = Arc::new(smoothed_weights(&q, &ckpt));
    let mut tap = Reach {
        q: &q,
        outside: 0,
        reach: vec![0.0; c.n_layers],
    };
    let stop = c.special.stop_tokens();
    for prompt in q.calibration() {
        let mut original = FloatModel::new(c.clone(), Arc::new(ckpt.clone()), len).expect("f");
        let mut smoothed = FloatModel::new(c.clone(), Arc::clone(&folded), len).expect("f");
        let mut seq: Vec<u32> = prompt.iter().copied().take(len).collect();
        let mut pos = 0;
        while pos < seq.len() {
            smoothed
                .forward_tapped(seq[pos], pos, &mut tap)
                .expect("forward");
            let next = model::ops::argmax(original.forward(seq[pos], pos).expect("forward"));
            let next = next as u32;
            pos += 1;
            if pos == seq.len()
                && seq.len() < len
                && Some(next) != c.special.bos
                && !stop.contains(&next)
            {
                seq.push(next);
            }
        }
    }
    assert_eq!(
        tap.outside, 0,
        "smoothed down inputs outside their encoding"
    );
    let want = 1.0 / FFN_SMOOTHING.margin;
    for (l, &r) in tap.reach.iter().enumerate() {
        assert!(
            (r - want).abs() <= want * 1e-3,
            "layer {l}: the down input reaches {r} of its encoding, not 1/margin = {want}"
        );
    }
}

/// f16, f32 and i4 weights: the smoothing is not applied (the same file as without it), and
/// no factors are recovered; i8: the file differs.
#[test]
fn only_i8_builds_are_smoothed() {
    let (ckpt, tok, c) = stories();
    let prompts = test_support::stories::default_prompts(&tok);
    for wt in [
        WeightType::F16,
        WeightType::F32,
        WeightType::I4,
        WeightType::I8,
    ] {
        let o = options(wt);
        let build = |smooth| {
            ref_backend::compile_with(
                &c,
                &ckpt,
                &prompts,
                (
                    &o,
                    Recipe {
                        ffn_smoothing: smooth,
                        ..Recipe::DEFAULT
                    },
                ),
                ckpt.sha256(),
                &mut |_| {},
            )
            .expect("compile")
            .to_bytes()
        };
        let same = build(Some(FFN_SMOOTHING)) == build(None);
        assert_eq!(same, wt != WeightType::I8, "{}", wt.name());
    }
    let f16 = compiled(&ckpt, &tok, &c, WeightType::F16);
    assert!(ffn_smoothing_factors(&f16, &ckpt).is_empty());
    let w: &dyn WeightSource = &smoothed_weights(&f16, &ckpt);
    let t = model::Tensor::Layer(0, model::LayerTensor::Up);
    assert_eq!(w.tensor(t), ckpt.tensor(t));
}
