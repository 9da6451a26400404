//! Calibration runs its sequences in lockstep (one row per sequence in each float pass); the
//! encodings must be those of the float model run over each sequence alone, continued greedily
//! the same way. With i8 weights the down projection's input is smoothed
//! ([`ref_backend::FFN_SMOOTHING`]): its encoding is derived here from each channel's observed
//! range and the factors' formula, independently of the compiler's code.

use std::sync::Arc;

use model::{FloatModel, LayerTensor, LlamaConfig, Site, Tap, Tensor, WeightSource};
use quant::{DataType, MinMaxObserver, Observer, ScaleOffset, Symmetry};
use ref_backend::{ActSite, CompileOptions, FFN_SMOOTHING, WeightType};

/// Min–max observers of what calibration observes, fed by [`FloatModel`] one sequence at a
/// time.
struct Expected {
    c: LlamaConfig,
    /// `layer * 4 + site`, then the classifier input.
    act: Vec<MinMaxObserver>,
    /// `(layer * n_kv_heads + head) * 2 + (0 K | 1 V)`.
    kv: Vec<MinMaxObserver>,
    /// Per layer and channel of the down input: `(min, max)`.
    ffn: Vec<Vec<(f32, f32)>>,
}

impl Tap for Expected {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        let act = match site {
            Site::AttnInput => Some(layer * 4),
            Site::AttnOutput => Some(layer * 4 + 1),
            Site::FfnInput => Some(layer * 4 + 2),
            Site::FfnHidden => Some(layer * 4 + 3),
            Site::FinalNorm => Some(self.c.n_layers * 4),
            _ => None,
        };
        if let Some(i) = act {
            self.act[i].observe(values);
        }
        if site == Site::FfnHidden {
            for (r, &v) in self.ffn[layer].iter_mut().zip(values) {
                *r = (r.0.min(v), r.1.max(v));
            }
        }
        let value = match site {
            Site::Key => 0,
            Site::Value => 1,
            _ => return,
        };
        for (h, head) in values.chunks_exact(self.c.head_dim).enumerate() {
            self.kv[(layer * self.c.n_kv_heads + h) * 2 + value].observe(head);
        }
    }
}

fn encoding(o: &MinMaxObserver, dtype: DataType) -> ScaleOffset {
    o.encoding(dtype, Symmetry::Asymmetric).expect("observed")
}

/// The i16 encoding of layer `l`'s smoothed down input: channel `c` divided by
/// `s_c = max|x_c|^alpha / max|Down[:, c]|^(1 - alpha)`, the range of the results widened by the
/// margin.
fn smoothed_encoding(w: &dyn WeightSource, l: usize, ranges: &[(f32, f32)]) -> ScaleOffset {
    let down = w.tensor(Tensor::Layer(l, LayerTensor::Down)).expect("down");
    let hidden = ranges.len();
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for (ch, &(min, max)) in ranges.iter().enumerate() {
        let wmax = (0..down.len() / hidden).fold(0f32, |m, r| m.max(down[r * hidden + ch].abs()));
        let xmax = min.abs().max(max.abs());
        let s = xmax.powf(FFN_SMOOTHING.alpha) / wmax.powf(1.0 - FFN_SMOOTHING.alpha);
        let s = if s.is_normal() { s } else { 1.0 };
        (lo, hi) = (lo.min(min / s), hi.max(max / s));
    }
    let m = FFN_SMOOTHING.margin;
    ScaleOffset::from_range(lo * m, hi * m, DataType::I16, Symmetry::Asymmetric).expect("range")
}

/// Also with a sliding window on layer 0 (calibration attends over its last 4 positions, as the
/// float model does).
#[test]
fn lockstep_calibration_equals_one_sequence_at_a_time() {
    let ckpt = test_support::stories::synthetic(true);
    let plain = model::llama2c::llama_config(&ckpt.config);
    lockstep_equals_one_at_a_time(&ckpt, plain.clone());
    lockstep_equals_one_at_a_time(&ckpt, plain.with_layer_windows(&[0], 4));
}

fn lockstep_equals_one_at_a_time(ckpt: &model::llama2c::Checkpoint, c: LlamaConfig) {
    // Different lengths: some are continued greedily, one is cut at the limit.
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 5, 9],
        vec![2, 3, 4, 7, 8, 11, 13, 17, 19, 23, 29, 31, 37, 41],
        vec![6],
        vec![12, 40, 33, 3, 5],
    ];
    let mut o = CompileOptions::new(32, vec![1, 4]);
    o.kv_dtype = DataType::U16;
    o.weights = WeightType::I8;
    o.calibration_tokens = 10;
    let q =
        ref_backend::compile(&c, ckpt, &prompts, &o, ckpt.sha256(), &mut |_| {}).expect("compile");

    let mut want = Expected {
        c: c.clone(),
        act: (0..c.n_layers * 4 + 1)
            .map(|_| MinMaxObserver::new())
            .collect(),
        kv: (0..c.n_layers * c.n_kv_heads * 2)
            .map(|_| MinMaxObserver::new())
            .collect(),
        ffn: vec![vec![(f32::INFINITY, f32::NEG_INFINITY); c.hidden_dim]; c.n_layers],
    };
    let stop = c.special.stop_tokens();
    let mut fm = FloatModel::new(c.clone(), Arc::new(ckpt.clone()), 10).expect("float model");
    for p in &prompts {
        let mut seq: Vec<u32> = p.iter().copied().take(10).collect();
        let mut pos = 0;
        while pos < seq.len() {
            let next = model::ops::argmax(fm.forward_tapped(seq[pos], pos, &mut want).unwrap());
            pos += 1;
            let next = next as u32;
            if pos == seq.len()
                && seq.len() < 10
                && Some(next) != c.special.bos
                && !stop.contains(&next)
            {
                seq.push(next);
            }
        }
    }
    for l in 0..c.n_layers {
        for (s, site) in ActSite::ALL.into_iter().enumerate() {
            let got = q.activation_encoding(l, site).expect("i8 weights");
            let expected = match site {
                ActSite::FfnMid => smoothed_encoding(ckpt, l, &want.ffn[l]),
                _ => encoding(&want.act[l * 4 + s], DataType::I16),
            };
            assert_eq!(got, expected, "{l} {site:?}");
        }
        for h in 0..c.n_kv_heads {
            for value in [false, true] {
                let got = q.kv_spec(l, h, value).expect("in range").encoding.clone();
                let i = (l * c.n_kv_heads + h) * 2 + usize::from(value);
                // The observed range, both ends widened by the margin.
                let (lo, hi) = want.kv[i].range().expect("observed");
                let m = ref_backend::U16_KV_MARGIN;
                let so =
                    ScaleOffset::from_range(lo * m, hi * m, DataType::U16, Symmetry::Asymmetric)
                        .expect("range");
                assert_eq!(got, quant::Encoding::PerTensor(so), "{l} {h} {value}");
            }
        }
    }
    let got = q.classifier_input_encoding().expect("i8 weights");
    assert_eq!(got, encoding(&want.act[c.n_layers * 4], DataType::I16));
}
