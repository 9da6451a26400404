//! Gemma 3: four norms per layer (pre and post attention, pre and post FFN), per-head q/k
//! norms, GELU-tanh gates, embeddings scaled by `sqrt(dim)`, RoPE pairs half a head apart, and
//! sliding-window layers: five local layers (window `attention.sliding_window`, RoPE base
//! 10,000) to every global one (the model's `rope.freq_base`). llama.cpp's converter stores the
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

/// Every `PATTERN`-th layer is global, the others slide.
const PATTERN: usize = 6;
/// The RoPE base of the local layers.
const LOCAL_THETA: f32 = 10_000.0;

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    m.no_rope_scaling()?;
    m.rotated_dims(c)?;
    let window = m.required("attention.sliding_window")?;
    block(c, window);
    Ok(())
}

/// What the family adds, with local layers of `window` positions.
fn block(c: &mut LlamaConfig, window: usize) {
    c.rope.pairing = RopePairing::HalfSplit;
    c.rope.window_theta = Some(LOCAL_THETA);
    let b = &mut c.block;
    (b.qk_norm, b.post_attention_norm, b.post_ffn_norm) = (true, true, true);
    b.activation = Activation::GeluTanh;
    b.attention_scale = Some(1.0 / (c.head_dim as f32).sqrt());
    c.embed_scale = Some((c.dim as f32).sqrt());
    c.layer_windows = (0..c.n_layers)
        .map(|l| ((l + 1) % PATTERN != 0).then_some(window))
        .collect();
}
