//! The compile step: checkpoint + options -> [`CompiledModel`].

use std::collections::HashSet;
use std::sync::Arc;

use llama2c::{Checkpoint, Config};
use quant::{DataType, QuantSpec, ScaleOffset};

use crate::calibrate::calibrate;
use crate::error::CompileError;
use crate::exec::Graph;
use crate::model::{ActSite, Matrix, ModelData, graph_name};
use crate::options::CompileOptions;
use crate::types::WeightType;

/// A stage of [`compile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Running the float model over the calibration prompts (`done`/`total` in tokens, where
    /// a sequence that stops early counts as its full length once it is done).
    Calibrate,
    /// Quantizing or converting the weight matrices (`done`/`total` in matrices).
    QuantizeWeights,
    /// Building the graphs (`done`/`total` in graphs).
    BuildGraphs,
}

impl Stage {
    /// Short human-readable name.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Calibrate => "calibrate",
            Stage::QuantizeWeights => "weights",
            Stage::BuildGraphs => "graphs",
        }
    }
}

/// A progress report of [`compile`]: `done` of `total` units of `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub stage: Stage,
    pub done: u64,
    pub total: u64,
}

/// A compiled model: configuration, weights, encodings and one [`Graph`] per AR variant — the
/// reference backend's "context binary" (see [`mod@crate::format`] for the file).
pub struct CompiledModel {
    pub(crate) data: Arc<ModelData>,
    pub(crate) graphs: Vec<Graph>,
}

impl std::fmt::Debug for CompiledModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledModel")
            .field("config", &self.data.config)
            .field("options", &self.data.options)
            .field("graphs", &self.graphs)
            .finish_non_exhaustive()
    }
}

/// Two compiled models are equal when their configuration, options, weights, encodings and
/// graph descriptions are.
impl PartialEq for CompiledModel {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
            && self.graphs.len() == other.graphs.len()
            && self.graphs.iter().zip(&other.graphs).all(|(a, b)| {
                a.name() == b.name() && a.inputs() == b.inputs() && a.outputs() == b.outputs()
            })
    }
}

impl CompiledModel {
    /// Builds the graphs for `data` (validated by the caller).
    pub(crate) fn from_data(data: ModelData) -> CompiledModel {
        let data = Arc::new(data);
        let graphs = data
            .options
            .ar
            .iter()
            .map(|&n| Graph::new(graph_name(n, data.options.context), n, Arc::clone(&data)))
            .collect();
        CompiledModel { data, graphs }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.data.config
    }

    /// The options the model was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.data.options
    }

    /// SHA-256 (lower-case hex) of the checkpoint this model was compiled from, as
    /// [`llama2c::Checkpoint::sha256_hex`] gives it: a runtime checks it against the checkpoint
    /// (and tokenizer) it is about to use with the model.
    pub fn checkpoint_sha256_hex(&self) -> String {
        llama2c::hex(&self.data.checkpoint_sha256)
    }

    /// [`CompileOptions::fingerprint`] of the options.
    pub fn fingerprint(&self) -> u64 {
        self.data.options.fingerprint()
    }

    /// All graphs, in the order of `options().ar`.
    pub fn graphs(&self) -> &[Graph] {
        &self.graphs
    }

    /// The graph called `name` (e.g. `ar1_cl512`).
    pub fn graph(&self, name: &str) -> Option<&Graph> {
        self.graphs.iter().find(|g| g.name() == name)
    }

    /// The graph that processes `n` tokens per step.
    pub fn graph_for_ar(&self, n: usize) -> Option<&Graph> {
        self.graphs.iter().find(|g| g.ar() == n)
    }

    /// The KV encoding of (layer, KV head), keys (`value = false`) or values; shared by the
    /// past and new tensors of that head.
    pub fn kv_spec(&self, layer: usize, head: usize, value: bool) -> Option<&QuantSpec> {
        let c = &self.data.config;
        if layer >= c.n_layers || head >= c.n_kv_heads {
            return None;
        }
        Some(self.data.kv_spec(layer, head, value))
    }

    /// The static i16 encoding of a matmul input (`None` for float weights or out of range).
    pub fn activation_encoding(&self, layer: usize, site: ActSite) -> Option<ScaleOffset> {
        if layer >= self.data.config.n_layers {
            return None;
        }
        self.data.act(layer, site)
    }

    /// The static i16 encoding of the classifier input (`None` for float weights).
    pub fn classifier_input_encoding(&self) -> Option<ScaleOffset> {
        self.data.act_final()
    }
}

/// Checks `opts` against `config`; the reason names the offending option.
pub(crate) fn validate_options(config: &Config, opts: &CompileOptions) -> Result<(), String> {
    if opts.context < 2 {
        return Err(format!("context {} must be at least 2", opts.context));
    }
    if opts.context > config.seq_len {
        return Err(format!(
            "context {} exceeds the model's maximum sequence length {}",
            opts.context, config.seq_len
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
    if !config.head_dim().is_multiple_of(2) {
        return Err(format!(
            "head_dim {} is odd: RoPE needs pairs",
            config.head_dim()
        ));
    }
    if opts.needs_calibration() && opts.calibration_prompts.is_empty() {
        return Err(format!(
            "KV dtype {} / weights {} need calibration, but no calibration prompts were given",
            opts.kv_dtype,
            opts.weights.name()
        ));
    }
    if opts.needs_calibration() && opts.calibration_tokens == 0 {
        return Err("calibration_tokens must be at least 1".into());
    }
    if opts.calibration_tokens > llama2c::limits::MAX_SEQ_LEN {
        return Err(format!(
            "calibration_tokens {} exceeds the maximum {} (the file format's limit)",
            opts.calibration_tokens,
            llama2c::limits::MAX_SEQ_LEN
        ));
    }
    Ok(())
}

/// Compiles `ckpt` with `opts`.
///
/// 1. Validates the options (see [`CompileOptions`]).
/// 2. Calibrates (only when KV is u8/u16 or weights are i8): runs a float forward pass
///    (llama2.c semantics) over `opts.calibration_prompts`, each continued greedily to
///    `opts.calibration_tokens` tokens, observing the i16 matmul inputs and the keys (after
///    RoPE) and values of every (layer, KV head); see [`crate::U8_KV_PERCENTILE`]
///    for the observers.
/// 3. Converts the weights: i8 per-output-channel symmetric (also the token embedding, whose
///    rows are the output channels of the tied classifier), or f16/f32; RMSNorm weights stay
///    f32.
/// 4. Builds one graph per AR variant, named `ar{n}_cl{S}`.
///
/// `progress` is called often (per calibration token) and should be cheap.
pub fn compile(
    ckpt: &Checkpoint,
    opts: &CompileOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<CompiledModel, CompileError> {
    let c = ckpt.config;
    validate_options(&c, opts).map_err(|reason| CompileError::InvalidOptions { reason })?;
    let cal = calibrate(ckpt, opts, progress)?;

    let w = &ckpt.weights;
    let (dim, hidden, kv_dim, l) = (c.dim, c.hidden_dim, c.kv_dim(), c.n_layers);
    let mut matrices: Vec<(&str, &[f32], usize, usize)> = vec![
        ("token_embedding", &w.token_embedding, c.vocab_size, dim),
        ("wq", &w.wq, l * dim, dim),
        ("wk", &w.wk, l * kv_dim, dim),
        ("wv", &w.wv, l * kv_dim, dim),
        ("wo", &w.wo, l * dim, dim),
        ("w1", &w.w1, l * hidden, dim),
        ("w2", &w.w2, l * dim, hidden),
        ("w3", &w.w3, l * hidden, dim),
    ];
    if let Some(cls) = w.wcls.as_ref().filter(|_| !c.shared_classifier) {
        matrices.push(("wcls", cls, c.vocab_size, dim));
    }
    let total = matrices.len() as u64;
    let mut converted = Vec::with_capacity(matrices.len());
    for (i, (name, data, rows, cols)) in matrices.into_iter().enumerate() {
        let m = match opts.weights {
            WeightType::I8 => {
                Matrix::quantize_i8(data, rows, cols).map_err(|source| CompileError::Quant {
                    what: format!("weight matrix {name}"),
                    source,
                })?
            }
            WeightType::F16 => Matrix::float(data, rows, cols, true),
            WeightType::F32 => Matrix::float(data, rows, cols, false),
        };
        converted.push(m);
        progress(Progress {
            stage: Stage::QuantizeWeights,
            done: i as u64 + 1,
            total,
        });
    }
    let mut it = converted.into_iter();
    let mut next = || {
        it.next().ok_or_else(|| CompileError::InvalidOptions {
            reason: "internal: missing weight matrix".into(),
        })
    };
    let embedding = next()?;
    let (wq, wk, wv, wo, w1, w2, w3) = (
        next()?,
        next()?,
        next()?,
        next()?,
        next()?,
        next()?,
        next()?,
    );
    let classifier = next().ok();
    let data = ModelData {
        config: c,
        options: opts.clone(),
        checkpoint_sha256: ckpt.sha256(),
        embedding,
        rms_att: w.rms_att.clone(),
        wq,
        wk,
        wv,
        wo,
        rms_ffn: w.rms_ffn.clone(),
        w1,
        w2,
        w3,
        rms_final: w.rms_final.clone(),
        classifier,
        act: cal.act,
        kv: cal.kv,
    };
    let model = CompiledModel::from_data(data);
    let n = model.graphs.len() as u64;
    progress(Progress {
        stage: Stage::BuildGraphs,
        done: n,
        total: n,
    });
    Ok(model)
}
