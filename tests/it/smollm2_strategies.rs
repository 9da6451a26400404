//! SmolLM2-135M-Instruct (GQA 3:1, 30 layers) through `htpkv::Session`: every KV strategy gives
//! bit-identical logits, as on stories260K (tests/runtime.rs), over a prefill, greedy decode,
//! a rollback and a different continuation.
//!
//! The model comes from `scripts/fetch-smollm2.sh`. When it is absent this test fails if the
//! environment variable `CI` is set, and otherwise prints how to fetch it and passes. Sizes are
//! small (context 32, short calibration) so that it runs in well under a minute in debug.

use std::sync::Arc;
use std::time::Instant;

use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::{HostAllocator, Strategy};
use model::gguf::GgufModel;
use model::ops::argmax;
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};

fn compiled() -> Option<Arc<CompiledModel>> {
    let path = test_support::fetched::smollm2_gguf("smollm2_strategies")?;
    let m = GgufModel::load(&path).expect("SmolLM2 loads");
    let mut o = CompileOptions::new(32, vec![1, 8]);
    o.kv_dtype = DataType::U8;
    // f16 weights run on the float matmul, the fastest path in a debug build; the KV (what
    // the strategies manage) is u8 with calibrated encodings.
    o.weights = WeightType::F16;
    o.calibration_tokens = 12;
    let calibration = [vec![1, 504, 3458, 282, 4649, 314]];
    let model = ref_backend::compile(
        &m.config,
        &*m.weights,
        &calibration,
        &o,
        [0; 32],
        &mut |_| {},
    )
    .expect("compiles");
    Some(Arc::new(model))
}

/// The logits (as bits) of every step of one run under `strategy`.
fn run(model: &Arc<CompiledModel>, strategy: Strategy) -> Vec<Vec<u32>> {
    let mut s = Session::new(
        ReferenceBackend::new(Arc::clone(model)),
        strategy,
        &HostAllocator::default(),
    )
    .expect("session");
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let prompt: Vec<u32> = (0..7).map(|i| 100 + 37 * i).collect();
    let mut steps = vec![bits(s.prefill(&prompt).unwrap())];
    // Up to 25 of the 32 positions: past the AR-8 window (24 rows), so windows move.
    for i in 0..22 {
        if i == 11 {
            let back = s.len() - 4;
            s.rollback(back).unwrap();
            s.decode(5).unwrap();
        }
        let t = argmax(s.last_logits()) as u32;
        steps.push(bits(s.decode(t).unwrap()));
    }
    steps
}

#[test]
fn every_kv_strategy_gives_bit_identical_logits_on_smollm2() {
    let Some(model) = compiled() else { return };
    let t0 = Instant::now();
    let reference = run(&model, Strategy::SHIFT_2X);
    let others = [Strategy::Conveyor, Strategy::SmartMask, Strategy::Naive];
    for strategy in others {
        let other = run(&model, strategy);
        assert_eq!(reference.len(), other.len());
        for (i, (a, b)) in reference.iter().zip(&other).enumerate() {
            assert!(
                a == b,
                "{strategy:?}: logits of step {i} differ from shift's"
            );
        }
    }
    eprintln!("4 strategies in {:.1} s", t0.elapsed().as_secs_f64());
}
