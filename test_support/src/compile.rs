//! Models compiled for the reference executor, as the tests need them.

use std::sync::Arc;

use htpkv::text::ChatFormat;
use model::llama2c::{Checkpoint, Tokenizer};
use quant::DataType;
use ref_backend::{CompileError, CompileOptions, CompiledModel, WeightType};

/// Compiles a llama2.c checkpoint described by `config` (its own, or with windows set): its
/// weights, `prompts` for calibration, its SHA-256 as fingerprint.
pub fn compile_config(
    config: &model::LlamaConfig,
    ckpt: &Checkpoint,
    prompts: &[Vec<u32>],
    o: &CompileOptions,
) -> Result<CompiledModel, CompileError> {
    ref_backend::compile(config, ckpt, prompts, o, ckpt.sha256(), &mut |_| {})
}

/// Compiles a llama2.c checkpoint as its own description.
pub fn compile_ckpt(
    ckpt: &Checkpoint,
    prompts: &[Vec<u32>],
    o: &CompileOptions,
) -> Result<CompiledModel, CompileError> {
    compile_config(
        &model::llama2c::llama_config(&ckpt.config),
        ckpt,
        prompts,
        o,
    )
}

/// stories260K described by `config` (its own, or with windows set) compiled with `opts`,
/// calibrated as the engine calibrates it.
pub fn compile(
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    config: &model::LlamaConfig,
    opts: &CompileOptions,
) -> Arc<CompiledModel> {
    let prompts = htpkv::engine::calibration_sequences(tok, &ChatFormat::new(None))
        .expect("a model without a chat template needs no rendering");
    Arc::new(compile_config(config, ckpt, &prompts, opts).expect("compiles"))
}

/// stories260K compiled for the reference executor with u8 K/V and i8 weights, for `context`
/// tokens and the AR variants `ar`, calibrated as the engine calibrates it.
pub fn compile_u8(
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    context: usize,
    ar: &[usize],
) -> Arc<CompiledModel> {
    let mut opts = CompileOptions::new(context, ar.to_vec());
    opts.kv_dtype = DataType::U8;
    opts.weights = WeightType::I8;
    compile(
        ckpt,
        tok,
        &model::llama2c::llama_config(&ckpt.config),
        &opts,
    )
}

/// stories260K compiled for context `s` with AR-1 (u8 KV, i8 weights, short calibration on one
/// story prompt), and its serialized bytes.
pub fn compiled_ar1(ckpt: &Checkpoint, tok: &Tokenizer, s: usize) -> (CompiledModel, Vec<u8>) {
    let mut o = CompileOptions::new(s, vec![1]);
    o.calibration_tokens = 12;
    let prompts = [tok.encode("Once upon a time", true, false)];
    let model = compile_ckpt(ckpt, &prompts, &o).expect("compile");
    let bytes = model.to_bytes();
    (model, bytes)
}
