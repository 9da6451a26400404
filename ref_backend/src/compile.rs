//! The compile step: model description + weights + calibration + options -> [`CompiledModel`].

use model::{LlamaConfig, Tensor, WeightSource, check_weights};

use rayon::prelude::*;

use crate::calibrate::{Calibrated, Recipe, calibrate};
use crate::compiled::CompiledModel;
use crate::error::CompileError;
use crate::gptq::Factor;
use crate::lpbq::{is_lpbq, lpbq_grid, quantize_lpbq};
use crate::model::{ActSite, LayerData, Matrix, ModelData, act_index, act_site, i8_grid};
use crate::options::CompileOptions;
use crate::progress::{Progress, Stage};
use crate::smooth;
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
///    Q/K/V biases stay f32. With i8 weights, [`FFN_SMOOTHING`](crate::FFN_SMOOTHING) is folded into each layer's
///    `Up` and `Down` first (f32), its factors from step 2 (see [`mod@crate::smooth`]). The
///    layers' integer weights are rounded by their output error over the calibration positions
///    ([`Rounding::Gptq`](crate::Rounding::Gptq), step 2 accumulating each matmul input's Gram matrix).
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
    let setup = (opts, Recipe::DEFAULT);
    compile_with(config, weights, calibration, setup, fingerprint, progress)
}

/// [`compile`] with another [`Recipe`] than [`Recipe::DEFAULT`]: for measuring the choices (the
/// accuracy example). The file does not record it, and its [`CompileOptions::fingerprint`] is
/// the default's: do not cache such files beside [`compile`]'s.
pub fn compile_with(
    config: &LlamaConfig,
    weights: &dyn WeightSource,
    calibration: &[Vec<u32>],
    (opts, recipe): (&CompileOptions, Recipe),
    fingerprint: [u8; 32],
    progress: &mut dyn FnMut(Progress),
) -> Result<CompiledModel, CompileError> {
    // The description as a graph of this context runs it (LongRoPE's factors for the context).
    let bound = config.clone().for_context(opts.context);
    let c = &bound;
    c.validate()
        .and_then(|()| check_weights(c, weights))
        .map_err(|source| CompileError::Model { source })?;
    validate_options(c, opts)
        .and_then(|()| validate_calibration(opts, calibration))
        .map_err(|reason| CompileError::InvalidOptions { reason })?;
    let cal = calibrate(c, weights, calibration, (opts, recipe), progress)?;
    let convert = (opts.weights, &cal);
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
/// and `Down` smoothed by its calibrated factors first (none when `cal.smoothing` is empty),
/// the layers' integer weights rounded by their inputs' Gram matrices when `cal.gram` holds
/// them ([`Rounding::Gptq`](crate::Rounding::Gptq); the embedding and the classifier are rounded to nearest).
fn convert_weights(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    (wt, cal): (WeightType, &Calibrated),
    progress: &mut dyn FnMut(Progress),
) -> Result<(Matrix, Vec<LayerData>, Option<Matrix>), CompileError> {
    let total = (c.n_layers * LayerData::MATRICES.len() + 2) as u64;
    let mut done = 0;
    let mut convert = |t: Tensor, factor: Option<&Factor>| {
        let shape = t.shape(c);
        let folded = match t {
            Tensor::Layer(l, lt) => cal
                .smoothing
                .get(l)
                .and_then(|s| smooth::fold(lt, tensor(w, t), shape[1], s)),
            _ => None,
        };
        let data = folded.as_deref().unwrap_or_else(|| tensor(w, t));
        let m = convert_matrix(data, (shape[0], shape[1]), (wt, factor), t)?;
        done += 1;
        progress(Progress {
            stage: Stage::QuantizeWeights,
            done,
            total,
        });
        Ok::<_, CompileError>(m)
    };
    let embedding = convert(Tensor::TokenEmbedding, None)?;
    let mut layers = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let factors = layer_factors(cal, l)?;
        let matrices = LayerData::MATRICES
            .iter()
            .map(|&t| {
                let f = act_site(t).and_then(|s| factors.get(s.index())?.as_ref());
                convert(Tensor::Layer(l, t), f)
            })
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
        Some(convert(Tensor::Output, None)?)
    };
    Ok((embedding, layers, classifier))
}

/// The factors of layer `l`'s four matmul inputs' Gram matrices ([`ActSite`] order; the down
/// input's for the smoothed values), computed in parallel; empty without Gram matrices.
fn layer_factors(cal: &Calibrated, l: usize) -> Result<Vec<Option<Factor>>, CompileError> {
    if cal.gram.is_empty() {
        return Ok(Vec::new());
    }
    ActSite::ALL
        .par_iter()
        .map(|&site| {
            let divisors = (site == ActSite::FfnMid)
                .then(|| cal.smoothing.get(l).map(Vec::as_slice))
                .flatten();
            let f = cal.gram[act_index(l, site)].factor(divisors);
            f.map(Some).ok_or_else(|| CompileError::InvalidOptions {
                reason: format!(
                    "the calibration of layer {l}'s {} has no positive definite Gram matrix",
                    site.name()
                ),
            })
        })
        .collect()
}

fn convert_matrix(
    data: &[f32],
    (rows, cols): (usize, usize),
    (wt, factor): (WeightType, Option<&Factor>),
    t: Tensor,
) -> Result<Matrix, CompileError> {
    let quant_error = |source| CompileError::Quant {
        what: format!("weight matrix {t}"),
        source,
    };
    let lpbq = |row: &[f32]| lpbq_grid(row, crate::LPBQ_BLOCK);
    let four_bits = is_lpbq(wt, t, cols);
    let wt = wt.matrix_type(t);
    let m = match (wt, four_bits, factor) {
        (WeightType::F16, ..) => return Ok(Matrix::float(data, rows, cols, true)),
        (WeightType::F32, ..) => return Ok(Matrix::float(data, rows, cols, false)),
        (_, false, None) => Matrix::quantize_i8(data, rows, cols),
        (_, true, None) => quantize_lpbq(data, rows, cols, crate::LPBQ_BLOCK),
        (_, false, Some(f)) => Matrix::quantize_by_error(data, (rows, cols), i8_grid, f),
        (_, true, Some(f)) => Matrix::quantize_by_error(data, (rows, cols), lpbq, f),
    };
    m.map_err(quant_error)
}
