//! GPTQ rounding of integer weights ([`ref_backend::Rounding::Gptq`], the default) on
//! stories260K, against to-nearest rounding of the same build: only the integer values change
//! (every row keeps its scale, so the encodings the HTP runs are the same), and every layer's
//! matrix products over a text the calibration did not contain come closer to the float ones.

use std::sync::Arc;

use model::llama2c::Checkpoint;
use model::{FloatModel, LayerTensor, LlamaConfig, Site, Tap, Tensor, WeightSource};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, Recipe, Rounding, WeightType, smoothed_weights};

const TEXT: &str = "Once upon a time, there was a little boy named Tim. Tim had a red ball. He \
    liked to play with his ball in the park. One day, he saw a big dog. The dog wanted the ball \
    too. Tim was scared, but then he shared his ball and they played together all day.";

fn build(ckpt: &Checkpoint, c: &LlamaConfig, wt: WeightType, rounding: Rounding) -> CompiledModel {
    let mut o = CompileOptions::new(256, vec![1]);
    o.kv_dtype = DataType::U16;
    o.weights = wt;
    let tok = test_support::stories::stories260k_loaded().1;
    let prompts = test_support::stories::default_prompts(&tok);
    let recipe = Recipe {
        rounding,
        ..Recipe::DEFAULT
    };
    ref_backend::compile_with(c, ckpt, &prompts, (&o, recipe), ckpt.sha256(), &mut |_| {})
        .expect("compile")
}

/// Every matrix product's input over the text, per layer and [`Site`].
#[derive(Default)]
struct Inputs(Vec<(usize, Site, Vec<f32>)>);

impl Tap for Inputs {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        if matches!(
            site,
            Site::AttnInput | Site::AttnOutput | Site::FfnInput | Site::FfnHidden
        ) {
            self.0.push((layer, site, values.to_vec()));
        }
    }
}

fn input_site(t: LayerTensor) -> Site {
    match t {
        LayerTensor::Q | LayerTensor::K | LayerTensor::V => Site::AttnInput,
        LayerTensor::O => Site::AttnOutput,
        LayerTensor::Gate | LayerTensor::Up => Site::FfnInput,
        _ => Site::FfnHidden,
    }
}

/// The seven matrices of a layer, listed here rather than taken from the compiler (the tests
/// are an oracle for which input feeds which matrix).
pub(crate) const MATRICES: [LayerTensor; 7] = [
    LayerTensor::Q,
    LayerTensor::K,
    LayerTensor::V,
    LayerTensor::O,
    LayerTensor::Gate,
    LayerTensor::Up,
    LayerTensor::Down,
];

/// `Σ_x |(W - Ŵ) x|²` of matrix `t` of `q` over the inputs, `W` the f32 weights it was
/// quantized from.
fn output_error(q: &CompiledModel, w: &dyn WeightSource, t: Tensor, inputs: &Inputs) -> f64 {
    let (Tensor::Layer(l, lt), Some(m)) = (t, q.i8_matrix(t)) else {
        panic!("{t} is not an i8 layer matrix")
    };
    let f32w = w.tensor(t).expect("present");
    let mut err = 0.0;
    for (_, _, x) in inputs
        .0
        .iter()
        .filter(|(il, s, _)| *il == l && *s == input_site(lt))
    {
        for r in 0..m.rows {
            let row = r * m.cols..(r + 1) * m.cols;
            let e: f64 = (f32w[row.clone()].iter().zip(&m.q[row]).zip(x))
                .map(|((&w, &q), &x)| f64::from(w - f32::from(q) * m.scales[r]) * f64::from(x))
                .sum();
            err += e * e;
        }
    }
    err
}

#[test]
fn gptq_keeps_every_scale_and_lowers_every_layers_output_error_on_unseen_text() {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let c = model::llama2c::llama_config(&ckpt.config);
    let tokens = tok.encode(TEXT, true, false);
    for wt in [WeightType::I8, WeightType::I4] {
        let nearest = build(&ckpt, &c, wt, Rounding::Nearest);
        let gptq = build(&ckpt, &c, wt, Rounding::Gptq);
        // The f32 weights both were quantized from (the same FFN fold: the same scales).
        let w = Arc::new(smoothed_weights(&gptq, &ckpt));
        let mut float = FloatModel::new(c.clone(), w.clone(), tokens.len()).expect("float");
        let mut inputs = Inputs::default();
        for (pos, &t) in tokens.iter().enumerate() {
            float.forward_tapped(t, pos, &mut inputs).expect("forward");
        }
        let (mut changed, mut values) = (0, 0);
        for l in 0..c.n_layers {
            for lt in MATRICES {
                let t = Tensor::Layer(l, lt);
                let (a, b) = (nearest.i8_matrix(t).unwrap(), gptq.i8_matrix(t).unwrap());
                assert_eq!(a.scales, b.scales, "{} {t}: the scales differ", wt.name());
                changed += a.q.iter().zip(b.q).filter(|(x, y)| x != y).count();
                values += a.q.len();
                let (en, eg) = (
                    output_error(&nearest, &*w, t, &inputs),
                    output_error(&gptq, &*w, t, &inputs),
                );
                eprintln!(
                    "{} {t}: output error {eg:.3e} (nearest {en:.3e})",
                    wt.name()
                );
                assert!(
                    eg < en,
                    "{} {t}: GPTQ {eg:.3e} against nearest {en:.3e}",
                    wt.name()
                );
            }
        }
        assert!(
            changed * 20 > values,
            "{}: {changed} of {values} values changed",
            wt.name()
        );
    }
}
