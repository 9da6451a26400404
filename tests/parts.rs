//! Split models through the session: a backend whose every AR variant is two parts — part 1 turns
//! the token ids and positions into a "hidden state", part 2 takes it with the mask and every K/V
//! tensor and writes u16-quantized logits — gives exactly the whole model's logits (quantized the
//! same way), step for step and token for token.

use htpkv::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoRole, IoTensor, OutputBuffer, PartOf,
};
use htpkv::reference::ReferenceBackend;
use htpkv::session::{Session, SessionError};
use kv_manager::{HostAllocator, Strategy};
use llama2c::{Checkpoint, ModelFiles, Tokenizer};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::sync::Arc;

fn compiled() -> Arc<CompiledModel> {
    let files = ModelFiles::discover(None).expect("the stories260K model (set HTPKV_MODEL_DIR)");
    let ckpt = Checkpoint::load(&files.checkpoint).expect("checkpoint loads");
    let tok = Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size).expect("tokenizer loads");
    let mut opts = CompileOptions::new(ckpt.config.seq_len, vec![1, 8]);
    opts.kv_dtype = DataType::U8;
    opts.weights = WeightType::I8;
    let prompts: Vec<Vec<u32>> = ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|t| tok.encode(t, true, false))
        .collect();
    let c = llama2c::llama_config(&ckpt.config);
    let model = ref_backend::compile(&c, &ckpt, &prompts, &opts, ckpt.sha256(), &mut |_| {});
    Arc::new(model.expect("compiles"))
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
            let mut inputs = vec![hidden(IoRole::HiddenIn)];
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
        let g = &self.inner.graphs()[inner];
        let mut rest = inputs[1..].iter();
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
        let mut parts = Session::new(split, strategy, &alloc).expect("split session");
        assert_eq!(parts.capacity(), whole.capacity());
        let prompt: Vec<u32> = vec![1, 403, 407, 261, 378, 130, 429, 289, 302, 351, 400];
        let a = through_u16(whole.prefill(&prompt).unwrap());
        let b = parts.prefill(&prompt).unwrap().to_vec();
        assert_eq!(a, b, "{strategy:?}: prefill logits");
        let mut token = llama2c::argmax(&b) as u32;
        for step in 0..40 {
            let a = through_u16(whole.decode(token).unwrap());
            let b = parts.decode(token).unwrap().to_vec();
            assert_eq!(a, b, "{strategy:?}: decode step {step}");
            token = llama2c::argmax(&b) as u32;
        }
        assert_eq!(parts.tokens(), whole.tokens());
    }
}

#[test]
fn a_missing_part_is_refused_by_name() {
    let model = compiled();
    let split = Split::new(ReferenceBackend::new(model), true);
    let err = Session::new(split, Strategy::SmartMask, &HostAllocator::default()).unwrap_err();
    assert!(matches!(err, SessionError::Graphs(_)), "{err}");
    assert!(err.to_string().contains("parts [1] of 2"), "{err}");
}
