//! `smart_mask` and `naive`: fixed slot windows, with the graph's new rows written to an output
//! area after them and copied into the slots on commit. `smart_mask` fills the slots from the
//! start (token t in slot t; the mask marks the valid ones); `naive` keeps them right-aligned (token
//! t in slot `stride - len + t`) and slides the whole window left on every commit.
//!
//! Fixed layouts (per_head tensors, K rows) serve every AR variant from one layout of W_max rows
//! per slot window (a sliding layer's: its kept rows K). Strided layouts (per_layer tensors or a
//! transposed K) lay the data out for the variant's window W = S - n and are relaid out when the
//! variant changes or a commit no longer fits W (counted as a rebase).

use super::{Cx, Layout, Predicted, RowRef, Rule, copy_row, require_window_layout};
use crate::predict::{Copies, Segment};
use crate::{Geometry, Granularity, KLayout, KvError, KvIo, Plan, Size, TensorKind};

/// The slot rule: `stride` is the window the data is laid out for (W_max in fixed layouts).
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    layout: Layout,
    /// `naive`: right-aligned rows, the window slides left on every commit.
    naive: bool,
    /// per_head tensors with K rows: one layout serves every variant.
    fixed: bool,
    stride: usize,
}

impl Slots {
    pub(crate) fn new(g: &Geometry, naive: bool) -> Result<Slots, KvError> {
        if naive {
            require_window_layout(g, "naive")?;
        } else if g.has_windows() {
            return Err(KvError::UnsupportedCombination {
                strategy: "smart_mask",
                reason: "sliding-window layers need left-padded windows: smart_mask's valid rows grow \
                         from the start of its fixed slots, so a layer's last W - 1 rows would move \
                         every step (a new memory handle per step, which smart_mask exists to avoid); \
                         use shift, conveyor or naive"
                    .to_owned(),
            });
        }
        // One slot window per tensor head (W_max rows; K rows for a sliding layer, whose tensors
        // are per head), then the new-row area: max(ar) rows per tensor head.
        let w_max = g.max_window();
        let tensors = crate::geometry::tensor_ids(g.layers, g.kv_heads, g.granularity);
        let heads = g.buffers() / tensors.len();
        let per_tensor: Vec<usize> = tensors
            .iter()
            .map(|t| g.kept_rows(t.layer).unwrap_or(w_max))
            .collect();
        let outputs = Size::new("region rows", g.buffers())
            .times(g.max_ar())
            .get()?;
        Ok(Slots {
            layout: Layout::packed(per_tensor, heads, outputs)?,
            naive,
            fixed: g.granularity == Granularity::PerHead && g.k_layout == KLayout::Rows,
            stride: w_max,
        })
    }

    /// The window tensor `t`'s data is laid out for: the layout's slot window (W_max, or K for a
    /// sliding layer) in fixed layouts, the variant's window `stride` in strided ones.
    fn slot_stride(&self, t: usize, stride: usize) -> usize {
        if self.fixed {
            self.layout.rows[t]
        } else {
            stride
        }
    }

    /// The slot of token `token` at length `len` in a window of `stride` slots.
    fn slot(&self, stride: usize, len: usize, token: usize) -> usize {
        if self.naive {
            stride + token - len
        } else {
            token
        }
    }

    /// Where token slot `j` of head `h` of slot tensor `t` lives, for a layout of window `stride`.
    fn slot_row(
        &self,
        g: &Geometry,
        plan: &Plan,
        t: usize,
        h: usize,
        j: usize,
        stride: usize,
    ) -> RowRef {
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let base = self.layout.base[t] * d * e;
        strided_row(base, (d, e), (h, j, stride), transposed(plan, t))
    }

    /// Where new token `i` of head `h` of output tensor `t` lives in an AR-`ar` step.
    fn out_row(
        &self,
        g: &Geometry,
        plan: &Plan,
        t: usize,
        h: usize,
        i: usize,
        ar: usize,
    ) -> RowRef {
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let heads = plan.heads_per_tensor;
        let base = (self.layout.out_base + t * heads * g.max_ar()) * d * e;
        strided_row(base, (d, e), (h, i, ar), transposed(plan, t))
    }

    /// Lays the slot tensors out for a window of `new_stride` rows (strided layouts only): token t
    /// moves from its slot in the old window to its slot in the new one. Counted as a rebase.
    fn relayout(&mut self, cx: &mut Cx<'_>, new_stride: usize) {
        let old = std::mem::replace(&mut self.stride, new_stride);
        let len = cx.len;
        if len > 0 {
            let slot = |s: usize, t: usize| self.slot(s, len, t);
            self.move_slot_tokens(
                cx,
                |_| 0..len,
                |_, t| (slot(old, t), old),
                |_, t| (slot(new_stride, t), new_stride),
                old,
            );
        }
        cx.moved.rebases += 1;
    }

    /// Copies the new rows of a step into their slots (`smart_mask`), or slides every window left by
    /// `accepted` rows and appends them (`naive`).
    fn commit_slots(&self, cx: &mut Cx<'_>, ar: usize, accepted: usize) {
        let g = cx.g;
        let (d, e, rb) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes());
        let plan = &*cx.plan;
        let heads = plan.heads_per_tensor;
        let mut copied = 0;
        for t in 0..plan.tensors.len() {
            let stride = self.slot_stride(t, self.stride);
            for h in 0..heads {
                if self.naive {
                    let first = self.slot_row(g, plan, t, h, 0, stride);
                    let shifted = self.slot_row(g, plan, t, h, accepted, stride);
                    let keep = stride - accepted;
                    if first.step == e {
                        cx.region
                            .copy_within(shifted.start..shifted.start + keep * rb, first.start);
                    } else {
                        // Transposed: each channel is a contiguous run of `stride` elements.
                        for c in 0..d {
                            let src = shifted.start + c * shifted.step;
                            cx.region
                                .copy_within(src..src + keep * e, first.start + c * first.step);
                        }
                    }
                    copied += keep * rb;
                }
                for i in 0..accepted {
                    let slot = if self.naive {
                        stride - accepted + i
                    } else {
                        cx.len + i
                    };
                    let dst = self.slot_row(g, plan, t, h, slot, stride);
                    let src = self.out_row(g, plan, t, h, i, ar);
                    copy_row(cx.region, src, dst, d, e);
                }
                copied += accepted * rb;
            }
        }
        cx.moved.bytes += copied;
    }

    /// Moves tokens `tokens(s)` of every slot tensor (s: the tensor's window for a layout of
    /// window `stride`, [`Slots::slot_stride`]) from (slot, window) `from(s, t)` to `to(s, t)`,
    /// through a scratch copy, so overlapping moves are safe.
    fn move_slot_tokens(
        &self,
        cx: &mut Cx<'_>,
        tokens: impl Fn(usize) -> std::ops::Range<usize>,
        from: impl Fn(usize, usize) -> (usize, usize),
        to: impl Fn(usize, usize) -> (usize, usize),
        stride: usize,
    ) {
        let g = cx.g;
        let (d, e, rb) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes());
        let plan = &*cx.plan;
        let heads = plan.heads_per_tensor;
        let mut moved = 0;
        for t in 0..plan.tensors.len() {
            let s = self.slot_stride(t, stride);
            let range = tokens(s);
            let count = range.len();
            let mut scratch = vec![0u8; heads * count * rb];
            for h in 0..heads {
                for (i, tok) in range.clone().enumerate() {
                    let (slot, window) = from(s, tok);
                    let src = self.slot_row(g, plan, t, h, slot, window);
                    let out = &mut scratch[(h * count + i) * rb..][..rb];
                    for c in 0..d {
                        let at = src.start + c * src.step;
                        out[c * e..(c + 1) * e].copy_from_slice(&cx.region[at..at + e]);
                    }
                }
            }
            for h in 0..heads {
                for (i, tok) in range.clone().enumerate() {
                    let (slot, window) = to(s, tok);
                    let dst = self.slot_row(g, plan, t, h, slot, window);
                    let row = &scratch[(h * count + i) * rb..][..rb];
                    for c in 0..d {
                        let at = dst.start + c * dst.step;
                        cx.region[at..at + e].copy_from_slice(&row[c * e..(c + 1) * e]);
                    }
                }
            }
            moved += heads * count * rb;
        }
        cx.moved.bytes += moved;
    }
}

fn transposed(plan: &Plan, t: usize) -> bool {
    plan.k_transposed && plan.tensors[t].kind == TensorKind::Key
}

/// The slot tensor and the head inside it that hold buffer `buffer`.
fn slot_of(g: &Geometry, buffer: usize) -> (usize, usize) {
    match g.granularity {
        Granularity::PerHead => (buffer, 0),
        Granularity::PerLayer => {
            let (_, head, _) = g.buffer_coords(buffer);
            (
                g.buffer_tensor(buffer, KvIo::Past).position(g.kv_heads),
                head,
            )
        }
    }
}

impl Rule for Slots {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn handle_groups(&self, _g: &Geometry) -> (usize, usize) {
        (1, 1)
    }

    fn left_padded(&self) -> bool {
        self.naive
    }

    fn anchored_at_end(&self) -> bool {
        self.naive
    }

    /// Strided layouts lay the data out for the step's window first.
    fn prepare(&mut self, cx: &mut Cx<'_>, ar: usize) {
        let w = cx.g.window(ar);
        if !self.fixed && self.stride != w {
            self.relayout(cx, w);
        }
    }

    fn bind(&mut self, cx: &mut Cx<'_>, ar: usize, variant: usize) -> usize {
        let (g, rb) = (cx.g, cx.g.row_bytes());
        let plan = &mut *cx.plan;
        let (tensors, h) = (plan.tensors.len(), plan.heads_per_tensor);
        for t in 0..tensors {
            // Fixed left-padded layouts end every window at the end of its slots.
            let origin = if self.fixed && self.naive {
                self.layout.rows[t] - g.past_rows(plan.tensors[t].layer, ar)
            } else {
                0
            };
            plan.past_offsets.push((self.layout.base[t] + origin) * rb);
            let out = self.layout.out_base + t * h * g.max_ar();
            plan.new_offsets.push(out * rb);
        }
        if cx.handles.mark(0, 0, variant) {
            2 * tensors
        } else {
            0
        }
    }

    fn commit(&mut self, cx: &mut Cx<'_>, ar: usize, accepted: usize) {
        let w_max = cx.g.max_window();
        if !self.fixed && cx.len + accepted > self.stride {
            // The tokens no longer fit the window this variant laid the data out for: go to the
            // largest window, which holds the whole capacity.
            self.relayout(cx, w_max);
        }
        if accepted > 0 {
            self.commit_slots(cx, ar, accepted);
        }
    }

    /// `naive`'s rows are right-aligned: the held ones move right by the dropped count.
    fn rollback(&mut self, cx: &mut Cx<'_>, len: usize) {
        let old_len = cx.len;
        if self.naive && old_len > len && len > 0 {
            let first = |s: usize| old_len.saturating_sub(s);
            self.move_slot_tokens(
                cx,
                |s| first(s).min(len)..len,
                |s, t| (s + t - old_len, s),
                |s, t| (s + t - len, s),
                self.stride,
            );
        }
    }

    fn reset_layout(&mut self, g: &Geometry) {
        self.stride = g.max_window();
    }

    fn token_row(
        &self,
        g: &Geometry,
        plan: &Plan,
        len: usize,
        buffer: usize,
        token: usize,
    ) -> RowRef {
        let (tensor, head) = slot_of(g, buffer);
        let s = self.slot_stride(tensor, self.stride);
        self.slot_row(g, plan, tensor, head, self.slot(s, len, token), s)
    }

    /// Each commit of k tokens copies k rows per buffer (`smart_mask`) or slides the window,
    /// (W_max - k) + k = W_max rows per buffer (`naive`). Handles: 2 x tensors per AR variant used.
    /// Strided layouts lay the slots out for the variant's window W = S - n and relay out (len rows
    /// per buffer, counted as a rebase) when the variant changes or when a commit overflows W.
    fn predict(
        &self,
        g: &Geometry,
        segments: &[Segment],
        copies: &mut Copies,
    ) -> Result<Predicted, KvError> {
        let (naive, fixed) = (self.naive, self.fixed);
        let (b, w_max) = (g.buffers(), g.max_window());
        let tensors = self.layout.base.len();
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
            // Only the last step of a segment can overflow the variant's window: any later step of
            // the same variant would not fit the cache.
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
        Ok((
            rebases,
            Size::new("memory handles", 2 * tensors).times(variants.len()),
            variants.len(),
        ))
    }
}

/// Row `j` of head `h` in a tensor at byte `base` whose heads hold `stride` rows of `d` elements
/// of `e` bytes: rows contiguous, or (K transposed) one element of each row per `stride` column.
fn strided_row(
    base: usize,
    (d, e): (usize, usize),
    (h, j, stride): (usize, usize, usize),
    transposed: bool,
) -> RowRef {
    if transposed {
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
