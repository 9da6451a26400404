//! Per-decode-step KV update cost of every strategy on the Llama-2-7B geometry (32 layers, 32 KV
//! heads, head_dim 128, S = 2048, u16, per_head), measured in one run.
//!
//! Every step plans AR-1, writes the new K/V rows into the step's output bindings (what the graph
//! would do) and commits. The `floor` is that write alone. Each strategy runs a whole context (S - 1
//! steps) so rebases are included; `naive` is sampled on `--naive-steps` steps (default 48).
//! Saturation counting is off, as in a cache nobody asked to count; each strategy but `naive` runs
//! a second time with it on (`--stats`, `eval`), reported as `counting_median_ns` and its ratio.
//!
//! `cargo run --release --example kv_update -- [--json] [--naive-steps N] [--steps N]`

use anyhow::{Context, bail};
use kv_manager::CacheSpec;
use kv_manager::workload::{
    StepTimes, llama2_7b_decode, seed_strategies, time_decode_counting, time_floor,
};

fn main() -> anyhow::Result<()> {
    let mut json = false;
    let mut naive_steps = 48usize;
    let mut steps = usize::MAX;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> anyhow::Result<usize> {
            args.next()
                .with_context(|| format!("{name} needs a number"))?
                .parse()
                .with_context(|| format!("{name} needs a whole number"))
        };
        match arg.as_str() {
            "--json" => json = true,
            "--naive-steps" => naive_steps = number("--naive-steps")?,
            "--steps" => steps = number("--steps")?,
            other => {
                bail!("unknown argument `{other}` (expected --json, --naive-steps N, --steps N)")
            }
        }
    }
    let geometry = llama2_7b_decode();
    let full = steps.min(geometry.capacity());
    // (name, counting off, counting on)
    let mut rows: Vec<(String, StepTimes, Option<StepTimes>)> = Vec::new();
    for strategy in seed_strategies() {
        let name = strategy.to_string();
        let naive = strategy == kv_manager::Strategy::Naive;
        let n = if naive { naive_steps.min(full) } else { full };
        let run = |counting: bool| {
            eprintln!("running {name} for {n} steps, saturation counting {counting} ...");
            let spec = CacheSpec::for_simulation(geometry.clone(), strategy);
            time_decode_counting(spec, n, counting).with_context(|| format!("strategy {name}"))
        };
        let off = run(false)?;
        let on = if naive { None } else { Some(run(true)?) };
        rows.push((name, off, on));
    }
    eprintln!("running floor for {full} steps ...");
    rows.push(("floor".into(), time_floor(&geometry, full)?, None));

    let median_of = |wanted: &str| {
        rows.iter()
            .find(|(n, _, _)| *n == wanted)
            .map(|(_, t, _)| t.median_ns().max(1) as f64)
            .unwrap_or(1.0)
    };
    let (floor, naive) = (median_of("floor"), median_of("naive"));
    if json {
        let strategies: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, t, on)| {
                let on = on.as_ref().map(|on| on.median_ns());
                serde_json::json!({
                    "name": name,
                    "steps": t.nanos.len(),
                    "median_ns": t.median_ns(),
                    "max_ns": t.max_ns(),
                    "bytes_copied_per_step": t.bytes_copied_per_step(),
                    "region_bytes": t.region_bytes,
                    "ratio_to_floor": t.median_ns().max(1) as f64 / floor,
                    "naive_over_this": naive / t.median_ns().max(1) as f64,
                    "counting_median_ns": on,
                    "counting_ratio_to_floor": on.map(|m| m.max(1) as f64 / floor),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "geometry": {
                "layers": geometry.layers, "kv_heads": geometry.kv_heads, "head_dim": geometry.head_dim,
                "context": geometry.context, "dtype": geometry.dtype.name(), "tensors": "per_head",
            },
            "strategies": strategies,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{:<22} {:>6} {:>12} {:>12} {:>16} {:>15} {:>9} {:>10} {:>12} {:>10}",
            "strategy",
            "steps",
            "median_ns",
            "max_ns",
            "copied B/step",
            "region bytes",
            "x floor",
            "naive/x",
            "counting_ns",
            "x floor"
        );
        for (name, t, on) in &rows {
            let on = on.as_ref().map(|on| on.median_ns());
            println!(
                "{:<22} {:>6} {:>12} {:>12} {:>16.0} {:>15} {:>9.2} {:>10.0} {:>12} {:>10}",
                name,
                t.nanos.len(),
                t.median_ns(),
                t.max_ns(),
                t.bytes_copied_per_step(),
                t.region_bytes,
                t.median_ns().max(1) as f64 / floor,
                naive / t.median_ns().max(1) as f64,
                on.map_or("-".into(), |m| m.to_string()),
                on.map_or("-".into(), |m| format!("{:.2}", m.max(1) as f64 / floor)),
            );
        }
    }
    Ok(())
}
