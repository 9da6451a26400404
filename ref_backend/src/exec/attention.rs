//! The executor's attention over one layer's KV heads.
//!
//! Per step, each mask is scanned once into per-row lists of visible columns and the list of
//! past rows some query sees. Per layer, those past rows are decoded once for all query heads,
//! in parallel over (KV head, K|V); then every (query row, query head) attends over its visible
//! rows, in parallel over contiguous groups of them. Each task computes exactly what a serial
//! loop would, so the results do not depend on the thread count or the split.

use model::LlamaConfig as Config;
use model::ops::attend;
use rayon::prelude::*;

use super::{Io, KvSlot, visible};
use crate::types::KLayout;

/// Decoded elements or multiply-adds below which a phase runs on the calling thread: handing
/// it to the pool would cost more than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 14;

/// Score buffers: the (query row, query head) tasks of a layer are split into at most this
/// many contiguous groups, each with its own buffer.
const GROUPS: usize = 16;

/// One mask input, decoded: `[n, cols]` additive values over `cols - n` past rows and the n new
/// ones, and which columns are visible.
#[derive(Debug)]
pub(super) struct MaskScratch {
    pub(super) values: Vec<f32>,
    cols: usize,
    /// Per query row `i`, its visible columns ascending: `visible[i * cols..][..count[i]]`.
    visible: Vec<u32>,
    count: Vec<usize>,
    /// The past rows some query of the step sees, ascending: `past[..past_len]`.
    past: Vec<u32>,
    past_len: usize,
}

impl MaskScratch {
    pub(super) fn new(n: usize, rows: usize) -> MaskScratch {
        let cols = rows + n;
        MaskScratch {
            values: vec![0.0; n * cols],
            cols,
            visible: vec![0; n * cols],
            count: vec![0; n],
            past: vec![0; rows],
            past_len: 0,
        }
    }

    /// Lists the visible columns once `values` holds the step's mask.
    pub(super) fn index(&mut self) {
        let cols = self.cols;
        for (i, row) in self.values.chunks_exact(cols).enumerate() {
            let list = &mut self.visible[i * cols..(i + 1) * cols];
            let mut c = 0;
            for (j, &m) in row.iter().enumerate() {
                if visible(m) {
                    list[c] = j as u32;
                    c += 1;
                }
            }
            self.count[i] = c;
        }
        self.past_len = 0;
        for j in 0..self.past.len() {
            if self.values.chunks_exact(cols).any(|row| visible(row[j])) {
                self.past[self.past_len] = j as u32;
                self.past_len += 1;
            }
        }
    }

    fn row(&self, i: usize) -> (&[f32], &[u32]) {
        let at = i * self.cols;
        let values = &self.values[at..at + self.cols];
        (values, &self.visible[at..at + self.count[i]])
    }

    fn past(&self) -> &[u32] {
        &self.past[..self.past_len]
    }

    pub(super) fn bytes(&self) -> usize {
        self.values.len() * 4
            + (self.visible.len() + self.past.len()) * 4
            + self.count.len() * std::mem::size_of::<usize>()
    }
}

/// Scratch of the attention: the decoded masks, and every KV head's new and past rows.
#[derive(Debug)]
pub(super) struct AttnScratch {
    /// The global mask, then one per sliding window of the graph's layers (input order).
    pub(super) masks: Vec<MaskScratch>,
    /// The step's K/V rows as read back from their encoding: `[kv_heads, n, head_dim]`.
    pub(super) knew: Vec<f32>,
    pub(super) vnew: Vec<f32>,
    /// Decoded past rows: `[kv_heads, rows, head_dim]` (only visible rows are written).
    kpast: Vec<f32>,
    vpast: Vec<f32>,
    /// `[GROUPS, cols]`.
    scores: Vec<f32>,
    /// The widest mask's past rows.
    rows: usize,
}

impl AttnScratch {
    /// For `n` query rows over `rows` past rows (the widest mask's) under `masks`.
    pub(super) fn new(c: &Config, n: usize, rows: usize, masks: Vec<MaskScratch>) -> AttnScratch {
        let (heads, d) = (c.n_kv_heads, c.head_dim);
        AttnScratch {
            masks,
            knew: vec![0.0; heads * n * d],
            vnew: vec![0.0; heads * n * d],
            kpast: vec![0.0; heads * rows * d],
            vpast: vec![0.0; heads * rows * d],
            scores: vec![0.0; GROUPS * (rows + n)],
            rows,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        let floats = [
            &self.knew,
            &self.vnew,
            &self.kpast,
            &self.vpast,
            &self.scores,
        ];
        let masks: usize = self.masks.iter().map(MaskScratch::bytes).sum();
        floats.iter().map(|v| v.len() * 4).sum::<usize>() + masks
    }

    /// Decodes the past rows some query can see, for every KV head of a layer (`slots`), once
    /// for all queries of the step.
    pub(super) fn load_past(&mut self, io: &dyn Io, slots: &[KvSlot], c: &Config, k: KLayout) {
        let d = c.head_dim;
        let stride = self.rows * d;
        let past = self.masks[slots[0].mask].past();
        let work = past.len() * d * 2 * slots.len();
        let keys = (self.kpast.par_chunks_mut(stride).zip(slots)).map(|(dst, s)| (dst, s, false));
        let values = (self.vpast.par_chunks_mut(stride).zip(slots)).map(|(dst, s)| (dst, s, true));
        keys.chain(values)
            .with_min_len(min_len(work))
            .for_each(|(dst, slot, value)| {
                let transposed = !value && k == KLayout::Transposed;
                decode_rows(io, slot, value, transposed, past, d, dst);
            });
    }

    /// Attention of every query row and head over the keys visible in the layer's mask
    /// (column `j < w`: past row `j`; `w + i`: new row `i`). `q` and `out` are `[n, q_dim]`.
    pub(super) fn attend(&mut self, slot: &KvSlot, c: &Config, q: &[f32], out: &mut [f32]) {
        let (d, heads, w) = (c.head_dim, c.n_heads, slot.rows);
        let n = q.len() / c.q_dim();
        let mask = &self.masks[slot.mask];
        let (kpast, vpast, knew, vnew) = (&self.kpast, &self.vpast, &self.knew, &self.vnew);
        let (stride, tasks) = (self.rows * d, n * heads);
        let per = tasks.div_ceil(GROUPS.min(tasks));
        let work: usize = mask.count.iter().sum::<usize>() * heads * d * 2;
        let group = |(g, (out, scores)): (usize, (&mut [f32], &mut [f32]))| {
            for (t, o) in out.chunks_exact_mut(d).enumerate() {
                let task = g * per + t;
                let (i, h) = (task / heads, task % heads / c.kv_mul());
                let (mrow, vis) = mask.row(i);
                let (kp, vp) = (&kpast[h * stride..], &vpast[h * stride..]);
                let (kn, vn) = (&knew[h * n * d..], &vnew[h * n * d..]);
                attend(
                    &q[task * d..(task + 1) * d],
                    vis.len(),
                    |t| kv_row(kp, kn, vis[t] as usize, w, d),
                    |t| kv_row(vp, vn, vis[t] as usize, w, d),
                    |t| mrow[vis[t] as usize],
                    scores,
                    o,
                );
            }
        };
        (out.par_chunks_mut(per * d))
            .zip(self.scores.par_chunks_mut(mask.cols))
            .enumerate()
            .with_min_len(min_len(work))
            .for_each(group);
    }
}

/// Items per pool task: one (split freely) when the phase is worth parallelizing, else all.
fn min_len(work: usize) -> usize {
    if work >= PARALLEL_MIN_WORK {
        1
    } else {
        usize::MAX
    }
}

/// Decodes past rows `past` of one KV head's K (`value = false`) or V into `dst`
/// (`[rows, head_dim]`); `transposed`: the tensor is `[head_dim, rows]`.
fn decode_rows(
    io: &dyn Io,
    slot: &KvSlot,
    value: bool,
    transposed: bool,
    past: &[u32],
    d: usize,
    dst: &mut [f32],
) {
    let (codec, buf) = if value {
        (slot.v, slot.past_v)
    } else {
        (slot.k, slot.past_k)
    };
    let (src, es, w) = (io.input(buf), codec.size(), slot.rows);
    for &j in past {
        let j = j as usize;
        let row = &mut dst[j * d..(j + 1) * d];
        if transposed {
            for (e, x) in row.iter_mut().enumerate() {
                let b = slot.past_off + (e * w + j) * es;
                *x = codec.decode(&src[b..b + es]);
            }
        } else {
            let b = slot.past_off + j * d * es;
            codec.decode_run(&src[b..b + d * es], row);
        }
    }
}

/// Row `j` of the keys or values a query sees: past row `j` for `j < w`, else new row `j - w`.
fn kv_row<'a>(past: &'a [f32], new: &'a [f32], j: usize, w: usize, d: usize) -> &'a [f32] {
    if j < w {
        &past[j * d..(j + 1) * d]
    } else {
        &new[(j - w) * d..(j - w + 1) * d]
    }
}
