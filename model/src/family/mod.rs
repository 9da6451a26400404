//! Model families: each is one file mapping its files' metadata and tensor names onto the one
//! model description ([`crate::LlamaConfig`]), plus its line in [`REGISTRY`].
//!
//! A family says, as data and small functions:
//! - which GGUF `general.architecture` values and Hugging Face `model_type` values it reads;
//! - what its layers do besides the Llama block ([`Family::gguf`]: pairing, [`crate::Block`],
//!   windows, RoPE bases and factors, embedding scale), from metadata the common reader has not
//!   read;
//! - where each tensor is stored ([`Family::gguf_tensor`]): its name and, for fused tensors
//!   (Phi-3's `attn_qkv`, `ffn_up`), the rows that hold it; fused tensors are split at load.
//!
//! Everything else (the forward, the reference executor, the compiled file, the HTP lowering)
//! reads the description and never the family's name.

mod gemma3;
mod llama;
mod mistral;
mod phi3;
mod qwen2;
mod qwen3;
mod stored;
#[cfg(test)]
mod toy;

pub use stored::{Entry, Naming, Stored, check_held, layout};

use crate::gguf_file::{GgufFile, Value};
use crate::{Error, LayerTensor, LlamaConfig, Tensor};

/// Reads a tensor of the file being described into f32 values by name (`None`: no such tensor).
pub type TensorReader<'a> = dyn FnMut(&str) -> Result<Option<Vec<f32>>, Error> + 'a;

/// One model family.
#[derive(Debug)]
pub struct Family {
    /// The family's name (`llama`, `gemma3`, ...).
    pub name: &'static str,
    /// The GGUF `general.architecture` values it reads.
    pub gguf_archs: &'static [&'static str],
    /// The Hugging Face `model_type` values it reads.
    pub hf_types: &'static [&'static str],
    /// Fills what the family adds to the description read from the common GGUF keys.
    pub gguf: fn(&mut LlamaConfig, &GgufMeta<'_>, &mut TensorReader<'_>) -> Result<(), Error>,
    /// Where the family's GGUF files store tensor `t` of a model described by the config.
    pub gguf_tensor: fn(Tensor, &LlamaConfig) -> Stored,
    /// Tensors of its GGUF files read into the description, not the weights (`rope_freqs`).
    pub gguf_config_tensors: &'static [&'static str],
    /// Fills what the family adds to a description read from a Hugging Face `config.json`.
    pub hf: fn(&mut LlamaConfig, &serde_json::Value) -> Result<(), String>,
    /// Where the family's Hugging Face folders store tensor `t` (most: whole, under [`hf_name`]).
    pub hf_tensor: Naming,
    /// Added to every norm weight read from the family's Hugging Face folders: Gemma's folders
    /// store `w` of its `1 + w` convention (its GGUF files store `1 + w`), folded at load.
    pub hf_norm_offset: f32,
}

/// The families htpkv reads, one line each.
pub static REGISTRY: &[&Family] = &[
    &llama::FAMILY,
    &mistral::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &gemma3::FAMILY,
    &phi3::FAMILY,
    #[cfg(test)]
    &toy::FAMILY,
];

/// The family of a GGUF `general.architecture`.
pub fn by_gguf_arch(arch: &str) -> Option<&'static Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.gguf_archs.contains(&arch))
}

/// The family of a Hugging Face `model_type`.
pub fn by_hf_type(model_type: &str) -> Option<&'static Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.hf_types.contains(&model_type))
}

/// Every GGUF architecture htpkv reads, for error messages.
pub fn gguf_archs() -> String {
    let v: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|f| f.gguf_archs.iter().copied())
        .collect();
    v.join(", ")
}

/// Every Hugging Face `model_type` htpkv reads, for error messages.
pub fn hf_types() -> String {
    let v: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|f| f.hf_types.iter().copied())
        .collect();
    v.join(", ")
}

/// llama.cpp's name of tensor `t` (the names every family shares).
pub fn gguf_name(t: Tensor) -> String {
    use LayerTensor as L;
    let layer = |l: usize, s: &str| format!("blk.{l}.{s}");
    match t {
        Tensor::TokenEmbedding => "token_embd.weight".into(),
        Tensor::OutputNorm => "output_norm.weight".into(),
        Tensor::Output => "output.weight".into(),
        Tensor::Layer(l, lt) => layer(
            l,
            match lt {
                L::AttnNorm => "attn_norm.weight",
                L::Q => "attn_q.weight",
                L::K => "attn_k.weight",
                L::V => "attn_v.weight",
                L::QBias => "attn_q.bias",
                L::KBias => "attn_k.bias",
                L::VBias => "attn_v.bias",
                L::O => "attn_output.weight",
                L::FfnNorm => "ffn_norm.weight",
                L::Gate => "ffn_gate.weight",
                L::Up => "ffn_up.weight",
                L::Down => "ffn_down.weight",
                L::QNorm => "attn_q_norm.weight",
                L::KNorm => "attn_k_norm.weight",
                L::PostAttnNorm => "post_attention_norm.weight",
                L::PostFfnNorm => "post_ffw_norm.weight",
            },
        ),
    }
}

/// The shared names, each tensor stored whole.
fn standard(t: Tensor, _: &LlamaConfig) -> Stored {
    Stored::whole(gguf_name(t))
}

/// Hugging Face's names of tensor `t` shared by the Llama-like families.
pub fn hf_name(t: Tensor) -> String {
    use LayerTensor as L;
    match t {
        Tensor::TokenEmbedding => "model.embed_tokens.weight".into(),
        Tensor::OutputNorm => "model.norm.weight".into(),
        Tensor::Output => "lm_head.weight".into(),
        Tensor::Layer(l, lt) => {
            let s = match lt {
                L::AttnNorm => "input_layernorm.weight",
                L::Q => "self_attn.q_proj.weight",
                L::K => "self_attn.k_proj.weight",
                L::V => "self_attn.v_proj.weight",
                L::QBias => "self_attn.q_proj.bias",
                L::KBias => "self_attn.k_proj.bias",
                L::VBias => "self_attn.v_proj.bias",
                L::O => "self_attn.o_proj.weight",
                L::FfnNorm => "post_attention_layernorm.weight",
                L::Gate => "mlp.gate_proj.weight",
                L::Up => "mlp.up_proj.weight",
                L::Down => "mlp.down_proj.weight",
                L::QNorm => "self_attn.q_norm.weight",
                L::KNorm => "self_attn.k_norm.weight",
                // Gemma's names (its family maps its own pre-FFN norm).
                L::PostAttnNorm => "post_attention_norm.weight",
                L::PostFfnNorm => "post_feedforward_layernorm.weight",
            };
            format!("model.layers.{l}.{s}")
        }
    }
}

/// Hugging Face's shared names, each tensor stored whole.
fn hf_standard(t: Tensor, _: &LlamaConfig) -> Stored {
    Stored::whole(hf_name(t))
}

/// Nothing beyond the common keys (a Hugging Face config).
fn hf_nothing(_: &mut LlamaConfig, _: &serde_json::Value) -> Result<(), String> {
    Ok(())
}

/// Typed access to a GGUF file's metadata, with errors naming the file and the key.
#[derive(Debug)]
pub struct GgufMeta<'a> {
    /// The header.
    pub file: &'a GgufFile,
    /// The file's name, for errors.
    pub origin: &'a str,
    /// `general.architecture`, the prefix of the model's keys.
    pub arch: String,
}

impl GgufMeta<'_> {
    /// An error about `key` of this file.
    pub fn err(&self, key: &str, reason: impl Into<String>) -> Error {
        Error::Metadata {
            origin: self.origin.to_owned(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    fn get<T>(
        &self,
        key: &str,
        kind: &str,
        f: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected {kind}, found {v:?}"))),
        }
    }

    /// The full key of `{arch}.{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}` as a non-negative integer that fits in `usize`.
    pub fn usize(&self, suffix: &str) -> Result<Option<usize>, Error> {
        let key = self.key(suffix);
        let v = self.get(&key, "a non-negative integer", Value::as_u64)?;
        v.map(|v| usize::try_from(v).map_err(|_| self.err(&key, "too large")))
            .transpose()
    }

    /// `{arch}.{suffix}`, which must be present.
    pub fn required(&self, suffix: &str) -> Result<usize, Error> {
        self.usize(suffix)?
            .ok_or_else(|| self.err(&self.key(suffix), "missing"))
    }

    /// `{arch}.{suffix}` as a float.
    pub fn f32(&self, suffix: &str) -> Result<Option<f32>, Error> {
        self.get(&self.key(suffix), "a float", Value::as_f32)
    }

    /// `{arch}.{suffix}` as a string.
    pub fn string(&self, suffix: &str) -> Result<Option<String>, Error> {
        self.get(&self.key(suffix), "a string", |v| {
            v.as_str().map(str::to_owned)
        })
    }

    /// A token id (`tokenizer.ggml.{name}_token_id`).
    pub fn token(&self, name: &str) -> Result<Option<u32>, Error> {
        let key = format!("tokenizer.ggml.{name}_token_id");
        let v = self.get(&key, "a token id", Value::as_u64)?;
        v.map(|v| u32::try_from(v).map_err(|_| self.err(&key, "too large")))
            .transpose()
    }

    /// Refuses `{arch}.rope.scaling.type` unless absent or `none`: the families that take a
    /// scaling read it themselves.
    pub fn no_rope_scaling(&self) -> Result<(), Error> {
        let key = self.key("rope.scaling.type");
        if let Some(ty) = self.string("rope.scaling.type")?.filter(|t| t != "none") {
            return Err(self.err(&key, format!("RoPE scaling {ty} is not supported")));
        }
        Ok(())
    }

    /// `{arch}.rope.dimension_count` into the description's rotated width, checked.
    pub fn rotated_dims(&self, c: &mut LlamaConfig) -> Result<(), Error> {
        if let Some(rot) = self.usize("rope.dimension_count")? {
            crate::config::valid_rotated(rot, c.head_dim)
                .map_err(|why| self.err(&self.key("rope.dimension_count"), why))?;
            c.rope.rotated = (rot != c.head_dim).then_some(rot);
        }
        Ok(())
    }
}
