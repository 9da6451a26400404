//! Gemma 3: four norms per layer (pre and post attention, pre and post FFN), per-head q/k
//! norms, GELU-tanh gates, embeddings scaled by `sqrt(dim)`, RoPE pairs half a head apart, and
//! sliding-window layers: five local layers (window `attention.sliding_window`, RoPE base
//! `rope.freq_base_swa` or 10,000) to every global one (the model's `rope.freq_base`); a file's
//! `attention.sliding_window_pattern` (a count, or one flag per layer, true for a local layer)
//! replaces the five-to-one pattern. llama.cpp's converter stores the
//! norm weights with Gemma's `1 + w` already added.
//!
//! Hugging Face folders (`gemma3_text`, the text-only checkpoints such as Gemma 3 270M and 1B)
//! store `w`, folded to `1 + w` at load; name the pre-FFN norm `pre_feedforward_layernorm` and
//! the post-attention one `post_attention_layernorm`; give the local base as
//! `rope_local_base_freq`, the windows as `layer_types` or `sliding_window_pattern`, the attention
//! scale as `query_pre_attn_scalar^-1/2`, and tie the classifier unless they say otherwise.

use super::{Family, GgufMeta, Stored, TensorReader, hf_name, standard};
use crate::{Activation, Error, LayerTensor, LlamaConfig, RopePairing, Tensor};

pub(super) static FAMILY: Family = Family {
    name: "gemma3",
    gguf_archs: &["gemma3"],
    hf_types: &["gemma3_text"],
    gguf,
    gguf_tensor: standard,
    gguf_config_tensors: &[],
    hf,
    hf_tensor,
    hf_norm_offset: 1.0,
};

/// Every `PATTERN`-th layer is global, the others slide (when the file does not say).
const PATTERN: usize = 6;
/// The RoPE base of the local layers.
const LOCAL_THETA: f32 = 10_000.0;

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    m.no_rope_scaling()?;
    m.rotated_dims(c)?;
    let window = m.required("attention.sliding_window")?;
    let local = local_layers(m, c.n_layers)?;
    block(c, m.f32("rope.freq_base_swa")?.unwrap_or(LOCAL_THETA));
    c.layer_windows = local.into_iter().map(|l| l.then_some(window)).collect();
    Ok(())
}

/// Every `n`-th layer global, the others local.
fn every(n: usize, n_layers: usize) -> Vec<bool> {
    (0..n_layers).map(|l| (l + 1) % n != 0).collect()
}

fn hf(c: &mut LlamaConfig, json: &serde_json::Value) -> Result<(), String> {
    let num = |key: &str| match &json[key] {
        serde_json::Value::Null => Ok(None),
        v => v
            .as_f64()
            .map(Some)
            .ok_or(format!("{key} = {v} is not a number")),
    };
    let act = json["hidden_activation"]
        .as_str()
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(format!(
            "hidden_activation {act} is not supported (gelu_pytorch_tanh)"
        ));
    }
    block(
        c,
        num("rope_local_base_freq")?.map_or(LOCAL_THETA, |t| t as f32),
    );
    if let Some(s) = num("query_pre_attn_scalar")? {
        c.block.attention_scale = Some((1.0 / s.sqrt()) as f32);
    }
    c.final_softcap = num("final_logit_softcapping")?.map(|v| v as f32);
    c.tied_output = json["tie_word_embeddings"].as_bool().unwrap_or(true);
    if c.layer_windows.is_empty() {
        let window = json["sliding_window"]
            .as_u64()
            .ok_or("sliding_window is missing")?;
        let window = usize::try_from(window).map_err(|_| "sliding_window is too large")?;
        let n = json["sliding_window_pattern"]
            .as_u64()
            .unwrap_or(PATTERN as u64);
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .ok_or("sliding_window_pattern must be positive")?;
        c.layer_windows = every(n, c.n_layers)
            .into_iter()
            .map(|l| l.then_some(window))
            .collect();
    }
    Ok(())
}

/// Hugging Face's names: Gemma's four norms per layer.
fn hf_tensor(t: Tensor, _: &LlamaConfig) -> Stored {
    use LayerTensor as L;
    let norm = |l: usize, s: &str| Stored::whole(format!("model.layers.{l}.{s}.weight"));
    match t {
        Tensor::Layer(l, L::PostAttnNorm) => norm(l, "post_attention_layernorm"),
        Tensor::Layer(l, L::FfnNorm) => norm(l, "pre_feedforward_layernorm"),
        other => Stored::whole(hf_name(other)),
    }
}

/// Which layers slide: `attention.sliding_window_pattern` (every N-th layer global, or one flag
/// per layer), else every [`PATTERN`]-th layer global.
fn local_layers(m: &GgufMeta<'_>, n_layers: usize) -> Result<Vec<bool>, Error> {
    let key = m.key("attention.sliding_window_pattern");
    match m.file.get(&key) {
        None => Ok(every(PATTERN, n_layers)),
        Some(v) => {
            if let Some(n) = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
            {
                return Ok(every(n, n_layers));
            }
            let flags = match v.as_array() {
                Some(crate::gguf_file::Array::Bool(f)) if f.len() == n_layers => Some(f.clone()),
                _ => None,
            };
            flags.ok_or_else(|| {
                m.err(
                    &key,
                    format!("expected a positive count or {n_layers} flags, found {v:?}"),
                )
            })
        }
    }
}

/// What the family adds besides the windows, its local layers rotating with base `local_theta`.
fn block(c: &mut LlamaConfig, local_theta: f32) {
    c.rope.pairing = RopePairing::HalfSplit;
    c.rope.window_theta = Some(local_theta);
    let b = &mut c.block;
    (b.qk_norm, b.post_attention_norm, b.post_ffn_norm) = (true, true, true);
    b.activation = Activation::GeluTanh;
    b.attention_scale = Some(1.0 / (c.head_dim as f32).sqrt());
    c.embed_scale = Some((c.dim as f32).sqrt());
}
