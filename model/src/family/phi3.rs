//! Phi-3 and Phi-4-mini: the Llama block with Q, K and V fused in one `attn_qkv` tensor and the
//! gate and up projections fused in one `ffn_up` (gate rows first), split at load; RoPE pairs
//! half a head apart, rotating `rope.dimension_count` of each head's dimensions (Phi-4-mini:
//! three quarters).

use super::{Family, GgufMeta, Stored, TensorReader, gguf_name, hf_nothing};
use crate::{Error, LayerTensor, LlamaConfig, RopePairing, Tensor};

pub(super) static FAMILY: Family = Family {
    name: "phi3",
    gguf_archs: &["phi3"],
    // Hugging Face folders fuse `qkv_proj` and `gate_up_proj`: not read yet.
    hf_types: &[],
    gguf,
    gguf_tensor,
    gguf_config_tensors: &[],
    hf: hf_nothing,
};

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    c.rope.pairing = RopePairing::HalfSplit;
    m.no_rope_scaling()?;
    for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if m.file.tensor(name).is_some() {
            return Err(m.err(name, "LongRoPE factors are not supported yet"));
        }
    }
    m.rotated_dims(c)
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
