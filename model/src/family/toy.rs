//! A family made up for the test that a new family is one file and one registry line
//! (ARCHITECTURE.md, "A model family"): `toyarch` GGUF files are the Llama block with GELU gates,
//! per-head q/k norms, a post-FFN norm stored as `blk.N.ffn_post_norm.weight` and the FFN's
//! gate and up fused in one `ffn_gate_up` tensor (up rows first). Built in tests only.

use super::{Family, GgufMeta, Stored, TensorReader, gguf_name, hf_nothing, hf_standard};
use crate::{Activation, Error, LayerTensor, LlamaConfig, RopePairing, Tensor};

pub(super) static FAMILY: Family = Family {
    name: "toy",
    gguf_archs: &["toyarch"],
    hf_types: &[],
    gguf,
    gguf_tensor,
    gguf_config_tensors: &[],
    hf: hf_nothing,
    hf_tensor: hf_standard,
    hf_norm_offset: 0.0,
};

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    c.rope.pairing = RopePairing::HalfSplit;
    (c.block.activation, c.block.qk_norm, c.block.post_ffn_norm) =
        (Activation::GeluTanh, true, true);
    m.no_rope_scaling()
}

fn gguf_tensor(t: Tensor, c: &LlamaConfig) -> Stored {
    let h = c.hidden_dim;
    let fused = |l: usize, rows| Stored {
        name: format!("blk.{l}.ffn_gate_up.weight"),
        rows: Some(rows),
    };
    match t {
        Tensor::Layer(l, LayerTensor::Up) => fused(l, 0..h),
        Tensor::Layer(l, LayerTensor::Gate) => fused(l, h..2 * h),
        Tensor::Layer(l, LayerTensor::PostFfnNorm) => {
            Stored::whole(format!("blk.{l}.ffn_post_norm.weight"))
        }
        other => Stored::whole(gguf_name(other)),
    }
}
