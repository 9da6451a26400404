//! Calibration: the float forward pass (the arithmetic of [`model::FloatModel`], several
//! sequences in lockstep) seen through a [`Tap`] that feeds observers on the tensors the
//! executor quantizes.

use model::forward::{self, Activations, Input, Kernels, Output, Pass, Positions};
use model::ops::{Rope, argmax, attend_scaled, matmul, matmul_rows};
use model::{LlamaConfig, Site, Tap, Tensor, WeightSource};
use quant::{
    DataType, Encoding, HistogramObserver, MinMaxObserver, Observer, QuantSpec, ScaleOffset,
    Symmetry,
};

use crate::error::CompileError;
use crate::gptq::{Gram, Rounding};
use crate::model::{ActSite, act_index, act_of, classifier_act_index};
use crate::options::CompileOptions;
use crate::progress::{Progress, Stage};
use crate::smooth::{self, ChannelRanges, FFN_SMOOTHING, FfnSmoothing};

/// How the observers turn observed values into encodings (documented for users; part of the
/// calibration version).
///
/// * i16 matmul inputs: [`MinMaxObserver`], asymmetric (i16 has enough levels that clipping
///   outliers only hurts). With i8 weights the down projection's input is smoothed
///   ([`crate::FfnSmoothing`]): its per-channel min/max give the factors and the smoothed
///   range, widened by the margin.
/// * u16 KV: [`MinMaxObserver`], asymmetric, per (layer, KV head, K|V), both ends of the
///   range multiplied by [`U16_KV_MARGIN`]: text beyond calibration's positions reaches past
///   it, and 16 bits lose little to a wider range.
/// * u8 KV: [`HistogramObserver`] clipping at [`U8_KV_PERCENTILE`], asymmetric, per (layer, KV
///   head, K|V): with 256 levels a rare outlier would otherwise cost resolution for all values.
pub const U8_KV_PERCENTILE: f64 = 99.99;

/// How much wider than calibration saw a u16 K/V range is (both ends), chosen by measured KL
/// (README, "Accuracy on SmolLM2"): 1.5 leaves none of the scored text's K/V values clipped.
pub const U16_KV_MARGIN: f32 = 1.5;

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
            KvObserver::MinMax(o) => {
                let (lo, hi) = o.range().ok_or(quant::QuantError::NoObservations)?;
                let m = U16_KV_MARGIN;
                ScaleOffset::from_range(lo * m, hi * m, dtype, Symmetry::Asymmetric)
            }
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
    /// Per layer, the FFN smoothing factors to fold into `Up` and `Down` (empty: no fold).
    pub(crate) smoothing: Vec<Vec<f32>>,
    /// The Gram matrix of each layer's i16 matmul inputs, [`act_index`] order, unsmoothed
    /// (empty unless the weights are rounded by [`Rounding::Gptq`]).
    pub(crate) gram: Vec<Gram>,
}

/// The tap of calibration: routes the forward's values to the observers.
struct Observers {
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// i16 matmul inputs, [`act_index`] order (empty unless weights are i8).
    act: Vec<MinMaxObserver>,
    /// KV, in buffer order ([`graph_io::buffer_index`]; empty unless KV is fixed point).
    kv: Vec<KvObserver>,
    /// Per layer, the down input's per-channel ranges (empty unless the FFN is smoothed); they
    /// replace that site's observer in `act`.
    ffn: Vec<ChannelRanges>,
    /// The Gram matrices of the layers' matmul inputs, [`act_index`] order (empty unless the
    /// weights are rounded by [`Rounding::Gptq`]).
    gram: Vec<Gram>,
}

impl Tap for Observers {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        let act = match site {
            Site::AttnInput => Some(act_index(layer, ActSite::AttnIn)),
            Site::AttnOutput => Some(act_index(layer, ActSite::AttnOut)),
            Site::FfnInput => Some(act_index(layer, ActSite::FfnIn)),
            Site::FfnHidden => Some(act_index(layer, ActSite::FfnMid)),
            Site::FinalNorm => Some(classifier_act_index(self.n_layers)),
            _ => None,
        };
        if site == Site::FfnHidden
            && let Some(r) = self.ffn.get_mut(layer)
        {
            r.observe(values);
        } else if let Some(o) = act.and_then(|i| self.act.get_mut(i)) {
            o.observe(values);
        }
        if let Some(g) = act.and_then(|i| self.gram.get_mut(i)) {
            g.observe(values);
        }
        let kind = match site {
            Site::Key => graph_io::TensorKind::Key,
            Site::Value => graph_io::TensorKind::Value,
            _ => return,
        };
        for (h, head) in values.chunks_exact(self.head_dim).enumerate() {
            let i = graph_io::buffer_index(layer, h, kind, self.n_kv_heads);
            if let Some(o) = self.kv.get_mut(i) {
                o.observe(head);
            }
        }
    }
}

impl Observers {
    /// Observers for `opts`; `smooth`: the down inputs are observed per channel; `gram`: the
    /// matmul inputs' Gram matrices are accumulated.
    fn new(c: &LlamaConfig, opts: &CompileOptions, (smooth, gram): (bool, bool)) -> Observers {
        let act = if opts.weights.is_integer() {
            (0..=classifier_act_index(c.n_layers))
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
        let ffn = if smooth {
            (0..c.n_layers)
                .map(|_| ChannelRanges::new(c.hidden_dim))
                .collect()
        } else {
            Vec::new()
        };
        let gram = if gram && opts.weights.is_integer() {
            let width = |i: usize| match act_of(i, c.n_layers).map(|(_, s)| s) {
                Some(ActSite::AttnOut) => c.q_dim(),
                Some(ActSite::FfnMid) => c.hidden_dim,
                _ => c.dim,
            };
            (0..classifier_act_index(c.n_layers))
                .map(|i| Gram::new(width(i)))
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
            ffn,
            gram,
        }
    }

    /// The i16 encoding of activation `i` ([`act_index`] order): the observed range, or for a
    /// smoothed down input the range of the smoothed values (`factors` of its layer) times
    /// `margin`.
    fn act_encoding(
        &self,
        i: usize,
        factors: &[Vec<f32>],
        margin: f32,
    ) -> Result<ScaleOffset, quant::QuantError> {
        let smoothed = match act_of(i, self.n_layers) {
            Some((l, ActSite::FfnMid)) => self.ffn.get(l).zip(factors.get(l)),
            _ => None,
        };
        let (dtype, sym) = (DataType::I16, Symmetry::Asymmetric);
        match smoothed {
            Some((r, s)) => {
                let (lo, hi) = r
                    .smoothed_range(s, margin)
                    .ok_or(quant::QuantError::NoObservations)?;
                ScaleOffset::from_range(lo, hi, dtype, sym)
            }
            None => self.act[i].encoding(dtype, sym),
        }
    }

    /// The encodings of what was observed, and the FFN smoothing factors (from `Down` in
    /// `weights` and `smoothing`) when the down inputs were observed per channel.
    fn encodings(
        mut self,
        weights: &dyn WeightSource,
        opts: &CompileOptions,
        smoothing: Option<FfnSmoothing>,
    ) -> Result<Calibrated, CompileError> {
        self.gram.iter_mut().for_each(Gram::flush);
        let (alpha, margin) = smoothing.map_or((1.0, 1.0), |s| (s.alpha, s.margin));
        let factors: Vec<Vec<f32>> = self
            .ffn
            .iter()
            .enumerate()
            .map(|(l, r)| {
                let down = weights
                    .tensor(Tensor::Layer(l, model::LayerTensor::Down))
                    .unwrap_or(&[]);
                r.factors(down, alpha)
            })
            .collect();
        let act = (0..self.act.len())
            .map(|i| {
                self.act_encoding(i, &factors, margin)
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
        Ok(Calibrated {
            act,
            kv,
            smoothing: factors,
            gram: self.gram,
        })
    }
}

/// Runs the float model over the calibration sequences (each continued greedily up to
/// `opts.calibration_tokens`, clamped to the context, until BOS or a stop token comes out)
/// and returns the encodings. Without fixed-point KV and i8 weights nothing is run.
///
/// Up to [`LOCKSTEP_ROWS`] sequences run in lockstep: one forward pass per position with one
/// row per sequence ([`Lockstep`]), so each weight row is read once for all of them. The
/// values observed are those of [`model::FloatModel`] run over each sequence alone.
pub(crate) fn calibrate(
    c: &LlamaConfig,
    weights: &dyn WeightSource,
    sequences: &[Vec<u32>],
    (opts, recipe): (&CompileOptions, Recipe),
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
            smoothing: Vec::new(),
            gram: Vec::new(),
        });
    }
    for (prompt, seq) in sequences.iter().enumerate() {
        if let Some(&token) = seq.iter().find(|&&t| t as usize >= c.vocab_size) {
            let vocab_size = c.vocab_size;
            let source = model::Error::TokenOutOfRange { token, vocab_size };
            return Err(CompileError::Calibration { prompt, source });
        }
    }
    let smoothing = recipe
        .ffn_smoothing
        .filter(|_| smooth::applies(opts.weights));
    let gram = recipe.rounding == Rounding::Gptq;
    let mut obs = Observers::new(c, opts, (smoothing.is_some(), gram));
    let max_len = opts
        .calibration_tokens
        .min(opts.context)
        .min(c.context_length);
    let total = (sequences.len() * max_len) as u64;
    let mut done = 0;
    for (g, group) in sequences.chunks(LOCKSTEP_ROWS).enumerate() {
        let mut run = Lockstep::new(c, weights, group, max_len);
        while run.step(&mut obs, &mut done)? {
            progress(Progress {
                stage: Stage::Calibrate,
                done,
                total,
            });
        }
        done = ((g + 1) * LOCKSTEP_ROWS).min(sequences.len()) as u64 * max_len as u64;
    }
    progress(Progress {
        stage: Stage::Calibrate,
        done: total,
        total,
    });
    let mut cal = obs.encodings(weights, opts, smoothing)?;
    if !opts.kv_dtype.is_fixed_point() {
        cal.kv = vec![float_kv; c.n_layers * c.n_kv_heads * 2];
    }
    Ok(cal)
}

/// Most calibration sequences run in lockstep (rows of one pass).
const LOCKSTEP_ROWS: usize = 16;

/// The float forward over several independent sequences in lockstep: pass `t` runs position
/// `t` of every sequence that has one, one row each, with per-sequence f32 KV caches and the
/// arithmetic of [`model::FloatModel`] (f32 matmuls, causal attention over the sequence's own
/// positions `0..=t`, or the last W of them in a sliding-window layer), so every row's values
/// equal that model's for its sequence alone.
struct Lockstep<'a> {
    c: &'a LlamaConfig,
    w: &'a dyn WeightSource,
    rope: Rope,
    acts: Activations,
    /// The sequences, continued greedily up to `max_len`.
    seqs: Vec<Vec<u32>>,
    max_len: usize,
    /// The next position to run.
    t: usize,
    /// Per sequence: keys and values `[layer][pos][kv_dim]` (keys after RoPE).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// The sequence of each row of the current pass.
    rows: Vec<usize>,
    /// Greedy choice of each row of the current pass.
    next: Vec<u32>,
    scores: Vec<f32>,
    tbuf: Vec<f32>,
}

impl<'a> Lockstep<'a> {
    fn new(
        c: &'a LlamaConfig,
        w: &'a dyn WeightSource,
        group: &[Vec<u32>],
        max_len: usize,
    ) -> Self {
        let cache = || vec![0.0f32; c.n_layers * max_len * c.kv_dim()];
        Lockstep {
            c,
            w,
            rope: Rope::new(c.head_dim, &c.rope),
            acts: Activations::new(c, group.len()),
            seqs: group
                .iter()
                .map(|s| s.iter().copied().take(max_len).collect())
                .collect(),
            max_len,
            t: 0,
            keys: group.iter().map(|_| cache()).collect(),
            values: group.iter().map(|_| cache()).collect(),
            rows: Vec::with_capacity(group.len()),
            next: vec![0; group.len()],
            scores: vec![0.0; max_len],
            tbuf: Vec::new(),
        }
    }

    /// Runs position `t` of every sequence that has one (adding its tokens to `done`) and
    /// continues the sequences that end there; false when none was left.
    fn step(&mut self, tap: &mut dyn Tap, done: &mut u64) -> Result<bool, CompileError> {
        let t = self.t;
        self.rows.clear();
        self.rows
            .extend((0..self.seqs.len()).filter(|&s| t < self.seqs[s].len()));
        if self.rows.is_empty() {
            return Ok(false);
        }
        let tokens: Vec<u32> = self.rows.iter().map(|&s| self.seqs[s][t]).collect();
        let positions = vec![t; tokens.len()];
        let pass = Pass {
            layers: 0..self.c.n_layers,
            input: Input::Tokens(&tokens),
            positions: Positions::Ids(&positions),
            output: Output::Logits,
        };
        let (c, rope) = (self.c, self.rope.clone());
        let mut acts = std::mem::replace(&mut self.acts, Activations::new(c, 0));
        let result = forward::run(c, &rope, self, &mut acts, &pass, tap);
        self.acts = acts;
        let prompt = self.rows[0];
        result.map_err(|source| CompileError::Calibration { prompt, source })?;
        let stop = c.special.stop_tokens();
        for (i, &s) in self.rows.iter().enumerate() {
            let seq = &mut self.seqs[s];
            let next = self.next[i];
            if t + 1 == seq.len()
                && seq.len() < self.max_len
                && Some(next) != c.special.bos
                && !stop.contains(&next)
            {
                seq.push(next);
            }
        }
        *done += self.rows.len() as u64;
        self.t += 1;
        Ok(true)
    }

    fn tensor(&self, t: Tensor) -> &'a [f32] {
        self.w
            .tensor(t)
            .expect("compile checked that every required tensor is present")
    }
}

impl Kernels for Lockstep<'_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        let d = out.len();
        let t = token as usize;
        out.copy_from_slice(&self.tensor(Tensor::TokenEmbedding)[t * d..(t + 1) * d]);
    }

    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let cols = w.shape(self.c)[1];
        let m = self.tensor(w);
        if x.len() == cols {
            matmul(out, x, m);
        } else {
            if self.tbuf.len() < out.len() {
                self.tbuf.resize(out.len(), 0.0);
            }
            matmul_rows(out, x, m, cols, &mut self.tbuf);
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.tensor(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = self.c;
        let (hd, qd, kvd, kv_mul) = (c.head_dim, c.q_dim(), c.kv_dim(), c.kv_mul());
        let t = self.t;
        let base = layer * self.max_len * kvd;
        for (i, &s) in self.rows.iter().enumerate() {
            let at = base + t * kvd;
            self.keys[s][at..at + kvd].copy_from_slice(&k[i * kvd..(i + 1) * kvd]);
            self.values[s][at..at + kvd].copy_from_slice(&v[i * kvd..(i + 1) * kvd]);
            // A sliding-window layer sees positions `t + 1 - W ..= t` only.
            let first = c
                .layer_window(layer)
                .map_or(0, |w| (t + 1).saturating_sub(w));
            let from = base + first * kvd;
            let (keys, values) = (&self.keys[s][from..], &self.values[s][from..]);
            for h in 0..c.n_heads {
                let off = (h / kv_mul) * hd;
                let row = |p: usize| p * kvd + off..p * kvd + off + hd;
                let o = i * qd + h * hd;
                attend_scaled(
                    &q[o..o + hd],
                    c.attention_scale(),
                    t + 1 - first,
                    |p| &keys[row(p)],
                    |p| &values[row(p)],
                    |_| 0.0,
                    &mut self.scores,
                    &mut out[o..o + hd],
                );
            }
        }
    }

    fn logits(&mut self, row: usize, logits: &[f32]) {
        self.next[row] = argmax(logits) as u32;
    }
}

fn act_name(i: usize, n_layers: usize) -> String {
    match act_of(i, n_layers) {
        Some((l, site)) => format!("activation {} of layer {l}", site.name()),
        None => "the classifier input".into(),
    }
}

/// How a compile quantizes beyond its [`CompileOptions`]: choices made by measurement (README,
/// "Accuracy on SmolLM2"), which a compiled file does not record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recipe {
    /// The FFN smoothing of i8 builds ([`FFN_SMOOTHING`]), or none; ignored for other weights.
    pub ffn_smoothing: Option<FfnSmoothing>,
    /// How integer weights are rounded ([`Rounding::Gptq`]).
    pub rounding: Rounding,
}

impl Recipe {
    /// What [`crate::compile`] uses.
    pub const DEFAULT: Recipe = Recipe {
        ffn_smoothing: Some(FFN_SMOOTHING),
        rounding: Rounding::Gptq,
    };
}
