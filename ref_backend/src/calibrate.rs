//! Calibration: a float forward pass (llama2.c semantics) with observers on the tensors the
//! executor quantizes.

use llama2c::{Checkpoint, Tokenizer};
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

/// Runs the float model over the calibration prompts (each continued greedily up to
/// `opts.calibration_tokens`, clamped to the context) and returns the encodings.
/// Without fixed-point KV and i8 weights nothing is run.
pub(crate) fn calibrate(
    ckpt: &Checkpoint,
    opts: &CompileOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Calibrated, CompileError> {
    let c = ckpt.config;
    let n_kv = c.n_layers * c.n_kv_heads * 2;
    let float_kv = || -> Vec<QuantSpec> {
        (0..n_kv)
            .map(|_| QuantSpec {
                dtype: opts.kv_dtype,
                encoding: Encoding::Float,
            })
            .collect()
    };
    if !opts.needs_calibration() {
        return Ok(Calibrated {
            act: Vec::new(),
            kv: float_kv(),
        });
    }
    let mut act_obs: Vec<MinMaxObserver> = if opts.weights == crate::WeightType::I8 {
        (0..c.n_layers * 4 + 1)
            .map(|_| MinMaxObserver::new())
            .collect()
    } else {
        Vec::new()
    };
    let mut kv_obs: Vec<KvObserver> = if opts.kv_dtype.is_fixed_point() {
        (0..n_kv)
            .map(|_| {
                if opts.kv_dtype == DataType::U8 {
                    KvObserver::Hist(Box::new(HistogramObserver::new(
                        HIST_BINS,
                        U8_KV_PERCENTILE,
                    )))
                } else {
                    KvObserver::MinMax(MinMaxObserver::new())
                }
            })
            .collect()
    } else {
        Vec::new()
    };

    let max_len = opts.calibration_tokens.min(opts.context).min(c.seq_len);
    let total = (opts.calibration_prompts.len() * max_len) as u64;
    let mut fwd = ObservedForward::new(ckpt, max_len);
    for (p, prompt) in opts.calibration_prompts.iter().enumerate() {
        let mut seq: Vec<u32> = prompt.iter().copied().take(max_len).collect();
        if seq.is_empty() {
            seq.push(Tokenizer::BOS);
        }
        let base = (p * max_len) as u64;
        let mut pos = 0;
        while pos < seq.len() {
            let tok = seq[pos];
            if tok as usize >= c.vocab_size {
                return Err(CompileError::Calibration {
                    prompt: p,
                    source: llama2c::ModelError::TokenOutOfRange {
                        token: tok,
                        vocab_size: c.vocab_size,
                    },
                });
            }
            fwd.forward(tok as usize, pos, &mut act_obs, &mut kv_obs);
            pos += 1;
            progress(Progress {
                stage: Stage::Calibrate,
                done: base + pos as u64,
                total,
            });
            if pos == seq.len() && seq.len() < max_len {
                let next = llama2c::argmax(&fwd.logits) as u32;
                if next != Tokenizer::BOS && next != Tokenizer::EOS {
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

    let act = act_obs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            o.encoding(DataType::I16, Symmetry::Asymmetric)
                .map_err(|source| CompileError::Quant {
                    what: act_name(i, c.n_layers),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let kv = if opts.kv_dtype.is_fixed_point() {
        kv_obs
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let so = o
                    .encoding(opts.kv_dtype)
                    .map_err(|source| CompileError::Quant {
                        what: format!(
                            "{} of layer {} KV head {}",
                            if i % 2 == 0 { "keys" } else { "values" },
                            i / 2 / c.n_kv_heads,
                            i / 2 % c.n_kv_heads
                        ),
                        source,
                    })?;
                Ok(QuantSpec {
                    dtype: opts.kv_dtype,
                    encoding: Encoding::PerTensor(so),
                })
            })
            .collect::<Result<Vec<_>, CompileError>>()?
    } else {
        float_kv()
    };
    Ok(Calibrated { act, kv })
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

/// A float forward pass with its own KV cache that reports the tensors to observers.
struct ObservedForward<'a> {
    ckpt: &'a Checkpoint,
    cap: usize,
    kc: Vec<f32>,
    vc: Vec<f32>,
    x: Vec<f32>,
    xb: Vec<f32>,
    xb2: Vec<f32>,
    q: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    att: Vec<f32>,
    logits: Vec<f32>,
}

impl<'a> ObservedForward<'a> {
    fn new(ckpt: &'a Checkpoint, cap: usize) -> Self {
        let c = ckpt.config;
        ObservedForward {
            ckpt,
            cap,
            kc: vec![0.0; c.n_layers * cap * c.kv_dim()],
            vc: vec![0.0; c.n_layers * cap * c.kv_dim()],
            x: vec![0.0; c.dim],
            xb: vec![0.0; c.dim],
            xb2: vec![0.0; c.dim],
            q: vec![0.0; c.dim],
            hb: vec![0.0; c.hidden_dim],
            hb2: vec![0.0; c.hidden_dim],
            att: vec![0.0; cap],
            logits: vec![0.0; c.vocab_size],
        }
    }

    /// One token at `pos < cap` (positions fed in order from 0).
    fn forward(
        &mut self,
        token: usize,
        pos: usize,
        act: &mut [MinMaxObserver],
        kv: &mut [KvObserver],
    ) {
        let c = self.ckpt.config;
        let w = &self.ckpt.weights;
        let (hd, kv_dim, kv_mul) = (c.head_dim(), c.kv_dim(), c.kv_mul());
        let scale = 1.0 / (hd as f32).sqrt();
        let mut observe_act = |i: usize, v: &[f32]| {
            if let Some(o) = act.get_mut(i) {
                o.observe(v);
            }
        };
        self.x.copy_from_slice(w.embedding(token));
        for l in 0..c.n_layers {
            llama2c::rmsnorm(&mut self.xb, &self.x, w.rms_att(l));
            observe_act(act_index(l, ActSite::AttnIn), &self.xb);
            let base = l * self.cap * kv_dim;
            let row = base + pos * kv_dim;
            llama2c::matmul(&mut self.q, &self.xb, w.wq(l));
            let k = &mut self.kc[row..row + kv_dim];
            llama2c::matmul(k, &self.xb, w.wk(l));
            llama2c::rope_rotate(k, pos, hd);
            llama2c::matmul(&mut self.vc[row..row + kv_dim], &self.xb, w.wv(l));
            llama2c::rope_rotate(&mut self.q, pos, hd);
            if !kv.is_empty() {
                for h in 0..c.n_kv_heads {
                    let i = (l * c.n_kv_heads + h) * 2;
                    kv[i].observe(&self.kc[row + h * hd..row + (h + 1) * hd]);
                    kv[i + 1].observe(&self.vc[row + h * hd..row + (h + 1) * hd]);
                }
            }
            for h in 0..c.n_heads {
                let qh = &self.q[h * hd..(h + 1) * hd];
                let off = (h / kv_mul) * hd;
                let a = &mut self.att[..=pos];
                for (t, s) in a.iter_mut().enumerate() {
                    let r = base + t * kv_dim + off;
                    *s = llama2c::dot(qh, &self.kc[r..r + hd]) * scale;
                }
                llama2c::softmax(a);
                let out = &mut self.xb[h * hd..(h + 1) * hd];
                out.fill(0.0);
                for (t, &p) in a.iter().enumerate() {
                    let r = base + t * kv_dim + off;
                    for (o, &v) in out.iter_mut().zip(&self.vc[r..r + hd]) {
                        *o += p * v;
                    }
                }
            }
            observe_act(act_index(l, ActSite::AttnOut), &self.xb);
            llama2c::matmul(&mut self.xb2, &self.xb, w.wo(l));
            for (a, b) in self.x.iter_mut().zip(&self.xb2) {
                *a += b;
            }
            llama2c::rmsnorm(&mut self.xb, &self.x, w.rms_ffn(l));
            observe_act(act_index(l, ActSite::FfnIn), &self.xb);
            llama2c::matmul(&mut self.hb, &self.xb, w.w1(l));
            llama2c::matmul(&mut self.hb2, &self.xb, w.w3(l));
            for (g, u) in self.hb.iter_mut().zip(&self.hb2) {
                *g = llama2c::silu(*g) * u;
            }
            observe_act(act_index(l, ActSite::FfnMid), &self.hb);
            llama2c::matmul(&mut self.xb, &self.hb, w.w2(l));
            for (a, b) in self.x.iter_mut().zip(&self.xb) {
                *a += b;
            }
        }
        llama2c::rmsnorm(&mut self.xb, &self.x, &w.rms_final);
        observe_act(c.n_layers * 4, &self.xb);
        llama2c::matmul(&mut self.logits, &self.xb, self.ckpt.classifier());
    }
}
