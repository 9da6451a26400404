//! Cross-check of the RoPE pairing logic: stories260K written as a Hugging Face model
//! (safetensors + config.json, Q/K rows reordered from llama2.c's adjacent pairs to HF's
//! half-split layout) must give the llama2.c forward's logits through `model::hf` and the
//! half-split RoPE.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ::model::hf::{HfModel, hf_name};
use ::model::{Tensor, WeightSource};
use model::llama2c::{Checkpoint, FloatModel, Tokenizer};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use test_support::files::ScratchDir;

/// Reorders each head's rows from pairs `(2k, 2k+1)` to `(k, k + head_dim/2)`.
fn to_half_split(w: &[f32], head_dim: usize, row_len: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for head in w.chunks_exact(head_dim * row_len) {
        let row = |r: usize| &head[r * row_len..(r + 1) * row_len];
        (0..head_dim / 2).for_each(|k| out.extend_from_slice(row(2 * k)));
        (0..head_dim / 2).for_each(|k| out.extend_from_slice(row(2 * k + 1)));
    }
    out
}

fn write_hf(dir: &Path, ck: &Checkpoint, permute: bool) {
    let c = ck.config;
    let desc = model::llama2c::llama_config(&c);
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": c.dim, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "num_hidden_layers": c.n_layers,
        "intermediate_size": c.hidden_dim, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.seq_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": c.shared_classifier, "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in Tensor::required(&desc) {
        let data = ck.tensor(t).unwrap();
        let data = match t {
            Tensor::Layer(_, ::model::LayerTensor::Q | ::model::LayerTensor::K) if permute => {
                to_half_split(data, desc.head_dim, c.dim)
            }
            _ => data.to_vec(),
        };
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((hf_name(t), t.shape(&desc), bytes));
    }
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

/// Largest |logit difference| over the tokens of a short story, HF model against llama2.c.
fn max_logit_diff(ck: &Arc<Checkpoint>, tok: &Tokenizer, permute: bool) -> f32 {
    let dir = ScratchDir::new(&format!("crosscheck-{permute}"));
    write_hf(&dir, ck, permute);
    let hf = HfModel::load(&dir).unwrap();
    drop(dir);
    assert_eq!(hf.config.rope.pairing, ::model::RopePairing::HalfSplit);
    let mut theirs = ::model::FloatModel::new(hf.config.clone(), hf.weights.clone(), 64).unwrap();
    let mut ours = FloatModel::new(ck.clone());
    let tokens = tok.encode(
        "Once upon a time, a little dog found a red ball.",
        true,
        false,
    );
    let mut worst = 0.0f32;
    for (pos, &t) in tokens.iter().enumerate() {
        let a = ours.forward(t, pos).unwrap();
        let b = theirs.forward(t, pos).unwrap();
        worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(worst, f32::max);
    }
    worst
}

#[test]
fn hf_layout_with_half_split_rope_matches_llama2c() {
    let files = test_support::stories::stories260k();
    let (ck, tok) = files.load().unwrap();
    let ck = Arc::new(ck);
    let diff = max_logit_diff(&ck, &tok, true);
    println!("max logit difference {diff} (unpermuted control below)");
    assert!(diff < 1e-4, "max logit difference {diff}");
    // Control: without reordering the rows, the half-split RoPE pairs the wrong elements.
    let wrong = max_logit_diff(&ck, &tok, false);
    println!("unpermuted: {wrong}");
    assert!(
        wrong > 1e-2,
        "unpermuted weights should differ, max difference {wrong}"
    );
}
