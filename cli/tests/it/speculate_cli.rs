//! `--speculate` of `htpkv generate` and `htpkv chat` as a user runs them: the same text as plain
//! decoding, the counters in `--stats` and `--json`, clear refusals.

use std::process::Output;
use test_support::files::ScratchDir;

/// The embedded stories260K model.
fn model_dir() -> String {
    let dir = test_support::stories::stories260k_dir();
    dir.to_str().unwrap().to_owned()
}

fn ok(o: &Output) -> (String, String) {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "failed: {err}");
    (String::from_utf8(o.stdout.clone()).unwrap(), err)
}

#[test]
fn generate_and_chat_print_plain_decodings_text_and_the_counters() {
    let (model, cache) = (model_dir(), ScratchDir::new("spec-cli-same"));
    let base = [
        "generate",
        "--model",
        &model,
        "Once upon a time, there was a little girl named Lily. Lily",
        "--steps",
        "150",
    ];
    let (plain, _) = ok(&crate::htpkv(&base, &cache));
    for update in ["shift", "smart_mask"] {
        let spec = [&base[..], &["--speculate", "prompt-lookup:3", "--stats"]].concat();
        let spec = [&spec[..], &["--update", update]].concat();
        let (text, stats) = ok(&crate::htpkv(&spec, &cache));
        assert_eq!(text, plain, "{update}");
        assert!(stats.contains("speculation (prompt-lookup:3):"), "{stats}");
        assert!(stats.contains("tokens per target call"), "{stats}");
        assert!(stats.contains("speedup"), "{stats}");
    }
    let json = [&base[..], &["--speculate", "prompt-lookup", "--json"]].concat();
    let (doc, _) = ok(&crate::htpkv(&json, &cache));
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let spec = &doc["speculation"];
    assert_eq!(spec["speculator"], "prompt-lookup:4", "{doc}");
    check_counters(&doc);
    assert_eq!(doc["ar"], serde_json::json!([1, 5, 32]), "K + 1 compiled");
    let turns = "Lily saw a cat.\nThe cat was sad.\n";
    let chat = ["chat", "--model", &model, "--steps", "60"];
    let (plain, _) = ok(&crate::htpkv_with_stdin(&chat, &cache, turns));
    let spec = [&chat[..], &["--speculate", "prompt-lookup:2"]].concat();
    assert_eq!(ok(&crate::htpkv_with_stdin(&spec, &cache, turns)).0, plain);
}

/// The counters of a `--json` run against what they must be, worked out from the run: every
/// generated token but the last is run into the cache (150 steps: 149 tokens, no stop); each
/// target call runs its first token plus the proposed tokens it accepted, and rolls the others
/// back; an AR-n verification of k proposed tokens pads n - 1 - k rows; the speed-up is the mean
/// plain step's time for every token, over the time taken.
fn check_counters(doc: &serde_json::Value) {
    let s = &doc["speculation"];
    let n = |key: &str| s[key].as_u64().unwrap_or_else(|| panic!("{key}: {s}"));
    let f = |key: &str| s[key].as_f64().unwrap_or_else(|| panic!("{key}: {s}"));
    assert_eq!(doc["generated_tokens"], 150, "{doc}");
    let (tokens, calls) = (n("tokens"), n("calls"));
    assert_eq!(tokens, 149, "{s}");
    assert_eq!(calls, n("verify_calls") + n("plain_calls"), "{s}");
    assert_eq!(tokens, calls + n("accepted"), "{s}");
    // Every AR variant is tried once, so some proposal was verified (how many is the planner's
    // choice from the measured step times: the scripted run of `tests/it/speculate.rs` checks
    // hand-worked counts).
    assert!(n("verify_calls") > 0, "{s}");
    assert_eq!(n("rolled_back_rows"), n("proposed") - n("accepted"), "{s}");
    // serde_json parses a float up to one ulp off what was printed.
    let want = tokens as f64 / calls as f64;
    assert!(
        (f("tokens_per_call") - want).abs() <= 1e-12 * want,
        "{want}: {s}"
    );
    let variants = s["variants"].as_array().unwrap();
    let rows: u64 = (variants.iter())
        .map(|v| v["ar"].as_u64().unwrap() * v["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(
        rows - n("verify_calls") - n("proposed"),
        n("padded_rows"),
        "{s}"
    );
    let verify: f64 = variants
        .iter()
        .map(|v| v["seconds"].as_f64().unwrap())
        .sum();
    assert!((verify - f("verify_seconds")).abs() < 1e-9, "{s}");
    if n("plain_calls") == 0 {
        return assert!(s["estimated_speedup"].is_null(), "{s}");
    }
    let taken = f("propose_seconds") + f("verify_seconds") + f("plain_seconds");
    let plain_step = f("plain_seconds") / n("plain_calls") as f64;
    let speedup = plain_step * tokens as f64 / taken;
    assert!(
        (f("estimated_speedup") / speedup - 1.0).abs() < 1e-12,
        "{speedup}: {s}"
    );
}

#[test]
fn bad_speculators_and_models_without_a_wide_variant_are_refused() {
    let (model, cache) = (model_dir(), ScratchDir::new("spec-cli-bad"));
    for (args, says) in [
        (
            vec!["--speculate", "psychic"],
            "unknown speculator `psychic`",
        ),
        (vec!["--speculate", "prompt-lookup:0"], "K must be a number"),
        (
            vec!["--speculate", "prompt-lookup", "--ar", "1"],
            "AR variant of 2 or more rows",
        ),
    ] {
        let all = [&["generate", "--model", &model, "--steps", "5"][..], &args].concat();
        let o = crate::htpkv(&all, &cache);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
    }
}
