//! One static AR-n step of a Llama-family decoder as QNN operations, in htpkv's own IO convention
//! (the reference executor's graphs, `ref_backend`'s crate docs):
//!
//! inputs `input_ids [1, n]` i32, `positions [1, n]` i32, `attention_mask [1, 1, n, S]` (additive,
//! column `j < S-n` = past row `j`, `S-n+i` = new token `i`), per layer `l` and KV head `h`
//! `past_key_{l}_{h}` and `past_value_{l}_{h}` `[1, 1, S-n, D]`; outputs `logits [1, n, V]` (`[1, 1, V]`
//! for a last-row prefill graph, `LogitRows::Last`) and
//! `new_key_{l}_{h}`, `new_value_{l}_{h}` `[1, 1, n, D]` (keys after RoPE).
//!
//! The block structure is the one forward's (`model::forward`), read from the model's description
//! (`model::Block` and the RoPE, window, scale and soft-cap properties): the embedding (times its
//! scale), RMSNorm, Q/K/V projections (+ biases), per-head q/k RMSNorm, RoPE of the rotated
//! dimensions by the description's pairing with angles from `model::Rope` (static `[S, R/2]`
//! tables gathered by position; the window layers' own base in a table of their own), scaled
//! dot-product attention of query head `h` over KV head `h / kv_mul` with the additive mask (a
//! sliding layer's past K/V hold its window's `W - 1` rows and read `attention_mask_w{W}`), the
//! output projection, post norm and residual, the gated FFN (SiLU or GELU-tanh), post norm and
//! residual, the final RMSNorm, the classifier (the embedding when tied) and the soft-cap.

use crate::emit::{Emitter, Val};
use crate::encoding::Fixed;
use crate::w8a16::W8A16;
use graph_io::{Granularity, GraphLayout, KvIo, KvTensor, LogitRows, PositionInput, TensorKind};
use model::ops::Rope;
use model::{LayerTensor as L, LlamaConfig, RopePairing, Tensor, WeightSource};
use qnn_ffi::QnnError;
use qnn_ffi::bindings as b;
use std::ops::Range;

/// The IO convention of the graphs (tensor names, K/V granularity and layout, positions):
/// [`Preset::Htpkv`] (see the module docs: per-head K/V rows, position ids) or [`Preset::AiHub`]
/// (what Genie runs: `position_ids_cos`/`position_ids_sin` `[1, 1, n, W]` inputs the runtime
/// computes, `W` the width of [`rope_table`], `D/2` for one base; per-layer K/V
/// `past_key_{l}_in [H, 1, D, S-n]` (keys transposed), `past_value_{l}_in [H, 1, S-n, D]`,
/// outputs `past_key_{l}_out [H, 1, D, n]`, `past_value_{l}_out [H, 1, n, D]`). ExecuTorch's is
/// refused before lowering.
pub use graph_io::Preset as Naming;

/// The name of a K/V tensor (`head` per head) under `naming`, written by its convention.
fn kv_name(
    naming: Naming,
    io: KvIo,
    kind: TensorKind,
    layer: usize,
    head: Option<usize>,
) -> String {
    naming.kv_name(&KvTensor {
        io,
        kind,
        layer,
        head,
    })
}

/// One part of a (possibly split) model: the layers it runs, where its rows come from and what it
/// ends with. Each part is its own context binary; parts pass the hidden state `[1, n, dim]` (f32)
/// under the names given here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartSpec {
    /// 0-based index.
    pub index: usize,
    /// Number of parts.
    pub count: usize,
    /// The layers it runs (empty: the embedding only, AI Hub's part 1).
    pub layers: Range<usize>,
    /// `None`: token ids through the embedding; `Some(name)`: the hidden state input `name`.
    pub hidden_in: Option<String>,
    /// `None`: the final RMSNorm and the logits; `Some(name)`: the hidden state output `name`.
    pub hidden_out: Option<String>,
}

impl PartSpec {
    /// The whole model as one part.
    pub fn whole(n_layers: usize) -> PartSpec {
        PartSpec {
            index: 0,
            count: 1,
            layers: 0..n_layers,
            hidden_in: None,
            hidden_out: None,
        }
    }
}

/// What the emitter needs of one AR variant.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// Tokens per step.
    pub n: usize,
    /// The rows of the logits output: every row, or the last only (a prefill graph).
    pub rows: LogitRows,
    /// Context length (columns of the mask).
    pub context: usize,
    /// The IO convention.
    pub naming: Naming,
    /// The part of the model.
    pub part: &'a PartSpec,
}

/// Fixed-point K/V: the encoding of each (layer, KV head), `[l * n_kv_heads + h]`, keys then
/// values (in AI Hub's convention, whose K/V tensors hold a whole layer, every head of a layer
/// has the layer's encoding); `None`: f32 K/V.
pub type KvEncodings = Option<Vec<(Fixed, Fixed)>>;

/// Why the lowering cannot build a model of description `c` in `layout` (`None`: it can). It
/// builds every property of the description ([`model::Block`], RoPE factors, partial rotary,
/// window layers with their own base and window-sized K/V, embedding scale, soft-cap) in
/// htpkv's layout; in a layout of RoPE tables it refuses, by name, what one table cannot carry
/// ([`rope_table`]) and partial rotary embeddings.
pub fn model_refusal(c: &LlamaConfig, layout: GraphLayout) -> Option<String> {
    if layout.positions != PositionInput::RopeTables {
        return None;
    }
    let mut missing = Vec::new();
    if let Err(why) = rope_table(c) {
        missing.push(why);
    }
    if c.rope.rotated.is_some() {
        missing.push(
            "partial rotary embeddings (rope.rotated) under a convention of RoPE tables".into(),
        );
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The one RoPE table a runtime computes for graphs of RoPE table inputs (Genie's
/// `positional-encoding`: `dim` columns, column `k` holding `cos`/`sin` of
/// `p * theta^(-k / dim)` at position `p`) and the columns each layer reads: every
/// `global_step`-th from 0 for the global layers, every `window_step`-th for the window layers
/// of a model whose window layers have a base of their own (`rope.window_theta`).
///
/// One table carries both bases when they are powers of one base `u` (`theta = u^a`,
/// `window_theta = u^b`, small `a`, `b`: Gemma 3's 1e6 and 1e4 are 100^3 and 100^2): the table
/// then holds the frequencies `u^(-2k / R)` (`R` the rotated width), the global layers' at
/// `k = a * i`, the window layers' at `k = b * i`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeTable {
    /// Columns (`rope-dim`).
    pub dim: usize,
    /// The base of the table's frequencies (`rope-theta`).
    pub theta: f64,
    /// The global layers' columns: `0, global_step, 2 * global_step, ...` (`R / 2` of them).
    pub global_step: usize,
    /// The window layers' columns (equal to `global_step` without a base of their own).
    pub window_step: usize,
}

/// Largest power of the shared base [`rope_table`] looks for.
const MAX_BASE_POWER: u32 = 8;

/// The one table the RoPE of `c` reads under a convention of RoPE tables, or why one table
/// cannot carry it: window layers with a base of their own that is not a small power of a base
/// the global one is also a power of, or whose frequencies are rescaled (Llama 3 scaling,
/// frequency factors: the rescaled frequencies are no longer powers of one base).
pub fn rope_table(c: &LlamaConfig) -> Result<RopeTable, String> {
    let half = c.rope.rotated_dims(c.head_dim) / 2;
    let theta = f64::from(c.rope.theta);
    let Some(window) = c.rope.window_theta.map(f64::from) else {
        return Ok(RopeTable {
            dim: half,
            theta,
            global_step: 1,
            window_step: 1,
        });
    };
    let refusal = |why: &str| {
        format!(
            "window layers with a RoPE base of their own (rope.window_theta {window}, global \
             {theta}) under a convention of one RoPE table: {why}"
        )
    };
    if c.rope.scaling.is_some() || c.rope.freq_factors.is_some() {
        return Err(refusal("rescaled frequencies are not columns of one table"));
    }
    let (lt, lw) = (theta.ln(), window.ln());
    let powers = (1..=MAX_BASE_POWER).flat_map(|a| (1..=MAX_BASE_POWER).map(move |b| (a, b)));
    let Some((a, b)) = powers.filter(|&(a, b)| gcd(a, b) == 1).find(|&(a, b)| {
        lt > 0.0 && lw > 0.0 && (lt * f64::from(b) - lw * f64::from(a)).abs() <= 1e-9 * lt
    }) else {
        return Err(refusal(&format!(
            "the two bases are not powers (up to {MAX_BASE_POWER}) of one base"
        )));
    };
    let (a, b) = (a as usize, b as usize);
    let dim = a.max(b) * (half.max(1) - 1) + 1;
    let rotated = (2 * half) as f64;
    Ok(RopeTable {
        dim,
        theta: (lt * 2.0 * dim as f64 / (a as f64 * rotated)).exp(),
        global_step: a,
        window_step: b,
    })
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Why the lowering cannot build `layout`'s graphs (`None`: it can). It builds the two layouts
/// it is tested with on Qualcomm's backend: [`GraphLayout::HTPKV`] and [`GraphLayout::AIHUB`].
pub fn layout_refusal(layout: GraphLayout) -> Option<String> {
    if layout == GraphLayout::HTPKV || layout == GraphLayout::AIHUB {
        return None;
    }
    Some(format!(
        "{} K/V with {} keys and {} positions is not lowered to QNN operations (per_head K/V \
         with key rows and position ids, or per_layer K/V with transposed keys and RoPE tables)",
        layout.kv.name(),
        layout.keys.name(),
        layout.positions.name()
    ))
}

/// A layer's per-layer past K/V inputs (per-layer layouts only).
struct LayerKv {
    past: Option<(Val, Val)>,
}

/// The inputs every layer of a step reads: the masks (global first, then one per window) and
/// the RoPE rows (the global layers', then the window layers' own base when it has one).
struct StepInputs {
    windows: Vec<usize>,
    masks: Vec<Val>,
    rope: Vec<(Val, Val)>,
}

impl StepInputs {
    /// The mask of a layer of window `w` (`None`: global).
    fn index(&self, w: Option<usize>) -> usize {
        w.and_then(|w| self.windows.iter().position(|&x| x == w))
            .map_or(0, |i| i + 1)
    }

    /// The RoPE rows of layer `l`: its window's own base when it has one.
    fn rope_of(&self, lw: &Lowering<'_>, l: usize) -> usize {
        usize::from(self.rope.len() > 1 && lw.layer_window(l).is_some())
    }
}

struct Lowering<'a> {
    c: &'a LlamaConfig,
    w: &'a dyn WeightSource,
    e: Emitter,
    n: u32,
    /// The rows of the logits output.
    rows: LogitRows,
    /// Context length S.
    context: usize,
    naming: Naming,
    /// The naming's graph layout ([`GraphLayout::HTPKV`] or [`GraphLayout::AIHUB`], checked by
    /// [`layout_refusal`]).
    layout: GraphLayout,
    kv: &'a KvEncodings,
    w8: Option<&'a W8A16>,
}

fn u(v: usize) -> u32 {
    v as u32
}

impl<'a> Lowering<'a> {
    fn data(&self, t: Tensor) -> Result<&'a [f32], QnnError> {
        self.w.tensor(t).ok_or_else(|| QnnError::InvalidTensor {
            tensor: t.to_string(),
            reason: "missing from the weights".into(),
        })
    }

    fn weight(&mut self, t: Tensor) -> Result<Val, QnnError> {
        let data = self.data(t)?;
        // Vectors (norm weights, biases) as one row [1, len], to broadcast over rows.
        let mut shape: Vec<u32> = t.shape(self.c).into_iter().map(u).collect();
        if shape.len() == 1 {
            shape.insert(0, 1);
        }
        self.e.constant("w", &shape, data)
    }

    fn scalar(&mut self, v: f32) -> Result<Val, QnnError> {
        self.e.constant("c", &[1], &[v])
    }

    /// `w * x / sqrt(mean(x^2) + eps)` per row of `x [n, dim]` (`RmsNorm`, weights `[dim]`).
    fn rmsnorm(&mut self, x: &Val, weight: Tensor) -> Result<Val, QnnError> {
        let data = self.data(weight)?;
        let gamma = self.e.constant("norm", &[u(data.len())], data)?;
        self.e.rmsnorm(x, &gamma, self.c.rms_eps)
    }

    /// RMSNorm of every head of `x [n, heads*D]` with weights `[D]` (`block.qk_norm`).
    fn norm_heads(&mut self, x: &Val, heads: usize, weight: Tensor) -> Result<Val, QnnError> {
        let (n, d) = (self.n, u(self.c.head_dim));
        let x3 = self.e.reshape(x, &[n, u(heads), d], None)?;
        let y = self.rmsnorm(&x3, weight)?;
        self.e.reshape(&y, &[n, u(heads) * d], None)
    }

    /// `x + out`, `out` RMS-normalized first when the block has that post norm.
    fn residual(&mut self, x: &Val, out: &Val, post: Option<Tensor>) -> Result<Val, QnnError> {
        match post {
            Some(t) => {
                let o = self.rmsnorm(out, t)?;
                self.e.add(x, &o)
            }
            None => self.e.add(x, out),
        }
    }

    /// `x * sigmoid(k * x)`-style gates: SiLU (`k = 1`) or GELU-tanh written as
    /// `x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))` (`0.5 (1 + tanh(z)) = sigmoid(2z)`).
    fn activate(&mut self, g: &Val) -> Result<Val, QnnError> {
        let z = match self.c.block.activation {
            model::Activation::Silu => g.clone(),
            model::Activation::GeluTanh => {
                let cube = self.e.mul(g, g)?;
                let cube = self.e.mul(&cube, g)?;
                let a = self.scalar(0.044_715)?;
                let inner = self.e.mul(&cube, &a)?;
                let inner = self.e.add(g, &inner)?;
                let k = self.scalar(2.0 * (2.0 / std::f32::consts::PI).sqrt())?;
                self.e.mul(&inner, &k)?
            }
        };
        let s = self.e.sigmoid(&z)?;
        self.e.mul(g, &s)
    }

    fn linear(&mut self, x: &Val, w: Tensor, bias: Option<Tensor>) -> Result<Val, QnnError> {
        let y = match self.w8.filter(|w8| !w8.float.contains(&w)) {
            Some(w8) => {
                let m = w8.matrices.get(&w).ok_or_else(|| QnnError::InvalidTensor {
                    tensor: w.to_string(),
                    reason: "missing from the i8 weights".into(),
                })?;
                self.e.fully_connected_w8(x, m)?
            }
            None => {
                let wv = self.weight(w)?;
                self.e.fully_connected(x, &wv)?
            }
        };
        match bias {
            Some(bt) if self.c.block.qkv_bias => {
                let bv = self.weight(bt)?;
                self.e.add(&y, &bv)
            }
            _ => Ok(y),
        }
    }

    /// RoPE of `x [n, heads*D]` with the step's `cos`/`sin` (shaped for the pairing): the first
    /// `rotated` dimensions of each head turn, the rest pass through (partial rotary).
    fn rope(&mut self, x: &Val, heads: usize, cs: &(Val, Val)) -> Result<Val, QnnError> {
        let (n, d, h) = (self.n, u(self.c.head_dim), u(heads));
        let rot = u(self.c.rope.rotated_dims(self.c.head_dim));
        if rot == d {
            return self.rope_rotated(x, heads, cs);
        }
        let x3 = self.e.reshape(x, &[n, h, d], None)?;
        let turned = self.e.slice(&x3, 2, 0, rot)?;
        let turned = self.e.reshape(&turned, &[n, h * rot], None)?;
        let turned = self.rope_rotated(&turned, heads, cs)?;
        let turned = self.e.reshape(&turned, &[n, h, rot], None)?;
        let kept = self.e.slice(&x3, 2, rot, d)?;
        let r = self.e.concat(&[&turned, &kept], 2)?;
        self.e.reshape(&r, &[n, h * d], None)
    }

    /// RoPE of `x [n, heads*R]` whose every dimension turns (`R` the rotated width).
    fn rope_rotated(&mut self, x: &Val, heads: usize, cs: &(Val, Val)) -> Result<Val, QnnError> {
        let rot = self.c.rope.rotated_dims(self.c.head_dim);
        let (n, d, half) = (self.n, u(rot), u(rot / 2));
        let h = u(heads);
        // Adjacent pairs (2k, 2k+1): [n, H, half, 2], split on the last axis. Half-split
        // pairs (k, k+half): [n, H, 2, half], split on axis 2.
        let (shape, axis) = match self.c.rope.pairing {
            RopePairing::Adjacent => ([n, h, half, 2], 3),
            RopePairing::HalfSplit => ([n, h, 2, half], 2),
        };
        let x4 = self.e.reshape(x, &shape, None)?;
        let a = self.e.slice(&x4, axis, 0, 1)?;
        let bb = self.e.slice(&x4, axis, 1, 2)?;
        let (cos, sin) = cs;
        let (ac, bs) = (self.e.mul(&a, cos)?, self.e.mul(&bb, sin)?);
        let ra = self.e.sub(&ac, &bs)?;
        let (as_, bc) = (self.e.mul(&a, sin)?, self.e.mul(&bb, cos)?);
        let rb = self.e.add(&as_, &bc)?;
        let r = self.e.concat(&[&ra, &rb], axis)?;
        self.e.reshape(&r, &[n, h * d], None)
    }

    /// Columns `[h*D, (h+1)*D)` of `x [n, heads*D]`.
    fn head(&mut self, x: &Val, h: usize) -> Result<Val, QnnError> {
        let d = u(self.c.head_dim);
        self.e.slice(x, 1, u(h) * d, u(h + 1) * d)
    }

    /// A K/V input: fixed point in `enc` (read as float), or f32.
    fn kv_input(&mut self, name: &str, enc: Option<Fixed>, shape: &[u32]) -> Result<Val, QnnError> {
        match enc {
            Some(enc) => self.e.input_dequantized(name, enc, shape),
            None => self.e.input(name, b::QNN_DATATYPE_FLOAT_32, shape),
        }
    }

    /// A K/V output `name` of `shape` from `v`: quantized to `enc`, or f32.
    fn kv_output(
        &mut self,
        v: &Val,
        name: &str,
        enc: Option<Fixed>,
        shape: &[u32],
    ) -> Result<(), QnnError> {
        match enc {
            Some(enc) => {
                let r = self.e.reshape(v, shape, None)?;
                self.e.quantize(&r, enc, Some(name))?
            }
            None => self.e.reshape(v, shape, Some(name))?,
        };
        Ok(())
    }

    /// `rows` as the queries see them once stored: read back from `enc` (so AR-n equals n AR-1
    /// steps), or unchanged for f32 K/V.
    fn as_stored(&mut self, rows: &Val, enc: Option<Fixed>) -> Result<Val, QnnError> {
        match enc {
            Some(enc) => {
                let q = self.e.quantize(rows, enc, None)?;
                self.e.dequantize(&q)
            }
            None => Ok(rows.clone()),
        }
    }

    /// The attention window of layer `l` in graphs of this context (`None`: global), the
    /// reference executor's rule ([`LlamaConfig::graph_window`]).
    fn layer_window(&self, l: usize) -> Option<usize> {
        self.c.graph_window(l, self.context)
    }

    /// Past rows of layer `l`'s K/V inputs: `S - n`, or `W - 1` for a sliding layer of window W
    /// (its K/V buffers hold the window's rows, not the context's).
    fn past(&self, l: usize) -> u32 {
        self.layer_window(l)
            .map_or(u(self.context) - self.n, |w| u(w - 1))
    }

    /// Past rows of layer `l`'s K/V input `[1, 1, P, D]` (dequantized from `enc`) followed by
    /// the step's new rows `[n, D]`.
    fn window(
        &mut self,
        l: usize,
        name: &str,
        new: &Val,
        enc: Option<Fixed>,
    ) -> Result<Val, QnnError> {
        let (d, p) = (u(self.c.head_dim), self.past(l));
        let past = self.kv_input(name, enc, &[1, 1, p, d])?;
        let past = self.e.reshape(&past, &[p, d], None)?;
        self.e.concat(&[&past, new], 0)
    }

    /// The encodings of (layer, KV head), keys and values.
    fn kv_encoding(&self, l: usize, h: usize) -> Option<(Fixed, Fixed)> {
        self.kv.as_ref().map(|v| v[l * self.c.n_kv_heads + h])
    }

    /// The step's new rows `[n, D]` as output `name` `[1, 1, n, D]` in `enc` (or f32), and as the
    /// queries of this step see them: read back from `enc`, so AR-n equals n AR-1 steps.
    fn new_rows(&mut self, rows: &Val, name: &str, enc: Option<Fixed>) -> Result<Val, QnnError> {
        let (n, d) = (self.n, u(self.c.head_dim));
        self.kv_output(rows, name, enc, &[1, 1, n, d])?;
        self.as_stored(rows, enc)
    }

    /// Head `h` of a per-layer K/V input (`[H, 1, a, b]`) as `[a, b]`.
    fn layer_head(&mut self, past: &Val, h: usize) -> Result<Val, QnnError> {
        let s = self.e.slice(past, 0, u(h), u(h) + 1)?;
        self.e.reshape(&s, &past.shape[2..], None)
    }

    /// Keys and values `[S, D]` of KV head `h` (past rows, then the step's `kh`/`vh` `[n, D]`);
    /// keys come transposed (`[D, S]`, the flag) in AI Hub's layout.
    fn kv_windows(
        &mut self,
        l: usize,
        h: usize,
        kh: &Val,
        vh: &Val,
        layer: &LayerKv,
    ) -> Result<(Val, bool, Val), QnnError> {
        match self.layout.kv {
            Granularity::PerHead => {
                let (ke, ve) = self.kv_encoding(l, h).unzip();
                let kh = self.new_rows(
                    kh,
                    &kv_name(self.naming, KvIo::New, TensorKind::Key, l, Some(h)),
                    ke,
                )?;
                let vh = self.new_rows(
                    vh,
                    &kv_name(self.naming, KvIo::New, TensorKind::Value, l, Some(h)),
                    ve,
                )?;
                let keys = self.window(
                    l,
                    &kv_name(self.naming, KvIo::Past, TensorKind::Key, l, Some(h)),
                    &kh,
                    ke,
                )?;
                let values = self.window(
                    l,
                    &kv_name(self.naming, KvIo::Past, TensorKind::Value, l, Some(h)),
                    &vh,
                    ve,
                )?;
                Ok((keys, false, values))
            }
            Granularity::PerLayer => {
                let (pk, pv) = layer.past.as_ref().expect("per-layer inputs");
                let (ke, ve) = self.kv_encoding(l, 0).unzip();
                let (kh, vh) = (&self.as_stored(kh, ke)?, &self.as_stored(vh, ve)?);
                let kt = self.e.transpose(kh, &[1, 0])?;
                let past_k = self.layer_head(pk, h)?;
                let keys_t = self.e.concat(&[&past_k, &kt], 1)?;
                let past_v = self.layer_head(pv, h)?;
                let values = self.e.concat(&[&past_v, vh], 0)?;
                Ok((keys_t, true, values))
            }
        }
    }

    /// Per-layer outputs (AI Hub's layout) from the heads' new rows.
    fn layer_outputs(&mut self, l: usize, ks: &[Val], vs: &[Val]) -> Result<(), QnnError> {
        if self.layout.kv != Granularity::PerLayer {
            return Ok(());
        }
        let (n, d, h) = (self.n, u(self.c.head_dim), u(ks.len()));
        let mut kt = Vec::with_capacity(ks.len());
        for k in ks {
            let t = self.e.transpose(k, &[1, 0])?;
            kt.push(self.e.reshape(&t, &[1, 1, d, n], None)?);
        }
        let mut vr = Vec::with_capacity(vs.len());
        for v in vs {
            vr.push(self.e.reshape(v, &[1, 1, n, d], None)?);
        }
        let k = self.e.concat(&kt.iter().collect::<Vec<_>>(), 0)?;
        let v = self.e.concat(&vr.iter().collect::<Vec<_>>(), 0)?;
        let (ke, ve) = self.kv_encoding(l, 0).unzip();
        self.kv_output(
            &k,
            &kv_name(self.naming, KvIo::New, TensorKind::Key, l, None),
            ke,
            &[h, 1, d, n],
        )?;
        self.kv_output(
            &v,
            &kv_name(self.naming, KvIo::New, TensorKind::Value, l, None),
            ve,
            &[h, 1, n, d],
        )
    }

    /// Per-layer past inputs (AI Hub's layout), created once per layer.
    fn layer_inputs(&mut self, l: usize) -> Result<LayerKv, QnnError> {
        if self.layout.kv != Granularity::PerLayer {
            return Ok(LayerKv { past: None });
        }
        let (h, d, p) = (u(self.c.n_kv_heads), u(self.c.head_dim), self.past(l));
        let (ke, ve) = self.kv_encoding(l, 0).unzip();
        let pk = self.kv_input(
            &kv_name(self.naming, KvIo::Past, TensorKind::Key, l, None),
            ke,
            &[h, 1, d, p],
        )?;
        let pv = self.kv_input(
            &kv_name(self.naming, KvIo::Past, TensorKind::Value, l, None),
            ve,
            &[h, 1, p, d],
        )?;
        Ok(LayerKv {
            past: Some((pk, pv)),
        })
    }

    fn attention(&mut self, l: usize, x: &Val, lm: &StepInputs) -> Result<Val, QnnError> {
        let c = self.c;
        let xn = self.rmsnorm(x, Tensor::Layer(l, L::AttnNorm))?;
        let (mask, cs) = (
            &lm.masks[lm.index(self.layer_window(l))],
            &lm.rope[lm.rope_of(self, l)],
        );
        let q = self.linear(
            &xn,
            Tensor::Layer(l, L::Q),
            Some(Tensor::Layer(l, L::QBias)),
        )?;
        let k = self.linear(
            &xn,
            Tensor::Layer(l, L::K),
            Some(Tensor::Layer(l, L::KBias)),
        )?;
        let v = self.linear(
            &xn,
            Tensor::Layer(l, L::V),
            Some(Tensor::Layer(l, L::VBias)),
        )?;
        let (q, k) = if c.block.qk_norm {
            let q = self.norm_heads(&q, c.n_heads, Tensor::Layer(l, L::QNorm))?;
            (
                q,
                self.norm_heads(&k, c.n_kv_heads, Tensor::Layer(l, L::KNorm))?,
            )
        } else {
            (q, k)
        };
        let q = self.rope(&q, c.n_heads, cs)?;
        let k = self.rope(&k, c.n_kv_heads, cs)?;
        let scale = self.scalar(c.attention_scale())?;
        let q = self.e.mul(&q, &scale)?;
        let kv_mul = c.n_heads / c.n_kv_heads;
        let layer = self.layer_inputs(l)?;
        let (mut outs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for h in 0..c.n_kv_heads {
            let (kh, vh) = (self.head(&k, h)?, self.head(&v, h)?);
            let (keys, transposed, values) = self.kv_windows(l, h, &kh, &vh, &layer)?;
            for qh in h * kv_mul..(h + 1) * kv_mul {
                let qv = self.head(&q, qh)?;
                let scores = self.e.matmul(&qv, &keys, !transposed)?;
                let scores = self.e.add(&scores, mask)?;
                let p = self.e.softmax(&scores)?;
                outs.push(self.e.matmul(&p, &values, false)?);
            }
            ks.push(kh);
            vs.push(vh);
        }
        self.layer_outputs(l, &ks, &vs)?;
        let att = self.e.concat(&outs.iter().collect::<Vec<_>>(), 1)?;
        let o = self.linear(&att, Tensor::Layer(l, L::O), None)?;
        let post = c
            .block
            .post_attention_norm
            .then_some(Tensor::Layer(l, L::PostAttnNorm));
        self.residual(x, &o, post)
    }

    fn ffn(&mut self, l: usize, x: &Val) -> Result<Val, QnnError> {
        let xn = self.rmsnorm(x, Tensor::Layer(l, L::FfnNorm))?;
        let g = self.linear(&xn, Tensor::Layer(l, L::Gate), None)?;
        let up = self.linear(&xn, Tensor::Layer(l, L::Up), None)?;
        let act = self.activate(&g)?;
        let hb = self.e.mul(&act, &up)?;
        let down = self.linear(&hb, Tensor::Layer(l, L::Down), None)?;
        let post = self
            .c
            .block
            .post_ffn_norm
            .then_some(Tensor::Layer(l, L::PostFfnNorm));
        self.residual(x, &down, post)
    }

    /// The step's cos/sin rows, shaped to broadcast over heads for the pairing: gathered from a
    /// static table by the `positions` input (htpkv), or AI Hub's `position_ids_cos/sin` inputs.
    fn rope_rows(&mut self, context: usize) -> Result<Vec<(Val, Val)>, QnnError> {
        let half = u(self.c.rope.rotated_dims(self.c.head_dim) / 2);
        if self.layout.positions == PositionInput::Ids {
            let positions = self
                .e
                .input("positions", b::QNN_DATATYPE_INT_32, &[1, self.n])?;
            let mut rows = vec![self.rope_tables(&positions, context, false)?];
            if self.c.rope.window_theta.is_some() {
                rows.push(self.rope_tables(&positions, context, true)?);
            }
            return Ok(rows);
        }
        let table = rope_table(self.c).map_err(|reason| QnnError::InvalidTensor {
            tensor: "position_ids_cos".into(),
            reason,
        })?;
        let (n, width) = (self.n, u(table.dim));
        let shape = self.pair_shape();
        let f = b::QNN_DATATYPE_FLOAT_32;
        let mut inputs = Vec::with_capacity(2);
        for name in ["position_ids_cos", "position_ids_sin"] {
            let v = self.e.input(name, f, &[1, 1, n, width])?;
            inputs.push(self.e.reshape(&v, &[n, width], None)?);
        }
        let mut steps = vec![table.global_step];
        if self.c.rope.window_theta.is_some() {
            steps.push(table.window_step);
        }
        let mut rows = Vec::with_capacity(steps.len());
        for step in steps {
            let end = u(step * (half as usize - 1) + 1);
            let mut pick = |t: &Val| -> Result<Val, QnnError> {
                let cols = if (step, end) == (1, width) {
                    t.clone()
                } else {
                    self.e.slice_every(t, 1, 0..end, u(step))?
                };
                self.e.reshape(&cols, &shape, None)
            };
            rows.push((pick(&inputs[0])?, pick(&inputs[1])?));
        }
        Ok(rows)
    }

    /// `[n, 1, D/2, 1]` (adjacent pairs) or `[n, 1, 1, D/2]` (half-split): cos/sin rows that
    /// broadcast over the heads of [`Self::rope`]'s layout.
    fn pair_shape(&self) -> [u32; 4] {
        let half = u(self.c.rope.rotated_dims(self.c.head_dim) / 2);
        match self.c.rope.pairing {
            RopePairing::Adjacent => [self.n, 1, half, 1],
            RopePairing::HalfSplit => [self.n, 1, 1, half],
        }
    }

    /// The cos/sin rows of `positions` from a static `[S, R/2]` table of the global layers'
    /// frequencies, or of the window layers' own (`windowed`).
    fn rope_tables(
        &mut self,
        positions: &Val,
        context: usize,
        windowed: bool,
    ) -> Result<(Val, Val), QnnError> {
        let c = self.c;
        let rope = Rope::new(c.head_dim, &c.rope);
        let half = rope.frequencies().len();
        let (mut cos, mut sin) = (vec![0.0; context * half], vec![0.0; context * half]);
        for (p, (cr, sr)) in cos
            .chunks_exact_mut(half)
            .zip(sin.chunks_exact_mut(half))
            .enumerate()
        {
            rope.cos_sin_of(windowed, p, cr, sr);
        }
        let shape = self.pair_shape();
        let mut rows = |t: &[f32]| -> Result<Val, QnnError> {
            let table = self.e.constant("rope", &[u(context), u(half)], t)?;
            let g = self.e.gather_rows(&table, positions)?;
            self.e.reshape(&g, &shape, None)
        };
        Ok((rows(&cos)?, rows(&sin)?))
    }

    fn emit(&mut self, step: Step<'_>) -> Result<(), QnnError> {
        let (c, part) = (self.c, step.part);
        let (n, dim) = (self.n, u(c.dim));
        let mut x = match &part.hidden_in {
            None => self.embed()?,
            Some(name) => {
                let h = self.e.input(name, b::QNN_DATATYPE_FLOAT_32, &[1, n, dim])?;
                self.e.reshape(&h, &[n, dim], None)?
            }
        };
        if !part.layers.is_empty() {
            let inputs = self.step_inputs(part)?;
            for l in part.layers.clone() {
                x = self.attention(l, &x, &inputs)?;
                x = self.ffn(l, &x)?;
            }
        }
        match &part.hidden_out {
            Some(name) => self.e.reshape(&x, &[1, n, dim], Some(name))?,
            None => self.logits(&x)?,
        };
        Ok(())
    }

    /// The masks (the global `attention_mask [1, 1, n, S]`, then `attention_mask_w{W}
    /// [1, 1, n, W - 1 + n]` per distinct window of the part's layers, ascending: the reference
    /// executor's inputs) and the RoPE rows of one step.
    fn step_inputs(&mut self, part: &PartSpec) -> Result<StepInputs, QnnError> {
        let n = self.n;
        let mut windows: Vec<usize> = part
            .layers
            .clone()
            .filter_map(|l| self.layer_window(l))
            .collect();
        windows.sort_unstable();
        windows.dedup();
        let mut masks = Vec::new();
        for w in std::iter::once(None).chain(windows.iter().copied().map(Some)) {
            let cols = w.map_or(u(self.context), |w| u(w - 1) + n);
            let name = graph_io::mask_name(w);
            let m = self
                .e
                .input(&name, b::QNN_DATATYPE_FLOAT_32, &[1, 1, n, cols])?;
            masks.push(self.e.reshape(&m, &[n, cols], None)?);
        }
        let rope = self.rope_rows(self.context)?;
        Ok(StepInputs {
            windows,
            masks,
            rope,
        })
    }

    /// The `input_ids` input through the embedding, `[n, dim]`.
    fn embed(&mut self) -> Result<Val, QnnError> {
        let c = self.c;
        let ids = self
            .e
            .input("input_ids", b::QNN_DATATYPE_INT_32, &[1, self.n])?;
        let emb = match self.w8 {
            Some(w8) => {
                let shape = [u(c.vocab_size), u(c.dim)];
                self.e.constant("embedding", &shape, &w8.embedding)?
            }
            None => self.weight(Tensor::TokenEmbedding)?,
        };
        let x = self.e.gather_rows(&emb, &ids)?;
        let x = self.e.reshape(&x, &[self.n, u(c.dim)], None)?;
        match c.embed_scale {
            Some(s) => {
                let s = self.scalar(s)?;
                self.e.mul(&x, &s)
            }
            None => Ok(x),
        }
    }

    /// The final RMSNorm and the classifier (the embedding when tied) of the step's rows, or of
    /// its last row only ([`LogitRows::Last`]): output `logits [1, rows, vocab]`.
    fn logits(&mut self, x: &Val) -> Result<Val, QnnError> {
        let c = self.c;
        let rows = u(self.rows.count(self.n as usize));
        let x = match self.rows {
            LogitRows::All => x.clone(),
            LogitRows::Last => self.e.slice(x, 0, self.n - 1, self.n)?,
        };
        let xn = self.rmsnorm(&x, Tensor::OutputNorm)?;
        let cls = Tensor::classifier(c);
        let logits = self.linear(&xn, cls, None)?;
        let logits = match c.final_softcap {
            Some(cap) => self.softcap(&logits, cap)?,
            None => logits,
        };
        self.e
            .reshape(&logits, &[1, rows, u(c.vocab_size)], Some("logits"))
    }

    /// `cap * tanh(x / cap)`, written as `cap * (2 sigmoid(2x / cap) - 1)`.
    fn softcap(&mut self, x: &Val, cap: f32) -> Result<Val, QnnError> {
        let k = self.scalar(2.0 / cap)?;
        let s = self.e.mul(x, &k)?;
        let s = self.e.sigmoid(&s)?;
        let two_cap = self.scalar(2.0 * cap)?;
        let s = self.e.mul(&s, &two_cap)?;
        let c = self.scalar(cap)?;
        self.e.sub(&s, &c)
    }
}

/// Emits the AR-`step.n` graph of model `c` with weights `w` into `e` (see the module docs); with
/// `w8`, every matrix product is W8A16 ([`crate::w8a16`]).
pub fn emit_step(
    c: &LlamaConfig,
    w: &dyn WeightSource,
    e: Emitter,
    step: Step<'_>,
    kv: &KvEncodings,
    w8: Option<&W8A16>,
) -> Result<Emitter, QnnError> {
    let mut lw = Lowering {
        c,
        w,
        e,
        n: u(step.n),
        rows: step.rows,
        context: step.context,
        naming: step.naming,
        layout: step.naming.convention().layout,
        kv,
        w8,
    };
    lw.emit(step)?;
    Ok(lw.e)
}
