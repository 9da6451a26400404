//! Every strategy against a naive reference kept as a plain list of rows per buffer.
//!
//! After every `plan`, the bytes the graph would read at every visible (non-masked) window position,
//! the mask and the positions must equal what the reference says; no output binding may overlap
//! another output or any visible past row (so the graph's writes can never clobber a valid row).

use kv_manager::{
    CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, Plan, Reserve,
    Strategy,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use quant::DataType;

use test_support::kv::{Op, Rng, op};

#[derive(Debug, Clone)]
struct Case {
    layers: usize,
    heads: usize,
    head_dim: usize,
    context: usize,
    ar: Vec<usize>,
    dtype: DataType,
    ops: Vec<Op>,
    extra: usize,
    stagger: bool,
}

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    (
        1usize..=3,
        1usize..=3,
        1usize..=4,
        3usize..=24,
        proptest::collection::vec(1usize..=7, 1..=3),
        prop_oneof![Just(DataType::U8), Just(DataType::U16), Just(DataType::F32)],
        proptest::collection::vec(op(), 1..=60),
        0usize..=24,
        any::<bool>(),
    )
        .prop_map(
            |(layers, heads, head_dim, context, ar_raw, dtype, ops, extra, stagger)| {
                let mut ar: Vec<usize> = ar_raw.into_iter().filter(|&n| n < context).collect();
                ar.sort_unstable();
                ar.dedup();
                // Every variant must fit at least once: min + max <= context.
                while ar.len() > 1 && ar[0] + ar[ar.len() - 1] > context {
                    ar.pop();
                }
                if ar.is_empty() || 2 * ar[0] > context {
                    ar = vec![1];
                }
                Case {
                    layers,
                    heads,
                    head_dim,
                    context,
                    ar,
                    dtype,
                    ops,
                    extra,
                    stagger,
                }
            },
        )
}

/// Checks a plan against the reference rows; returns the error text on a mismatch.
fn check_plan(
    plan: &Plan,
    geometry: &Geometry,
    left_padded: bool,
    region: &[u8],
    reference: &[Vec<Vec<u8>>],
) -> Result<(), String> {
    let len = reference[0].len();
    let (n, s) = (plan.ar, geometry.context);
    let w = s - n;
    let e = geometry.dtype.size_bytes();
    let d = geometry.head_dim;
    if plan.past_len != len {
        return Err(format!("past_len {} != {len}", plan.past_len));
    }
    let positions: Vec<i32> = (0..n).map(|i| (len + i) as i32).collect();
    if plan.positions != positions {
        return Err(format!("positions {:?} != {positions:?}", plan.positions));
    }
    // The expected mask, from first principles.
    for i in 0..n {
        for j in 0..s {
            let visible = if j < w {
                if left_padded { j >= w - len } else { j < len }
            } else {
                j - w <= i
            };
            let got = plan.mask[i * s + j];
            let want = if visible { 0.0 } else { f32::NEG_INFINITY };
            if got != want {
                return Err(format!("mask[{i}][{j}] = {got}, want {want}"));
            }
        }
    }
    // Visible rows hold the reference history, in order; mark them to detect aliasing outputs.
    let mut marks = vec![0u8; region.len()];
    let visible_rows: Vec<usize> = if left_padded {
        (w - len..w).collect()
    } else {
        (0..len).collect()
    };
    for t in 0..plan.tensor_count() {
        let past = plan.past(t);
        if past.offset + past.bytes > region.len() {
            return Err(format!("past binding {t} ends past the region"));
        }
        let heads = past.shape[0];
        for h in 0..heads {
            let head = past.head.unwrap_or(h);
            let b = geometry.buffer_index(past.layer, head, past.kind);
            for (token, &j) in visible_rows.iter().enumerate() {
                let mut row = Vec::with_capacity(d * e);
                for c in 0..d {
                    let at = past.offset + past.element_offset(h, j, c, e);
                    row.extend_from_slice(&region[at..at + e]);
                    marks[at..at + e].fill(1);
                }
                if row != reference[b][token] {
                    return Err(format!(
                        "buffer {b} (layer {}, head {head}, {}) token {token} at window row {j}: read {row:?}, \
                         reference {:?}",
                        past.layer, past.kind, reference[b][token]
                    ));
                }
            }
        }
    }
    for t in 0..plan.tensor_count() {
        let new = plan.new_output(t);
        if new.offset + new.bytes > region.len() {
            return Err(format!("new binding {t} ends past the region"));
        }
        if let Some(k) = marks[new.offset..new.offset + new.bytes]
            .iter()
            .position(|&m| m != 0)
        {
            return Err(format!(
                "output {t} byte {} overlaps a {} (plan {plan:?})",
                new.offset + k,
                if marks[new.offset + k] == 1 {
                    "visible past row"
                } else {
                    "another output"
                }
            ));
        }
        marks[new.offset..new.offset + new.bytes].fill(2);
    }
    Ok(())
}

fn run(
    case: &Case,
    strategy: Strategy,
    k_layout: KLayout,
    granularity: Granularity,
) -> Result<(), TestCaseError> {
    let geometry = Geometry {
        k_layout,
        granularity,
        ..Geometry::new(
            case.layers,
            case.heads,
            case.head_dim,
            case.context,
            &case.ar,
            case.dtype,
        )
    };
    let spec = CacheSpec::for_simulation(geometry.clone(), strategy);
    let mut cache = KvCache::new(spec, &HostAllocator::default())
        .map_err(|e| TestCaseError::fail(format!("construction failed: {e}")))?;
    let left_padded = !matches!(strategy, Strategy::SmartMask);
    let b_count = geometry.buffers();
    let e = geometry.dtype.size_bytes();
    let d = geometry.head_dim;
    let mut reference: Vec<Vec<Vec<u8>>> = vec![Vec::new(); b_count];
    for (step, op) in case.ops.iter().enumerate() {
        match op {
            Op::Step {
                ar_pick,
                accept,
                seed,
            } => {
                let n = geometry.ar_variants[ar_pick % geometry.ar_variants.len()];
                let len = reference[0].len();
                if len + n > geometry.capacity() {
                    let err = cache.plan(n).expect_err("plan past capacity must fail");
                    prop_assert!(matches!(err, KvError::ContextFull { .. }), "{err}");
                    continue;
                }
                let mut rng = Rng(seed | 1);
                let (plan, region) = {
                    cache
                        .plan(n)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    cache.pending_io().expect("planned")
                };
                check_plan(plan, &geometry, left_padded, region, &reference).map_err(|m| {
                    TestCaseError::fail(format!("step {step} (AR-{n}, len {len}): {m}"))
                })?;
                // The graph writes n new rows into every output binding.
                let mut new_rows = vec![Vec::new(); b_count];
                for t in 0..plan.tensor_count() {
                    let out = plan.new_output(t);
                    for byte in &mut region[out.offset..out.offset + out.bytes] {
                        *byte = rng.next_u64() as u8;
                    }
                    for h in 0..out.shape[0] {
                        let b = geometry.buffer_index(out.layer, out.head.unwrap_or(h), out.kind);
                        for i in 0..n {
                            let mut row = Vec::with_capacity(d * e);
                            for c in 0..d {
                                let at = out.offset + out.element_offset(h, i, c, e);
                                row.extend_from_slice(&region[at..at + e]);
                            }
                            new_rows[b].push(row);
                        }
                    }
                }
                if let Some(accept) = accept {
                    let k = accept % (n + 1);
                    cache
                        .commit(k)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    for (rows, new) in reference.iter_mut().zip(new_rows) {
                        rows.extend(new.into_iter().take(k));
                    }
                }
            }
            Op::Rollback(pick) => {
                let len = reference[0].len();
                let to = pick % (len + 1);
                cache
                    .rollback(to)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                reference.iter_mut().for_each(|r| r.truncate(to));
            }
            Op::Reset => {
                cache.reset();
                reference.iter_mut().for_each(Vec::clear);
            }
        }
        prop_assert_eq!(cache.len(), reference[0].len());
    }
    // The conveyor and shift-2x never copy; the copying strategies copy when they commit.
    let c = cache.counters();
    if matches!(strategy, Strategy::Conveyor) || strategy == Strategy::SHIFT_2X {
        prop_assert_eq!(c.bytes_copied, 0, "zero-copy strategy copied");
    }
    prop_assert!(c.peak_bytes_in_use <= c.region_bytes);
    Ok(())
}

const CASES: u32 = 256;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn shift_2x(case in case()) {
        run(&case, Strategy::SHIFT_2X, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn shift_small_reserve(case in case()) {
        let reserve = Reserve::Spare(case.ar.iter().max().copied().unwrap_or(1) + case.extra % case.context);
        run(&case, Strategy::Shift { reserve, stagger: case.stagger }, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn shift_1_5x_staggered(case in case()) {
        // 1.5x is only valid when half the context covers the largest AR variant.
        let max_ar = case.ar.iter().max().copied().unwrap_or(1);
        let min_ar = case.ar.iter().min().copied().unwrap_or(1);
        prop_assume!((case.context - min_ar) / 2 >= max_ar);
        let strategy = Strategy::Shift { reserve: Reserve::Factor(1.5), stagger: true };
        run(&case, strategy, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn conveyor(case in case()) {
        run(&case, Strategy::Conveyor, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn smart_mask_rows_per_head(case in case()) {
        run(&case, Strategy::SmartMask, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn smart_mask_transposed_per_head(case in case()) {
        run(&case, Strategy::SmartMask, KLayout::Transposed, Granularity::PerHead)?;
    }

    #[test]
    fn smart_mask_rows_per_layer(case in case()) {
        run(&case, Strategy::SmartMask, KLayout::Rows, Granularity::PerLayer)?;
    }

    #[test]
    fn smart_mask_transposed_per_layer(case in case()) {
        run(&case, Strategy::SmartMask, KLayout::Transposed, Granularity::PerLayer)?;
    }

    #[test]
    fn naive_rows_per_head(case in case()) {
        run(&case, Strategy::Naive, KLayout::Rows, Granularity::PerHead)?;
    }

    #[test]
    fn naive_transposed_per_head(case in case()) {
        run(&case, Strategy::Naive, KLayout::Transposed, Granularity::PerHead)?;
    }

    #[test]
    fn naive_rows_per_layer(case in case()) {
        run(&case, Strategy::Naive, KLayout::Rows, Granularity::PerLayer)?;
    }

    #[test]
    fn naive_transposed_per_layer(case in case()) {
        run(&case, Strategy::Naive, KLayout::Transposed, Granularity::PerLayer)?;
    }
}
