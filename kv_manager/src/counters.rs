//! What the manager did: per step and in total.

/// Counters of one step (its `plan` and `commit`/`rollback`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Bytes the manager copied (rebases, slot copies, slides, relayouts).
    pub bytes_copied: usize,
    /// Rebases: `shift` moving one layer's valid rows back (per layer); relayouts of a strided layout
    /// when the AR variant changes are counted here too.
    pub rebases: usize,
    /// New memory handles a QNN HTP backend would register this step: one per distinct
    /// (tensor, byte offset, byte length) binding not seen before.
    pub new_handles: usize,
}

/// Totals since the cache was built (not cleared by `reset`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Steps planned.
    pub steps: usize,
    /// Tokens committed.
    pub tokens_committed: usize,
    pub bytes_copied: usize,
    pub rebases: usize,
    /// Distinct (tensor, offset, length) bindings seen: the memory handles a QNN HTP backend needs.
    pub handles: usize,
    /// The largest number of distinct past-window bindings of any one buffer.
    pub max_window_offsets_per_buffer: usize,
    /// The most bytes copied by one step.
    pub worst_step_bytes_copied: usize,
    /// The highest byte of the region any binding has reached (how much of the region is really used).
    pub peak_bytes_in_use: usize,
    /// The region's size in bytes.
    pub region_bytes: usize,
    /// Evictions ([`crate::KvCache::evict`]), the tokens they dropped and the rows they moved (their
    /// bytes are counted in `bytes_copied`).
    pub evictions: usize,
    pub tokens_evicted: usize,
    pub rows_moved_by_evictions: usize,
    /// Relayouts ([`crate::KvCache::relayout_into`]: the cache moved to another geometry, e.g. the
    /// graphs of a larger context length), the rows they moved and their bytes (also counted in
    /// `bytes_copied`).
    pub relayouts: usize,
    pub rows_moved_by_relayouts: usize,
    pub bytes_moved_by_relayouts: usize,
}

/// Remembers which (group position, variant) keys have been bound, to count handles.
#[derive(Debug, Clone)]
pub(crate) struct HandleTracker {
    positions: usize,
    variants: usize,
    /// One bitset per group, `positions * variants` bits.
    seen: Vec<Vec<u64>>,
    distinct: Vec<usize>,
}

impl HandleTracker {
    pub(crate) fn new(groups: usize, positions: usize, variants: usize) -> Self {
        let bits = positions * variants;
        HandleTracker {
            positions,
            variants,
            // One zeroed allocation per group (not clones of one, which would copy, and so touch,
            // every page): a large bitset of a long `shift` reservation is then mapped lazily and
            // costs memory only where handles are marked.
            seen: (0..groups).map(|_| vec![0; bits.div_ceil(64)]).collect(),
            distinct: vec![0; groups],
        }
    }

    /// Marks (group, position, variant) as bound; true when it is new.
    pub(crate) fn mark(&mut self, group: usize, position: usize, variant: usize) -> bool {
        debug_assert!(position < self.positions && variant < self.variants);
        let bit = variant * self.positions + position;
        let word = &mut self.seen[group][bit / 64];
        let mask = 1u64 << (bit % 64);
        if *word & mask != 0 {
            return false;
        }
        *word |= mask;
        self.distinct[group] += 1;
        true
    }

    pub(crate) fn max_distinct(&self) -> usize {
        self.distinct.iter().copied().max().unwrap_or(0)
    }
}
