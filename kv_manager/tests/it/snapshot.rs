//! Snapshots across strategies, against a naive reference kept as a plain list of rows per buffer.
//!
//! Random steps on every allowed (strategy, K layout, granularity) configuration A, export, import
//! into every configuration B (which had its own, different history), then the same random steps on
//! A and on each B: every plan of both must show exactly the reference rows in its visible windows,
//! and the export must equal the reference at the switch and at the end.

use kv_manager::Geometry;
use proptest::prelude::*;
use quant::DataType;

use test_support::kv::{Op, Rows, apply_ops as run_ops, assert_export, cache, configs, op};

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
