//! Snapshots across strategies, against a naive reference kept as a plain list of rows per buffer.
//!
//! Random steps on every allowed (strategy, K layout, granularity) configuration A, export, import
//! into every configuration B (which had its own, different history), then the same random steps on
//! A and on each B: every plan of both must show exactly the reference rows in its visible windows,
//! and the export must equal the reference at the switch and at the end.

use kv_manager::{
    CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, KvSnapshot,
    Reserve, Strategy,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use quant::DataType;

mod common;
use common::{Op, Rng, op};

/// Every configuration a cache accepts (`shift` and `conveyor` need per-head K rows).
fn configs(ar: &[usize]) -> Vec<(Strategy, KLayout, Granularity)> {
    let small = Strategy::Shift {
        reserve: Reserve::Spare(ar.iter().copied().max().unwrap_or(1)),
        stagger: true,
    };
    let mut out = vec![
        (Strategy::SHIFT_2X, KLayout::Rows, Granularity::PerHead),
        (small, KLayout::Rows, Granularity::PerHead),
        (Strategy::Conveyor, KLayout::Rows, Granularity::PerHead),
    ];
    for s in [Strategy::SmartMask, Strategy::Naive] {
        for k in [KLayout::Rows, KLayout::Transposed] {
            for g in [Granularity::PerHead, Granularity::PerLayer] {
                out.push((s, k, g));
            }
        }
    }
    out
}

type Rows = Vec<Vec<Vec<u8>>>;

/// Applies `op` to the cache and the reference; after `plan`, checks every visible window row.
fn apply(cache: &mut KvCache, reference: &mut Rows, op: &Op) -> Result<(), String> {
    let g = cache.spec().geometry.clone();
    let left_padded = cache.spec().strategy.left_padded();
    let (d, e) = (g.head_dim, g.dtype.size_bytes());
    match op {
        Op::Step {
            ar_pick,
            accept,
            seed,
        } => {
            let n = g.ar_variants[ar_pick % g.ar_variants.len()];
            let len = reference[0].len();
            if len + n > g.capacity() {
                return match cache.plan(n) {
                    Err(KvError::ContextFull { .. }) => Ok(()),
                    other => Err(format!("plan past capacity gave {other:?}")),
                };
            }
            cache.plan(n).map_err(|e| e.to_string())?;
            let (plan, region) = cache.pending_io().expect("planned");
            let w = g.context - n;
            let mut new_rows: Rows = vec![Vec::new(); g.buffers()];
            for t in 0..plan.tensor_count() {
                let (past, out) = (plan.past(t), plan.new_output(t));
                for h in 0..past.shape[0] {
                    let b = g.buffer_index(past.layer, past.head.unwrap_or(h), past.kind);
                    for (token, want) in reference[b].iter().enumerate() {
                        let j = if left_padded { w - len + token } else { token };
                        let row: Vec<u8> = (0..d)
                            .flat_map(|c| {
                                let at = past.offset + past.element_offset(h, j, c, e);
                                region[at..at + e].to_vec()
                            })
                            .collect();
                        if row != *want {
                            return Err(format!("buffer {b} token {token}: {row:?} != {want:?}"));
                        }
                    }
                }
                // The graph writes n new rows; their bytes depend on (seed, buffer, token) only, so
                // every configuration computes the same rows.
                for h in 0..out.shape[0] {
                    let b = g.buffer_index(out.layer, out.head.unwrap_or(h), out.kind);
                    for i in 0..n {
                        let mut rng =
                            Rng((seed ^ ((b * 64 + i) as u64).wrapping_mul(0x9E37_79B9)) | 1);
                        let row: Vec<u8> = (0..d * e).map(|_| rng.next() as u8).collect();
                        for c in 0..d {
                            let at = out.offset + out.element_offset(h, i, c, e);
                            region[at..at + e].copy_from_slice(&row[c * e..(c + 1) * e]);
                        }
                        new_rows[b].push(row);
                    }
                }
            }
            if let Some(accept) = accept {
                let k = accept % (n + 1);
                cache.commit(k).map_err(|e| e.to_string())?;
                for (rows, new) in reference.iter_mut().zip(new_rows) {
                    rows.extend(new.into_iter().take(k));
                }
            }
        }
        Op::Rollback(pick) => {
            let to = pick % (reference[0].len() + 1);
            cache.rollback(to).map_err(|e| e.to_string())?;
            reference.iter_mut().for_each(|r| r.truncate(to));
        }
        Op::Reset => {
            cache.reset();
            reference.iter_mut().for_each(Vec::clear);
        }
    }
    if cache.len() != reference[0].len() {
        return Err(format!("len {} != {}", cache.len(), reference[0].len()));
    }
    Ok(())
}

fn run_ops(cache: &mut KvCache, reference: &mut Rows, ops: &[Op]) -> Result<(), TestCaseError> {
    for (i, op) in ops.iter().enumerate() {
        apply(cache, reference, op).map_err(|m| {
            TestCaseError::fail(format!(
                "{} op {i} {op:?}: {m}",
                cache.spec().strategy.name()
            ))
        })?;
    }
    Ok(())
}

fn assert_export(cache: &KvCache, reference: &Rows) -> Result<KvSnapshot, TestCaseError> {
    let snapshot = cache.export_rows();
    prop_assert_eq!(snapshot.len, reference[0].len());
    for (b, rows) in reference.iter().enumerate() {
        prop_assert_eq!(&snapshot.rows[b], &rows.concat(), "buffer {}", b);
    }
    Ok(snapshot)
}

#[derive(Debug, Clone)]
struct Case {
    geometry: Geometry,
    before: Vec<Op>,
    other: Vec<Op>,
    after: Vec<Op>,
}

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    (
        (1usize..=2, 1usize..=2, 1usize..=3, 3usize..=16),
        proptest::collection::vec(1usize..=5, 1..=3),
        prop_oneof![Just(DataType::U8), Just(DataType::U16), Just(DataType::F32)],
        proptest::collection::vec(op(), 0..=30),
        proptest::collection::vec(op(), 0..=10),
        proptest::collection::vec(op(), 1..=30),
    )
        .prop_map(
            |((layers, heads, head_dim, context), ar_raw, dtype, before, other, after)| {
                let mut ar: Vec<usize> = ar_raw.into_iter().filter(|&n| 2 * n <= context).collect();
                ar.sort_unstable();
                ar.dedup();
                while ar.len() > 1 && ar[0] + ar[ar.len() - 1] > context {
                    ar.pop();
                }
                if ar.is_empty() {
                    ar = vec![1];
                }
                Case {
                    geometry: Geometry::new(layers, heads, head_dim, context, &ar, dtype),
                    before,
                    other,
                    after,
                }
            },
        )
}

fn cache(
    g: &Geometry,
    (strategy, k_layout, granularity): (Strategy, KLayout, Granularity),
) -> KvCache {
    let geometry = Geometry {
        k_layout,
        granularity,
        ..g.clone()
    };
    KvCache::new(
        CacheSpec::for_simulation(geometry, strategy),
        &HostAllocator::default(),
    )
    .expect("valid config")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_strategy_pair_continues_from_an_imported_snapshot(case in case()) {
        let configs = configs(&case.geometry.ar_variants);
        let empty: Rows = vec![Vec::new(); case.geometry.buffers()];
        for &a in &configs {
            let mut cache_a = cache(&case.geometry, a);
            let mut reference = empty.clone();
            run_ops(&mut cache_a, &mut reference, &case.before)?;
            let snapshot = assert_export(&cache_a, &reference)?;
            let mut end = reference.clone();
            run_ops(&mut cache_a, &mut end, &case.after)?;
            assert_export(&cache_a, &end)?;
            for &b in &configs {
                // B has its own history (and maybe a pending plan) that the import replaces.
                let mut cache_b = cache(&case.geometry, b);
                run_ops(&mut cache_b, &mut empty.clone(), &case.other)?;
                cache_b.import_rows(&snapshot).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut continued = reference.clone();
                run_ops(&mut cache_b, &mut continued, &case.after)?;
                prop_assert_eq!(&continued, &end);
                assert_export(&cache_b, &end)?;
            }
        }
    }
}
