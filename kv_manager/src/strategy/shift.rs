//! `shift` (ShiftPointer): each buffer reserves R rows; a layer's past windows end at its window
//! end `v1` and its outputs are bound right after, so a commit moves the end (a pointer shift).
//! When the next output would pass R, the layer's held rows move back to end at its anchor (a
//! rebase): W_max for a global layer, its kept rows K for a sliding one.

use super::{Cx, Layout, Predicted, RowRef, Rule, require_in_place, require_window_layout};
use crate::predict::{Copies, Segment};
use crate::size::MAX_RESERVE_ROWS;
use crate::{Geometry, KvError, Plan, Size};
use std::collections::{BTreeMap, HashMap};

/// The `shift` reservation: R rows per buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reserve {
    /// `f` times the largest window W = S - min(ar): R = W + floor((f - 1) * W).
    /// `2x` (R = 2W) never rebases within a context; for `ar: [1]` it is exactly 2(S - 1).
    Factor(f64),
    /// R = (S - min ar) + K: K spare rows after the largest window.
    Spare(usize),
    /// An explicit row count.
    Rows(usize),
}

impl Reserve {
    /// What [`Reserve`]'s `FromStr` accepts, for error messages.
    pub const EXPECTED: &'static str =
        "`2x`, `1.5x` (a factor >= 1 followed by x), a row count such as 3070, or `+K` spare rows";

    /// The spelling `FromStr` reads back: `2x`, `1.5x`, `+64`, `3070`.
    pub fn spelling(&self) -> String {
        match *self {
            Reserve::Factor(x) => format!("{x}x"),
            Reserve::Spare(k) => format!("+{k}"),
            Reserve::Rows(r) => r.to_string(),
        }
    }

    /// R for a geometry; [`KvError::ReserveTooLarge`] above [`MAX_RESERVE_ROWS`].
    pub fn rows(&self, geometry: &Geometry) -> Result<usize, KvError> {
        let w_max = geometry.max_window();
        // Each extra is compared with the limit before it is added, so nothing overflows or saturates.
        let extra = match *self {
            Reserve::Factor(f) => {
                let extra = ((f - 1.0).max(0.0) * (geometry.capacity() as f64)).floor();
                (extra <= MAX_RESERVE_ROWS as f64).then_some(extra as usize)
            }
            Reserve::Spare(k) => Some(k),
            Reserve::Rows(r) => return self.limit(Some(r)),
        };
        self.limit(extra.filter(|&e| e <= MAX_RESERVE_ROWS).map(|e| w_max + e))
    }

    /// The slide room (rows after the kept ones) of a sliding layer's buffer keeping `kept` rows,
    /// given the global R `global` (already checked): `f x` gives floor((f - 1) x kept), `+K` and a
    /// row count give the global buffer's room, and every buffer gets at least max(ar).
    pub fn slide_room(&self, global: usize, kept: usize, geometry: &Geometry) -> usize {
        let room = match *self {
            Reserve::Factor(f) => ((f - 1.0).max(0.0) * kept as f64).floor() as usize,
            Reserve::Spare(_) | Reserve::Rows(_) => global - geometry.max_window(),
        };
        room.max(geometry.max_ar())
    }

    fn limit(&self, rows: Option<usize>) -> Result<usize, KvError> {
        rows.filter(|&r| r <= MAX_RESERVE_ROWS)
            .ok_or_else(|| KvError::ReserveTooLarge {
                reserve: self.to_string(),
                maximum: MAX_RESERVE_ROWS,
            })
    }
}

impl std::fmt::Display for Reserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Debug keeps huge and tiny factors short (1e300x rather than 301 digits).
            Reserve::Factor(x) if x.abs() >= 1e15 => write!(f, "{x:?}x"),
            Reserve::Factor(x) => write!(f, "{x}x"),
            Reserve::Spare(k) => write!(f, "+{k}"),
            Reserve::Rows(r) => write!(f, "{r} rows"),
        }
    }
}

/// The one parser of reservations (configs' `kv.reserve`, strategy spellings such as
/// `shift-1.5x`): `Fx` a factor F >= 1 ([`Reserve::Factor`]), `+K` spare rows
/// ([`Reserve::Spare`]), or a bare row count ([`Reserve::Rows`]).
impl std::str::FromStr for Reserve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = || format!("invalid reserve `{s}`; expected {}", Reserve::EXPECTED);
        if let Some(f) = t.strip_suffix(['x', 'X']) {
            let f: f64 = f.trim().parse().map_err(|_| bad())?;
            if !f.is_finite() || f < 1.0 {
                return Err(bad());
            }
            return Ok(Reserve::Factor(f));
        }
        if let Some(k) = t.strip_prefix('+') {
            return k.trim().parse().map(Reserve::Spare).map_err(|_| bad());
        }
        t.parse().map(Reserve::Rows).map_err(|_| bad())
    }
}

/// The `shift` rule: R rows per buffer (the layout's); every buffer of a layer shares one window
/// end `v1` (row index inside the buffer). Held rows are `[v1 - (len - first_held), v1)`.
#[derive(Debug, Clone)]
pub(crate) struct Shift {
    layout: Layout,
    /// Per layer: where its window end starts (and returns to on a reset).
    start: Vec<usize>,
    /// Per layer: the window end.
    v1: Vec<usize>,
}

impl Shift {
    pub(crate) fn new(g: &Geometry, reserve: Reserve, stagger: bool) -> Result<Shift, KvError> {
        require_window_layout(g, "shift")?;
        require_in_place(g, "shift")?;
        let r = reserve.rows(g)?;
        let (w_max, max_ar) = (g.max_window(), g.max_ar());
        let minimum = w_max + max_ar;
        if r < minimum {
            return Err(KvError::ReserveTooSmall {
                reserve: r,
                minimum,
                max_window: w_max,
                max_ar,
            });
        }
        // A sliding layer's buffers keep K rows and get the same slide room rule.
        let per_buffer = (0..g.buffers()).map(|buf| {
            let layer = g.buffer_coords(buf).0;
            g.kept_rows(layer)
                .map_or(r, |k| k + reserve.slide_room(r, k, g))
        });
        let layout = Layout::packed(per_buffer.collect(), 0, 0)?;
        // Stagger: spread the layers' starting offsets over the slack that the largest step still
        // fits in, so their rebases fall on different steps.
        let start: Vec<usize> = (0..g.layers)
            .map(|l| {
                let (r, anchor) = (layout.rows[l * 2 * g.kv_heads], anchor(g, l));
                let slack = r - anchor - max_ar;
                if stagger {
                    anchor + l * slack / g.layers.max(1)
                } else {
                    anchor
                }
            })
            .collect();
        Ok(Shift {
            layout,
            v1: start.clone(),
            start,
        })
    }
}

/// Where a layer's window ends after a rebase (and starts, unstaggered): W_max for a global
/// layer, its kept rows K for a sliding layer.
fn anchor(g: &Geometry, layer: usize) -> usize {
    g.kept_rows(layer).unwrap_or(g.capacity())
}

impl Rule for Shift {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn handle_groups(&self, g: &Geometry) -> (usize, usize) {
        let r_max = self.layout.rows.iter().copied().max().unwrap_or(0);
        (g.layers, r_max + 1)
    }

    fn anchored_at_end(&self) -> bool {
        true
    }

    /// Rebases every layer whose next step would pass its R rows (or whose window would start
    /// before its buffer): its held rows (at most the kept ones) move to end at the anchor.
    fn prepare(&mut self, cx: &mut Cx<'_>, ar: usize) {
        let (g, rb) = (cx.g, cx.g.row_bytes());
        let per_layer = 2 * g.kv_heads;
        for (layer, end) in self.v1.iter_mut().enumerate() {
            let first = layer * per_layer;
            if *end + ar <= self.layout.rows[first] && *end >= g.past_rows(layer, ar) {
                continue;
            }
            let anchor = anchor(g, layer);
            let keep = cx.len.min(anchor).min(*end);
            for &base in &self.layout.base[first..first + per_layer] {
                let src = (base + *end - keep) * rb;
                let dst = (base + anchor - keep) * rb;
                cx.region.copy_within(src..src + keep * rb, dst);
            }
            *end = anchor;
            cx.moved.rebases += 1;
            cx.moved.bytes += per_layer * keep * rb;
        }
    }

    fn bind(&mut self, cx: &mut Cx<'_>, ar: usize, variant: usize) -> usize {
        let (g, rb) = (cx.g, cx.g.row_bytes());
        let per_layer = 2 * g.kv_heads;
        let plan = &mut *cx.plan;
        let mut new_handles = 0;
        for (layer, &end) in self.v1.iter().enumerate() {
            if cx.handles.mark(layer, end, variant) {
                new_handles += 2 * per_layer;
            }
            let past = g.past_rows(layer, ar);
            for &base in &self.layout.base[layer * per_layer..(layer + 1) * per_layer] {
                let row = base + end;
                plan.past_offsets.push((row - past) * rb);
                plan.new_offsets.push(row * rb);
            }
        }
        new_handles
    }

    fn commit(&mut self, _cx: &mut Cx<'_>, _ar: usize, accepted: usize) {
        self.v1.iter_mut().for_each(|v| *v += accepted);
    }

    /// A layer's window end moves back by the held tokens dropped (a sliding layer rolled back
    /// below its held rows, to 0 or with W = 1, keeps its end at its oldest held row).
    fn rollback(&mut self, cx: &mut Cx<'_>, len: usize) {
        for (v, &first) in self.v1.iter_mut().zip(cx.first_held) {
            *v -= cx.len - len.max(first);
        }
    }

    fn reset(&mut self) {
        self.v1.copy_from_slice(&self.start);
    }

    fn token_row(
        &self,
        g: &Geometry,
        _plan: &Plan,
        len: usize,
        buffer: usize,
        token: usize,
    ) -> RowRef {
        let end = self.v1[buffer / (2 * g.kv_heads)];
        RowRef {
            start: (self.layout.base[buffer] + end + token - len) * g.row_bytes(),
            step: g.dtype.size_bytes(),
        }
    }

    /// Layer l has R_l rows per buffer and rebases to its anchor A_l (W_max; a sliding layer's
    /// K, with R = K + its slide room), moving min(len, A_l) rows of each of its 2H buffers: a step
    /// of n tokens whose end + n would pass R rebases the layer first. Rebases are counted per
    /// layer; handles are 4H per distinct (window end, variant) of a layer. Layers that start at
    /// the same offset are predicted once, so the work is bounded by the steps, not layers x steps.
    fn predict(
        &self,
        g: &Geometry,
        segments: &[Segment],
        copies: &mut Copies,
    ) -> Result<Predicted, KvError> {
        let h = g.kv_heads;
        // Rows copied by rebases, by global step index (staggered layers may rebase on the same step).
        let mut events: BTreeMap<usize, (usize, bool)> = BTreeMap::new();
        let mut rebases = 0;
        let (mut handles, mut max_keys) = (Size::new("memory handles", 0), 0);
        let mut starts: BTreeMap<(usize, usize, usize), usize> = BTreeMap::new();
        for (layer, &start) in self.start.iter().enumerate() {
            let r = self.layout.rows[layer * 2 * h];
            *starts.entry((start, r, anchor(g, layer))).or_default() += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_len_counts_integers() {
        assert_eq!(union_len(vec![]), 0);
        assert_eq!(union_len(vec![(3, 5), (1, 2), (9, 9), (4, 7)]), 8);
    }

    #[test]
    fn reservations_spell_and_parse_back() {
        for (text, reserve) in [
            ("2x", Reserve::Factor(2.0)),
            ("1.5x", Reserve::Factor(1.5)),
            ("3070", Reserve::Rows(3070)),
            ("+64", Reserve::Spare(64)),
        ] {
            assert_eq!(text.parse::<Reserve>(), Ok(reserve));
            assert_eq!(reserve.spelling(), text);
        }
        for bad in ["0.5x", "nanx", "x", "+", "-3", "2y", ""] {
            assert!(bad.parse::<Reserve>().is_err(), "{bad}");
        }
    }
}
