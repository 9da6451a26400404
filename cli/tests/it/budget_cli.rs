//! `htpkv budget` and `htpkv plan` end to end: the seed numbers, JSON fields, --fit, --plot, errors,
//! and plan totals equal to budget predictions.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use test_support::files::ScratchDir;

fn config(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join("configs").join(name).display().to_string()
}

fn htpkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_htpkv"))
        .args(args)
        .output()
        .expect("run htpkv")
}

fn ok_json(args: &[&str]) -> Value {
    let out = htpkv(args);
    assert!(
        out.status.success(),
        "htpkv {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "htpkv {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{field}` missing or not an integer in {v}"))
}

#[test]
fn seed_budget_json() {
    let seed = config("llama-2-7b.yaml");
    let doc = ok_json(&["budget", &seed, "--json"]);
    let rows = doc.as_array().expect("an array");
    assert_eq!(rows.len(), 4, "one object per strategy");
    let by = |name: &str| {
        rows.iter()
            .find(|r| r["update"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    for r in rows {
        for field in [
            "model",
            "update",
            "reserve_rows",
            "region_bytes",
            "kv_bytes_per_token",
            "rows_copied_per_token",
            "rebases_per_context",
            "handles",
        ] {
            assert!(!r[field].is_null(), "{field} missing in {r}");
        }
        assert_eq!(r["model"], "llama-2-7b");
    }
    let shift = by("shift");
    assert_eq!(u(shift, "region_bytes"), 2_146_435_072);
    assert_eq!(u(shift, "reserve_rows"), 4094);
    assert_eq!(u(shift, "kv_bytes_per_token"), 524_288);
    let conveyor = u(by("conveyor"), "region_bytes") as f64;
    assert!(
        (conveyor / 2_146_435_072.0 - 0.5).abs() < 0.01,
        "{conveyor}"
    );

    let r15 = ok_json(&[
        "budget",
        &seed,
        "--reserve",
        "1.5x",
        "--update",
        "shift",
        "--json",
    ]);
    assert_eq!(r15.as_array().unwrap().len(), 1);
    assert_eq!(u(&r15[0], "reserve_rows"), 3070);
    assert_eq!(u(&r15[0], "region_bytes"), 2048 * 3070 * 256);
}

#[test]
fn text_output_names_every_strategy() {
    let out = htpkv(&[
        "budget",
        &config("stories260K.yaml"),
        &config("llama-2-7b.yaml"),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("2,146,435,072"), "{text}");
    for name in [
        "shift",
        "conveyor",
        "smart_mask",
        "naive",
        "stories260K",
        "llama-2-7b",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
}

#[test]
fn plan_totals_equal_budget_predictions() {
    // (config, context, update, extra args, prefill)
    let cases: &[(&str, &str, &str, &[&str], &str)] = &[
        (
            "stories260K.yaml",
            "96",
            "shift",
            &["--reserve", "1.5x", "--stagger"],
            "0",
        ),
        (
            "stories260K.yaml",
            "96",
            "shift",
            &["--reserve", "+40"],
            "33",
        ),
        ("llama-3.2-1b.yaml", "160", "conveyor", &[], "0"),
        ("qwen2.5-0.5b.yaml", "80", "smart_mask", &[], "10"),
        ("qwen2.5-0.5b.yaml", "80", "naive", &[], "0"),
    ];
    for &(file, context, update, extra, prefill) in cases {
        let path = config(file);
        let mut common = vec![
            path.as_str(),
            "--context",
            context,
            "--update",
            update,
            "--prefill",
            prefill,
            "--json",
        ];
        common.extend_from_slice(extra);
        let budget = ok_json(&[&["budget"], common.as_slice()].concat());
        let b = &budget[0];
        let steps = u(&b["run"], "decode_steps").to_string();
        let plan = ok_json(&[&["plan"], common.as_slice(), &["--steps", &steps]].concat());
        let t = &plan["totals"];
        let what = format!("{file} {update} {extra:?}");
        assert_eq!(plan["prediction_matches"], true, "{what}");
        assert_eq!(u(t, "region_bytes"), u(b, "region_bytes"), "{what}");
        assert_eq!(u(t, "rebases"), u(b, "rebases_per_context"), "{what}");
        assert_eq!(u(t, "handles"), u(b, "handles"), "{what}");
        assert_eq!(u(t, "rows_copied"), u(b, "rows_copied"), "{what}");
        assert_eq!(
            u(t, "worst_step_rows_copied"),
            u(b, "worst_step_rows_copied"),
            "{what}"
        );
        let decode_rows: u64 = plan["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["phase"] == "decode")
            .map(|s| u(s, "rows_copied"))
            .sum();
        let per_token = decode_rows as f64 / steps.parse::<f64>().unwrap();
        let predicted = b["rows_copied_per_token"].as_f64().unwrap();
        assert!(
            (per_token - predicted).abs() < 1e-9,
            "{what}: {per_token} vs {predicted}"
        );
        // One window start per layer in every step.
        let layers = u(b, "layers") as usize;
        for s in plan["steps"].as_array().unwrap() {
            assert_eq!(s["window_start_bytes"].as_array().unwrap().len(), layers);
        }
    }
}

#[test]
fn plan_refuses_a_run_longer_than_the_context() {
    let out = htpkv(&["plan", &config("stories260K.yaml"), "--steps", "600"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 511"), "{err}");
}

#[test]
fn fit_answers_the_largest_context() {
    let stories = config("stories260K.yaml");
    let doc = ok_json(&["budget", &stories, "--fit", "1MiB", "--json"]);
    let entry = &doc[0];
    assert_eq!(u(entry, "budget_bytes"), 1 << 20);
    let strategies = entry["strategies"].as_array().unwrap();
    assert_eq!(strategies.len(), 4);
    let mut best = 0;
    for s in strategies {
        let context = u(s, "context");
        assert!(u(s, "region_bytes") <= 1 << 20, "{s}");
        best = best.max(context);
        // The next context does not fit: its exact region (from `budget`) is over the budget.
        let next = (context + 1).to_string();
        let update = s["update"].as_str().unwrap();
        let b = ok_json(&[
            "budget",
            &stories,
            "--context",
            &next,
            "--update",
            update,
            "--json",
        ]);
        assert!(u(&b[0], "region_bytes") > 1 << 20, "{update} at {next}");
    }
    assert_eq!(u(entry, "largest_context"), best);
    let text = htpkv(&["budget", &stories, "--fit", "2GB"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("largest context that fits"));
    let bad = htpkv(&["budget", &stories, "--fit", "lots"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("512MiB"));
}

#[test]
fn plot_writes_an_svg() {
    let dir = ScratchDir::new("budget-plot");
    let path = dir.join("plot.svg");
    let out = htpkv(&[
        "budget",
        &config("llama-2-7b.yaml"),
        "--plot",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<path ").count(), 4, "one line per strategy");
    for label in [
        "shift 2x",
        "conveyor",
        "smart_mask",
        "naive",
        "KV region (GiB)",
        "S = 2048",
    ] {
        assert!(svg.contains(label), "{label} missing");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn bad_config_errors_name_file_and_field() {
    let seed = std::fs::read_to_string(config("llama-2-7b.yaml")).unwrap();
    let dir = ScratchDir::new("budget-bad-config");
    let path = dir.join("bad.yaml");
    std::fs::write(&path, seed.replace("head_dim: 128", "head_dim: 100")).unwrap();
    let out = htpkv(&["budget", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(path.to_str().unwrap()), "{err}");
    assert!(
        err.contains("model.head_dim") && err.contains("head_dim mismatch"),
        "{err}"
    );
    assert!(err.contains("expected"), "{err}");
}

/// `--sessions N`: N regions and graph IO buffers plus the shared bytes, in JSON and text.
#[test]
fn budget_sessions_cost_n_regions_plus_the_shared_part() {
    let cfg = config("stories260K.yaml");
    let one = ok_json(&["budget", &cfg, "--json"]);
    let four = ok_json(&[
        "budget",
        &cfg,
        "--json",
        "--sessions",
        "4",
        "--shared-bytes",
        "1MiB",
    ]);
    let (one, four) = (one.as_array().unwrap(), four.as_array().unwrap());
    assert_eq!(one.len(), four.len());
    for (a, b) in one.iter().zip(four) {
        let s = &b["sessions"];
        assert_eq!(u(s, "sessions"), 4);
        assert_eq!(u(s, "per_session_bytes"), u(a, "total_bytes"));
        assert_eq!(u(s, "shared_bytes"), 1 << 20);
        assert_eq!(u(s, "total_bytes"), 4 * u(a, "total_bytes") + (1 << 20));
    }
    let text = htpkv(&["budget", &cfg, "--sessions", "3"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("3 sessions (conveyor): 3 x "), "{text}");
    let zero = htpkv(&["budget", &cfg, "--sessions", "0"]);
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--sessions must be at least 1"));
}

#[test]
fn budget_and_plan_of_a_model_follow_the_ar_default_of_generate_and_take_ar() {
    let Some(model) = test_support::fetched::smollm2_gguf("budget_of_a_model_at_context_64") else {
        return;
    };
    let model = model.to_str().unwrap();
    // A context of 64 gets AR [1, 32] as generate would, not the AR-128 variant it cannot hold.
    let doc = ok_json(&["budget", model, "--context", "64", "--json"]);
    let row = &doc.as_array().expect("an array")[0];
    assert_eq!(row["ar"], serde_json::json!([1, 32]), "{row}");
    // A context of 32 is too short for AR-32 beside AR-1: AR [1].
    let doc = ok_json(&["budget", model, "--context", "32", "--json"]);
    assert_eq!(doc[0]["ar"], serde_json::json!([1]), "{doc}");
    // --ar overrides, in budget and plan.
    let doc = ok_json(&["budget", model, "--context", "64", "--ar", "1,16", "--json"]);
    assert_eq!(doc[0]["ar"], serde_json::json!([1, 16]), "{doc}");
    let out = htpkv(&[
        "plan",
        model,
        "--steps",
        "4",
        "--context",
        "64",
        "--ar",
        "1,8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
