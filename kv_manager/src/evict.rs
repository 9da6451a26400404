//! Eviction: dropping a run of cached tokens from the middle of the sequence, for sliding-window
//! conversations that outgrow the context (keep the first `keep` tokens — attention sinks, system
//! prompt — drop the next `drop`, keep the rest).
//!
//! [`KvCache::evict`] works for every strategy and layout: it moves rows so that, afterwards, every
//! plan shows exactly the kept rows, in order, as tokens `0..len - drop`. Which rows move depends on
//! where a strategy anchors its rows:
//! - `shift` and `naive` keep rows right-aligned at the window's end: the `keep` head rows move right
//!   by `drop` rows (a rebase-like move of the head only; the tail stays);
//! - `conveyor` and `smart_mask` anchor token 0: the tail rows move left by `drop` rows.
//!
//! Positions: the K rows were rotated (RoPE) for their old positions. With
//! [`PositionMode::Renumber`] later tokens take contiguous positions again (`len + i`), and the caller
//! must re-rotate the moved tail's K rows by `-drop` positions ([`KvCache::map_key_rows`] dequantizes,
//! lets the caller rotate, and requantizes to the same encoding). With [`PositionMode::Keep`] the kept
//! rows keep their positions and the next token's position stays where it was: the cache's
//! [`KvCache::position_offset`] grows by `drop`, so positions keep growing past the context.

use crate::{KvCache, KvError, TensorKind};
use quant::QuantSpec;
use std::ops::Range;

/// What happens to positions when tokens are evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionMode {
    /// Tokens after the dropped run take the dropped positions: positions stay `0..len` (the moved K
    /// rows must be re-rotated by the caller).
    Renumber,
    /// Every kept row keeps its position; new tokens continue where the sequence was (`position_offset`
    /// grows by the dropped count).
    Keep,
}

/// What one eviction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Tokens dropped.
    pub dropped: usize,
    /// Rows moved (per buffer, times the buffers).
    pub rows_moved: usize,
    /// Bytes copied.
    pub bytes_copied: usize,
}

/// The error a requantization adds: what [`KvCache::map_key_rows`] measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequantError {
    /// Elements rewritten.
    pub elements: usize,
    /// Elements whose new value lay outside the encoding's range (clamped).
    pub clamped: usize,
    /// The largest |stored - wanted| of any element, in real units.
    pub max_abs: f32,
    /// Sum of squared errors (for an RMS over `elements`).
    pub sum_sq: f64,
}

impl RequantError {
    /// Root mean square error per element.
    pub fn rms(&self) -> f64 {
        if self.elements == 0 {
            0.0
        } else {
            (self.sum_sq / self.elements as f64).sqrt()
        }
    }

    /// Adds another measurement.
    pub fn merge(&mut self, other: &RequantError) {
        self.elements += other.elements;
        self.clamped += other.clamped;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.sum_sq += other.sum_sq;
    }
}

impl KvCache {
    /// Drops tokens `keep..keep + drop` (see the [module docs](crate::evict)). Discards a pending plan.
    /// `keep + drop` must not exceed the length.
    pub fn evict(
        &mut self,
        keep: usize,
        drop: usize,
        positions: PositionMode,
    ) -> Result<Eviction, KvError> {
        let len = self.len();
        if keep.checked_add(drop).is_none_or(|end| end > len) {
            return Err(KvError::InvalidEviction { keep, drop, len });
        }
        self.discard_plan();
        if drop == 0 {
            return Ok(Eviction::default());
        }
        if self.spec().geometry.has_windows() {
            return self.evict_windowed(keep, drop, positions);
        }
        let g = &self.spec().geometry;
        let (d, e, buffers) = (g.head_dim, g.dtype.size_bytes(), g.buffers());
        // Rows move to their place at the new length (`token_row` depends on it for right-aligned
        // strategies). `moves` lists (old token, new token) in a safe order.
        let head_moves = self.anchored_at_end();
        let moves: Vec<(usize, usize)> = if head_moves {
            (0..keep).rev().map(|t| (t, t)).collect()
        } else {
            (keep + drop..len).map(|t| (t, t - drop)).collect()
        };
        let old: Vec<Vec<crate::cache::RowRef>> = (0..buffers)
            .map(|b| moves.iter().map(|&(t, _)| self.token_row(b, t)).collect())
            .collect();
        self.set_len_for_eviction(len - drop);
        for (b, rows) in old.iter().enumerate() {
            for (&src, &(_, to)) in rows.iter().zip(&moves) {
                let dst = self.token_row(b, to);
                crate::cache::copy_row(self.region_mut(), src, dst, d, e);
            }
        }
        let eviction = Eviction {
            dropped: drop,
            rows_moved: moves.len() * buffers,
            bytes_copied: moves.len() * buffers * d * e,
        };
        self.count_eviction(&eviction, positions);
        Ok(eviction)
    }

    /// [`KvCache::evict`] with sliding-window layers: every buffer's rows that its layer shows at
    /// the new length (all of them for a global layer, the last W - 1 for a sliding one) are
    /// gathered and written back as after an import, so a sliding layer then holds only those (no
    /// rollback below the new length). Refused, before anything moves, when a sliding layer's new
    /// window would show a token whose rows it no longer holds.
    fn evict_windowed(
        &mut self,
        keep: usize,
        drop: usize,
        positions: PositionMode,
    ) -> Result<Eviction, KvError> {
        let g = self.spec().geometry.clone();
        let new_len = self.len() - drop;
        let old = |t: usize| if t < keep { t } else { t + drop };
        for layer in 0..g.layers {
            let shown = self.window_tokens(layer, new_len);
            if let Some(needed) = shown.clone().next().map(old)
                && needed < self.first_held(layer)
            {
                return Err(KvError::EvictionPastWindow {
                    keep,
                    drop,
                    layer,
                    window: g.layer_window(layer).unwrap_or(0),
                    needed,
                    first_held: self.first_held(layer),
                });
            }
        }
        let (d, e, rb) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes());
        let rows: Vec<Vec<u8>> = (0..g.buffers())
            .map(|b| {
                let shown = self.window_tokens(g.buffer_coords(b).0, new_len);
                let mut out = vec![0u8; shown.len() * rb];
                for (t, row) in shown.zip(out.chunks_exact_mut(rb)) {
                    gather(self.region().as_slice(), self.token_row(b, old(t)), row, e);
                }
                out
            })
            .collect();
        let offset = self.position_offset();
        self.reset_to_len(new_len);
        self.set_position_offset(offset);
        let mut moved = 0;
        for (b, out) in rows.iter().enumerate() {
            let first = new_len - out.len() / rb;
            for (i, row) in out.chunks_exact(rb).enumerate() {
                let at = self.token_row(b, first + i);
                scatter(self.region_mut(), at, row, e);
            }
            moved += out.len() / rb;
        }
        let eviction = Eviction {
            dropped: drop,
            rows_moved: moved,
            bytes_copied: moved * d * e,
        };
        self.count_eviction(&eviction, positions);
        Ok(eviction)
    }

    /// Rewrites the K rows of tokens `tokens` in every buffer: each row is dequantized with its buffer's
    /// encoding, handed to `f(layer, kv_head, token, row)` and requantized to the same encoding (e.g.
    /// a RoPE re-rotation after [`KvCache::evict`] with [`PositionMode::Renumber`]). Returns the error
    /// the requantization added. Per-axis encodings are refused before anything is written.
    pub fn map_key_rows(
        &mut self,
        tokens: Range<usize>,
        mut f: impl FnMut(usize, usize, usize, &mut [f32]),
    ) -> Result<RequantError, KvError> {
        if tokens.end > self.len() || tokens.start > tokens.end {
            return Err(KvError::InvalidEviction {
                keep: tokens.start,
                drop: tokens.end.saturating_sub(tokens.start),
                len: self.len(),
            });
        }
        let g = self.spec().geometry.clone();
        let keys: Vec<usize> = (0..g.buffers())
            .filter(|&b| g.buffer_coords(b).2 == TensorKind::Key)
            .collect();
        if let Some(&b) = keys
            .iter()
            .find(|&&b| matches!(self.encoding(b).encoding, quant::Encoding::PerAxis { .. }))
        {
            let (layer, head, _) = g.buffer_coords(b);
            return Err(KvError::Requantize {
                layer,
                head,
                reason: "a per-axis K encoding cannot be requantized row by row".into(),
            });
        }
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let mut err = RequantError::default();
        let (mut bytes, mut values, mut back) = (vec![0u8; d * e], vec![0f32; d], vec![0f32; d]);
        for b in keys {
            let (layer, head, _) = g.buffer_coords(b);
            let spec = self.encoding(b).clone();
            // A sliding layer's rows older than those it holds are gone: nothing to rewrite.
            for t in tokens.start.max(self.first_held(layer))..tokens.end {
                let at = self.token_row(b, t);
                gather(self.region().as_slice(), at, &mut bytes, e);
                decode(&bytes, &spec, &mut values, layer, head)?;
                f(layer, head, t, &mut values);
                encode(&values, &spec, &mut bytes, layer, head)?;
                decode(&bytes, &spec, &mut back, layer, head)?;
                measure(&values, &back, &spec, &mut err);
                scatter(self.region_mut(), at, &bytes, e);
            }
        }
        Ok(err)
    }
}

fn gather(region: &[u8], at: crate::cache::RowRef, out: &mut [u8], e: usize) {
    for (c, chunk) in out.chunks_exact_mut(e).enumerate() {
        let from = at.start + c * at.step;
        chunk.copy_from_slice(&region[from..from + e]);
    }
}

fn scatter(region: &mut [u8], at: crate::cache::RowRef, row: &[u8], e: usize) {
    for (c, chunk) in row.chunks_exact(e).enumerate() {
        let to = at.start + c * at.step;
        region[to..to + e].copy_from_slice(chunk);
    }
}

fn requant_error(layer: usize, head: usize, e: quant::QuantError) -> KvError {
    KvError::Requantize {
        layer,
        head,
        reason: e.to_string(),
    }
}

fn decode(
    bytes: &[u8],
    spec: &QuantSpec,
    out: &mut [f32],
    layer: usize,
    head: usize,
) -> Result<(), KvError> {
    quant::decode_bytes_to_f32(bytes, spec, out).map_err(|e| requant_error(layer, head, e))
}

fn encode(
    values: &[f32],
    spec: &QuantSpec,
    out: &mut [u8],
    layer: usize,
    head: usize,
) -> Result<(), KvError> {
    quant::encode_f32_to_bytes(values, spec, out).map_err(|e| requant_error(layer, head, e))
}

/// Adds the error between the wanted values and what the encoding stored.
fn measure(wanted: &[f32], stored: &[f32], spec: &QuantSpec, err: &mut RequantError) {
    let range = match &spec.encoding {
        quant::Encoding::PerTensor(so) => so.representable_range(spec.dtype),
        _ => None,
    };
    for (&w, &s) in wanted.iter().zip(stored) {
        let diff = (w - s).abs();
        err.elements += 1;
        err.max_abs = err.max_abs.max(diff);
        err.sum_sq += f64::from(diff) * f64::from(diff);
        if range.is_some_and(|(lo, hi)| w < lo || w > hi) {
            err.clamped += 1;
        }
    }
}
