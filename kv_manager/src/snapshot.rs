//! Snapshots: a cache's valid rows in logical order (token 0..len), independent of the strategy and
//! the layout, to save a session or move it to a cache with another strategy.
//!
//! [`KvCache::export_rows`] reads every buffer's valid rows into a [`KvSnapshot`]: per buffer, the
//! fixed-point (or float) bytes of each token's row, D elements in channel order, whatever the
//! region layout (rows or transposed K, per-head or per-layer tensors, any strategy).
//! [`KvCache::import_rows`] replaces a cache's contents with a snapshot: after it, every later plan
//! sees exactly those rows at positions 0..len, as if the cache had computed them itself. The rows are
//! copied byte for byte; a snapshot whose buffers are encoded differently from the cache is refused
//! (importing it would need a requantization, which the manager never does).
//!
//! Sliding-window layers: a buffer's row set may hold only the rows of the **last** tokens (a
//! sliding layer of window W exports its last `min(len, W - 1)` rows, all its next step reads).
//! An import needs, per buffer, the rows the target layer's window shows at that length (all of
//! them for a global layer): a snapshot of a sliding layer restores into a cache with the same (or
//! a shorter) window, whatever the strategy or context, and a full snapshot restores anywhere; a
//! global layer cannot be restored from a sliding layer's rows (refused, naming the layer).

use crate::{Geometry, KvCache, KvError};
use quant::{DataType, QuantSpec};

/// The shape of a snapshot's rows: what two caches must share to exchange rows (the context, the AR
/// variants, the strategy and the tensor layout may differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DataType,
}

impl RowShape {
    /// The row shape of a geometry.
    pub fn of(geometry: &Geometry) -> RowShape {
        RowShape {
            layers: geometry.layers,
            kv_heads: geometry.kv_heads,
            head_dim: geometry.head_dim,
            dtype: geometry.dtype,
        }
    }

    /// Number of K/V buffers: layers x kv_heads x 2.
    pub fn buffers(&self) -> usize {
        self.layers * self.kv_heads * 2
    }

    /// Bytes of one row: head_dim x element size.
    pub fn row_bytes(&self) -> usize {
        self.head_dim * self.dtype.size_bytes()
    }
}

impl std::fmt::Display for RowShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers x {} kv-heads x head_dim {} of {}",
            self.layers, self.kv_heads, self.head_dim, self.dtype
        )
    }
}

/// A cache's valid rows in logical order. Buffers are indexed by [`Geometry::buffer_index`].
#[derive(Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    pub shape: RowShape,
    /// One encoding per buffer (the bytes mean nothing without it).
    pub encodings: Vec<QuantSpec>,
    /// Tokens held.
    pub len: usize,
    /// Per buffer, the rows of its last h tokens (`h <= len`: `len` for a global layer,
    /// `min(len, W - 1)` as exported from a sliding layer), [`RowShape::row_bytes`] bytes each,
    /// oldest first.
    pub rows: Vec<Vec<u8>>,
}

impl KvSnapshot {
    /// Tokens whose rows buffer `buffer` holds (its last ones); `None` when its byte count is not a
    /// whole number of rows up to `len`.
    pub fn held(&self, buffer: usize) -> Option<usize> {
        let (rb, bytes) = (self.shape.row_bytes(), self.rows.get(buffer)?.len());
        let held = bytes.checked_div(rb)?;
        (held * rb == bytes && held <= self.len).then_some(held)
    }

    /// Checks that the snapshot is well formed and fits `cache`: same row shape and encodings, at most
    /// the cache's capacity, per buffer whole rows covering what the cache's layer shows at that
    /// length (every row for a global layer, the last W - 1 for a sliding one). Touches nothing.
    pub fn check_fits(&self, cache: &KvCache) -> Result<(), KvError> {
        let g = &cache.spec().geometry;
        let mismatch = |what: &'static str, cache: String, snapshot: String| {
            Err(KvError::SnapshotMismatch {
                what,
                cache,
                snapshot,
            })
        };
        let shape = RowShape::of(g);
        if self.shape != shape {
            return mismatch("row shape", shape.to_string(), self.shape.to_string());
        }
        if self.encodings.len() != shape.buffers() || self.rows.len() != shape.buffers() {
            return mismatch(
                "buffer count",
                shape.buffers().to_string(),
                format!(
                    "{} encodings, {} row sets",
                    self.encodings.len(),
                    self.rows.len()
                ),
            );
        }
        if let Some(b) = (0..shape.buffers()).find(|&b| self.encodings[b] != *cache.encoding(b)) {
            let (layer, head, kind) = g.buffer_coords(b);
            return mismatch(
                if kind == crate::TensorKind::Key {
                    "K encoding"
                } else {
                    "V encoding"
                },
                format!("layer {layer} head {head}: {:?}", cache.encoding(b)),
                format!("{:?}", self.encodings[b]),
            );
        }
        if self.len > g.capacity() {
            return mismatch(
                "length",
                format!("capacity {}", g.capacity()),
                format!("{} tokens", self.len),
            );
        }
        for b in 0..shape.buffers() {
            let layer = g.buffer_coords(b).0;
            let needed = cache.window_tokens(layer, self.len).len();
            match self.held(b) {
                Some(held) if held >= needed => {}
                Some(held) => {
                    return mismatch(
                        "rows held",
                        format!("layer {layer} needing the last {needed} of {}", self.len),
                        format!("{held} in buffer {b}"),
                    );
                }
                None => {
                    return mismatch(
                        "row bytes",
                        format!(
                            "whole rows of {} bytes, at most {}",
                            shape.row_bytes(),
                            self.len
                        ),
                        format!("{} in buffer {b}", self.rows[b].len()),
                    );
                }
            }
        }
        Ok(())
    }
}

impl KvCache {
    /// The valid rows of every buffer in logical order, with the encodings (see [`KvSnapshot`]):
    /// every token's for a global layer, the last `min(len, W - 1)` for a sliding layer of window
    /// W ([`KvCache::window_tokens`]). A pending plan is ignored: only committed tokens are exported.
    pub fn export_rows(&self) -> KvSnapshot {
        let g = &self.spec().geometry;
        let shape = RowShape::of(g);
        let (d, e) = (g.head_dim, g.dtype.size_bytes());
        let bytes = self.region().as_slice();
        let rows = (0..shape.buffers())
            .map(|b| {
                let tokens = self.window_tokens(g.buffer_coords(b).0, self.len());
                let mut out = Vec::with_capacity(tokens.len() * shape.row_bytes());
                for t in tokens {
                    let at = self.token_row(b, t);
                    for c in 0..d {
                        let from = at.start + c * at.step;
                        out.extend_from_slice(&bytes[from..from + e]);
                    }
                }
                out
            })
            .collect();
        KvSnapshot {
            shape,
            encodings: self.spec().encodings.clone(),
            len: self.len(),
            rows,
        }
    }

    /// Replaces the cache's contents with `snapshot` (any strategy and layout may have exported it).
    /// On error ([`KvSnapshot::check_fits`]) the cache is left exactly as it was. Counters keep their
    /// totals: the import is not a step and counts no copies.
    pub fn import_rows(&mut self, snapshot: &KvSnapshot) -> Result<(), KvError> {
        snapshot.check_fits(self)?;
        let g = &self.spec().geometry;
        let (d, e, rb, kv_heads) = (g.head_dim, g.dtype.size_bytes(), g.row_bytes(), g.kv_heads);
        self.reset_to_len(snapshot.len);
        for (b, rows) in snapshot.rows.iter().enumerate() {
            // The snapshot's rows are its last `held` tokens; the cache takes what its layer shows.
            let first = snapshot.len - rows.len() / rb;
            let tokens = self.window_tokens(b / (2 * kv_heads), snapshot.len);
            for t in tokens {
                let row = &rows[(t - first) * rb..][..rb];
                let at = self.token_row(b, t);
                let bytes = self.region_mut();
                for c in 0..d {
                    let to = at.start + c * at.step;
                    bytes[to..to + e].copy_from_slice(&row[c * e..(c + 1) * e]);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheSpec, HostAllocator, Strategy};
    use quant::{Encoding, ScaleOffset};

    fn filled(strategy: Strategy) -> KvCache {
        let g = Geometry::new(1, 1, 2, 8, &[1], DataType::U8);
        let mut c = KvCache::new(
            CacheSpec::for_simulation(g, strategy),
            &HostAllocator::default(),
        )
        .unwrap();
        for token in 0..3u8 {
            c.plan(1).unwrap();
            let (plan, region) = c.pending_io().unwrap();
            for t in 0..plan.tensor_count() {
                let out = plan.new_output(t);
                region[out.offset..out.offset + out.bytes].fill(10 * token + t as u8);
            }
            c.commit(1).unwrap();
        }
        c
    }

    #[test]
    fn a_snapshot_that_does_not_fit_is_refused_and_changes_nothing() {
        let mut target = filled(Strategy::Naive);
        let before = target.export_rows();
        let good = filled(Strategy::Conveyor).export_rows();
        assert_eq!(
            good.rows,
            vec![vec![0, 0, 10, 10, 20, 20], vec![1, 1, 11, 11, 21, 21]]
        );
        let mut wrong_encoding = good.clone();
        wrong_encoding.encodings[1].encoding = Encoding::PerTensor(ScaleOffset {
            scale: 0.5,
            offset: 0,
        });
        let mut wrong_shape = good.clone();
        wrong_shape.shape.head_dim = 4;
        let mut too_long = good.clone();
        too_long.len = 8;
        let mut short_rows = good.clone();
        short_rows.rows[0].pop();
        let mut missing_buffer = good.clone();
        missing_buffer.rows.pop();
        for (bad, what) in [
            (wrong_encoding, "V encoding"),
            (wrong_shape, "row shape"),
            (too_long, "length"),
            (short_rows, "row bytes"),
            (missing_buffer, "buffer count"),
        ] {
            match target.import_rows(&bad) {
                Err(KvError::SnapshotMismatch { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(target.export_rows(), before);
        }
        target.import_rows(&good).unwrap();
        assert_eq!(target.export_rows(), good);
    }
}
