//! The cache: one region, one strategy, and the step protocol `plan` -> (graph runs) -> `commit`.

use crate::counters::HandleTracker;
use crate::saturation::Saturation;
use crate::strategy::{Cx, Moved, Rule};
pub(crate) use crate::strategy::{RowRef, copy_row};
use crate::{
    CacheSpec, Counters, Granularity, KLayout, KvError, Plan, Region, RegionAllocator, StepStats,
};
use quant::QuantSpec;

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
    /// The strategy's rule: its layout, its state and its per-step work.
    rule: Box<dyn Rule>,
    region: Region,
    len: usize,
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
    /// Committed K/V codes at their encoding's extremes, per buffer (while `counting`).
    saturation: Saturation,
    /// Whether commits count saturated codes ([`KvCache::set_saturation_counting`]).
    counting: bool,
}

impl KvCache {
    /// Validates `spec` (every refusal names its reason) and allocates the region.
    pub fn new(spec: CacheSpec, allocator: &dyn RegionAllocator) -> Result<KvCache, KvError> {
        let rule = spec.rule()?;
        let region_bytes = spec.region_bytes()?;
        let region = Region::allocate(allocator, region_bytes)?;
        let g = &spec.geometry;
        let (groups, positions) = rule.handle_groups(g);
        let handles = HandleTracker::new(groups, positions, g.ar_variants.len());
        let tensors = crate::geometry::tensor_ids(g.layers, g.kv_heads, g.granularity);
        let self_bytes = rule.layout().region_rows * g.row_bytes(); // checked by `region_bytes`
        let cross = crate::static_kv::bindings(&spec, self_bytes)?;
        let cross_filled = vec![false; cross.len()];
        let plan = Plan {
            heads_per_tensor: heads_per_tensor(g.kv_heads, g.granularity),
            head_dim: g.head_dim,
            elem_bytes: g.dtype.size_bytes(),
            k_transposed: g.k_layout == KLayout::Transposed,
            context: g.context,
            left_padded: rule.left_padded(),
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
        let saturation = Saturation::new(g.buffers());
        Ok(KvCache {
            first_held,
            saturation,
            counting: false,
            spec,
            rule,
            region,
            len: 0,
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
        self.prepare_and_bind(ar, variant);
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
        if self.counting {
            self.count_saturation(accepted);
        }
        self.with_rule(|rule, cx| rule.commit(cx, ar, accepted));
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

    /// Committed K/V codes at their encoding's extremes, per buffer, counted while counting was on
    /// ([`KvCache::set_saturation_counting`]; all zero when it never was).
    pub fn saturation(&self) -> &Saturation {
        &self.saturation
    }

    /// Turns saturation counting on or off (off when the cache is made): while on, every commit
    /// scans the rows it keeps (about one more read of them; see the `kv_update` example), and
    /// [`KvCache::saturation`] grows.
    pub fn set_saturation_counting(&mut self, on: bool) {
        self.counting = on;
    }

    /// Whether commits count saturated codes.
    pub fn counts_saturation(&self) -> bool {
        self.counting
    }

    /// Takes `other`'s saturation counts and whether it counts (a relayout carries them over).
    pub(crate) fn carry_saturation(&mut self, other: &KvCache) {
        self.counting = other.counting;
        self.saturation = other.saturation.clone();
    }

    /// Adds the saturated codes of the first `accepted` new rows of the planned step (still where
    /// the graph wrote them: the strategies move rows only in their commit). A head's rows are
    /// one slice ([heads, 1, n, D]: rows 0..k side by side; transposed, all n rows are the
    /// head's block), or with a transposed K and part of a step kept, one slice per channel.
    fn count_saturation(&mut self, accepted: usize) {
        let g = &self.spec.geometry;
        if !g.dtype.is_fixed_point() || accepted == 0 {
            return;
        }
        let (elem, d) = (self.plan.elem_bytes, g.head_dim);
        let region = self.region.as_slice();
        for index in 0..self.plan.tensor_count() {
            let binding = self.plan.new_output(index);
            let id = self.plan.tensors[index];
            for head in 0..self.plan.heads_per_tensor {
                let buffer = g.buffer_index(id.layer, id.head.unwrap_or(head), id.kind);
                let dtype = self.spec.encodings[buffer].dtype;
                if !dtype.is_fixed_point() {
                    continue;
                }
                let count = |channel: usize, len: usize| {
                    let at = binding.offset + binding.element_offset(head, 0, channel, elem);
                    crate::saturation::count_saturated_bytes(dtype, &region[at..at + len * elem])
                };
                let saturated = if binding.transposed && accepted < self.plan.ar {
                    (0..d).map(|c| count(c, accepted)).sum()
                } else {
                    count(0, accepted * d)
                };
                let b = &mut self.saturation.buffers[buffer];
                b.saturated += saturated;
                b.values += (accepted * d) as u64;
            }
        }
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
        self.with_rule(|rule, cx| rule.rollback(cx, len));
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
        self.rule.reset();
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
        self.rule.anchored_at_end()
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
        self.rule
            .token_row(&self.spec.geometry, &self.plan, self.len, buffer, token)
    }

    /// Empties the cache and makes it hold `len` tokens whose rows are then written at
    /// [`KvCache::token_row`] (the snapshot import; `len <= capacity` is checked by the caller).
    /// A sliding layer then holds the last W - 1 of them ([`KvCache::window_tokens`]).
    pub(crate) fn reset_to_len(&mut self, len: usize) {
        self.reset();
        self.rule.reset_layout(&self.spec.geometry);
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

    /// Runs `f` on the rule with the cache's state, then counts what it moved.
    fn with_rule<T>(&mut self, f: impl FnOnce(&mut dyn Rule, &mut Cx<'_>) -> T) -> T {
        let mut cx = Cx {
            g: &self.spec.geometry,
            plan: &mut self.plan,
            region: self.region.as_mut_slice(),
            len: self.len,
            first_held: &self.first_held,
            handles: &mut self.handles,
            moved: Moved::default(),
        };
        let out = f(self.rule.as_mut(), &mut cx);
        let moved = cx.moved;
        self.step.rebases += moved.rebases;
        self.counters.rebases += moved.rebases;
        self.add_copy(moved.bytes);
        out
    }

    /// Moves what the strategy must before an AR-`ar` step (rebases, relayouts), then fills the
    /// plan's offsets and counts the new handles and the peak.
    fn prepare_and_bind(&mut self, ar: usize, variant: usize) {
        self.plan.past_offsets.clear();
        self.plan.new_offsets.clear();
        let new_handles = self.with_rule(|rule, cx| {
            rule.prepare(cx, ar);
            rule.bind(cx, ar, variant)
        });
        // Every past window ends at or before its tensor's new rows (left-padded strategies bind
        // them right after it, slot strategies put every output after every slot window), so the
        // highest byte any binding reaches is the end of the highest new-row binding.
        let rb = self.spec.geometry.row_bytes();
        let new_bytes = self.plan.heads_per_tensor * ar * rb;
        let new_end = self
            .plan
            .new_offsets
            .iter()
            .max()
            .map_or(0, |o| o + new_bytes);
        self.counters.peak_bytes_in_use = self.counters.peak_bytes_in_use.max(new_end);
        self.step.new_handles += new_handles;
        self.counters.handles += new_handles;
        self.counters.max_window_offsets_per_buffer = self.handles.max_distinct();
    }
}

fn heads_per_tensor(kv_heads: usize, granularity: Granularity) -> usize {
    match granularity {
        Granularity::PerHead => 1,
        Granularity::PerLayer => kv_heads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Geometry, HostAllocator, Reserve, Strategy};
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
