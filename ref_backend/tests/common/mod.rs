//! Shared test helpers: model discovery and a plain left-padded KV window harness (one Vec per
//! (layer, head, K|V) history; windows rebuilt by hand every step — deliberately NOT the
//! kv_manager crate).
#![allow(dead_code)]

use std::path::PathBuf;

use model::llama2c::{Checkpoint, Config, ModelFiles, Tokenizer};
use ref_backend::{CompileError, CompileOptions, CompiledModel, Graph, IoRole};

/// The stories260K model and tokenizer, or `None` (with a message) when absent.
pub fn real_model() -> Option<(Checkpoint, Tokenizer)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let extra = [root.join("../shared/models/stories260K")];
    match ModelFiles::discover_with(None, &extra).and_then(|f| f.load()) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!(
                "SKIPPED: the stories260K model is not available (set HTPKV_MODEL_DIR or put it in ../shared/models/stories260K): {e}"
            );
            None
        }
    }
}

/// A small synthetic checkpoint (always available).
pub fn synthetic(shared_classifier: bool) -> Checkpoint {
    let config = Config {
        dim: 32,
        hidden_dim: 48,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        vocab_size: 64,
        seq_len: 64,
        shared_classifier,
    };
    Checkpoint::synthetic(config, 7).expect("valid synthetic config")
}

/// The default calibration prompts, tokenized with BOS.
pub fn default_prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|p| tok.encode(p, true, false))
        .collect()
}

/// Synthetic calibration prompts for a synthetic model.
pub fn synthetic_prompts(vocab: usize) -> Vec<Vec<u32>> {
    (0..3u32)
        .map(|p| {
            (0..6u32)
                .map(|i| (1 + p * 7 + i * 5) % vocab as u32)
                .collect()
        })
        .collect()
}

/// Compiles a llama2.c checkpoint: its description, its weights, its SHA-256 as fingerprint.
pub fn compile_ckpt(
    ckpt: &Checkpoint,
    prompts: &[Vec<u32>],
    o: &CompileOptions,
) -> Result<CompiledModel, CompileError> {
    let c = model::llama2c::llama_config(&ckpt.config);
    ref_backend::compile(&c, ckpt, prompts, o, ckpt.sha256(), &mut |_| {})
}

pub fn options(context: usize, ar: Vec<usize>) -> CompileOptions {
    CompileOptions::new(context, ar)
}

/// Byte pattern for padding rows: finite but large values in every float format, so reading
/// it would visibly change the results.
const PAD: u8 = 0x5a;

/// A left-padded KV harness: the committed K/V rows of every (layer, head, K|V) in "rows"
/// layout (token-major, D elements each), as bytes.
pub struct Harness {
    /// `hist[(l * H + h) * 2 + kind]`.
    hist: Vec<Vec<u8>>,
    h: usize,
    d: usize,
    es: usize,
    transposed: bool,
    /// Committed tokens.
    pub len: usize,
}

impl Harness {
    /// A harness for `model`'s graphs.
    pub fn for_model(model: &ref_backend::CompiledModel) -> Self {
        Harness::new(
            model.config(),
            model.options().kv_dtype.size_bytes(),
            model.options().k_layout == ref_backend::KLayout::Transposed,
        )
    }

    pub fn new(config: &model::LlamaConfig, kv_elem_size: usize, transposed_keys: bool) -> Self {
        Harness {
            hist: vec![Vec::new(); config.n_layers * config.n_kv_heads * 2],
            h: config.n_kv_heads,
            d: config.head_dim,
            es: kv_elem_size,
            transposed: transposed_keys,
            len: 0,
        }
    }

    /// Runs one step of `graph` over `tokens` (at most n; the rest of the step is filled
    /// with copies of the last token and not committed) at positions `len..`, commits the
    /// real tokens' K/V and returns the logits of the real tokens (`tokens.len() * V`).
    ///
    /// Every past tensor holds the last rows of its layer's history, as many as its shape has
    /// (`S - n`, or `W - 1` on a sliding layer), left-padded; a mask named
    /// `attention_mask_w{W}` shows new token i the positions `len + i + 1 - W ..`.
    pub fn step(&mut self, graph: &Graph, tokens: &[u32]) -> Vec<f32> {
        let n = graph.ar();
        let k = tokens.len();
        assert!(k >= 1 && k <= n, "step of {k} tokens on AR-{n}");
        let (d, es) = (self.d, self.es);
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for desc in graph.inputs() {
            let mut buf = vec![0u8; desc.byte_size()];
            match desc.role {
                IoRole::InputIds => {
                    for i in 0..n {
                        let t = tokens[i.min(k - 1)] as i32;
                        buf[i * 4..i * 4 + 4].copy_from_slice(&t.to_le_bytes());
                    }
                }
                IoRole::Positions => {
                    for i in 0..n {
                        let p = (self.len + i) as i32;
                        buf[i * 4..i * 4 + 4].copy_from_slice(&p.to_le_bytes());
                    }
                }
                IoRole::Mask => {
                    let es = desc.dtype.size_bytes();
                    let cols = desc.shape[3];
                    let w = cols - n;
                    let window = kv_manager::parse_mask_name(&desc.name)
                        .expect("a mask name")
                        .unwrap_or(usize::MAX);
                    for i in 0..n {
                        for j in 0..cols {
                            // Past column j holds position len - w + j.
                            let seen = |p: usize| p.saturating_add(window) > self.len + i;
                            let vis = if j < w {
                                j + self.len >= w && seen(self.len + j - w)
                            } else {
                                j - w <= i
                            };
                            let b = ref_backend::mask_value_bytes(desc.dtype, vis);
                            let at = (i * cols + j) * es;
                            buf[at..at + es].copy_from_slice(&b);
                        }
                    }
                }
                IoRole::PastKey | IoRole::PastValue => {
                    buf.fill(PAD);
                    let value = desc.role == IoRole::PastValue;
                    let transposed = !value && self.transposed;
                    let w = desc.shape[if transposed { 3 } else { 2 }];
                    let valid = self.len.min(w);
                    let l = desc.layer.expect("KV tensor has a layer");
                    let heads: Vec<usize> = match desc.head {
                        Some(h) => vec![h],
                        None => (0..desc.shape[0]).collect(),
                    };
                    for (slot, &h) in heads.iter().enumerate() {
                        let hist = &self.hist[(l * self.h + h) * 2 + usize::from(value)];
                        let base = slot * w * d * es;
                        for r in 0..valid {
                            let src_row = self.len - valid + r;
                            let j = w - valid + r;
                            for e in 0..d {
                                let src = (src_row * d + e) * es;
                                let at = if transposed { e * w + j } else { j * d + e };
                                let dst = base + at * es;
                                buf[dst..dst + es].copy_from_slice(&hist[src..src + es]);
                            }
                        }
                    }
                }
                other => panic!("unexpected input role {other:?}"),
            }
            inputs.push(buf);
        }
        let mut outputs: Vec<Vec<u8>> = graph
            .outputs()
            .iter()
            .map(|o| vec![0u8; o.byte_size()])
            .collect();
        {
            let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
            let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(|v| v.as_mut_slice()).collect();
            graph.execute(&ins, &mut outs).expect("execute");
        }
        let mut logits = Vec::new();
        for (desc, buf) in graph.outputs().iter().zip(&outputs) {
            match desc.role {
                IoRole::Logits => {
                    let v = desc.shape[2];
                    logits = buf[..k * v * 4]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                }
                IoRole::NewKey | IoRole::NewValue => {
                    let value = desc.role == IoRole::NewValue;
                    let transposed = !value && self.transposed;
                    let l = desc.layer.expect("KV tensor has a layer");
                    let heads: Vec<usize> = match desc.head {
                        Some(h) => vec![h],
                        None => (0..desc.shape[0]).collect(),
                    };
                    for (slot, &h) in heads.iter().enumerate() {
                        let hist = &mut self.hist[(l * self.h + h) * 2 + usize::from(value)];
                        let base = slot * n * d * es;
                        for i in 0..k {
                            for e in 0..d {
                                let at = if transposed { e * n + i } else { i * d + e };
                                let src = base + at * es;
                                hist.extend_from_slice(&buf[src..src + es]);
                            }
                        }
                    }
                }
                other => panic!("unexpected output role {other:?}"),
            }
        }
        self.len += k;
        logits
    }
}

/// The mask dtype of a graph (for tests that build inputs by hand).
pub fn mask_dtype(graph: &Graph) -> quant::DataType {
    graph.inputs()[2].dtype
}

pub fn argmax(x: &[f32]) -> usize {
    model::ops::argmax(x)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Re-seals a compiled file with a correct checksum, so the content checks are reached.
pub fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    let crc = ref_backend::crc32(&b[ref_backend::format::HEADER_LEN..]);
    b[24..28].copy_from_slice(&crc.to_le_bytes());
    b
}
