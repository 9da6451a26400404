//! Llama 1–3 (and SmolLM, TinyLlama, Mistral as llama.cpp converts it): the Llama block as it
//! is. GGUF files keep Q/K rows permuted so RoPE pairs are adjacent; Llama 3.1/3.2 files carry
//! the converter's per-pair frequency divisors as the `rope_freqs` tensor.

use super::{Family, GgufMeta, TensorReader, hf_nothing, hf_standard, standard};
use crate::{Error, LlamaConfig, RopePairing};

pub(super) static FAMILY: Family = Family {
    name: "llama",
    gguf_archs: &["llama"],
    hf_types: &["llama"],
    gguf,
    gguf_tensor: standard,
    gguf_config_tensors: &[ROPE_FREQS],
    hf: hf_nothing,
    hf_tensor: hf_standard,
    hf_norm_offset: 0.0,
};

const ROPE_FREQS: &str = "rope_freqs.weight";

fn gguf(c: &mut LlamaConfig, m: &GgufMeta<'_>, read: &mut TensorReader<'_>) -> Result<(), Error> {
    c.rope.pairing = RopePairing::Adjacent;
    m.no_rope_scaling()?;
    m.rotated_dims(c)?;
    c.rope.freq_factors = read(ROPE_FREQS)?;
    Ok(())
}
