//! `i4` builds on stories260K: which matrices are on QNN's blockwise-expansion grid, and the
//! multipliers the HTP lowering recovers ([`ref_backend::lpbq_multipliers`]), checked here
//! against the definition (each block's multiplier is its largest |w| over 7, in units of the
//! row's scale, rounded into [1, 15]) computed from the f32 weights without the crate's grid code.

use model::{LayerTensor, Tensor, WeightSource};
use quant::DataType;
use ref_backend::{
    CompileError, CompileOptions, CompiledModel, LPBQ_BLOCK, WeightType, lpbq_multipliers,
};

/// The layer matrices an i4 build keeps at 8 bits, as the documentation states them (written
/// here, not read from the crate).
const KEPT_AT_8_BITS: [LayerTensor; 2] = [LayerTensor::V, LayerTensor::Down];

fn build() -> (CompiledModel, model::llama2c::Checkpoint) {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let mut o = CompileOptions::new(64, vec![1]);
    o.kv_dtype = DataType::U8;
    o.weights = WeightType::I4;
    let prompts = test_support::stories::default_prompts(&tok);
    let c = model::llama2c::llama_config(&ckpt.config);
    let m = ref_backend::compile(&c, &ckpt, &prompts, &o, ckpt.sha256(), &mut |_| {}).unwrap();
    (m, ckpt)
}

/// The multipliers of one row by the definition: `round((max|w| of the block / 7) / scale)`
/// clamped to [1, 15].
fn by_definition(row: &[f32], scale: f32) -> Vec<u8> {
    row.chunks(LPBQ_BLOCK)
        .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())) / 7.0)
        .map(|s| (s / scale).round().clamp(1.0, 15.0) as u8)
        .collect()
}

#[test]
fn i4_builds_put_every_layer_matrix_but_v_and_down_on_the_lpbq_grid() {
    let (m, ckpt) = build();
    let c = m.config().clone();
    for l in 0..c.n_layers {
        for lt in crate::gptq::MATRICES {
            let t = Tensor::Layer(l, lt);
            let got = lpbq_multipliers(&m, t, &ckpt).unwrap();
            // stories260K's down has 172 inputs, not whole blocks: it stays i8 either way.
            let four_bit = !KEPT_AT_8_BITS.contains(&lt) && lt != LayerTensor::Down;
            assert_eq!(got.is_some(), four_bit, "{t}");
            let i8m = m.i8_matrix(t).unwrap();
            let Some(got) = got else {
                // On the i8 grid: some value is outside the 4-bit products' reach or odd-sized.
                assert!(i8m.q.iter().any(|&v| v.unsigned_abs() > 120), "{t}");
                continue;
            };
            let w = ckpt.tensor(t).unwrap();
            for (r, row) in w.chunks(i8m.cols).enumerate() {
                let per_row = i8m.cols / LPBQ_BLOCK;
                let want = by_definition(row, i8m.scales[r]);
                assert_eq!(got[r * per_row..(r + 1) * per_row], want, "{t} row {r}");
            }
        }
    }
    assert_eq!(
        lpbq_multipliers(&m, Tensor::TokenEmbedding, &ckpt).unwrap(),
        None
    );
}

/// Weights other than the ones compiled are refused, naming the matrix.
#[test]
fn lpbq_multipliers_refuse_other_weights() {
    let (m, ckpt) = build();
    let t = Tensor::Layer(0, LayerTensor::Q);
    let mut doubled = ckpt.tensor(t).unwrap().to_vec();
    doubled.iter_mut().for_each(|v| *v *= 2.0);
    let other = Other { t, data: doubled };
    let err = lpbq_multipliers(&m, t, &other).unwrap_err();
    assert!(matches!(err, CompileError::WeightsMismatch { .. }), "{err}");
    assert!(err.to_string().contains("layer 0 Q"), "{err}");
}

struct Other {
    t: Tensor,
    data: Vec<f32>,
}

impl WeightSource for Other {
    fn tensor(&self, t: Tensor) -> Option<&[f32]> {
        (t == self.t).then_some(self.data.as_slice())
    }
}
