//! The compile step: model description + weights + calibration + options -> [`CompiledModel`].

use model::{LlamaConfig, Tensor, WeightSource, check_weights};

use crate::calibrate::calibrate;
use crate::compiled::CompiledModel;
use crate::error::CompileError;
use crate::model::{LayerData, Matrix, ModelData};
use crate::options::CompileOptions;
use crate::progress::{Progress, Stage};
use crate::smooth::{self, FFN_SMOOTHING, FfnSmoothing};
use crate::types::WeightType;
use crate::validate::validate_options;

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
///    Q/K/V biases stay f32. With i8 weights, [`FFN_SMOOTHING`] is folded into each layer's
///    `Up` and `Down` first (f32), its factors from step 2 (see [`mod@crate::smooth`]).
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
    let setup = (opts, Some(FFN_SMOOTHING));
    compile_with(config, weights, calibration, setup, fingerprint, progress)
}

/// [`compile`] with another FFN smoothing than [`FFN_SMOOTHING`], or none (ignored unless
/// weights are i8): for measuring the choice (the accuracy example). The file does not record
/// it, and its [`CompileOptions::fingerprint`] is the default's: do not cache such files beside
/// [`compile`]'s.
pub fn compile_with(
    config: &LlamaConfig,
    weights: &dyn WeightSource,
    calibration: &[Vec<u32>],
    (opts, smoothing): (&CompileOptions, Option<FfnSmoothing>),
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
    let cal = calibrate(c, weights, calibration, (opts, smoothing), progress)?;
    let convert = (opts.weights, cal.smoothing.as_slice());
    let (embedding, layers, classifier) = convert_weights(c, weights, convert, progress)?;
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

/// The embedding, the layers and the separate classifier (if any) in `wt`, each layer's `Up`
/// and `Down` smoothed by its `smoothing` factors first (none when `smoothing` is empty).
fn convert_weights(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    (wt, smoothing): (WeightType, &[Vec<f32>]),
    progress: &mut dyn FnMut(Progress),
) -> Result<(Matrix, Vec<LayerData>, Option<Matrix>), CompileError> {
    let total = (c.n_layers * LayerData::MATRICES.len() + 2) as u64;
    let mut done = 0;
    let mut convert = |t: Tensor| {
        let shape = t.shape(c);
        let folded = match t {
            Tensor::Layer(l, lt) => smoothing
                .get(l)
                .and_then(|s| smooth::fold(lt, tensor(w, t), shape[1], s)),
            _ => None,
        };
        let data = folded.as_deref().unwrap_or_else(|| tensor(w, t));
        let m = convert_matrix(data, shape[0], shape[1], wt, t)?;
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
        // The embedding (also the tied classifier) keeps 8 bits, as AI Hub's W4A16 models keep
        // their LM head at 8 bits and llama.cpp's 4-bit types keep it at 6: measured on SmolLM2.
        WeightType::I4 if matches!(t, Tensor::TokenEmbedding | Tensor::Output) => {
            convert_matrix(data, rows, cols, WeightType::I8, t)?
        }
        WeightType::I4 => {
            Matrix::quantize_lpbq(data, rows, cols, crate::LPBQ_BLOCK).map_err(|source| {
                CompileError::Quant {
                    what: format!("weight matrix {t}"),
                    source,
                }
            })?
        }
        WeightType::F16 => Matrix::float(data, rows, cols, true),
        WeightType::F32 => Matrix::float(data, rows, cols, false),
    })
}
