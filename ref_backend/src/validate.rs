//! The rules a model and its compile options must satisfy (checked by [`crate::compile`] and when
//! a compiled file is read).

use std::collections::HashSet;

use model::LlamaConfig;
use quant::DataType;

use crate::options::{CompileOptions, MAX_CALIBRATION_TOKENS};

/// Checks `opts` against `config`; the reason names the offending option.
pub(crate) fn validate_options(config: &LlamaConfig, opts: &CompileOptions) -> Result<(), String> {
    if opts.context < 2 {
        return Err(format!("context {} must be at least 2", opts.context));
    }
    if opts.context > config.context_length {
        return Err(format!(
            "context {} exceeds the model's maximum context length {}",
            opts.context, config.context_length
        ));
    }
    if opts.ar.is_empty() {
        return Err("at least one AR variant is needed".into());
    }
    let mut seen = HashSet::new();
    for &n in &opts.ar {
        if n == 0 || n >= opts.context {
            return Err(format!(
                "AR variant {n} must satisfy 1 <= n < context ({})",
                opts.context
            ));
        }
        if !seen.insert(n) {
            return Err(format!("AR variant {n} is listed twice"));
        }
    }
    if !matches!(
        opts.kv_dtype,
        DataType::U8 | DataType::U16 | DataType::F16 | DataType::F32
    ) {
        return Err(format!(
            "KV dtype {} is not supported (expected u8, u16, f16 or f32)",
            opts.kv_dtype
        ));
    }
    validate_windows(config, opts)?;
    if opts.needs_calibration() && opts.calibration_tokens == 0 {
        return Err("calibration_tokens must be at least 1".into());
    }
    if opts.calibration_tokens > MAX_CALIBRATION_TOKENS {
        return Err(format!(
            "calibration_tokens {} exceeds the maximum {MAX_CALIBRATION_TOKENS} (the file format's limit)",
            opts.calibration_tokens,
        ));
    }
    Ok(())
}

/// Checks the sliding windows that bite within the context against kv_manager's rule (the
/// geometry a session builds from the graphs): `max(ar) <= W <= S - max(ar) + 1`. A window
/// between that and the context would change the float model's answer yet has no graph a cache
/// can serve, so it is refused rather than served as a global layer.
fn validate_windows(config: &LlamaConfig, opts: &CompileOptions) -> Result<(), String> {
    let windows: Vec<Option<usize>> = (0..config.n_layers)
        .map(|l| config.graph_window(l, opts.context))
        .collect();
    if windows.iter().all(Option::is_none) {
        return Ok(());
    }
    let mut geometry = kv_manager::Geometry::new(
        config.n_layers,
        config.n_kv_heads,
        config.head_dim,
        opts.context,
        &opts.ar,
        opts.kv_dtype,
    );
    geometry.windows = windows;
    geometry.validate().map_err(|e| {
        format!(
            "{e}: the graphs of context {} cannot take this sliding window",
            opts.context
        )
    })
}
