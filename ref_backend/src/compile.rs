//! The compile step: model description + weights + calibration + options -> [`CompiledModel`].

use std::collections::HashSet;
use std::sync::Arc;

use model::{LlamaConfig, Tensor, WeightSource, check_weights};
use quant::{DataType, QuantSpec, ScaleOffset};

use crate::calibrate::calibrate;
use crate::error::CompileError;
use crate::exec::Graph;
use crate::model::{ActSite, I8Matrix, LayerData, Matrix, ModelData, graph_window};
use crate::options::{CompileOptions, MAX_CALIBRATION_TOKENS};
use crate::parts::Part;
use crate::types::WeightType;

/// A stage of [`compile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Running the float model over the calibration sequences (`done`/`total` in tokens, where
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
    pub(crate) part: Part,
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
            && self.part == other.part
            && self.graphs.len() == other.graphs.len()
            && self.graphs.iter().zip(&other.graphs).all(|(a, b)| {
                a.name() == b.name() && a.inputs() == b.inputs() && a.outputs() == b.outputs()
            })
    }
}

impl CompiledModel {
    /// Builds the graphs for `data` (validated by the caller): the whole model.
    pub(crate) fn from_data(data: ModelData) -> CompiledModel {
        let part = Part::whole(data.config.n_layers);
        CompiledModel::with_part(Arc::new(data), part)
    }

    /// The graphs of `part` of `data` (a part that fits the model), one per AR variant.
    pub(crate) fn with_part(data: Arc<ModelData>, part: Part) -> CompiledModel {
        let context = data.options.context;
        let graphs = data
            .options
            .ar
            .iter()
            .map(|&n| {
                Graph::new(
                    part.graph_name(n, context),
                    n,
                    Arc::clone(&data),
                    part.clone(),
                )
            })
            .collect();
        CompiledModel { data, part, graphs }
    }

    /// The part of the model this file holds ([`Part::whole`] unless made by
    /// [`split`](Self::split)).
    pub fn part(&self) -> &Part {
        &self.part
    }

    /// The model description.
    pub fn config(&self) -> &LlamaConfig {
        &self.data.config
    }

    /// The options the model was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.data.options
    }

    /// The fingerprint (SHA-256 of the model file(s)) [`compile`] was given: a runtime checks
    /// it against the model it is about to use with this compiled file.
    pub fn model_sha256(&self) -> [u8; 32] {
        self.data.model_sha256
    }

    /// [`model_sha256`](Self::model_sha256) as 64 lower-case hex digits.
    pub fn model_sha256_hex(&self) -> String {
        self.data
            .model_sha256
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The token sequences calibration started from.
    pub fn calibration(&self) -> &[Vec<u32>] {
        &self.data.calibration
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

    /// The i8 weights of matrix `t` as the executor multiplies them: a layer's `Q`, `K`, `V`,
    /// `O`, `Gate`, `Up`, `Down`, the embedding table (`TokenEmbedding`, also the classifier of a
    /// tied model) or the classifier (`Output`). `None` for float weights,
    /// a tensor that is not a matrix, or a part that does not hold it.
    pub fn i8_matrix(&self, t: Tensor) -> Option<I8Matrix<'_>> {
        let d = &self.data;
        let m = match t {
            Tensor::TokenEmbedding => d.embedding.as_ref(),
            Tensor::Output => d.classifier.as_ref(),
            Tensor::Layer(l, lt) => d.layer(l).and_then(|x| x.matrix(lt)),
            Tensor::OutputNorm => None,
        };
        m.and_then(Matrix::as_i8)
    }

    /// The static i16 encoding of the classifier input (`None` for float weights).
    pub fn classifier_input_encoding(&self) -> Option<ScaleOffset> {
        self.data.act_final()
    }
}

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
        .map(|l| graph_window(config, opts.context, l))
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

/// Checks the calibration sequences: present when something is quantized, none empty.
fn validate_calibration(opts: &CompileOptions, calibration: &[Vec<u32>]) -> Result<(), String> {
    if opts.needs_calibration() && calibration.is_empty() {
        return Err(format!(
            "KV dtype {} / weights {} need calibration, but no calibration sequences were given",
            opts.kv_dtype,
            opts.weights.name()
        ));
    }
    match calibration.iter().position(Vec::is_empty) {
        Some(p) => Err(format!("calibration sequence {p} is empty")),
        None => Ok(()),
    }
}

/// Compiles the model `config` with `weights` (any [`WeightSource`]: GGUF, HF safetensors,
/// a llama2.c checkpoint) into a [`CompiledModel`].
///
/// 1. Validates the description, the weights ([`check_weights`]), the options (see
///    [`CompileOptions`]) and the calibration sequences (token ids, normally BOS + text).
/// 2. Calibrates (only when KV is u8/u16 or weights are i8): runs the float model (the shared
///    forward with [`model::FloatModel`]'s arithmetic, up to 16 sequences in lockstep) over
///    `calibration`, each sequence cut or continued greedily to `opts.calibration_tokens`
///    tokens, observing the i16 matmul inputs and the
///    keys (after RoPE) and values of every (layer, KV head); see [`crate::U8_KV_PERCENTILE`]
///    for the observers.
/// 3. Converts the weights: i8 per-output-channel symmetric (also the token embedding, whose
///    rows are the output channels of the tied classifier), or f16/f32; RMSNorm weights and
///    Q/K/V biases stay f32.
/// 4. Builds one graph per AR variant, named `ar{n}_cl{S}`.
///
/// `fingerprint` is the SHA-256 of the model file(s); it is stored and returned by
/// [`CompiledModel::model_sha256`] so a runtime can refuse a compiled file made from another
/// model. `progress` is called often (per calibration token) and should be cheap.
pub fn compile(
    config: &LlamaConfig,
    weights: &dyn WeightSource,
    calibration: &[Vec<u32>],
    opts: &CompileOptions,
    fingerprint: [u8; 32],
    progress: &mut dyn FnMut(Progress),
) -> Result<CompiledModel, CompileError> {
    let c = config;
    c.validate()
        .and_then(|()| check_weights(c, weights))
        .map_err(|source| CompileError::Model { source })?;
    validate_options(c, opts)
        .and_then(|()| validate_calibration(opts, calibration))
        .map_err(|reason| CompileError::InvalidOptions { reason })?;
    let cal = calibrate(c, weights, calibration, opts, progress)?;
    let (embedding, layers, classifier) = convert_weights(c, weights, opts.weights, progress)?;
    let mut config = c.clone();
    if !config.layer_windows.iter().any(Option::is_some) {
        // All global: the same model as one without windows (and its file).
        config.layer_windows.clear();
    }
    let data = ModelData {
        config,
        options: opts.clone(),
        model_sha256: fingerprint,
        calibration: calibration.to_vec(),
        embedding: Some(embedding),
        first_layer: 0,
        layers,
        output_norm: tensor(weights, Tensor::OutputNorm).to_vec(),
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

/// A tensor [`check_weights`] found present and sized (an empty slice for an absent bias).
fn tensor(w: &dyn WeightSource, t: Tensor) -> &[f32] {
    w.tensor(t).unwrap_or(&[])
}

/// The embedding, the layers and the separate classifier (if any) in `wt`.
fn convert_weights(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    wt: WeightType,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Matrix, Vec<LayerData>, Option<Matrix>), CompileError> {
    let total = (c.n_layers * LayerData::MATRICES.len() + 2) as u64;
    let mut done = 0;
    let mut convert = |t: Tensor| {
        let shape = t.shape(c);
        let m = convert_matrix(tensor(w, t), shape[0], shape[1], wt, t)?;
        done += 1;
        progress(Progress {
            stage: Stage::QuantizeWeights,
            done,
            total,
        });
        Ok::<_, CompileError>(m)
    };
    let embedding = convert(Tensor::TokenEmbedding)?;
    let mut layers = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let matrices = LayerData::MATRICES
            .iter()
            .map(|&t| convert(Tensor::Layer(l, t)))
            .collect::<Result<_, _>>()?;
        let vectors = LayerData::VECTORS
            .iter()
            .map(|&t| tensor(w, Tensor::Layer(l, t)).to_vec())
            .collect();
        layers.push(LayerData { matrices, vectors });
    }
    let classifier = if c.tied_output {
        None
    } else {
        Some(convert(Tensor::Output)?)
    };
    Ok((embedding, layers, classifier))
}

fn convert_matrix(
    data: &[f32],
    rows: usize,
    cols: usize,
    wt: WeightType,
    t: Tensor,
) -> Result<Matrix, CompileError> {
    Ok(match wt {
        WeightType::I8 => {
            Matrix::quantize_i8(data, rows, cols).map_err(|source| CompileError::Quant {
                what: format!("weight matrix {t}"),
                source,
            })?
        }
        WeightType::F16 => Matrix::float(data, rows, cols, true),
        WeightType::F32 => Matrix::float(data, rows, cols, false),
    })
}
