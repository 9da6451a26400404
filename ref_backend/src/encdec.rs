//! The encoder-decoder test model ([`model::encdec`]) compiled into static graphs: one encoder
//! graph that writes the cross K/V in the static buffers' encodings, and one decoder graph per AR
//! variant that reads them (with the self-attention past windows) and writes the new self K/V.
//!
//! **Encoder** `encoder_e{E}`: input `source_ids [1, E]` i32; outputs, per decoder layer l and
//! KV head h, `cross_key_{l}_{h}` and `cross_value_{l}_{h}` `[1, 1, E, D]` in the cross encoding
//! ([`EncDecOptions::cross_dtype`]: f32, f16, or u8/u16 asymmetric per (layer, head, K|V) from the
//! min/max over the calibration sources).
//!
//! **Decoder** `ar{n}_cl{S}`: inputs `input_ids [1, n]` i32, `positions [1, n]` i32,
//! `attention_mask [1, 1, n, S]` f32 (0 / -inf, columns as in the Llama graphs), then per (l, h)
//! `past_key_{l}_{h}`, `past_value_{l}_{h}` `[1, 1, S-n, D]` f32, then per (l, h)
//! `cross_key_{l}_{h}`, `cross_value_{l}_{h}` `[1, 1, E, D]` (the encoder's outputs, same
//! encodings); outputs `logits [1, n, V]` f32, then per (l, h) `new_key_{l}_{h}`,
//! `new_value_{l}_{h}` `[1, 1, n, D]` f32.
//!
//! Weights and activations are f32 (this model proves the static K/V wiring, not weight
//! quantization); the cross K/V are dequantized on read, so the quantized variants differ from
//! the float oracle by the cross encoding's rounding only. The decoder runs the one forward with
//! [`model::encdec::WithCross`] over these kernels.

use std::sync::Arc;

use model::encdec::{CrossKv, CrossScratch, EncDecConfig, EncDecWeights, WithCross, encode};
use model::forward::{Activations, Input, Kernels, Output, Pass, Positions, linear_rows, run};
use model::ops::{Rope, attend};
use model::{NoTap, Tensor, WeightSource};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset, Symmetry};

use graph_io::{IoRole, IoTensor, KvIo, KvTensor, TensorKind};

use crate::{CompileError, ExecError};

/// K or V of a buffer.
fn kind_of(value: bool) -> TensorKind {
    if value {
        TensorKind::Value
    } else {
        TensorKind::Key
    }
}

/// What to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct EncDecOptions {
    /// Decoder context S.
    pub context: usize,
    /// Decoder AR variants.
    pub ar: Vec<usize>,
    /// Element type of the static cross K/V.
    pub cross_dtype: DataType,
}

/// One static graph: the encoder (`ar == None`) or a decoder AR variant.
#[derive(Debug, Clone, PartialEq)]
pub struct EncDecGraph {
    /// `encoder_e{E}` or `ar{n}_cl{S}`.
    pub name: String,
    /// n of a decoder graph; `None` for the encoder.
    pub ar: Option<usize>,
    /// Inputs, in order.
    pub inputs: Vec<IoTensor>,
    /// Outputs, in order.
    pub outputs: Vec<IoTensor>,
}

/// The compiled encoder-decoder model.
#[derive(Debug, Clone)]
pub struct EncDecCompiled {
    config: EncDecConfig,
    weights: Arc<EncDecWeights>,
    context: usize,
    /// Per buffer ([`graph_io::buffer_index`] order).
    cross: Vec<QuantSpec>,
    graphs: Vec<EncDecGraph>,
}

/// A non-K/V tensor of `role` (i32 without an encoding).
fn tensor(name: &str, role: IoRole, shape: Vec<usize>, quant: Option<QuantSpec>) -> IoTensor {
    IoTensor {
        name: name.into(),
        role,
        layer: None,
        head: None,
        dtype: quant.as_ref().map_or(DataType::I32, |q| q.dtype),
        shape,
        quant,
    }
}

/// The per-head K/V tensor `t`.
fn kv_tensor(t: KvTensor, shape: Vec<usize>, quant: QuantSpec) -> IoTensor {
    IoTensor {
        layer: Some(t.layer),
        head: t.head,
        ..tensor(&t.name(), IoRole::kv(t.io, t.kind), shape, Some(quant))
    }
}

fn f32_spec() -> QuantSpec {
    QuantSpec {
        dtype: DataType::F32,
        encoding: Encoding::Float,
    }
}

/// Compiles `weights` for `options`; u8/u16 cross encodings come from the encoder run over the
/// `calibration` sources (each exactly E tokens, at least one).
pub fn compile_encdec(
    config: &EncDecConfig,
    weights: Arc<EncDecWeights>,
    calibration: &[Vec<u32>],
    options: &EncDecOptions,
) -> Result<EncDecCompiled, CompileError> {
    let invalid = |reason: String| CompileError::InvalidOptions { reason };
    weights
        .check(config)
        .map_err(|source| CompileError::Model { source })?;
    let d = &config.decoder;
    let s = options.context;
    if s < 2 || s > d.context_length {
        return Err(invalid(format!(
            "context {s} must be in 2..={}",
            d.context_length
        )));
    }
    if options.ar.is_empty() || options.ar.iter().any(|&n| n == 0 || n >= s) {
        return Err(invalid(format!(
            "AR variants {:?} must be in 1..{s}",
            options.ar
        )));
    }
    let cross = cross_encodings(config, &weights, calibration, options.cross_dtype)?;
    let mut model = EncDecCompiled {
        config: config.clone(),
        weights,
        context: s,
        cross,
        graphs: Vec::new(),
    };
    model.graphs.push(model.describe_encoder());
    for &n in &options.ar {
        model.graphs.push(model.describe_decoder(n));
    }
    Ok(model)
}

/// One encoding per cross buffer.
fn cross_encodings(
    c: &EncDecConfig,
    w: &EncDecWeights,
    calibration: &[Vec<u32>],
    dtype: DataType,
) -> Result<Vec<QuantSpec>, CompileError> {
    let d = &c.decoder;
    let buffers = d.n_layers * d.n_kv_heads * 2;
    if dtype.is_float() {
        return Ok(vec![
            QuantSpec::float(dtype).expect("a float type");
            buffers
        ]);
    }
    if !matches!(dtype, DataType::U8 | DataType::U16) {
        return Err(CompileError::InvalidOptions {
            reason: format!("cross K/V type {dtype}: use u8, u16, f16 or f32"),
        });
    }
    if calibration.is_empty() {
        return Err(CompileError::InvalidOptions {
            reason: "quantized cross K/V needs at least one calibration source".into(),
        });
    }
    let mut ranges = vec![(f32::INFINITY, f32::NEG_INFINITY); buffers];
    for (prompt, source) in calibration.iter().enumerate() {
        let kv =
            encode(c, w, source).map_err(|source| CompileError::Calibration { prompt, source })?;
        for_each_cross_row(d, &kv, |b, row| {
            let r = &mut ranges[b];
            for &x in row {
                *r = (r.0.min(x), r.1.max(x));
            }
        });
    }
    ranges
        .iter()
        .enumerate()
        .map(|(b, &(lo, hi))| {
            let so = ScaleOffset::from_range(lo.min(0.0), hi.max(0.0), dtype, Symmetry::Asymmetric)
                .map_err(|source| CompileError::Quant {
                    what: format!("cross buffer {b}"),
                    source,
                })?;
            Ok(QuantSpec {
                dtype,
                encoding: Encoding::PerTensor(so),
            })
        })
        .collect()
}

/// Calls `f(buffer, row)` for every row (E per buffer, in order) of every cross buffer.
fn for_each_cross_row(d: &model::LlamaConfig, kv: &CrossKv, mut f: impl FnMut(usize, &[f32])) {
    let (hd, kvd) = (d.head_dim, d.kv_dim());
    for l in 0..d.n_layers {
        let (keys, values) = kv.layer(l);
        for h in 0..d.n_kv_heads {
            for (value, data) in [(false, keys), (true, values)] {
                let b = graph_io::buffer_index(l, h, kind_of(value), d.n_kv_heads);
                for t in 0..kv.rows {
                    f(b, &data[t * kvd + h * hd..t * kvd + (h + 1) * hd]);
                }
            }
        }
    }
}

impl EncDecCompiled {
    /// The model description.
    pub fn config(&self) -> &EncDecConfig {
        &self.config
    }

    /// The graphs: the encoder first, then one decoder per AR variant.
    pub fn graphs(&self) -> &[EncDecGraph] {
        &self.graphs
    }

    /// The encoding of cross buffer (layer, head, K|V).
    pub fn cross_encoding(&self, layer: usize, head: usize, value: bool) -> &QuantSpec {
        let h = self.config.decoder.n_kv_heads;
        &self.cross[graph_io::buffer_index(layer, head, kind_of(value), h)]
    }

    /// The per-head K/V tensors of side `io`, in buffer order.
    fn kv_tensors(&self, io: KvIo) -> Vec<KvTensor> {
        let d = &self.config.decoder;
        let mut out = Vec::new();
        for layer in 0..d.n_layers {
            for h in 0..d.n_kv_heads {
                for kind in [TensorKind::Key, TensorKind::Value] {
                    out.push(KvTensor {
                        io,
                        kind,
                        layer,
                        head: Some(h),
                    });
                }
            }
        }
        out
    }

    fn cross_tensors(&self) -> Vec<IoTensor> {
        let (e, hd) = (self.config.source_len, self.config.decoder.head_dim);
        self.kv_tensors(KvIo::Cross)
            .into_iter()
            .map(|t| {
                // A per-head tensor's position is its buffer index.
                let q = &self.cross[t.position(self.config.decoder.n_kv_heads)];
                kv_tensor(t, vec![1, 1, e, hd], q.clone())
            })
            .collect()
    }

    fn describe_encoder(&self) -> EncDecGraph {
        let e = self.config.source_len;
        EncDecGraph {
            name: format!("encoder_e{e}"),
            ar: None,
            inputs: vec![tensor("source_ids", IoRole::SourceIds, vec![1, e], None)],
            outputs: self.cross_tensors(),
        }
    }

    fn describe_decoder(&self, n: usize) -> EncDecGraph {
        let (s, d) = (self.context, &self.config.decoder);
        let kv = |io: KvIo, rows: usize| -> Vec<IoTensor> {
            self.kv_tensors(io)
                .into_iter()
                .map(|t| kv_tensor(t, vec![1, 1, rows, d.head_dim], f32_spec()))
                .collect()
        };
        let mut inputs = vec![
            tensor("input_ids", IoRole::InputIds, vec![1, n], None),
            tensor("positions", IoRole::Positions, vec![1, n], None),
            tensor(
                &graph_io::mask_name(None),
                IoRole::Mask,
                vec![1, 1, n, s],
                Some(f32_spec()),
            ),
        ];
        inputs.extend(kv(KvIo::Past, s - n));
        inputs.extend(self.cross_tensors());
        let logits = vec![1, n, d.vocab_size];
        let mut outputs = vec![tensor("logits", IoRole::Logits, logits, Some(f32_spec()))];
        outputs.extend(kv(KvIo::New, n));
        EncDecGraph {
            name: format!("ar{n}_cl{s}"),
            ar: Some(n),
            inputs,
            outputs,
        }
    }

    /// Runs graph `graph` on `inputs`/`outputs` (each exactly its tensor's bytes, in order).
    /// Counts, sizes, token ids and positions are checked before anything is written; a graph
    /// index past [`EncDecCompiled::graphs`] is an `InputCount` error for graph `#index`, which
    /// has no inputs.
    pub fn execute(
        &self,
        graph: usize,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ExecError> {
        let g = self
            .graphs
            .get(graph)
            .ok_or_else(|| ExecError::InputCount {
                graph: format!("#{graph}"),
                expected: 0,
                found: inputs.len(),
            })?;
        check_buffers(g, inputs, outputs)?;
        let vocab = self.config.decoder.vocab_size;
        let ids = read_i32(inputs[0]);
        for (index, &value) in ids.iter().enumerate() {
            if value < 0 || value as usize >= vocab {
                return Err(ExecError::TokenOutOfRange {
                    graph: g.name.clone(),
                    tensor: g.inputs[0].name.clone(),
                    index,
                    value,
                    vocab_size: vocab,
                });
            }
        }
        let ids: Vec<u32> = ids.iter().map(|&v| v as u32).collect();
        match g.ar {
            None => self.run_encoder(&ids, outputs),
            Some(n) => self.run_decoder(g, n, &ids, inputs, outputs),
        }
    }

    fn run_encoder(&self, source: &[u32], outputs: &mut [&mut [u8]]) -> Result<(), ExecError> {
        let d = &self.config.decoder;
        let kv = encode(&self.config, &self.weights, source)
            .expect("checked at compile time: weights, and E source tokens in the vocabulary");
        let mut rows: Vec<Vec<f32>> = vec![Vec::new(); self.cross.len()];
        for_each_cross_row(d, &kv, |b, row| rows[b].extend_from_slice(row));
        for ((out, data), spec) in outputs.iter_mut().zip(&rows).zip(&self.cross) {
            quant::encode_f32_to_bytes(data, spec, out)
                .expect("the cross encodings are per-tensor or float, sized by the description");
        }
        Ok(())
    }

    fn run_decoder(
        &self,
        g: &EncDecGraph,
        n: usize,
        ids: &[u32],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ExecError> {
        let d = &self.config.decoder;
        let positions = read_i32(inputs[1]);
        if let Some((index, &value)) = positions.iter().enumerate().find(|(_, p)| **p < 0) {
            return Err(ExecError::NegativePosition {
                graph: g.name.clone(),
                tensor: g.inputs[1].name.clone(),
                index,
                value,
            });
        }
        let positions: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
        let units = d.n_layers * d.n_kv_heads;
        let past = &inputs[3..3 + 2 * units];
        let cross = self.decode_cross(&inputs[3 + 2 * units..]);
        let (logits, new) = outputs.split_at_mut(1);
        let base = StepKernels {
            config: d,
            weights: &self.weights.decoder,
            window: self.context - n,
            mask: read_f32(inputs[2]),
            past,
            new,
            logits: &mut logits[0][..],
            scores: vec![0.0; self.context],
        };
        let mut scratch = CrossScratch::new(d, self.config.source_len);
        let mut k = WithCross {
            base,
            config: d,
            weights: &self.weights.cross,
            cross: &cross,
            scratch: &mut scratch,
        };
        let pass = Pass {
            layers: 0..d.n_layers,
            input: Input::Tokens(ids),
            positions: Positions::Ids(&positions),
            output: Output::Logits,
        };
        let rope = Rope::new(d.head_dim, &d.rope);
        let mut acts = Activations::new(d, n);
        run(d, &rope, &mut k, &mut acts, &pass, &mut NoTap)
            .expect("ids, positions and row counts were checked against the description");
        Ok(())
    }

    /// The cross inputs dequantized into `[layer][E][kv_dim]` rows.
    fn decode_cross(&self, inputs: &[&[u8]]) -> CrossKv {
        let d = &self.config.decoder;
        let (e, hd, kvd) = (self.config.source_len, d.head_dim, d.kv_dim());
        let mut kv = CrossKv::zeros(d.n_layers, e, kvd);
        let mut rows = vec![0.0; e * hd];
        for (b, (bytes, spec)) in inputs.iter().zip(&self.cross).enumerate() {
            quant::decode_bytes_to_f32(bytes, spec, &mut rows)
                .expect("sized by the description, per-tensor or float");
            let (l, h, value) = (b / 2 / d.n_kv_heads, b / 2 % d.n_kv_heads, b % 2 == 1);
            let (keys, values) = kv.layer_mut(l);
            let dst = if value { values } else { keys };
            for t in 0..e {
                dst[t * kvd + h * hd..t * kvd + (h + 1) * hd]
                    .copy_from_slice(&rows[t * hd..(t + 1) * hd]);
            }
        }
        kv
    }
}

fn check_buffers(
    g: &EncDecGraph,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<(), ExecError> {
    let graph = || g.name.clone();
    if inputs.len() != g.inputs.len() {
        return Err(ExecError::InputCount {
            graph: graph(),
            expected: g.inputs.len(),
            found: inputs.len(),
        });
    }
    if outputs.len() != g.outputs.len() {
        return Err(ExecError::OutputCount {
            graph: graph(),
            expected: g.outputs.len(),
            found: outputs.len(),
        });
    }
    for (index, (t, b)) in g.inputs.iter().zip(inputs).enumerate() {
        if b.len() != t.byte_size() {
            return Err(ExecError::InputSize {
                graph: graph(),
                tensor: t.name.clone(),
                index,
                expected: t.byte_size(),
                found: b.len(),
            });
        }
    }
    for (index, (t, b)) in g.outputs.iter().zip(outputs.iter()).enumerate() {
        if b.len() != t.byte_size() {
            return Err(ExecError::OutputSize {
                graph: graph(),
                tensor: t.name.clone(),
                index,
                expected: t.byte_size(),
                found: b.len(),
            });
        }
    }
    Ok(())
}

fn read_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The decoder step's kernels: f32 weights; self-attention over the f32 past windows and the
/// step's new rows (written to the outputs), under the additive mask.
struct StepKernels<'a, 'p, 'n> {
    config: &'a model::LlamaConfig,
    weights: &'a model::Weights,
    window: usize,
    mask: Vec<f32>,
    /// Past K then V per (layer, head).
    past: &'a [&'p [u8]],
    /// `new_key`, `new_value` per (layer, head).
    new: &'a mut [&'n mut [u8]],
    logits: &'a mut [u8],
    scores: Vec<f32>,
}

impl StepKernels<'_, '_, '_> {
    fn tensor(&self, t: Tensor) -> &[f32] {
        self.weights
            .tensor(t)
            .expect("checked at compile time by EncDecWeights::check")
    }
}

impl Kernels for StepKernels<'_, '_, '_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        let (dim, t) = (out.len(), token as usize);
        out.copy_from_slice(&self.tensor(Tensor::TokenEmbedding)[t * dim..(t + 1) * dim]);
    }
    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let shape = w.shape(self.config);
        linear_rows(self.tensor(w), shape[0], shape[1], x, out);
    }
    fn vector(&self, v: Tensor) -> &[f32] {
        self.tensor(v)
    }
    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = self.config;
        let (hd, qd, kvd, kv_mul) = (c.head_dim, c.q_dim(), c.kv_dim(), c.kv_mul());
        let (w, n) = (self.window, q.len() / qd);
        let s = w + n;
        for kh in 0..c.n_kv_heads {
            let kb = graph_io::buffer_index(layer, kh, TensorKind::Key, c.n_kv_heads);
            let vb = graph_io::buffer_index(layer, kh, TensorKind::Value, c.n_kv_heads);
            // Past window rows then the new rows: key/value row t of the mask's column t.
            let mut keys = read_f32(self.past[kb]);
            let mut values = read_f32(self.past[vb]);
            for i in 0..n {
                let (kr, vr) = (&k[i * kvd + kh * hd..][..hd], &v[i * kvd + kh * hd..][..hd]);
                keys.extend_from_slice(kr);
                values.extend_from_slice(vr);
                write_f32(kr, &mut self.new[kb][i * hd * 4..(i + 1) * hd * 4]);
                write_f32(vr, &mut self.new[vb][i * hd * 4..(i + 1) * hd * 4]);
            }
            for i in 0..n {
                let mask = &self.mask[i * s..(i + 1) * s];
                for h in (kh * kv_mul)..((kh + 1) * kv_mul) {
                    attend(
                        &q[i * qd + h * hd..i * qd + (h + 1) * hd],
                        s,
                        |t| &keys[t * hd..(t + 1) * hd],
                        |t| &values[t * hd..(t + 1) * hd],
                        |t| mask[t],
                        &mut self.scores,
                        &mut out[i * qd + h * hd..i * qd + (h + 1) * hd],
                    );
                }
            }
        }
    }
    fn logits(&mut self, row: usize, logits: &[f32]) {
        let v = logits.len();
        write_f32(logits, &mut self.logits[row * v * 4..(row + 1) * v * 4]);
    }
}

fn write_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}
