//! `i8f16` builds on stories260K: V and down stay f16 (no i8 matrix, no FFN smoothing), every
//! other matrix is the i8 build's own.

use model::{LayerTensor, Tensor};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};

/// The layer matrices an i8f16 build keeps in f16, as the documentation states them (written here,
/// not read from the crate).
const KEPT_AT_F16: [LayerTensor; 2] = [LayerTensor::V, LayerTensor::Down];

fn build(weights: WeightType) -> CompiledModel {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let mut o = CompileOptions::new(64, vec![1]);
    o.kv_dtype = DataType::U16;
    o.weights = weights;
    let prompts = test_support::stories::default_prompts(&tok);
    test_support::compile::compile_ckpt(&ckpt, &prompts, &o).unwrap()
}

#[test]
fn i8f16_keeps_v_and_down_in_f16_and_the_other_matrices_as_i8_builds_do() {
    let (mixed, plain) = (build(WeightType::I8F16), build(WeightType::I8));
    for l in 0..mixed.config().n_layers {
        for lt in crate::gptq::MATRICES {
            let t = Tensor::Layer(l, lt);
            let (m, p) = (mixed.i8_matrix(t), plain.i8_matrix(t));
            if KEPT_AT_F16.contains(&lt) {
                assert!(m.is_none(), "{t} is i8 in an i8f16 build");
            } else if lt == LayerTensor::Up {
                // The i8 build folds the FFN smoothing into up; i8f16 has none.
                assert_ne!(m.unwrap().scales, p.unwrap().scales, "{t}");
            } else {
                let (m, p) = (m.unwrap(), p.unwrap());
                assert_eq!((m.q, m.scales), (p.q, p.scales), "{t}");
            }
        }
    }
    let e = |m: &CompiledModel| m.i8_matrix(Tensor::TokenEmbedding).map(|e| e.q.to_vec());
    assert_eq!(e(&mixed), e(&plain));
    // The file says which matrices are f16: it reads back whole.
    let back = CompiledModel::from_bytes(&mixed.to_bytes(), "i8f16 build").unwrap();
    assert_eq!(back.options().weights, WeightType::I8F16);
    assert!(
        back.i8_matrix(Tensor::Layer(0, LayerTensor::Down))
            .is_none()
    );
}
