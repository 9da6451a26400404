//! `htpkv budget` and `htpkv plan` on a model (a Hugging Face folder's config.json) instead of a
//! YAML config.

use crate::htpkv;
use test_support::files::ScratchDir;

/// SmolLM2-135M's geometry as its Hugging Face `config.json` states it.
const CONFIG_JSON: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
  "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2
}"#;

#[test]
fn budget_and_plan_read_the_geometry_from_a_model_folder() {
    let dir = ScratchDir::new("model-budget-hf");
    std::fs::write(dir.join("config.json"), CONFIG_JSON).unwrap();
    let folder = dir.to_str().unwrap();
    let o = htpkv(&["budget", folder, "--context", "1024", "--json"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let text = doc.to_string();
    // 30 layers x 3 KV heads x K/V = 180 buffers of 64 u16 elements: 23,040 bytes per token.
    assert!(text.contains("23040"), "{text}");
    let o = htpkv(&["plan", folder, "--context", "256", "--steps", "2"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Without --context the model's own context length (8192) is used.
    let o = htpkv(&["budget", folder], &dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("S = 8192"), "{out}");

    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let o = htpkv(&["budget", folder], &dir);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot read the model's description"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Issue 21, finding 6: budget and plan check a model's description against its tensors (the
/// fuzz seeds: a tiny GGUF whose block_count disagrees with its 2 layers), naming the file and the
/// tensor once.
#[test]
fn budget_and_plan_refuse_a_description_that_disagrees_with_the_tensors() {
    let dir = ScratchDir::new("model-budget-disagree");
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/gguf_model");
    let valid = seeds.join("valid");
    let o = htpkv(&["budget", valid.to_str().unwrap(), "--json"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (seed, says) in [
        (
            "block_count_1000",
            "tensor blk.2.attn_norm.weight is missing",
        ),
        (
            "block_count_below_layers",
            "tensor blk.1.attn_norm.weight is not part",
        ),
    ] {
        let file = seeds.join(seed);
        let file = file.to_str().unwrap();
        for args in [vec!["budget", file], vec!["plan", file, "--steps", "2"]] {
            let o = htpkv(&args, &dir);
            assert!(!o.status.success(), "{args:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(&format!("{file}: {says}")), "{err}");
            assert_eq!(err.matches(file).count(), 1, "the path once: {err}");
        }
    }
}
