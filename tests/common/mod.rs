//! What the root crate's stories260K tests share (each test binary uses part of it).
#![allow(dead_code)]

use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use htpkv::text::ChatFormat;
use kv_manager::{HostAllocator, Strategy};
use model::llama2c::{Checkpoint, Tokenizer};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::sync::Arc;

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
    Arc::new(
        ref_backend::compile(config, ckpt, &prompts, opts, ckpt.sha256(), &mut |_| {})
            .expect("compiles"),
    )
}

/// The four strategies with their default settings.
pub const STRATEGIES: [Strategy; 4] = [
    Strategy::SHIFT_2X,
    Strategy::Conveyor,
    Strategy::SmartMask,
    Strategy::Naive,
];

/// A session on the reference executor in host memory.
pub fn session(model: &Arc<CompiledModel>, strategy: Strategy) -> Session<ReferenceBackend> {
    Session::new(
        ReferenceBackend::new(model.clone()),
        strategy,
        &HostAllocator::default(),
    )
    .expect("session")
}
