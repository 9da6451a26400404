//! The shipped configs, config errors, the seed budget numbers, and the budget's closed-form
//! predictions against a real `KvCache` running the same schedule.

use htpkv::budget::{Run, fit_context, predict, region_at, report};
use htpkv::config::{Config, ConfigError, ReserveConfig};
use htpkv::kv_manager::{HostAllocator, KvCache, Reserve, Strategy, workload};
use std::path::{Path, PathBuf};
use test_support::files::ScratchDir;

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs")
}

fn load(name: &str) -> Config {
    let path = configs_dir().join(name);
    Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the schedule of `run` on a real cache (writing every new row, as a graph would) and returns its
/// counters.
fn simulate(config: &Config, run: &Run) -> htpkv::kv_manager::Counters {
    let spec = config.cache_spec();
    let g = spec.geometry.clone();
    let mut cache = KvCache::new(spec, &HostAllocator { prefault: false }).unwrap();
    for (i, step) in run.schedule(&g).into_iter().enumerate() {
        cache.plan(step.ar).unwrap();
        let (plan, region) = cache.pending_io().unwrap();
        workload::graph_write(plan, region, i as u8);
        cache.commit(step.commit).unwrap();
    }
    *cache.counters()
}

#[test]
fn seed_numbers() {
    let mut c = load("llama-2-7b.yaml");
    let shift = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    assert_eq!(shift.region_bytes, 2_146_435_072);
    // 2048 buffers x R = 2(S - 1) rows x 256-byte rows.
    assert_eq!(shift.buffers, 32 * 32 * 2);
    assert_eq!(shift.row_bytes, 128 * 2);
    assert_eq!(shift.reserve_rows, 2 * 2047);
    assert_eq!(shift.kv_bytes_per_token, 2048 * 256);
    // A full context with the 2x reservation never copies, and binds one new window end per step in
    // every layer: 2047 ends x (32 kv heads x K|V x past|new) handles per layer.
    assert_eq!(shift.run.decode_steps, 2047);
    assert_eq!((shift.rows_copied, shift.rebases_per_context), (0, 0));
    assert_eq!(shift.handles, 32 * 2047 * 32 * 2 * 2);

    // 1.5x: R = W + floor(0.5 W) with W = 2047.
    c.kv.reserve = "1.5x".parse::<ReserveConfig>().unwrap();
    let r15 = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    assert_eq!(r15.reserve_rows, 2047 + 1023);
    assert_eq!(r15.region_bytes, 2048 * 3070 * 256);
    // A decode step at length L needs its output row W + L < R: the step at L = 1023 rebases every
    // layer (1023 rows of each buffer move back to end at W), and the window then reaches R again at
    // L = 2046, the last step of the context, which moves 2046 rows.
    assert_eq!(r15.rebases_per_context, 2 * 32);
    assert_eq!(r15.rows_copied, 2048 * (1023 + 2046));
    assert_eq!(r15.worst_step_rows_copied, 2048 * 2046);

    let conveyor = report(&c, Strategy::Conveyor, 0).unwrap();
    assert_eq!(conveyor.region_bytes, (2047 * 2048 + 2 * 2047) * 256);
    let ratio = conveyor.region_bytes as f64 / shift.region_bytes as f64;
    assert!((0.49..0.51).contains(&ratio), "{ratio}");
    assert_eq!(conveyor.rows_copied, 0);

    let smart = report(&c, Strategy::SmartMask, 0).unwrap();
    assert_eq!(smart.rows_copied_per_token, 2048.0);
    let naive = report(&c, Strategy::Naive, 0).unwrap();
    assert_eq!(naive.rows_copied_per_token, 2048.0 * 2047.0);
    // Graph IO of AR-1: ids 4 + positions 4 + u16 mask 2 x 2048 + logits 4 x 32000.
    assert_eq!(shift.graph_io[0].total_bytes, 4 + 4 + 4096 + 128_000);
}

#[test]
fn gqa_model_budgets_kv_heads_not_heads() {
    let c = load("llama-3-8b.yaml");
    assert_eq!((c.model.heads, c.model.kv_heads), (32, 8));
    let r = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    assert_eq!(r.buffers, 32 * 8 * 2);
    assert_eq!(r.kv_bytes_per_token, 512 * 256);
    assert_eq!(r.region_bytes, 512 * 2 * 4095 * 256);
    // The AR-128 prefill variant: mask [128, 4096] u16 and logits [128, 128256] f32.
    let io128 = r.graph_io.iter().find(|io| io.ar == 128).unwrap();
    assert_eq!(io128.mask_bytes, 128 * 4096 * 2);
    assert_eq!(io128.logits_bytes, 128 * 128_256 * 4);
    // Its last-row prefill graph writes one row; AR-1 has none (its one row is its last).
    assert_eq!(io128.last_row_logits_bytes, Some(128_256 * 4));
    let io1 = r.graph_io.iter().find(|io| io.ar == 1).unwrap();
    assert_eq!(io1.last_row_logits_bytes, None);
}

#[test]
fn shipped_configs_parse_with_their_real_geometries() {
    // (file, layers, heads, kv heads, head_dim, vocab)
    let facts = [
        ("llama-2-7b.yaml", 32, 32, 32, 128, 32_000),
        ("llama-3.2-1b.yaml", 16, 32, 8, 64, 128_256),
        ("llama-3.2-3b.yaml", 28, 24, 8, 128, 128_256),
        ("llama-3-8b.yaml", 32, 32, 8, 128, 128_256),
        ("qwen2.5-0.5b.yaml", 24, 14, 2, 64, 151_936),
        ("mistral-7b.yaml", 32, 32, 8, 128, 32_000),
        ("stories260K.yaml", 5, 8, 4, 8, 512),
        ("gemma-3-1b.yaml", 26, 4, 1, 256, 262_144),
    ];
    let mut files: Vec<String> = std::fs::read_dir(configs_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    for f in &files {
        let c = load(f);
        for u in Strategy::ALL {
            let r = report(&c, u, 0);
            if u == Strategy::SmartMask && c.geometry().has_windows() {
                // Sliding layers need left-padded windows: refused with the reason.
                let e = r.unwrap_err().to_string();
                assert!(e.contains("left-padded"), "{f}: {e}");
                continue;
            }
            r.unwrap_or_else(|e| panic!("{f} {u}: {e}"));
        }
    }
    for (file, layers, heads, kv_heads, head_dim, vocab) in facts {
        assert!(files.iter().any(|f| f == file), "{file} is not shipped");
        let m = load(file).model;
        assert_eq!(
            (m.layers, m.heads, m.kv_heads, m.head_dim, m.vocab),
            (layers, heads, kv_heads, head_dim, vocab),
            "{file}"
        );
        if let Some(dim) = m.dim {
            assert_eq!(dim, heads * head_dim, "{file}");
        }
    }
    let mistral = load("mistral-7b.yaml");
    assert_eq!(mistral.model.sliding_window, Some(4096));
    assert_eq!(mistral.graph.context, 4096);
    let stories = load("stories260K.yaml");
    assert_eq!((stories.model.dim, stories.graph.context), (Some(64), 512));
}

#[test]
fn bad_configs_name_file_field_and_expectation() {
    let seed = std::fs::read_to_string(configs_dir().join("llama-2-7b.yaml")).unwrap();
    let dir = ScratchDir::new("budget-bad-configs");
    let cases = [
        (
            "missing.yaml",
            seed.replace("heads: 32, kv_heads", "kv_heads"),
            "model.heads",
            "missing",
        ),
        (
            "type.yaml",
            seed.replace("layers: 32", "layers: thirty-two"),
            "model.layers",
            "positive integer",
        ),
        (
            "zero.yaml",
            seed.replace("kv_heads: 32", "kv_heads: 0"),
            "model.kv_heads",
            "is 0",
        ),
        (
            "dim.yaml",
            seed.replace("dim: 4096", "dim: 5120"),
            "model.head_dim",
            "head_dim mismatch",
        ),
        (
            "ctx.yaml",
            seed.replace("context: 2048, ar: [1]", "context: 64, ar: [1, 128]"),
            "graph.context",
            "AR-128",
        ),
        (
            "unknown.yaml",
            seed.replace("reserve: 2x", "reserve: 2x, colour: blue"),
            "kv.colour",
            "stagger",
        ),
        (
            "update.yaml",
            seed.replace("update: shift", "update: teleport"),
            "kv.update",
            "conveyor",
        ),
        (
            "reserve.yaml",
            seed.replace("reserve: 2x", "reserve: 0.5x"),
            "kv.reserve",
            "1.5x",
        ),
    ];
    for (name, text, field, needle) in cases {
        assert_ne!(text, seed, "{name}: the replacement did not apply");
        let path = dir.join(name);
        std::fs::write(&path, &text).unwrap();
        let err = Config::load(&path).unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.field(), Some(field), "{name}: {msg}");
        assert!(
            msg.starts_with(&path.display().to_string()),
            "{name}: {msg}"
        );
        assert!(msg.contains("expected"), "{name}: {msg}");
        assert!(msg.contains(needle), "{name}: {msg}");
    }
    let err = Config::load(dir.join("absent.yaml")).unwrap_err();
    assert!(matches!(err, ConfigError::File(_)), "{err}");
    // Row 5 of the hostile-input issues: an endless input is refused before it is read, and a
    // regular file above the config cap from its size.
    let err = Config::load("/dev/zero").unwrap_err();
    assert_eq!(
        err.to_string(),
        "config /dev/zero is a character device, not a regular file"
    );
    let big = dir.join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((1 << 20) + 1)
        .unwrap();
    let err = Config::load(&big).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "config {} is larger than the 1048576-byte cap for a config (1048577 bytes)",
            big.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// (config, context override, update, reserve, stagger, prefill)
type Case = (
    &'static str,
    Option<usize>,
    Strategy,
    &'static str,
    bool,
    usize,
);

#[test]
fn gemma_slides_five_layers_in_six_and_the_budget_shows_the_saving() {
    let c = load("gemma-3-1b.yaml");
    let g = c.geometry();
    let global: Vec<usize> = (0..g.layers)
        .filter(|&l| g.layer_window(l).is_none())
        .collect();
    assert_eq!(global, [5, 11, 17, 23]);
    assert_eq!(g.distinct_windows(), [512]);
    let r = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    assert_eq!(r.sliding_layers, 22);
    // AR-1: 2 buffers per layer of 512-byte rows; 4095 past rows global, 511 sliding.
    assert_eq!(
        r.past_bytes_per_decode_step,
        2 * 512 * (4 * 4095 + 22 * 511)
    );
    assert_eq!(r.past_bytes_per_decode_step_all_global, 2 * 512 * 26 * 4095);
    // The AR-1 graph also takes attention_mask_w512 [1, 512].
    assert_eq!(r.graph_io[0].mask_bytes, 2 * (4096 + 512));
    // The region: a sliding layer's buffers keep K = W - 1 + max(ar) = 511 + 128 rows plus the
    // strategy's slack. 8 buffers are global (layers 5, 11, 17, 23), 44 slide; rows of 512 B.
    let (rb, k, s, cap, max_ar) = (512, 511 + 128, 4096, 4095, 128);
    // shift 2x: R = 2 x capacity for a global buffer, 2K for a sliding one.
    assert_eq!(r.region_bytes, rb * (8 * 2 * cap + 44 * 2 * k));
    assert_eq!(r.region_bytes_all_global, rb * 52 * 2 * cap);
    // conveyor: buffer 0 (layer 0, sliding) starts at W - 1, a gap of S before each global
    // buffer and K + max(ar) before each of the other 43 sliding ones, the capacity after the last.
    let conveyor = report(&c, Strategy::Conveyor, 0).unwrap();
    assert_eq!(
        conveyor.region_bytes,
        rb * (511 + 8 * s + 43 * (k + max_ar) + cap)
    );
    assert_eq!(conveyor.region_bytes_all_global, rb * (cap + 51 * s + cap));
    // naive: a slot window of W_max or K rows per buffer, then max(ar) output rows per buffer.
    let naive = report(&c, Strategy::Naive, 0).unwrap();
    assert_eq!(naive.region_bytes, rb * (8 * cap + 44 * k + 52 * max_ar));
    assert_eq!(naive.region_bytes_all_global, rb * 52 * (cap + max_ar));
    // A window longer than the graph's reach is the global layer: at S = 600 with AR-128 the
    // longest window served is 473.
    let mut short = c.clone();
    short.graph.context = 600;
    assert!(!short.geometry().has_windows());
    short.model.sliding_window = Some(100);
    short.model.global_every = None;
    assert_eq!(short.geometry().distinct_windows(), [100]);
    assert_eq!(short.geometry().windows.len(), 26);
    short.model.sliding_window = Some(64);
    let e = short.validate().unwrap_err().to_string();
    assert!(e.contains("model.sliding_window"), "{e}");
}

#[test]
fn predictions_equal_a_real_cache() {
    let cases: &[Case] = &[
        ("stories260K.yaml", None, Strategy::SHIFT_2X, "2x", false, 0),
        (
            "stories260K.yaml",
            None,
            Strategy::SHIFT_2X,
            "1.5x",
            true,
            45,
        ),
        (
            "stories260K.yaml",
            None,
            Strategy::Conveyor,
            "2x",
            false,
            100,
        ),
        (
            "stories260K.yaml",
            Some(128),
            Strategy::SmartMask,
            "2x",
            false,
            33,
        ),
        (
            "stories260K.yaml",
            Some(128),
            Strategy::Naive,
            "2x",
            false,
            7,
        ),
        (
            "llama-3.2-1b.yaml",
            Some(400),
            Strategy::SHIFT_2X,
            "1.5x",
            true,
            0,
        ),
        (
            "llama-3.2-1b.yaml",
            Some(160),
            Strategy::SHIFT_2X,
            "+130",
            false,
            20,
        ),
        (
            "qwen2.5-0.5b.yaml",
            Some(96),
            Strategy::SHIFT_2X,
            "140",
            false,
            40,
        ),
        (
            "qwen2.5-0.5b.yaml",
            Some(96),
            Strategy::Conveyor,
            "2x",
            false,
            0,
        ),
        (
            "mistral-7b.yaml",
            Some(136),
            Strategy::Naive,
            "2x",
            false,
            0,
        ),
        (
            "gemma-3-1b.yaml",
            Some(700),
            Strategy::Naive,
            "2x",
            false,
            9,
        ),
        (
            "gemma-3-1b.yaml",
            Some(640),
            Strategy::SHIFT_2X,
            "1.5x",
            true,
            0,
        ),
        (
            "gemma-3-1b.yaml",
            Some(600),
            Strategy::Conveyor,
            "2x",
            false,
            3,
        ),
        (
            "llama-3-8b.yaml",
            Some(136),
            Strategy::SmartMask,
            "2x",
            false,
            5,
        ),
    ];
    for &(file, context, update, reserve, stagger, prefill) in cases {
        let mut c = load(file);
        if let Some(s) = context {
            c.graph.context = s;
        }
        c.kv.update = update;
        c.kv.reserve = reserve.parse().unwrap();
        c.kv.stagger = stagger;
        c.validate().unwrap_or_else(|e| panic!("{e}"));
        let g = c.geometry();
        let full = Run::full_context(&g, prefill).unwrap();
        let budget = report(&c, update, prefill).unwrap();
        assert_eq!(budget.run, full);
        for run in [
            full,
            Run {
                decode_steps: full.decode_steps / 3,
                ..full
            },
        ] {
            let p = predict(&c.cache_spec(), &run).unwrap();
            let counted = simulate(&c, &run);
            let m = p.mismatches(&counted);
            assert!(m.is_empty(), "{file} {update} {reserve} {run:?}: {m:?}");
            if run == full {
                assert_eq!(budget.region_bytes, counted.region_bytes);
                assert_eq!(budget.rebases_per_context, counted.rebases);
                assert_eq!(budget.handles, counted.handles);
                assert_eq!(budget.bytes_copied, counted.bytes_copied);
                assert_eq!(
                    budget.worst_step_bytes_copied,
                    counted.worst_step_bytes_copied
                );
            }
        }
    }
}

#[test]
fn staggering_spreads_the_rebases() {
    let mut c = load("stories260K.yaml");
    c.kv.reserve = ReserveConfig(Reserve::Factor(1.5));
    let plain = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    c.kv.stagger = true;
    let staggered = report(&c, Strategy::SHIFT_2X, 0).unwrap();
    assert!(
        staggered.worst_step_rows_copied < plain.worst_step_rows_copied,
        "{} vs {}",
        staggered.worst_step_rows_copied,
        plain.worst_step_rows_copied
    );
    assert_eq!(
        c.strategy(),
        Strategy::Shift {
            reserve: Reserve::Factor(1.5),
            stagger: true
        }
    );
}

#[test]
fn fit_finds_the_largest_context() {
    let c = load("stories260K.yaml");
    for update in Strategy::ALL {
        let at_512 = region_at(&c, update, 512).unwrap();
        let (s, bytes) = fit_context(&c, update, at_512).unwrap();
        assert!(s >= 512 && bytes <= at_512, "{update}: {s} {bytes}");
        assert!(
            region_at(&c, update, s + 1).is_none_or(|b| b > at_512),
            "{update}: S + 1 still fits"
        );
        // A budget below the smallest context fits nothing.
        assert_eq!(fit_context(&c, update, 10), None);
    }
}
