//! Calibration: the float forward pass ([`model::FloatModel`]) seen through a [`Tap`] that feeds
//! observers on the tensors the executor quantizes.

use std::sync::Arc;

use model::ops::argmax;
use model::{FloatModel, LlamaConfig, Site, Tap, WeightSource};
use quant::{
    DataType, Encoding, HistogramObserver, MinMaxObserver, Observer, QuantSpec, ScaleOffset,
    Symmetry,
};

use crate::compile::{Progress, Stage};
use crate::error::CompileError;
use crate::model::{ActSite, act_index};
use crate::options::CompileOptions;

/// How the observers turn observed values into encodings (documented for users; part of the
/// calibration version).
///
/// * i16 matmul inputs: [`MinMaxObserver`], asymmetric (i16 has enough levels that clipping
///   outliers only hurts).
/// * u16 KV: [`MinMaxObserver`], asymmetric, per (layer, KV head, K|V).
/// * u8 KV: [`HistogramObserver`] clipping at [`U8_KV_PERCENTILE`], asymmetric, per (layer, KV
///   head, K|V): with 256 levels a rare outlier would otherwise cost resolution for all values.
pub const U8_KV_PERCENTILE: f64 = 99.99;

/// Histogram bins of the u8 KV observers.
const HIST_BINS: usize = 2048;

enum KvObserver {
    MinMax(MinMaxObserver),
    Hist(Box<HistogramObserver>),
}

impl KvObserver {
    fn observe(&mut self, v: &[f32]) {
        match self {
            KvObserver::MinMax(o) => o.observe(v),
            KvObserver::Hist(o) => o.observe(v),
        }
    }
    fn encoding(&self, dtype: DataType) -> Result<ScaleOffset, quant::QuantError> {
        match self {
            KvObserver::MinMax(o) => o.encoding(dtype, Symmetry::Asymmetric),
            KvObserver::Hist(o) => o.encoding(dtype, Symmetry::Asymmetric),
        }
    }
}

/// The encodings calibration fixes.
pub(crate) struct Calibrated {
    /// i16 activation encodings (empty unless weights are i8).
    pub(crate) act: Vec<ScaleOffset>,
    /// KV specs, `(layer * n_kv_heads + head) * 2 + (0 K | 1 V)`.
    pub(crate) kv: Vec<QuantSpec>,
}

/// The tap of calibration: routes the forward's values to the observers.
struct Observers {
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// i16 matmul inputs, [`act_index`] order (empty unless weights are i8).
    act: Vec<MinMaxObserver>,
    /// KV, `(layer * n_kv_heads + head) * 2 + (0 K | 1 V)` (empty unless KV is fixed point).
    kv: Vec<KvObserver>,
}

impl Tap for Observers {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        let act = match site {
            Site::AttnInput => Some(act_index(layer, ActSite::AttnIn)),
            Site::AttnOutput => Some(act_index(layer, ActSite::AttnOut)),
            Site::FfnInput => Some(act_index(layer, ActSite::FfnIn)),
            Site::FfnHidden => Some(act_index(layer, ActSite::FfnMid)),
            Site::FinalNorm => Some(self.n_layers * 4),
            _ => None,
        };
        if let Some(o) = act.and_then(|i| self.act.get_mut(i)) {
            o.observe(values);
        }
        let value = match site {
            Site::Key => false,
            Site::Value => true,
            _ => return,
        };
        for (h, head) in values.chunks_exact(self.head_dim).enumerate() {
            let i = (layer * self.n_kv_heads + h) * 2 + usize::from(value);
            if let Some(o) = self.kv.get_mut(i) {
                o.observe(head);
            }
        }
    }
}

impl Observers {
    fn new(c: &LlamaConfig, opts: &CompileOptions) -> Observers {
        let act = if opts.weights == crate::WeightType::I8 {
            (0..c.n_layers * 4 + 1)
                .map(|_| MinMaxObserver::new())
                .collect()
        } else {
            Vec::new()
        };
        let kv_observer = || {
            if opts.kv_dtype == DataType::U8 {
                KvObserver::Hist(Box::new(HistogramObserver::new(
                    HIST_BINS,
                    U8_KV_PERCENTILE,
                )))
            } else {
                KvObserver::MinMax(MinMaxObserver::new())
            }
        };
        let kv = if opts.kv_dtype.is_fixed_point() {
            (0..c.n_layers * c.n_kv_heads * 2)
                .map(|_| kv_observer())
                .collect()
        } else {
            Vec::new()
        };
        Observers {
            n_layers: c.n_layers,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            act,
            kv,
        }
    }

    /// The encodings of what was observed.
    fn encodings(&self, opts: &CompileOptions) -> Result<Calibrated, CompileError> {
        let act = self
            .act
            .iter()
            .enumerate()
            .map(|(i, o)| {
                o.encoding(DataType::I16, Symmetry::Asymmetric)
                    .map_err(|source| CompileError::Quant {
                        what: act_name(i, self.n_layers),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kv = self
            .kv
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let so = o
                    .encoding(opts.kv_dtype)
                    .map_err(|source| CompileError::Quant {
                        what: format!(
                            "{} of layer {} KV head {}",
                            if i % 2 == 0 { "keys" } else { "values" },
                            i / 2 / self.n_kv_heads,
                            i / 2 % self.n_kv_heads
                        ),
                        source,
                    })?;
                Ok(QuantSpec {
                    dtype: opts.kv_dtype,
                    encoding: Encoding::PerTensor(so),
                })
            })
            .collect::<Result<Vec<_>, CompileError>>()?;
        Ok(Calibrated { act, kv })
    }
}

/// Runs the float model over the calibration sequences (each continued greedily up to
/// `opts.calibration_tokens`, clamped to the context, until BOS or a stop token comes out)
/// and returns the encodings. Without fixed-point KV and i8 weights nothing is run.
pub(crate) fn calibrate(
    c: &LlamaConfig,
    weights: &dyn WeightSource,
    sequences: &[Vec<u32>],
    opts: &CompileOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Calibrated, CompileError> {
    let float_kv = QuantSpec {
        dtype: opts.kv_dtype,
        encoding: Encoding::Float,
    };
    if !opts.needs_calibration() {
        return Ok(Calibrated {
            act: Vec::new(),
            kv: vec![float_kv; c.n_layers * c.n_kv_heads * 2],
        });
    }
    let mut obs = Observers::new(c, opts);
    let max_len = opts
        .calibration_tokens
        .min(opts.context)
        .min(c.context_length);
    let total = (sequences.len() * max_len) as u64;
    let mut fm = FloatModel::new(c.clone(), Arc::new(weights), max_len)
        .map_err(|source| CompileError::Model { source })?;
    let stop = c.special.stop_tokens();
    for (p, prompt) in sequences.iter().enumerate() {
        let mut seq: Vec<u32> = prompt.iter().copied().take(max_len).collect();
        let base = (p * max_len) as u64;
        let mut pos = 0;
        while pos < seq.len() {
            let logits = fm
                .forward_tapped(seq[pos], pos, &mut obs)
                .map_err(|source| CompileError::Calibration { prompt: p, source })?;
            pos += 1;
            progress(Progress {
                stage: Stage::Calibrate,
                done: base + pos as u64,
                total,
            });
            if pos == seq.len() && seq.len() < max_len {
                let next = argmax(logits) as u32;
                if Some(next) != c.special.bos && !stop.contains(&next) {
                    seq.push(next);
                }
            }
        }
    }
    progress(Progress {
        stage: Stage::Calibrate,
        done: total,
        total,
    });
    let mut cal = obs.encodings(opts)?;
    if !opts.kv_dtype.is_fixed_point() {
        cal.kv = vec![float_kv; c.n_layers * c.n_kv_heads * 2];
    }
    Ok(cal)
}

fn act_name(i: usize, n_layers: usize) -> String {
    if i == n_layers * 4 {
        "the classifier input".into()
    } else {
        format!(
            "activation {} of layer {}",
            ActSite::ALL[i % 4].name(),
            i / 4
        )
    }
}
