//! `htpkv compile --parts N --convention aihub --split aihub`: bundles cut as AI Hub cuts its LLM
//! exports (part 1 the embedding alone, the hidden state named after AI Hub's ONNX tensors) run
//! through `--bundle` and the reference QNN library with the tokens of htpkv's own split.

use std::path::Path;

use test_support::files::{ScratchDir, built_library};

use serde_json::Value;

fn compile(dir: &Path, name: &str, parts: &str, split: &str) -> std::process::Output {
    crate::compile_aihub(dir, name, &["--parts", parts, "--split", split])
}

fn inspect(file: &Path, lib: &str) -> Value {
    let args = [
        "inspect",
        file.to_str().unwrap(),
        "--qnn-system",
        lib,
        "--json",
    ];
    let o = crate::htpkv(&args, Path::new("/nonexistent"));
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
    let o = crate::htpkv(&args, cache);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    doc["tokens"].clone()
}

/// Three parts cut as AI Hub does: part 1 only `input_ids` -> the embedding's output, part 2
/// layers 0-2, part 3 layers 3-4 and the logits, the hidden state under AI Hub's names; the
/// bundle generates the tokens of htpkv's balanced two-part bundle.
#[test]
fn an_ai_hub_split_bundle_names_the_hidden_state_and_gives_the_same_tokens() {
    let lib = built_library("libhtpkv_ref_qnn.so");
    let lib = lib.to_str().unwrap();
    let dir = ScratchDir::new("aihub_split_cli-three");
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
    let dir = ScratchDir::new("aihub_split_cli-refused");
    let o = compile(&dir, "five", "5", "aihub");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("2 layers per part fill only 3 parts"), "{err}");
    let tok = test_support::stories::stories_tokenizer_json(&dir);
    let refused = |extra: &[&str]| {
        let mut args = vec!["compile", "--ar", "1,8", "--parts", "2", "--split", "aihub"];
        args.extend(extra);
        args.extend(["--tokenizer-json", tok.to_str().unwrap()]);
        let out = dir.join("refused");
        args.extend(["--out", out.to_str().unwrap()]);
        let o = crate::htpkv(&args, &dir.join("cache"));
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = refused(&["--context", "64"]);
    assert!(err.contains("needs --convention aihub"), "{err}");
    let err = refused(&["--contexts", "32,64", "--convention", "aihub"]);
    assert!(err.contains("give --context, not --contexts"), "{err}");
}

/// `--convention aihub --parts N` cuts as the convention declares (AI Hub's own shape) without
/// `--split`: the same part files as `--split aihub`; `--split balanced` still overrides it.
#[test]
fn the_aihub_convention_cuts_its_own_way_by_default() {
    let dir = ScratchDir::new("aihub_split_cli-default");
    let o = crate::compile_aihub(&dir, "default", &["--parts", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = compile(&dir, "aihub", "3", "aihub");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = compile(&dir, "balanced", "3", "balanced");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let part1 = |name: &str| {
        let file = dir.join(name).join("stories260K_part_1_of_3.bin");
        std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    assert_eq!(part1("default"), part1("aihub"));
    assert_ne!(part1("default"), part1("balanced"));
}
