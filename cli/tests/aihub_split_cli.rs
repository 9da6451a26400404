//! `htpkv compile --parts N --convention aihub --split aihub`: bundles cut as AI Hub cuts its LLM
//! exports (part 1 the embedding alone, the hidden state named after AI Hub's ONNX tensors) run
//! through `--bundle` and the reference QNN library with the tokens of htpkv's own split.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.to_path_buf(), deps.join("..")]
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not built next to {}", exe.display()))
}

/// A word-level tokenizer.json of stories260K's pieces (enough for `--bundle`).
fn tokenizer_json(dir: &Path) -> PathBuf {
    let tok = llama2c::Tokenizer::load(&common::model_dir().join("tok512.bin"), 512).unwrap();
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), 1.into());
    vocab.insert("</s>".into(), 2.into());
    for id in 0..512u32 {
        let piece = String::from_utf8_lossy(tok.piece(id).unwrap()).into_owned();
        vocab.entry(piece).or_insert(id.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    });
    let path = dir.join("tokenizer-src.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

fn compile(dir: &Path, name: &str, parts: &str, split: &str) -> std::process::Output {
    let tok = tokenizer_json(dir);
    let out = dir.join(name);
    let args = [
        "compile",
        "--context",
        "64",
        "--ar",
        "1,8",
        "--parts",
        parts,
        "--split",
        split,
        "--convention",
        "aihub",
        "--tokenizer-json",
        tok.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    common::htpkv(&args, &dir.join("cache"))
}

fn inspect(file: &Path, lib: &str) -> Value {
    let args = [
        "inspect",
        file.to_str().unwrap(),
        "--qnn-system",
        lib,
        "--json",
    ];
    let o = common::htpkv(&args, Path::new("/nonexistent"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn tokens(bundle: &Path, lib: &str, cache: &Path) -> Value {
    let args = [
        "generate",
        "--bundle",
        bundle.to_str().unwrap(),
        "--backend",
        "qnn",
        "--qnn-backend",
        lib,
        "--steps",
        "40",
        "--json",
    ];
    let o = common::htpkv(&args, cache);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    doc["tokens"].clone()
}

/// Three parts cut as AI Hub does: part 1 only `input_ids` -> the embedding's output, part 2
/// layers 0-2, part 3 layers 3-4 and the logits, the hidden state under AI Hub's names; the
/// bundle generates the tokens of htpkv's balanced two-part bundle.
#[test]
fn an_ai_hub_split_bundle_names_the_hidden_state_and_gives_the_same_tokens() {
    let lib = library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let dir = common::scratch("aihub_split_cli", "three");
    let o = compile(&dir, "aihub3", "3", "aihub");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = compile(&dir, "balanced2", "2", "balanced");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let bundle = dir.join("aihub3");
    let part = |i| bundle.join(format!("stories260K_part_{i}_of_3.bin"));
    let p1 = inspect(&part(1), lib);
    let g = &p1["graphs"][0];
    assert_eq!(g["name"], "token_ar1_cl64_1_of_3");
    assert_eq!(names(&g["inputs"]), ["input_ids"]);
    assert_eq!(
        names(&g["outputs"]),
        ["_model_model_embed_tokens_Gather_output_0"]
    );
    let p2 = inspect(&part(2), lib);
    let (ins, outs) = (
        names(&p2["graphs"][0]["inputs"]),
        names(&p2["graphs"][0]["outputs"]),
    );
    assert_eq!(ins[0], "_model_model_embed_tokens_Gather_output_0");
    assert_eq!(outs[0], "_model_model_layers_2_Add_1_output_0");
    assert!(
        ins.contains(&"past_key_2_in".to_string()) && !ins.contains(&"past_key_3_in".to_string())
    );
    let p3 = inspect(&part(3), lib);
    let (ins, outs) = (
        names(&p3["graphs"][0]["inputs"]),
        names(&p3["graphs"][0]["outputs"]),
    );
    assert_eq!(ins[0], "_model_model_layers_2_Add_1_output_0");
    assert_eq!(outs[0], "logits");
    assert!(
        ins.contains(&"past_key_3_in".to_string()) && ins.contains(&"past_key_4_in".to_string())
    );

    let cache = dir.join("cache");
    let ai = tokens(&bundle, lib, &cache);
    let balanced = tokens(&dir.join("balanced2"), lib, &cache);
    assert_eq!(ai.as_array().unwrap().len(), 40, "{ai}");
    assert_eq!(ai, balanced);
}

/// AI Hub's split refuses a count that leaves a part without layers, and other conventions.
#[test]
fn an_ai_hub_split_that_cannot_be_made_is_refused() {
    let dir = common::scratch("aihub_split_cli", "refused");
    let o = compile(&dir, "five", "5", "aihub");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("2 layers per part fill only 3 parts"), "{err}");
    let tok = tokenizer_json(&dir);
    let o = common::htpkv(
        &[
            "compile",
            "--parts",
            "2",
            "--split",
            "aihub",
            "--tokenizer-json",
            tok.to_str().unwrap(),
            "--out",
            dir.join("x").to_str().unwrap(),
        ],
        &dir.join("cache"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("needs --convention aihub"), "{err}");
    let o = common::htpkv(
        &[
            "compile",
            "--contexts",
            "32,64",
            "--ar",
            "1,8",
            "--parts",
            "2",
            "--split",
            "aihub",
            "--convention",
            "aihub",
            "--tokenizer-json",
            tok.to_str().unwrap(),
            "--out",
            dir.join("y").to_str().unwrap(),
        ],
        &dir.join("cache"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("give --context, not --contexts"), "{err}");
}
