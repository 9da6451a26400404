//! The random operations the KV cache's property tests draw (mostly steps, some rollbacks, a few
//! resets), applied to a cache and to a plain reference of every buffer's committed rows.

use kv_manager::{
    CacheSpec, Geometry, Granularity, HostAllocator, KLayout, KvCache, KvError, KvSnapshot, Plan,
    Reserve, Strategy,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;

/// One operation on a cache and its reference.
#[derive(Debug, Clone)]
pub enum Op {
    /// Plan AR-`ar_pick % variants`, write random rows, then commit `accept % (n + 1)` (or abandon).
    Step {
        ar_pick: usize,
        accept: Option<usize>,
        seed: u64,
    },
    Rollback(usize),
    Reset,
}

/// Mostly steps, some rollbacks, a few resets.
pub fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    prop_oneof![
        12 => (any::<usize>(), proptest::option::weighted(0.9, any::<usize>()), any::<u64>())
            .prop_map(|(ar_pick, accept, seed)| Op::Step { ar_pick, accept, seed }),
        2 => any::<usize>().prop_map(Op::Rollback),
        1 => Just(Op::Reset),
    ]
}

/// A small deterministic generator for row bytes (xorshift64*).
#[derive(Debug)]
pub struct Rng(pub u64);
impl Rng {
    /// The next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Every configuration a cache accepts (`shift` and `conveyor` need per-head K rows).
pub fn configs(ar: &[usize]) -> Vec<(Strategy, KLayout, Granularity)> {
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

pub type Rows = Vec<Vec<Vec<u8>>>;

/// Applies `op` to the cache and the reference; after `plan`, checks the positions and every
/// visible window row ([`check_window`]).
pub fn apply(cache: &mut KvCache, reference: &mut Rows, op: &Op) -> Result<(), String> {
    apply_checked(cache, reference, op, &check_window)
}

/// How a test checks a planned step (the plan, the region, the reference before the step)
/// before the graph's new rows are written.
pub type CheckStep<'a> = dyn Fn(&KvCache, &Plan, &[u8], &Rows) -> Result<(), String> + 'a;

/// Applies `op` to the cache and the reference, checking every planned step with `check`; the
/// new rows' bytes depend on (seed, buffer, token) only, so every configuration writes the same.
pub fn apply_checked(
    cache: &mut KvCache,
    reference: &mut Rows,
    op: &Op,
    check: &CheckStep<'_>,
) -> Result<(), String> {
    let g = cache.spec().geometry.clone();
    let (d, e) = (g.head_dim, g.dtype.size_bytes());
    match op {
        Op::Step {
            ar_pick,
            accept,
            seed,
        } => {
            let n = g.ar_variants[ar_pick % g.ar_variants.len()];
            if reference[0].len() + n > g.capacity() {
                return match cache.plan(n) {
                    Err(KvError::ContextFull { .. }) => Ok(()),
                    other => Err(format!("plan past capacity gave {other:?}")),
                };
            }
            cache.plan(n).map_err(|e| e.to_string())?;
            {
                let plan = cache.pending_plan().expect("planned");
                check(cache, plan, cache.region().as_slice(), reference)?;
            }
            let (plan, region) = cache.pending_io().expect("planned");
            let mut new_rows: Rows = vec![Vec::new(); g.buffers()];
            for t in 0..plan.tensor_count() {
                let out = plan.new_output(t);
                for h in 0..out.shape[0] {
                    let b = g.buffer_index(out.layer, out.head.unwrap_or(h), out.kind);
                    for i in 0..n {
                        let mut rng =
                            Rng((seed ^ ((b * 64 + i) as u64).wrapping_mul(0x9E37_79B9)) | 1);
                        let row: Vec<u8> = (0..d * e).map(|_| rng.next_u64() as u8).collect();
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

/// The seed check of a step: the new tokens' positions follow the cached ones, and every cached
/// row sits in its buffer's window where the strategy keeps it (left-padded or from the start).
pub fn check_window(
    cache: &KvCache,
    plan: &Plan,
    region: &[u8],
    reference: &Rows,
) -> Result<(), String> {
    let g = &cache.spec().geometry;
    let left_padded = cache.spec().strategy.left_padded();
    let (d, e, n, len) = (
        g.head_dim,
        g.dtype.size_bytes(),
        plan.ar,
        reference[0].len(),
    );
    let first = len + cache.position_offset();
    let want: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    if plan.positions != want {
        return Err(format!("positions {:?} != {want:?}", plan.positions));
    }
    let w = g.context - n;
    for t in 0..plan.tensor_count() {
        let past = plan.past(t);
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
    }
    Ok(())
}

pub fn apply_ops(
    cache: &mut KvCache,
    reference: &mut Rows,
    ops: &[Op],
) -> Result<(), TestCaseError> {
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

pub fn assert_export(cache: &KvCache, reference: &Rows) -> Result<KvSnapshot, TestCaseError> {
    let snapshot = cache.export_rows();
    prop_assert_eq!(snapshot.len, reference[0].len());
    for (b, rows) in reference.iter().enumerate() {
        prop_assert_eq!(&snapshot.rows[b], &rows.concat(), "buffer {}", b);
    }
    Ok(snapshot)
}

pub fn cache(
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
