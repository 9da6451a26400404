//! B beams (or B independent samples) sharing one cache: the prompt's rows stored once, each beam's
//! own rows in the same window, and a mask per query row (tree attention).
//!
//! ## Design
//! Every strategy's mask already decides which window rows each query row sees, so B beams live in
//! ONE cache: the prompt's tokens `0..prompt` once, then each beam's rows wherever they were written.
//! A beam step is one AR-n step (n >= the number of stepping beams) whose query row q belongs to beam
//! `beams[q]`: mask row q shows the prompt rows, beam q's own rows and its own new column only, and its
//! position is `prompt + beam length` (plus the cache's position offset). Attention does not depend on
//! where a row lies in the window, only on the mask and the (already rotated) K/V rows, so each beam sees
//! exactly what a cache of its own would hold.
//!
//! [`BeamKv::reorder`]`(beam_idx)` (new beam i continues old beam `beam_idx[i]`, OpenVINO's `beam_idx`)
//! only remaps the row lists: rows shared by several beams stay shared, rows no beam reads any more are
//! freed, and **no row is copied** ([`BeamCounters::rows_copied_by_reorders`] measures it from the
//! cache's own copy counter and is 0). Freed rows are reused where it costs nothing extra:
//! - `smart_mask` and `naive` copy every new row into its slot anyway, so a new row goes into a freed
//!   slot (a direct row copy instead of the append copy) and the cache grows only when no slot is free.
//! - `shift` and `conveyor` write new rows in place (zero copies); reusing a freed row would cost a copy,
//!   so they only append. Freed rows at the end of the cache are given back by [`BeamKv::rollback`];
//!   others stay until the beams end ([`BeamKv::finish`]). A search of T steps over B beams needs
//!   `prompt + B x T` rows there, against about `prompt + (live rows)` with the slot strategies.
//!
//! Every layout (per-head or per-layer tensors, K rows or transposed) works, since rows are reached
//! through the cache's own token addressing. The limits are typed errors: a step with more beams than
//! the AR variant has rows ([`BeamError::TooManyBeams`]), a step past the capacity (the cache's
//! `ContextFull`), and a cache moved by someone else between steps ([`BeamError::CacheMoved`]).

use crate::cache::{RowRef, copy_row};
use crate::{KvCache, KvError, Plan, Strategy};

/// The most beams one [`BeamKv`] tracks (a bound on every per-beam table).
pub const MAX_BEAMS: usize = 256;

/// Why a beam operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BeamError {
    #[error("beam count {count} must be between 1 and {MAX_BEAMS}")]
    BeamCount { count: usize },
    #[error("beam index {index} is out of range: there are {beams} beams")]
    BeamIndex { index: usize, beams: usize },
    #[error("beam {index} is listed twice in one step")]
    DuplicateBeam { index: usize },
    #[error(
        "{beams} beams do not fit one AR-{ar} step (one query row per beam): use a variant with at \
         least {beams} rows, or step the beams one at a time"
    )]
    TooManyBeams { beams: usize, ar: usize },
    #[error("no beam step is planned")]
    NothingPlanned,
    #[error(
        "beams cannot share a cache with sliding-window layers (layer {layer}, window {window}): \
         such a layer binds the last W - 1 cache rows, but a beam's own rows are interleaved with \
         the other beams' rows, so its last W positions are not the cache's last rows"
    )]
    SlidingWindow { layer: usize, window: usize },
    #[error(
        "the cache holds {found} tokens but the beams expect {expected}: it was changed outside \
         the beam tracker"
    )]
    CacheMoved { expected: usize, found: usize },
    #[error(transparent)]
    Cache(#[from] KvError),
}

impl BeamError {
    /// The error's kind: `bad_option` for a beam count out of range, the cache's own kind for a
    /// cache error, `kv` otherwise.
    pub fn kind(&self) -> &'static str {
        match self {
            BeamError::BeamCount { .. } => "bad_option",
            BeamError::Cache(e) => e.kind(),
            _ => "kv",
        }
    }
}

/// What the beams did (totals since [`BeamKv::new`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeamCounters {
    /// Beam steps committed and the rows they wrote.
    pub steps: usize,
    pub rows_written: usize,
    /// New rows written into a freed row instead of appended (`smart_mask`, `naive`).
    pub rows_reused: usize,
    /// Rows that no beam read any more after a reorder or a rollback.
    pub rows_freed: usize,
    /// Rows the reorders copied (measured from the cache's copy counter; 0 by design).
    pub rows_copied_by_reorders: usize,
    /// Reorders done.
    pub reorders: usize,
}

/// The step in progress: which beam each query row serves and where its row goes.
#[derive(Debug, Clone)]
struct Pending {
    rows: Vec<usize>,
    /// Token index each query row's new row gets: the first `append` are `len..len + append`.
    slots: Vec<usize>,
    append: usize,
}

/// B beams over one [`KvCache`] (module docs). The tracker does not own the cache: every call takes it,
/// and between beam calls nobody else may plan, commit or roll it back.
#[derive(Debug, Clone)]
pub struct BeamKv {
    prompt: usize,
    /// Each beam's own rows (cache token indices), in position order.
    beams: Vec<Vec<usize>>,
    /// Readers of every cache token `>= prompt` (index `t - prompt`); 0 = free.
    readers: Vec<u32>,
    free: Vec<usize>,
    reuse: bool,
    /// The cache length the beams expect.
    len: usize,
    plan: Plan,
    pending: Option<Pending>,
    counters: BeamCounters,
}

impl BeamKv {
    /// `count` beams sharing the cache's current tokens as their prompt.
    pub fn new(cache: &KvCache, count: usize) -> Result<BeamKv, BeamError> {
        if count == 0 || count > MAX_BEAMS {
            return Err(BeamError::BeamCount { count });
        }
        let g = &cache.spec().geometry;
        if let Some(layer) = (0..g.layers).find(|&l| g.layer_window(l).is_some()) {
            let window = g.layer_window(layer).unwrap_or(0);
            return Err(BeamError::SlidingWindow { layer, window });
        }
        Ok(BeamKv {
            prompt: cache.len(),
            beams: vec![Vec::new(); count],
            readers: Vec::new(),
            free: Vec::new(),
            reuse: matches!(cache.spec().strategy, Strategy::SmartMask | Strategy::Naive),
            len: cache.len(),
            plan: Plan::default(),
            pending: None,
            counters: BeamCounters::default(),
        })
    }

    /// Number of beams.
    pub fn count(&self) -> usize {
        self.beams.len()
    }

    /// Prompt tokens (shared by every beam).
    pub fn prompt_len(&self) -> usize {
        self.prompt
    }

    /// Tokens of beam `beam` after the prompt.
    pub fn beam_len(&self, beam: usize) -> usize {
        self.beams[beam].len()
    }

    /// The cache token indices beam `beam` reads, in position order (prompt first).
    pub fn rows(&self, beam: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.prompt).chain(self.beams[beam].iter().copied())
    }

    /// Totals.
    pub fn counters(&self) -> &BeamCounters {
        &self.counters
    }

    /// Rows the cache holds for the beams now (prompt once, each live row once).
    pub fn rows_held(&self) -> usize {
        self.prompt + self.readers.iter().filter(|&&r| r > 0).count()
    }

    /// Rows read by more than one beam now (the prompt's included when there are several beams).
    pub fn rows_shared(&self) -> usize {
        let prompt = if self.beams.len() > 1 { self.prompt } else { 0 };
        prompt + self.readers.iter().filter(|&&r| r > 1).count()
    }

    /// Rows B independent caches would hold for the same beams.
    pub fn rows_independent(&self) -> usize {
        self.beams.iter().map(|b| self.prompt + b.len()).sum()
    }

    /// Plans one step on the AR-`ar` graph for beams `beams` (query row q is beam `beams[q]`; rows
    /// past `beams.len()` are padding that sees only itself). Returns the plan with the beams' mask
    /// and positions.
    pub fn plan(
        &mut self,
        cache: &mut KvCache,
        ar: usize,
        beams: &[usize],
    ) -> Result<&Plan, BeamError> {
        self.pending = None;
        self.check_len(cache)?;
        if beams.is_empty() {
            return Err(BeamError::BeamCount { count: 0 });
        }
        if beams.len() > ar {
            return Err(BeamError::TooManyBeams {
                beams: beams.len(),
                ar,
            });
        }
        for (q, &b) in beams.iter().enumerate() {
            if b >= self.beams.len() {
                return Err(BeamError::BeamIndex {
                    index: b,
                    beams: self.beams.len(),
                });
            }
            if beams[..q].contains(&b) {
                return Err(BeamError::DuplicateBeam { index: b });
            }
        }
        self.plan.clone_from(cache.plan(ar)?);
        let k = beams.len();
        let reused = if self.reuse {
            k.min(self.free.len())
        } else {
            0
        };
        let append = k - reused;
        let mut slots: Vec<usize> = (self.len..self.len + append).collect();
        slots.extend(self.free.iter().rev().take(reused));
        self.fill_mask(beams);
        self.pending = Some(Pending {
            rows: beams.to_vec(),
            slots,
            append,
        });
        Ok(&self.plan)
    }

    fn check_len(&self, cache: &KvCache) -> Result<(), BeamError> {
        if cache.len() != self.len {
            return Err(BeamError::CacheMoved {
                expected: self.len,
                found: cache.len(),
            });
        }
        Ok(())
    }

    /// The mask rows and positions of a step: beam rows see the prompt, their own rows and their own
    /// new column; padding rows see only their own column.
    fn fill_mask(&mut self, beams: &[usize]) {
        let plan = &mut self.plan;
        let (s, w, past) = (plan.context, plan.window(), plan.past_len);
        let offset = plan.first_position - past;
        let column = |t: usize| if plan.left_padded { w - past + t } else { t };
        plan.mask.fill(f32::NEG_INFINITY);
        for q in 0..plan.ar {
            let row = &mut plan.mask[q * s..(q + 1) * s];
            row[w + q] = 0.0;
            let Some(&b) = beams.get(q) else { continue };
            for t in (0..self.prompt).chain(self.beams[b].iter().copied()) {
                row[column(t)] = 0.0;
            }
            plan.positions[q] = (offset + self.prompt + self.beams[b].len()) as i32;
        }
    }

    /// The plan of the step in progress.
    pub fn pending_plan(&self) -> Option<&Plan> {
        self.pending.as_ref().map(|_| &self.plan)
    }

    /// Keeps the new row of every stepping beam (after the graph ran on the plan).
    pub fn commit(&mut self, cache: &mut KvCache) -> Result<(), BeamError> {
        let pending = self.pending.take().ok_or(BeamError::NothingPlanned)?;
        self.check_len(cache)?;
        if cache.pending_plan().is_none() {
            return Err(BeamError::NothingPlanned);
        }
        // Reused rows first (direct copies from the step's outputs), then the cache appends the
        // first `append` query rows itself.
        let g = cache.spec().geometry.clone();
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let mut copies: Vec<(RowRef, RowRef)> = Vec::new();
        for q in pending.append..pending.rows.len() {
            for buffer in 0..g.buffers() {
                copies.push((
                    new_row(&self.plan, &g, buffer, q),
                    cache.token_row(buffer, pending.slots[q]),
                ));
            }
        }
        let region = cache.region_mut();
        for &(src, dst) in &copies {
            copy_row(region, src, dst, d, e);
        }
        cache.add_copy(copies.len() * g.row_bytes());
        cache.commit(pending.append)?;
        let reused = pending.rows.len() - pending.append;
        self.free.truncate(self.free.len() - reused);
        self.len += pending.append;
        self.readers.resize(self.len - self.prompt, 0);
        for (&b, &slot) in pending.rows.iter().zip(&pending.slots) {
            self.beams[b].push(slot);
            self.readers[slot - self.prompt] = 1;
        }
        self.counters.steps += 1;
        self.counters.rows_written += pending.rows.len();
        self.counters.rows_reused += reused;
        Ok(())
    }

    /// New beam i continues old beam `beam_idx[i]` (its rows shared, never copied); the beam count
    /// becomes `beam_idx.len()`. Rows no beam reads any more are freed. Discards a planned step.
    pub fn reorder(&mut self, cache: &mut KvCache, beam_idx: &[usize]) -> Result<(), BeamError> {
        if beam_idx.is_empty() || beam_idx.len() > MAX_BEAMS {
            return Err(BeamError::BeamCount {
                count: beam_idx.len(),
            });
        }
        if let Some(&index) = beam_idx.iter().find(|&&i| i >= self.beams.len()) {
            return Err(BeamError::BeamIndex {
                index,
                beams: self.beams.len(),
            });
        }
        self.check_len(cache)?;
        self.pending = None;
        let copied_before = cache.counters().bytes_copied;
        self.beams = beam_idx.iter().map(|&i| self.beams[i].clone()).collect();
        self.recount();
        let row_bytes = cache.spec().geometry.kv_bytes_per_token();
        self.counters.rows_copied_by_reorders +=
            (cache.counters().bytes_copied - copied_before) / row_bytes.max(1);
        self.counters.reorders += 1;
        Ok(())
    }

    /// Truncates every beam to at most `len` tokens after the prompt; frees the rows dropped, and
    /// gives trailing free rows back to the cache where that costs no copy (`shift`, `conveyor`).
    pub fn rollback(&mut self, cache: &mut KvCache, len: usize) -> Result<(), BeamError> {
        self.check_len(cache)?;
        self.pending = None;
        for beam in &mut self.beams {
            beam.truncate(len);
        }
        self.recount();
        if !self.reuse {
            let live = self
                .readers
                .iter()
                .rposition(|&r| r > 0)
                .map_or(0, |i| i + 1);
            cache.rollback(self.prompt + live)?;
            self.len = cache.len();
            self.readers.truncate(live);
            self.free.retain(|&t| t < self.len);
        }
        Ok(())
    }

    /// Ends the beams: the cache goes back to the prompt alone.
    pub fn finish(self, cache: &mut KvCache) -> Result<(), BeamError> {
        self.check_len(cache)?;
        cache.rollback(self.prompt)?;
        Ok(())
    }

    /// Recomputes the readers of every row and frees the rows no beam reads any more.
    fn recount(&mut self) {
        let before: Vec<bool> = self.readers.iter().map(|&r| r > 0).collect();
        self.readers.fill(0);
        for beam in &self.beams {
            for &t in beam {
                self.readers[t - self.prompt] += 1;
            }
        }
        for (i, was) in before.into_iter().enumerate() {
            if was && self.readers[i] == 0 {
                self.free.push(self.prompt + i);
                self.counters.rows_freed += 1;
            }
        }
    }
}

/// Where new row `q` of buffer `buffer` lies in the step's output bindings.
fn new_row(plan: &Plan, g: &crate::Geometry, buffer: usize, q: usize) -> RowRef {
    let tensor = g
        .buffer_tensor(buffer, crate::KvIo::New)
        .position(g.kv_heads);
    let head = if plan.heads_per_tensor > 1 {
        g.buffer_coords(buffer).1
    } else {
        0
    };
    let binding = plan.new_output(tensor);
    let e = plan.elem_bytes;
    let first = binding.element_offset(head, q, 0, e);
    RowRef {
        start: binding.offset + first,
        step: binding.element_offset(head, q, 1, e) - first,
    }
}
