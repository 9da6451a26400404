//! The random operations both property tests draw (`oracle.rs`, `snapshot.rs`).
#![allow(dead_code)]

use proptest::prelude::*;

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
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
