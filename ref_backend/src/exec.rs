//! The executor: one static AR-n graph over raw byte buffers. [`Graph::run`] decodes the input
//! buffers, runs the shared forward ([`model::forward::run`]) with [`ExecKernels`] (quantized
//! matrices, the KV codec writing the new-KV outputs, the static window and mask) and writes
//! the logits.

use std::sync::{Arc, Mutex};

use graph_io::{IoTensor, KvIo, KvTensor, LogitRows, TensorKind};
use model::forward::{self, Activations, Input, Kernels, Output, Pass, Positions};
use model::ops::Rope;
use model::{NoTap, Tensor};
use quant::{DataType, Encoding, ScaleOffset};

use crate::error::ExecError;
use crate::kernels;
use crate::model::{MASKED_AT_OR_BELOW, Matrix, ModelData, mask_encoding};
use crate::parts::Part;
use crate::types::{Granularity, KLayout};

mod attention;

use attention::{AttnScratch, MaskScratch};

/// Element codec of one KV head's tensors.
#[derive(Debug, Clone, Copy)]
enum Codec {
    U8(ScaleOffset),
    U16(ScaleOffset),
    F16,
    F32,
}

impl Codec {
    fn new(dtype: DataType, enc: &Encoding) -> Codec {
        let so = match enc {
            Encoding::PerTensor(so) => *so,
            _ => ScaleOffset {
                scale: 1.0,
                offset: 0,
            },
        };
        match dtype {
            DataType::U8 => Codec::U8(so),
            DataType::U16 => Codec::U16(so),
            DataType::F16 => Codec::F16,
            // The compiler rejects i8/i16 KV; f32 is the remaining case.
            _ => Codec::F32,
        }
    }

    fn size(self) -> usize {
        match self {
            Codec::U8(_) => 1,
            Codec::U16(_) | Codec::F16 => 2,
            Codec::F32 => 4,
        }
    }

    /// Writes `x` in this encoding at `dst[..size]` and returns the value that reads back.
    #[inline]
    fn encode(self, x: f32, dst: &mut [u8]) -> f32 {
        match self {
            Codec::U8(so) => {
                let q = quant::quantize::<u8>(x, so);
                dst[0] = q;
                quant::dequantize(q, so)
            }
            Codec::U16(so) => {
                let q = quant::quantize::<u16>(x, so);
                dst[..2].copy_from_slice(&q.to_le_bytes());
                quant::dequantize(q, so)
            }
            Codec::F16 => {
                let h = half::f16::from_f32(x);
                dst[..2].copy_from_slice(&h.to_le_bytes());
                h.to_f32()
            }
            Codec::F32 => {
                dst[..4].copy_from_slice(&x.to_le_bytes());
                x
            }
        }
    }

    /// Reads `dst.len()` consecutive elements from `src` (one match for the whole run; each
    /// value is exactly what [`decode`](Self::decode) gives).
    fn decode_run(self, src: &[u8], dst: &mut [f32]) {
        match self {
            // The f32 form vectorizes; it is bit-identical where `dequantizes_exactly_in_f32`.
            Codec::U8(so) if so.dequantizes_exactly_in_f32(DataType::U8) => {
                for (d, &q) in dst.iter_mut().zip(src) {
                    *d = so.dequantize_i32_in_f32(i32::from(q));
                }
            }
            Codec::U16(so) if so.dequantizes_exactly_in_f32(DataType::U16) => {
                for (d, ch) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = so.dequantize_i32_in_f32(i32::from(u16::from_le_bytes([ch[0], ch[1]])));
                }
            }
            Codec::U8(so) => {
                for (d, &q) in dst.iter_mut().zip(src) {
                    *d = quant::dequantize(q, so);
                }
            }
            Codec::U16(so) => {
                for (d, ch) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = quant::dequantize(u16::from_le_bytes([ch[0], ch[1]]), so);
                }
            }
            Codec::F16 => {
                for (d, ch) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = half::f16::from_le_bytes([ch[0], ch[1]]).to_f32();
                }
            }
            Codec::F32 => decode_f32(src, dst),
        }
    }

    /// Reads the element at `src[..size]`.
    #[inline]
    fn decode(self, src: &[u8]) -> f32 {
        match self {
            Codec::U8(so) => quant::dequantize(src[0], so),
            Codec::U16(so) => quant::dequantize(u16::from_le_bytes([src[0], src[1]]), so),
            Codec::F16 => half::f16::from_le_bytes([src[0], src[1]]).to_f32(),
            Codec::F32 => f32::from_le_bytes([src[0], src[1], src[2], src[3]]),
        }
    }
}

/// Where one (layer, KV head)'s tensors are: buffer indices and byte offsets inside them.
#[derive(Debug, Clone, Copy)]
struct KvSlot {
    past_k: usize,
    past_v: usize,
    new_k: usize,
    new_v: usize,
    /// Byte offset of this head inside the past tensors (non-zero for per-layer tensors).
    past_off: usize,
    /// Byte offset of this head inside the new tensors.
    new_off: usize,
    /// Rows of the past tensors: `S - n`, or `W - 1` on a sliding layer of window W.
    rows: usize,
    /// The layer's mask: index into [`AttnScratch::masks`] (0: the global one).
    mask: usize,
    k: Codec,
    v: Codec,
}

/// Per-graph scratch, allocated once when the graph is built.
#[derive(Debug)]
struct Scratch {
    ids: Vec<u32>,
    pos: Vec<usize>,
    /// The hidden state input (parts after the first), `[n, dim]`.
    hidden: Vec<f32>,
    /// RoPE tables (graphs that take them), `[n, head_dim / 2]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
    acts: Activations,
    attn: AttnScratch,
    /// i16 activations of the step's rows (`n x` the widest matrix input).
    qbuf: Vec<i16>,
    /// Transpose scratch of the batched matmul (`n x` the widest matrix output; empty for
    /// AR-1).
    tbuf: Vec<f32>,
}

/// One static AR-n graph of a compiled model (QNN: one graph of a context binary).
///
/// Inputs/outputs are raw little-endian buffers laid out as [`Graph::inputs`] /
/// [`Graph::outputs`] describe (see the crate docs for the semantics). The graph owns
/// preallocated scratch behind a [`Mutex`]: [`execute`](Self::execute) takes `&self`, performs
/// no heap allocation on success, and concurrent calls on one graph are serialized.
pub struct Graph {
    name: String,
    ar: usize,
    /// The rows its logits output holds (on the last part).
    rows: LogitRows,
    context: usize,
    inputs: Vec<IoTensor>,
    outputs: Vec<IoTensor>,
    model: Arc<ModelData>,
    part: Part,
    rope: Rope,
    slots: Vec<KvSlot>,
    mask_u16: bool,
    scratch: Mutex<Scratch>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.name)
            .field("ar", &self.ar)
            .field("context", &self.context)
            .field("inputs", &self.inputs.len())
            .field("outputs", &self.outputs.len())
            .finish_non_exhaustive()
    }
}

/// Access to the buffers of one execution (slices or raw pointers).
/// `Send`: a step runs on a pool thread ([`kernels::on_busy_pool`]) while the caller waits.
/// `Sync`: the attention reads inputs from several pool threads at once.
trait Io: Send + Sync {
    fn input(&self, i: usize) -> &[u8];
    fn output(&mut self, i: usize) -> &mut [u8];
}

struct SliceIo<'a, 'b, 'c, 'd> {
    inputs: &'a [&'b [u8]],
    outputs: &'c mut [&'d mut [u8]],
}

impl Io for SliceIo<'_, '_, '_, '_> {
    fn input(&self, i: usize) -> &[u8] {
        self.inputs[i]
    }
    fn output(&mut self, i: usize) -> &mut [u8] {
        self.outputs[i]
    }
}

struct RawIo<'a> {
    inputs: &'a [(*const u8, usize)],
    outputs: &'a [(*mut u8, usize)],
}

// SAFETY: `execute_raw`'s contract gives the call exclusive use of the buffers until it
// returns; the executor hands its `RawIo` to one pool thread while the calling thread waits for
// the step, so one thread at a time reads and writes through the pointers, within the call.
unsafe impl Send for RawIo<'_> {}

// SAFETY: through `&RawIo` only `input` is reachable, which hands out shared slices of input
// buffers; the call never writes them (outputs overlap no input, and are written only through
// `&mut RawIo`), so concurrent reads from several threads see no data race.
unsafe impl Sync for RawIo<'_> {}

impl Io for RawIo<'_> {
    fn input(&self, i: usize) -> &[u8] {
        let (p, n) = self.inputs[i];
        // SAFETY: `execute_raw`'s contract: `p` is non-null (checked), valid for reads of `n`
        // bytes for the whole call, and no output (the only memory written) overlaps it.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
    fn output(&mut self, i: usize) -> &mut [u8] {
        let (p, n) = self.outputs[i];
        // SAFETY: `execute_raw`'s contract: `p` is non-null (checked), valid for writes of `n`
        // bytes, and overlaps no other output or input; `&mut self` ensures at most one output
        // slice is alive at a time and no input slice coexists with it.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

impl Graph {
    pub(crate) fn new(
        name: String,
        (ar, rows): (usize, LogitRows),
        model: Arc<ModelData>,
        part: Part,
    ) -> Graph {
        let (inputs, outputs) = model.describe(ar, rows, &part);
        let windows = model.part_windows(&part);
        let leading = leading_inputs(&part) + windows.len();
        let c = &model.config;
        let o = &model.options;
        let d = c.head_dim;
        let hk = c.n_kv_heads;
        let esize = o.kv_dtype.size_bytes();
        let mut slots = Vec::with_capacity(c.n_layers * hk);
        for l in part.layers.clone() {
            let w = model.past_rows(l, ar);
            let window = model.graph_window(l);
            // Mask 0 is the global one, mask 1 + i the one of `windows[i]`.
            let mask = window.map_or(0, |x| {
                1 + (windows.iter().position(|&y| y == x))
                    .expect("part_windows lists every window of the part's layers")
            });
            for h in 0..hk {
                let kspec = model.kv_spec(l, h, false);
                let vspec = model.kv_spec(l, h, true);
                let (head, past_off, new_off) = match o.granularity {
                    Granularity::PerHead => (Some(h), 0, 0),
                    Granularity::PerLayer => (None, h * w * d * esize, h * ar * d * esize),
                };
                // Inputs: the leading ones, then the part's K/V tensors; outputs: logits or
                // the hidden state, then K/V.
                let key = |io| KvTensor {
                    io,
                    kind: TensorKind::Key,
                    layer: l - part.layers.start,
                    head,
                };
                let past_k = leading + key(KvIo::Past).position(hk);
                let new_k = 1 + key(KvIo::New).position(hk);
                slots.push(KvSlot {
                    past_k,
                    past_v: past_k + 1,
                    new_k,
                    new_v: new_k + 1,
                    past_off,
                    new_off,
                    rows: w,
                    mask,
                    k: Codec::new(kspec.dtype, &kspec.encoding),
                    v: Codec::new(vspec.dtype, &vspec.encoding),
                });
            }
        }
        let (n, s) = (ar, o.context);
        // The widest input of a matrix, and the widest output: the classifier's on the last
        // part, or Q/K/V's or gate/up's together (one fused job, `linear_many`).
        let widest = c.dim.max(c.hidden_dim).max(c.q_dim());
        let fused = (c.q_dim() + 2 * c.kv_dim()).max(2 * c.hidden_dim);
        let widest_out = if part.is_last() && rows.count(n) > 1 {
            widest.max(fused).max(c.vocab_size)
        } else {
            widest.max(fused)
        };
        let table = if part.rope_tables { n * d / 2 } else { 0 };
        let w = s - n;
        let masks = std::iter::once(w)
            .chain(windows.iter().map(|&x| x - 1))
            .map(|rows| MaskScratch::new(n, rows))
            .collect();
        let scratch = Scratch {
            ids: vec![0; n],
            pos: vec![0; n],
            hidden: vec![0.0; if part.is_first() { 0 } else { n * c.dim }],
            cos: vec![0.0; table],
            sin: vec![0.0; table],
            acts: match rows {
                LogitRows::All => Activations::new(c, n),
                LogitRows::Last => Activations::last_row(c, n),
            },
            attn: AttnScratch::new(c, n, w, masks),
            qbuf: vec![0; n * widest],
            tbuf: vec![0.0; if n > 1 { n * widest_out } else { 0 }],
        };
        Graph {
            name,
            ar,
            rows,
            context: s,
            inputs,
            outputs,
            mask_u16: o.kv_dtype.is_fixed_point(),
            rope: Rope::new(d, &c.rope),
            part,
            model,
            slots,
            scratch: Mutex::new(scratch),
        }
    }

    /// Bytes of the graph's preallocated scratch (its intermediate activations): what an HTP
    /// graph would spill to and fill from DDR, reported as the spill-fill size by the QNN
    /// library.
    pub fn scratch_bytes(&self) -> usize {
        let s = match self.scratch.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let words = s.ids.len() * 4
            + s.pos.len() * std::mem::size_of::<usize>()
            + (s.hidden.len() + s.cos.len() + s.sin.len()) * 4;
        s.acts.bytes() + s.attn.bytes() + s.qbuf.len() * 2 + s.tbuf.len() * 4 + words
    }

    /// Graph name, e.g. `ar32_cl512`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The part of the model the graph runs ([`Part::whole`] for htpkv's own graphs).
    pub fn part(&self) -> &Part {
        &self.part
    }

    /// Tokens per step (n).
    pub fn ar(&self) -> usize {
        self.ar
    }

    /// The rows its logits output holds: every row, or only the last (a prefill graph).
    pub fn logit_rows(&self) -> LogitRows {
        self.rows
    }

    /// Context length S.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Rows of each global layer's past window, `S - n` (a sliding layer of window W has
    /// `W - 1`: [`past_rows`](Self::past_rows)).
    pub fn window(&self) -> usize {
        self.context - self.ar
    }

    /// Rows of `layer`'s past tensors: `S - n`, or `W - 1` on a sliding layer of window W.
    pub fn past_rows(&self, layer: usize) -> usize {
        self.model.past_rows(layer, self.ar)
    }

    /// The attention window of `layer` in this graph (`None`: global), which selects its mask
    /// input ([`graph_io::mask_name`]).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.model.graph_window(layer)
    }

    /// Input descriptions, in buffer order.
    pub fn inputs(&self) -> &[IoTensor] {
        &self.inputs
    }

    /// Output descriptions, in buffer order.
    pub fn outputs(&self) -> &[IoTensor] {
        &self.outputs
    }

    /// Runs the graph once.
    ///
    /// `inputs[i]` / `outputs[i]` are the bytes of `self.inputs()[i]` / `self.outputs()[i]`
    /// (little endian, exactly [`IoTensor::byte_size`] bytes each). Validation happens before
    /// anything is written: wrong counts, wrong byte lengths (naming the tensor), token ids
    /// outside the vocabulary and negative positions are errors. Past-window rows whose mask
    /// column is masked for every query are never read as numbers, so their bytes do not
    /// matter.
    pub fn execute(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), ExecError> {
        self.check_counts(inputs.len(), outputs.len())?;
        for (i, b) in inputs.iter().enumerate() {
            self.check_input(i, b.len())?;
        }
        for (i, b) in outputs.iter().enumerate() {
            self.check_output(i, b.len())?;
        }
        self.run(&mut SliceIo { inputs, outputs })
    }

    /// Runs the graph on raw buffers, as QNN's `graphExecute` does with registered memory.
    ///
    /// Counts and byte lengths are validated as in [`execute`](Self::execute); null pointers
    /// are rejected.
    ///
    /// # Safety
    /// For the duration of the call, every `(ptr, len)` of `inputs` must be valid for reads of
    /// `len` bytes and every `(ptr, len)` of `outputs` valid for writes of `len` bytes; no
    /// output range may overlap another output range or any input range (inputs may overlap
    /// each other), and no other thread may write the input ranges or access the output
    /// ranges meanwhile. Alignment is not required.
    pub unsafe fn execute_raw(
        &self,
        inputs: &[(*const u8, usize)],
        outputs: &[(*mut u8, usize)],
    ) -> Result<(), ExecError> {
        self.check_counts(inputs.len(), outputs.len())?;
        for (i, &(p, n)) in inputs.iter().enumerate() {
            self.check_input(i, n)?;
            if p.is_null() {
                return Err(ExecError::NullPointer {
                    graph: self.name.clone(),
                    tensor: self.inputs[i].name.clone(),
                });
            }
        }
        for (i, &(p, n)) in outputs.iter().enumerate() {
            self.check_output(i, n)?;
            if p.is_null() {
                return Err(ExecError::NullPointer {
                    graph: self.name.clone(),
                    tensor: self.outputs[i].name.clone(),
                });
            }
        }
        self.run(&mut RawIo { inputs, outputs })
    }

    fn check_counts(&self, ni: usize, no: usize) -> Result<(), ExecError> {
        if ni != self.inputs.len() {
            return Err(ExecError::InputCount {
                graph: self.name.clone(),
                expected: self.inputs.len(),
                found: ni,
            });
        }
        if no != self.outputs.len() {
            return Err(ExecError::OutputCount {
                graph: self.name.clone(),
                expected: self.outputs.len(),
                found: no,
            });
        }
        Ok(())
    }

    fn check_input(&self, i: usize, len: usize) -> Result<(), ExecError> {
        let d = &self.inputs[i];
        if d.byte_size() != len {
            return Err(ExecError::InputSize {
                graph: self.name.clone(),
                tensor: d.name.clone(),
                index: i,
                expected: d.byte_size(),
                found: len,
            });
        }
        Ok(())
    }

    fn check_output(&self, i: usize, len: usize) -> Result<(), ExecError> {
        let d = &self.outputs[i];
        if d.byte_size() != len {
            return Err(ExecError::OutputSize {
                graph: self.name.clone(),
                tensor: d.name.clone(),
                index: i,
                expected: d.byte_size(),
                found: len,
            });
        }
        Ok(())
    }

    /// The forward pass: decode the inputs, run the shared forward, which writes the new K/V
    /// and the logits through [`ExecKernels`]. Buffers are validated; `io` hands out one
    /// buffer borrow at a time.
    fn run(&self, io: &mut dyn Io) -> Result<(), ExecError> {
        let mut guard = match self.scratch.lock() {
            Ok(g) => g,
            // A panic during an earlier run left the scratch in some state; every run
            // overwrites what it reads, so it is still usable.
            Err(poisoned) => poisoned.into_inner(),
        };
        let Scratch {
            ids,
            pos,
            hidden,
            cos,
            sin,
            acts,
            attn,
            qbuf,
            tbuf,
        } = &mut *guard;
        let input = if self.part.is_first() {
            self.decode_ids(io.input(0), ids)?;
            Input::Tokens(ids)
        } else {
            decode_f32(io.input(0), hidden);
            Input::Hidden(hidden)
        };
        let positions = if self.part.embeds_only() {
            // The token lookup only (AI Hub's part 1): no positions, mask or K/V.
            pos.fill(0);
            Positions::Ids(pos)
        } else if self.part.rope_tables {
            decode_f32(io.input(1), cos);
            decode_f32(io.input(2), sin);
            Positions::Table { cos, sin }
        } else {
            self.decode_positions(io.input(1), pos)?;
            Positions::Ids(pos)
        };
        let first_mask = leading_inputs(&self.part) - 1;
        if !self.part.embeds_only() {
            for (m, mask) in attn.masks.iter_mut().enumerate() {
                self.decode_mask(io.input(first_mask + m), mask);
            }
        }
        let last = self.part.is_last();
        let pass = Pass {
            layers: self.part.layers.clone(),
            input,
            positions,
            output: match (last, self.rows) {
                (false, _) => Output::Hidden,
                (true, LogitRows::All) => Output::Logits,
                (true, LogitRows::Last) => Output::LastLogits,
            },
        };
        let c = &self.model.config;
        let mut k = ExecKernels {
            graph: self,
            io,
            s: attn,
            qbuf,
            tbuf,
        };
        // Ids and positions were checked above, the pass fits the graph by construction.
        kernels::on_busy_pool(|| forward::run(c, &self.rope, &mut k, acts, &pass, &mut NoTap))
            .expect("the executor's pass is consistent with its graph");
        if !last {
            encode_f32(acts.hidden(), k.io.output(0));
        }
        Ok(())
    }

    /// Token ids, each checked against the vocabulary.
    fn decode_ids(&self, bytes: &[u8], ids: &mut [u32]) -> Result<(), ExecError> {
        let vocab_size = self.model.config.vocab_size;
        for (i, (chunk, id)) in bytes.chunks_exact(4).zip(ids).enumerate() {
            let v = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if v < 0 || v as usize >= vocab_size {
                return Err(ExecError::TokenOutOfRange {
                    graph: self.name.clone(),
                    tensor: self.inputs[0].name.clone(),
                    index: i,
                    value: v,
                    vocab_size,
                });
            }
            *id = v as u32;
        }
        Ok(())
    }

    /// RoPE positions, each checked non-negative.
    fn decode_positions(&self, bytes: &[u8], pos: &mut [usize]) -> Result<(), ExecError> {
        for (i, (chunk, p)) in bytes.chunks_exact(4).zip(pos).enumerate() {
            let v = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if v < 0 {
                return Err(ExecError::NegativePosition {
                    graph: self.name.clone(),
                    tensor: self.inputs[1].name.clone(),
                    index: i,
                    value: v,
                });
            }
            *p = v as usize;
        }
        Ok(())
    }

    /// A mask, dequantized to additive f32 values, and which past rows any query sees.
    fn decode_mask(&self, bytes: &[u8], m: &mut MaskScratch) {
        if self.mask_u16 {
            let so = mask_encoding();
            for (dst, ch) in m.values.iter_mut().zip(bytes.chunks_exact(2)) {
                *dst = quant::dequantize(u16::from_le_bytes([ch[0], ch[1]]), so);
            }
        } else {
            decode_f32(bytes, &mut m.values);
        }
        m.index();
    }
}

/// Inputs up to the global mask: ids or hidden state, positions or two RoPE tables, the mask
/// (the sliding windows' masks follow it).
fn leading_inputs(part: &Part) -> usize {
    if part.rope_tables { 4 } else { 3 }
}

/// Little-endian f32 values (the buffer's size was checked against the destination's).
fn decode_f32(bytes: &[u8], dst: &mut [f32]) {
    for (d, ch) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *d = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
    }
}

/// `src` as little-endian f32 values into `dst`.
fn encode_f32(src: &[f32], dst: &mut [u8]) {
    for (d, v) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

/// A mask value that lets the query see the key.
fn visible(mask: f32) -> bool {
    mask > MASKED_AT_OR_BELOW
}

/// The executor's [`Kernels`]: i8/f16/f32 matrices with static activation encodings, KV
/// written to the new-KV outputs in its codec and read back, past rows decoded from the
/// past-KV inputs, attention over the rows the mask shows.
struct ExecKernels<'a> {
    graph: &'a Graph,
    io: &'a mut dyn Io,
    s: &'a mut AttnScratch,
    qbuf: &'a mut [i16],
    tbuf: &'a mut [f32],
}

impl Kernels for ExecKernels<'_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        self.graph.model.embedding().row_into(token as usize, out);
    }

    /// All rows at once: each weight row (the classifier's too) is read once per step.
    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let (matrix, act) = self.graph.model.linear(w);
        let n = x.len() / matrix.cols();
        matrix.matmul(0, n, out, x, act, self.qbuf, self.tbuf);
    }

    fn linear_many(&mut self, ws: &[Tensor], x: &[f32], outs: &mut [&mut [f32]]) {
        let model = &self.graph.model;
        let act = model.linear(ws[0]).1;
        let parts: Vec<&Matrix> = ws.iter().map(|&w| model.linear(w).0).collect();
        // i8 matrices of one activation encoding: quantized once, one parallel job.
        let fused = parts.iter().all(|m| m.is_i8()) && ws.iter().all(|&w| model.linear(w).1 == act);
        if fused {
            let n = x.len() / parts[0].cols();
            Matrix::matmul_i8_many(&parts, outs, (x, n), act, self.qbuf, self.tbuf);
        } else {
            for (&w, out) in ws.iter().zip(outs) {
                self.linear(w, x, out);
            }
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.graph.model.vector(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = &self.graph.model.config;
        let heads = c.n_kv_heads;
        let local = layer - self.graph.part.layers.start;
        let slots = &self.graph.slots[local * heads..(local + 1) * heads];
        for (h, slot) in slots.iter().enumerate() {
            self.store_new(slot, h, k, v);
        }
        let layout = self.graph.model.options.k_layout;
        self.s.load_past(&*self.io, slots, c, layout);
        self.s.attend(&slots[0], c, q, out);
    }

    fn logits(&mut self, row: usize, logits: &[f32]) {
        let out = self.io.output(0);
        let at = row * logits.len() * 4;
        for (dst, &v) in out[at..at + logits.len() * 4]
            .chunks_exact_mut(4)
            .zip(logits)
        {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

impl ExecKernels<'_> {
    /// Writes KV head `h` of the step's keys/values (`[n, kv_dim]`) in the KV encoding; the
    /// step sees the values read back (`knew`/`vnew`).
    fn store_new(&mut self, slot: &KvSlot, h: usize, k: &[f32], v: &[f32]) {
        let (n, d) = (self.graph.ar, self.graph.model.config.head_dim);
        let kv_dim = k.len() / n;
        let transposed = self.graph.model.options.k_layout == KLayout::Transposed;
        for (value, src, codec, buf) in [
            (false, k, slot.k, slot.new_k),
            (true, v, slot.v, slot.new_v),
        ] {
            let out = self.io.output(buf);
            let all = if value {
                &mut self.s.vnew
            } else {
                &mut self.s.knew
            };
            let dst = &mut all[h * n * d..(h + 1) * n * d];
            let es = codec.size();
            for i in 0..n {
                for e in 0..d {
                    let at = if transposed && !value {
                        e * n + i
                    } else {
                        i * d + e
                    };
                    let b = slot.new_off + at * es;
                    dst[i * d + e] = codec.encode(src[i * kv_dim + h * d + e], &mut out[b..b + es]);
                }
            }
        }
    }
}

/// Helper for callers and tests: the bytes of an f32 mask row value or a u16 mask code.
///
/// `visible = true` gives `0.0` (f32) / `65535` (u16); `false` gives `-inf` / `0`.
pub fn mask_value_bytes(dtype: DataType, visible: bool) -> Vec<u8> {
    match (dtype, visible) {
        (DataType::U16, true) => 65535u16.to_le_bytes().to_vec(),
        (DataType::U16, false) => 0u16.to_le_bytes().to_vec(),
        (_, true) => 0.0f32.to_le_bytes().to_vec(),
        (_, false) => f32::NEG_INFINITY.to_le_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of elements decodes to exactly what element-wise decoding gives, in every codec.
    #[test]
    fn decode_run_equals_decode_of_each_element() {
        let so = ScaleOffset {
            scale: 0.037,
            offset: -131,
        };
        let wide = ScaleOffset {
            scale: 3.1e-4,
            offset: -30000,
        };
        // An offset past ±2^24 takes the f64 path of `decode_run`.
        let far = ScaleOffset {
            scale: 0.37,
            offset: 1 << 25,
        };
        let codecs = [
            Codec::U8(so),
            Codec::U16(wide),
            Codec::U8(far),
            Codec::U16(far),
            Codec::F16,
            Codec::F32,
        ];
        let values: Vec<f32> = (0..67)
            .map(|i| ((i * 29 % 41) as f32 - 20.0) * 0.37)
            .collect();
        for codec in codecs {
            let es = codec.size();
            let mut bytes = vec![0u8; values.len() * es];
            for (v, b) in values.iter().zip(bytes.chunks_exact_mut(es)) {
                codec.encode(*v, b);
            }
            let mut run = vec![f32::NAN; values.len()];
            codec.decode_run(&bytes, &mut run);
            let each: Vec<f32> = bytes.chunks_exact(es).map(|b| codec.decode(b)).collect();
            assert_eq!(
                run.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                each.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{codec:?}"
            );
        }
    }
}
