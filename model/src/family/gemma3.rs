//! Gemma 3: four norms per layer (pre and post attention, pre and post FFN), per-head q/k
//! norms, GELU-tanh gates, embeddings scaled by `sqrt(dim)`, RoPE pairs half a head apart, and
//! sliding-window layers: five local layers (window `attention.sliding_window`, RoPE base
//! `rope.freq_base_swa` or 10,000) to every global one (the model's `rope.freq_base`); a file's
//! `attention.sliding_window_pattern` (a count, or one flag per layer, true for a local layer)
//! replaces the five-to-one pattern. llama.cpp's converter stores the
//! norm weights with Gemma's `1 + w` already added.

use super::{Family, GgufMeta, TensorReader, hf_nothing, standard};
use crate::{Activation, Error, LlamaConfig, RopePairing};

pub(super) static FAMILY: Family = Family {
    name: "gemma3",
    gguf_archs: &["gemma3"],
    // Hugging Face folders name the norms otherwise and store `w`, not `1 + w`: not read yet.
    hf_types: &[],
    gguf,
    gguf_tensor: standard,
    gguf_config_tensors: &[],
    hf: hf_nothing,
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

/// Which layers slide: `attention.sliding_window_pattern` (every N-th layer global, or one flag
/// per layer), else every [`PATTERN`]-th layer global.
fn local_layers(m: &GgufMeta<'_>, n_layers: usize) -> Result<Vec<bool>, Error> {
    let key = m.key("attention.sliding_window_pattern");
    let every = |n: usize| (0..n_layers).map(|l| (l + 1) % n != 0).collect();
    match m.file.get(&key) {
        None => Ok(every(PATTERN)),
        Some(v) => {
            if let Some(n) = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
            {
                return Ok(every(n));
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
