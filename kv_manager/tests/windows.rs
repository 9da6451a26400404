//! Per-layer attention windows against a naive reference: after every plan, each new token of
//! each layer sees — through its layer's mask and past binding — exactly the cached rows of the
//! last W positions (all positions for a global layer), byte for byte, under random steps, partial
//! commits, rollbacks and resets, for every strategy and layout that accepts windows; the others
//! are refused with their reason.

mod common;

use common::{Op, Rows, op};
use kv_manager::{
    CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, Plan, Reserve,
    Strategy, mask_name, parse_mask_name,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use quant::DataType;

/// The configurations that take sliding-window layers.
fn accepted(max_ar: usize) -> Vec<Strategy> {
    vec![
        Strategy::SHIFT_2X,
        Strategy::Shift {
            reserve: Reserve::Spare(max_ar),
            stagger: true,
        },
        Strategy::Conveyor,
        Strategy::Naive,
    ]
}

/// The cached tokens new token `i` of a layer sees through `mask` (`[n, rows + n]`) and which
/// new tokens, checking each visible past row's bytes against the reference.
fn seen(
    plan: &Plan,
    region: &[u8],
    t: usize,
    mask: &[f32],
    reference: &[Vec<u8>],
    i: usize,
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let past = plan.past(t);
    let rows = past.shape[2];
    let (n, len, e) = (plan.ar, plan.past_len, plan.elem_bytes);
    let row = &mask[i * (rows + n)..(i + 1) * (rows + n)];
    let mut cached = Vec::new();
    for j in (0..rows).filter(|&j| row[j] == 0.0) {
        // Left-padded: column j holds token len - rows + j.
        let token = (len + j)
            .checked_sub(rows)
            .ok_or_else(|| format!("padding column {j} is visible"))?;
        let bytes: Vec<u8> = (0..plan.head_dim)
            .flat_map(|c| {
                let at = past.offset + past.element_offset(0, j, c, e);
                region[at..at + e].to_vec()
            })
            .collect();
        if bytes != reference[token] {
            return Err(format!("column {j} (token {token}) holds other bytes"));
        }
        cached.push(token);
    }
    let new = (0..n).filter(|&k| row[rows + k] == 0.0).collect();
    Ok((cached, new))
}

/// The windows check of a step: for every buffer and every new token, the rows visible through
/// the layer's mask and binding are the reference's last W rows (all rows for a global layer).
fn check_windows(
    cache: &KvCache,
    plan: &Plan,
    region: &[u8],
    reference: &Rows,
) -> Result<(), String> {
    let g = &cache.spec().geometry;
    let (n, len) = (plan.ar, reference[0].len());
    for t in 0..plan.tensor_count() {
        let past = plan.past(t);
        let b = g.buffer_index(past.layer, past.head.expect("per_head"), past.kind);
        let window = g.layer_window(past.layer);
        if past.shape[2] != g.past_rows(past.layer, n) || past.offset + past.bytes > region.len() {
            return Err(format!("buffer {b}: binding {past:?}"));
        }
        let mask = plan.mask_for(window).ok_or("no mask for the window")?;
        for i in 0..n {
            let (cached, new) = seen(plan, region, t, mask, &reference[b], i)?;
            // The naive reference: the last W positions, or all of them.
            let first = window.map_or(0, |w| (len + i + 1).saturating_sub(w));
            let want: Vec<usize> = (first.min(len)..len).collect();
            if cached != want || new != (0..=i).collect::<Vec<_>>() {
                return Err(format!(
                    "buffer {b} window {window:?} token {i}: sees {cached:?} + new {new:?}, \
                     expected {want:?} + new 0..={i}"
                ));
            }
        }
    }
    Ok(())
}

fn apply(cache: &mut KvCache, reference: &mut Rows, op: &Op) -> Result<(), String> {
    common::apply_checked(cache, reference, op, &check_windows)
}

/// A geometry with a random window (or none) per layer.
fn geometry() -> impl proptest::strategy::Strategy<Value = Geometry> {
    (
        prop_oneof![Just(vec![1]), Just(vec![1, 4]), Just(vec![3])],
        10usize..24,
        proptest::collection::vec(proptest::option::of(0usize..100), 3),
    )
        .prop_map(|(ar, context, picks)| {
            let max_ar = *ar.iter().max().unwrap();
            let mut g = Geometry::new(3, 2, 2, context, &ar, DataType::U8);
            // Windows in [max_ar, S - max_ar + 1].
            let span = context - 2 * max_ar + 2;
            g.windows = picks
                .into_iter()
                .map(|p| p.map(|p| max_ar + p % span))
                .collect();
            g
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_layer_sees_exactly_its_last_w_rows(
        g in geometry(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        for strategy in accepted(g.max_ar()) {
            let spec = CacheSpec::for_simulation(g.clone(), strategy);
            let mut cache = KvCache::new(spec, &HostAllocator::default()).unwrap();
            let mut reference: Rows = vec![Vec::new(); g.buffers()];
            for (i, op) in ops.iter().enumerate() {
                apply(&mut cache, &mut reference, op).map_err(|m| {
                    TestCaseError::fail(format!("{} op {i} {op:?}: {m}", strategy.name()))
                })?;
            }
        }
    }
}

#[test]
fn windows_are_validated_and_refused_where_the_view_cannot_work() {
    let g = Geometry::new(2, 1, 4, 32, &[1, 8], DataType::U8);
    for (windows, why) in [
        (vec![Some(8)], "1 windows for 2 layers"),
        (vec![Some(7), None], "window 7 must be between"),
        (vec![None, Some(26)], "context - 8 + 1 = 25"),
    ] {
        let g = Geometry {
            windows,
            ..g.clone()
        };
        let err = g.validate().unwrap_err().to_string();
        assert!(err.contains("`windows`") && err.contains(why), "{err}");
    }
    let windowed = g.clone().with_windows(&[1], 8);
    windowed.validate().unwrap();
    let refused = |strategy, k_layout, granularity, why: &str| {
        let geometry = Geometry {
            k_layout,
            granularity,
            ..windowed.clone()
        };
        let err = CacheSpec::for_simulation(geometry, strategy)
            .region_bytes()
            .unwrap_err();
        assert!(
            matches!(&err, KvError::UnsupportedCombination { reason, .. } if reason.contains(why)),
            "{err}"
        );
    };
    refused(
        Strategy::SmartMask,
        KLayout::Rows,
        Granularity::PerHead,
        "left-padded",
    );
    refused(
        Strategy::Naive,
        KLayout::Transposed,
        Granularity::PerHead,
        "per_head tensors with k_layout rows",
    );
    refused(
        Strategy::Naive,
        KLayout::Rows,
        Granularity::PerLayer,
        "per_head tensors with k_layout rows",
    );
    // Without windows the same layouts are served.
    assert!(
        CacheSpec::for_simulation(g, Strategy::SmartMask)
            .region_bytes()
            .is_ok()
    );
}

#[test]
fn mask_names_round_trip() {
    assert_eq!(mask_name(None), "attention_mask");
    assert_eq!(mask_name(Some(16)), "attention_mask_w16");
    for w in [None, Some(1), Some(4096)] {
        assert_eq!(parse_mask_name(&mask_name(w)), Some(w));
    }
    for bad in [
        "attention_mask_w",
        "attention_mask_16",
        "attention_mask_w1x",
        "mask",
    ] {
        assert_eq!(parse_mask_name(bad), None, "{bad}");
    }
}

#[test]
fn window_masks_are_banded_and_quantize() {
    let g = Geometry::new(2, 1, 2, 16, &[1, 4], DataType::U8).with_windows(&[0], 4);
    let mut c = KvCache::new(
        CacheSpec::for_simulation(g, Strategy::Naive),
        &HostAllocator::default(),
    )
    .unwrap();
    for _ in 0..2 {
        c.plan(4).unwrap();
        c.commit(4).unwrap();
    }
    let plan = c.plan(4).unwrap();
    assert_eq!(plan.window_masks.len(), 1);
    let (x, o) = (f32::NEG_INFINITY, 0.0);
    // 3 past columns then 4 new: token i sees past columns i.. and new tokens ..=i.
    #[rustfmt::skip]
    let want = vec![
        o, o, o, o, x, x, x,
        x, o, o, o, o, x, x,
        x, x, o, o, o, o, x,
        x, x, x, o, o, o, o,
    ];
    assert_eq!(plan.mask_for(Some(4)).unwrap(), &want[..]);
    assert_eq!(plan.past(0).shape, [1, 1, 3, 2]);
    assert_eq!(plan.past(2).shape, [1, 1, 12, 2]);
    let spec = quant::QuantSpec {
        dtype: DataType::U8,
        encoding: quant::Encoding::PerTensor(quant::ScaleOffset {
            scale: 1.0,
            offset: -128,
        }),
    };
    let mut out = vec![0u8; 28];
    plan.mask_quantized_for(Some(4), &spec, &mut out).unwrap();
    assert_eq!(&out[..7], &[128, 128, 128, 128, 0, 0, 0]);
    assert!(plan.mask_quantized_for(Some(5), &spec, &mut out).is_err());
}
