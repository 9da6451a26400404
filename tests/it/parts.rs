//! Split models through the session: a backend whose every AR variant is two parts — part 1 turns
//! the token ids and positions into a "hidden state", part 2 takes it with the mask, RoPE cos/sin
//! tables (checked against the positions it was given) and every K/V tensor and writes
//! u16-quantized logits — gives exactly the whole model's logits (quantized the same way), step for
//! step and token for token.

use htpkv::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoRole, IoTensor, OutputBuffer, PartOf,
};
use htpkv::reference::ReferenceBackend;
use htpkv::session::{Session, SessionError};
use kv_manager::{HostAllocator, Strategy};
use model::llama2c::{Checkpoint, Tokenizer};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use ref_backend::CompiledModel;
use std::sync::Arc;

fn compiled() -> Arc<CompiledModel> {
    let files = test_support::stories::stories260k();
    let ckpt = Checkpoint::load(&files.checkpoint).expect("checkpoint loads");
    let tok = Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size).expect("tokenizer loads");
    test_support::compile::compile_u8(&ckpt, &tok, ckpt.config.seq_len, &[1, 8])
}

/// The u16 encoding of the split model's logits.
fn logits_spec() -> QuantSpec {
    QuantSpec {
        dtype: DataType::U16,
        encoding: Encoding::PerTensor(ScaleOffset {
            scale: 40.0 / 65535.0,
            offset: -32768,
        }),
    }
}

/// Every reference graph as two parts (see the module docs).
#[derive(Debug)]
struct Split {
    inner: ReferenceBackend,
    descs: Vec<GraphDesc>,
    /// Byte sizes of the ids and positions of each inner graph.
    sizes: Vec<(usize, usize)>,
}

impl Split {
    fn new(inner: ReferenceBackend, drop_first_parts: bool) -> Split {
        let mut descs = Vec::new();
        let mut sizes = Vec::new();
        for g in inner.graphs() {
            let find = |r| g.inputs.iter().find(|t| t.role == r).unwrap().clone();
            let (ids, pos) = (find(IoRole::InputIds), find(IoRole::Positions));
            let hidden_bytes = ids.byte_size() + pos.byte_size();
            let n = ids.shape[ids.shape.len() - 1];
            sizes.push((ids.byte_size(), pos.byte_size()));
            let hidden = |role| IoTensor {
                name: format!("hidden_{}", g.name),
                role,
                layer: None,
                head: None,
                shape: vec![hidden_bytes],
                dtype: DataType::U8,
                quant: Some(QuantSpec {
                    dtype: DataType::U8,
                    encoding: Encoding::PerTensor(ScaleOffset {
                        scale: 1.0,
                        offset: 0,
                    }),
                }),
            };
            let first = GraphDesc {
                name: format!("{}_1_of_2", g.name),
                inputs: vec![ids, pos],
                outputs: vec![hidden(IoRole::HiddenOut)],
                part: PartOf { index: 0, count: 2 },
                mask: g.mask,
            };
            let table = |role, name: &str| IoTensor {
                name: name.into(),
                role,
                layer: None,
                head: None,
                shape: vec![1, 1, n, HEAD_DIM / 2],
                dtype: DataType::F32,
                quant: Some(QuantSpec::float(DataType::F32).unwrap()),
            };
            let mut inputs = vec![
                hidden(IoRole::HiddenIn),
                table(IoRole::RopeCos, "position_ids_cos"),
                table(IoRole::RopeSin, "position_ids_sin"),
            ];
            inputs.extend(
                g.inputs
                    .iter()
                    .filter(|t| !matches!(t.role, IoRole::InputIds | IoRole::Positions))
                    .cloned(),
            );
            let outputs = g
                .outputs
                .iter()
                .map(|t| match t.role {
                    IoRole::Logits => IoTensor {
                        dtype: DataType::U16,
                        quant: Some(logits_spec()),
                        ..t.clone()
                    },
                    _ => t.clone(),
                })
                .collect();
            let second = GraphDesc {
                name: format!("{}_2_of_2", g.name),
                inputs,
                outputs,
                part: PartOf { index: 1, count: 2 },
                mask: g.mask,
            };
            if !drop_first_parts {
                descs.push(first);
            }
            descs.push(second);
        }
        Split {
            inner,
            descs,
            sizes,
        }
    }
}

fn err(message: String) -> BackendError {
    BackendError {
        backend: "split",
        message,
        source: None,
    }
}

impl Backend for Split {
    fn name(&self) -> &'static str {
        "split"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.descs
    }

    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        let (inner, part) = (graph / 2, graph % 2);
        let (ids, pos) = self.sizes[inner];
        if part == 0 {
            // SAFETY: the session passes buffers valid for their lengths (Backend::execute's
            // contract); the hidden output was declared ids + positions bytes long.
            unsafe {
                std::ptr::copy_nonoverlapping(inputs[0].ptr, outputs[0].ptr, ids);
                std::ptr::copy_nonoverlapping(inputs[1].ptr, outputs[0].ptr.add(ids), pos);
            }
            return Ok(());
        }
        let hidden = inputs[0];
        if hidden.len != ids + pos {
            return Err(err(format!("hidden state of {} bytes", hidden.len)));
        }
        // SAFETY: the hidden buffer holds ids then positions (part 1 wrote them), and the tables are
        // valid for their declared lengths during the call.
        let (positions, cos, sin) = unsafe {
            let bytes = |b: InputBuffer| std::slice::from_raw_parts(b.ptr, b.len);
            let pos = std::slice::from_raw_parts(hidden.ptr.add(ids), pos);
            (pos, bytes(inputs[1]), bytes(inputs[2]))
        };
        check_tables(positions, cos, sin)?;
        let g = &self.inner.graphs()[inner];
        let mut rest = inputs[3..].iter();
        let mut inner_in = Vec::new();
        for t in &g.inputs {
            inner_in.push(match t.role {
                IoRole::InputIds => InputBuffer {
                    ptr: hidden.ptr,
                    len: ids,
                },
                IoRole::Positions => InputBuffer {
                    // SAFETY: the hidden buffer is ids + pos bytes long (checked above).
                    ptr: unsafe { hidden.ptr.add(ids) },
                    len: pos,
                },
                _ => *rest.next().ok_or_else(|| err("too few inputs".into()))?,
            });
        }
        let logits_at = g
            .outputs
            .iter()
            .position(|t| t.role == IoRole::Logits)
            .unwrap();
        let mut logits = vec![0.0f32; g.outputs[logits_at].shape.iter().product()];
        let mut inner_out = outputs.to_vec();
        inner_out[logits_at] = OutputBuffer {
            ptr: logits.as_mut_ptr().cast(),
            len: logits.len() * 4,
        };
        // SAFETY: forwarded buffers keep the caller's guarantees; the logits scratch is a live Vec of
        // the declared length.
        unsafe { self.inner.execute(inner, &inner_in, &inner_out)? };
        let out = outputs[logits_at];
        // SAFETY: the session's logits buffer is valid for `out.len` bytes during the call.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr, out.len) };
        quant::encode_f32_to_bytes(&logits, &logits_spec(), dst)
            .map_err(|e| err(format!("quantizing logits: {e}")))
    }
}

/// stories260K's head width and RoPE base.
const HEAD_DIM: usize = 8;

fn rope() -> model::RopeConfig {
    model::RopeConfig {
        theta: 10000.0,
        scaling: None,
        pairing: model::RopePairing::Adjacent,
        ..model::RopeConfig::default()
    }
}

/// The tables the session fed are those of the positions the step runs at.
fn check_tables(positions: &[u8], cos: &[u8], sin: &[u8]) -> Result<(), BackendError> {
    let rope = model::ops::Rope::new(HEAD_DIM, &rope());
    let half = HEAD_DIM / 2;
    let f = |b: &[u8], i: usize| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
    for (row, p) in positions.chunks_exact(4).enumerate() {
        let p = i32::from_le_bytes(p.try_into().unwrap());
        rope.cos_sin(p as usize, &mut c, &mut s);
        for k in 0..half {
            if f(cos, row * half + k) != c[k] || f(sin, row * half + k) != s[k] {
                return Err(err(format!(
                    "RoPE tables of row {row} are not position {p}'s"
                )));
            }
        }
    }
    Ok(())
}

/// What the whole model's logits become through the split model's u16 logits.
fn through_u16(logits: &[f32]) -> Vec<f32> {
    let spec = logits_spec();
    let mut bytes = vec![0u8; logits.len() * 2];
    quant::encode_f32_to_bytes(logits, &spec, &mut bytes).unwrap();
    let mut back = vec![0.0; logits.len()];
    quant::decode_bytes_to_f32(&bytes, &spec, &mut back).unwrap();
    back
}

#[test]
fn a_two_part_model_gives_the_whole_models_logits() {
    let model = compiled();
    for strategy in [Strategy::SmartMask, Strategy::SHIFT_2X] {
        let alloc = HostAllocator::default();
        let mut whole = Session::new(ReferenceBackend::new(model.clone()), strategy, &alloc)
            .expect("whole session");
        let split = Split::new(ReferenceBackend::new(model.clone()), false);
        let mut parts =
            Session::with_rope(split, strategy, &alloc, Some(rope())).expect("split session");
        assert_eq!(parts.capacity(), whole.capacity());
        let prompt: Vec<u32> = vec![1, 403, 407, 261, 378, 130, 429, 289, 302, 351, 400];
        let a = through_u16(whole.prefill(&prompt).unwrap());
        let b = parts.prefill(&prompt).unwrap().to_vec();
        assert_eq!(a, b, "{strategy:?}: prefill logits");
        let mut token = model::ops::argmax(&b) as u32;
        for step in 0..40 {
            let a = through_u16(whole.decode(token).unwrap());
            let b = parts.decode(token).unwrap().to_vec();
            assert_eq!(a, b, "{strategy:?}: decode step {step}");
            token = model::ops::argmax(&b) as u32;
        }
        assert_eq!(parts.tokens(), whole.tokens());
    }
}

#[test]
fn tables_without_a_rope_config_are_refused() {
    let split = Split::new(ReferenceBackend::new(compiled()), false);
    let err = Session::new(split, Strategy::SmartMask, &HostAllocator::default()).unwrap_err();
    assert!(err.to_string().contains("takes RoPE tables"), "{err}");
}

#[test]
fn a_missing_part_is_refused_by_name() {
    let model = compiled();
    let split = Split::new(ReferenceBackend::new(model), true);
    let alloc = HostAllocator::default();
    let err = Session::with_rope(split, Strategy::SmartMask, &alloc, Some(rope())).unwrap_err();
    assert!(matches!(err, SessionError::Graphs(_)), "{err}");
    assert!(err.to_string().contains("parts [1] of 2"), "{err}");
}

/// Several context lengths of one model in one backend, as a bundle holding `_cl{c}` graphs of
/// each: graph `i` of the list runs on the backend that owns it.
#[derive(Debug)]
struct Tiered {
    inner: Vec<ReferenceBackend>,
    descs: Vec<GraphDesc>,
    /// (backend, graph) of each description.
    owner: Vec<(usize, usize)>,
}

impl Tiered {
    fn new(model: &CompiledModel, contexts: &[usize]) -> Tiered {
        Tiered::of(
            contexts
                .iter()
                .map(|&c| model.with_context(c).expect("context")),
        )
    }

    fn of(models: impl Iterator<Item = CompiledModel>) -> Tiered {
        let mut t = Tiered {
            inner: Vec::new(),
            descs: Vec::new(),
            owner: Vec::new(),
        };
        for m in models {
            let c = m.options().context;
            let b = ReferenceBackend::new(Arc::new(m));
            for (i, g) in b.graphs().iter().enumerate() {
                assert!(g.name.ends_with(&format!("_cl{c}")), "{}", g.name);
                t.descs.push(g.clone());
                t.owner.push((t.inner.len(), i));
            }
            t.inner.push(b);
        }
        t
    }
}

impl Backend for Tiered {
    fn name(&self) -> &'static str {
        "tiered"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.descs
    }

    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        let (b, g) = self.owner[graph];
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner[b].execute(g, inputs, outputs) }
    }
}

/// A session on contexts 24, 40 and 64 starts on 24 and moves its cache up twice as it fills; its
/// logits are bit for bit those of a session on context 64 from the start, with every strategy:
/// the rows, positions and encodings are the same, and the reference executor skips masked keys,
/// so a shorter window is the same arithmetic.
#[test]
fn moving_to_larger_context_lengths_keeps_the_logits_bit_for_bit() {
    let model = compiled();
    let buffers = 5 * 4 * 2;
    for strategy in [
        Strategy::SmartMask,
        Strategy::Naive,
        Strategy::Conveyor,
        Strategy::SHIFT_2X,
    ] {
        let alloc = HostAllocator::default();
        let large = ReferenceBackend::new(Arc::new(model.with_context(64).unwrap()));
        let mut straight = Session::new(large, strategy, &alloc).expect("context 64");
        let tiered = Tiered::new(&model, &[40, 64, 24]);
        let mut moving =
            Session::with_contexts(tiered, strategy, Box::new(alloc), None).expect("tiered");
        assert_eq!((moving.context(), moving.capacity()), (24, 63));
        let prompt: Vec<u32> = vec![1, 403, 407, 261, 378, 130, 429, 289, 302, 351, 400];
        let a = straight.prefill(&prompt).unwrap().to_vec();
        let b = moving.prefill(&prompt).unwrap().to_vec();
        assert_eq!(a, b, "{strategy:?}: prefill logits");
        assert_eq!(moving.context(), 24);
        let mut token = model::ops::argmax(&b) as u32;
        let mut seen = vec![24];
        for step in 0..50 {
            let a = straight.decode(token).unwrap().to_vec();
            let b = moving.decode(token).unwrap().to_vec();
            assert_eq!(a, b, "{strategy:?}: decode step {step}");
            if seen.last() != Some(&moving.context()) {
                seen.push(moving.context());
            }
            token = model::ops::argmax(&b) as u32;
        }
        assert_eq!(moving.tokens(), straight.tokens());
        assert_eq!(seen, [24, 40, 64], "{strategy:?}");
        let kv = moving.stats().kv;
        assert_eq!(kv.relayouts, 2);
        // Full at 23 tokens (context 24, AR-1), then at 39.
        assert_eq!(kv.rows_moved_by_relayouts, (23 + 39) * buffers);
        assert_eq!(kv.bytes_moved_by_relayouts, (23 + 39) * buffers * 8);
    }
}

/// A prompt longer than the smallest context starts on the smallest that holds it.
#[test]
fn a_long_prompt_starts_on_the_context_that_holds_it() {
    let model = compiled();
    let tiered = Tiered::new(&model, &[24, 40, 64]);
    let alloc = Box::new(HostAllocator::default());
    let mut s = Session::with_contexts(tiered, Strategy::SmartMask, alloc, None).unwrap();
    let prompt: Vec<u32> = (0..30).map(|i| 1 + (i * 37) % 500).collect();
    s.prefill(&prompt).unwrap();
    assert_eq!(s.context(), 40);
    assert_eq!(s.stats().kv.rows_moved_by_relayouts, 0);
    assert!(
        model.with_context(8).is_err(),
        "AR-8 needs a context above 8"
    );
}

/// Context lengths whose K/V encodings differ cannot exchange rows: refused when the session is
/// built, naming both.
#[test]
fn context_lengths_with_different_encodings_are_refused() {
    let model = compiled();
    let small = model.with_context(24).unwrap();
    let large = model
        .with_kv_zero_point_128()
        .unwrap()
        .with_context(64)
        .unwrap();
    let tiered = Tiered::of([small, large].into_iter());
    let alloc = Box::new(HostAllocator::default());
    let err = Session::with_contexts(tiered, Strategy::SmartMask, alloc, None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("context 24") && text.contains("context 64"),
        "{text}"
    );
}

/// The argmax after the test prompt and after each of `forced` (teacher forcing), and the largest
/// absolute logit difference from `reference` logits when given.
fn forced(model: Arc<CompiledModel>, forced: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let alloc = HostAllocator::default();
    let mut s = Session::new(ReferenceBackend::new(model), Strategy::SmartMask, &alloc).unwrap();
    let prompt: Vec<u32> = vec![1, 403, 407, 261, 378, 130, 429, 289, 302, 351, 400];
    let mut logits = vec![s.prefill(&prompt).unwrap().to_vec()];
    for &t in forced {
        logits.push(s.decode(t).unwrap().to_vec());
    }
    let top = logits
        .iter()
        .map(|l| model::ops::argmax(l) as u32)
        .collect();
    (top, logits)
}

/// u8 K/V with AI Hub's zero point 128: every K/V tensor is described with offset −128 and the
/// model runs. Symmetric ranges cost up to a bit of resolution; on stories260K (a tiny model whose
/// free-running greedy text diverges after 2 tokens under this change) the next-token choice
/// along the calibrated model's own text agrees at 39 of 40 steps (measured; 36 required).
#[test]
fn u8_kv_with_zero_point_128_runs_and_mostly_agrees() {
    let model = compiled();
    let sym = Arc::new(model.with_kv_zero_point_128().unwrap());
    let mut kv_tensors = 0;
    for g in ReferenceBackend::new(sym.clone()).graphs() {
        for t in g.inputs.iter().chain(&g.outputs) {
            let kv = [
                IoRole::PastKey,
                IoRole::PastValue,
                IoRole::NewKey,
                IoRole::NewValue,
            ];
            if !kv.contains(&t.role) {
                continue;
            }
            kv_tensors += 1;
            let encoding = t.quant.as_ref().map(|q| q.encoding.clone());
            let Some(Encoding::PerTensor(so)) = encoding else {
                panic!("{} is not per tensor", t.name)
            };
            assert_eq!(so.offset, -128, "{}", t.name);
        }
    }
    assert!(kv_tensors > 0);
    let (mut text, _) = forced(model.clone(), &[]);
    for _ in 0..39 {
        let (top, _) = forced(model.clone(), &text);
        text.push(*top.last().unwrap());
    }
    let text = &text[..40];
    let (own, _) = forced(model.clone(), &text[..39]);
    assert_eq!(own, text, "teacher forcing reproduces the greedy text");
    let (top, _) = forced(sym, &text[..39]);
    let agree = top.iter().zip(text).filter(|(a, b)| a == b).count();
    eprintln!("zero point 128: {agree} of 40 next-token choices agree along the calibrated text");
    assert!(agree >= 36, "{agree} of 40");
}

/// The sections of a reference-backend file: (tag, body), after the 28-byte header.
fn sections(bytes: &[u8]) -> Vec<([u8; 4], &[u8])> {
    let mut out = Vec::new();
    let mut at = ref_backend::format::HEADER_LEN;
    while at < bytes.len() {
        let tag: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
        let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
        out.push((tag, &bytes[at + 12..at + 12 + len]));
        at += 12 + len;
    }
    out
}

/// A file of `version` with these sections, its checksum fixed.
fn assemble(version: u32, sections: &[([u8; 4], &[u8])]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (tag, body) in sections {
        payload.extend_from_slice(tag);
        payload.extend_from_slice(&(body.len() as u64).to_le_bytes());
        payload.extend_from_slice(body);
    }
    let mut out = ref_backend::format::MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&ref_backend::crc32(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn section<'a>(all: &[([u8; 4], &'a [u8])], tag: &[u8; 4]) -> &'a [u8] {
    all.iter().find(|(t, _)| t == tag).unwrap().1
}

/// Serialized bytes of one i8 weight matrix (kind, rows, cols, row scales, values) and of one
/// f32 vector (count, values), as the file format describes them.
fn i8_matrix_bytes(rows: usize, cols: usize) -> usize {
    1 + 8 + 8 + 4 * rows + rows * cols
}
fn vector_bytes(len: usize) -> usize {
    8 + 4 * len
}

/// The weight bytes of one layer, from the model's shapes.
fn layer_bytes(c: &model::LlamaConfig) -> usize {
    let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let biases = if c.block.qkv_bias { q + 2 * kv } else { 0 };
    2 * vector_bytes(c.dim)
        + 3 * vector_bytes(0)
        + 4 * biases
        + i8_matrix_bytes(q, c.dim)
        + 2 * i8_matrix_bytes(kv, c.dim)
        + i8_matrix_bytes(c.dim, q)
        + 2 * i8_matrix_bytes(c.hidden_dim, c.dim)
        + i8_matrix_bytes(c.dim, c.hidden_dim)
}

/// Each part file of a split holds only its own weights: the embedding in part 1 and (tied
/// classifier) in the last, its layers, the final norm and LM head in the last; the other
/// sections are the whole model's, byte for byte. A part reads alone, as the part it was.
#[test]
fn part_files_hold_only_their_own_weights() {
    let model = compiled();
    let c = model.config().clone();
    assert!(
        c.tied_output,
        "stories260K ties its classifier to the embedding"
    );
    let whole = model.to_bytes();
    let whole_s = sections(&whole);
    let embedding = i8_matrix_bytes(c.vocab_size, c.dim);
    let head = vector_bytes(c.dim) + 1;
    assert_eq!(
        section(&whole_s, b"WGTS").len(),
        embedding + c.n_layers * layer_bytes(&c) + head,
        "the whole model's weights, from its shapes"
    );
    let parts = model.split(2, true).unwrap();
    let mut dropped = 0;
    for part in &parts {
        let p = part.part();
        let bytes = part.to_bytes();
        let s = sections(&bytes);
        for tag in [b"OPTS", b"MSHA", b"CONF", b"CALB", b"ENCS"] {
            assert_eq!(section(&s, tag), section(&whole_s, tag));
        }
        // Part 1 embeds; part 2 holds the tied LM head, which is the embedding.
        let expected =
            embedding + p.layers.len() * layer_bytes(&c) + if p.is_last() { head } else { 0 };
        assert_eq!(section(&s, b"WGTS").len(), expected, "part {}", p.index + 1);
        dropped += section(&whole_s, b"WGTS").len() - expected;
        assert!(bytes.len() < whole.len());
        let back = CompiledModel::from_bytes(&bytes, "part").expect("a part reads alone");
        assert_eq!(&back, part);
    }
    assert_eq!(dropped, c.n_layers * layer_bytes(&c) + head);
}

/// A damaged or hostile part file gives a typed error: cut short, a naming code no build
/// knows, a part index past the count, an ExecuTorch-named part (whose names carry no part).
#[test]
fn damaged_part_files_are_refused_with_typed_errors() {
    use ref_backend::FormatError;
    let model = compiled();
    let part = &model.split(2, false).unwrap()[1];
    let bytes = part.to_bytes();
    for cut in [bytes.len() - 1, bytes.len() / 2, 40] {
        let err = CompiledModel::from_bytes(&bytes[..cut], "cut").unwrap_err();
        assert!(matches!(err, FormatError::Truncated { .. }), "{cut}: {err}");
    }
    let s = sections(&bytes);
    let body = section(&s, b"PART");
    let hostile = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = body.to_vec();
        edit(&mut b);
        let with: Vec<([u8; 4], &[u8])> = s
            .iter()
            .map(|&(t, x)| (t, if &t == b"PART" { &b[..] } else { x }))
            .collect();
        CompiledModel::from_bytes(&assemble(ref_backend::FORMAT_VERSION, &with), "hostile")
            .unwrap_err()
    };
    for (edit, says) in [
        (
            &(|b: &mut Vec<u8>| b[17] = 9) as &dyn Fn(&mut Vec<u8>),
            "naming code 9",
        ),
        (&|b: &mut Vec<u8>| b[0] = 2, "part index 2 of 2"),
        (&|b: &mut Vec<u8>| b[17] = 2, "no part number"),
        (&|b: &mut Vec<u8>| b[8] = 200, "200 parts for 5 layers"),
    ] {
        let err = hostile(edit);
        assert!(matches!(err, FormatError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
}

/// Version-3 files (the whole model's weights in every file; a part section after the weights,
/// without a naming, meaning AI Hub's names) still read, as the model and parts they were.
#[test]
fn version_3_files_still_read() {
    let model = compiled();
    let whole = model.to_bytes();
    let ws = sections(&whole);
    let v3: Vec<_> = ws.iter().copied().filter(|(t, _)| t != b"PART").collect();
    let back = CompiledModel::from_bytes(&assemble(3, &v3), "v3").expect("a v3 whole model");
    assert_eq!(&back, &*model);
    for part in model.split(2, true).unwrap() {
        let b = part.to_bytes();
        let ps = sections(&b);
        let mut v3: Vec<_> = ws.iter().copied().take(5).collect();
        v3.push((*b"WGTS", section(&ws, b"WGTS")));
        // The version-3 part section: index, count, RoPE flag (no naming byte).
        v3.push((*b"PART", &section(&ps, b"PART")[..17]));
        v3.push((*b"GRPH", section(&ps, b"GRPH")));
        let back = CompiledModel::from_bytes(&assemble(3, &v3), "v3 part").expect("a v3 part");
        assert_eq!(back, part);
    }
}
