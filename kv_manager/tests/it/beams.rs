//! Beams on one shared cache against a naive reference of B independent caches (plain row lists,
//! copied on every reorder): after every plan, each beam's query row must see exactly the rows its own
//! cache would hold (the contents of its mask-visible rows, as a multiset, since attention does not
//! depend on where a row lies) at the position its own cache would give, for every strategy and layout.

use kv_manager::{BeamError, BeamKv, Geometry, KvCache, KvError, Plan};
use proptest::prelude::*;
use quant::DataType;

use test_support::kv::{Rng, cache, configs};

#[derive(Debug, Clone)]
enum BeamOp {
    /// Step every beam: one batched step, or (`single`) one AR-1 step per beam.
    Step { seed: u64, single: bool },
    /// New beam i continues old beam `picks[i] % count`.
    Reorder(Vec<usize>),
    /// Truncate every beam to `pick % (longest + 1)` tokens.
    Rollback(usize),
}

fn beam_op(max_beams: usize) -> impl proptest::strategy::Strategy<Value = BeamOp> {
    prop_oneof![
        8 => (any::<u64>(), proptest::bool::weighted(0.2))
            .prop_map(|(seed, single)| BeamOp::Step { seed, single }),
        5 => proptest::collection::vec(any::<usize>(), 1..=max_beams).prop_map(BeamOp::Reorder),
        1 => any::<usize>().prop_map(BeamOp::Rollback),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    layers: usize,
    heads: usize,
    head_dim: usize,
    context: usize,
    dtype: DataType,
    beams: usize,
    prompt: usize,
    ops: Vec<BeamOp>,
}

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    (
        1usize..=2,
        1usize..=2,
        1usize..=3,
        20usize..=40,
        prop_oneof![Just(DataType::U8), Just(DataType::U16)],
        1usize..=4,
        0usize..=6,
    )
        .prop_flat_map(|(layers, heads, head_dim, context, dtype, beams, prompt)| {
            proptest::collection::vec(beam_op(beams), 1..=30).prop_map(move |ops| Case {
                layers,
                heads,
                head_dim,
                context,
                dtype,
                beams,
                prompt,
                ops,
            })
        })
}

/// One beam of the reference: its position-ordered rows, per buffer.
type Rows = Vec<Vec<Vec<u8>>>;

fn row(seed: u64, buffer: usize, q: usize, bytes: usize) -> Vec<u8> {
    let mut rng = Rng((seed ^ ((buffer * 64 + q) as u64).wrapping_mul(0x9E37_79B9)) | 1);
    (0..bytes).map(|_| rng.next_u64() as u8).collect()
}

/// Writes the step's new rows (as a graph would) and returns them per query row and buffer.
fn write_outputs(cache: &mut KvCache, seed: u64) -> Vec<Vec<Vec<u8>>> {
    let g = cache.spec().geometry.clone();
    let (d, e) = (g.head_dim, g.dtype.size_bytes());
    let (plan, region) = cache.pending_io().expect("planned");
    let mut out = vec![vec![Vec::new(); g.buffers()]; plan.ar];
    for t in 0..plan.tensor_count() {
        let b = plan.new_output(t);
        for h in 0..b.shape[0] {
            let buffer = g.buffer_index(b.layer, b.head.unwrap_or(h), b.kind);
            for (q, rows) in out.iter_mut().enumerate() {
                let bytes = row(seed, buffer, q, d * e);
                for c in 0..d {
                    let at = b.offset + b.element_offset(h, q, c, e);
                    region[at..at + e].copy_from_slice(&bytes[c * e..(c + 1) * e]);
                }
                rows[buffer] = bytes;
            }
        }
    }
    out
}

/// The rows query row `q` sees in every buffer (sorted: a multiset), and its new-column visibility.
fn visible(cache: &KvCache, plan: &Plan, q: usize) -> Result<Rows, String> {
    let g = &cache.spec().geometry;
    let (d, e, s, w) = (
        g.head_dim,
        g.dtype.size_bytes(),
        plan.context,
        plan.window(),
    );
    let mask = &plan.mask[q * s..(q + 1) * s];
    for (j, &m) in mask[w..].iter().enumerate() {
        if (m == 0.0) != (j == q) {
            return Err(format!("query {q} sees new column {j}: {m}"));
        }
    }
    let region = cache.region().as_slice();
    let mut rows: Rows = vec![Vec::new(); g.buffers()];
    for t in 0..plan.tensor_count() {
        let b = plan.past(t);
        for h in 0..b.shape[0] {
            let buffer = g.buffer_index(b.layer, b.head.unwrap_or(h), b.kind);
            for j in (0..w).filter(|&j| mask[j] == 0.0) {
                let bytes: Vec<u8> = (0..d)
                    .flat_map(|c| {
                        let at = b.offset + b.element_offset(h, j, c, e);
                        region[at..at + e].to_vec()
                    })
                    .collect();
                rows[buffer].push(bytes);
            }
            rows[buffer].sort();
        }
    }
    Ok(rows)
}

/// Prefills `prompt` tokens (one AR-1 step each) and returns their rows per buffer.
fn prefill(cache: &mut KvCache, prompt: usize) -> Rows {
    let mut rows: Rows = vec![Vec::new(); cache.spec().geometry.buffers()];
    for i in 0..prompt {
        cache.plan(1).unwrap();
        let new = write_outputs(cache, 0xABCD + i as u64);
        cache.commit(1).unwrap();
        for (r, n) in rows.iter_mut().zip(&new[0]) {
            r.push(n.clone());
        }
    }
    rows
}

struct Reference {
    prompt: Rows,
    /// Per beam, per buffer: its own rows.
    beams: Vec<Rows>,
}

impl Reference {
    fn sees(&self, beam: usize) -> Rows {
        let mut rows: Rows = self.prompt.clone();
        for (r, own) in rows.iter_mut().zip(&self.beams[beam]) {
            r.extend(own.iter().cloned());
            r.sort();
        }
        rows
    }

    fn len(&self, beam: usize) -> usize {
        self.beams[beam][0].len()
    }
}

/// One step over `stepping` beams on the AR-`ar` graph, checked against the reference.
fn step(
    cache: &mut KvCache,
    kv: &mut BeamKv,
    reference: &mut Reference,
    ar: usize,
    stepping: &[usize],
    seed: u64,
) -> Result<bool, String> {
    let before = cache.len();
    let plan = match kv.plan(cache, ar, stepping) {
        Err(BeamError::Cache(KvError::ContextFull { len, .. }))
            if len + ar > cache.spec().geometry.capacity() =>
        {
            return Ok(false);
        }
        other => other.map_err(|e| e.to_string())?.clone(),
    };
    for (q, &b) in stepping.iter().enumerate() {
        let want = (reference.prompt[0].len() + reference.len(b)) as i32;
        if plan.positions[q] != want {
            return Err(format!("beam {b} position {} != {want}", plan.positions[q]));
        }
        if visible(cache, &plan, q)? != reference.sees(b) {
            return Err(format!(
                "beam {b} (query {q}) sees other rows than its own cache"
            ));
        }
    }
    let new = write_outputs(cache, seed);
    kv.commit(cache).map_err(|e| e.to_string())?;
    for (q, &b) in stepping.iter().enumerate() {
        for (r, n) in reference.beams[b].iter_mut().zip(&new[q]) {
            r.push(n.clone());
        }
    }
    if cache.len() > before + stepping.len() {
        return Err("the cache grew by more than one row per beam".into());
    }
    Ok(true)
}

fn run(case: &Case, config_index: usize) -> Result<(), TestCaseError> {
    // AR variants: 1 (decode, and stepping beams one at a time) and one with room for every beam.
    let ar: Vec<usize> = if case.beams > 1 {
        vec![1, case.beams]
    } else {
        vec![1]
    };
    let g = Geometry::new(
        case.layers,
        case.heads,
        case.head_dim,
        case.context,
        &ar,
        case.dtype,
    );
    let config = configs(&ar)[config_index];
    let mut cache = cache(&g, config);
    let prompt = prefill(&mut cache, case.prompt);
    let mut kv = BeamKv::new(&cache, case.beams).unwrap();
    let mut reference = Reference {
        beams: vec![vec![Vec::new(); g.buffers()]; case.beams],
        prompt,
    };
    let name = format!("{} {:?} {:?}", config.0.name(), config.1, config.2);
    for (i, op) in case.ops.iter().enumerate() {
        let fail = |m: String| TestCaseError::fail(format!("{name}: op {i} {op:?}: {m}"));
        match op {
            BeamOp::Step { seed, single } => {
                let count = kv.count();
                if *single || count == 1 {
                    for b in 0..count {
                        step(
                            &mut cache,
                            &mut kv,
                            &mut reference,
                            1,
                            &[b],
                            seed + b as u64,
                        )
                        .map_err(fail)?;
                    }
                } else {
                    let all: Vec<usize> = (0..count).collect();
                    step(&mut cache, &mut kv, &mut reference, case.beams, &all, *seed)
                        .map_err(fail)?;
                }
            }
            BeamOp::Reorder(picks) => {
                let idx: Vec<usize> = picks.iter().map(|p| p % kv.count()).collect();
                kv.reorder(&mut cache, &idx)
                    .map_err(|e| fail(e.to_string()))?;
                reference.beams = idx.iter().map(|&i| reference.beams[i].clone()).collect();
            }
            BeamOp::Rollback(pick) => {
                let longest = (0..kv.count()).map(|b| kv.beam_len(b)).max().unwrap_or(0);
                let to = pick % (longest + 1);
                kv.rollback(&mut cache, to)
                    .map_err(|e| fail(e.to_string()))?;
                for beam in &mut reference.beams {
                    beam.iter_mut().for_each(|r| r.truncate(to));
                }
            }
        }
        for b in 0..kv.count() {
            prop_assert_eq!(kv.beam_len(b), reference.len(b), "{}: beam {}", name, b);
        }
        let independent: usize = (0..kv.count())
            .map(|b| case.prompt + reference.len(b))
            .sum();
        prop_assert_eq!(kv.rows_independent(), independent);
        prop_assert!(kv.rows_held() <= cache.len());
        prop_assert!(kv.rows_held() <= independent.max(case.prompt));
    }
    prop_assert_eq!(kv.counters().rows_copied_by_reorders, 0);
    // The prompt stays shared and untouched: ending the beams leaves exactly the prompt.
    let prompt_len = kv.prompt_len();
    kv.finish(&mut cache).unwrap();
    prop_assert_eq!(cache.len(), prompt_len);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_strategy_and_layout_shows_each_beam_its_own_cache(case in case()) {
        for config in 0..configs(&[1, 2]).len() {
            run(&case, config)?;
        }
    }
}

#[test]
fn slot_strategies_reuse_freed_rows_and_pointer_shift_ones_append() {
    let g = Geometry::new(1, 1, 2, 64, &[1, 4], DataType::U8);
    for config in configs(&[1, 4]) {
        let mut cache = cache(&g, config);
        prefill(&mut cache, 5);
        let mut kv = BeamKv::new(&cache, 4).unwrap();
        for s in 0..10 {
            kv.plan(&mut cache, 4, &[0, 1, 2, 3]).unwrap();
            write_outputs(&mut cache, s);
            kv.commit(&mut cache).unwrap();
            // Beams 0 and 1 win: each continues twice.
            kv.reorder(&mut cache, &[0, 0, 1, 1]).unwrap();
        }
        let c = *kv.counters();
        assert_eq!(c.rows_written, 40);
        assert_eq!(c.rows_copied_by_reorders, 0);
        // Each reorder drops the rows beams 2 and 3 wrote in the step before it, and (from the second
        // on) the last row of the lineage that lost: 2 + 9 x 3.
        assert_eq!(c.rows_freed, 2 + 9 * 3);
        assert_eq!(kv.rows_independent(), 4 * (5 + 10));
        assert_eq!(kv.rows_shared(), 5 + 9 + 2);
        let reuse = matches!(
            config.0,
            kv_manager::Strategy::SmartMask | kv_manager::Strategy::Naive
        );
        if reuse {
            // Step 1 reuses the 2 rows the first reorder freed, every later step 3 of its 4 rows.
            assert_eq!(c.rows_reused, 2 + 8 * 3, "{config:?}");
            assert_eq!(cache.len(), 5 + 4 + 2 + 8, "{config:?}");
            assert_eq!(kv.rows_held() + 3, cache.len());
        } else {
            assert_eq!(c.rows_reused, 0, "{config:?}");
            assert_eq!(cache.len(), 5 + 40, "{config:?}");
        }
    }
}

#[test]
fn misuse_is_refused_with_a_typed_error() {
    let g = Geometry::new(1, 1, 2, 16, &[1, 2], DataType::U8);
    let mut cache = cache(&g, configs(&[1, 2])[0]);
    prefill(&mut cache, 2);
    assert_eq!(
        BeamKv::new(&cache, 0).unwrap_err(),
        BeamError::BeamCount { count: 0 }
    );
    let mut kv = BeamKv::new(&cache, 3).unwrap();
    assert_eq!(
        kv.plan(&mut cache, 2, &[0, 1, 2]).unwrap_err(),
        BeamError::TooManyBeams { beams: 3, ar: 2 }
    );
    assert_eq!(
        kv.plan(&mut cache, 2, &[]).unwrap_err(),
        BeamError::BeamCount { count: 0 }
    );
    assert_eq!(
        kv.plan(&mut cache, 2, &[1, 1]).unwrap_err(),
        BeamError::DuplicateBeam { index: 1 }
    );
    assert_eq!(
        kv.reorder(&mut cache, &[0, 3]).unwrap_err(),
        BeamError::BeamIndex { index: 3, beams: 3 }
    );
    assert_eq!(
        kv.commit(&mut cache).unwrap_err(),
        BeamError::NothingPlanned
    );
    // Someone else steps the cache: the beams notice instead of reading wrong rows.
    cache.plan(1).unwrap();
    cache.commit(1).unwrap();
    assert_eq!(
        kv.plan(&mut cache, 1, &[0]).unwrap_err(),
        BeamError::CacheMoved {
            expected: 2,
            found: 3
        }
    );
}
