//! Phi-3 and Phi-4-mini: the Llama block with Q, K and V fused in one `attn_qkv` tensor and the
//! gate and up projections fused in one `ffn_up` (gate rows first), split at load; RoPE pairs
//! half a head apart, rotating `rope.dimension_count` of each head's dimensions (Phi-4-mini:
//! three quarters). Long-context files (Phi-3-mini-128k, Phi-4-mini) carry LongRoPE: the
//! `rope_factors_short` and `rope_factors_long` tensors, `rope.scaling.original_context_length`
//! (the context past which the long set applies; the model's context when absent, as llama.cpp
//! reads it) and `rope.scaling.attn_factor`, all read into [`crate::RopeConfig`].

use super::{Family, GgufMeta, Stored, TensorReader, gguf_name, hf_nothing};
use crate::{Error, LayerTensor, LlamaConfig, LongRope, RopePairing, Tensor};

pub(super) static FAMILY: Family = Family {
    name: "phi3",
    gguf_archs: &["phi3"],
    // Hugging Face folders fuse `qkv_proj` and `gate_up_proj`: not read yet.
    hf_types: &[],
    gguf,
    gguf_tensor,
    gguf_config_tensors: &[SHORT, LONG],
    hf: hf_nothing,
};

const SHORT: &str = "rope_factors_short.weight";
const LONG: &str = "rope_factors_long.weight";

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, read: &mut TensorReader<'_>) -> Result<(), Error> {
    c.rope.pairing = RopePairing::HalfSplit;
    m.no_rope_scaling()?;
    m.rotated_dims(c)?;
    c.rope.attn_factor = m.f32("rope.scaling.attn_factor")?;
    let (short, long) = match (read(SHORT)?, read(LONG)?) {
        (None, None) => return Ok(()),
        (Some(s), Some(l)) => (s, l),
        (None, _) => return Err(m.err(SHORT, "missing while rope_factors_long is present")),
        (_, None) => return Err(m.err(LONG, "missing while rope_factors_short is present")),
    };
    let original = m.usize("rope.scaling.original_context_length")?;
    c.rope.freq_factors = Some(short.clone());
    c.rope.long_rope = Some(LongRope {
        short,
        long,
        original_context: original.unwrap_or(c.context_length),
    });
    Ok(())
}

fn gguf_tensor(t: Tensor, c: &LlamaConfig) -> Stored {
    use LayerTensor as L;
    let (q, kv, h) = (c.q_dim(), c.kv_dim(), c.hidden_dim);
    let fused = |l: usize, name: &str, rows| Stored {
        name: format!("blk.{l}.{name}"),
        rows: Some(rows),
    };
    match t {
        Tensor::Layer(l, L::Q) => fused(l, "attn_qkv.weight", 0..q),
        Tensor::Layer(l, L::K) => fused(l, "attn_qkv.weight", q..q + kv),
        Tensor::Layer(l, L::V) => fused(l, "attn_qkv.weight", q + kv..q + 2 * kv),
        Tensor::Layer(l, L::Gate) => fused(l, "ffn_up.weight", 0..h),
        Tensor::Layer(l, L::Up) => fused(l, "ffn_up.weight", h..2 * h),
        other => Stored::whole(gguf_name(other)),
    }
}
