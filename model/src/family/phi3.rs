//! Phi-3 and Phi-4-mini: the Llama block with Q, K and V fused in one `attn_qkv` tensor and the
//! gate and up projections fused in one `ffn_up` (gate rows first), split at load; RoPE pairs
//! half a head apart, rotating `rope.dimension_count` of each head's dimensions (Phi-4-mini:
//! three quarters). Long-context files (Phi-3-mini-128k, Phi-4-mini) carry LongRoPE: the
//! `rope_factors_short` and `rope_factors_long` tensors, `rope.scaling.original_context_length`
//! (the context past which the long set applies; the model's context when absent, as llama.cpp
//! reads it) and `rope.scaling.attn_factor`, all read into [`crate::RopeConfig`]. Hugging Face
//! folders (`phi3`) fuse the same rows in `qkv_proj` and `gate_up_proj`; their LongRoPE is the
//! common `rope_scaling` reader's ([`crate::hf`]).

use super::{Family, GgufMeta, Stored, TensorReader, gguf_name, hf_name, hf_nothing};
use crate::{Error, LayerTensor, LlamaConfig, LongRope, RopePairing, Tensor};

pub(super) static FAMILY: Family = Family {
    name: "phi3",
    gguf_archs: &["phi3"],
    hf_types: &["phi3"],
    gguf,
    gguf_tensor,
    gguf_config_tensors: &[SHORT, LONG],
    hf: hf_nothing,
    hf_tensor,
    hf_norm_offset: 0.0,
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
    let name = |l: usize, s: &str| format!("blk.{l}.{s}.weight");
    fused(t, c, [name, name], ["attn_qkv", "ffn_up"]).unwrap_or_else(|| Stored::whole(gguf_name(t)))
}

fn hf_tensor(t: Tensor, c: &LlamaConfig) -> Stored {
    let attn = |l: usize, s: &str| format!("model.layers.{l}.self_attn.{s}.weight");
    let mlp = |l: usize, s: &str| format!("model.layers.{l}.mlp.{s}.weight");
    fused(t, c, [attn, mlp], ["qkv_proj", "gate_up_proj"])
        .unwrap_or_else(|| Stored::whole(hf_name(t)))
}

/// Where a fused tensor holds `t`: Q, K and V rows in turn in the attention's fused tensor, gate
/// then up rows in the FFN's; `None` for a tensor stored whole. `names` make the attention's and
/// the FFN's tensor names of a layer from `fused`'s.
fn fused(
    t: Tensor,
    c: &LlamaConfig,
    names: [fn(usize, &str) -> String; 2],
    fused: [&str; 2],
) -> Option<Stored> {
    use LayerTensor as L;
    let (q, kv, h) = (c.q_dim(), c.kv_dim(), c.hidden_dim);
    let Tensor::Layer(l, lt) = t else {
        return None;
    };
    let (i, rows) = match lt {
        L::Q => (0, 0..q),
        L::K => (0, q..q + kv),
        L::V => (0, q + kv..q + 2 * kv),
        L::Gate => (1, 0..h),
        L::Up => (1, h..2 * h),
        _ => return None,
    };
    Some(Stored {
        name: names[i](l, fused[i]),
        rows: Some(rows),
    })
}
