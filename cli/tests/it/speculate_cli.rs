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
    assert!(spec["tokens_per_call"].as_f64().unwrap() >= 1.0, "{doc}");
    assert!(spec["calls"].as_u64().unwrap() > 0, "{doc}");
    assert_eq!(doc["ar"], serde_json::json!([1, 5, 32]), "K + 1 compiled");
    let turns = "Lily saw a cat.\nThe cat was sad.\n";
    let chat = ["chat", "--model", &model, "--steps", "60"];
    let (plain, _) = ok(&crate::htpkv_with_stdin(&chat, &cache, turns));
    let spec = [&chat[..], &["--speculate", "prompt-lookup:2"]].concat();
    assert_eq!(ok(&crate::htpkv_with_stdin(&spec, &cache, turns)).0, plain);
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
