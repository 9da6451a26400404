//! Static cross-attention K/V under every strategy and layout: arbitrary steps, rollbacks, resets
//! and evictions never change a static row, never bind an output over one, and the self-attention
//! rows still match the naive reference (test_support::kv::apply checks every visible window row).

use kv_manager::{
    CROSS_ALIGN, CacheSpec, CrossSpec, Geometry, Granularity, HostAllocator, KvCache, KvError,
    KvIo, KvTensor, PositionMode, TensorKind,
};
use proptest::prelude::*;
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};

use test_support::kv::{Op, Rng, Rows, apply, configs, op};

fn encoding(dtype: DataType, b: usize) -> QuantSpec {
    if dtype.is_fixed_point() {
        QuantSpec {
            dtype,
            encoding: Encoding::PerTensor(ScaleOffset {
                scale: 0.01 * (b + 1) as f32,
                offset: -3,
            }),
        }
    } else {
        QuantSpec::float(dtype).unwrap()
    }
}

fn cross_spec(g: &Geometry, rows: usize, granularity: Granularity, dtype: DataType) -> CrossSpec {
    CrossSpec {
        rows,
        granularity,
        encodings: (0..g.buffers()).map(|b| encoding(dtype, b)).collect(),
    }
}

fn build(
    g: &Geometry,
    cross: CrossSpec,
    config: (kv_manager::Strategy, kv_manager::KLayout, Granularity),
) -> KvCache {
    let (strategy, k_layout, granularity) = config;
    let geometry = Geometry {
        k_layout,
        granularity,
        ..g.clone()
    };
    let mut spec = CacheSpec::for_simulation(geometry, strategy);
    spec.cross = Some(cross);
    KvCache::new(spec, &HostAllocator::default()).expect("valid config")
}

/// Fills every cross tensor with seeded bytes; returns them in graph order.
fn fill(cache: &mut KvCache, seed: u64) -> Vec<Vec<u8>> {
    let g = cache.spec().geometry.clone();
    let cross = cache.spec().cross.clone().unwrap();
    let mut rng = Rng(seed | 1);
    let mut all = Vec::new();
    for t in cross.tensors(&g) {
        let bytes: Vec<u8> = (0..cross.tensor_bytes(&g).unwrap())
            .map(|_| rng.next_u64() as u8)
            .collect();
        cache
            .fill_cross(&t, &cross.tensor_encoding(&g, &t), &bytes)
            .unwrap();
        all.push(bytes);
    }
    all
}

fn check_static(cache: &KvCache, filled: &[Vec<u8>]) -> Result<(), String> {
    for (i, want) in filled.iter().enumerate() {
        if cache.cross_bytes(i) != Some(want.as_slice()) {
            return Err(format!("cross tensor {i} changed"));
        }
    }
    Ok(())
}

/// No past window or new-row binding of a pending plan overlaps a cross tensor.
fn check_disjoint(cache: &KvCache) -> Result<(), String> {
    let Some(plan) = cache.pending_plan() else {
        return Ok(());
    };
    if plan.cross != cache.cross_bindings() {
        return Err("the plan's cross bindings moved".into());
    }
    for c in &plan.cross {
        for t in 0..plan.tensor_count() {
            for b in [plan.past(t), plan.new_output(t)] {
                if b.offset < c.offset + c.bytes && c.offset < b.offset + b.bytes {
                    return Err(format!("{b:?} overlaps cross {c:?}"));
                }
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Action {
    Op(Op),
    Evict { keep: usize, drop: usize },
}

fn action() -> impl proptest::strategy::Strategy<Value = Action> {
    prop_oneof![
        8 => op().prop_map(Action::Op),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(keep, drop)| Action::Evict { keep, drop }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn steps_rollbacks_and_evictions_never_touch_static_rows(
        layers in 1usize..=2,
        heads in 1usize..=2,
        head_dim in 1usize..=4,
        context in 6usize..=16,
        multi in any::<bool>(),
        self_dtype in prop_oneof![Just(DataType::U8), Just(DataType::U16), Just(DataType::F32)],
        cross_dtype in prop_oneof![Just(DataType::U8), Just(DataType::U16), Just(DataType::F32)],
        rows in 1usize..=9,
        per_layer_cross in any::<bool>(),
        actions in proptest::collection::vec(action(), 1..=40),
        seed in any::<u64>(),
    ) {
        let ar: &[usize] = if multi { &[1, 3] } else { &[1] };
        let g = Geometry::new(layers, heads, head_dim, context, ar, self_dtype);
        let granularity = if per_layer_cross { Granularity::PerLayer } else { Granularity::PerHead };
        for config in configs(ar) {
            let mut cache = build(&g, cross_spec(&g, rows, granularity, cross_dtype), config);
            let filled = fill(&mut cache, seed);
            let mut reference: Rows = vec![Vec::new(); g.buffers()];
            for (i, a) in actions.iter().enumerate() {
                let result = match a {
                    Action::Op(op) => apply(&mut cache, &mut reference, op)
                        .and_then(|()| check_disjoint(&cache)),
                    Action::Evict { keep, drop } => {
                        let len = reference[0].len();
                        let keep = keep % (len + 1);
                        let drop = drop % (len - keep + 1);
                        reference.iter_mut().for_each(|r| { r.drain(keep..keep + drop); });
                        cache.evict(keep, drop, PositionMode::Renumber).map(|_| ()).map_err(|e| e.to_string())
                    }
                };
                let result = result.and_then(|()| check_static(&cache, &filled));
                prop_assert!(result.is_ok(), "{} action {i} {a:?}: {:?}", config.0.name(), result);
            }
            // A snapshot import refills the self-attention rows only.
            let snapshot = cache.export_rows();
            cache.import_rows(&snapshot).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(check_static(&cache, &filled).is_ok());
        }
    }
}

fn small() -> (Geometry, CrossSpec) {
    let g = Geometry::new(2, 2, 4, 8, &[1], DataType::U8);
    let cross = cross_spec(&g, 5, Granularity::PerHead, DataType::U16);
    (g, cross)
}

fn key(layer: usize, head: Option<usize>) -> KvTensor {
    KvTensor {
        io: KvIo::Cross,
        kind: TensorKind::Key,
        layer,
        head,
    }
}

#[test]
fn the_region_counts_the_static_buffers_after_an_aligned_gap() {
    let (g, cross) = small();
    let plain = CacheSpec::for_simulation(g.clone(), kv_manager::Strategy::Naive);
    let self_bytes = plain.region_bytes().unwrap();
    let with = CacheSpec {
        cross: Some(cross.clone()),
        ..plain
    };
    // 8 buffers x 5 rows x 4 channels x 2 bytes.
    assert_eq!(cross.region_bytes(&g).unwrap(), 8 * 5 * 4 * 2);
    let base = self_bytes.div_ceil(CROSS_ALIGN) * CROSS_ALIGN;
    assert_eq!(with.region_bytes().unwrap(), base + 320);
    let cache = KvCache::new(with, &HostAllocator::default()).unwrap();
    assert_eq!(cache.counters().region_bytes, base + 320);
    assert_eq!(cache.cross_bindings()[0].offset, base);
    assert_eq!(cache.cross_bindings()[0].shape, [1, 1, 5, 4]);
}

#[test]
fn fills_of_the_wrong_size_encoding_or_tensor_are_typed_errors() {
    let (g, cross) = small();
    let mut spec = CacheSpec::for_simulation(g.clone(), kv_manager::Strategy::SHIFT_2X);
    spec.cross = Some(cross.clone());
    let mut cache = KvCache::new(spec, &HostAllocator::default()).unwrap();
    let t = key(1, Some(0));
    let enc = cross.tensor_encoding(&g, &t);
    let right = vec![1u8; 40];
    assert_eq!(
        cache.fill_cross(&t, &enc, &right[..39]),
        Err(KvError::CrossSize {
            tensor: "cross_key_1_0".into(),
            expected: 40,
            found: 39
        })
    );
    let other = encoding(DataType::U16, 7);
    assert!(matches!(
        cache.fill_cross(&t, &other, &right),
        Err(KvError::CrossEncoding { .. })
    ));
    for bad in [
        key(2, Some(0)),
        key(0, Some(2)),
        key(0, None),
        KvTensor {
            io: KvIo::Past,
            ..t
        },
    ] {
        let err = cache.fill_cross(&bad, &enc, &right).unwrap_err();
        assert!(matches!(err, KvError::CrossTensor { .. }), "{bad:?}: {err}");
    }
    // A step before every tensor is filled is refused, naming the first missing one.
    assert_eq!(
        cache.plan(1).unwrap_err().to_string(),
        "8 cross-attention tensor(s) not filled for this request (first: `cross_key_0_0`): fill \
         them from the encoder before the first step"
    );
    cache.fill_cross(&t, &enc, &right).unwrap();
    // Once per request.
    assert!(matches!(
        cache.fill_cross(&t, &enc, &right),
        Err(KvError::CrossTensor { reason, .. }) if reason.contains("already filled")
    ));
    for tensor in cross.tensors(&g).into_iter().filter(|x| *x != t) {
        let e = cross.tensor_encoding(&g, &tensor);
        cache.fill_cross(&tensor, &e, &right).unwrap();
    }
    assert!(cache.cross_filled());
    cache.plan(1).unwrap();
    cache.commit(1).unwrap();
    // A new request: clear empties and zeroes, the self rows are the caller's to reset.
    cache.clear_cross();
    assert!(!cache.cross_filled());
    assert!(cache.cross_bytes(3).unwrap().iter().all(|&b| b == 0));
    assert!(matches!(
        cache.plan(1),
        Err(KvError::CrossNotFilled { missing: 8, .. })
    ));
    cache.fill_cross(&t, &enc, &right).unwrap();
}

#[test]
fn a_cache_without_cross_buffers_refuses_fills_and_plans_as_before() {
    let (g, cross) = small();
    let spec = CacheSpec::for_simulation(g.clone(), kv_manager::Strategy::Conveyor);
    let mut cache = KvCache::new(spec, &HostAllocator::default()).unwrap();
    let t = key(0, Some(0));
    let err = cache
        .fill_cross(&t, &cross.tensor_encoding(&g, &t), &[0; 40])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot fill cross-attention tensor `cross_key_0_0`: the cache has no cross-attention buffers"
    );
    assert!(cache.plan(1).unwrap().cross.is_empty());
}

#[test]
fn invalid_cross_specs_are_refused_with_the_reason() {
    let (g, cross) = small();
    let base = CacheSpec::for_simulation(g.clone(), kv_manager::Strategy::Naive);
    let mut mixed = cross.clone();
    mixed.encodings[3] = encoding(DataType::U8, 3);
    let mut empty_rows = cross.clone();
    empty_rows.rows = 0;
    let mut short = cross.clone();
    short.encodings.pop();
    for (bad, text) in [
        (mixed, "one data type"),
        (empty_rows, "rows (encoder length)"),
        (short, "expected one encoding per"),
    ] {
        let spec = CacheSpec {
            cross: Some(bad),
            ..base.clone()
        };
        let err = spec.region_bytes().unwrap_err();
        assert!(
            matches!(&err, KvError::InvalidCross { reason } if reason.contains(text)),
            "{err}"
        );
    }
}

#[test]
fn per_layer_cross_tensors_declare_a_per_axis_encoding_when_heads_differ() {
    let (g, mut cross) = small();
    cross.granularity = Granularity::PerLayer;
    let t = key(1, None);
    let enc = cross.tensor_encoding(&g, &t);
    let Encoding::PerAxis { axis: 0, params } = &enc.encoding else {
        panic!("{enc:?}");
    };
    assert_eq!(params.len(), 2);
    assert_eq!(cross.tensor_bytes(&g).unwrap(), 2 * 5 * 4 * 2);
    let same = cross_spec(&g, 5, Granularity::PerLayer, DataType::F32);
    assert_eq!(
        same.tensor_encoding(&g, &t),
        QuantSpec::float(DataType::F32).unwrap()
    );
}
