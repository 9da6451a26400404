//! Errors of the KV manager.

use crate::TensorKind;

/// Everything the KV manager can refuse, with the facts needed to fix it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    /// A geometry field is out of range.
    #[error("invalid geometry: `{field}` {reason}")]
    InvalidGeometry { field: &'static str, reason: String },
    /// The strategy cannot serve this geometry (e.g. `shift` with `per_layer` tensors).
    #[error("strategy `{strategy}` cannot serve this cache: {reason}")]
    UnsupportedCombination {
        strategy: &'static str,
        reason: String,
    },
    /// The `shift` reservation is too small to rebase into.
    #[error(
        "shift reservation of {reserve} rows per buffer is too small: it needs at least {minimum} rows \
         (largest window S - min(ar) = {max_window} plus the largest AR variant {max_ar})"
    )]
    ReserveTooSmall {
        reserve: usize,
        minimum: usize,
        max_window: usize,
        max_ar: usize,
    },
    /// The number of buffer encodings differs from the number of buffers.
    #[error("expected one encoding per (layer, kv-head, K|V) buffer: {expected}, got {found}")]
    EncodingCount { expected: usize, found: usize },
    /// A buffer's encoding does not match the cache's element type.
    #[error(
        "encoding of layer {layer} head {head} {kind} has data type {found}, but the cache stores {expected}"
    )]
    EncodingDataType {
        layer: usize,
        head: usize,
        kind: TensorKind,
        expected: quant::DataType,
        found: quant::DataType,
    },
    /// The past input and the new output of one buffer are encoded differently: appending would need a
    /// requantization, which the manager never does.
    #[error(
        "AR-{ar} graph: past and new {kind} of layer {layer} head {head} have different encodings \
         ({past} vs {new}); past and new K/V must share one encoding so appending is a byte copy"
    )]
    EncodingMismatch {
        ar: usize,
        layer: usize,
        head: usize,
        kind: TensorKind,
        past: String,
        new: String,
    },
    /// A step was planned for an AR variant the cache was not built for.
    #[error("AR-{ar} is not one of this cache's graph variants {variants:?}")]
    UnknownVariant { ar: usize, variants: Vec<usize> },
    /// The context is full: the step would exceed the cache's capacity.
    #[error(
        "context full: {len} tokens cached + AR-{ar} step exceeds the capacity of {capacity} tokens \
         (context {context} minus the smallest AR variant)"
    )]
    ContextFull {
        len: usize,
        ar: usize,
        capacity: usize,
        context: usize,
    },
    /// `commit` without a planned step, or with more tokens than the step computed.
    #[error("cannot commit {requested} tokens: {reason}")]
    InvalidCommit { requested: usize, reason: String },
    /// `rollback` to a length longer than what is cached.
    #[error("cannot roll back to {requested} tokens: only {len} are cached")]
    InvalidRollback { requested: usize, len: usize },
    /// `rollback` to a length whose window needs rows a sliding layer no longer holds.
    #[error(
        "cannot roll back to {requested} tokens: layer {layer} (window {window}) holds only tokens \
         {first_held} on, so the shortest length it can return to is {shortest}"
    )]
    RollbackPastWindow {
        requested: usize,
        layer: usize,
        window: usize,
        first_held: usize,
        shortest: usize,
    },
    /// A size, count or offset does not fit in `usize` (see [`crate::Size`]).
    /// An eviction outside the cached tokens.
    #[error(
        "cannot evict {drop} tokens after the first {keep}: layer {layer} (window {window}) would \
         show token {needed}, but it holds only tokens {first_held} on"
    )]
    EvictionPastWindow {
        keep: usize,
        drop: usize,
        layer: usize,
        window: usize,
        needed: usize,
        first_held: usize,
    },
    #[error("cannot evict {drop} tokens after the first {keep}: only {len} are cached")]
    InvalidEviction {
        keep: usize,
        drop: usize,
        len: usize,
    },
    /// Evictions that kept positions moved them past what the graphs' i32 positions hold.
    #[error(
        "position {position} does not fit the graphs' i32 positions (evictions kept positions; reset the cache)"
    )]
    PositionsExhausted { position: usize },
    /// K rows could not be requantized (e.g. a per-axis encoding).
    #[error("cannot requantize the K rows of layer {layer} head {head}: {reason}")]
    Requantize {
        layer: usize,
        head: usize,
        reason: String,
    },
    #[error("{what} overflow the {}-bit size type", usize::BITS)]
    SizeOverflow { what: &'static str },
    /// The `shift` reservation is larger than [`crate::MAX_RESERVE_ROWS`].
    #[error("shift reservation of {reserve} exceeds the limit of {maximum} rows per buffer")]
    ReserveTooLarge { reserve: String, maximum: usize },
    /// The allocator could not provide the region.
    #[error("could not allocate a region of {bytes} bytes (alignment {align}): {reason}")]
    Allocation {
        bytes: usize,
        align: usize,
        reason: String,
    },
    /// A mask encoding cannot represent the visible value 0.0 exactly.
    #[error("mask encoding {dtype} scale {scale} offset {offset}: {reason}")]
    MaskEncoding {
        dtype: quant::DataType,
        scale: f32,
        offset: i32,
        reason: &'static str,
    },
    /// An output buffer has the wrong size.
    #[error("{what}: expected {expected} bytes, got {found}")]
    BufferSize {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// A [`crate::CrossSpec`] does not fit the cache's geometry.
    #[error("invalid cross-attention spec: {reason}")]
    InvalidCross { reason: String },
    /// A cross tensor that the cache does not have, or filled twice in one request.
    #[error("cannot fill cross-attention tensor `{tensor}`: {reason}")]
    CrossTensor { tensor: String, reason: String },
    /// A cross fill whose bytes are not the tensor's size.
    #[error("cross-attention tensor `{tensor}` holds {expected} bytes, the fill has {found}")]
    CrossSize {
        tensor: String,
        expected: usize,
        found: usize,
    },
    /// A cross fill in another encoding than the buffer's (it would need a requantization).
    #[error(
        "cross-attention tensor `{tensor}` is encoded {expected}, the fill {found}: static K/V is copied, never requantized"
    )]
    CrossEncoding {
        tensor: String,
        expected: String,
        found: String,
    },
    /// A step planned before every cross tensor was filled for the request.
    #[error(
        "{missing} cross-attention tensor(s) not filled for this request (first: `{first}`): fill them from the encoder before the first step"
    )]
    CrossNotFilled { missing: usize, first: String },
    /// A snapshot does not fit the cache it is imported into.
    #[error("snapshot does not fit this cache: {what} is {snapshot}, the cache has {cache}")]
    SnapshotMismatch {
        what: &'static str,
        cache: String,
        snapshot: String,
    },
    /// A cache cannot be relaid out into a spec (see [`crate::KvCache::relayout_into`]).
    #[error("cannot move the cache to the new layout: {what} is {target} there, {current} here")]
    RelayoutMismatch {
        what: &'static str,
        current: String,
        target: String,
    },
    /// A run ([`crate::predict::Run`]) whose steps do not fit the cache.
    #[error(
        "a prefill of {prefill} tokens and {decode_steps} decode steps do not fit the cache: {reason}"
    )]
    RunTooLong {
        prefill: usize,
        decode_steps: usize,
        reason: String,
    },
}

impl KvError {
    /// The error's kind: `context_full` when the cache is full, `kv` otherwise.
    pub fn kind(&self) -> &'static str {
        match self {
            KvError::ContextFull { .. } => "context_full",
            _ => "kv",
        }
    }
}
