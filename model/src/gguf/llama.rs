//! Llama-family models from GGUF: the description from `{arch}.*` and `tokenizer.ggml.*`
//! metadata, the weights by their llama.cpp names, dequantized to f32.
//!
//! Architectures: `llama` (llama.cpp's converter permutes Q/K rows so RoPE pairs are adjacent)
//! and `qwen2` (Q/K/V biases, RoPE pairs half a head apart, as llama.cpp's NEOX mode). GGUF
//! files whose RoPE needs a `rope_freqs` tensor or a `rope.scaling.type` are rejected.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;
use std::sync::Arc;

use super::{GgufFile, Value};
use crate::weights::HeldTensor;
use crate::{
    Error, LayerTensor, LlamaConfig, RopeConfig, RopePairing, SpecialTokens, Tensor, Weights,
};

/// A model read from a GGUF file: its description, f32 weights and the parsed header (for the
/// tokenizer and chat template).
#[derive(Debug, Clone)]
pub struct GgufModel {
    /// The description.
    pub config: LlamaConfig,
    /// Dequantized weights, shareable with [`crate::FloatModel`].
    pub weights: Arc<Weights>,
    /// Header and metadata.
    pub file: GgufFile,
}

/// llama.cpp's name of tensor `t`.
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
            },
        ),
    }
}

impl GgufModel {
    /// Reads and dequantizes the model in the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<GgufModel, Error> {
        let (mut f, file) = open(path)?;
        let origin = path.display().to_string();
        let config = llama_config(&file, &origin)?;
        let weights = read_weights(&file, &config, &mut f, &origin)?;
        Ok(GgufModel {
            config,
            weights: Arc::new(weights),
            file,
        })
    }

    /// The description and header of the GGUF file at `path`, without reading the weights.
    pub fn describe(path: &Path) -> Result<(LlamaConfig, GgufFile), Error> {
        let (_, file) = open(path)?;
        Ok((llama_config(&file, &path.display().to_string())?, file))
    }
}

/// Opens `path` (a regular file under the GGUF cap, [`crate::fsio::open_regular`]) and parses its
/// header.
fn open(path: &Path) -> Result<(File, GgufFile), Error> {
    let (mut f, len) = crate::fsio::open_regular(path, crate::fsio::FileKind::GGUF)?;
    let file = GgufFile::read(BufReader::new(&mut f), len).map_err(|source| Error::Gguf {
        origin: path.display().to_string(),
        source,
    })?;
    Ok((f, file))
}

/// Checks that the file's tensors are exactly those `config` needs, with their shapes
/// ([`crate::weights::check_tensor_set`]).
pub fn check_tensors(file: &GgufFile, config: &LlamaConfig, origin: &str) -> Result<(), Error> {
    let held: Vec<HeldTensor<'_>> = file
        .tensors
        .iter()
        .map(|t| HeldTensor {
            name: &t.name,
            shape: t.shape(),
            file: origin,
        })
        .collect();
    crate::weights::check_tensor_set(config, &held, gguf_name, origin)
}

/// Reads every tensor `config` needs from `r`, after checking that the file holds exactly those
/// ([`check_tensors`]); each must be finite.
pub fn read_weights(
    file: &GgufFile,
    config: &LlamaConfig,
    r: &mut (impl Read + Seek),
    origin: &str,
) -> Result<Weights, Error> {
    check_tensors(file, config, origin)?;
    let mut w = Weights::with_layers(config.n_layers);
    for t in Tensor::required(config) {
        let name = gguf_name(t);
        let info = file
            .tensor(&name)
            .ok_or(Error::MissingTensor { name: name.clone() })?;
        let data = file.read_f32(r, info).map_err(|source| Error::Gguf {
            origin: origin.to_owned(),
            source,
        })?;
        crate::weights::check_finite(origin, &name, &data)?;
        w.set(t, data)?;
    }
    Ok(w)
}

/// Typed access to metadata with errors naming the key.
struct Meta<'a> {
    file: &'a GgufFile,
    origin: &'a str,
    arch: String,
}

impl Meta<'_> {
    fn err(&self, key: &str, reason: impl Into<String>) -> Error {
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

    /// `{arch}.{suffix}` as a non-negative integer that fits in `usize`.
    fn usize(&self, suffix: &str) -> Result<Option<usize>, Error> {
        let key = format!("{}.{suffix}", self.arch);
        let v = self.get(&key, "a non-negative integer", Value::as_u64)?;
        v.map(|v| usize::try_from(v).map_err(|_| self.err(&key, "too large")))
            .transpose()
    }

    fn required(&self, suffix: &str) -> Result<usize, Error> {
        let key = format!("{}.{suffix}", self.arch);
        self.usize(suffix)?.ok_or_else(|| self.err(&key, "missing"))
    }

    fn f32(&self, suffix: &str) -> Result<Option<f32>, Error> {
        self.get(&format!("{}.{suffix}", self.arch), "a float", Value::as_f32)
    }

    /// A token id (`tokenizer.ggml.{name}_token_id`).
    fn token(&self, name: &str) -> Result<Option<u32>, Error> {
        let key = format!("tokenizer.ggml.{name}_token_id");
        let v = self.get(&key, "a token id", Value::as_u64)?;
        v.map(|v| u32::try_from(v).map_err(|_| self.err(&key, "too large")))
            .transpose()
    }
}

/// The model description from a GGUF header, checked against the file's tensors
/// ([`check_tensors`]).
pub fn llama_config(file: &GgufFile, origin: &str) -> Result<LlamaConfig, Error> {
    let mut m = Meta {
        file,
        origin,
        arch: String::new(),
    };
    let pairing = architecture(&mut m)?;
    reject_rope_scaling(&m)?;
    let n_heads = m.required("attention.head_count")?;
    let dim = m.required("embedding_length")?;
    let config = LlamaConfig {
        n_layers: m.required("block_count")?,
        dim,
        n_heads,
        n_kv_heads: m.usize("attention.head_count_kv")?.unwrap_or(n_heads),
        head_dim: m
            .usize("attention.key_length")?
            .unwrap_or(dim / n_heads.max(1)),
        hidden_dim: m.required("feed_forward_length")?,
        vocab_size: vocab_size(&m)?,
        context_length: m.required("context_length")?,
        rms_eps: m.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        rope: RopeConfig {
            theta: m.f32("rope.freq_base")?.unwrap_or(10000.0),
            scaling: None,
            pairing,
        },
        tied_output: file.tensor(&gguf_name(Tensor::Output)).is_none(),
        qkv_bias: file
            .tensor(&gguf_name(Tensor::Layer(0, LayerTensor::QBias)))
            .is_some(),
        special: special_tokens(&m)?,
        layer_windows: Vec::new(),
    };
    config.validate().map_err(|e| e.in_file(origin))?;
    if let Some(rope_dim) = m.usize("rope.dimension_count")? {
        let key = format!("{}.rope.dimension_count", m.arch);
        crate::full_rope_only(rope_dim, config.head_dim).map_err(|why| m.err(&key, why))?;
    }
    check_tensors(file, &config, origin)?;
    Ok(config)
}

/// Reads `general.architecture` into `m.arch`; returns the RoPE pairing of its GGUF layout.
fn architecture(m: &mut Meta<'_>) -> Result<RopePairing, Error> {
    let key = "general.architecture";
    let arch = m.get(key, "a string", |v| v.as_str().map(str::to_owned))?;
    let arch = arch.ok_or_else(|| m.err(key, "missing"))?;
    let pairing = match arch.as_str() {
        "llama" => RopePairing::Adjacent,
        "qwen2" => RopePairing::HalfSplit,
        other => {
            let why = format!("architecture {other} is not supported (llama, qwen2)");
            return Err(m.err(key, why));
        }
    };
    m.arch = arch;
    Ok(pairing)
}

/// `{arch}.vocab_size`, else the embedding's row count.
fn vocab_size(m: &Meta<'_>) -> Result<usize, Error> {
    if let Some(v) = m.usize("vocab_size")? {
        return Ok(v);
    }
    let name = gguf_name(Tensor::TokenEmbedding);
    let rows = m
        .file
        .tensor(&name)
        .and_then(|t| t.shape().first().copied());
    rows.ok_or_else(|| m.err(&name, "missing, so the vocabulary size is unknown"))
}

fn special_tokens(m: &Meta<'_>) -> Result<SpecialTokens, Error> {
    Ok(SpecialTokens {
        bos: m.token("bos")?,
        eos: m.token("eos")?,
        eot: m.token("eot")?,
        pad: m.token("padding")?,
    })
}

fn reject_rope_scaling(m: &Meta<'_>) -> Result<(), Error> {
    let key = format!("{}.rope.scaling.type", m.arch);
    let ty = m.get(&key, "a string", |v| v.as_str().map(str::to_owned))?;
    if let Some(ty) = ty.filter(|t| t != "none") {
        return Err(m.err(&key, format!("RoPE scaling {ty} is not supported")));
    }
    if m.file.tensor("rope_freqs.weight").is_some() {
        return Err(m.err(
            "rope_freqs.weight",
            "per-frequency RoPE factors are not supported",
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
