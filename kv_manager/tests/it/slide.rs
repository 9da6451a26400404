//! Evictions (sliding windows) against the naive reference, for every strategy and layout.
//!
//! Random interleavings of steps, rollbacks, resets, evictions (keeping or renumbering positions),
//! K-row rewrites (what a RoPE re-rotation does) and save/restore (export, import): after every
//! operation the cache must hold exactly the reference rows, every plan must show them and number
//! positions from the cache's offset, and every configuration ends with the same bytes.

use kv_manager::{Eviction, KvCache, PositionMode, TensorKind};
use proptest::prelude::*;
use quant::DataType;

use test_support::kv::{Op, Rows, apply, assert_export, cache, configs, op};

#[derive(Debug, Clone)]
enum SlideOp {
    Base(Op),
    Evict {
        keep: usize,
        drop: usize,
        keep_positions: bool,
    },
    /// Rewrite the K rows of tokens `from % (len + 1)..len`.
    RewriteKeys {
        from: usize,
    },
    SaveRestore,
}

fn slide_op() -> impl proptest::strategy::Strategy<Value = SlideOp> {
    prop_oneof![
        8 => op().prop_map(SlideOp::Base),
        3 => (any::<usize>(), any::<usize>(), any::<bool>())
            .prop_map(|(keep, drop, keep_positions)| SlideOp::Evict { keep, drop, keep_positions }),
        1 => any::<usize>().prop_map(|from| SlideOp::RewriteKeys { from }),
        1 => Just(SlideOp::SaveRestore),
    ]
}

/// The reference cache: rows per buffer and the position offset.
#[derive(Debug, Clone, PartialEq)]
struct Reference {
    rows: Rows,
    offset: usize,
}

/// The K-row rewrite both sides apply: deterministic in (layer, head, token) and the row.
fn rewrite(layer: usize, head: usize, token: usize, row: &mut [f32]) {
    let first = row[0];
    let d = row.len();
    for c in 0..d {
        let next = if c + 1 < d { row[c + 1] } else { first };
        row[c] = next * 0.75 + layer as f32 - 0.5 * head as f32 + 0.25 * (token % 7) as f32;
    }
}

fn apply_slide(c: &mut KvCache, r: &mut Reference, op: &SlideOp) -> Result<(), String> {
    let g = c.spec().geometry.clone();
    let len = r.rows[0].len();
    match op {
        SlideOp::Base(base) => {
            apply(c, &mut r.rows, base)?;
            if matches!(base, Op::Reset) {
                r.offset = 0;
            }
        }
        SlideOp::Evict {
            keep,
            drop,
            keep_positions,
        } => {
            let keep = keep % (len + 1);
            let drop = drop % (len - keep + 1);
            let mode = if *keep_positions {
                PositionMode::Keep
            } else {
                PositionMode::Renumber
            };
            let before = c.counters().rows_moved_by_evictions;
            let e: Eviction = c.evict(keep, drop, mode).map_err(|e| e.to_string())?;
            let moved_tokens = if drop == 0 {
                0
            } else if matches!(
                c.spec().strategy,
                kv_manager::Strategy::Shift { .. } | kv_manager::Strategy::Naive
            ) {
                keep
            } else {
                len - keep - drop
            };
            if e.rows_moved != moved_tokens * g.buffers()
                || c.counters().rows_moved_by_evictions != before + e.rows_moved
            {
                return Err(format!(
                    "eviction moved {e:?}, expected {moved_tokens} tokens"
                ));
            }
            r.rows.iter_mut().for_each(|rows| {
                rows.drain(keep..keep + drop);
            });
            if *keep_positions {
                r.offset += drop;
            }
            if c.evict(keep, len + 1, mode).is_ok() {
                return Err("an eviction past the end was accepted".into());
            }
        }
        SlideOp::RewriteKeys { from } => {
            let from = from % (len + 1);
            c.map_key_rows(from..len, rewrite)
                .map_err(|e| e.to_string())?;
            for (b, rows) in r.rows.iter_mut().enumerate() {
                let (layer, head, kind) = g.buffer_coords(b);
                if kind != TensorKind::Key {
                    continue;
                }
                let spec = c.encoding(b).clone();
                for (t, row) in rows.iter_mut().enumerate().skip(from) {
                    let mut values = vec![0f32; g.head_dim];
                    quant::decode_bytes_to_f32(row, &spec, &mut values).unwrap();
                    rewrite(layer, head, t, &mut values);
                    quant::encode_f32_to_bytes(&values, &spec, row).unwrap();
                }
            }
        }
        SlideOp::SaveRestore => {
            let snapshot = c.export_rows();
            let offset = c.position_offset();
            c.import_rows(&snapshot).map_err(|e| e.to_string())?;
            c.set_position_offset(offset);
        }
    }
    if c.len() != r.rows[0].len() || c.position_offset() != r.offset {
        return Err(format!(
            "len {} offset {} != reference {} {}",
            c.len(),
            c.position_offset(),
            r.rows[0].len(),
            r.offset
        ));
    }
    Ok(())
}

fn case() -> impl proptest::strategy::Strategy<Value = (kv_manager::Geometry, Vec<SlideOp>)> {
    (
        (1usize..=2, 1usize..=2, 1usize..=3, 3usize..=16),
        proptest::collection::vec(1usize..=5, 1..=3),
        prop_oneof![Just(DataType::U8), Just(DataType::U16), Just(DataType::F32)],
        proptest::collection::vec(slide_op(), 1..=60),
    )
        .prop_map(|((layers, heads, head_dim, context), ar_raw, dtype, ops)| {
            let mut ar: Vec<usize> = ar_raw.into_iter().filter(|&n| 2 * n <= context).collect();
            ar.sort_unstable();
            ar.dedup();
            while ar.len() > 1 && ar[0] + ar[ar.len() - 1] > context {
                ar.pop();
            }
            if ar.is_empty() {
                ar = vec![1];
            }
            (
                kv_manager::Geometry::new(layers, heads, head_dim, context, &ar, dtype),
                ops,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_strategy_matches_the_reference_across_slides((geometry, ops) in case()) {
        let mut ends = Vec::new();
        for config in configs(&geometry.ar_variants) {
            let mut c = cache(&geometry, config);
            let mut r = Reference { rows: vec![Vec::new(); geometry.buffers()], offset: 0 };
            for (i, op) in ops.iter().enumerate() {
                apply_slide(&mut c, &mut r, op).map_err(|m| {
                    TestCaseError::fail(format!("{config:?} op {i} {op:?}: {m}"))
                })?;
                assert_export(&c, &r.rows)?;
            }
            ends.push((c.export_rows(), r));
        }
        prop_assert!(ends.windows(2).all(|w| w[0] == w[1]));
    }
}

#[test]
fn an_eviction_outside_the_cache_and_a_per_axis_rewrite_are_refused() {
    let g = kv_manager::Geometry::new(1, 1, 2, 8, &[1], DataType::U8);
    let mut c = cache(
        &g,
        (
            kv_manager::Strategy::Naive,
            kv_manager::KLayout::Rows,
            kv_manager::Granularity::PerHead,
        ),
    );
    for _ in 0..3 {
        c.plan(1).unwrap();
        c.commit(1).unwrap();
    }
    assert_eq!(
        c.evict(2, 2, PositionMode::Keep).unwrap_err(),
        kv_manager::KvError::InvalidEviction {
            keep: 2,
            drop: 2,
            len: 3
        }
    );
    assert!(c.evict(usize::MAX, 1, PositionMode::Keep).is_err());
    assert!(c.map_key_rows(2..4, |_, _, _, _| {}).is_err());
    let mut spec = c.spec().clone();
    spec.encodings[0].encoding = quant::Encoding::PerAxis {
        axis: 3,
        params: vec![quant::ScaleOffset::new(1.0, 0).unwrap(); 2],
    };
    let mut per_axis = KvCache::new(spec, &kv_manager::HostAllocator::default()).unwrap();
    per_axis.plan(1).unwrap();
    per_axis.commit(1).unwrap();
    assert!(matches!(
        per_axis.map_key_rows(0..1, |_, _, _, _| {}),
        Err(kv_manager::KvError::Requantize { .. })
    ));
}
