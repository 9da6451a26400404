//! Models from GGUF: the description from `{arch}.*` and `tokenizer.ggml.*` metadata through the
//! file's family ([`crate::family`]), the weights by the family's tensor names (fused tensors
//! split), dequantized to f32.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;
use std::sync::Arc;

use crate::family::{self, Family, GgufMeta};
use crate::weights::HeldTensor;
use crate::{Error, LlamaConfig, RopeConfig, SpecialTokens, Tensor, Weights};

pub use crate::family::gguf_name;
pub use crate::gguf_file::{
    Array, DEFAULT_ALIGNMENT, GgmlType, GgufError, GgufFile, MAX_ARRAY_DEPTH, MAX_DIMS, TensorInfo,
    Value, dequantize,
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

impl GgufModel {
    /// Reads and dequantizes the model in the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<GgufModel, Error> {
        let (mut f, file) = open(path)?;
        let origin = path.display().to_string();
        let config = llama_config(&file, &origin, &mut f)?;
        let weights = read_weights(&file, &config, &mut f, &origin)?;
        Ok(GgufModel {
            config,
            weights: Arc::new(weights),
            file,
        })
    }

    /// The description and header of the GGUF file at `path`, without reading the weights.
    pub fn describe(path: &Path) -> Result<(LlamaConfig, GgufFile), Error> {
        let (mut f, file) = open(path)?;
        Ok((
            llama_config(&file, &path.display().to_string(), &mut f)?,
            file,
        ))
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

/// The family of the file's `general.architecture`, and its metadata reader.
fn family_of<'a>(
    file: &'a GgufFile,
    origin: &'a str,
) -> Result<(&'static Family, GgufMeta<'a>), Error> {
    let mut m = GgufMeta {
        file,
        origin,
        arch: String::new(),
    };
    let key = "general.architecture";
    let arch = match file.get(key) {
        None => return Err(m.err(key, "missing")),
        Some(v) => v
            .as_str()
            .ok_or_else(|| m.err(key, format!("expected a string, found {v:?}")))?,
    };
    let Some(fam) = family::by_gguf_arch(arch) else {
        let why = format!(
            "architecture {arch} is not supported ({})",
            family::gguf_archs()
        );
        return Err(m.err(key, why));
    };
    m.arch = arch.to_owned();
    Ok((fam, m))
}

/// Checks that the file's tensors are exactly those `config` needs under its family's names,
/// with their shapes (the family's description tensors, such as `rope_freqs`, aside): none
/// missing, none of another shape, none left over ([`family::check_held`]).
pub fn check_tensors(file: &GgufFile, config: &LlamaConfig, origin: &str) -> Result<(), Error> {
    let (fam, _) = family_of(file, origin)?;
    let held: Vec<HeldTensor<'_>> = file
        .tensors
        .iter()
        .map(|t| HeldTensor {
            name: &t.name,
            shape: t.shape(),
            file: origin,
        })
        .collect();
    let skip = fam.gguf_config_tensors;
    family::check_held(config, fam.gguf_tensor, &held, skip, (fam.name, origin))
}

/// Reads every tensor `config` needs from `r`, after checking that the file holds exactly those
/// ([`check_tensors`]); fused tensors are split into their parts; each must be finite.
pub fn read_weights(
    file: &GgufFile,
    config: &LlamaConfig,
    r: &mut (impl Read + Seek),
    origin: &str,
) -> Result<Weights, Error> {
    check_tensors(file, config, origin)?;
    let (fam, _) = family_of(file, origin)?;
    let mut w = Weights::with_layers(config.n_layers);
    for (name, e) in family::layout(fam.gguf_tensor, config) {
        // Checked finite as it is read.
        let data = read_tensor(file, r, &name, origin)?
            .ok_or(Error::MissingTensor { name: name.clone() })?;
        for (t, part) in e.split(data) {
            w.set(t, part)?;
        }
    }
    Ok(w)
}

/// Tensor `name` of the file as f32 values (`None`: the file has no such tensor).
fn read_tensor(
    file: &GgufFile,
    r: &mut (impl Read + Seek),
    name: &str,
    origin: &str,
) -> Result<Option<Vec<f32>>, Error> {
    let Some(info) = file.tensor(name) else {
        return Ok(None);
    };
    let data = file.read_f32(r, info).map_err(|source| Error::Gguf {
        origin: origin.to_owned(),
        source,
    })?;
    crate::weights::check_finite(origin, name, &data)?;
    Ok(Some(data))
}

/// The model description from a GGUF header (the common keys, then what the file's family
/// adds, reading its description tensors from `r`), checked against the file's tensors
/// ([`check_tensors`]).
pub fn llama_config(
    file: &GgufFile,
    origin: &str,
    r: &mut (impl Read + Seek),
) -> Result<LlamaConfig, Error> {
    let (fam, m) = family_of(file, origin)?;
    let mut config = common(&m)?;
    let mut reader = |name: &str| read_tensor(file, r, name, origin);
    (fam.gguf)(&mut config, &m, &mut reader)?;
    config.validate().map_err(|e| e.in_file(origin))?;
    check_tensors(file, &config, origin)?;
    Ok(config)
}

/// The description from the keys every family shares (a Llama block, global layers).
fn common(m: &GgufMeta<'_>) -> Result<LlamaConfig, Error> {
    let n_heads = m.required("attention.head_count")?;
    let dim = m.required("embedding_length")?;
    Ok(LlamaConfig {
        n_layers: m.required("block_count")?,
        dim,
        n_heads,
        n_kv_heads: m.usize("attention.head_count_kv")?.unwrap_or(n_heads),
        head_dim: m
            .usize("attention.key_length")?
            .unwrap_or(dim / n_heads.max(1)),
        hidden_dim: m.required("feed_forward_length")?,
        vocab_size: vocab_size(m)?,
        context_length: m.required("context_length")?,
        rms_eps: m.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        rope: RopeConfig {
            theta: m.f32("rope.freq_base")?.unwrap_or(10000.0),
            ..RopeConfig::default()
        },
        tied_output: m.file.tensor(&gguf_name(Tensor::Output)).is_none(),
        block: Default::default(),
        embed_scale: None,
        final_softcap: m.f32("final_logit_softcapping")?,
        special: special_tokens(m)?,
        layer_windows: Vec::new(),
    })
}

/// `{arch}.vocab_size`, else the embedding's row count.
fn vocab_size(m: &GgufMeta<'_>) -> Result<usize, Error> {
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

fn special_tokens(m: &GgufMeta<'_>) -> Result<SpecialTokens, Error> {
    Ok(SpecialTokens {
        bos: m.token("bos")?,
        eos: m.token("eos")?,
        eot: m.token("eot")?,
        pad: m.token("padding")?,
    })
}

#[cfg(test)]
pub(crate) mod tests;
