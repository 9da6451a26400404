//! Relayouts: moving a cache's valid rows into a cache of another geometry — the graphs of a larger
//! context length, when a model ships several and the smaller one has filled.
//!
//! The target is built from its own [`CacheSpec`] (any strategy, context, AR variants, K layout and
//! tensor granularity) and must share the row shape and the per-buffer encodings: each row is copied
//! byte for byte from where the source keeps it to where the target keeps it, never requantized. The
//! target continues exactly where the source stood: same length, same position offset, so the next
//! step sees the same rows at the same positions as it would have in the source.

use crate::snapshot::RowShape;
use crate::{CacheSpec, Counters, KvCache, KvError, RegionAllocator};

impl KvCache {
    /// A new cache built from `spec` (its region from `allocator`) holding this cache's tokens.
    ///
    /// Refused ([`KvError::RelayoutMismatch`]) when the row shape or an encoding differs, or the
    /// tokens exceed the target's capacity; a pending plan is not carried over. The target's counters
    /// are this cache's totals plus the relayout (one relayout, `len` rows per buffer, their bytes,
    /// also in `bytes_copied`), with the target's region size; its memory handles start afresh, since
    /// the region is new. The saturation counts, and whether commits count them, carry over.
    pub fn relayout_into(
        &self,
        spec: CacheSpec,
        allocator: &dyn RegionAllocator,
    ) -> Result<KvCache, KvError> {
        let shape = RowShape::of(&self.spec().geometry);
        let mismatch = |what, current: String, target: String| {
            Err(KvError::RelayoutMismatch {
                what,
                current,
                target,
            })
        };
        let target_shape = RowShape::of(&spec.geometry);
        if target_shape != shape {
            return mismatch("the row shape", shape.to_string(), target_shape.to_string());
        }
        if let Some(b) = (0..shape.buffers()).find(|&b| spec.encodings[b] != *self.encoding(b)) {
            return mismatch(
                "the encoding of buffer",
                format!("{b}: {:?}", self.encoding(b)),
                format!("{b}: {:?}", spec.encodings[b]),
            );
        }
        if self.len() > spec.geometry.capacity() {
            return mismatch(
                "the capacity",
                format!("{} tokens", self.len()),
                spec.geometry.capacity().to_string(),
            );
        }
        let mut target = KvCache::new(spec, allocator)?;
        target.carry_saturation(self);
        let len = self.len();
        target.reset_to_len(len);
        // Each layer's window in the target must show only rows this cache still holds.
        for layer in 0..shape.layers {
            let needed = target.window_tokens(layer, len);
            if !needed.is_empty() && needed.start < self.first_held(layer) {
                return mismatch(
                    "the rows of layer",
                    format!("{layer}: tokens {}..{len} held", self.first_held(layer)),
                    format!("{layer}: tokens {needed:?} shown"),
                );
            }
        }
        target.set_position_offset(self.position_offset());
        let (e, rb) = (shape.dtype.size_bytes(), shape.row_bytes());
        let source = self.region().as_slice();
        let mut rows = 0;
        for b in 0..shape.buffers() {
            let tokens = target.window_tokens(b / (2 * shape.kv_heads), len);
            rows += tokens.len();
            for t in tokens {
                let (from, to) = (self.token_row(b, t), target.token_row(b, t));
                let bytes = target.region_mut();
                if from.step == e && to.step == e {
                    bytes[to.start..to.start + rb]
                        .copy_from_slice(&source[from.start..from.start + rb]);
                    continue;
                }
                for c in 0..shape.head_dim {
                    let (src, dst) = (from.start + c * from.step, to.start + c * to.step);
                    bytes[dst..dst + e].copy_from_slice(&source[src..src + e]);
                }
            }
        }
        let moved = rows * rb;
        let old = self.counters();
        let region_bytes = target.counters().region_bytes;
        *target.counters_mut() = Counters {
            region_bytes,
            peak_bytes_in_use: 0,
            bytes_copied: old.bytes_copied + moved,
            worst_step_bytes_copied: old.worst_step_bytes_copied.max(moved),
            relayouts: old.relayouts + 1,
            rows_moved_by_relayouts: old.rows_moved_by_relayouts + rows,
            bytes_moved_by_relayouts: old.bytes_moved_by_relayouts + moved,
            ..*old
        };
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, Reserve,
        Strategy,
    };
    use quant::DataType;

    fn geometry(context: usize, ar: &[usize], k: KLayout, g: Granularity) -> Geometry {
        Geometry {
            k_layout: k,
            granularity: g,
            ..Geometry::new(2, 2, 3, context, ar, DataType::U8)
        }
    }

    fn cache(g: Geometry, strategy: Strategy) -> KvCache {
        KvCache::new(
            CacheSpec::for_simulation(g, strategy),
            &HostAllocator::default(),
        )
        .unwrap()
    }

    /// Runs `tokens` steps of AR-1 writing a byte pattern that names (token, tensor) into the new rows.
    fn fill(c: &mut KvCache, from: usize, tokens: usize) {
        for token in from..from + tokens {
            c.plan(1).unwrap();
            let (plan, region) = c.pending_io().unwrap();
            for t in 0..plan.tensor_count() {
                let out = plan.new_output(t);
                for (i, v) in region[out.offset..out.offset + out.bytes]
                    .iter_mut()
                    .enumerate()
                {
                    *v = (token * 31 + t * 7 + i) as u8;
                }
            }
            c.commit(1).unwrap();
        }
    }

    fn strategies() -> Vec<Strategy> {
        vec![
            Strategy::Shift {
                reserve: Reserve::Factor(2.0),
                stagger: true,
            },
            Strategy::Conveyor,
            Strategy::SmartMask,
            Strategy::Naive,
        ]
    }

    /// Every strategy and layout the manager serves: after a relayout into the larger context the
    /// rows, the positions and the next steps are exactly those of a cache that had the larger
    /// context from the start.
    #[test]
    fn a_relayout_continues_exactly_like_the_larger_cache() {
        let mut ran = 0;
        for (k, gran) in [
            (KLayout::Rows, Granularity::PerHead),
            (KLayout::Transposed, Granularity::PerLayer),
        ] {
            for strategy in strategies() {
                let small = geometry(8, &[1, 4], k, gran);
                if small.validate().is_err()
                    || CacheSpec::for_simulation(small.clone(), strategy)
                        .layout()
                        .is_err()
                {
                    continue;
                }
                let large = geometry(16, &[1, 4], k, gran);
                let mut grown = cache(small, strategy);
                fill(&mut grown, 0, 7);
                assert!(
                    grown.plan(1).is_err(),
                    "{strategy:?}: the small cache is full"
                );
                let spec = CacheSpec::for_simulation(large.clone(), strategy);
                let mut grown = grown
                    .relayout_into(spec, &HostAllocator::default())
                    .unwrap();
                let mut straight = cache(large, strategy);
                fill(&mut straight, 0, 7);
                assert_eq!(grown.export_rows(), straight.export_rows(), "{strategy:?}");
                let c = grown.counters();
                assert_eq!(c.relayouts, 1);
                assert_eq!(c.rows_moved_by_relayouts, 7 * 8);
                assert_eq!(c.bytes_moved_by_relayouts, 7 * 8 * 3);
                fill(&mut grown, 7, 8);
                fill(&mut straight, 7, 8);
                assert_eq!(grown.export_rows(), straight.export_rows(), "{strategy:?}");
                assert_eq!(grown.len(), 15);
                assert_eq!(
                    grown.plan(1).unwrap_err().to_string(),
                    straight.plan(1).unwrap_err().to_string()
                );
                ran += 1;
            }
        }
        // All four strategies with per-head rows; smart_mask and naive with per-layer transposed K.
        assert_eq!(ran, 6);
    }

    #[test]
    fn a_relayout_that_cannot_hold_the_rows_is_refused() {
        let mut c = cache(
            geometry(16, &[1], KLayout::Rows, Granularity::PerHead),
            Strategy::SmartMask,
        );
        fill(&mut c, 0, 10);
        let smaller = CacheSpec::for_simulation(
            geometry(8, &[1], KLayout::Rows, Granularity::PerHead),
            Strategy::SmartMask,
        );
        let err = c
            .relayout_into(smaller, &HostAllocator::default())
            .unwrap_err();
        assert!(
            matches!(
                err,
                KvError::RelayoutMismatch {
                    what: "the capacity",
                    ..
                }
            ),
            "{err}"
        );
        let other_shape = CacheSpec::for_simulation(
            Geometry::new(2, 2, 4, 32, &[1], DataType::U8),
            Strategy::SmartMask,
        );
        let err = c
            .relayout_into(other_shape, &HostAllocator::default())
            .unwrap_err();
        assert!(err.to_string().contains("row shape"), "{err}");
    }
}
