//! The QNN path through the `htpkv` binary: `inspect` on binaries htpkv did not make (an
//! independent system library reporting binary info V3 or V1 with AI Hub-style tensor names), the
//! reference library in every binary-info layout, and `generate --backend qnn` with every memory
//! choice, the strict mode and the handle cap — always the same text as the reference backend.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use crate::ok_json;
use test_support::files::{ScratchDir, built_library};

/// The directory the tests of this file share: htpkv's cache and the compiled models they reuse.
fn scratch() -> PathBuf {
    test_support::files::shared_dir("qnn-cli")
}

fn htpkv(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_htpkv"));
    cmd.args(args)
        .env("HTPKV_CACHE_DIR", scratch().join("cache"))
        .env_remove("HTPKV_MODEL_DIR")
        .env_remove("HTPKV_REF_QNN_LAYOUT")
        .env_remove("HTPKV_REF_QNN_STRICT")
        .env_remove("QNN_FFI_TESTLIB_SYSTEM");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `htpkv inspect FILE --qnn-system LIB --json` with `env`, parsed.
fn inspect_json(file: &str, lib: &str, env: &[(&str, &str)]) -> Value {
    ok_json(&htpkv(
        &["inspect", file, "--qnn-system", lib, "--json"],
        env,
    ))
}

/// The graph names an `inspect --json` document lists, in order.
fn graph_names(doc: &Value) -> Vec<&str> {
    doc["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect()
}

/// Compiles stories260K for context 64, AR-1 and AR-8 (two graphs in one binary), u8 KV, with
/// the `extra` options, into `scratch()/name`.
fn compile_s64(name: &str, extra: &[&str]) -> PathBuf {
    let out = scratch().join(name);
    let mut args = vec![
        "compile",
        "--context",
        "64",
        "--ar",
        "1,8",
        "--kv-dtype",
        "u8",
    ];
    args.extend_from_slice(extra);
    args.extend(["--out", out.to_str().unwrap()]);
    let o = htpkv(&args, &[]);
    assert!(
        o.status.success(),
        "compile: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A small compiled stories260K (context 64, AR-1 and AR-8: two graphs in one binary).
fn compiled() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| compile_s64("s64.htpkv", &[]))
}

fn inspect_foreign(mode: &str) -> Value {
    let lib = built_library("libqnn_ffi_testlib.so");
    let o = htpkv(
        &[
            "inspect",
            "Cargo.toml",
            "--qnn-system",
            lib.to_str().unwrap(),
            "--json",
        ],
        &[("QNN_FFI_TESTLIB_SYSTEM", mode)],
    );
    ok_json(&o)
}

#[test]
fn inspect_lists_a_foreign_v3_binary_completely() {
    let doc = inspect_foreign("v3");
    assert_eq!(doc["binary_info_version"], 3);
    assert_eq!(doc["backend_id"], 6);
    assert_eq!(doc["soc_model"], 57);
    assert_eq!(doc["soc_version"], "V75");
    assert_eq!(doc["core_api"], "2.28.0");
    let graphs = doc["graphs"].as_array().unwrap();
    let names: Vec<_> = graphs.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["prompt_ar128_cl4096_1_of_3", "token_ar1_cl4096_1_of_3"]
    );
    let spill: Vec<_> = graphs
        .iter()
        .map(|g| g["spill_fill_bytes"].as_u64())
        .collect();
    assert_eq!(spill, [Some(25_165_824), Some(1_048_576)]);
    for g in graphs {
        assert_eq!(g["graph_info_version"], 3);
        assert_eq!(g["inputs"].as_array().unwrap().len(), 6);
        assert_eq!(g["outputs"].as_array().unwrap().len(), 3);
    }
    let token = &graphs[1];
    assert_eq!(token["inputs"][4]["name"], "past_key_0_in");
    assert_eq!(
        token["inputs"][4]["dims"],
        serde_json::json!([8, 1, 64, 4095])
    );
    assert_eq!(token["inputs"][4]["quant"]["count"], 8);
    assert_eq!(token["inputs"][4]["role"], "past K layer 0");
    assert_eq!(token["inputs"][2]["role"], "RoPE cos");
    assert_eq!(
        token["outputs"][0]["name"],
        "_model_layers_0_Add_1_output_0"
    );
    // The one tensor the convention does not name is the hidden state for the next part.
    assert_eq!(token["outputs"][0]["role"], "hidden state out");
    assert_eq!(token["outputs"][0]["quant"]["offset"], -30000);
}

#[test]
fn inspect_lists_a_foreign_v1_binary_and_its_text_table() {
    let doc = inspect_foreign("v1");
    assert_eq!(doc["binary_info_version"], 1);
    assert_eq!(doc["soc_model"], Value::Null);
    let graphs = doc["graphs"].as_array().unwrap();
    assert_eq!(graphs.len(), 2);
    assert!(graphs.iter().all(|g| g["graph_info_version"] == 1));
    assert!(graphs.iter().all(|g| g["spill_fill_bytes"].is_null()));
    let lib = built_library("libqnn_ffi_testlib.so");
    let o = htpkv(
        &[
            "inspect",
            "Cargo.toml",
            "--qnn-system",
            lib.to_str().unwrap(),
        ],
        &[("QNN_FFI_TESTLIB_SYSTEM", "v1")],
    );
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("binary info v1"), "{text}");
    assert!(text.contains("2 graphs"), "{text}");
    let foreign = text
        .lines()
        .find(|l| l.contains("_model_layers_0_Add_1"))
        .unwrap();
    assert!(
        foreign.trim_end().ends_with("hidden state out"),
        "{foreign}"
    );
}

/// The graphs without the fields that legitimately differ between layouts.
fn graphs_without_versions(doc: &Value) -> Value {
    let mut graphs = doc["graphs"].clone();
    for g in graphs.as_array_mut().unwrap() {
        for k in ["graph_info_version", "spill_fill_bytes", "op_range"] {
            g.as_object_mut().unwrap().remove(k);
        }
    }
    graphs
}

#[test]
fn the_reference_library_describes_the_same_graphs_in_every_layout() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let file = compiled().to_str().unwrap();
    let docs: Vec<Value> = ["3", "2", "1"]
        .iter()
        .map(|layout| {
            let args = [
                "inspect",
                file,
                "--qnn-system",
                lib.to_str().unwrap(),
                "--json",
            ];
            ok_json(&htpkv(&args, &[("HTPKV_REF_QNN_LAYOUT", layout)]))
        })
        .collect();
    for (doc, version) in docs.iter().zip([3, 2, 1]) {
        assert_eq!(doc["binary_info_version"], version);
        // AR-1, AR-n and AR-n's last-row prefill graph.
        assert_eq!(doc["graphs"].as_array().unwrap().len(), 3);
        assert!(
            doc["graphs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g["graph_info_version"] == version)
        );
    }
    assert!(docs[0]["graphs"][0]["spill_fill_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        graphs_without_versions(&docs[0]),
        graphs_without_versions(&docs[1])
    );
    assert_eq!(
        graphs_without_versions(&docs[0]),
        graphs_without_versions(&docs[2])
    );
    let o = htpkv(
        &["inspect", file, "--qnn-system", lib.to_str().unwrap()],
        &[("HTPKV_REF_QNN_LAYOUT", "7")],
    );
    assert!(!o.status.success());
}

fn generate(extra: &[&str], env: &[(&str, &str)]) -> Value {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let mut args = vec!["generate", "Once upon a time", "--steps", "40", "--json"];
    args.extend(["--compiled", compiled().to_str().unwrap()]);
    // QNN options are refused with the reference backend.
    if extra.contains(&"qnn") {
        args.extend(["--qnn-backend", lib.to_str().unwrap()]);
    }
    args.extend(extra);
    ok_json(&htpkv(&args, env))
}

#[test]
fn generate_through_qnn_gives_the_reference_text_in_every_layout_and_memory() {
    let reference = generate(&["--backend", "reference"], &[]);
    let text = reference["text"].as_str().unwrap().to_owned();
    assert!(text.len() > 40, "{text}");
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, Env<'_>, &str); 6] = [
        ("auto", &[], "host"),
        ("auto", &[("HTPKV_REF_QNN_LAYOUT", "1")], "host"),
        ("client", &[("HTPKV_REF_QNN_LAYOUT", "2")], "client"),
        ("host", &[("HTPKV_REF_QNN_LAYOUT", "1")], "host"),
        ("shared-buffer", &[], "shared-buffer (memfd)"),
        // Strict: host descriptors are refused as on a real HTP; auto falls back.
        ("auto", &[("HTPKV_REF_QNN_STRICT", "1")], "client"),
    ];
    for (memory, env, used) in cases {
        let doc = generate(&["--backend", "qnn", "--qnn-memory", memory], env);
        assert_eq!(doc["text"], text, "--qnn-memory {memory} {env:?}");
        assert_eq!(
            doc["qnn_memory"]["memory"], used,
            "--qnn-memory {memory} {env:?}"
        );
        assert_eq!(doc["update"], "smart_mask", "the QNN default strategy");
    }
}

#[test]
fn strict_mode_refuses_an_explicit_host_choice_with_a_clear_error() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let file = compiled().to_str().unwrap();
    let args = [
        "generate",
        "Hi",
        "--steps",
        "3",
        "--compiled",
        file,
        "--backend",
        "qnn",
    ];
    let mut args = args.to_vec();
    args.extend([
        "--qnn-backend",
        lib.to_str().unwrap(),
        "--qnn-memory",
        "host",
    ]);
    let o = htpkv(&args, &[("HTPKV_REF_QNN_STRICT", "1")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE"), "{err}");
    assert_eq!(err.matches("UNSUPPORTED_MEMTYPE").count(), 1, "{err}");
}

#[test]
fn the_handle_cap_deregisters_least_recently_used_handles() {
    let reference = generate(&["--backend", "reference", "--update", "shift"], &[]);
    let capped = [
        "--backend",
        "qnn",
        "--update",
        "shift",
        "--qnn-max-handles",
        "50",
    ];
    let doc = generate(&capped, &[]);
    assert_eq!(doc["text"], reference["text"]);
    let m = &doc["qnn_memory"];
    assert!(m["deregistrations"].as_u64().unwrap() > 0, "{m}");
    // One step binds 80 K/V tensors (past and new rows of 5 layers x 4 KV heads x K|V), each
    // at a new offset; the cap keeps the live handles to 100.
    assert!(m["peak_handles"].as_u64().unwrap() <= 100, "{m}");
    assert!(m["live_handles"].as_u64().unwrap() <= 100, "{m}");
    let uncapped = generate(&["--backend", "qnn", "--update", "shift"], &[]);
    assert!(uncapped["qnn_memory"]["peak_handles"].as_u64().unwrap() > 100);
}

/// Issue 14, row 3, for `inspect` and `compile`: a reader that went away ends the command quietly
/// with success; a full disk is an error saying so.
#[test]
fn inspect_and_compile_survive_closed_and_full_stdout() {
    let lib = built_library("libqnn_ffi_testlib.so");
    let dir = ScratchDir::new("qnn-cli-pipe");
    let out = dir.join("pipe.htpkv");
    let commands: [Vec<&str>; 2] = [
        vec![
            "inspect",
            "Cargo.toml",
            "--qnn-system",
            lib.to_str().unwrap(),
        ],
        vec![
            "compile",
            "--context",
            "32",
            "--ar",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    ];
    for args in &commands {
        let run = |stdout: std::process::Stdio| {
            Command::new(env!("CARGO_BIN_EXE_htpkv"))
                .args(args)
                .env("QNN_FFI_TESTLIB_SYSTEM", "v3")
                .stdout(stdout)
                .output()
                .unwrap()
        };
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let closed = run(writer.into());
        assert_eq!(closed.status.code(), Some(0), "{args:?}");
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let full = run(full.into());
        assert_eq!(full.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&full.stderr);
        assert!(
            err.ends_with("error: writing to stdout: No space left on device (os error 28)\n"),
            "{err}"
        );
    }
}

/// A Genie bundle of the compiled stories260K: genie_config.json, the binary, and a tokenizer.json
/// whose vocabulary is the model's pieces (a word-level model: enough to map ids to text).
fn bundle(name: &str, eos: &str) -> PathBuf {
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(compiled(), dir.join("stories_1_of_1.bin")).unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/stories260K/tok512.bin");
    let tok = model::llama2c::Tokenizer::load(&model, 512).unwrap();
    let mut vocab = serde_json::Map::new();
    // llama2.c spells BOS and EOS with newlines around them; name them as tokenizer.json files do.
    vocab.insert("<s>".into(), 1.into());
    vocab.insert("</s>".into(), 2.into());
    for id in 0..512u32 {
        let piece = String::from_utf8_lossy(tok.piece(id).unwrap()).into_owned();
        vocab.entry(piece).or_insert(id.into());
    }
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = format!(
        r#"{{"dialog": {{"version": 1, "type": "basic",
            "context": {{"version": 1, "size": 64, "n-vocab": 512, "bos-token": 1, "eos-token": {eos}}},
            "tokenizer": {{"version": 1, "path": "tokenizer.json"}},
            "engine": {{"version": 1, "backend": {{"type": "QnnHtp", "QnnHtp": {{}}}},
              "model": {{"type": "binary", "binary": {{"ctx-bins": ["stories_1_of_1.bin"]}}}}}}}}}}"#
    );
    std::fs::write(dir.join("genie_config.json"), config).unwrap();
    dir
}

#[test]
fn a_genie_bundle_generates_the_tokens_of_the_compiled_file() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let steps = [
        "--steps",
        "40",
        "--json",
        "--backend",
        "qnn",
        "--qnn-backend",
        lib,
    ];
    let mut direct = vec!["generate", "--compiled", compiled().to_str().unwrap()];
    direct.extend(steps);
    let direct = ok_json(&htpkv(&direct, &[]));
    let dir = bundle("bundle", "[2, 1]");
    let mut via = vec!["generate", "--bundle", dir.to_str().unwrap()];
    via.extend(steps);
    let via = ok_json(&htpkv(&via, &[]));
    assert!(direct["tokens"].as_array().unwrap().len() > 10, "{direct}");
    assert_eq!(via["tokens"], direct["tokens"]);
    assert_eq!(via["stop"], direct["stop"]);
    assert_eq!(via["convention"], "htpkv", "detected from the names");
    assert_eq!(via["context"], 64);
}

#[test]
fn foreign_binaries_need_a_qnn_backend_and_a_fitting_convention() {
    let dir = bundle("refuse", "2");
    let o = htpkv(&["generate", "--bundle", dir.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--backend qnn"), "{err}");

    let lib = built_library("libhtpkv_ref_qnn.so");
    let tok = dir.join("tokenizer.json");
    let args = [
        "generate",
        "--compiled",
        compiled().to_str().unwrap(),
        "--convention",
        "aihub",
        "--tokenizer",
        tok.to_str().unwrap(),
        "--backend",
        "qnn",
        "--qnn-backend",
        lib.to_str().unwrap(),
    ];
    let o = htpkv(&args, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("convention `aihub`"), "{err}");

    // Two binaries load as two contexts; the same graphs twice are not the parts of one model.
    let twice = format!("{0},{0}", compiled().to_str().unwrap());
    let args = [
        "generate",
        "--compiled",
        &twice,
        "--tokenizer",
        tok.to_str().unwrap(),
        "--backend",
        "qnn",
        "--qnn-backend",
        lib.to_str().unwrap(),
    ];
    let o = htpkv(&args, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("parts [0, 0] of 1"), "{err}");

    // A bundle whose config disagrees with its binaries is refused.
    let config = dir.join("genie_config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"size\": 64", "\"size\": 128")).unwrap();
    let args = [
        "generate",
        "--bundle",
        dir.to_str().unwrap(),
        "--backend",
        "qnn",
        "--qnn-backend",
        lib.to_str().unwrap(),
    ];
    let o = htpkv(&args, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("declares context 128"), "{err}");
}

/// stories260K compiled the way AI Hub lays out K/V: one tensor per layer, K transposed
/// (`[kv_heads, 1, head_dim, S-n]`).
fn compiled_per_layer() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let extra = ["--k-layout", "transposed", "--granularity", "per_layer"];
        compile_s64("s64-per-layer.htpkv", &extra)
    })
}

#[test]
fn ai_hub_names_are_detected_and_give_the_same_tokens() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let file = compiled_per_layer().to_str().unwrap();
    let inspect = inspect_json(
        file,
        lib.to_str().unwrap(),
        &[("HTPKV_REF_QNN_NAMES", "aihub")],
    );
    let token = &inspect["graphs"][0];
    assert_eq!(token["name"], "token_ar1_cl64_1_of_1");
    let k = token["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "past_key_0_in")
        .expect("an AI Hub K input");
    assert_eq!(k["role"], "past K layer 0");
    assert_eq!(
        k["dims"][2], k["dims"][2],
        "transposed: [kv_heads, 1, head_dim, S-n]"
    );
    assert_eq!(k["dims"][3], 63);
    let tok = bundle("aihub-tok", "2").join("tokenizer.json");
    let run = |names: &str, extra: &[&str]| {
        let mut args = vec!["generate", "--compiled", file, "--steps", "40", "--json"];
        args.extend(["--backend", "qnn", "--qnn-backend", lib.to_str().unwrap()]);
        args.extend(extra);
        ok_json(&htpkv(&args, &[("HTPKV_REF_QNN_NAMES", names)]))
    };
    let own = run("htpkv", &[]);
    // The foreign path (HF tokenizer), the convention detected from the names.
    let detected = run("aihub", &["--tokenizer", tok.to_str().unwrap()]);
    assert_eq!(detected["convention"], "aihub");
    let own_tokens = own["tokens"].as_array().unwrap();
    assert!(own_tokens.len() > 10, "{own}");
    assert_eq!(detected["tokens"], own["tokens"]);
    assert_eq!(detected["stop"], own["stop"]);
}

#[test]
fn executorch_layout_is_detected_by_index_and_gives_the_same_tokens() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let file = compiled_per_layer().to_str().unwrap();
    let env = [("HTPKV_REF_QNN_NAMES", "executorch")];
    let inspect = inspect_json(file, lib.to_str().unwrap(), &env);
    let kv = &inspect["graphs"][0];
    assert_eq!(kv["name"], "kv_forward");
    let roles: Vec<&str> = kv["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles[..5],
        [
            "token ids",
            "attention mask",
            "position ids",
            "past K layer 0",
            "past K layer 1"
        ]
    );
    assert_eq!(roles[8], "past V layer 0");
    // K: [1, kv_heads, head_dim, S-n].
    assert_eq!(kv["inputs"][3]["dims"], serde_json::json!([1, 4, 8, 63]));
    let tok = bundle("et-tok", "2").join("tokenizer.json");
    let mut args = vec!["generate", "--compiled", file, "--steps", "40", "--json"];
    args.extend(["--backend", "qnn", "--qnn-backend", lib.to_str().unwrap()]);
    let own = ok_json(&htpkv(&args, &[]));
    args.extend(["--tokenizer", tok.to_str().unwrap()]);
    let et = ok_json(&htpkv(&args, &env));
    assert_eq!(et["convention"], "executorch");
    assert_eq!(et["tokens"], own["tokens"]);
    assert_eq!(et["stop"], own["stop"]);
}

/// `htpkv compile --convention executorch` records ExecuTorch's naming in the file: the reference
/// library presents it (no environment override) with methods `kv_forward` / `prefill_forward`,
/// IO in ExecuTorch's index order and K `[1, kv_heads, head_dim, S-n]`, and it generates, as
/// `--convention executorch`, the greedy tokens of the same model under htpkv's names. What the
/// names cannot express is refused with the reason.
#[test]
fn compile_executorch_writes_a_file_the_library_presents_as_executorch() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let out = compile_s64("s64-et.htpkv", &["--convention", "executorch"]);
    let inspect = inspect_json(out.to_str().unwrap(), lib, &[]);
    let names = graph_names(&inspect);
    assert_eq!(names, ["kv_forward", "prefill_forward"]);
    let kv = &inspect["graphs"][0];
    assert_eq!(kv["inputs"][1]["role"], "attention mask");
    assert_eq!(kv["inputs"][3]["role"], "past K layer 0");
    assert_eq!(kv["inputs"][3]["dims"], serde_json::json!([1, 4, 8, 63]));
    assert_eq!(kv["inputs"][8]["role"], "past V layer 0");
    assert_eq!(kv["inputs"][8]["dims"], serde_json::json!([1, 4, 63, 8]));

    let tok = bundle("et-compiled-tok", "2").join("tokenizer.json");
    let run = |file: &Path, extra: &[&str]| {
        let mut args = vec!["generate", "--compiled", file.to_str().unwrap()];
        args.extend([
            "--steps",
            "40",
            "--json",
            "--backend",
            "qnn",
            "--qnn-backend",
            lib,
        ]);
        args.extend(extra);
        ok_json(&htpkv(&args, &[]))
    };
    let own = run(compiled_per_layer(), &[]);
    let et = run(
        &out,
        &[
            "--convention",
            "executorch",
            "--tokenizer",
            tok.to_str().unwrap(),
        ],
    );
    assert_eq!(et["convention"], "executorch");
    assert!(own["tokens"].as_array().unwrap().len() > 10, "{own}");
    assert_eq!(et["tokens"], own["tokens"]);
    assert_eq!(et["stop"], own["stop"]);

    for (extra, says) in [
        (&["--parts", "2"][..], "no part number"),
        (&["--contexts", "32,64"][..], "carry no context length"),
        (&["--ar", "1,8,16"][..], "cannot be told apart"),
    ] {
        let mut args = vec!["compile", "--convention", "executorch", "--out", "x.htpkv"];
        args.extend(extra);
        let o = htpkv(&args, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(says),
            "{extra:?}: {err}"
        );
    }
}

/// Compiles stories260K into a two-part AI Hub bundle `scratch()/name` (AR-1 and AR-8, u8 K/V,
/// a test tokenizer.json) with the `extra` compile options; returns the bundle's folder.
fn compile_aihub_bundle(name: &str, extra: &[&str]) -> PathBuf {
    let tok = bundle(&format!("{name}-tok"), "2").join("tokenizer.json");
    let dir = scratch().join(name);
    let mut args = vec!["compile", "--ar", "1,8", "--kv-dtype", "u8"];
    // htpkv's balanced cut (the hidden state `hidden_in`/`hidden_out`), not the convention's own.
    args.extend([
        "--parts",
        "2",
        "--convention",
        "aihub",
        "--split",
        "balanced",
    ]);
    args.extend(extra);
    args.extend(["--tokenizer-json", tok.to_str().unwrap()]);
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = htpkv(&args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir
}

/// `htpkv compile --parts 2 --convention aihub` writes a Genie bundle (two part binaries with
/// AI Hub's graph and tensor names, RoPE cos/sin inputs, the hidden state between the parts;
/// genie_config.json; the tokenizer) that generates, through `--bundle` and the reference
/// library, the greedy tokens of the one-binary `htpkv` convention.
#[test]
fn compiled_aihub_parts_bundle_gives_the_tokens_of_one_binary() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let dir = compile_aihub_bundle("parts-bundle", &["--context", "64"]);
    let mut six = vec![
        "compile",
        "--context",
        "64",
        "--parts",
        "6",
        "--convention",
        "aihub",
        "--split",
        "balanced",
    ];
    let tok = dir.join("tokenizer.json");
    six.extend(["--tokenizer-json", tok.to_str().unwrap(), "--out", "six"]);
    let o = htpkv(&six, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--parts: 6 parts for 5 layers"), "{err}");
    let part2 = dir.join("stories260K_part_2_of_2.bin");
    let inspect = inspect_json(part2.to_str().unwrap(), lib, &[]);
    let names = graph_names(&inspect);
    assert_eq!(names, ["token_ar1_cl64_2_of_2", "prompt_ar8_cl64_2_of_2"]);
    // Presented under AI Hub's names, a part keeps its part number.
    let presented = inspect_json(
        part2.to_str().unwrap(),
        lib,
        &[("HTPKV_REF_QNN_NAMES", "aihub")],
    );
    assert_eq!(presented["graphs"][0]["name"], "token_ar1_cl64_2_of_2");
    let inputs: Vec<&str> = inspect["graphs"][0]["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        inputs[..5],
        [
            "hidden_in",
            "position_ids_cos",
            "position_ids_sin",
            "attention_mask",
            "past_key_3_in"
        ]
    );

    let steps = [
        "--steps",
        "40",
        "--json",
        "--backend",
        "qnn",
        "--qnn-backend",
        lib,
    ];
    let mut direct = vec!["generate", "--compiled", compiled().to_str().unwrap()];
    direct.extend(steps);
    let direct = ok_json(&htpkv(&direct, &[]));
    let mut via = vec!["generate", "--bundle", dir.to_str().unwrap()];
    via.extend(steps);
    let via = ok_json(&htpkv(&via, &[]));
    assert_eq!(via["convention"], "aihub");
    assert!(direct["tokens"].as_array().unwrap().len() > 10, "{direct}");
    assert_eq!(via["tokens"], direct["tokens"]);
    assert_eq!(via["stop"], direct["stop"]);
}

/// `htpkv compile --contexts 32,64 --parts 2 --convention aihub` writes part binaries for each
/// context length; `--bundle` starts on context 32 and moves the cache to 64 when it fills (one
/// relayout of the 31 rows of every buffer), and generates the greedy tokens of the one-binary
/// `htpkv` convention at context 64, with `smart_mask` (the QNN default) and `naive`.
#[test]
fn a_bundle_of_two_context_lengths_moves_up_and_gives_the_same_tokens() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let dir = compile_aihub_bundle("contexts-bundle", &["--contexts", "32,64"]);
    for c in [32, 64] {
        for i in [1, 2] {
            let f = dir.join(format!("stories260K_cl{c}_part_{i}_of_2.bin"));
            assert!(f.is_file(), "{}", f.display());
        }
    }
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("genie_config.json")).unwrap()).unwrap();
    assert_eq!(config["dialog"]["context"]["size"], 64);
    let o = htpkv(&["compile", "--contexts", "32,64", "--out", "x.htpkv"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--contexts writes a bundle"), "{err}");

    let steps = ["--steps", "40", "--json", "--backend", "qnn"];
    let mut direct = vec!["generate", "--compiled", compiled().to_str().unwrap()];
    direct.extend(steps);
    direct.extend(["--qnn-backend", lib]);
    let direct = ok_json(&htpkv(&direct, &[]));
    assert!(direct["tokens"].as_array().unwrap().len() > 35, "{direct}");
    for update in ["smart_mask", "naive"] {
        let mut via = vec!["generate", "--bundle", dir.to_str().unwrap()];
        via.extend(steps);
        via.extend(["--qnn-backend", lib, "--update", update]);
        let via = ok_json(&htpkv(&via, &[]));
        assert_eq!(via["tokens"], direct["tokens"], "{update}");
        assert_eq!(via["contexts"], serde_json::json!([32, 64]));
        assert_eq!(via["context"], 64, "{update}: moved up");
        assert_eq!(via["relayouts"], 1, "{update}");
        // 31 tokens (context 32, AR-1) in each of 5 layers x 4 KV heads x K and V.
        assert_eq!(via["rows_moved_by_relayouts"], 31 * 40, "{update}");
    }
}

/// `--kv-zero-point 128`: an AI Hub bundle whose per-layer K/V encodings all have offset −128
/// (u8, symmetric around 0, as AI Hub ships them) runs through `--bundle`; the option is refused
/// for a KV type other than u8 before any work.
#[test]
fn a_bundle_with_kv_zero_point_128_runs() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let zp = ["--context", "64", "--kv-zero-point", "128"];
    let dir = compile_aihub_bundle("zp-bundle", &zp);
    let part1 = dir.join("stories260K_part_1_of_2.bin");
    let inspect = inspect_json(part1.to_str().unwrap(), lib, &[]);
    let mut kv = 0;
    for t in inspect["graphs"][0]["inputs"].as_array().unwrap() {
        if t["name"].as_str().unwrap().starts_with("past_") {
            kv += 1;
            let offsets = t["quant"]["offsets"].as_array().unwrap();
            assert!(offsets.iter().all(|o| o == -128), "{t}");
        }
    }
    assert_eq!(kv, 6, "K and V of part 1's three layers");
    let mut run = vec![
        "generate",
        "--bundle",
        dir.to_str().unwrap(),
        "--steps",
        "30",
    ];
    run.extend(["--json", "--backend", "qnn", "--qnn-backend", lib]);
    let doc = ok_json(&htpkv(&run, &[]));
    assert!(doc["tokens"].as_array().unwrap().len() > 10, "{doc}");
    let mut u16 = vec!["compile", "--context", "64", "--kv-dtype", "u16"];
    u16.extend([
        "--kv-zero-point",
        "128",
        "--parts",
        "2",
        "--convention",
        "aihub",
    ]);
    u16.extend(["--out", "zp16"]);
    let o = htpkv(&u16, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--kv-zero-point 128 is for a u8 KV cache"),
        "{err}"
    );
}

/// `htpkv compile --model SmolLM2.gguf --parts 3 --convention aihub` writes a Genie bundle (the
/// tokenizer.json made from the GGUF's vocabulary) that generates, through `--bundle` and the
/// reference library, the greedy tokens of the same model compiled as one `htpkv` binary under the
/// same genie_config.json. Small and fast: context 32, f16 weights, short calibration.
#[test]
fn a_smollm2_bundle_of_three_parts_gives_the_tokens_of_one_binary() {
    let Some(model) = test_support::fetched::smollm2_gguf(
        "a_smollm2_bundle_of_three_parts_gives_the_tokens_of_one_binary",
    ) else {
        return;
    };
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let work = ScratchDir::new("qnn-cli-smollm2");
    let dir = work.join("smollm2-bundle");
    let one = work.join("smollm2-one");
    std::fs::create_dir_all(&one).unwrap();
    let one_bin = one.join("smollm2.htpkv");
    let mut common = vec!["compile", "--model", model.to_str().unwrap()];
    common.extend(["--context", "32", "--ar", "1,8", "--kv-dtype", "u8"]);
    common.extend(["--weights", "f16", "--calibration-tokens", "12"]);
    let mut parts = common.clone();
    parts.extend(["--parts", "3", "--convention", "aihub"]);
    parts.extend(["--out", dir.to_str().unwrap()]);
    let o = htpkv(&parts, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut whole = common.clone();
    whole.extend(["--out", one_bin.to_str().unwrap()]);
    let o = htpkv(&whole, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The one binary under the bundle's own genie_config.json and tokenizer.json.
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("genie_config.json")).unwrap()).unwrap();
    let bins = &mut config["dialog"]["engine"]["model"]["binary"]["ctx-bins"];
    assert_eq!(bins.as_array().unwrap().len(), 3);
    *bins = serde_json::json!(["smollm2.htpkv"]);
    std::fs::write(one.join("genie_config.json"), config.to_string()).unwrap();
    std::fs::copy(dir.join("tokenizer.json"), one.join("tokenizer.json")).unwrap();

    let run = |d: &Path| {
        let mut args = vec!["generate", "The capital of France is", "--bundle"];
        args.push(d.to_str().unwrap());
        args.extend([
            "--steps",
            "8",
            "--json",
            "--backend",
            "qnn",
            "--qnn-backend",
            lib,
        ]);
        ok_json(&htpkv(&args, &[]))
    };
    let (via, direct) = (run(&dir), run(&one));
    assert_eq!(via["convention"], "aihub");
    assert_eq!(direct["convention"], "htpkv");
    assert!(!direct["tokens"].as_array().unwrap().is_empty(), "{direct}");
    assert_eq!(via["tokens"], direct["tokens"]);
    assert_eq!(via["text"], direct["text"]);
    let size = |p: PathBuf| std::fs::metadata(p).unwrap().len();
    eprintln!(
        "SmolLM2 sizes: one binary {} bytes; parts {} / {} / {} bytes",
        size(one_bin.clone()),
        size(dir.join("SmolLM2-135M-Instruct.Q4_1_part_1_of_3.bin")),
        size(dir.join("SmolLM2-135M-Instruct.Q4_1_part_2_of_3.bin")),
        size(dir.join("SmolLM2-135M-Instruct.Q4_1_part_3_of_3.bin")),
    );
}

/// The error line of a failed run.
fn error_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "succeeded: {err}");
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {err}"))
        .to_owned()
}

/// Issue 21 finding 13: QNN's binary-info errors never named the binary (which of N parts?), and
/// a bundle's part-set errors named neither `genie_config.json` nor `ctx-bins`.
#[test]
fn errors_about_context_binaries_name_the_file_once() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let dir = ScratchDir::new("qnn-cli-garbage");
    let garbage = dir.join("garbage.bin");
    std::fs::write(&garbage, b"not a context binary").unwrap();
    let garbage = garbage.to_str().unwrap();
    // inspect of a file QNN cannot read.
    let o = htpkv(&["inspect", garbage, "--qnn-system", lib], &[]);
    let line = error_line(&o);
    assert_eq!(line.matches(garbage).count(), 1, "{line}");
    // The second of two --compiled binaries.
    let tok = bundle("named-tok", "2").join("tokenizer.json");
    let two = format!("{},{garbage}", compiled().display());
    let o = generate_qnn(
        &["--compiled", &two, "--tokenizer", tok.to_str().unwrap()],
        lib,
    );
    let line = error_line(&o);
    assert_eq!(line.matches(garbage).count(), 1, "{line}");
    assert!(!line.contains(&compiled().display().to_string()), "{line}");
    // A bundle listing one part of two.
    let dir = compile_aihub_bundle("one-of-two", &["--context", "64"]);
    let config = dir.join("genie_config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("\"stories260K_part_2_of_2.bin\"", "");
    let text = text.replace(
        "\"stories260K_part_1_of_2.bin\",",
        "\"stories260K_part_1_of_2.bin\"",
    );
    std::fs::write(&config, text).unwrap();
    let o = generate_qnn(&["--bundle", dir.to_str().unwrap()], lib);
    let line = error_line(&o);
    assert_eq!(line.matches("genie_config.json").count(), 1, "{line}");
    assert!(line.contains("ctx-bins"), "{line}");
    assert!(line.contains("every part must be there once"), "{line}");
}

/// `htpkv generate ARGS --backend qnn --qnn-backend LIB`.
fn generate_qnn(args: &[&str], lib: &str) -> Output {
    let mut v = vec!["generate"];
    v.extend(args);
    v.extend(["--backend", "qnn", "--qnn-backend", lib]);
    htpkv(&v, &[])
}

/// Issue 21, finding 10: a bundle's `rope-dim` (the cos/sin table width, half a head's rotated
/// dimensions) must match the binaries' heads; htpkv rotates whole heads.
#[test]
fn a_bundle_rope_dim_other_than_half_the_head_is_refused_naming_the_field() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let dir = bundle("rope-dim", "2");
    let config = dir.join("genie_config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let with = |d: usize| {
        let pe = format!(
            r#""model": {{"positional-encoding": {{"type": "rope", "rope-dim": {d}, "rope-theta": 10000}}, "type": "binary","#
        );
        std::fs::write(&config, text.replace(r#""model": {"type": "binary","#, &pe)).unwrap();
        let args = [
            "generate",
            "--bundle",
            dir.to_str().unwrap(),
            "--steps",
            "4",
            "--backend",
            "qnn",
            "--qnn-backend",
            lib.to_str().unwrap(),
        ];
        htpkv(&args, &[])
    };
    // stories260K: 8-wide heads, so 4 frequencies.
    let o = with(4);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (d, says) in [(3, "partial RoPE"), (5, "invalid"), (2, "partial RoPE")] {
        let o = with(d);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("{}: ", config.display())), "{err}");
        assert!(
            err.contains(&format!("rope-dim = {d}")) && err.contains(says),
            "{err}"
        );
    }
}

/// `htpkv eval --bundle DIR --model PATH`: an AI Hub bundle scored against the f32 model whose
/// weights `--model` gives (a bundle carries none), through the reference QNN library; without
/// `--model` it is refused naming what is missing.
#[test]
fn eval_scores_a_bundle_against_the_f32_model() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    // stories260K's own tokenizer (the test tokenizer of `compile_aihub_bundle` spells other text).
    let root = ScratchDir::new("qnn-cli-eval-bundle");
    let o = crate::compile_aihub(&root, "bundle", &["--kv-dtype", "u8", "--parts", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = root.join("bundle");
    let model = test_support::stories::stories260k_dir();
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ref_backend/examples/data/declaration.txt"
    );
    let mut args = vec!["eval", "--bundle", dir.to_str().unwrap(), "--text", text];
    args.extend(["--tokens", "32", "--backend", "qnn", "--qnn-backend", lib]);
    let refused = htpkv(&args, &[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("needs --model PATH"),
        "{err}"
    );
    args.extend(["--model", model.to_str().unwrap(), "--json"]);
    let doc = ok_json(&htpkv(&args, &[]));
    assert_eq!(doc["positions"], 32, "{doc}");
    let kl = doc["mean_kl"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.1, "{doc}");
    assert!(doc["top1_agreement"].as_f64().unwrap() > 0.7, "{doc}");
    assert!(doc["kv_saturation"]["codes"].as_u64().unwrap() > 0, "{doc}");
}
