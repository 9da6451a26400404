//! Times AR-1 and AR-32 steps of a compiled stories260K model (all windows fully visible).
//!
//! `cargo run -p ref_backend --example ref_step_timing [--release]`

use std::time::Instant;

use model::llama2c::ModelFiles;
use quant::DataType;
use ref_backend::{CompileOptions, IoRole, WeightType, compile, mask_value_bytes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ckpt, tok) = ModelFiles::discover(None)?.load()?;
    for (kv, w) in [
        (DataType::U8, WeightType::I8),
        (DataType::U16, WeightType::I8),
        (DataType::F32, WeightType::F32),
    ] {
        let mut o = CompileOptions::new(512, vec![1, 32]);
        o.kv_dtype = kv;
        o.weights = w;
        let prompts: Vec<Vec<u32>> = ref_backend::DEFAULT_CALIBRATION_PROMPTS
            .iter()
            .map(|p| tok.encode(p, true, false))
            .collect();
        let t = Instant::now();
        let c = model::llama2c::llama_config(&ckpt.config);
        let model = compile(&c, &ckpt, &prompts, &o, ckpt.sha256(), &mut |_| {})?;
        let compile_time = t.elapsed();
        for g in model.graphs() {
            let mut ins: Vec<Vec<u8>> = g
                .inputs()
                .iter()
                .map(|d| {
                    let mut b = vec![0u8; d.byte_size()];
                    if d.role == IoRole::Mask {
                        let v = mask_value_bytes(d.dtype, true);
                        for c in b.chunks_exact_mut(v.len()) {
                            c.copy_from_slice(&v);
                        }
                    }
                    b
                })
                .collect();
            for (i, c) in ins[0].chunks_exact_mut(4).enumerate() {
                c.copy_from_slice(&((i % 500) as i32 + 3).to_le_bytes());
            }
            let mut outs: Vec<Vec<u8>> = g
                .outputs()
                .iter()
                .map(|d| vec![0u8; d.byte_size()])
                .collect();
            let i: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
            let mut ob: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            let reps = if g.ar() == 1 { 200 } else { 10 };
            let t = Instant::now();
            for _ in 0..reps {
                g.execute(&i, &mut ob)?;
            }
            let per = t.elapsed() / reps;
            println!(
                "KV {kv} weights {}: compile {compile_time:.2?}; {} (full {}-row window): {per:.2?}/step, {:.2?}/token",
                w.name(),
                g.name(),
                g.window(),
                per / g.ar() as u32
            );
        }
    }
    Ok(())
}
