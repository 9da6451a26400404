//! Per-layer attention windows against a naive reference: after every plan, each new token of
//! each layer sees — through its layer's mask and past binding — exactly the cached rows of the
//! last W positions (all positions for a global layer), byte for byte, under random steps, partial
//! commits, rollbacks and resets, for every strategy and layout that accepts windows; the others
//! are refused with their reason.

use kv_manager::{
    CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, KvSnapshot, Plan,
    PositionMode, Reserve, Strategy, mask_name, parse_mask_name,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use quant::DataType;
use test_support::kv::{Op, Rows, op};

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

/// What the windows test draws: the shared steps, rollbacks and resets, plus snapshots (export,
/// restore into a cache of another strategy, and back) and evictions.
#[derive(Debug, Clone)]
enum WOp {
    Shared(Op),
    /// Export, import into a fresh cache of strategy `pick % 4` (and of a longer context when
    /// `longer`), export that, import it back.
    Snapshot {
        pick: usize,
        longer: bool,
    },
    Evict {
        keep: usize,
        drop: usize,
    },
}

fn wop() -> impl proptest::strategy::Strategy<Value = WOp> {
    prop_oneof![
        14 => op().prop_map(WOp::Shared),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, longer)| WOp::Snapshot { pick, longer }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(keep, drop)| WOp::Evict { keep, drop }),
    ]
}

/// The plain reference: every buffer's rows in order, and per layer the first token a sliding
/// layer still holds, computed here from the documented rule (a sliding layer of window W keeps
/// its last min(W - 1 + max(ar), S - min(ar)) tokens; an import or an eviction keeps the last
/// W - 1; a rollback keeps what it kept, up to the new length; a reset keeps everything).
struct Model {
    rows: Rows,
    first_held: Vec<usize>,
}

impl Model {
    fn len(&self) -> usize {
        self.rows[0].len()
    }

    /// Tokens layer `layer`'s past tensors show at length `len`.
    fn shown(g: &Geometry, layer: usize, len: usize) -> std::ops::Range<usize> {
        let w = g.windows.get(layer).copied().flatten();
        len - w.map_or(len, |w| len.min(w - 1))..len
    }

    fn after_commit(&mut self, g: &Geometry) {
        let len = self.len();
        for (layer, first) in self.first_held.iter_mut().enumerate() {
            if let Some(w) = g.windows.get(layer).copied().flatten() {
                let kept = (w - 1 + g.max_ar()).min(g.context - g.min_ar());
                *first = (*first).max(len.saturating_sub(kept));
            }
        }
    }

    fn after_import(&mut self, g: &Geometry) {
        let len = self.len();
        for (layer, first) in self.first_held.iter_mut().enumerate() {
            *first = Self::shown(g, layer, len).start;
        }
    }

    /// Whether every layer's window at `len` (its tokens mapped by `old`) is still held.
    fn holds(&self, g: &Geometry, len: usize, old: impl Fn(usize) -> usize) -> bool {
        (0..g.layers).all(|l| {
            let shown = Self::shown(g, l, len);
            shown.is_empty() || old(shown.start) >= self.first_held[l]
        })
    }
}

fn fresh(g: &Geometry, strategy: Strategy) -> KvCache {
    KvCache::new(
        CacheSpec::for_simulation(g.clone(), strategy),
        &HostAllocator::default(),
    )
    .expect("accepted")
}

/// The export holds, per buffer, exactly the reference rows its layer shows.
fn check_export(g: &Geometry, cache: &KvCache, model: &Model) -> Result<KvSnapshot, String> {
    let snapshot = cache.export_rows();
    let len = model.len();
    if snapshot.len != len {
        return Err(format!("snapshot of {} tokens, {len} cached", snapshot.len));
    }
    for (b, rows) in model.rows.iter().enumerate() {
        let shown = Model::shown(g, g.buffer_coords(b).0, len);
        if snapshot.rows[b] != rows[shown.clone()].concat() {
            return Err(format!(
                "snapshot buffer {b}: not the rows of tokens {shown:?}"
            ));
        }
    }
    Ok(snapshot)
}

fn apply(cache: &mut KvCache, model: &mut Model, op: &WOp) -> Result<(), String> {
    let g = cache.spec().geometry.clone();
    let len = model.len();
    match op {
        WOp::Shared(Op::Rollback(pick)) => {
            let to = pick % (len + 1);
            let result = cache.rollback(to);
            if model.holds(&g, to, |t| t) {
                result.map_err(|e| e.to_string())?;
                model.rows.iter_mut().for_each(|r| r.truncate(to));
                // Rows are held from at most the new length on (nothing older comes back).
                model.first_held.iter_mut().for_each(|f| *f = (*f).min(to));
            } else if !matches!(result, Err(KvError::RollbackPastWindow { .. })) {
                return Err(format!(
                    "rollback to {to} past the held rows gave {result:?}"
                ));
            }
        }
        WOp::Shared(op) => {
            test_support::kv::apply_checked(cache, &mut model.rows, op, &check_windows)?;
            if matches!(op, Op::Reset) {
                model.first_held.fill(0);
            }
            model.after_commit(&g);
        }
        WOp::Snapshot { pick, longer } => {
            let snapshot = check_export(&g, cache, model)?;
            let other_g = Geometry {
                context: g.context + if *longer { 5 } else { 0 },
                ..g.clone()
            };
            let mut other = fresh(&other_g, accepted(g.max_ar())[pick % 4]);
            other.import_rows(&snapshot).map_err(|e| e.to_string())?;
            let back = other.export_rows();
            if back != snapshot {
                return Err("the restored cache exports other rows".into());
            }
            cache.import_rows(&back).map_err(|e| e.to_string())?;
            model.after_import(&g);
        }
        WOp::Evict { keep, drop } => {
            let keep = keep % (len + 1);
            let drop = drop % (len - keep + 1);
            let old = |t: usize| if t < keep { t } else { t + drop };
            let result = cache.evict(keep, drop, PositionMode::Renumber);
            if drop > 0 && !model.holds(&g, len - drop, old) {
                if !matches!(result, Err(KvError::EvictionPastWindow { .. })) {
                    return Err(format!("eviction past the held rows gave {result:?}"));
                }
            } else {
                result.map_err(|e| e.to_string())?;
                for rows in &mut model.rows {
                    rows.drain(keep..keep + drop);
                }
                if drop > 0 {
                    model.after_import(&g);
                }
            }
        }
    }
    if cache.len() != model.len() {
        return Err(format!("len {} != {}", cache.len(), model.len()));
    }
    Ok(())
}

/// The region rows the test expects, from the documented per-strategy rules, computed here.
fn expected_rows(g: &Geometry, strategy: &Strategy) -> usize {
    let (s, cap, max_ar) = (g.context, g.context - g.min_ar(), g.max_ar());
    let kept = |b: usize| {
        let w = g.windows.get(b / (2 * g.kv_heads)).copied().flatten();
        w.map(|w| (w - 1 + max_ar).min(cap))
    };
    let buffers = 0..g.buffers();
    match strategy {
        Strategy::Shift { reserve, .. } => buffers
            .map(|b| match (kept(b), reserve) {
                (None, Reserve::Factor(f)) => cap + ((f - 1.0) * cap as f64) as usize,
                (Some(k), Reserve::Factor(f)) => k + (((f - 1.0) * k as f64) as usize).max(max_ar),
                (k, Reserve::Spare(x)) => k.unwrap_or(cap) + (*x).max(max_ar),
                (_, Reserve::Rows(_)) => unreachable!("not drawn"),
            })
            .sum(),
        Strategy::Conveyor => {
            let first = g.windows.first().copied().flatten().map_or(cap, |w| w - 1);
            let gaps: usize = (1..g.buffers())
                .map(|b| kept(b).map_or(s, |k| (k + max_ar).min(s)))
                .sum();
            first + gaps + cap
        }
        Strategy::SmartMask | Strategy::Naive => {
            buffers.map(|b| kept(b).unwrap_or(cap) + max_ar).sum()
        }
    }
}

/// A geometry with a random window (or none) per layer.
fn geometry() -> impl proptest::strategy::Strategy<Value = Geometry> {
    (
        prop_oneof![
            Just(vec![1]),
            Just(vec![1, 4]),
            Just(vec![3]),
            Just(vec![2, 5])
        ],
        10usize..40,
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
    #![proptest_config(ProptestConfig {
        cases: std::env::var("WINDOWS_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_layer_sees_exactly_its_last_w_rows(
        g in geometry(),
        ops in proptest::collection::vec(wop(), 1..60),
    ) {
        let global = Geometry { windows: Vec::new(), ..g.clone() };
        for strategy in accepted(g.max_ar()) {
            let mut cache = fresh(&g, strategy);
            // The region is the computed one, smaller than the all-global cache's by exactly
            // what the sliding layers save.
            let rb = g.row_bytes();
            let all_global = fresh(&global, strategy).counters().region_bytes;
            prop_assert_eq!(all_global, expected_rows(&global, &strategy) * rb);
            prop_assert_eq!(cache.counters().region_bytes, expected_rows(&g, &strategy) * rb);
            let mut model = Model {
                rows: vec![Vec::new(); g.buffers()],
                first_held: vec![0; g.layers],
            };
            for (i, op) in ops.iter().enumerate() {
                apply(&mut cache, &mut model, op).map_err(|m| {
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
