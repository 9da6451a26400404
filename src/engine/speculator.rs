//! Opening a speculator for a session: the one kind that needs the engine is a draft model, which is
//! found, compiled and opened like the target (speculation itself is the runtime's
//! [`crate::speculate`]).

use super::{EngineError, EngineOptions, Model};
use crate::backend::Backend;
use crate::speculate::{Lookahead, PromptLookup, SpecKind, Speculator, draft::DraftModel};
use quant::DataType;
use std::path::Path;

/// The speculator `kind` for a target opened with `target` at context length `context` (a draft
/// model is opened as [`open_draft`] says).
pub fn open(
    kind: &SpecKind,
    target: &EngineOptions,
    context: usize,
) -> Result<Box<dyn Speculator>, EngineError> {
    Ok(match kind {
        SpecKind::PromptLookup { k } => Box::new(PromptLookup::new(*k)),
        SpecKind::Draft { path, k } => Box::new(open_draft(target, context, path, *k)?),
        SpecKind::Lookahead { window, ngram, cap } => {
            Box::new(Lookahead::new(*window, *ngram, *cap))
        }
    })
}

/// Opens the model at `path` as a draft for a target opened with `target`: the same backend,
/// strategy and context, compiled with i8 weights and u8 K/V (the cheapest build) and AR [1, 32].
pub fn open_draft(
    target: &EngineOptions,
    context: usize,
    path: &Path,
    k: usize,
) -> Result<DraftModel<Box<dyn Backend>>, EngineError> {
    let options = EngineOptions {
        model_dir: Some(path.to_path_buf()),
        compiled: None,
        kv_dtype: DataType::U8,
        weights: "i8".into(),
        context: Some(context),
        ar: crate::config::default_ar(context),
        layer_windows: Vec::new(),
        ..target.clone()
    };
    let model = Model::open(&options, &mut |_| {})?;
    let session = model.new_session()?;
    Ok(DraftModel::new(
        session,
        k,
        format!("draft:{}:{k}", path.display()),
    ))
}
