//! A plain left-padded KV window harness over a compiled graph (one Vec per (layer, head, K|V)
//! history; windows rebuilt by hand every step — deliberately NOT the kv_manager crate), and small
//! numeric helpers.

use ref_backend::{Graph, IoRole};

/// Byte pattern for padding rows: finite but large values in every float format, so reading
/// it would visibly change the results.
const PAD: u8 = 0x5a;

/// A left-padded KV harness: the committed K/V rows of every (layer, head, K|V) in "rows"
/// layout (token-major, D elements each), as bytes.
#[derive(Debug)]
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
    /// real tokens' K/V and returns the logits of the real tokens (`tokens.len() * V`; a
    /// last-row graph's one row, `V`).
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
                    // A last-row graph's one row, else the real tokens' rows.
                    let (rows, v) = (desc.shape[1], desc.shape[2]);
                    let keep = if rows == n { k } else { rows };
                    logits = buf[..keep * v * 4]
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

/// The logits of every position of `tokens` through `model`'s graphs: the first 8 tokens in
/// AR-4 steps, then AR-1 (the model must have both graphs).
pub fn logits_ar4_then_ar1(model: &ref_backend::CompiledModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (g1, g4) = (
        model.graph_for_ar(1).unwrap(),
        model.graph_for_ar(4).unwrap(),
    );
    let v = model.config().vocab_size;
    let mut h = Harness::for_model(model);
    let mut out = Vec::new();
    for chunk in tokens[..8].chunks(4) {
        out.extend(h.step(g4, chunk).chunks_exact(v).map(<[f32]>::to_vec));
    }
    for &t in &tokens[8..] {
        out.push(h.step(g1, &[t]));
    }
    out
}

/// The largest absolute difference of two equally long vectors.
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
