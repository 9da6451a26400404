//! The executor: one static AR-n graph over raw byte buffers.

use std::sync::{Arc, Mutex};

use kv_manager::{KvIo, KvTensor, TensorKind};
use quant::{DataType, Encoding, ScaleOffset};

use crate::error::ExecError;
use crate::model::{ActSite, MASKED_AT_OR_BELOW, ModelData, mask_encoding};
use crate::types::{Granularity, KLayout, TensorDesc};

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
    k: Codec,
    v: Codec,
}

/// Per-graph scratch, allocated once when the graph is built.
#[derive(Debug)]
struct Scratch {
    ids: Vec<usize>,
    pos: Vec<usize>,
    mask: Vec<f32>,
    x: Vec<f32>,
    xb: Vec<f32>,
    xb2: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att_out: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    knew: Vec<f32>,
    vnew: Vec<f32>,
    kpast: Vec<f32>,
    vpast: Vec<f32>,
    visible_any: Vec<bool>,
    scores: Vec<f32>,
    idx: Vec<usize>,
    qbuf: Vec<i16>,
    logits: Vec<f32>,
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
    context: usize,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    model: Arc<ModelData>,
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
trait Io {
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
    pub(crate) fn new(name: String, ar: usize, model: Arc<ModelData>) -> Graph {
        let (inputs, outputs) = model.describe(ar);
        let c = model.config;
        let o = &model.options;
        let d = c.head_dim();
        let hk = c.n_kv_heads;
        let w = o.context - ar;
        let esize = o.kv_dtype.size_bytes();
        let mut slots = Vec::with_capacity(c.n_layers * hk);
        for l in 0..c.n_layers {
            for h in 0..hk {
                let kspec = model.kv_spec(l, h, false);
                let vspec = model.kv_spec(l, h, true);
                let (head, past_off, new_off) = match o.granularity {
                    Granularity::PerHead => (Some(h), 0, 0),
                    Granularity::PerLayer => (None, h * w * d * esize, h * ar * d * esize),
                };
                // Inputs: ids, positions, mask, then the K/V tensors; outputs: logits, then K/V.
                let key = |io| KvTensor {
                    io,
                    kind: TensorKind::Key,
                    layer: l,
                    head,
                };
                let past_k = 3 + key(KvIo::Past).position(hk);
                let new_k = 1 + key(KvIo::New).position(hk);
                slots.push(KvSlot {
                    past_k,
                    past_v: past_k + 1,
                    new_k,
                    new_v: new_k + 1,
                    past_off,
                    new_off,
                    k: Codec::new(kspec.dtype, &kspec.encoding),
                    v: Codec::new(vspec.dtype, &vspec.encoding),
                });
            }
        }
        let n = ar;
        let s = o.context;
        let scratch = Scratch {
            ids: vec![0; n],
            pos: vec![0; n],
            mask: vec![0.0; n * s],
            x: vec![0.0; n * c.dim],
            xb: vec![0.0; n * c.dim],
            xb2: vec![0.0; n * c.dim],
            q: vec![0.0; n * c.dim],
            k: vec![0.0; n * c.kv_dim()],
            v: vec![0.0; n * c.kv_dim()],
            att_out: vec![0.0; n * c.dim],
            hb: vec![0.0; n * c.hidden_dim],
            hb2: vec![0.0; n * c.hidden_dim],
            knew: vec![0.0; n * d],
            vnew: vec![0.0; n * d],
            kpast: vec![0.0; w * d],
            vpast: vec![0.0; w * d],
            visible_any: vec![false; w],
            scores: vec![0.0; s],
            idx: vec![0; s],
            qbuf: vec![0; c.dim.max(c.hidden_dim)],
            logits: vec![0.0; c.vocab_size],
        };
        Graph {
            name,
            ar,
            context: s,
            inputs,
            outputs,
            mask_u16: o.kv_dtype.is_fixed_point(),
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
        let f32s = [
            &s.mask, &s.x, &s.xb, &s.xb2, &s.q, &s.k, &s.v, &s.att_out, &s.hb, &s.hb2, &s.knew,
            &s.vnew, &s.kpast, &s.vpast, &s.scores, &s.logits,
        ];
        let floats: usize = f32s.iter().map(|v| v.len() * 4).sum();
        let words = (s.ids.len() + s.pos.len() + s.idx.len()) * std::mem::size_of::<usize>();
        floats + words + s.qbuf.len() * 2 + s.visible_any.len()
    }

    /// Graph name, e.g. `ar32_cl512`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens per step (n).
    pub fn ar(&self) -> usize {
        self.ar
    }

    /// Context length S.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Rows of each past window, `S - n`.
    pub fn window(&self) -> usize {
        self.context - self.ar
    }

    /// Input descriptions, in buffer order.
    pub fn inputs(&self) -> &[TensorDesc] {
        &self.inputs
    }

    /// Output descriptions, in buffer order.
    pub fn outputs(&self) -> &[TensorDesc] {
        &self.outputs
    }

    /// Runs the graph once.
    ///
    /// `inputs[i]` / `outputs[i]` are the bytes of `self.inputs()[i]` / `self.outputs()[i]`
    /// (little endian, exactly [`TensorDesc::byte_size`] bytes each). Validation happens before
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

    /// The forward pass. Buffers are validated; `io` hands out one buffer borrow at a time.
    fn run(&self, io: &mut dyn Io) -> Result<(), ExecError> {
        let mut guard = match self.scratch.lock() {
            Ok(g) => g,
            // A panic during an earlier run left the scratch in some state; every run
            // overwrites what it reads, so it is still usable.
            Err(poisoned) => poisoned.into_inner(),
        };
        let sc = &mut *guard;
        let m = &*self.model;
        let c = m.config;
        let (n, s) = (self.ar, self.context);
        let w = s - n;
        let (dim, hidden, kv_dim) = (c.dim, c.hidden_dim, c.kv_dim());
        let d = c.head_dim();
        let kv_mul = c.kv_mul();
        let attn_scale = 1.0 / (d as f32).sqrt();

        // Token ids and positions (validated before anything is written).
        for (i, chunk) in io.input(0).chunks_exact(4).enumerate() {
            let v = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if v < 0 || v as usize >= c.vocab_size {
                return Err(ExecError::TokenOutOfRange {
                    graph: self.name.clone(),
                    tensor: self.inputs[0].name.clone(),
                    index: i,
                    value: v,
                    vocab_size: c.vocab_size,
                });
            }
            sc.ids[i] = v as usize;
        }
        for (i, chunk) in io.input(1).chunks_exact(4).enumerate() {
            let v = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if v < 0 {
                return Err(ExecError::NegativePosition {
                    graph: self.name.clone(),
                    tensor: self.inputs[1].name.clone(),
                    index: i,
                    value: v,
                });
            }
            sc.pos[i] = v as usize;
        }
        // Mask, dequantized to additive f32 values.
        if self.mask_u16 {
            let so = mask_encoding();
            for (dst, ch) in sc.mask.iter_mut().zip(io.input(2).chunks_exact(2)) {
                *dst = quant::dequantize(u16::from_le_bytes([ch[0], ch[1]]), so);
            }
        } else {
            for (dst, ch) in sc.mask.iter_mut().zip(io.input(2).chunks_exact(4)) {
                *dst = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
            }
        }
        let visible = |x: f32| x > MASKED_AT_OR_BELOW;
        for j in 0..w {
            sc.visible_any[j] = (0..n).any(|i| visible(sc.mask[i * s + j]));
        }

        for i in 0..n {
            m.embedding
                .row_into(sc.ids[i], &mut sc.x[i * dim..(i + 1) * dim]);
        }

        for l in 0..c.n_layers {
            let act_in = m.act(l, ActSite::AttnIn);
            for i in 0..n {
                let (xr, xbr) = (
                    &sc.x[i * dim..(i + 1) * dim],
                    &mut sc.xb[i * dim..(i + 1) * dim],
                );
                llama2c::rmsnorm(xbr, xr, &m.rms_att[l * dim..(l + 1) * dim]);
                let xbr = &sc.xb[i * dim..(i + 1) * dim];
                m.wq.matvec(
                    l * dim,
                    &mut sc.q[i * dim..(i + 1) * dim],
                    xbr,
                    act_in,
                    &mut sc.qbuf,
                );
                m.wk.matvec(
                    l * kv_dim,
                    &mut sc.k[i * kv_dim..(i + 1) * kv_dim],
                    xbr,
                    act_in,
                    &mut sc.qbuf,
                );
                m.wv.matvec(
                    l * kv_dim,
                    &mut sc.v[i * kv_dim..(i + 1) * kv_dim],
                    xbr,
                    act_in,
                    &mut sc.qbuf,
                );
                llama2c::rope_rotate(&mut sc.q[i * dim..(i + 1) * dim], sc.pos[i], d);
                llama2c::rope_rotate(&mut sc.k[i * kv_dim..(i + 1) * kv_dim], sc.pos[i], d);
            }

            for h in 0..c.n_kv_heads {
                let slot = self.slots[l * c.n_kv_heads + h];
                // New K/V: written in the KV encoding; the step sees the values read back.
                let transposed = self.model.options.k_layout == KLayout::Transposed;
                {
                    let out = io.output(slot.new_k);
                    let es = slot.k.size();
                    for i in 0..n {
                        for e in 0..d {
                            let at = if transposed { e * n + i } else { i * d + e };
                            let b = slot.new_off + at * es;
                            sc.knew[i * d + e] = slot
                                .k
                                .encode(sc.k[i * kv_dim + h * d + e], &mut out[b..b + es]);
                        }
                    }
                }
                {
                    let out = io.output(slot.new_v);
                    let es = slot.v.size();
                    for i in 0..n {
                        for e in 0..d {
                            let b = slot.new_off + (i * d + e) * es;
                            sc.vnew[i * d + e] = slot
                                .v
                                .encode(sc.v[i * kv_dim + h * d + e], &mut out[b..b + es]);
                        }
                    }
                }
                // Past rows that some query can see, decoded once for all queries.
                {
                    let src = io.input(slot.past_k);
                    let es = slot.k.size();
                    for j in (0..w).filter(|&j| sc.visible_any[j]) {
                        for e in 0..d {
                            let at = if transposed { e * w + j } else { j * d + e };
                            let b = slot.past_off + at * es;
                            sc.kpast[j * d + e] = slot.k.decode(&src[b..b + es]);
                        }
                    }
                }
                {
                    let src = io.input(slot.past_v);
                    let es = slot.v.size();
                    for j in (0..w).filter(|&j| sc.visible_any[j]) {
                        for e in 0..d {
                            let b = slot.past_off + (j * d + e) * es;
                            sc.vpast[j * d + e] = slot.v.decode(&src[b..b + es]);
                        }
                    }
                }
                for qh in h * kv_mul..(h + 1) * kv_mul {
                    for i in 0..n {
                        let qv = &sc.q[i * dim + qh * d..i * dim + (qh + 1) * d];
                        let mrow = &sc.mask[i * s..(i + 1) * s];
                        let mut cnt = 0;
                        for (j, &mv) in mrow.iter().enumerate() {
                            if !visible(mv) {
                                continue;
                            }
                            let kr = if j < w {
                                &sc.kpast[j * d..(j + 1) * d]
                            } else {
                                &sc.knew[(j - w) * d..(j - w + 1) * d]
                            };
                            sc.scores[cnt] = llama2c::dot(qv, kr) * attn_scale + mv;
                            sc.idx[cnt] = j;
                            cnt += 1;
                        }
                        llama2c::softmax(&mut sc.scores[..cnt]);
                        let out = &mut sc.att_out[i * dim + qh * d..i * dim + (qh + 1) * d];
                        out.fill(0.0);
                        for (&p, &j) in sc.scores[..cnt].iter().zip(&sc.idx[..cnt]) {
                            let vr = if j < w {
                                &sc.vpast[j * d..(j + 1) * d]
                            } else {
                                &sc.vnew[(j - w) * d..(j - w + 1) * d]
                            };
                            for (o, &vv) in out.iter_mut().zip(vr) {
                                *o += p * vv;
                            }
                        }
                    }
                }
            }

            let act_out = m.act(l, ActSite::AttnOut);
            let act_ffn = m.act(l, ActSite::FfnIn);
            let act_mid = m.act(l, ActSite::FfnMid);
            for i in 0..n {
                let r = i * dim..(i + 1) * dim;
                m.wo.matvec(
                    l * dim,
                    &mut sc.xb2[r.clone()],
                    &sc.att_out[r.clone()],
                    act_out,
                    &mut sc.qbuf,
                );
                for (a, b) in sc.x[r.clone()].iter_mut().zip(&sc.xb2[r.clone()]) {
                    *a += b;
                }
                llama2c::rmsnorm(
                    &mut sc.xb[r.clone()],
                    &sc.x[r.clone()],
                    &m.rms_ffn[l * dim..(l + 1) * dim],
                );
                let hr = i * hidden..(i + 1) * hidden;
                m.w1.matvec(
                    l * hidden,
                    &mut sc.hb[hr.clone()],
                    &sc.xb[r.clone()],
                    act_ffn,
                    &mut sc.qbuf,
                );
                m.w3.matvec(
                    l * hidden,
                    &mut sc.hb2[hr.clone()],
                    &sc.xb[r.clone()],
                    act_ffn,
                    &mut sc.qbuf,
                );
                for (g, u) in sc.hb[hr.clone()].iter_mut().zip(&sc.hb2[hr.clone()]) {
                    *g = llama2c::silu(*g) * u;
                }
                m.w2.matvec(
                    l * dim,
                    &mut sc.xb[r.clone()],
                    &sc.hb[hr],
                    act_mid,
                    &mut sc.qbuf,
                );
                for (a, b) in sc.x[r.clone()].iter_mut().zip(&sc.xb[r]) {
                    *a += b;
                }
            }
        }

        let act_final = m.act_final();
        let vocab = c.vocab_size;
        for i in 0..n {
            let r = i * dim..(i + 1) * dim;
            llama2c::rmsnorm(&mut sc.xb[r.clone()], &sc.x[r.clone()], &m.rms_final);
            m.classifier()
                .matvec(0, &mut sc.logits, &sc.xb[r], act_final, &mut sc.qbuf);
            let out = io.output(0);
            for (dst, &v) in out[i * vocab * 4..(i + 1) * vocab * 4]
                .chunks_exact_mut(4)
                .zip(&sc.logits)
            {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        Ok(())
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
