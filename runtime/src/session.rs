//! The runtime session: a compiled model on a backend, a KV cache built from the model's own tensor
//! descriptions, a tokenizer and a sampler.

use crate::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoRole, IoTensor, LogitRows, OutputBuffer,
};
use crate::convention::{self, MaskEncoding};
use crate::sampler::{Sampler, SamplerError};
use kv_manager::{
    CacheSpec, Counters, Geometry, Granularity, KLayout, KvCache, KvError, KvIo, KvTensor,
    RegionAllocator, Strategy, TensorKind, encodings_from_graphs,
};
use model::RopeConfig;
use model::ops::Rope;
use quant::QuantSpec;
use std::time::Instant;

mod beam;
mod contexts;
mod cross;
mod generate;
mod overflow;
mod verify;
pub use beam::{Beam, BeamMemory, BeamOptions, BeamSearch, Samples, decode_text};
use contexts::Tiers;
pub use generate::{
    Cancel, GenerateOptions, Generation, MAX_STOP_BYTES, MAX_STOPS, StopReason, TextOutput,
    Utf8Stream, find_stop, stop_prefix_len,
};
pub use overflow::{Overflow, SlideEvent, SlidePositions};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The model's graphs do not describe a KV cache the runtime can serve.
    #[error("model graphs: {0}")]
    Graphs(String),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Beam(#[from] kv_manager::BeamError),
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    /// A runtime-made input (mask, RoPE table) or the logits could not be encoded or decoded.
    #[error("encoding a graph input or decoding the logits")]
    Encode(#[source] quant::QuantError),
    /// A token id outside the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    Token { token: u32, vocab: usize },
    /// Nothing to run, or a malformed request.
    #[error("{0}")]
    Input(String),
    /// The prompt does not fit in what is left of the context. With `at_least`, the prompt was
    /// refused before it was tokenized, from a lower bound on its token count
    /// ([`check_text_fits`]).
    #[error(
        "the prompt has {}{prompt} tokens but the context holds only {room} more",
        if *at_least { "at least " } else { "" }
    )]
    PromptTooLong {
        prompt: usize,
        room: usize,
        at_least: bool,
    },
}

impl SessionError {
    /// The error's kind (`context_full`, `kv`, `bad_option`, `backend`, `bad_model`, `constraint`).
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::PromptTooLong { .. } => "context_full",
            SessionError::Kv(e) => e.kind(),
            SessionError::Beam(e) => e.kind(),
            SessionError::Backend(_) => "backend",
            SessionError::Sampler(_) | SessionError::Input(_) | SessionError::Token { .. } => {
                "bad_option"
            }
            SessionError::Graphs(_) | SessionError::Encode(_) => "bad_model",
            SessionError::Constraint(_) => "constraint",
        }
    }
}

/// Where the bytes of one graph input come from.
#[derive(Debug, Clone)]
enum Feed {
    InputIds,
    Positions,
    /// The mask of the layers of attention window `Option<usize>` (`None`: the global one), bound
    /// by its name ([`kv_manager::mask_name`]).
    Mask(QuantSpec, MaskEncoding, Option<usize>),
    /// The RoPE cos (`sin: false`) or sin table of the step's positions, `rope` of the table's width.
    Rope {
        spec: QuantSpec,
        rope: Rope,
        sin: bool,
    },
    /// The hidden state the previous part wrote (index into the session's hidden buffers, bytes).
    Hidden(usize, usize),
    Past(usize),
    /// A static cross-attention tensor (index into the plan's cross bindings).
    Cross(usize),
}

/// Where one graph output goes.
#[derive(Debug, Clone)]
enum Sink {
    /// Logits, decoded from `Some(encoding)` when the graph does not write f32.
    Logits(Option<QuantSpec>),
    /// The hidden state for the next part (index into the session's hidden buffers, bytes).
    Hidden(usize, usize),
    New(usize),
}

/// One graph of a step: a whole model, or one part of a split one.
#[derive(Debug, Clone)]
struct PartSlot {
    index: usize,
    feeds: Vec<Feed>,
    sinks: Vec<Sink>,
}

/// An AR variant: its graphs (the parts, in order) run one after the other each step.
#[derive(Debug, Clone)]
struct GraphSlot {
    ar: usize,
    parts: Vec<PartSlot>,
    /// The variant's graph returning only the last row's logits, when the model has one (a
    /// whole model's prefill graph, [`LogitRows::Last`]): run where no other row is consumed.
    last: Option<PartSlot>,
}

impl GraphSlot {
    /// The graphs a step returning the logits of `rows` runs, and how many rows they return.
    fn graphs(&self, rows: LogitRows) -> (&[PartSlot], usize) {
        match (rows, &self.last) {
            (LogitRows::Last, Some(last)) => (std::slice::from_ref(last), 1),
            _ => (&self.parts, self.ar),
        }
    }
}

/// What binding one graph of a step needs besides the graph: the cache geometry, the RoPE
/// configuration of table inputs, the boundary (index, bytes) of the hidden state the part
/// before it wrote, and the boundary it writes (when a part follows).
struct Binding<'a> {
    geometry: &'a Geometry,
    rope: Option<&'a RopeConfig>,
    into: Option<(usize, usize)>,
    out_of: Option<usize>,
}

/// What the graphs bound so far need: the vocabulary (the logits' last dimension) and the byte
/// size of each hidden-state boundary.
#[derive(Default)]
struct SlotSizes {
    vocab: usize,
    hidden: Vec<usize>,
}

/// How the session binds graph `index`; also returns the boundary it writes (index, bytes).
fn part_slot(
    graphs: &[GraphDesc],
    index: usize,
    bind: &Binding<'_>,
    sizes: &mut SlotSizes,
) -> Result<(PartSlot, Option<(usize, usize)>), SessionError> {
    let g = &graphs[index];
    let geometry = bind.geometry;
    let feeds = (g.inputs.iter())
        .map(|t| feed_of(g, t, geometry, bind.rope, bind.into))
        .collect::<Result<Vec<_>, _>>()?;
    let mut wrote = None;
    let mut sinks = Vec::new();
    for t in &g.outputs {
        sinks.push(match t.role {
            IoRole::Logits => {
                sizes.vocab = *t.shape.last().unwrap_or(&0);
                let raw = t.quant.clone().filter(|q| q.dtype != quant::DataType::F32);
                Sink::Logits(raw)
            }
            IoRole::HiddenOut => {
                let b = bind.out_of.ok_or_else(|| {
                    SessionError::Graphs(format!(
                        "`{}` of graph `{}` names no role, and the last part has no next part to \
                         pass it to",
                        t.name, g.name
                    ))
                })?;
                if sizes.hidden.len() <= b {
                    sizes.hidden.resize(b + 1, 0);
                }
                sizes.hidden[b] = sizes.hidden[b].max(t.byte_size());
                wrote = Some((b, t.byte_size()));
                Sink::Hidden(b, t.byte_size())
            }
            IoRole::NewKey => Sink::New(kv_index(geometry, t, TensorKind::Key)?),
            IoRole::NewValue => Sink::New(kv_index(geometry, t, TensorKind::Value)?),
            other => {
                return Err(SessionError::Graphs(format!(
                    "output `{}` has input role {other:?}",
                    t.name
                )));
            }
        });
    }
    let part = PartSlot {
        index,
        feeds,
        sinks,
    };
    Ok((part, wrote))
}

/// The bindings of every graph of one context length.
struct Slots {
    slots: Vec<GraphSlot>,
    vocab: usize,
    /// Byte size of each hidden-state boundary between parts.
    hidden: Vec<usize>,
}

/// Whether graph `g` runs the steps of context length `context`: a part without a mask (one that
/// only embeds, say) goes with every context length; an encoder graph is run once per request,
/// not per step.
fn steps_in(g: &GraphDesc, context: usize) -> bool {
    !g.is_encoder() && g.context().is_none_or(|c| c == context)
}

/// The graphs returning only the last row's logits ([`GraphDesc::logit_rows`]) of context length
/// `context`, with their AR: each a whole model's (one part).
fn last_row_graphs(
    graphs: &[GraphDesc],
    context: usize,
) -> Result<Vec<(usize, usize)>, SessionError> {
    let last = graphs
        .iter()
        .enumerate()
        .filter(|(_, g)| steps_in(g, context) && g.logit_rows() == Some(LogitRows::Last));
    last.map(|(i, g)| match (g.ar(), g.part.count) {
        (Some(ar), 1) => Ok((ar, i)),
        _ => Err(SessionError::Graphs(format!(
            "graph `{}` returns the last row's logits and is part {} of {}: only a whole \
             model's graph can",
            g.name,
            g.part.index + 1,
            g.part.count
        ))),
    })
    .collect()
}

/// The graphs of each AR variant of context length `context`, parts in order (those returning
/// every row's logits: a last-row graph goes with its variant, [`last_row_graphs`]).
fn variant_groups(graphs: &[GraphDesc], context: usize) -> Result<Vec<Vec<usize>>, SessionError> {
    let bad = |m: String| SessionError::Graphs(m);
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, g) in graphs.iter().enumerate() {
        if !steps_in(g, context) || g.logit_rows() == Some(LogitRows::Last) {
            continue;
        }
        let ar = g
            .ar()
            .ok_or_else(|| bad(format!("graph `{}` has no token or mask input", g.name)))?;
        match groups.iter_mut().find(|(a, _)| *a == ar) {
            Some((_, list)) => list.push(i),
            None => groups.push((ar, vec![i])),
        }
    }
    groups.sort_by_key(|(ar, _)| *ar);
    for (ar, list) in &mut groups {
        list.sort_by_key(|&i| graphs[i].part.index);
        let count = graphs[list[0]].part.count;
        let parts: Vec<usize> = list.iter().map(|&i| graphs[i].part.index).collect();
        if parts != (0..count).collect::<Vec<_>>()
            || list.iter().any(|&i| graphs[i].part.count != count)
        {
            return Err(bad(format!(
                "the AR-{ar} graphs of context {context} are parts {parts:?} of {count}; every \
                 part must be there once"
            )));
        }
    }
    Ok(groups.into_iter().map(|(_, list)| list).collect())
}

/// Wall time and token counts of the session's work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionStats {
    pub prefill_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_tokens: usize,
    pub decode_seconds: f64,
    /// Prompt tokens found in the cache and not prefilled again ([`Session::prefill_reusing`]).
    pub reused_tokens: usize,
    /// Slides (or restarts) when the context filled, and their total wall time.
    pub slides: usize,
    pub slide_seconds: f64,
    /// The KV manager's totals.
    pub kv: Counters,
}

impl SessionStats {
    /// Prompt tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_seconds)
    }
    /// Generated tokens per second.
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.decode_tokens, self.decode_seconds)
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// Derives the cache geometry and per-buffer encodings from a model's graphs (of the largest
/// context length when they have several).
pub fn cache_spec_from_graphs(
    graphs: &[GraphDesc],
    strategy: Strategy,
) -> Result<CacheSpec, SessionError> {
    cache_spec_for_context(graphs, strategy, contexts::largest(graphs)?)
}

/// The cache geometry and per-buffer encodings of the graphs of context length `context`.
pub fn cache_spec_for_context(
    graphs: &[GraphDesc],
    strategy: Strategy,
    context: usize,
) -> Result<CacheSpec, SessionError> {
    let bad = |m: String| SessionError::Graphs(m);
    if graphs.is_empty() {
        return Err(bad("the model has no graphs".into()));
    }
    let groups = variant_groups(graphs, context)?;
    let first = &graphs[groups[0][0]];
    let past: Vec<_> = groups[0]
        .iter()
        .flat_map(|&i| &graphs[i].inputs)
        .filter(|t| matches!(t.role, IoRole::PastKey | IoRole::PastValue))
        .collect();
    let value = past
        .iter()
        .find(|t| t.role == IoRole::PastValue)
        .ok_or_else(|| bad(format!("graph `{}` has no past_value input", first.name)))?;
    let context = groups[0]
        .iter()
        .find_map(|&i| graphs[i].context())
        .ok_or_else(|| bad("mask has no shape".into()))?;
    let per_head = value.head.is_some();
    let layers = past
        .iter()
        .filter_map(|t| t.layer)
        .max()
        .map_or(0, |l| l + 1);
    let kv_heads = if per_head {
        past.iter()
            .filter_map(|t| t.head)
            .max()
            .map_or(0, |h| h + 1)
    } else {
        // `[heads, 1, rows, D]` (htpkv, AI Hub) or `[1, heads, rows, D]` (ExecuTorch).
        let lead = value.shape.len().saturating_sub(2);
        value.shape[..lead].iter().product()
    };
    let head_dim = value.shape.last().copied().unwrap_or(0);
    let dtype = value.dtype;
    if !dtype.is_real() {
        return Err(bad(format!(
            "past_value tensors must hold real values, not {dtype}"
        )));
    }
    let mut ar_variants = Vec::new();
    for group in &groups {
        let g = &graphs[group[0]];
        ar_variants.push(
            g.ar()
                .ok_or_else(|| bad(format!("graph `{}` has no input_ids", g.name)))?,
        );
    }
    let windows = windows_from_graphs(graphs, &groups, &ar_variants, context, layers)?;
    let k_layout = match past.iter().find(|t| t.role == IoRole::PastKey) {
        Some(k) => {
            let layer = k.layer.unwrap_or(0);
            let window = windows.get(layer).copied().flatten();
            let rows = window.map_or(context.saturating_sub(ar_variants[0]), |w| w - 1);
            if k.shape.len() == 4
                && k.shape[2] == head_dim
                && k.shape[3] == rows
                && rows != head_dim
            {
                KLayout::Transposed
            } else {
                KLayout::Rows
            }
        }
        None => KLayout::Rows,
    };
    let geometry = Geometry {
        layers,
        kv_heads,
        head_dim,
        context,
        ar_variants,
        dtype,
        k_layout,
        granularity: if per_head {
            Granularity::PerHead
        } else {
            Granularity::PerLayer
        },
        windows,
    };
    geometry.validate()?;
    let mut variants = Vec::new();
    for (group, &ar) in groups.iter().zip(&geometry.ar_variants) {
        let g = &graphs[group[0]];
        let mut past_enc = vec![None; geometry.buffers()];
        let mut new_enc = vec![None; geometry.buffers()];
        let tensors = |outputs: bool| -> Vec<&IoTensor> {
            group
                .iter()
                .flat_map(|&i| {
                    if outputs {
                        &graphs[i].outputs
                    } else {
                        &graphs[i].inputs
                    }
                })
                .collect()
        };
        for (list, target, roles) in [
            (
                tensors(false),
                &mut past_enc,
                [IoRole::PastKey, IoRole::PastValue],
            ),
            (
                tensors(true),
                &mut new_enc,
                [IoRole::NewKey, IoRole::NewValue],
            ),
        ] {
            for t in list.iter().filter(|t| roles.contains(&t.role)) {
                let kind = if t.role == roles[0] {
                    TensorKind::Key
                } else {
                    TensorKind::Value
                };
                let layer = t
                    .layer
                    .ok_or_else(|| bad(format!("tensor `{}` has no layer", t.name)))?;
                let spec = t
                    .quant
                    .clone()
                    .ok_or_else(|| bad(format!("tensor `{}` has no encoding", t.name)))?;
                let heads: Vec<usize> = match t.head {
                    Some(h) => vec![h],
                    None => (0..kv_heads).collect(),
                };
                for h in heads {
                    if layer >= layers || h >= kv_heads {
                        return Err(bad(format!(
                            "tensor `{}` names layer {layer} head {h} outside the model",
                            t.name
                        )));
                    }
                    target[geometry.buffer_index(layer, h, kind)] = Some(spec.clone());
                }
            }
        }
        let collect =
            |v: Vec<Option<QuantSpec>>, what: &str| -> Result<Vec<QuantSpec>, SessionError> {
                v.into_iter()
                    .enumerate()
                    .map(|(b, s)| {
                        s.ok_or_else(|| {
                            let (l, h, k) = geometry.buffer_coords(b);
                            bad(format!(
                                "graph `{}` has no {what} {k} tensor for layer {l} head {h}",
                                g.name
                            ))
                        })
                    })
                    .collect()
            };
        variants.push((ar, collect(past_enc, "past")?, collect(new_enc, "new")?));
    }
    let encodings = encodings_from_graphs(&geometry, &variants)?;
    let cross = cross::cross_spec_from_graphs(graphs, &geometry)?;
    Ok(CacheSpec {
        geometry,
        strategy,
        encodings,
        cross,
    })
}

/// The per-layer attention windows of the graph groups (one per AR variant `ar`, of context
/// `context`): empty when the graphs take no window mask. A graph that takes
/// `attention_mask_w{W}` ([`kv_manager::parse_mask_name`]) has sliding layers of window W, each
/// recognised by its past tensors holding `W - 1` rows in every AR variant (a global layer's hold
/// `S - n`; `kv_manager::Geometry::past_rows`).
fn windows_from_graphs(
    graphs: &[GraphDesc],
    groups: &[Vec<usize>],
    ar: &[usize],
    context: usize,
    layers: usize,
) -> Result<Vec<Option<usize>>, SessionError> {
    let bad = |m: String| SessionError::Graphs(m);
    let inputs = |group: &Vec<usize>| -> Vec<&IoTensor> {
        group.iter().flat_map(|&i| &graphs[i].inputs).collect()
    };
    let mut masks: Vec<usize> = inputs(&groups[0])
        .iter()
        .filter_map(|t| kv_manager::parse_mask_name(&t.name).flatten())
        .collect();
    masks.sort_unstable();
    masks.dedup();
    if masks.is_empty() {
        return Ok(Vec::new());
    }
    // Rows of `layer`'s past values in each variant (shape `[.., rows, D]`).
    let rows = |layer: usize| -> Vec<Option<usize>> {
        groups
            .iter()
            .map(|g| {
                inputs(g)
                    .into_iter()
                    .find(|t| t.role == IoRole::PastValue && t.layer == Some(layer))
                    .and_then(|t| t.shape.len().checked_sub(2).map(|i| t.shape[i]))
            })
            .collect()
    };
    let fits = |rows: &[Option<usize>], want: &dyn Fn(usize) -> usize| {
        rows.iter().zip(ar).all(|(r, &n)| *r == Some(want(n)))
    };
    (0..layers)
        .map(|layer| {
            let rows = rows(layer);
            let global = fits(&rows, &|n| context.saturating_sub(n));
            let sliding: Vec<usize> = (masks.iter().copied())
                .filter(|&w| fits(&rows, &|_| w - 1))
                .collect();
            match (global, sliding.as_slice()) {
                (false, [w]) => Ok(Some(*w)),
                (true, []) => Ok(None),
                (true, [w, ..]) => Err(bad(format!(
                    "layer {layer}'s past tensors hold S - n = {w} - 1 rows in every AR variant: \
                     it could be global or slide with window {w} (add an AR variant to tell)"
                ))),
                _ => Err(bad(format!(
                    "layer {layer}'s past tensors hold {rows:?} rows in the AR variants {ar:?}: \
                     neither S - n (a global layer, context {context}) nor W - 1 for a window mask \
                     of the graphs ({masks:?})"
                ))),
            }
        })
        .collect()
}

/// A model loaded on a backend with its KV cache: the step engine under `generate`.
#[derive(Debug)]
pub struct Session<B: Backend> {
    backend: B,
    cache: KvCache,
    slots: Vec<GraphSlot>,
    vocab: usize,
    ids: Vec<u8>,
    positions: Vec<u8>,
    /// Runtime-made inputs of the part being run (mask, RoPE tables), one buffer per input.
    made: Vec<Vec<u8>>,
    /// Hidden states between the parts of a split model, one per boundary.
    hidden: Vec<Vec<u8>>,
    /// Quantized logits as a graph wrote them, before decoding.
    logits_raw: Vec<u8>,
    logits: Vec<f32>,
    last_logits: Vec<f32>,
    /// The token ids in the cache, in order.
    tokens: Vec<u32>,
    stats: SessionStats,
    overflow: Overflow,
    rope: Option<overflow::RopeShift>,
    slides: Vec<SlideEvent>,
    /// After slides that kept positions: the fewest tokens kept (a rollback to this length or less
    /// leaves only tokens at their own index, so positions restart there).
    keep_floor: Option<usize>,
    /// The context lengths the session may move its cache to.
    tiers: Tiers,
    /// Tokens of the step [`Session::verify`] ran and not yet accepted.
    verified: Vec<u32>,
}

/// The cache-buffer index of a K/V tensor.
fn kv_index(geometry: &Geometry, t: &IoTensor, kind: TensorKind) -> Result<usize, SessionError> {
    let layer = t.layer.unwrap_or(0);
    Ok(match (geometry.granularity, t.head) {
        (Granularity::PerHead, Some(h)) => geometry.buffer_index(layer, h, kind),
        (Granularity::PerLayer, None) => KvTensor {
            io: KvIo::Past,
            kind,
            layer,
            head: None,
        }
        .position(geometry.kv_heads),
        _ => {
            return Err(SessionError::Graphs(format!(
                "tensor `{}` mixes per-head and per-layer K/V tensors",
                t.name
            )));
        }
    })
}

/// How the session fills one graph input.
fn feed_of(
    g: &GraphDesc,
    t: &IoTensor,
    geometry: &Geometry,
    rope: Option<&RopeConfig>,
    boundary: Option<(usize, usize)>,
) -> Result<Feed, SessionError> {
    let bad = |m: String| SessionError::Graphs(m);
    let spec = || {
        t.quant
            .clone()
            .ok_or_else(|| bad(format!("`{}` has no encoding", t.name)))
    };
    // A sliding window's mask is bound by its name, whatever role a convention gave it.
    if let Some(window @ Some(_)) = kv_manager::parse_mask_name(&t.name) {
        return Ok(Feed::Mask(spec()?, g.mask, window));
    }
    Ok(match t.role {
        IoRole::InputIds => Feed::InputIds,
        IoRole::Positions => Feed::Positions,
        IoRole::Mask => Feed::Mask(spec()?, g.mask, None),
        IoRole::RopeCos | IoRole::RopeSin => {
            let cfg = rope.ok_or_else(|| {
                bad(format!(
                    "graph `{}` takes RoPE tables: the RoPE theta and scaling must be given \
                     (genie_config.json `positional-encoding`)",
                    g.name
                ))
            })?;
            let width = *t.shape.last().unwrap_or(&0);
            if width == 0 {
                return Err(bad(format!("RoPE table `{}` has no width", t.name)));
            }
            Feed::Rope {
                spec: spec()?,
                rope: Rope::new(2 * width, cfg),
                sin: t.role == IoRole::RopeSin,
            }
        }
        IoRole::HiddenIn => match boundary {
            Some((b, bytes)) if bytes == t.byte_size() => Feed::Hidden(b, bytes),
            Some((_, bytes)) => {
                return Err(bad(format!(
                    "graph `{}` takes a hidden state `{}` of {} bytes but the part before it \
                     gives {bytes}",
                    g.name,
                    t.name,
                    t.byte_size()
                )));
            }
            None => {
                return Err(bad(format!(
                    "`{}` of graph `{}` names no role, and the part before it gives no hidden \
                     state",
                    t.name, g.name
                )));
            }
        },
        IoRole::PastKey => Feed::Past(kv_index(geometry, t, TensorKind::Key)?),
        IoRole::PastValue => Feed::Past(kv_index(geometry, t, TensorKind::Value)?),
        IoRole::CrossKey => Feed::Cross(cross::cross_index(geometry, t, TensorKind::Key)?),
        IoRole::CrossValue => Feed::Cross(cross::cross_index(geometry, t, TensorKind::Value)?),
        IoRole::Embeddings => {
            return Err(bad(format!(
                "graph `{}` takes embeddings (`{}`): the embedding lookup outside the graph is not \
                 supported; use binaries that take token ids",
                g.name, t.name
            )));
        }
        other => {
            return Err(bad(format!("input `{}` has output role {other:?}", t.name)));
        }
    })
}

impl<B: Backend> Session<B> {
    /// Builds the cache from the backend's graph descriptions (never from anything else) with
    /// `strategy`, allocates its region with `allocator` and attaches it to the backend.
    pub fn new(
        backend: B,
        strategy: Strategy,
        allocator: &dyn RegionAllocator,
    ) -> Result<Self, SessionError> {
        Session::with_rope(backend, strategy, allocator, None)
    }

    /// As [`Session::new`], for graphs that may take RoPE cos/sin tables, which the session
    /// computes from `rope` (theta and scaling; the width comes from each table tensor).
    /// With graphs of several context lengths, the session uses the largest
    /// ([`Session::with_contexts`] starts on the smallest and moves up).
    pub fn with_rope(
        backend: B,
        strategy: Strategy,
        allocator: &dyn RegionAllocator,
        rope: Option<RopeConfig>,
    ) -> Result<Self, SessionError> {
        let context = contexts::largest(backend.graphs())?;
        Session::build(
            backend,
            strategy,
            allocator,
            context,
            Tiers::fixed(context, rope),
        )
    }

    /// The session on the graphs of context length `context`.
    fn build(
        mut backend: B,
        strategy: Strategy,
        allocator: &dyn RegionAllocator,
        context: usize,
        tiers: Tiers,
    ) -> Result<Self, SessionError> {
        let spec = cache_spec_for_context(backend.graphs(), strategy, context)?;
        let cache = KvCache::new(spec, allocator)?;
        let slots = Self::slots_for(backend.graphs(), &cache, tiers.rope.as_ref())?;
        let region = cache.region();
        backend.attach_region(region.as_ptr(), region.len(), region.fd())?;
        Ok(Session {
            backend,
            cache,
            vocab: slots.vocab,
            slots: slots.slots,
            ids: Vec::new(),
            positions: Vec::new(),
            made: Vec::new(),
            hidden: slots.hidden.into_iter().map(|n| vec![0; n]).collect(),
            logits_raw: Vec::new(),
            logits: Vec::new(),
            last_logits: Vec::new(),
            tokens: Vec::new(),
            stats: SessionStats::default(),
            overflow: Overflow::Stop,
            rope: None,
            slides: Vec::new(),
            keep_floor: None,
            tiers,
            verified: Vec::new(),
        })
    }

    /// How the session binds every graph of `cache`'s context length.
    fn slots_for(
        graphs: &[GraphDesc],
        cache: &KvCache,
        rope: Option<&RopeConfig>,
    ) -> Result<Slots, SessionError> {
        let geometry = &cache.spec().geometry;
        let mut sizes = SlotSizes::default();
        let mut slots = Vec::new();
        let groups = variant_groups(graphs, geometry.context)?;
        for (group, &ar) in groups.iter().zip(&geometry.ar_variants) {
            let mut parts = Vec::new();
            // The boundary the previous part wrote, with its byte size.
            let mut into: Option<(usize, usize)> = None;
            for (p, &index) in group.iter().enumerate() {
                // Part p writes boundary p (when a part follows).
                let out_of = (p + 1 < group.len()).then_some(p);
                let bind = Binding {
                    geometry,
                    rope,
                    into,
                    out_of,
                };
                let (part, wrote) = part_slot(graphs, index, &bind, &mut sizes)?;
                parts.push(part);
                into = wrote;
            }
            slots.push(GraphSlot {
                ar,
                parts,
                last: None,
            });
        }
        for (ar, index) in last_row_graphs(graphs, geometry.context)? {
            let bind = Binding {
                geometry,
                rope,
                into: None,
                out_of: None,
            };
            let (part, _) = part_slot(graphs, index, &bind, &mut sizes)?;
            let slot = slots.iter_mut().find(|s| s.ar == ar).ok_or_else(|| {
                SessionError::Graphs(format!(
                    "graph `{}` returns the last row of AR-{ar} steps, and no graph returns \
                     every row of them",
                    graphs[index].name
                ))
            })?;
            slot.last = Some(part);
        }
        if sizes.vocab == 0 {
            return Err(SessionError::Graphs("no graph has a logits output".into()));
        }
        Ok(Slots {
            slots,
            vocab: sizes.vocab,
            hidden: sizes.hidden,
        })
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Turns the KV saturation count of the cache on or off (off by default: a commit then reads
    /// no code; see [`KvCache::set_saturation_counting`]). It stays on across context tiers.
    pub fn set_kv_saturation_counting(&mut self, on: bool) {
        self.cache.set_saturation_counting(on);
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Vocabulary size (the logits' last dimension).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Tokens in the cache.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// True when the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Tokens the cache can hold (in the largest context length the session may move to).
    pub fn capacity(&self) -> usize {
        self.tiers
            .capacity
            .unwrap_or_else(|| self.cache.spec().geometry.capacity())
    }

    /// Timing and KV counters so far.
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            kv: *self.cache.counters(),
            slides: self.slides.len(),
            slide_seconds: self.slides.iter().map(|s| s.seconds).sum(),
            ..self.stats
        }
    }

    /// Logits of the last token run (empty before the first step).
    pub fn last_logits(&self) -> &[f32] {
        &self.last_logits
    }

    /// The token ids in the cache, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The cache, the cached token ids and the last logits, for restoring a saved session.
    pub(crate) fn state_mut(&mut self) -> (&mut KvCache, &mut Vec<u32>, &mut Vec<f32>) {
        (&mut self.cache, &mut self.tokens, &mut self.last_logits)
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
        self.cache.reset();
        self.tokens.clear();
        self.last_logits.clear();
        self.keep_floor = None;
    }

    /// Truncates the cache to `len` tokens (the logits of the last token are then unknown).
    pub fn rollback(&mut self, len: usize) -> Result<(), SessionError> {
        self.cache.rollback(len)?;
        self.tokens.truncate(len);
        self.last_logits.clear();
        if self.keep_floor.is_some_and(|k| len <= k) {
            self.cache.set_position_offset(0);
            self.keep_floor = None;
        }
        Ok(())
    }

    /// Runs `tokens` (1..=n) through the AR-n graphs of `slot` (every part in order, the hidden
    /// state passed between them) and commits them; keeps the logits of every token in
    /// `self.logits` (`[n, vocab]`), or with `rows` [`LogitRows::Last`] (and `n` tokens) those of
    /// the last one (`[1, vocab]`) when the variant has a last-row graph.
    fn run_step(
        &mut self,
        slot: usize,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<(), SessionError> {
        self.check_step(slot, tokens)?;
        let ar = self.slots[slot].ar;
        let rows = if tokens.len() == ar {
            rows
        } else {
            LogitRows::All
        };
        self.cache.plan(ar)?;
        let written = self.execute_rows(slot, rows, tokens, None)?;
        self.cache.commit(tokens.len())?;
        self.tokens.extend_from_slice(tokens);
        // The last token's row: the last row written, less the padding after the tokens.
        let last = written - 1 - (ar - tokens.len());
        self.last_logits.clear();
        self.last_logits
            .extend_from_slice(&self.logits[last * self.vocab..(last + 1) * self.vocab]);
        Ok(())
    }

    /// Refuses a step of `tokens` on the graphs of `slot` before anything is planned.
    fn check_step(&self, slot: usize, tokens: &[u32]) -> Result<(), SessionError> {
        let ar = self.slots[slot].ar;
        if tokens.is_empty() || tokens.len() > ar {
            return Err(SessionError::Input(format!(
                "AR-{ar} step given {} tokens",
                tokens.len()
            )));
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(SessionError::Token {
                token,
                vocab: self.vocab,
            });
        }
        Ok(())
    }

    /// Runs `tokens` through the graphs of `slot` on the planned step (the cache's pending plan, or
    /// `plan` when given: a beam step's); keeps the logits of every query row in `self.logits`
    /// (`[n, vocab]`). Commits nothing.
    fn execute(
        &mut self,
        slot: usize,
        tokens: &[u32],
        plan: Option<&kv_manager::Plan>,
    ) -> Result<(), SessionError> {
        self.execute_rows(slot, LogitRows::All, tokens, plan)
            .map(|_| ())
    }

    /// [`Session::execute`] on the graphs of `slot` returning the logits of `rows` (every row
    /// when the variant has no last-row graph); returns the rows `self.logits` then holds (the
    /// step's last ones).
    fn execute_rows(
        &mut self,
        slot: usize,
        rows: LogitRows,
        tokens: &[u32],
        plan: Option<&kv_manager::Plan>,
    ) -> Result<usize, SessionError> {
        let ar = self.slots[slot].ar;
        let plan = match plan {
            Some(p) => p,
            None => self.cache.pending_plan().expect("planned"),
        };
        self.ids.clear();
        for i in 0..ar {
            let id = tokens.get(i).copied().unwrap_or(0) as i32;
            self.ids.extend_from_slice(&id.to_le_bytes());
        }
        self.positions.clear();
        for p in &plan.positions {
            self.positions.extend_from_slice(&p.to_le_bytes());
        }
        let (parts, logit_rows) = self.slots[slot].graphs(rows);
        self.logits.resize(logit_rows * self.vocab, 0.0);
        let base = self.cache.region().as_ptr();
        for part in parts {
            // Runtime-made inputs first (each feed its own buffer), then the bindings.
            self.made.resize_with(part.feeds.len(), Vec::new);
            for (feed, buf) in part.feeds.iter().zip(&mut self.made) {
                match feed {
                    Feed::Mask(spec, encoding, window) => {
                        let mask = plan.mask_for(*window).ok_or_else(|| {
                            SessionError::Graphs(format!(
                                "the plan has no mask for window {window:?}"
                            ))
                        })?;
                        buf.resize(mask.len() * spec.dtype.size_bytes(), 0);
                        match encoding {
                            MaskEncoding::Additive => {
                                plan.mask_quantized_for(*window, spec, buf)?;
                            }
                            MaskEncoding::AttendMax => {
                                convention::attend_max_mask(mask, spec.dtype, buf)
                                    .map_err(SessionError::Encode)?;
                            }
                        }
                    }
                    Feed::Rope { spec, rope, sin } => {
                        convention::rope_table(rope, &plan.positions, *sin, spec, buf)
                            .map_err(SessionError::Encode)?;
                    }
                    _ => {}
                }
            }
            let mut inputs = Vec::with_capacity(part.feeds.len());
            for (feed, made) in part.feeds.iter().zip(&self.made) {
                inputs.push(match feed {
                    Feed::InputIds => InputBuffer {
                        ptr: self.ids.as_ptr(),
                        len: self.ids.len(),
                    },
                    Feed::Positions => InputBuffer {
                        ptr: self.positions.as_ptr(),
                        len: self.positions.len(),
                    },
                    Feed::Mask(..) | Feed::Rope { .. } => InputBuffer {
                        ptr: made.as_ptr(),
                        len: made.len(),
                    },
                    Feed::Hidden(b, len) => InputBuffer {
                        ptr: self.hidden[*b].as_ptr(),
                        len: *len,
                    },
                    Feed::Cross(t) => {
                        let b = plan.cross[*t];
                        // SAFETY: the plan's bindings lie inside the region (kv_manager's contract).
                        let ptr = unsafe { base.add(b.offset) };
                        InputBuffer { ptr, len: b.bytes }
                    }
                    Feed::Past(t) => {
                        let b = plan.past(*t);
                        // SAFETY: the plan's bindings lie inside the region (kv_manager's contract).
                        let ptr = unsafe { base.add(b.offset) };
                        InputBuffer { ptr, len: b.bytes }
                    }
                });
            }
            let mut outputs = Vec::with_capacity(part.sinks.len());
            for sink in &part.sinks {
                outputs.push(match sink {
                    Sink::Logits(None) => OutputBuffer {
                        ptr: self.logits.as_mut_ptr().cast(),
                        len: self.logits.len() * 4,
                    },
                    Sink::Logits(Some(spec)) => {
                        self.logits_raw
                            .resize(self.logits.len() * spec.dtype.size_bytes(), 0);
                        OutputBuffer {
                            ptr: self.logits_raw.as_mut_ptr(),
                            len: self.logits_raw.len(),
                        }
                    }
                    Sink::Hidden(b, len) => OutputBuffer {
                        ptr: self.hidden[*b].as_mut_ptr(),
                        len: *len,
                    },
                    Sink::New(t) => {
                        let b = plan.new_output(*t);
                        // SAFETY: the plan's bindings lie inside the region (kv_manager's contract).
                        let ptr = unsafe { base.add(b.offset) };
                        OutputBuffer { ptr, len: b.bytes }
                    }
                });
            }
            // SAFETY: ids/positions/made/hidden/logits are live Vecs of at least the given lengths
            // (hidden buffers are sized for the largest graph at construction, and a part reads
            // the boundary before it and writes the one after it, never the same); past and new
            // bindings come from the cache's plan, which guarantees they lie in the region and that
            // no new binding overlaps another or a visible past row (property-tested in
            // kv_manager); the region outlives the call.
            unsafe { self.backend.execute(part.index, &inputs, &outputs)? };
            if let Some(Sink::Logits(Some(spec))) =
                part.sinks.iter().find(|s| matches!(s, Sink::Logits(_)))
            {
                quant::decode_bytes_to_f32(&self.logits_raw, spec, &mut self.logits)
                    .map_err(SessionError::Encode)?;
            }
        }
        Ok(logit_rows)
    }

    fn slot_for(&self, ar: usize) -> usize {
        self.slots
            .iter()
            .position(|s| s.ar == ar)
            .expect("variant exists")
    }

    /// Runs prompt tokens through the cache: chunks of the largest AR variant (the last chunk padded
    /// and masked), then the smallest variant for what no longer fits. Returns the last token's logits.
    ///
    /// Only the last token's logits are consumed, so a chunk that fills its step runs the
    /// variant's last-row graph when the model has one ([`LogitRows::Last`]: no classifier work
    /// for the other rows); a padded chunk, whose last token is not its last row, returns every
    /// row.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Input(
                "prefill needs at least one token".into(),
            ));
        }
        let started = Instant::now();
        self.grow_for(tokens.len())?;
        let geometry = &self.cache.spec().geometry;
        let (big, small, capacity) = (geometry.max_ar(), geometry.min_ar(), geometry.capacity());
        let mut rest = tokens;
        while !rest.is_empty() {
            self.make_room(rest.len().min(big))?;
            let len = self.cache.len();
            let use_big = big > small && rest.len() > small && len + big <= capacity;
            let ar = if use_big { big } else { small };
            let take = rest.len().min(ar);
            self.run_step(self.slot_for(ar), &rest[..take], LogitRows::Last)?;
            rest = &rest[take..];
        }
        self.stats.prefill_tokens += tokens.len();
        self.stats.prefill_seconds += started.elapsed().as_secs_f64();
        Ok(&self.last_logits)
    }

    /// Runs one token through the smallest variant (AR-1 for decode), after making room by the
    /// overflow policy when the context is full. Returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<&[f32], SessionError> {
        let started = Instant::now();
        let small = self.cache.spec().geometry.min_ar();
        self.make_room(small)?;
        self.run_step(self.slot_for(small), &[token], LogitRows::All)?;
        self.stats.decode_tokens += 1;
        self.stats.decode_seconds += started.elapsed().as_secs_f64();
        Ok(&self.last_logits)
    }

    /// Makes the cache hold `tokens` and returns the last token's logits, reusing the longest prefix
    /// the cache already holds: it rolls back to the common prefix and prefills only the rest (at
    /// least the last token, whose logits are needed, unless the cache holds exactly `tokens` and
    /// their logits). The reused count is added to [`SessionStats::reused_tokens`]. Without slides in
    /// between, the logits are bit-identical to a cold prefill of `tokens`. A sliding-window layer
    /// holds only its window's rows, so a common prefix shorter than they reach back is not
    /// reusable: then everything is prefilled again.
    pub fn prefill_reusing(&mut self, tokens: &[u32]) -> Result<&[f32], SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Input(
                "prefill needs at least one token".into(),
            ));
        }
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if common == tokens.len() && common == self.tokens.len() && !self.last_logits.is_empty() {
            self.stats.reused_tokens += common;
            return Ok(&self.last_logits);
        }
        let mut keep = common.min(tokens.len() - 1);
        match self.rollback(keep) {
            // A sliding layer no longer holds the rows that length needs: no prefix is reusable.
            Err(SessionError::Kv(KvError::RollbackPastWindow { .. })) => {
                keep = 0;
                self.rollback(0)?;
            }
            other => other?,
        }
        self.stats.reused_tokens += keep;
        self.prefill(&tokens[keep..])
    }

    /// Samples a token from the last logits (the penalties look at the cached tokens).
    pub fn sample(&self, sampler: &mut Sampler) -> Result<u32, SessionError> {
        if self.last_logits.is_empty() {
            return Err(SessionError::Input(
                "no logits yet: prefill or decode first".into(),
            ));
        }
        Ok(sampler.sample_after(&self.last_logits, &self.tokens)?)
    }
}

/// Tokenizer operations generation needs (implemented for `model::llama2c::Tokenizer` here and for Hugging
/// Face tokenizers in [`crate::text`]).
pub trait TextCodec {
    /// Token ids of `text`, with BOS first when `bos`.
    fn encode(&self, text: &str, bos: bool) -> Vec<u32>;
    /// Bytes of `token` following `prev`.
    fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8>;
    /// The most bytes of text one token stands for, when the tokenizer has such a bound: every
    /// text reaching the tokenizer is first checked against it ([`check_text_fits`]), so a text
    /// that cannot fit is refused before it is tokenized. `None` (no bound) is always correct.
    fn bytes_per_token(&self) -> Option<usize> {
        None
    }
    /// True when sampling `token` ends the generation (the model's end of text or of a turn).
    /// The default suits llama2.c models: EOS, and BOS (a story model starts the next story).
    fn is_stop(&self, token: u32) -> bool {
        token == EOS || token == BOS
    }
    /// How many token ids the tokenizer has (ids are `0..vocab_size`), when it can list them:
    /// constrained decoding (`htpkv_structured`) needs it, with [`TextCodec::token_bytes`].
    /// `None` (the default) means the codec cannot be constrained.
    fn vocab_size(&self) -> Option<usize> {
        None
    }
    /// The bytes `token` adds to the text after an ordinary token: what a grammar matches it
    /// against. Special tokens (BOS, EOS, `<|im_end|>`, ...) are spelled `\xFF` then their name,
    /// llguidance's convention, so that no text can match them. The default is
    /// [`TextCodec::decode_piece`] after token 0.
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        self.decode_piece(0, token)
    }
}

/// The first byte of a special token's [`TextCodec::token_bytes`]: never valid in UTF-8 text.
pub const SPECIAL_TOKEN_MARKER: u8 = 0xFF;

impl TextCodec for model::llama2c::Tokenizer {
    fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        model::llama2c::Tokenizer::encode(self, text, bos, false)
    }
    fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8> {
        model::llama2c::Tokenizer::decode_piece(self, prev, token)
    }
    fn bytes_per_token(&self) -> Option<usize> {
        model::llama2c::Tokenizer::max_piece_bytes(self)
    }
    fn vocab_size(&self) -> Option<usize> {
        Some(model::llama2c::Tokenizer::vocab_size(self))
    }
    /// `<unk>`, BOS and EOS (ids 0 to 2) are special; every other piece is its bytes (with its
    /// leading space, `<0xNN>` as the byte).
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        const NAMES: [&str; 3] = ["<unk>", "<s>", "</s>"];
        match NAMES.get(token as usize) {
            Some(name) => special_bytes(name),
            None => model::llama2c::Tokenizer::decode_piece(self, 0, token),
        }
    }
}

/// A special token's [`TextCodec::token_bytes`]: [`SPECIAL_TOKEN_MARKER`] then `name`.
pub fn special_bytes(name: &str) -> Vec<u8> {
    let mut out = vec![SPECIAL_TOKEN_MARKER];
    out.extend_from_slice(name.as_bytes());
    out
}

/// A lower bound on the number of tokens of `text` (without BOS) from the codec's
/// [`TextCodec::bytes_per_token`]; 0 without one.
pub fn min_tokens(codec: &dyn TextCodec, text: &str) -> usize {
    codec
        .bytes_per_token()
        .map_or(0, |b| text.len().div_ceil(b.max(1)))
}

/// The longest text, in bytes, that may encode to at most `tokens` tokens (the inverse of
/// [`min_tokens`]): the output cap of a chat template rendering for `tokens` tokens of room.
pub fn max_text_bytes(codec: &dyn TextCodec, tokens: usize) -> usize {
    codec
        .bytes_per_token()
        .map_or(usize::MAX, |b| tokens.saturating_mul(b.max(1)))
}

/// The check every text passes before it reaches the tokenizer (a prompt, each chat turn, a
/// rendered conversation): refused when its byte length shows that it needs more than `room`
/// tokens (plus BOS when `bos`), so a text of megabytes is never tokenized whole.
pub fn check_text_fits(
    codec: &dyn TextCodec,
    text: &str,
    room: usize,
    bos: bool,
) -> Result<(), SessionError> {
    let at_least = min_tokens(codec, text) + usize::from(bos && !text.is_empty());
    if at_least > room {
        return Err(SessionError::PromptTooLong {
            prompt: at_least,
            room,
            at_least: true,
        });
    }
    Ok(())
}

/// BOS and EOS ids of llama2.c tokenizers.
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;

impl<B: Backend> Session<B> {
    /// Tokenizes `text` (with BOS when the cache is empty) if it fits in what is left of the
    /// context; a text that cannot fit is refused before tokenizing when its byte length shows it.
    pub fn encode_fitting(
        &self,
        codec: &dyn TextCodec,
        text: &str,
    ) -> Result<Vec<u32>, SessionError> {
        let bos = self.cache.is_empty();
        let room = self.prompt_room();
        check_text_fits(codec, text, room, bos)?;
        let tokens = codec.encode(text, bos);
        if tokens.len() > room {
            return Err(SessionError::PromptTooLong {
                prompt: tokens.len(),
                room,
                at_least: false,
            });
        }
        Ok(tokens)
    }
}
