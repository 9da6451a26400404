//! Criterion benchmark of one AR-1 KV update step (plan + the graph's write + commit) on the
//! Llama-2-7B geometry, for every strategy and the floor (the write alone). `naive` moves ~1 GiB a
//! step, so it gets a small sample. Run: `cargo bench -p kv_manager --bench kv_update`.

use criterion::{Criterion, criterion_group, criterion_main};
use kv_manager::workload::{Floor, decode_step, llama2_7b_decode, seed_strategies};
use kv_manager::{CacheSpec, HostAllocator, KvCache};

fn kv_update(c: &mut Criterion) {
    let geometry = llama2_7b_decode();
    let mut group = c.benchmark_group("kv_update_step");
    for strategy in seed_strategies() {
        let name = strategy.to_string();
        if strategy == kv_manager::Strategy::Naive {
            group.sample_size(10);
        }
        let spec = CacheSpec::for_simulation(geometry.clone(), strategy);
        let mut cache = KvCache::new(spec, &HostAllocator::default()).expect("region");
        let mut value = 0u8;
        group.bench_function(&name, |b| {
            b.iter(|| {
                if cache.len() == geometry.capacity() {
                    cache.reset();
                }
                value = value.wrapping_add(1);
                decode_step(&mut cache, 1, value).expect("step");
            })
        });
    }
    let mut floor = Floor::new(&geometry).expect("floor region");
    group.sample_size(100);
    group.bench_function("floor", |b| b.iter(|| floor.step(1)));
    group.finish();
}

criterion_group!(benches, kv_update);
criterion_main!(benches);
