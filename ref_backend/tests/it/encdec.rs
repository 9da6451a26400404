//! The encoder-decoder graphs refuse bad options and bad buffers with the tensor named, before
//! writing anything.

use model::encdec::{EncDecConfig, EncDecWeights};
use quant::DataType;
use ref_backend::ExecError;
use ref_backend::encdec::{EncDecCompiled, EncDecOptions, compile_encdec};
use std::sync::Arc;

fn compile(
    ar: Vec<usize>,
    cross: DataType,
    calibration: &[Vec<u32>],
) -> Result<EncDecCompiled, String> {
    let c = EncDecConfig::tiny();
    let w = Arc::new(EncDecWeights::from_seed(&c, 5).unwrap());
    let opts = EncDecOptions {
        context: 12,
        ar,
        cross_dtype: cross,
    };
    compile_encdec(&c, w, calibration, &opts).map_err(|e| e.to_string())
}

#[test]
fn bad_options_are_refused_with_the_reason() {
    let source = vec![vec![1u32; 8]];
    assert!(
        compile(vec![12], DataType::F32, &source)
            .unwrap_err()
            .contains("AR variants [12]")
    );
    assert!(
        compile(vec![], DataType::F32, &source)
            .unwrap_err()
            .contains("AR variants []")
    );
    assert!(
        compile(vec![1], DataType::U8, &[])
            .unwrap_err()
            .contains("calibration source")
    );
    assert!(
        compile(vec![1], DataType::I32, &source)
            .unwrap_err()
            .contains("use u8, u16, f16 or f32")
    );
    assert!(
        compile(vec![1], DataType::U8, &[vec![1; 3]])
            .unwrap_err()
            .contains("calibration sequence 0")
    );
    assert!(compile(vec![1], DataType::F16, &[]).is_ok());
}

fn buffers(model: &EncDecCompiled, graph: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let g = &model.graphs()[graph];
    (
        g.inputs.iter().map(|t| vec![0; t.byte_size()]).collect(),
        g.outputs.iter().map(|t| vec![0; t.byte_size()]).collect(),
    )
}

fn run(
    model: &EncDecCompiled,
    graph: usize,
    ins: &[Vec<u8>],
    outs: &mut [Vec<u8>],
) -> Result<(), ExecError> {
    let ins: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
    let mut outs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    model.execute(graph, &ins, &mut outs)
}

#[test]
fn bad_buffers_are_refused_before_anything_is_written() {
    let model = compile(vec![1, 4], DataType::U16, &[vec![3; 8]]).unwrap();
    assert_eq!(model.graphs()[0].name, "encoder_e8");
    assert_eq!(model.graphs()[2].name, "ar4_cl12");
    // A correct encoder run writes every cross output.
    let (ins, mut outs) = buffers(&model, 0);
    run(&model, 0, &ins, &mut outs).unwrap();
    assert!(outs.iter().all(|o| o.iter().any(|&b| b != 0)));
    let (mut ins, mut outs) = buffers(&model, 2);
    ins[0][..4].copy_from_slice(&64i32.to_le_bytes());
    let err = run(&model, 2, &ins, &mut outs).unwrap_err();
    assert!(
        matches!(err, ExecError::TokenOutOfRange { value: 64, .. }),
        "{err}"
    );
    ins[0][..4].copy_from_slice(&0i32.to_le_bytes());
    ins[1][4..8].copy_from_slice(&(-1i32).to_le_bytes());
    let err = run(&model, 2, &ins, &mut outs).unwrap_err();
    assert!(
        matches!(err, ExecError::NegativePosition { index: 1, .. }),
        "{err}"
    );
    ins[1][4..8].copy_from_slice(&1i32.to_le_bytes());
    let last = ins.len() - 1;
    ins[last].pop();
    let err = run(&model, 2, &ins, &mut outs).unwrap_err().to_string();
    assert!(
        err.contains("`cross_value_1_1` must be 128 bytes, got 127"),
        "{err}"
    );
    ins.pop();
    let err = run(&model, 2, &ins, &mut outs).unwrap_err();
    assert!(matches!(err, ExecError::InputCount { .. }), "{err}");
    assert!(outs.iter().all(|o| o.iter().all(|&b| b == 0)));
    assert!(run(&model, 9, &ins, &mut outs).is_err());
}
