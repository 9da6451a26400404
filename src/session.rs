//! The runtime session: a compiled model on a backend, a KV cache built from the model's own tensor
//! descriptions, a tokenizer and a sampler.

use crate::backend::{Backend, BackendError, GraphDesc, InputBuffer, IoRole, OutputBuffer};
use crate::sampler::{Sampler, SamplerError, SamplerOptions};
use kv_manager::{
    CacheSpec, Counters, Geometry, Granularity, KLayout, KvCache, KvError, KvIo, KvTensor,
    RegionAllocator, Strategy, TensorKind, encodings_from_graphs,
};
use quant::QuantSpec;
use std::time::Instant;

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
    /// A token id outside the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    Token { token: u32, vocab: usize },
    /// Nothing to run, or a malformed request.
    #[error("{0}")]
    Input(String),
    /// The prompt does not fit in what is left of the context. With `at_least`, the prompt was
    /// refused before it was tokenized, from a lower bound on its token count
    /// ([`TextCodec::min_tokens`]).
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

/// Where the bytes of one graph input come from.
#[derive(Debug, Clone)]
enum Feed {
    InputIds,
    Positions,
    Mask(QuantSpec),
    Past(usize),
}

/// Where one graph output goes.
#[derive(Debug, Clone, Copy)]
enum Sink {
    Logits,
    New(usize),
}

#[derive(Debug, Clone)]
struct GraphSlot {
    index: usize,
    ar: usize,
    feeds: Vec<Feed>,
    sinks: Vec<Sink>,
}

/// Wall time and token counts of the session's work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionStats {
    pub prefill_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_tokens: usize,
    pub decode_seconds: f64,
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

/// Derives the cache geometry and per-buffer encodings from a model's graphs.
pub fn cache_spec_from_graphs(
    graphs: &[GraphDesc],
    strategy: Strategy,
) -> Result<CacheSpec, SessionError> {
    let bad = |m: String| SessionError::Graphs(m);
    let first = graphs
        .first()
        .ok_or_else(|| bad("the model has no graphs".into()))?;
    let past: Vec<_> = first
        .inputs
        .iter()
        .filter(|t| matches!(t.role, IoRole::PastKey | IoRole::PastValue))
        .collect();
    let value = past
        .iter()
        .find(|t| t.role == IoRole::PastValue)
        .ok_or_else(|| bad(format!("graph `{}` has no past_value input", first.name)))?;
    let mask = first
        .inputs
        .iter()
        .find(|t| t.role == IoRole::Mask)
        .ok_or_else(|| {
            bad(format!(
                "graph `{}` has no attention mask input",
                first.name
            ))
        })?;
    let context = *mask
        .shape
        .last()
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
        value.shape.first().copied().unwrap_or(0)
    };
    let head_dim = value.shape.last().copied().unwrap_or(0);
    let dtype = value.dtype;
    if !dtype.is_real() {
        return Err(bad(format!(
            "past_value tensors must hold real values, not {dtype}"
        )));
    }
    let mut ar_variants = Vec::new();
    for g in graphs {
        ar_variants.push(
            g.ar()
                .ok_or_else(|| bad(format!("graph `{}` has no input_ids", g.name)))?,
        );
    }
    let window = context.saturating_sub(ar_variants[0]);
    let k_layout = match past.iter().find(|t| t.role == IoRole::PastKey) {
        Some(k)
            if k.shape.len() == 4
                && k.shape[2] == head_dim
                && k.shape[3] == window
                && window != head_dim =>
        {
            KLayout::Transposed
        }
        _ => KLayout::Rows,
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
    };
    geometry.validate()?;
    let mut variants = Vec::new();
    for (g, &ar) in graphs.iter().zip(&geometry.ar_variants) {
        let mut past_enc = vec![None; geometry.buffers()];
        let mut new_enc = vec![None; geometry.buffers()];
        for (list, target, roles) in [
            (
                &g.inputs,
                &mut past_enc,
                [IoRole::PastKey, IoRole::PastValue],
            ),
            (&g.outputs, &mut new_enc, [IoRole::NewKey, IoRole::NewValue]),
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
    Ok(CacheSpec {
        geometry,
        strategy,
        encodings,
    })
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
    mask: Vec<u8>,
    logits: Vec<f32>,
    last_logits: Vec<f32>,
    /// The token ids in the cache, in order.
    tokens: Vec<u32>,
    stats: SessionStats,
}

impl<B: Backend> Session<B> {
    /// Builds the cache from the backend's graph descriptions (never from anything else) with
    /// `strategy`, allocates its region with `allocator` and attaches it to the backend.
    pub fn new(
        mut backend: B,
        strategy: Strategy,
        allocator: &dyn RegionAllocator,
    ) -> Result<Self, SessionError> {
        let spec = cache_spec_from_graphs(backend.graphs(), strategy)?;
        let cache = KvCache::new(spec, allocator)?;
        let geometry = cache.spec().geometry.clone();
        let mut slots = Vec::new();
        let mut vocab = 0;
        for (index, g) in backend.graphs().iter().enumerate() {
            let ar = geometry.ar_variants[index];
            let tensor_index =
                |t: &crate::backend::IoTensor, kind: TensorKind| -> Result<usize, SessionError> {
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
                };
            let mut feeds = Vec::new();
            for t in &g.inputs {
                feeds.push(match t.role {
                    IoRole::InputIds => Feed::InputIds,
                    IoRole::Positions => Feed::Positions,
                    IoRole::Mask => Feed::Mask(t.quant.clone().ok_or_else(|| {
                        SessionError::Graphs(format!("mask `{}` has no encoding", t.name))
                    })?),
                    IoRole::PastKey => Feed::Past(tensor_index(t, TensorKind::Key)?),
                    IoRole::PastValue => Feed::Past(tensor_index(t, TensorKind::Value)?),
                    other => {
                        return Err(SessionError::Graphs(format!(
                            "input `{}` has output role {other:?}",
                            t.name
                        )));
                    }
                });
            }
            let mut sinks = Vec::new();
            for t in &g.outputs {
                sinks.push(match t.role {
                    IoRole::Logits => {
                        vocab = *t.shape.last().unwrap_or(&0);
                        Sink::Logits
                    }
                    IoRole::NewKey => Sink::New(tensor_index(t, TensorKind::Key)?),
                    IoRole::NewValue => Sink::New(tensor_index(t, TensorKind::Value)?),
                    other => {
                        return Err(SessionError::Graphs(format!(
                            "output `{}` has input role {other:?}",
                            t.name
                        )));
                    }
                });
            }
            slots.push(GraphSlot {
                index,
                ar,
                feeds,
                sinks,
            });
        }
        if vocab == 0 {
            return Err(SessionError::Graphs("no graph has a logits output".into()));
        }
        let region = cache.region();
        backend.attach_region(region.as_ptr(), region.len(), region.fd())?;
        Ok(Session {
            backend,
            cache,
            slots,
            vocab,
            ids: Vec::new(),
            positions: Vec::new(),
            mask: Vec::new(),
            logits: Vec::new(),
            last_logits: Vec::new(),
            tokens: Vec::new(),
            stats: SessionStats::default(),
        })
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
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

    /// Tokens the cache can hold.
    pub fn capacity(&self) -> usize {
        self.cache.spec().geometry.capacity()
    }

    /// Timing and KV counters so far.
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            kv: *self.cache.counters(),
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
    }

    /// Truncates the cache to `len` tokens (the logits of the last token are then unknown).
    pub fn rollback(&mut self, len: usize) -> Result<(), SessionError> {
        self.cache.rollback(len)?;
        self.tokens.truncate(len);
        self.last_logits.clear();
        Ok(())
    }

    /// Runs `tokens` (1..=n) through the AR-n graph `slot` and commits them; keeps the logits of every
    /// token in `self.logits` (`[n, vocab]`).
    fn run_step(&mut self, slot: usize, tokens: &[u32]) -> Result<(), SessionError> {
        let GraphSlot { index, ar, .. } = self.slots[slot];
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
        self.cache.plan(ar)?;
        let plan = self.cache.pending_plan().expect("planned");
        self.ids.clear();
        for i in 0..ar {
            let id = tokens.get(i).copied().unwrap_or(0) as i32;
            self.ids.extend_from_slice(&id.to_le_bytes());
        }
        self.positions.clear();
        for p in &plan.positions {
            self.positions.extend_from_slice(&p.to_le_bytes());
        }
        self.logits.resize(ar * self.vocab, 0.0);
        let base = self.cache.region().as_ptr();
        let slot_ref = &self.slots[slot];
        let mut inputs = Vec::with_capacity(slot_ref.feeds.len());
        for feed in &slot_ref.feeds {
            inputs.push(match feed {
                Feed::InputIds => InputBuffer {
                    ptr: self.ids.as_ptr(),
                    len: self.ids.len(),
                },
                Feed::Positions => InputBuffer {
                    ptr: self.positions.as_ptr(),
                    len: self.positions.len(),
                },
                Feed::Mask(spec) => {
                    self.mask
                        .resize(plan.mask.len() * spec.dtype.size_bytes(), 0);
                    plan.mask_quantized(spec, &mut self.mask)?;
                    InputBuffer {
                        ptr: self.mask.as_ptr(),
                        len: self.mask.len(),
                    }
                }
                Feed::Past(t) => {
                    let b = plan.past(*t);
                    // SAFETY: the plan's bindings lie inside the region (kv_manager's contract).
                    let ptr = unsafe { base.add(b.offset) };
                    InputBuffer { ptr, len: b.bytes }
                }
            });
        }
        let mut outputs = Vec::with_capacity(slot_ref.sinks.len());
        for sink in &slot_ref.sinks {
            outputs.push(match sink {
                Sink::Logits => OutputBuffer {
                    ptr: self.logits.as_mut_ptr().cast(),
                    len: self.logits.len() * 4,
                },
                Sink::New(t) => {
                    let b = plan.new_output(*t);
                    // SAFETY: the plan's bindings lie inside the region (kv_manager's contract).
                    let ptr = unsafe { base.add(b.offset) };
                    OutputBuffer { ptr, len: b.bytes }
                }
            });
        }
        // SAFETY: ids/positions/mask/logits are live Vecs of the given lengths; past and new bindings come
        // from the cache's plan, which guarantees they lie in the region and that no new binding overlaps
        // another or a visible past row (property-tested in kv_manager); the region outlives the call.
        unsafe { self.backend.execute(index, &inputs, &outputs)? };
        self.cache.commit(tokens.len())?;
        self.tokens.extend_from_slice(tokens);
        let last = tokens.len() - 1;
        self.last_logits.clear();
        self.last_logits
            .extend_from_slice(&self.logits[last * self.vocab..(last + 1) * self.vocab]);
        Ok(())
    }

    fn slot_for(&self, ar: usize) -> usize {
        self.slots
            .iter()
            .position(|s| s.ar == ar)
            .expect("variant exists")
    }

    /// Runs prompt tokens through the cache: chunks of the largest AR variant (the last chunk padded
    /// and masked), then the smallest variant for what no longer fits. Returns the last token's logits.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Input(
                "prefill needs at least one token".into(),
            ));
        }
        let started = Instant::now();
        let geometry = &self.cache.spec().geometry;
        let (big, small, capacity) = (geometry.max_ar(), geometry.min_ar(), geometry.capacity());
        let mut rest = tokens;
        while !rest.is_empty() {
            let len = self.cache.len();
            let use_big = big > small && rest.len() > small && len + big <= capacity;
            let ar = if use_big { big } else { small };
            let take = rest.len().min(ar);
            self.run_step(self.slot_for(ar), &rest[..take])?;
            rest = &rest[take..];
        }
        self.stats.prefill_tokens += tokens.len();
        self.stats.prefill_seconds += started.elapsed().as_secs_f64();
        Ok(&self.last_logits)
    }

    /// Runs one token through the smallest variant (AR-1 for decode). Returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<&[f32], SessionError> {
        let started = Instant::now();
        let small = self.cache.spec().geometry.min_ar();
        self.run_step(self.slot_for(small), &[token])?;
        self.stats.decode_tokens += 1;
        self.stats.decode_seconds += started.elapsed().as_secs_f64();
        Ok(&self.last_logits)
    }

    /// Samples a token from the last logits.
    pub fn sample(&self, sampler: &mut Sampler) -> Result<u32, SessionError> {
        if self.last_logits.is_empty() {
            return Err(SessionError::Input(
                "no logits yet: prefill or decode first".into(),
            ));
        }
        Ok(sampler.sample(&self.last_logits)?)
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced EOS or BOS (end of a story).
    EndOfText,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The token callback asked to stop.
    Callback,
}

/// Options of one generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampler: SamplerOptions,
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
}

/// Turns byte pieces into valid UTF-8 text as they stream: incomplete sequences wait for their next
/// bytes, invalid bytes become U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("validated"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Tokenizer operations generation needs (implemented for `llama2c::Tokenizer` here and for Hugging
/// Face tokenizers in [`crate::text`]).
pub trait TextCodec {
    /// Token ids of `text`, with BOS first when `bos`.
    fn encode(&self, text: &str, bos: bool) -> Vec<u32>;
    /// Bytes of `token` following `prev`.
    fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8>;
    /// A lower bound on the number of tokens of `text` (without BOS), cheap to compute, so a
    /// prompt that cannot fit is refused before it is tokenized. 0 is always correct.
    fn min_tokens(&self, text: &str) -> usize {
        let _ = text;
        0
    }
    /// True when sampling `token` ends the generation (the model's end of text or of a turn).
    /// The default suits llama2.c models: EOS, and BOS (a story model starts the next story).
    fn is_stop(&self, token: u32) -> bool {
        token == EOS || token == BOS
    }
}

impl TextCodec for llama2c::Tokenizer {
    fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        llama2c::Tokenizer::encode(self, text, bos, false)
    }
    fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8> {
        llama2c::Tokenizer::decode_piece(self, prev, token)
    }
    fn min_tokens(&self, text: &str) -> usize {
        llama2c::Tokenizer::min_tokens(self, text)
    }
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
        let room = self.capacity().saturating_sub(self.cache.len());
        let at_least = codec.min_tokens(text) + usize::from(bos && !text.is_empty());
        if at_least > room {
            return Err(SessionError::PromptTooLong {
                prompt: at_least,
                room,
                at_least: true,
            });
        }
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

    /// Generates text after `prompt`. When the cache is empty the prompt starts with BOS; otherwise it
    /// continues the cached text, and an empty prompt continues from the last logits (e.g. of a
    /// restored session). Text streams to `on_text` in valid UTF-8 pieces; returning false stops.
    pub fn generate(
        &mut self,
        codec: &dyn TextCodec,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, SessionError> {
        let mut sampler = Sampler::new(options.sampler)?;
        let prompt_tokens = self.encode_fitting(codec, prompt)?;
        let continuing = prompt_tokens.is_empty() && !self.last_logits.is_empty();
        if prompt_tokens.is_empty() && !continuing {
            return Err(SessionError::Input(
                "the prompt encodes to no tokens".into(),
            ));
        }
        if !continuing {
            self.prefill(&prompt_tokens)?;
        }
        let mut prev = *self.tokens.last().unwrap_or(&BOS);
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut utf8 = Utf8Stream::default();
        let mut stop = StopReason::MaxTokens;
        while tokens.len() < options.max_tokens {
            let next = self.sample(&mut sampler)?;
            if codec.is_stop(next) {
                stop = StopReason::EndOfText;
                break;
            }
            tokens.push(next);
            let piece = utf8.push(&codec.decode_piece(prev, next));
            text.push_str(&piece);
            if !piece.is_empty() && !on_text(&piece) {
                stop = StopReason::Callback;
                break;
            }
            prev = next;
            if tokens.len() == options.max_tokens {
                break;
            }
            if self.cache.len() + 1 > self.capacity() {
                stop = StopReason::ContextFull;
                break;
            }
            self.decode(next)?;
        }
        let tail = utf8.finish();
        if !tail.is_empty() {
            text.push_str(&tail);
            on_text(&tail);
        }
        Ok(Generation {
            prompt_tokens,
            tokens,
            text,
            stop,
        })
    }
}
