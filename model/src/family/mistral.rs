//! Mistral (Hugging Face `mistral`): the Llama block, every layer attending over a sliding
//! window when the config sets `sliding_window`. llama.cpp converts Mistral 7B to the `llama`
//! architecture, so GGUF files are read by [`super::llama`].

use super::{Family, GgufMeta, TensorReader, hf_standard, standard};
use crate::{Error, LlamaConfig};

pub(super) static FAMILY: Family = Family {
    name: "mistral",
    gguf_archs: &[],
    hf_types: &["mistral"],
    gguf: no_gguf,
    gguf_tensor: standard,
    gguf_config_tensors: &[],
    hf,
    hf_tensor: hf_standard,
    hf_norm_offset: 0.0,
};

fn no_gguf(_: &mut LlamaConfig, m: &GgufMeta<'_>, _: &mut TensorReader<'_>) -> Result<(), Error> {
    Err(m.err(
        "general.architecture",
        "mistral GGUF files are read as llama",
    ))
}

/// A `sliding_window` without `layer_types` applies to every layer.
fn hf(c: &mut LlamaConfig, json: &serde_json::Value) -> Result<(), String> {
    if c.layer_windows.is_empty()
        && let Some(w) = json["sliding_window"].as_u64()
    {
        let w = usize::try_from(w).map_err(|_| format!("sliding_window = {w} is too large"))?;
        c.layer_windows = vec![Some(w); c.n_layers];
    }
    Ok(())
}
