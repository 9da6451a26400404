//! Simulated workloads shared by the benchmarks, the `kv_update` example and `htpkv plan`: a stand-in
//! for the graph that writes new K/V rows, the floor that does only that write, and the strategies of
//! the seed comparison.

use crate::{CacheSpec, Geometry, HostAllocator, KvCache, KvError, Plan, Strategy};
use std::time::Instant;

/// Writes what a graph would: every byte of every new-row binding of `plan`, set to `value`.
pub fn graph_write(plan: &Plan, region: &mut [u8], value: u8) {
    let bytes = plan.new_bytes();
    for &offset in &plan.new_offsets {
        region[offset..offset + bytes].fill(value);
    }
}

/// The seed geometry of the benchmark: Llama-2-7B (32 layers, 32 KV heads, head_dim 128), S = 2048,
/// u16, per_head, decode only (`ar: [1]`).
pub fn llama2_7b_decode() -> Geometry {
    Geometry::new(32, 32, 128, 2048, &[1], quant::DataType::U16)
}

/// The strategies compared by the benchmark, in their spelling (each one's label is its
/// Display): `shift` 2x, 1.5x unstaggered and staggered, 64 spare rows, `conveyor`, `smart_mask`
/// and `naive`.
pub fn seed_strategies() -> Vec<Strategy> {
    [
        "shift-2x",
        "shift-1.5x",
        "shift-1.5x-staggered",
        "shift-+64",
        "conveyor",
        "smart_mask",
        "naive",
    ]
    .into_iter()
    .map(|s| s.parse().expect("the seed spellings parse"))
    .collect()
}

/// The floor: one new row written into each of B buffers laid out one window apart, with no
/// bookkeeping. The row moves one position per step, as a sliding window's output would.
#[derive(Debug)]
pub struct Floor {
    region: crate::Region,
    buffers: usize,
    window_rows: usize,
    row_bytes: usize,
    step: usize,
}

impl Floor {
    /// A floor for `geometry`'s AR-1 window.
    pub fn new(geometry: &Geometry) -> Result<Floor, KvError> {
        let window_rows = geometry.max_window();
        let buffers = geometry.buffers();
        let row_bytes = geometry.row_bytes();
        let region =
            crate::Region::allocate(&HostAllocator::default(), buffers * window_rows * row_bytes)?;
        Ok(Floor {
            region,
            buffers,
            window_rows,
            row_bytes,
            step: 0,
        })
    }

    /// Writes one row into every buffer.
    pub fn step(&mut self, value: u8) {
        let row = self.step % self.window_rows;
        let bytes = self.region.as_mut_slice();
        for b in 0..self.buffers {
            let at = (b * self.window_rows + row) * self.row_bytes;
            bytes[at..at + self.row_bytes].fill(value);
        }
        self.step += 1;
    }
}

/// One decode step: plan AR-`ar`, write the graph's outputs, commit them all.
pub fn decode_step(cache: &mut KvCache, ar: usize, value: u8) -> Result<(), KvError> {
    cache.plan(ar)?;
    let (plan, region) = cache.pending_io().expect("a step was just planned");
    graph_write(plan, region, value);
    cache.commit(ar)
}

/// Times of the steps of one run, in nanoseconds, plus what the cache counted.
#[derive(Debug, Clone)]
pub struct StepTimes {
    pub nanos: Vec<u64>,
    pub bytes_copied: Vec<usize>,
    pub region_bytes: usize,
}

impl StepTimes {
    /// Median step time.
    pub fn median_ns(&self) -> u64 {
        let mut v = self.nanos.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }

    /// Slowest step.
    pub fn max_ns(&self) -> u64 {
        self.nanos.iter().copied().max().unwrap_or(0)
    }

    /// Mean bytes copied per step.
    pub fn bytes_copied_per_step(&self) -> f64 {
        self.bytes_copied.iter().sum::<usize>() as f64 / self.bytes_copied.len().max(1) as f64
    }
}

/// Runs `steps` AR-1 decode steps from an empty cache (at most a full context) and times each one.
pub fn time_decode(spec: CacheSpec, steps: usize) -> Result<StepTimes, KvError> {
    time_decode_counting(spec, steps, false)
}

/// [`time_decode`] with saturation counting on or off ([`KvCache::set_saturation_counting`]).
pub fn time_decode_counting(
    spec: CacheSpec,
    steps: usize,
    count_saturation: bool,
) -> Result<StepTimes, KvError> {
    let mut cache = KvCache::new(spec, &HostAllocator::default())?;
    cache.set_saturation_counting(count_saturation);
    let steps = steps.min(cache.spec().geometry.capacity());
    let mut times = StepTimes {
        nanos: Vec::with_capacity(steps),
        bytes_copied: Vec::with_capacity(steps),
        region_bytes: cache.counters().region_bytes,
    };
    for i in 0..steps {
        let start = Instant::now();
        decode_step(&mut cache, 1, i as u8)?;
        times.nanos.push(start.elapsed().as_nanos() as u64);
        times.bytes_copied.push(cache.last_step().bytes_copied);
    }
    Ok(times)
}

/// Times `steps` steps of the floor.
pub fn time_floor(geometry: &Geometry, steps: usize) -> Result<StepTimes, KvError> {
    let mut floor = Floor::new(geometry)?;
    let mut times = StepTimes {
        nanos: Vec::with_capacity(steps),
        bytes_copied: vec![0; steps],
        region_bytes: floor.region.len(),
    };
    for i in 0..steps {
        let start = Instant::now();
        floor.step(i as u8);
        times.nanos.push(start.elapsed().as_nanos() as u64);
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_write_touches_exactly_the_new_bindings() {
        let g = Geometry::new(1, 2, 4, 8, &[1, 2], quant::DataType::U8);
        let mut cache = KvCache::new(
            CacheSpec::for_simulation(g, Strategy::Conveyor),
            &HostAllocator::default(),
        )
        .unwrap();
        cache.plan(2).unwrap();
        let (plan, region) = cache.pending_io().unwrap();
        graph_write(plan, region, 7);
        let written = region.iter().filter(|&&b| b == 7).count();
        assert_eq!(written, plan.tensor_count() * plan.new_bytes());
    }

    #[test]
    fn step_times_report_median_and_max() {
        let t = StepTimes {
            nanos: vec![5, 1, 9],
            bytes_copied: vec![0, 2, 4],
            region_bytes: 0,
        };
        assert_eq!(t.median_ns(), 5);
        assert_eq!(t.max_ns(), 9);
        assert_eq!(t.bytes_copied_per_step(), 2.0);
    }
}
