//! Memory budgets and closed-form predictions of what the KV manager does over a generation.
//!
//! [`predict`] derives, from the documented behaviour of each strategy in `kv_manager` (not by running
//! a cache), the counters a [`kv_manager::KvCache`] reports after a [`Run`]: bytes copied, the worst
//! step, rebases and memory handles. `htpkv plan` runs the real cache over the same schedule
//! ([`Run::schedule`]) and the tests check that both agree.
//!
//! # The run
//! A [`Run`] is a prefill of `prefill` tokens followed by `decode_steps` decode steps:
//! - prefill: chunks of m = max(ar) tokens on the AR-m graph; the last chunk is padded and commits
//!   only its real tokens (a prefill of 0 tokens is skipped);
//! - decode: steps on the smallest variant a = min(ar), each committing 1 token (the generated one).
//!
//! Every step must fit the cache: `len + n <= S - a` ([`kv_manager::Geometry::capacity`]).
//! [`Run::full_context`] decodes until the next step would not fit: with `ar: [1]` and no prefill that
//! is S - 1 steps, after which the cache holds S - 1 tokens and the last sampled token completes a
//! context of S.
//!
//! # Closed forms (B buffers, H kv heads, L layers, rows of one token of one buffer)
//! - `conveyor`: no copies, no rebases; every step binds a new offset: handles = 2B x steps.
//! - `smart_mask` (per_head, K rows): each commit of k tokens copies k rows per buffer;
//!   `naive`: each commit slides the window, (W_max - k) + k = W_max rows per buffer.
//!   Handles: 2 x tensors per AR variant used. Strided layouts (`per_layer` or transposed K) lay the
//!   slots out for the variant's window W = S - n and relay out (len rows per buffer, counted as a
//!   rebase) when the variant changes or when a commit overflows W.
//! - `shift`: layer l's window end starts at W_max (+ l x slack / L when staggered, slack =
//!   R - W_max - max ar) and grows by each commit; a step of n tokens whose end + n would pass R rebases
//!   the layer first: len rows of each of its 2H buffers move and the end returns to W_max. Rebases are
//!   counted per layer. Handles: 4H per distinct (window end, variant) of a layer.
//!
//! # Hostile input
//! Geometries are bounded by `kv_manager`'s limits (see [`kv_manager::size`]), a run's prefill and
//! decode steps are compared with the cache's capacity before any arithmetic ([`Run::check`]), and run
//! totals (rows and bytes copied, handles) use [`kv_manager::Size`]: a total beyond `usize` is a
//! [`KvError::SizeOverflow`] naming it, never a wrapped number. Layers that start at the same offset are
//! predicted once, so a `shift` prediction costs about one pass over the steps whatever the depth.
//! Byte sizes (`--fit`) are at most [`MAX_BYTE_SIZE`].

use crate::config::{Config, Update};
use kv_manager::{
    CacheSpec, Counters, Geometry, Granularity, KLayout, KvError, Reserve, Size, Strategy,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// What a budget or a prediction can fail on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The KV manager refuses the spec.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The run does not fit the cache.
    #[error(
        "a prefill of {prefill} tokens and {decode_steps} decode steps do not fit the cache: {reason}"
    )]
    RunTooLong {
        prefill: usize,
        decode_steps: usize,
        reason: String,
    },
    /// A byte size above [`MAX_BYTE_SIZE`].
    #[error("byte size `{text}` is above the limit of 1 PiB ({maximum} bytes)")]
    ByteSizeTooLarge { text: String, maximum: usize },
    /// A beam count `htpkv budget --beams` cannot cost.
    #[error("--beams {beams}: {reason}")]
    Beams { beams: usize, reason: String },
    /// A byte size that could not be parsed.
    #[error(
        "invalid byte size `{text}`: expected a number with an optional suffix B, KB, MB, GB, TB, PB \
         (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. 512MiB or 2GB"
    )]
    ByteSize { text: String },
}

/// One step of a schedule: plan the AR-`ar` graph, then commit `commit` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    pub ar: usize,
    pub commit: usize,
    /// True for decode steps, false for prefill chunks.
    pub decode: bool,
}

/// A generation: a prefill of `prefill` tokens, then `decode_steps` decode steps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Run {
    pub prefill: usize,
    pub decode_steps: usize,
}

/// Steps that share a variant and a commit size: step i plans at length `len0 + i x commit`.
#[derive(Debug, Clone, Copy)]
struct Segment {
    ar: usize,
    len0: usize,
    commit: usize,
    count: usize,
    decode: bool,
}

impl Run {
    /// The most decode steps that fit after a prefill of `prefill` tokens (fails when the prefill itself
    /// does not fit).
    pub fn max_decode_steps(geometry: &Geometry, prefill: usize) -> Result<usize, BudgetError> {
        Run {
            prefill,
            decode_steps: 0,
        }
        .check(geometry)?;
        let (a, cap) = (geometry.min_ar(), geometry.capacity());
        Ok((cap + 1).saturating_sub(a + prefill))
    }

    /// The run that fills the whole context with decode steps after a prefill of `prefill` tokens.
    pub fn full_context(geometry: &Geometry, prefill: usize) -> Result<Run, BudgetError> {
        Ok(Run {
            prefill,
            decode_steps: Run::max_decode_steps(geometry, prefill)?,
        })
    }

    /// Checks that every step fits the cache.
    pub fn check(&self, geometry: &Geometry) -> Result<(), BudgetError> {
        let (a, m, cap) = (geometry.min_ar(), geometry.max_ar(), geometry.capacity());
        let fail = |reason: String| BudgetError::RunTooLong {
            prefill: self.prefill,
            decode_steps: self.decode_steps,
            reason,
        };
        // Each count is compared with the capacity (at most 2^24) before any arithmetic, so nothing
        // below can overflow.
        if self.prefill > cap {
            return Err(fail(format!(
                "the cache holds {cap} tokens (context {} - {a})",
                geometry.context
            )));
        }
        let chunks = self.prefill.div_ceil(m);
        if chunks * m > cap {
            return Err(fail(format!(
                "{chunks} AR-{m} prefill chunks need {} rows but the cache holds {cap} tokens \
                 (context {} - {a})",
                chunks * m,
                geometry.context
            )));
        }
        if self.decode_steps > cap
            || (self.decode_steps > 0 && self.prefill + self.decode_steps - 1 + a > cap)
        {
            let max = (cap + 1).saturating_sub(a + self.prefill);
            return Err(fail(format!(
                "at most {max} AR-{a} decode steps fit after the prefill (the cache holds {cap} tokens)"
            )));
        }
        Ok(())
    }

    fn segments(&self, geometry: &Geometry) -> Vec<Segment> {
        let (a, m) = (geometry.min_ar(), geometry.max_ar());
        let mut out = Vec::new();
        let (full, rest) = (self.prefill / m, self.prefill % m);
        for (len0, commit, count) in [(0, m, full), (full * m, rest, usize::from(rest > 0))] {
            if count > 0 {
                out.push(Segment {
                    ar: m,
                    len0,
                    commit,
                    count,
                    decode: false,
                });
            }
        }
        if self.decode_steps > 0 {
            out.push(Segment {
                ar: a,
                len0: self.prefill,
                commit: 1,
                count: self.decode_steps,
                decode: true,
            });
        }
        out
    }

    /// Every step of the run, in order.
    pub fn schedule(&self, geometry: &Geometry) -> Vec<Step> {
        self.segments(geometry)
            .iter()
            .flat_map(|s| {
                std::iter::repeat_n(
                    Step {
                        ar: s.ar,
                        commit: s.commit,
                        decode: s.decode,
                    },
                    s.count,
                )
            })
            .collect()
    }
}

/// What the KV manager will count over a run: the same quantities as [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Prediction {
    /// Steps planned (prefill chunks + decode steps).
    pub steps: usize,
    pub tokens_committed: usize,
    /// Decode steps (one generated token each).
    pub decode_tokens: usize,
    pub bytes_copied: usize,
    /// `bytes_copied` in rows (one token of one buffer: head_dim x element size bytes).
    pub rows_copied: usize,
    /// Rows copied during the decode steps.
    pub decode_rows_copied: usize,
    pub worst_step_bytes_copied: usize,
    pub worst_step_rows_copied: usize,
    pub rebases: usize,
    /// Distinct memory handles (Counters::handles).
    pub handles: usize,
    /// Counters::max_window_offsets_per_buffer.
    pub max_window_offsets_per_buffer: usize,
}

impl Prediction {
    /// Rows copied per generated token: decode-step rows / decode steps (0 without decode steps).
    pub fn rows_copied_per_token(&self) -> f64 {
        if self.decode_tokens == 0 {
            0.0
        } else {
            self.decode_rows_copied as f64 / self.decode_tokens as f64
        }
    }

    /// The fields that differ from a cache's counters, as `name: predicted vs counted` (empty when the
    /// prediction is exact).
    pub fn mismatches(&self, c: &Counters) -> Vec<String> {
        [
            ("steps", self.steps, c.steps),
            (
                "tokens_committed",
                self.tokens_committed,
                c.tokens_committed,
            ),
            ("bytes_copied", self.bytes_copied, c.bytes_copied),
            (
                "worst_step_bytes_copied",
                self.worst_step_bytes_copied,
                c.worst_step_bytes_copied,
            ),
            ("rebases", self.rebases, c.rebases),
            ("handles", self.handles, c.handles),
            (
                "max_window_offsets_per_buffer",
                self.max_window_offsets_per_buffer,
                c.max_window_offsets_per_buffer,
            ),
        ]
        .into_iter()
        .filter(|(_, p, c)| p != c)
        .map(|(name, p, c)| format!("{name}: predicted {p} vs counted {c}"))
        .collect()
    }
}

/// Copies per step, accumulated with checked arithmetic (a `naive` run over a long context of a large
/// model copies more than 2^64 bytes).
#[derive(Debug)]
struct Copies {
    rows: Size,
    decode_rows: Size,
    worst: usize,
}

impl Default for Copies {
    fn default() -> Self {
        Copies {
            rows: Size::new("rows copied over the run", 0),
            decode_rows: Size::new("rows copied by the decode steps", 0),
            worst: 0,
        }
    }
}

impl Copies {
    /// `n` steps copying `rows` rows each.
    fn add(&mut self, rows: usize, n: usize, decode: bool) {
        if n == 0 {
            return;
        }
        let total = Size::new("rows copied over the run", rows).times(n);
        self.rows = self.rows.plus_size(total);
        if decode {
            self.decode_rows = self.decode_rows.plus_size(total);
        }
        self.worst = self.worst.max(rows);
    }
}

/// Predicts the counters of a fresh [`kv_manager::KvCache`] built from `spec` after `run`, in closed
/// form (see the module docs). Fails when the spec is refused or the run does not fit.
pub fn predict(spec: &CacheSpec, run: &Run) -> Result<Prediction, BudgetError> {
    spec.region_bytes()?;
    let g = &spec.geometry;
    run.check(g)?;
    let segments = run.segments(g);
    let steps: usize = segments.iter().map(|s| s.count).sum();
    let mut copies = Copies::default();
    let (rebases, handles, max_keys) = match spec.strategy {
        Strategy::Conveyor => (
            0,
            Size::new("memory handles", 2 * g.buffers()).times(steps),
            steps,
        ),
        Strategy::SmartMask | Strategy::Naive => slots(g, spec.strategy, &segments, &mut copies),
        Strategy::Shift { reserve, stagger } => shift(g, reserve, stagger, &segments, &mut copies)?,
    };
    let rb = g.row_bytes();
    let rows_copied = copies.rows.get()?;
    Ok(Prediction {
        steps,
        tokens_committed: run.prefill + run.decode_steps,
        decode_tokens: run.decode_steps,
        bytes_copied: Size::new("bytes copied over the run", rows_copied)
            .times(rb)
            .get()?,
        rows_copied,
        decode_rows_copied: copies.decode_rows.get()?,
        handles: handles.get()?,
        worst_step_bytes_copied: copies.worst * rb,
        worst_step_rows_copied: copies.worst,
        rebases,
        max_window_offsets_per_buffer: max_keys,
    })
}

/// `smart_mask` / `naive`: (rebases, handles, distinct keys).
fn slots(
    g: &Geometry,
    strategy: Strategy,
    segments: &[Segment],
    copies: &mut Copies,
) -> (usize, Size, usize) {
    let naive = strategy == Strategy::Naive;
    let fixed = g.granularity == Granularity::PerHead && g.k_layout == KLayout::Rows;
    let (b, w_max) = (g.buffers(), g.max_window());
    let tensors = match g.granularity {
        Granularity::PerHead => b,
        Granularity::PerLayer => 2 * g.layers,
    };
    // A fixed layout's slot windows: W_max rows per buffer, K for a sliding layer's (windows
    // need fixed layouts); strided layouts use the variant's window for every buffer.
    let fixed_rows: usize = (0..b)
        .map(|buf| g.kept_rows(buf / (2 * g.kv_heads)).unwrap_or(w_max))
        .sum();
    let commit_rows = |stride: usize, k: usize| match (naive, fixed) {
        (true, true) => fixed_rows,
        (true, false) => b * stride,
        (false, _) => b * k,
    };
    let mut stride = w_max;
    let mut rebases = 0;
    let mut variants: Vec<usize> = Vec::new();
    for s in segments {
        if !variants.contains(&s.ar) {
            variants.push(s.ar);
        }
        let w = g.context - s.ar;
        let mut first_extra = 0;
        if !fixed && stride != w {
            rebases += 1;
            first_extra = b * s.len0;
            stride = w;
        }
        let last_len = s.len0 + (s.count - 1) * s.commit;
        // Only the last step of a segment can overflow the variant's window: any later step of the same
        // variant would not fit the cache.
        let overflow = !fixed && last_len + s.commit > stride;
        let last = if overflow {
            rebases += 1;
            b * last_len + commit_rows(w_max, s.commit)
        } else {
            commit_rows(stride, s.commit)
        };
        if s.count == 1 {
            copies.add(first_extra + last, 1, s.decode);
        } else {
            copies.add(first_extra + commit_rows(stride, s.commit), 1, s.decode);
            copies.add(commit_rows(stride, s.commit), s.count - 2, s.decode);
            copies.add(last, 1, s.decode);
        }
        if overflow {
            stride = w_max;
        }
    }
    (
        rebases,
        Size::new("memory handles", 2 * tensors).times(variants.len()),
        variants.len(),
    )
}

/// `shift`: (rebases, handles, distinct keys of the busiest layer). Layer l has R_l rows per
/// buffer and rebases to its anchor A_l (W_max; a sliding layer's K, with R = K + its slide room),
/// moving min(len, A_l) rows of each of its 2H buffers.
fn shift(
    g: &Geometry,
    reserve: Reserve,
    stagger: bool,
    segments: &[Segment],
    copies: &mut Copies,
) -> Result<(usize, Size, usize), KvError> {
    let (h, layers) = (g.kv_heads, g.layers);
    let global_r = reserve.rows(g)?;
    // Rows copied by rebases, by global step index (staggered layers may rebase on the same step).
    let mut events: BTreeMap<usize, (usize, bool)> = BTreeMap::new();
    let mut rebases = 0;
    let (mut handles, mut max_keys) = (Size::new("memory handles", 0), 0);
    // Layers that start at the same offset with the same rows behave identically: predict each
    // (start, R, anchor) once and count it `n` times, so the work is bounded by the steps, not
    // layers x steps.
    let mut starts: BTreeMap<(usize, usize, usize), usize> = BTreeMap::new();
    for layer in 0..layers {
        let (anchor, r) = match g.kept_rows(layer) {
            Some(k) => (k, k + reserve.slide_room(global_r, k, g)),
            None => (g.capacity(), global_r),
        };
        let start = if stagger {
            anchor + layer * (r - anchor - g.max_ar()) / layers
        } else {
            anchor
        };
        *starts.entry((start, r, anchor)).or_default() += 1;
    }
    // With one start (no staggering) every rebase is its own step: no need to sum them by step.
    let single = starts.len() == 1;
    for ((start, r, anchor), n) in starts {
        // The window end is off + len (off < 0 once a sliding layer holds more than its anchor).
        let mut off = start as isize;
        // Window ends bound, per variant: (first, step, count) progressions.
        let mut keys: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        let mut record = |ar: usize, first: usize, step: usize, count: usize| {
            let list = keys.entry(ar).or_default();
            if count == 0 {
            } else if step == 1 || count == 1 {
                push_interval(list, (first, first + (count - 1) * step));
            } else {
                list.extend((0..count).map(|i| (first + i * step, first + i * step)));
            }
        };
        let mut base = 0;
        for s in segments {
            let mut i = 0;
            while i < s.count {
                // Step j rebases when off + len_j + ar > R, i.e. len_j > t (t >= len0 >= 0
                // while no rebase is due: the end never passes R).
                let t = (r - s.ar) as isize - off;
                let len_i = s.len0 + i * s.commit;
                let j = if len_i as isize > t {
                    i
                } else {
                    (t as usize - s.len0) / s.commit + 1
                };
                let upto = j.min(s.count);
                record(s.ar, (off + len_i as isize) as usize, s.commit, upto - i);
                if j >= s.count {
                    break;
                }
                let len_j = s.len0 + j * s.commit;
                let moved = n * 2 * h * len_j.min(anchor);
                rebases += n;
                if single {
                    copies.add(moved, 1, s.decode);
                } else {
                    let e = events.entry(base + j).or_insert((0, s.decode));
                    e.0 += moved;
                }
                off = anchor as isize - len_j as isize;
                record(s.ar, anchor, 1, 1);
                i = j + 1;
            }
            base += s.count;
        }
        let distinct: usize = keys.into_values().map(union_len).sum();
        handles = handles.plus_size(Size::new("memory handles", n * 4 * h).times(distinct));
        max_keys = max_keys.max(distinct);
    }
    for (rows, decode) in events.into_values() {
        copies.add(rows, 1, decode);
    }
    Ok((rebases, handles, max_keys))
}

/// Appends a closed interval, merged into the last one when they overlap or touch (a shift layer that
/// rebases every few steps records one interval per rebase, mostly adjacent: this keeps the list short).
fn push_interval(list: &mut Vec<(usize, usize)>, (lo, hi): (usize, usize)) {
    match list.last_mut() {
        Some(last) if lo <= last.1 + 1 && hi + 1 >= last.0 => {
            *last = (last.0.min(lo), last.1.max(hi));
        }
        _ => list.push((lo, hi)),
    }
}

/// Number of integers covered by a set of closed intervals.
fn union_len(mut v: Vec<(usize, usize)>) -> usize {
    v.sort_unstable();
    let mut total = 0;
    let mut current: Option<(usize, usize)> = None;
    for (lo, hi) in v {
        current = match current {
            Some((a, b)) if lo <= b + 1 => Some((a, b.max(hi))),
            Some((a, b)) => {
                total += b - a + 1;
                Some((lo, hi))
            }
            None => Some((lo, hi)),
        };
    }
    total + current.map_or(0, |(a, b)| b - a + 1)
}

/// Graph IO buffers of one AR-n variant (besides the K/V tensors, which live in the region).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GraphIo {
    pub ar: usize,
    /// `input_ids [1, n]` i32: n x 4 bytes.
    pub input_ids_bytes: usize,
    /// `positions [1, n]` i32: n x 4 bytes.
    pub positions_bytes: usize,
    /// `attention_mask [1, 1, n, S]`, plus `attention_mask_w{W} [1, 1, n, W - 1 + n]` per distinct
    /// sliding window: u16 (2 bytes) for a fixed-point cache, f32 (4 bytes) for f16/f32 caches.
    pub mask_bytes: usize,
    /// `logits [1, n, vocab]` f32: n x vocab x 4 bytes.
    pub logits_bytes: usize,
    pub total_bytes: usize,
}

/// The IO buffers of every AR variant of `geometry` for a vocabulary of `vocab` tokens.
pub fn graph_io(geometry: &Geometry, vocab: usize) -> Result<Vec<GraphIo>, KvError> {
    let mask_elem = if geometry.dtype.is_fixed_point() {
        2
    } else {
        4
    };
    geometry
        .ar_variants
        .iter()
        .map(|&n| {
            let ids = Size::new("input_ids bytes", n).times(4).get()?;
            // The global mask [n, S] and one [n, W - 1 + n] per distinct sliding window.
            let mask = geometry
                .distinct_windows()
                .into_iter()
                .fold(Size::new("mask bytes", geometry.context), |sum, w| {
                    sum.plus(w - 1 + n)
                })
                .times(n)
                .times(mask_elem)
                .get()?;
            let logits = Size::new("logits bytes", n).times(vocab).times(4).get()?;
            Ok(GraphIo {
                ar: n,
                input_ids_bytes: ids,
                positions_bytes: ids,
                mask_bytes: mask,
                logits_bytes: logits,
                total_bytes: Size::new("graph IO bytes", ids)
                    .times(2)
                    .plus(mask)
                    .plus(logits)
                    .get()?,
            })
        })
        .collect()
}

/// One line of `htpkv budget`: a config with one strategy. Field names are the JSON field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetReport {
    /// The config file.
    pub config: String,
    pub model: String,
    /// `shift`, `conveyor`, `smart_mask` or `naive`.
    pub update: String,
    /// `shift` only: the reservation as written (`2x`, `1.5x`, `3070`, `+64`).
    pub reserve: Option<String>,
    /// `shift` only: layers staggered.
    pub stagger: bool,
    pub context: usize,
    pub ar: Vec<usize>,
    pub dtype: String,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// B = layers x kv_heads x 2.
    pub buffers: usize,
    /// Bytes of one token in one buffer: head_dim x element size.
    pub row_bytes: usize,
    /// B x row_bytes.
    pub kv_bytes_per_token: usize,
    /// Tokens the cache holds: S - min(ar).
    pub capacity_tokens: usize,
    /// Rows per buffer of a global layer: `shift` R, `conveyor` S (the stride between buffers),
    /// `smart_mask`/`naive` W_max = S - min(ar) (the window slots; their output staging rows are in
    /// `region_rows`). A sliding layer's buffers are smaller (`region_bytes_all_global`).
    pub reserve_rows: usize,
    /// reserve_rows x row_bytes.
    pub buffer_bytes: usize,
    pub region_rows: usize,
    /// Exactly what the KV manager allocates (static cross K/V included).
    pub region_bytes: usize,
    /// The same region with every layer global: a sliding layer's buffers keep only its last
    /// W - 1 + max(ar) rows plus the strategy's slack, so the saving is the difference.
    pub region_bytes_all_global: usize,
    /// Static cross-attention K/V (`kv.cross`): E rows per buffer, in the region; 0 without.
    pub cross_bytes: usize,
    pub graph_io: Vec<GraphIo>,
    /// Sum of graph_io totals.
    pub graph_io_bytes: usize,
    /// region_bytes + graph_io_bytes.
    pub total_bytes: usize,
    /// The run the copy/rebase/handle figures are for.
    pub run: Run,
    /// Decode-step rows copied / decode steps.
    pub rows_copied_per_token: f64,
    /// The most rows copied by one step of the run.
    pub worst_step_rows_copied: usize,
    pub rows_copied: usize,
    pub bytes_copied: usize,
    pub worst_step_bytes_copied: usize,
    /// Rebases over the run (per layer for `shift`; relayouts for strided slot layouts).
    pub rebases_per_context: usize,
    /// Distinct memory handles a QNN HTP backend registers over the run.
    pub handles: usize,
    /// Distinct (window offset, variant) bindings of the busiest buffer.
    pub max_window_offsets_per_buffer: usize,
    /// Layers with a sliding attention window (`model.sliding_window`, `model.global_every`).
    pub sliding_layers: usize,
    /// K/V bytes one decode step (AR-min(ar)) binds as past inputs: S - n rows per buffer of a
    /// global layer, W - 1 of a sliding one. What the graph reads from the region every step.
    pub past_bytes_per_decode_step: usize,
    /// The same with every layer global: the saving of the sliding layers is the difference.
    pub past_bytes_per_decode_step_all_global: usize,
}

/// K/V bytes of the past inputs of one AR-`ar` step of `g` ([`BudgetReport::past_bytes_per_decode_step`]).
pub fn past_bytes_per_step(g: &Geometry, ar: usize) -> Result<usize, KvError> {
    (0..g.layers)
        .try_fold(Size::new("past bytes per step", 0), |sum, l| {
            let layer = Size::new("past bytes per step", g.past_rows(l, ar))
                .times(2 * g.kv_heads)
                .times(g.row_bytes());
            Ok(sum.plus_size(layer))
        })?
        .get()
}

/// The budget of `config` with strategy `update`, for the full-context run after a prefill of
/// `prefill` tokens.
pub fn report(
    config: &Config,
    update: Update,
    prefill: usize,
) -> Result<BudgetReport, BudgetError> {
    let spec = config.cache_spec_for(update);
    let g = &spec.geometry;
    let region_bytes = spec.region_bytes()?;
    let cross_bytes = match &spec.cross {
        Some(c) => c.region_bytes(g)?,
        None => 0,
    };
    let self_bytes = CacheSpec {
        cross: None,
        ..spec.clone()
    }
    .region_bytes()?;
    let all_global = Geometry {
        windows: Vec::new(),
        ..g.clone()
    };
    let region_bytes_all_global = CacheSpec {
        geometry: all_global.clone(),
        ..spec.clone()
    }
    .region_bytes()?;
    let run = Run::full_context(g, prefill)?;
    let p = predict(&spec, &run)?;
    let reserve_rows = match spec.strategy {
        Strategy::Shift { reserve, .. } => reserve.rows(g)?,
        Strategy::Conveyor => g.context,
        Strategy::SmartMask | Strategy::Naive => g.max_window(),
    };
    let io = graph_io(g, config.model.vocab)?;
    let io_bytes = io
        .iter()
        .fold(Size::new("graph IO bytes", 0), |sum, i| {
            sum.plus(i.total_bytes)
        })
        .get()?;
    let total_bytes = Size::new("region and graph IO bytes", region_bytes)
        .plus(io_bytes)
        .get()?;
    Ok(BudgetReport {
        config: config.origin.display().to_string(),
        model: config.model.name.clone(),
        update: update.name().into(),
        reserve: (update == Update::Shift).then(|| config.kv.reserve.to_string()),
        stagger: update == Update::Shift && config.kv.stagger,
        context: g.context,
        ar: g.ar_variants.clone(),
        dtype: g.dtype.name().into(),
        layers: g.layers,
        kv_heads: g.kv_heads,
        head_dim: g.head_dim,
        buffers: g.buffers(),
        row_bytes: g.row_bytes(),
        kv_bytes_per_token: g.kv_bytes_per_token(),
        capacity_tokens: g.capacity(),
        reserve_rows,
        buffer_bytes: Size::new("bytes per buffer", reserve_rows)
            .times(g.row_bytes())
            .get()?,
        region_rows: self_bytes / g.row_bytes(),
        region_bytes,
        region_bytes_all_global,
        cross_bytes,
        graph_io: io,
        graph_io_bytes: io_bytes,
        total_bytes,
        run,
        rows_copied_per_token: p.rows_copied_per_token(),
        worst_step_rows_copied: p.worst_step_rows_copied,
        rows_copied: p.rows_copied,
        bytes_copied: p.bytes_copied,
        worst_step_bytes_copied: p.worst_step_bytes_copied,
        rebases_per_context: p.rebases,
        handles: p.handles,
        max_window_offsets_per_buffer: p.max_window_offsets_per_buffer,
        sliding_layers: g.windows.iter().flatten().count(),
        past_bytes_per_decode_step: past_bytes_per_step(g, g.min_ar())?,
        past_bytes_per_decode_step_all_global: past_bytes_per_step(&all_global, g.min_ar())?,
    })
}

/// The region of `config` with strategy `update` at context `context` (None when the KV manager
/// refuses that context, e.g. a fixed `shift` row count too small for it).
pub fn region_at(config: &Config, update: Update, context: usize) -> Option<usize> {
    let mut spec = config.cache_spec_for(update);
    spec.geometry.context = context;
    spec.region_bytes().ok()
}

/// The smallest context the config's AR variants allow: min(ar) + max(ar) (and more than max(ar)).
pub fn min_context(config: &Config) -> usize {
    let g = config.geometry();
    (g.min_ar() + g.max_ar()).max(g.max_ar() + 1).max(2)
}

/// The largest context whose exact region fits in `budget` bytes with strategy `update`, and that
/// region's size; None when even the smallest context does not fit. Binary search on
/// [`region_at`], which grows with the context.
pub fn fit_context(config: &Config, update: Update, budget: usize) -> Option<(usize, usize)> {
    let ok = |s: usize| region_at(config, update, s).filter(|&b| b <= budget);
    let lo = min_context(config);
    let mut best = (lo, ok(lo)?);
    // Grow until the region no longer fits, then bisect (good, bad).
    let mut bad = lo;
    loop {
        bad = bad.saturating_mul(2);
        match ok(bad) {
            Some(bytes) if bad < usize::MAX / 4 => best = (bad, bytes),
            _ => break,
        }
    }
    let mut good = best.0;
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        match ok(mid) {
            Some(bytes) => {
                good = mid;
                best = (mid, bytes);
            }
            None => bad = mid,
        }
    }
    Some(best)
}

/// What B beams cost on one cache (`htpkv budget --beams B`): the prompt (the run's prefill) held once
/// and each beam's own rows after it, against B full caches each holding the prompt and its beam.
/// The length is the most each beam can generate when every step appends (the pointer-shift
/// strategies; `smart_mask` and `naive` also reuse rows freed by reorders, so they go further):
/// `tokens_per_beam = (capacity - prompt) / beams`. Field names are the JSON field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BeamBudget {
    pub beams: usize,
    pub prompt_tokens: usize,
    pub tokens_per_beam: usize,
    /// prompt + beams x tokens_per_beam, and x kv_bytes_per_token.
    pub shared_rows: usize,
    pub shared_kv_bytes: usize,
    /// beams x (prompt + tokens_per_beam), and x kv_bytes_per_token.
    pub independent_rows: usize,
    pub independent_kv_bytes: usize,
    /// One region (the config's) against beams x region.
    pub shared_region_bytes: usize,
    pub independent_region_bytes: usize,
}

/// The [`BeamBudget`] of `beams` beams on the cache `report` describes.
pub fn beam_budget(report: &BudgetReport, beams: usize) -> Result<BeamBudget, BudgetError> {
    let max = kv_manager::beam::MAX_BEAMS;
    let refuse = |reason: String| BudgetError::Beams { beams, reason };
    if beams == 0 || beams > max {
        return Err(refuse(format!("must be between 1 and {max}")));
    }
    let prompt = report.run.prefill;
    let tokens_per_beam = report.capacity_tokens.saturating_sub(prompt) / beams;
    if tokens_per_beam == 0 {
        return Err(refuse(format!(
            "the cache holds {} tokens: after a prompt of {prompt} there is no room for one token per beam",
            report.capacity_tokens
        )));
    }
    let rows = |what: &'static str, n: usize| Size::new(what, n);
    let shared_rows = prompt + beams * tokens_per_beam;
    let independent_rows = rows("beam rows", prompt + tokens_per_beam)
        .times(beams)
        .get()?;
    let per_token = report.kv_bytes_per_token;
    Ok(BeamBudget {
        beams,
        prompt_tokens: prompt,
        tokens_per_beam,
        shared_rows,
        shared_kv_bytes: rows("beam bytes", shared_rows).times(per_token).get()?,
        independent_rows,
        independent_kv_bytes: rows("beam bytes", independent_rows)
            .times(per_token)
            .get()?,
        shared_region_bytes: report.region_bytes,
        independent_region_bytes: rows("beam regions", report.region_bytes)
            .times(beams)
            .get()?,
    })
}

/// The largest byte size [`parse_byte_size`] accepts: 1 PiB, more memory than any device has (and
/// more than the largest region a valid geometry of a real model needs).
pub const MAX_BYTE_SIZE: usize = 1 << 50;

/// Parses a byte size (at most [`MAX_BYTE_SIZE`]): a number (fractions allowed) and an optional suffix `B`, `KB`/`K`, `MB`/`M`,
/// `GB`/`G`, `TB`/`T`, `PB`/`P` (powers of 1000) or `KiB`, `MiB`, `GiB`, `TiB`, `PiB` (powers of
/// 1024), case-insensitive.
pub fn parse_byte_size(text: &str) -> Result<usize, BudgetError> {
    let bad = || BudgetError::ByteSize {
        text: text.to_string(),
    };
    let t = text.trim().replace('_', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let unit: u128 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "p" | "pb" => 1_000_000_000_000_000,
        "pib" => 1 << 50,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
    let bytes = if let Ok(n) = number.parse::<u128>() {
        n.checked_mul(unit).ok_or_else(bad)?
    } else {
        let f: f64 = number.parse().map_err(|_| bad())?;
        (f * unit as f64).floor() as u128
    };
    if bytes > MAX_BYTE_SIZE as u128 {
        return Err(BudgetError::ByteSizeTooLarge {
            text: text.to_string(),
            maximum: MAX_BYTE_SIZE,
        });
    }
    usize::try_from(bytes).map_err(|_| bad())
}

/// A human-readable size in binary units, e.g. `2.00 GiB`.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_manager::{HostAllocator, KvCache, Reserve};
    use quant::DataType;

    fn simulate(spec: &CacheSpec, run: &Run) -> Counters {
        let mut cache = KvCache::new(spec.clone(), &HostAllocator { prefault: false }).unwrap();
        for step in run.schedule(&spec.geometry) {
            cache.plan(step.ar).unwrap();
            cache.commit(step.commit).unwrap();
        }
        *cache.counters()
    }

    #[test]
    fn union_len_counts_integers() {
        assert_eq!(union_len(vec![]), 0);
        assert_eq!(union_len(vec![(3, 5), (1, 2), (9, 9), (4, 7)]), 8);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_byte_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_byte_size("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_byte_size("4096").unwrap(), 4096);
        assert_eq!(parse_byte_size("2gib").unwrap(), 2 << 30);
        for bad in ["", "MiB", "12 parsecs", "1.2.3GB", "-1"] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn predictions_match_small_caches() {
        let geometries = [
            Geometry::new(3, 2, 4, 24, &[1], DataType::U8),
            Geometry::new(3, 2, 4, 40, &[1, 8], DataType::U16),
            Geometry::new(2, 1, 2, 30, &[3, 5], DataType::F32),
            // Sliding layers: smaller buffers, their own rebases and naive copies.
            Geometry::new(3, 2, 4, 40, &[1, 8], DataType::U16).with_windows(&[0, 2], 12),
            Geometry::new(4, 1, 2, 32, &[1], DataType::U8).with_windows(&[1, 2, 3], 5),
        ];
        let strategies = [
            Strategy::SHIFT_2X,
            Strategy::Shift {
                reserve: Reserve::Factor(1.5),
                stagger: true,
            },
            Strategy::Shift {
                reserve: Reserve::Spare(9),
                stagger: false,
            },
            Strategy::Conveyor,
            Strategy::SmartMask,
            Strategy::Naive,
        ];
        for g in geometries {
            for strategy in strategies {
                for prefill in [0, 1, 7, 13] {
                    let spec = CacheSpec::for_simulation(g.clone(), strategy);
                    let Ok(run) = Run::full_context(&g, prefill) else {
                        continue;
                    };
                    if g.has_windows() && strategy == Strategy::SmartMask {
                        assert!(spec.region_bytes().is_err());
                        continue;
                    }
                    for run in [
                        run,
                        Run {
                            decode_steps: run.decode_steps / 2,
                            ..run
                        },
                    ] {
                        let p = predict(&spec, &run).unwrap();
                        let c = simulate(&spec, &run);
                        assert!(
                            p.mismatches(&c).is_empty(),
                            "{g:?} {strategy:?} {run:?}: {:?}",
                            p.mismatches(&c)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn strided_slot_layouts_are_predicted_too() {
        for (granularity, k_layout) in [
            (Granularity::PerLayer, KLayout::Rows),
            (Granularity::PerHead, KLayout::Transposed),
            (Granularity::PerLayer, KLayout::Transposed),
        ] {
            let mut g = Geometry::new(2, 2, 4, 33, &[1, 8], DataType::U8);
            g.granularity = granularity;
            g.k_layout = k_layout;
            for strategy in [Strategy::SmartMask, Strategy::Naive] {
                let spec = CacheSpec::for_simulation(g.clone(), strategy);
                for prefill in [0, 5, 8, 20, 24, 27, 32] {
                    let run = Run::full_context(&g, prefill).unwrap();
                    let p = predict(&spec, &run).unwrap();
                    let c = simulate(&spec, &run);
                    assert!(
                        p.mismatches(&c).is_empty(),
                        "{g:?} {strategy:?} {run:?}: {:?}",
                        p.mismatches(&c)
                    );
                }
            }
        }
    }

    #[test]
    fn runs_that_do_not_fit_are_refused() {
        let g = Geometry::new(1, 1, 2, 16, &[1, 4], DataType::U8);
        assert_eq!(Run::max_decode_steps(&g, 0).unwrap(), 15);
        assert_eq!(Run::max_decode_steps(&g, 6).unwrap(), 9);
        // 4 chunks of 4 = 16 rows > 15.
        assert!(Run::max_decode_steps(&g, 13).is_err());
        let run = Run {
            prefill: 6,
            decode_steps: 10,
        };
        assert!(matches!(run.check(&g), Err(BudgetError::RunTooLong { .. })));
    }

    #[test]
    fn counts_near_usize_max_are_refused_before_any_arithmetic() {
        let g = Geometry::new(1, 1, 2, 16, &[1, 4], DataType::U8);
        for (prefill, decode_steps) in [(usize::MAX, 0), (usize::MAX, 1), (0, usize::MAX)] {
            let run = Run {
                prefill,
                decode_steps,
            };
            assert!(matches!(run.check(&g), Err(BudgetError::RunTooLong { .. })));
            let spec = CacheSpec::for_simulation(g.clone(), Strategy::Naive);
            assert!(predict(&spec, &run).is_err());
        }
        assert!(Run::max_decode_steps(&g, usize::MAX).is_err());
    }

    #[test]
    fn run_totals_beyond_64_bits_are_an_error_naming_the_quantity() {
        let g = Geometry::new(32, 32, 128, kv_manager::MAX_CONTEXT, &[1], DataType::U16);
        let spec = CacheSpec::for_simulation(g.clone(), Strategy::Naive);
        let run = Run::full_context(&g, 0).unwrap();
        assert_eq!(
            predict(&spec, &run),
            Err(BudgetError::Kv(KvError::SizeOverflow {
                what: "bytes copied over the run"
            }))
        );
        // Rows alone still fit: 2048 buffers x (S - 1) rows x (S - 1) steps.
        let w = kv_manager::MAX_CONTEXT - 1;
        let spec = CacheSpec::for_simulation(g.clone(), Strategy::SmartMask);
        assert_eq!(predict(&spec, &run).unwrap().rows_copied, 2048 * w);
    }

    #[test]
    fn byte_sizes_have_a_limit() {
        assert_eq!(parse_byte_size("1PiB").unwrap(), MAX_BYTE_SIZE);
        for text in [
            "1.5PiB",
            "18446744073709551615",
            "1e300",
            "99999999999999999999999999999TB",
        ] {
            let e = parse_byte_size(text).unwrap_err();
            assert!(
                matches!(
                    e,
                    BudgetError::ByteSizeTooLarge { .. } | BudgetError::ByteSize { .. }
                ),
                "{text}: {e}"
            );
        }
        assert_eq!(
            parse_byte_size("2PB").unwrap_err().to_string(),
            "byte size `2PB` is above the limit of 1 PiB (1125899906842624 bytes)"
        );
    }

    /// The closed form against the real beam tracker: B beams that never reorder, each stepping
    /// `tokens_per_beam` times after the prompt, hold exactly `shared_rows` rows in one cache.
    #[test]
    fn beam_budget_matches_the_beam_tracker() {
        let text = "model: { name: t, layers: 2, heads: 4, kv_heads: 2, head_dim: 4, vocab: 32, dim: 16 }\n\
                    graph: { context: 64, ar: [1, 4] }\n\
                    kv: { dtype: u8, k_layout: rows, tensors: per_head, update: conveyor }\n";
        let config = Config::from_yaml(text, std::path::Path::new("t.yaml")).unwrap();
        let r = report(&config, Update::Conveyor, 7).unwrap();
        let b = beam_budget(&r, 4).unwrap();
        assert_eq!(b.tokens_per_beam, (63 - 7) / 4);
        let mut cache = KvCache::new(
            config.cache_spec_for(Update::Conveyor),
            &HostAllocator::default(),
        )
        .unwrap();
        for _ in 0..7 {
            cache.plan(1).unwrap();
            cache.commit(1).unwrap();
        }
        let mut kv = kv_manager::BeamKv::new(&cache, 4).unwrap();
        for _ in 0..b.tokens_per_beam {
            kv.plan(&mut cache, 4, &[0, 1, 2, 3]).unwrap();
            kv.commit(&mut cache).unwrap();
        }
        assert_eq!(
            (kv.rows_held(), cache.len()),
            (b.shared_rows, b.shared_rows)
        );
        assert_eq!(kv.rows_independent(), b.independent_rows);
        assert_eq!(b.shared_kv_bytes, b.shared_rows * r.kv_bytes_per_token);
        assert_eq!(b.independent_region_bytes, 4 * r.region_bytes);
        assert!(beam_budget(&r, 0).is_err());
        let e = beam_budget(&r, 57).unwrap_err().to_string();
        assert!(e.contains("no room for one token per beam"), "{e}");
    }
}
