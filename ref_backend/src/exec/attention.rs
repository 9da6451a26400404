//! The executor's attention over one layer's KV heads.
//!
//! Per step, each mask is scanned once into per-row lists of visible columns and the list of
//! past rows some query sees. Per layer, those past rows are decoded once for all query heads,
//! in parallel over (KV head, K|V); then every (query row, query head) attends over its visible
//! rows, in parallel over contiguous groups of them. Each task computes exactly what a serial
//! loop would, so the results do not depend on the thread count or the split.

use model::LlamaConfig as Config;
use model::ops::attend_scaled;
use rayon::prelude::*;

use super::{Io, KvSlot, visible};
use crate::kernels::min_len_for;
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
            .with_min_len(min_len_for(work, PARALLEL_MIN_WORK))
            .for_each(|(dst, slot, value)| {
                let transposed = !value && k == KLayout::Transposed;
                decode_rows(io, slot, value, transposed, past, d, dst);
            });
    }

    /// Attention of every query row and head over the keys visible in the layer's mask
    /// (column `j < w`: past row `j`; `w + i`: new row `i`). `q` and `out` are `[n, q_dim]`.
    pub(super) fn attend(&mut self, slot: &KvSlot, c: &Config, q: &[f32], out: &mut [f32]) {
        let (d, heads, w) = (c.head_dim, c.n_heads, slot.rows);
        let scale = c.attention_scale();
        let n = q.len() / c.q_dim();
        let mask = &self.masks[slot.mask];
        let (kpast, vpast, knew, vnew) = (&self.kpast, &self.vpast, &self.knew, &self.vnew);
        let (stride, tasks) = (self.rows * d, n * heads);
        let per = tasks.div_ceil(GROUPS.min(tasks));
        let work: usize = mask.count.iter().sum::<usize>() * heads * d * 2;
        let group = |(g, (outs, scores)): (usize, (&mut [f32], &mut [f32]))| {
            for (k, o) in outs.chunks_exact_mut(d).enumerate() {
                let task = g * per + k;
                let (i, h) = (task / heads, task % heads / c.kv_mul());
                let (mrow, vis) = mask.row(i);
                let (kp, vp) = (&kpast[h * stride..], &vpast[h * stride..]);
                let (kn, vn) = (&knew[h * n * d..], &vnew[h * n * d..]);
                attend_scaled(
                    &q[task * d..(task + 1) * d],
                    scale,
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
            .with_min_len(min_len_for(work, PARALLEL_MIN_WORK))
            .for_each(group);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Codec, SliceIo};
    use quant::ScaleOffset;

    /// A little-endian pseudo-random stream (xorshift), for test data only.
    fn stream(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Both phases split over a 3-thread pool give, bit for bit, `ops::attend` over rows gathered
    /// and decoded element by element, for every (query row, query head) of a GQA layer.
    #[test]
    fn parallel_attention_equals_attend_over_the_visible_rows() {
        let c = model::llama2c::llama_config(&model::llama2c::Config {
            dim: 256,
            hidden_dim: 64,
            n_layers: 1,
            n_heads: 8,
            n_kv_heads: 2,
            vocab_size: 16,
            seq_len: 512,
            shared_classifier: true,
        });
        let (n, w, d, heads) = (3, 300, c.head_dim, c.n_kv_heads);
        let mut next = stream(5);
        let mut float = || (next() % 2001) as f32 / 1000.0 - 1.0;
        let so = |scale, offset| ScaleOffset { scale, offset };
        let codecs = [Codec::U16(so(3.1e-5, -32000)), Codec::U8(so(0.01, -128))];
        let mut bytes = stream(9);
        let past: Vec<Vec<u8>> = (0..2 * heads)
            .map(|i| {
                let size = w * d * codecs[i % 2].size();
                (0..size).map(|_| bytes() as u8).collect()
            })
            .collect();
        let slots: Vec<KvSlot> = (0..heads)
            .map(|h| KvSlot {
                past_k: 2 * h,
                past_v: 2 * h + 1,
                new_k: 0,
                new_v: 0,
                past_off: 0,
                new_off: 0,
                rows: w,
                mask: 0,
                k: codecs[0],
                v: codecs[1],
            })
            .collect();
        let mut mask = MaskScratch::new(n, w);
        for i in 0..n {
            for j in 0..w + n {
                let shown = if j < w {
                    (j + i) % 3 != 0 && j > 20
                } else {
                    j - w <= i
                };
                mask.values[i * (w + n) + j] = if shown {
                    -0.25 * (j % 4) as f32
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        mask.index();
        let mut s = AttnScratch::new(&c, n, w, vec![mask]);
        s.knew.iter_mut().for_each(|x| *x = float());
        s.vnew.iter_mut().for_each(|x| *x = float());
        let q: Vec<f32> = (0..n * c.q_dim()).map(|_| float()).collect();
        let inputs: Vec<&[u8]> = past.iter().map(Vec::as_slice).collect();
        let io = SliceIo {
            inputs: &inputs,
            outputs: &mut [],
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let mut out = vec![f32::NAN; q.len()];
        pool.install(|| {
            s.load_past(&io, &slots, &c, KLayout::Rows);
            s.attend(&slots[0], &c, &q, &mut out);
        });

        let m = &s.masks[0];
        let decode = |buf: &[u8], codec: Codec, j: usize| -> Vec<f32> {
            let es = codec.size();
            (0..d)
                .map(|e| codec.decode(&buf[(j * d + e) * es..]))
                .collect()
        };
        let mut scores = vec![0.0; w + n];
        for i in 0..n {
            let row = &m.values[i * (w + n)..(i + 1) * (w + n)];
            let shown: Vec<usize> = (0..w + n).filter(|&j| visible(row[j])).collect();
            for qh in 0..c.n_heads {
                let h = qh / c.kv_mul();
                let rows = |new: &[f32], buf: &[u8], codec| -> Vec<Vec<f32>> {
                    let new = &new[h * n * d..(h + 1) * n * d];
                    (shown.iter())
                        .map(|&j| match j < w {
                            true => decode(buf, codec, j),
                            false => new[(j - w) * d..(j - w + 1) * d].to_vec(),
                        })
                        .collect()
                };
                let keys = rows(&s.knew, &past[2 * h], codecs[0]);
                let values = rows(&s.vnew, &past[2 * h + 1], codecs[1]);
                let at = (i * c.n_heads + qh) * d;
                let mut want = vec![0.0; d];
                model::ops::attend(
                    &q[at..at + d],
                    shown.len(),
                    |t| &keys[t],
                    |t| &values[t],
                    |t| row[shown[t]],
                    &mut scores,
                    &mut want,
                );
                let got = &out[at..at + d];
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "row {i} head {qh}: {got:?} != {want:?}"
                );
            }
        }
    }
}
