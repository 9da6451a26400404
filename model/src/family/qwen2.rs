//! Qwen2 / Qwen2.5: the Llama block with Q/K/V biases, RoPE pairs half a head apart.

use super::{Family, GgufMeta, TensorReader, hf_standard, standard};
use crate::{Error, LlamaConfig, RopePairing};

pub(super) static FAMILY: Family = Family {
    name: "qwen2",
    gguf_archs: &["qwen2"],
    hf_types: &["qwen2"],
    gguf,
    gguf_tensor: standard,
    gguf_config_tensors: &[],
    hf,
    hf_tensor: hf_standard,
    hf_norm_offset: 0.0,
};

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    c.rope.pairing = RopePairing::HalfSplit;
    c.block.qkv_bias = true;
    m.no_rope_scaling()?;
    m.rotated_dims(c)
}

fn hf(c: &mut LlamaConfig, _: &serde_json::Value) -> Result<(), String> {
    c.block.qkv_bias = true;
    Ok(())
}
