//! Saturation counts against a direct count: every configuration, codes written through the new-row
//! bindings as a graph writes them, part of a step committed.

use kv_manager::{Geometry, KvCache, TensorKind};
use quant::DataType;
use test_support::kv::{cache, configs};

/// The code a graph "writes" at (layer, head, kind, step token, channel): saturated on a pattern
/// that differs per buffer.
fn code(layer: usize, head: usize, kind: TensorKind, row: usize, c: usize) -> u8 {
    let k = usize::from(kind == TensorKind::Value);
    if (layer * 7 + head * 3 + k + row * 2 + c).is_multiple_of(5) {
        [0, 255][(row + c) % 2]
    } else {
        1 + ((row + c) % 250) as u8
    }
}

fn write_step(cache: &mut KvCache) {
    let (plan, region) = cache.pending_io().expect("planned");
    for i in 0..plan.tensor_count() {
        let b = plan.new_output(i);
        for head in 0..plan.heads_per_tensor {
            let h = b.head.unwrap_or(head);
            for row in 0..plan.ar {
                for c in 0..plan.head_dim {
                    let at = b.offset + b.element_offset(head, row, c, 1);
                    region[at] = code(b.layer, h, b.kind, row, c);
                }
            }
        }
    }
}

#[test]
fn saturated_codes_of_committed_rows_are_counted_per_buffer() {
    let g = Geometry::new(2, 2, 8, 32, &[1, 4], DataType::U8);
    for config in configs(&[1, 4]) {
        let mut c = cache(&g, config);
        c.set_saturation_counting(true);
        // Two steps: AR-4 keeping 3 rows, then AR-1 keeping it.
        for (ar, keep) in [(4, 3), (1, 1)] {
            c.plan(ar).unwrap();
            write_step(&mut c);
            c.commit(keep).unwrap();
        }
        let s = c.saturation();
        for (buffer, counts) in s.buffers.iter().enumerate() {
            let (layer, head, kind) = g.buffer_coords(buffer);
            let rows: Vec<usize> = vec![0, 1, 2, 0];
            let expected = rows
                .iter()
                .flat_map(|&r| (0..8).map(move |ch| (r, ch)))
                .filter(|&(r, ch)| matches!(code(layer, head, kind, r, ch), 0 | 255))
                .count() as u64;
            assert_eq!(counts.values, 4 * 8, "{config:?} buffer {buffer}");
            assert_eq!(counts.saturated, expected, "{config:?} buffer {buffer}");
        }
        assert!(s.worst(&g).is_some());
    }
}

/// Counting is off until asked for (a commit then reads no code), and a relayout into a larger
/// cache keeps the counts and goes on counting.
#[test]
fn counting_is_opt_in_and_survives_a_relayout() {
    let g = Geometry::new(2, 2, 8, 32, &[1, 4], DataType::U8);
    let step = |c: &mut KvCache| {
        c.plan(4).unwrap();
        write_step(c);
        c.commit(4).unwrap();
    };
    let config = configs(&[1, 4])[0];
    let mut off = cache(&g, config);
    step(&mut off);
    assert!(!off.counts_saturation());
    assert_eq!(off.saturation().total(), Default::default());
    let mut on = cache(&g, config);
    on.set_saturation_counting(true);
    step(&mut on);
    let once = on.saturation().total();
    assert!(once.saturated > 0 && once.values == 4 * 8 * g.buffers() as u64);
    let larger = Geometry::new(2, 2, 8, 64, &[1, 4], DataType::U8);
    let spec = kv_manager::CacheSpec::for_simulation(larger, on.spec().strategy);
    let mut moved = on
        .relayout_into(spec, &kv_manager::HostAllocator::default())
        .unwrap();
    assert!(moved.counts_saturation());
    assert_eq!(moved.saturation(), on.saturation());
    step(&mut moved);
    assert_eq!(moved.saturation().total().values, 2 * once.values);
    assert_eq!(moved.saturation().total().saturated, 2 * once.saturated);
}
