//! Hugging Face folders (`config.json`, `model.safetensors`, `tokenizer.json`,
//! `tokenizer_config.json` for `add_bos_token`) of the toys of
//! [`crate::families`] whose families have them (`gemma3`, `phi3` and its LongRoPE variants):
//! the same weights as the toy GGUF, under the names and conventions of Hugging Face's
//! checkpoints (written here from those checkpoints' layout, not through htpkv's loaders), so
//! that a test can check that both forms of one model give the same logits.
//!
//! What differs from the GGUF file, as llama.cpp's converter maps it:
//! - tensor names (`model.layers.N.self_attn.q_proj.weight` for `blk.N.attn_q.weight`, ...;
//!   Phi-3's fused `qkv_proj` and `gate_up_proj`; Gemma 3's `pre_feedforward_layernorm`);
//! - Gemma's norm weights are stored as `w` of its `1 + w` (the GGUF holds `1 + w`);
//! - LongRoPE's factors are `rope_scaling` in `config.json`, not tensors;
//! - Q/K rows are as they are: both architectures rotate halves (llama.cpp's "neox"), so the
//!   converter does not permute them.

use std::io::Cursor;
use std::path::Path;

use model::gguf::GgufFile;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use crate::families::{ToySpec, long_rope_factors, toy_gguf, toy_spec};

/// Writes the Hugging Face folder of toy `family` into `dir`; `None` for a toy without one.
pub fn write_toy_hf_folder(family: &str, dir: &Path) -> Option<()> {
    let spec = toy_spec(family)?;
    let gemma = match spec.arch {
        "gemma3" => true,
        "phi3" => false,
        _ => return None,
    };
    let bytes = toy_gguf(family)?;
    let file = GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).expect("a toy parses");
    let mut tensors = Vec::new();
    for t in &file.tensors {
        let Some(name) = hf_name(&t.name, gemma) else {
            continue;
        };
        let mut data = file
            .read_f32(&mut Cursor::new(&bytes), t)
            .expect("a toy reads");
        if gemma && t.name.ends_with("norm.weight") {
            data.iter_mut().for_each(|v| *v -= 1.0);
        }
        let le: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((name, t.shape(), le));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, le)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), le).expect("a valid view");
            (n.clone(), view)
        })
        .collect();
    let st = safetensors::serialize(views, None).expect("serializes");
    std::fs::write(dir.join("model.safetensors"), st).expect("writes the shard");
    let config = config_json(&spec, &file, gemma).to_string();
    std::fs::write(dir.join("config.json"), config).expect("writes config.json");
    let tok = model::HfTokenizer::from_gguf(&file).expect("the toy's vocabulary");
    let tok = tok.inner().to_string(false).expect("tokenizer.json");
    std::fs::write(dir.join("tokenizer.json"), tok).expect("writes tokenizer.json");
    let add_bos = file
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool());
    let tok_config = json!({ "add_bos_token": add_bos }).to_string();
    std::fs::write(dir.join("tokenizer_config.json"), tok_config).expect("writes it");
    Some(())
}

/// The Hugging Face name of GGUF tensor `name` (`None`: not a tensor in Hugging Face's form).
fn hf_name(name: &str, gemma: bool) -> Option<String> {
    let whole = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = whole {
        return Some(n.into());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    let tensor = tensor.strip_suffix(".weight")?;
    let hf = match tensor {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "post_attention_norm" => "post_attention_layernorm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if gemma => "mlp.up_proj",
        "ffn_up" => "mlp.gate_up_proj",
        "ffn_down" => "mlp.down_proj",
        "post_ffw_norm" => "post_feedforward_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.weight"))
}

/// A token id key of the toy's vocabulary.
fn token(file: &GgufFile, name: &str) -> Value {
    let key = format!("tokenizer.ggml.{name}_token_id");
    file.get(&key)
        .and_then(|v| v.as_u64())
        .map_or(Value::Null, Value::from)
}

fn config_json(s: &ToySpec, file: &GgufFile, gemma: bool) -> Value {
    let n_vocab = file
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .map(|t| t.shape()[0])
        .expect("an embedding");
    let mut c = json!({
        "hidden_size": s.dim, "num_attention_heads": s.n_head,
        "num_key_value_heads": s.n_head_kv, "head_dim": s.head_dim,
        "num_hidden_layers": s.n_layer, "intermediate_size": s.n_ff, "vocab_size": n_vocab,
        "max_position_embeddings": s.context, "rms_norm_eps": s.rms_eps,
        "rope_theta": s.rope_base, "tie_word_embeddings": s.tied,
        "bos_token_id": token(file, "bos"), "eos_token_id": token(file, "eos"),
        "pad_token_id": token(file, "padding"),
    });
    if gemma {
        c["model_type"] = json!("gemma3_text");
        c["rope_local_base_freq"] = json!(10000.0);
        c["sliding_window"] = json!(s.sliding_window);
        c["sliding_window_pattern"] = json!(6);
        c["query_pre_attn_scalar"] = json!(s.head_dim);
        c["hidden_activation"] = json!("gelu_pytorch_tanh");
    } else {
        c["model_type"] = json!("phi3");
        c["partial_rotary_factor"] = json!(f64::from(s.n_rot) / f64::from(s.head_dim));
    }
    if let Some(original) = s.long_rope {
        let (short, long) = long_rope_factors(s.n_rot);
        c["original_max_position_embeddings"] = json!(original);
        c["rope_scaling"] = json!({"type": "longrope", "short_factor": short, "long_factor": long});
    }
    c
}
