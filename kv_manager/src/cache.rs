//! The cache: one region, one strategy, and the step protocol `plan` -> (graph runs) -> `commit`.

use crate::counters::HandleTracker;
use crate::geometry::Layout;
use crate::plan::TensorId;
use crate::{
    CacheSpec, Counters, Granularity, KLayout, KvError, KvIo, Plan, Region, RegionAllocator,
    StepStats, Strategy, TensorKind,
};
use quant::QuantSpec;

/// Per-strategy state.
#[derive(Debug, Clone)]
enum State {
    /// `shift`: R rows per buffer (the layout's); every buffer of a layer shares one window end
    /// `v1` (row index inside the buffer). Held rows are `[v1 - (len - first_held), v1)`.
    Shift { start: Vec<usize>, v1: Vec<usize> },
    /// `conveyor`: buffer b's window ends at row `base[b] + len`; rows never move.
    Conveyor,
    /// `smart_mask` / `naive`: fixed slots. `stride` is the window length the data is laid out for;
    /// `fixed` layouts (per_head, K rows) serve every variant from one layout (stride = W_max),
    /// strided ones (per_layer or transposed K) are relaid out when the variant's window changes.
    Slots { fixed: bool, stride: usize },
}

/// A location of one token's row: `start` byte, then `step` bytes between consecutive channels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowRef {
    pub(crate) start: usize,
    pub(crate) step: usize,
}

/// An application-managed KV cache for static-shape graphs.
///
/// Protocol for every step on the AR-n graph:
/// 1. [`KvCache::plan`] (may move data: rebases, relayouts) returns the IO binding plan;
/// 2. the graph runs, reading the past windows and writing n new rows into the new-row bindings;
/// 3. [`KvCache::commit`]`(k)`, `k <= n`, keeps the first k new tokens.
///
/// [`KvCache::rollback`] truncates to an earlier length and [`KvCache::reset`] empties the cache.
/// The cache holds at most S - min(ar) tokens ([`crate::Geometry::capacity`]; S - 1 with an AR-1 graph).
#[derive(Debug)]
pub struct KvCache {
    spec: CacheSpec,
    layout: Layout,
    region: Region,
    len: usize,
    state: State,
    plan: Plan,
    pending: Option<usize>,
    counters: Counters,
    step: StepStats,
    handles: HandleTracker,
    /// Added to every new token's position (grows when evictions keep positions).
    position_offset: usize,
    /// Per cross tensor (graph order): filled for the current request (see [`crate::static_kv`]).
    pub(crate) cross_filled: Vec<bool>,
    /// Per layer: the first token whose rows the layer still holds (0 for a global layer; a
    /// sliding layer keeps its last [`crate::Geometry::kept_rows`] tokens).
    first_held: Vec<usize>,
}

impl KvCache {
    /// Validates `spec` (every refusal names its reason) and allocates the region.
    pub fn new(spec: CacheSpec, allocator: &dyn RegionAllocator) -> Result<KvCache, KvError> {
        let layout = spec.layout()?;
        let region_bytes = spec.region_bytes()?;
        let region = Region::allocate(allocator, region_bytes)?;
        let g = &spec.geometry;
        let variants = g.ar_variants.len();
        let (state, handles) = match spec.strategy {
            Strategy::Shift { stagger, .. } => {
                // Stagger: spread the layers' starting offsets over the slack that the largest step
                // still fits in, so their rebases fall on different steps.
                let start: Vec<usize> = (0..g.layers)
                    .map(|l| {
                        let (r, anchor) = (layout.rows[l * 2 * g.kv_heads], shift_anchor(g, l));
                        let slack = r - anchor - g.max_ar();
                        if stagger {
                            anchor + l * slack / g.layers.max(1)
                        } else {
                            anchor
                        }
                    })
                    .collect();
                let r_max = layout.rows.iter().copied().max().unwrap_or(0);
                (
                    State::Shift {
                        v1: start.clone(),
                        start,
                    },
                    HandleTracker::new(g.layers, r_max + 1, variants),
                )
            }
            Strategy::Conveyor => (State::Conveyor, HandleTracker::new(1, g.context, variants)),
            Strategy::SmartMask | Strategy::Naive => {
                let fixed = g.granularity == Granularity::PerHead && g.k_layout == KLayout::Rows;
                (
                    State::Slots {
                        fixed,
                        stride: g.max_window(),
                    },
                    HandleTracker::new(1, 1, variants),
                )
            }
        };
        let tensors = tensor_ids(g.layers, g.kv_heads, g.granularity);
        let self_bytes = layout.region_rows * g.row_bytes(); // checked by `region_bytes`
        let cross = crate::static_kv::bindings(&spec, self_bytes)?;
        let cross_filled = vec![false; cross.len()];
        let plan = Plan {
            heads_per_tensor: heads_per_tensor(g.kv_heads, g.granularity),
            head_dim: g.head_dim,
            elem_bytes: g.dtype.size_bytes(),
            k_transposed: g.k_layout == KLayout::Transposed,
            context: g.context,
            left_padded: spec.strategy.left_padded(),
            windows: g.windows.clone(),
            past_offsets: Vec::with_capacity(tensors.len()),
            new_offsets: Vec::with_capacity(tensors.len()),
            tensors,
            cross,
            ..Plan::default()
        };
        let counters = Counters {
            region_bytes,
            ..Counters::default()
        };
        let first_held = vec![0; g.layers];
        Ok(KvCache {
            first_held,
            spec,
            layout,
            region,
            len: 0,
            state,
            plan,
            pending: None,
            counters,
            step: StepStats::default(),
            handles,
            position_offset: 0,
            cross_filled,
        })
    }

    /// The spec the cache was built from.
    pub fn spec(&self) -> &CacheSpec {
        &self.spec
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoding of a buffer (shared by its past input and new output).
    pub fn encoding(&self, buffer: usize) -> &QuantSpec {
        &self.spec.encodings[buffer]
    }

    /// The region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Totals since construction.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counters of the current (or last) step.
    pub fn last_step(&self) -> &StepStats {
        &self.step
    }

    /// The plan of the step in progress (planned and not yet committed), if any.
    pub fn pending_plan(&self) -> Option<&Plan> {
        self.pending.map(|_| &self.plan)
    }

    /// The plan state (its cross bindings are fixed at construction).
    pub(crate) fn plan_ref(&self) -> &Plan {
        &self.plan
    }

    /// The pending plan together with the region bytes, for running a graph on the host: the graph
    /// reads the past bindings and writes the new ones.
    pub fn pending_io(&mut self) -> Option<(&Plan, &mut [u8])> {
        self.pending?;
        Some((&self.plan, self.region.as_mut_slice()))
    }

    /// Plans a step on the AR-`ar` graph: moves data when the strategy must (rebase, relayout) and
    /// returns the binding plan. Planning again before committing discards the earlier plan.
    pub fn plan(&mut self, ar: usize) -> Result<&Plan, KvError> {
        let g = &self.spec.geometry;
        let variant =
            g.ar_variants
                .iter()
                .position(|&n| n == ar)
                .ok_or_else(|| KvError::UnknownVariant {
                    ar,
                    variants: g.ar_variants.clone(),
                })?;
        if self.len + ar > g.capacity() {
            return Err(KvError::ContextFull {
                len: self.len,
                ar,
                capacity: g.capacity(),
                context: g.context,
            });
        }
        let last_position = self.len + self.position_offset + ar;
        if last_position > i32::MAX as usize {
            return Err(KvError::PositionsExhausted {
                position: last_position,
            });
        }
        self.check_cross_ready()?;
        self.step = StepStats::default();
        self.counters.steps += 1;
        self.prepare(ar);
        self.fill_offsets(ar, variant);
        self.plan.ar = ar;
        self.plan.past_len = self.len;
        self.plan.first_position = self.len + self.position_offset;
        self.plan.fill_mask_and_positions();
        self.pending = Some(ar);
        Ok(&self.plan)
    }

    /// Keeps the first `accepted` new tokens of the planned step (`accepted <= n`; fewer for
    /// speculative decoding, 0 to drop the step).
    pub fn commit(&mut self, accepted: usize) -> Result<(), KvError> {
        let Some(ar) = self.pending else {
            return Err(KvError::InvalidCommit {
                requested: accepted,
                reason: "no step is planned".into(),
            });
        };
        if accepted > ar {
            return Err(KvError::InvalidCommit {
                requested: accepted,
                reason: format!("the planned AR-{ar} step computed only {ar} tokens"),
            });
        }
        self.pending = None;
        let strategy = self.spec.strategy;
        match &mut self.state {
            State::Shift { v1, .. } => v1.iter_mut().for_each(|v| *v += accepted),
            State::Conveyor => {}
            State::Slots { stride, fixed } => {
                let (mut stride, fixed) = (*stride, *fixed);
                let w_max = self.spec.geometry.max_window();
                if !fixed && self.len + accepted > stride {
                    // The tokens no longer fit the window this variant laid the data out for: go to
                    // the largest window, which holds the whole capacity.
                    self.relayout(w_max);
                    stride = w_max;
                }
                if accepted > 0 {
                    self.commit_slots(ar, accepted, stride, strategy == Strategy::Naive);
                }
            }
        }
        self.len += accepted;
        self.counters.tokens_committed += accepted;
        let g = &self.spec.geometry;
        if g.windows.is_empty() {
            return Ok(());
        }
        for (layer, first) in self.first_held.iter_mut().enumerate() {
            if let Some(kept) = g.kept_rows(layer) {
                *first = (*first).max(self.len.saturating_sub(kept));
            }
        }
        Ok(())
    }

    /// The first token whose rows `layer` still holds: 0 for a global layer, and for a sliding
    /// layer the oldest of its last [`crate::Geometry::kept_rows`] tokens since the last reset,
    /// import or eviction (a rollback does not bring older rows back).
    pub fn first_held(&self, layer: usize) -> usize {
        self.first_held.get(layer).copied().unwrap_or(0)
    }

    /// The tokens `layer`'s past tensors show at length `len`: all of them for a global layer,
    /// the last `W - 1` for a sliding layer of window W.
    pub fn window_tokens(&self, layer: usize, len: usize) -> std::ops::Range<usize> {
        let g = &self.spec.geometry;
        let shown = g.layer_window(layer).map_or(len, |w| len.min(w - 1));
        len - shown..len
    }

    /// The sliding layer whose held rows do not cover its window at length `len`, if any.
    fn window_gap(&self, len: usize) -> Option<(usize, usize)> {
        (0..self.first_held.len())
            .find(|&l| {
                let shown = self.window_tokens(l, len);
                !shown.is_empty() && shown.start < self.first_held[l]
            })
            .map(|l| (l, self.first_held[l]))
    }

    /// Truncates the cache to its first `len` tokens. Discards a pending plan.
    pub fn rollback(&mut self, len: usize) -> Result<(), KvError> {
        if len > self.len {
            return Err(KvError::InvalidRollback {
                requested: len,
                len: self.len,
            });
        }
        if let Some((layer, first_held)) = self.window_gap(len) {
            let window = self.spec.geometry.layer_window(layer).unwrap_or(0);
            return Err(KvError::RollbackPastWindow {
                requested: len,
                layer,
                window,
                first_held,
                shortest: first_held + window - 1,
            });
        }
        self.pending = None;
        let dropped = self.len - len;
        let old_len = self.len;
        match &mut self.state {
            // A layer's window end moves back by the held tokens dropped (a sliding layer rolled
            // back below its held rows, to 0 or with W = 1, keeps its end at its oldest held row).
            State::Shift { v1, .. } => {
                for (v, &first) in v1.iter_mut().zip(&self.first_held) {
                    *v -= old_len - len.max(first);
                }
            }
            State::Conveyor => {}
            State::Slots { stride, .. } => {
                if self.spec.strategy == Strategy::Naive && dropped > 0 && len > 0 {
                    // Right-aligned rows: the held ones move right by the dropped count.
                    let stride = *stride;
                    let first = |s: usize| old_len.saturating_sub(s);
                    self.move_slot_tokens(
                        |s| first(s).min(len)..len,
                        |s, t| (s + t - old_len, s),
                        |s, t| (s + t - len, s),
                        stride,
                    );
                }
            }
        }
        self.len = len;
        self.first_held.iter_mut().for_each(|f| *f = (*f).min(len));
        Ok(())
    }

    /// Empties the cache (counters keep their totals) and restarts positions at 0.
    pub fn reset(&mut self) {
        self.pending = None;
        self.len = 0;
        self.position_offset = 0;
        self.first_held.fill(0);
        if let State::Shift { start, v1, .. } = &mut self.state {
            v1.copy_from_slice(start);
        }
    }

    /// What is added to a new token's index to make its position: 0 unless evictions kept positions
    /// ([`crate::PositionMode::Keep`]). Rollbacks keep it; a reset or an import sets it to 0.
    pub fn position_offset(&self) -> usize {
        self.position_offset
    }

    /// Sets the position offset (restoring a saved session whose evictions kept positions).
    pub fn set_position_offset(&mut self, offset: usize) {
        self.pending = None;
        self.position_offset = offset;
    }

    /// Drops a pending plan.
    pub(crate) fn discard_plan(&mut self) {
        self.pending = None;
    }

    /// True when a strategy keeps token rows anchored at the window's end (`shift`, `naive`): token t
    /// lives at `end - len + t`, so a shorter length moves every token's place right.
    pub(crate) fn anchored_at_end(&self) -> bool {
        matches!(self.state, State::Shift { .. }) || self.spec.strategy == Strategy::Naive
    }

    /// Sets the length after an eviction moved the rows (see [`crate::evict`]).
    pub(crate) fn set_len_for_eviction(&mut self, len: usize) {
        self.len = len;
    }

    /// Counts an eviction's copies and, with [`crate::PositionMode::Keep`], moves positions on.
    pub(crate) fn count_eviction(
        &mut self,
        eviction: &crate::Eviction,
        positions: crate::PositionMode,
    ) {
        self.counters.evictions += 1;
        self.counters.tokens_evicted += eviction.dropped;
        self.counters.rows_moved_by_evictions += eviction.rows_moved;
        self.counters.bytes_copied += eviction.bytes_copied;
        if positions == crate::PositionMode::Keep {
            self.position_offset += eviction.dropped;
        }
    }

    /// The totals, for a relayout that carries them over.
    pub(crate) fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// The region as mutable bytes, for the snapshot import.
    pub(crate) fn region_mut(&mut self) -> &mut [u8] {
        self.region.as_mut_slice()
    }

    /// Where token `token` of buffer `buffer` lives now, whatever the strategy and layout. The
    /// token must be held: `first_held(layer) <= token < len`.
    pub(crate) fn token_row(&self, buffer: usize, token: usize) -> RowRef {
        let g = &self.spec.geometry;
        let (rb, e) = (g.row_bytes(), g.dtype.size_bytes());
        let base = self.layout.base.get(buffer).copied().unwrap_or(0);
        match &self.state {
            State::Shift { v1, .. } => {
                let end = v1[buffer / (2 * g.kv_heads)];
                RowRef {
                    start: (base + end + token - self.len) * rb,
                    step: e,
                }
            }
            State::Conveyor => RowRef {
                start: (base + token) * rb,
                step: e,
            },
            State::Slots { stride, .. } => {
                let (tensor, head) = match g.granularity {
                    Granularity::PerHead => (buffer, 0),
                    Granularity::PerLayer => {
                        let (_, head, _) = g.buffer_coords(buffer);
                        (
                            g.buffer_tensor(buffer, KvIo::Past).position(g.kv_heads),
                            head,
                        )
                    }
                };
                let s = self.slot_stride(tensor, *stride);
                let slot = if self.spec.strategy == Strategy::Naive {
                    s + token - self.len
                } else {
                    token
                };
                self.slot_row(tensor, head, slot, s)
            }
        }
    }

    /// Empties the cache and makes it hold `len` tokens whose rows are then written at
    /// [`KvCache::token_row`] (the snapshot import; `len <= capacity` is checked by the caller).
    /// A sliding layer then holds the last W - 1 of them ([`KvCache::window_tokens`]).
    pub(crate) fn reset_to_len(&mut self, len: usize) {
        self.reset();
        let w_max = self.spec.geometry.max_window();
        if let State::Slots { stride, .. } = &mut self.state {
            // Any layout is free while empty; the largest window holds the whole capacity.
            *stride = w_max;
        }
        self.len = len;
        for layer in 0..self.first_held.len() {
            self.first_held[layer] = self.window_tokens(layer, len).start;
        }
    }

    pub(crate) fn add_copy(&mut self, bytes: usize) {
        self.step.bytes_copied += bytes;
        self.counters.bytes_copied += bytes;
        self.counters.worst_step_bytes_copied = self
            .counters
            .worst_step_bytes_copied
            .max(self.step.bytes_copied);
    }

    fn add_rebase(&mut self) {
        self.step.rebases += 1;
        self.counters.rebases += 1;
    }

    /// Data movement a strategy needs before the AR-`ar` step.
    fn prepare(&mut self, ar: usize) {
        let g = &self.spec.geometry;
        let (w, len, row_bytes) = (g.window(ar), self.len, g.row_bytes());
        let kv_heads = g.kv_heads;
        match &mut self.state {
            State::Shift { v1, .. } => {
                let mut moved = Vec::new();
                for (layer, end) in v1.iter_mut().enumerate() {
                    let first = layer * kv_heads * 2;
                    let r = self.layout.rows[first];
                    if *end + ar <= r && *end >= g.past_rows(layer, ar) {
                        continue;
                    }
                    // Rebase: move the held rows (at most the kept ones) to end at the anchor.
                    let anchor = shift_anchor(g, layer);
                    let keep = len.min(anchor).min(*end);
                    let bytes = self.region.as_mut_slice();
                    for b in first..first + kv_heads * 2 {
                        let base = self.layout.base[b];
                        let src = (base + *end - keep) * row_bytes;
                        let dst = (base + anchor - keep) * row_bytes;
                        bytes.copy_within(src..src + keep * row_bytes, dst);
                    }
                    *end = anchor;
                    moved.push(keep);
                }
                for keep in moved {
                    self.add_rebase();
                    self.add_copy(2 * kv_heads * keep * row_bytes);
                }
            }
            State::Conveyor => {}
            State::Slots { fixed, stride } => {
                if !*fixed && *stride != w {
                    self.relayout(w);
                }
            }
        }
    }

    /// Lays the slot tensors out for a window of `new_stride` rows (strided layouts only): token t sits
    /// in slot t (`smart_mask`) or right-aligned in slot `stride - len + t` (`naive`).
    fn relayout(&mut self, new_stride: usize) {
        let State::Slots { stride, .. } = &mut self.state else {
            return;
        };
        let old = std::mem::replace(stride, new_stride);
        let len = self.len;
        if len > 0 {
            let naive = self.spec.strategy == Strategy::Naive;
            let slot = move |s: usize, t: usize| if naive { s - len + t } else { t };
            self.move_slot_tokens(
                |_| 0..len,
                |_, t| (slot(old, t), old),
                |_, t| (slot(new_stride, t), new_stride),
                old,
            );
        }
        self.add_rebase();
    }

    /// The window tensor `t`'s data is laid out for: the layout's slot window (W_max, or K for a
    /// sliding layer) in fixed layouts, the variant's window `stride` in strided ones.
    fn slot_stride(&self, t: usize, stride: usize) -> usize {
        match self.state {
            State::Slots { fixed: true, .. } => self.layout.rows[t],
            _ => stride,
        }
    }

    /// Where token slot `j` of head `h` of slot tensor `t` lives, for a layout of window `stride`.
    fn slot_row(&self, t: usize, h: usize, j: usize, stride: usize) -> RowRef {
        let g = &self.spec.geometry;
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let base = self.layout.base[t] * d * e;
        if self.transposed(t) {
            RowRef {
                start: base + (h * d * stride + j) * e,
                step: stride * e,
            }
        } else {
            RowRef {
                start: base + (h * stride + j) * d * e,
                step: e,
            }
        }
    }

    /// Where new token `i` of head `h` of output tensor `t` lives in an AR-`ar` step.
    fn out_row(&self, t: usize, h: usize, i: usize, ar: usize) -> RowRef {
        let g = &self.spec.geometry;
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let heads = self.plan.heads_per_tensor;
        let base = (self.layout.out_base + t * heads * g.max_ar()) * d * e;
        if self.transposed(t) {
            RowRef {
                start: base + (h * d * ar + i) * e,
                step: ar * e,
            }
        } else {
            RowRef {
                start: base + (h * ar + i) * d * e,
                step: e,
            }
        }
    }

    fn transposed(&self, t: usize) -> bool {
        self.plan.k_transposed && self.plan.tensors[t].kind == TensorKind::Key
    }

    /// Copies the new rows of a step into their slots (`smart_mask`), or slides every window left by
    /// `accepted` rows and appends them (`naive`).
    fn commit_slots(&mut self, ar: usize, accepted: usize, stride: usize, naive: bool) {
        let g = &self.spec.geometry;
        let (d, e, rb) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes());
        let heads = self.plan.heads_per_tensor;
        let mut copied = 0;
        for t in 0..self.plan.tensors.len() {
            let stride = self.slot_stride(t, stride);
            for h in 0..heads {
                if naive {
                    let first = self.slot_row(t, h, 0, stride);
                    let shifted = self.slot_row(t, h, accepted, stride);
                    let bytes = self.region.as_mut_slice();
                    let keep = stride - accepted;
                    if first.step == e {
                        bytes.copy_within(shifted.start..shifted.start + keep * rb, first.start);
                    } else {
                        // Transposed: each channel is a contiguous run of `stride` elements.
                        for c in 0..d {
                            let src = shifted.start + c * shifted.step;
                            bytes.copy_within(src..src + keep * e, first.start + c * first.step);
                        }
                    }
                    copied += keep * rb;
                }
                for i in 0..accepted {
                    let slot = if naive {
                        stride - accepted + i
                    } else {
                        self.len + i
                    };
                    let dst = self.slot_row(t, h, slot, stride);
                    let src = self.out_row(t, h, i, ar);
                    copy_row(self.region.as_mut_slice(), src, dst, d, e);
                }
                copied += accepted * rb;
            }
        }
        self.add_copy(copied);
    }

    /// Moves tokens `tokens(s)` of every slot tensor (s: the tensor's window for a layout of
    /// window `stride`, [`KvCache::slot_stride`]) from (slot, window) `from(s, t)` to `to(s, t)`,
    /// through a scratch copy, so overlapping moves are safe.
    fn move_slot_tokens(
        &mut self,
        tokens: impl Fn(usize) -> std::ops::Range<usize>,
        from: impl Fn(usize, usize) -> (usize, usize),
        to: impl Fn(usize, usize) -> (usize, usize),
        stride: usize,
    ) {
        let g = &self.spec.geometry;
        let (d, e, rb) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes());
        let heads = self.plan.heads_per_tensor;
        let mut moved = 0;
        for t in 0..self.plan.tensors.len() {
            let s = self.slot_stride(t, stride);
            let range = tokens(s);
            let count = range.len();
            let mut scratch = vec![0u8; heads * count * rb];
            for h in 0..heads {
                for (i, tok) in range.clone().enumerate() {
                    let (slot, window) = from(s, tok);
                    let src = self.slot_row(t, h, slot, window);
                    let bytes = self.region.as_slice();
                    let out = &mut scratch[(h * count + i) * rb..][..rb];
                    for c in 0..d {
                        let at = src.start + c * src.step;
                        out[c * e..(c + 1) * e].copy_from_slice(&bytes[at..at + e]);
                    }
                }
            }
            for h in 0..heads {
                for (i, tok) in range.clone().enumerate() {
                    let (slot, window) = to(s, tok);
                    let dst = self.slot_row(t, h, slot, window);
                    let row = &scratch[(h * count + i) * rb..][..rb];
                    let bytes = self.region.as_mut_slice();
                    for c in 0..d {
                        let at = dst.start + c * dst.step;
                        bytes[at..at + e].copy_from_slice(&row[c * e..(c + 1) * e]);
                    }
                }
            }
            moved += heads * count * rb;
        }
        self.add_copy(moved);
    }

    /// Fills the plan's offsets, counts new handles and the peak. Per-step work: one pass over the
    /// buffers with no division and no per-buffer lookup (each layer's past rows are taken once).
    fn fill_offsets(&mut self, ar: usize, variant: usize) {
        let g = &self.spec.geometry;
        let (rb, per_layer) = (g.row_bytes(), 2 * g.kv_heads);
        let plan = &mut self.plan;
        plan.past_offsets.clear();
        plan.new_offsets.clear();
        let mut new_keys = 0usize;
        // Every past tensor ends where the step's new rows begin (left-padded strategies) and
        // holds the layer's past rows: S - n, or W - 1 for a sliding layer (per_head rows and
        // left-padded strategies only, see `CacheSpec::check_windows`).
        let mut past_end = 0;
        match &self.state {
            State::Shift { v1, .. } => {
                for (layer, &end) in v1.iter().enumerate() {
                    if self.handles.mark(layer, end, variant) {
                        new_keys += 2 * per_layer;
                    }
                    let past = g.past_rows(layer, ar);
                    for &base in &self.layout.base[layer * per_layer..(layer + 1) * per_layer] {
                        let row = base + end;
                        plan.past_offsets.push((row - past) * rb);
                        plan.new_offsets.push(row * rb);
                    }
                    past_end = past_end.max(plan.new_offsets.last().copied().unwrap_or(0));
                }
            }
            State::Conveyor => {
                if self.handles.mark(0, self.len, variant) {
                    new_keys += 2 * g.buffers();
                }
                for (layer, bases) in self.layout.base.chunks_exact(per_layer).enumerate() {
                    let past = g.past_rows(layer, ar);
                    for &base in bases {
                        let row = base + self.len;
                        plan.past_offsets.push((row - past) * rb);
                        plan.new_offsets.push(row * rb);
                    }
                }
                past_end = plan.new_offsets.last().copied().unwrap_or(0);
            }
            State::Slots { fixed, .. } => {
                let tensors = plan.tensors.len();
                if self.handles.mark(0, 0, variant) {
                    new_keys += 2 * tensors;
                }
                let h = plan.heads_per_tensor;
                for t in 0..tensors {
                    let past = g.past_rows(plan.tensors[t].layer, ar);
                    // Fixed left-padded layouts end every window at the end of its slots.
                    let origin = if *fixed && plan.left_padded {
                        self.layout.rows[t] - past
                    } else {
                        0
                    };
                    let at = (self.layout.base[t] + origin) * rb;
                    plan.past_offsets.push(at);
                    past_end = past_end.max(at + h * past * rb);
                    let out = self.layout.out_base + t * h * g.max_ar();
                    plan.new_offsets.push(out * rb);
                }
            }
        }
        let h = plan.heads_per_tensor;
        let new_end = plan.new_offsets.iter().max().map_or(0, |o| o + h * ar * rb);
        self.counters.peak_bytes_in_use =
            self.counters.peak_bytes_in_use.max(past_end).max(new_end);
        self.step.new_handles += new_keys;
        self.counters.handles += new_keys;
        self.counters.max_window_offsets_per_buffer = self.handles.max_distinct();
    }
}

/// Where a `shift` layer's window ends after a rebase (and starts, unstaggered): W_max for a
/// global layer, its kept rows K for a sliding layer.
fn shift_anchor(g: &crate::Geometry, layer: usize) -> usize {
    g.kept_rows(layer).unwrap_or(g.capacity())
}

pub(crate) fn copy_row(bytes: &mut [u8], src: RowRef, dst: RowRef, d: usize, e: usize) {
    if src.step == e && dst.step == e {
        bytes.copy_within(src.start..src.start + d * e, dst.start);
    } else {
        for c in 0..d {
            let at = src.start + c * src.step;
            bytes.copy_within(at..at + e, dst.start + c * dst.step);
        }
    }
}

fn heads_per_tensor(kv_heads: usize, granularity: Granularity) -> usize {
    match granularity {
        Granularity::PerHead => 1,
        Granularity::PerLayer => kv_heads,
    }
}

pub(crate) fn tensor_ids(
    layers: usize,
    kv_heads: usize,
    granularity: Granularity,
) -> Vec<TensorId> {
    let mut ids = Vec::new();
    for layer in 0..layers {
        match granularity {
            Granularity::PerHead => {
                for head in 0..kv_heads {
                    for kind in [TensorKind::Key, TensorKind::Value] {
                        ids.push(TensorId {
                            layer,
                            head: Some(head),
                            kind,
                        });
                    }
                }
            }
            Granularity::PerLayer => {
                for kind in [TensorKind::Key, TensorKind::Value] {
                    ids.push(TensorId {
                        layer,
                        head: None,
                        kind,
                    });
                }
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Geometry, HostAllocator, Reserve};
    use quant::DataType;

    fn cache(g: Geometry, s: Strategy) -> KvCache {
        KvCache::new(CacheSpec::for_simulation(g, s), &HostAllocator::default()).unwrap()
    }

    #[test]
    fn protocol_errors_are_typed() {
        let mut c = cache(
            Geometry::new(1, 1, 2, 8, &[1, 4], DataType::U8),
            Strategy::SHIFT_2X,
        );
        assert!(matches!(c.commit(1), Err(KvError::InvalidCommit { .. })));
        assert!(matches!(
            c.plan(2),
            Err(KvError::UnknownVariant { ar: 2, .. })
        ));
        c.plan(4).unwrap();
        assert!(matches!(
            c.commit(5),
            Err(KvError::InvalidCommit { requested: 5, .. })
        ));
        c.commit(4).unwrap();
        assert!(matches!(
            c.rollback(5),
            Err(KvError::InvalidRollback {
                requested: 5,
                len: 4
            })
        ));
        // Capacity is S - 1 = 7: 4 + 4 does not fit, 4 + 1 three times does.
        assert_eq!(
            c.plan(4).unwrap_err(),
            KvError::ContextFull {
                len: 4,
                ar: 4,
                capacity: 7,
                context: 8
            }
        );
        for _ in 0..3 {
            c.plan(1).unwrap();
            c.commit(1).unwrap();
        }
        assert_eq!(c.len(), 7);
        assert!(matches!(
            c.plan(1),
            Err(KvError::ContextFull { len: 7, .. })
        ));
        c.reset();
        assert!(c.is_empty());
        c.plan(4).unwrap();
    }

    #[test]
    fn shift_2x_fills_a_context_without_a_copy_and_1_5x_rebases() {
        let g = Geometry::new(2, 2, 4, 64, &[1], DataType::U16);
        let mut full = cache(g.clone(), Strategy::SHIFT_2X);
        let mut small = cache(
            g,
            Strategy::Shift {
                reserve: Reserve::Factor(1.5),
                stagger: false,
            },
        );
        for c in [&mut full, &mut small] {
            while c.plan(1).is_ok() {
                c.commit(1).unwrap();
            }
        }
        assert_eq!(full.counters().bytes_copied, 0);
        assert_eq!(full.counters().rebases, 0);
        // One window position per step: 63 distinct offsets for 63 steps.
        assert_eq!(full.counters().max_window_offsets_per_buffer, 63);
        assert_eq!(
            full.counters().peak_bytes_in_use,
            full.counters().region_bytes
        );
        // R = 63 + 31: the first rebase comes at len 31 and moves 31 rows of each of the 2 layers' 4 buffers.
        let c = small.counters();
        assert_eq!(c.rebases, 2 * 2);
        assert_eq!(c.bytes_copied, 2 * 4 * (31 + 62) * 8);
    }

    #[test]
    fn staggered_layers_rebase_on_different_steps() {
        let g = Geometry::new(4, 1, 4, 64, &[1], DataType::U8);
        let mut c = cache(
            g,
            Strategy::Shift {
                reserve: Reserve::Factor(1.5),
                stagger: true,
            },
        );
        let mut rebasing_steps = Vec::new();
        while c.plan(1).is_ok() {
            let rebases = c.last_step().rebases;
            assert!(rebases <= 1, "two layers rebased on one step");
            if rebases == 1 {
                rebasing_steps.push(c.len());
            }
            c.commit(1).unwrap();
        }
        assert!(rebasing_steps.len() >= 4, "{rebasing_steps:?}");
    }

    #[test]
    fn quantized_mask_uses_the_zero_point_and_the_minimum() {
        let mut c = cache(
            Geometry::new(1, 1, 2, 4, &[1], DataType::U16),
            Strategy::Naive,
        );
        c.plan(1).unwrap();
        c.commit(1).unwrap();
        let plan = c.plan(1).unwrap().clone();
        // Left-padded window of 3 with one valid row: [-inf, -inf, 0, 0(new)].
        assert_eq!(
            plan.mask,
            vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0]
        );
        let u16_spec = QuantSpec {
            dtype: DataType::U16,
            encoding: quant::Encoding::PerTensor(quant::ScaleOffset {
                scale: 100.0 / 65535.0,
                offset: -65535,
            }),
        };
        let mut out = vec![0u8; 8];
        plan.mask_quantized(&u16_spec, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        let u8_spec = QuantSpec {
            dtype: DataType::U8,
            encoding: quant::Encoding::PerTensor(quant::ScaleOffset {
                scale: 0.5,
                offset: 0,
            }),
        };
        let mut out = vec![0u8; 4];
        assert!(matches!(
            plan.mask_quantized(&u8_spec, &mut out),
            Err(KvError::MaskEncoding { .. })
        ));
        let mut short = vec![0u8; 3];
        assert!(matches!(
            plan.mask_quantized(&u16_spec, &mut short),
            Err(KvError::BufferSize { .. })
        ));
    }
}
