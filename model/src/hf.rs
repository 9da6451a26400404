//! Hugging Face model folders: `config.json` for the description and `*.safetensors` (one file
//! or shards) for the weights, as f32, f16 or bf16, converted to f32 on load.
//!
//! HF stores Q/K rows in the order its `rotate_half` RoPE expects, so the description's RoPE
//! pairing is [`RopePairing::HalfSplit`]. Model types: those of [`crate::family::REGISTRY`]
//! (`llama`, `mistral`, `qwen2`, `qwen3`, `gemma3_text`, `phi3`), each family naming its tensors
//! (fused ones split at load) and folding its norm convention.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value as Json;

use crate::family::{self, Entry, Family};
use crate::weights::HeldTensor;
use crate::{
    Block, Error, Llama3Scaling, LlamaConfig, LongRope, RopeConfig, RopePairing, SpecialTokens,
    Weights,
};

/// A model read from a Hugging Face folder.
#[derive(Debug, Clone)]
pub struct HfModel {
    /// The description.
    pub config: LlamaConfig,
    /// Weights as f32, shareable with [`crate::FloatModel`].
    pub weights: Arc<Weights>,
}

pub use crate::family::hf_name;

impl HfModel {
    /// Reads `dir/config.json` and every `dir/*.safetensors`, after checking the shards' headers
    /// against the description ([`check_folder`]); every weight must be finite.
    pub fn load(dir: &Path) -> Result<HfModel, Error> {
        let (config, fam) = described(&dir.join("config.json"))?;
        let files = check_folder(dir, &config)?;
        let mut weights = Weights::with_layers(config.n_layers);
        let mut wanted = family::layout(fam.hf_tensor, &config);
        for path in &files {
            let bytes = crate::fsio::read_capped(path, crate::fsio::FileKind::SAFETENSORS)?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::Safetensors {
                origin: path.display().to_string(),
                reason: e.to_string(),
            })?;
            take_tensors(&st, fam, &mut wanted, &mut weights, path)?;
        }
        if let Some(name) = wanted.into_keys().next() {
            return Err(Error::MissingTensor { name });
        }
        Ok(HfModel {
            config,
            weights: Arc::new(weights),
        })
    }
}

/// Largest safetensors header read (the safetensors crate's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The `(name, shape)` of each tensor of a safetensors file, from its header alone.
fn shard_header(path: &Path) -> Result<Vec<(String, Vec<usize>)>, Error> {
    let origin = path.display().to_string();
    let bad = |reason: String| Error::Safetensors {
        origin: origin.clone(),
        reason,
    };
    let mut f = crate::fsio::CappedFile::open(path, crate::fsio::FileKind::SAFETENSORS)?;
    let mut bytes = Vec::new();
    f.read_up_to(&mut bytes, 8)?;
    let Ok(len) = <[u8; 8]>::try_from(bytes.as_slice()) else {
        return Err(bad("shorter than the 8 bytes of its header length".into()));
    };
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header of {n} bytes (at most {MAX_HEADER_BYTES})"
        )));
    }
    f.read_up_to(&mut bytes, 8 + n)?;
    if bytes.len() as u64 != 8 + n {
        return Err(bad(format!("header of {n} bytes, the file ends first")));
    }
    let json: serde_json::Map<String, Json> =
        serde_json::from_slice(&bytes[8..]).map_err(|e| bad(format!("header: {e}")))?;
    let mut out = Vec::new();
    for (name, info) in json {
        if name == "__metadata__" {
            continue;
        }
        let shape: Option<Vec<usize>> = info["shape"].as_array().and_then(|dims| {
            dims.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect()
        });
        let shape = shape.ok_or_else(|| bad(format!("tensor {name} has no valid shape")))?;
        out.push((name, shape));
    }
    Ok(out)
}

/// Checks the folder's shards against `config` from their headers: no tensor in two shards, and
/// exactly the tensors the description needs, with their shapes
/// ([`family::check_held`], under the family's names). Returns the shards in name order.
pub fn check_folder(dir: &Path, config: &LlamaConfig) -> Result<Vec<PathBuf>, Error> {
    let files = safetensors_files(dir)?;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut headers = Vec::new();
    for path in &files {
        headers.push(shard_header(path)?);
    }
    let mut seen: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut held = Vec::new();
    for (file, header) in names.iter().zip(&headers) {
        for (name, shape) in header {
            if let Some(first) = seen.insert(name, file) {
                return Err(Error::BadTensor {
                    origin: first.to_owned(),
                    name: name.clone(),
                    reason: format!("is also in {file}: shards must not repeat a tensor"),
                });
            }
            held.push(HeldTensor {
                name,
                shape: shape.clone(),
                file,
            });
        }
    }
    let path = dir.join("config.json");
    let fam = described(&path)?.1;
    let origin = path.display().to_string();
    family::check_held(config, fam.hf_tensor, &held, &[], (fam.name, &origin))?;
    Ok(files)
}

/// True when `dir` holds at least one `*.safetensors` file.
pub fn has_shards(dir: &Path) -> bool {
    safetensors_files(dir).is_ok()
}

/// The folder's `*.safetensors` files in name order (at least one).
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        let name = format!("{}/*.safetensors", dir.display());
        return Err(Error::MissingTensor { name });
    }
    Ok(files)
}

/// Converts the tensors of `wanted` that `st` holds into `weights` (fused ones split, norms
/// shifted by the family's [`Family::hf_norm_offset`]) and removes them from `wanted`.
fn take_tensors(
    st: &SafeTensors<'_>,
    fam: &Family,
    wanted: &mut BTreeMap<String, Entry>,
    weights: &mut Weights,
    path: &Path,
) -> Result<(), Error> {
    let origin = path.display().to_string();
    let held: Vec<String> = wanted
        .keys()
        .filter(|name| st.tensor(name).is_ok())
        .cloned()
        .collect();
    for name in held {
        let (Some(e), Ok(view)) = (wanted.remove(&name), st.tensor(&name)) else {
            continue;
        };
        if view.shape() != e.shape {
            return Err(Error::TensorShape {
                name,
                expected: e.shape,
                found: view.shape().to_vec(),
            });
        }
        let data = to_f32(view.dtype(), view.data()).ok_or_else(|| Error::Safetensors {
            origin: origin.clone(),
            reason: format!(
                "tensor {name} has dtype {:?} (f32, f16, bf16 are read)",
                view.dtype()
            ),
        })?;
        crate::weights::check_finite(&origin, &name, &data)?;
        for (t, mut part) in e.split(data) {
            if t.is_norm() {
                part.iter_mut().for_each(|v| *v += fam.hf_norm_offset);
            }
            weights.set(t, part)?;
        }
    }
    Ok(())
}

fn to_f32(dtype: Dtype, b: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// Reads a `config.json`.
pub fn config_from_file(path: &Path) -> Result<LlamaConfig, Error> {
    Ok(described(path)?.0)
}

/// The description of a `config.json` and the family of its `model_type`.
fn described(path: &Path) -> Result<(LlamaConfig, &'static Family), Error> {
    let text = crate::fsio::read_text_capped(path, crate::fsio::FileKind::HF_JSON)?;
    parse(&text, &path.display().to_string())
}

/// Typed access to config.json fields with errors naming the field.
struct Fields<'a> {
    json: &'a Json,
    origin: &'a str,
}

impl Fields<'_> {
    fn err(&self, reason: String) -> Error {
        Error::HfConfig {
            origin: self.origin.to_owned(),
            reason,
        }
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>, Error> {
        match &self.json[key] {
            Json::Null => Ok(None),
            v => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} = {v} is not a non-negative integer"))),
        }
    }

    fn usize(&self, key: &str) -> Result<usize, Error> {
        self.usize_opt(key)?
            .ok_or_else(|| self.err(format!("{key} is missing")))
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32, Error> {
        match &self.json[key] {
            Json::Null => Ok(default),
            v => v
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| self.err(format!("{key} = {v} is not a number"))),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        match &self.json[key] {
            Json::Null => Ok(default),
            v => v
                .as_bool()
                .ok_or_else(|| self.err(format!("{key} = {v} is not a boolean"))),
        }
    }

    /// A token id, or the first and second of a list of ids.
    fn ids(&self, key: &str) -> Result<(Option<u32>, Option<u32>), Error> {
        let one = |v: &Json| v.as_u64().and_then(|n| u32::try_from(n).ok());
        let bad = || {
            self.err(format!(
                "{key} = {} is not a token id or a list of them",
                self.json[key]
            ))
        };
        match &self.json[key] {
            Json::Null => Ok((None, None)),
            Json::Array(list) => {
                let ids: Option<Vec<u32>> = list.iter().map(one).collect();
                let ids = ids.ok_or_else(bad)?;
                Ok((ids.first().copied(), ids.get(1).copied()))
            }
            v => one(v).map(|id| (Some(id), None)).ok_or_else(bad),
        }
    }
}

/// The description from the text of a `config.json`; `origin` labels errors.
pub fn config_from_json(text: &str, origin: &str) -> Result<LlamaConfig, Error> {
    Ok(parse(text, origin)?.0)
}

/// The description from the text of a `config.json` and the family of its `model_type`.
fn parse(text: &str, origin: &str) -> Result<(LlamaConfig, &'static Family), Error> {
    let json: Json = serde_json::from_str(text).map_err(|e| Error::HfConfig {
        origin: origin.to_owned(),
        reason: e.to_string(),
    })?;
    let f = Fields {
        json: &json,
        origin,
    };
    let model_type = json["model_type"].as_str().unwrap_or("llama");
    let Some(family) = crate::family::by_hf_type(model_type) else {
        return Err(f.err(format!(
            "model_type {model_type} is not supported ({})",
            crate::family::hf_types()
        )));
    };
    let (dim, n_heads) = (f.usize("hidden_size")?, f.usize("num_attention_heads")?);
    let (eos, eot) = f.ids("eos_token_id")?;
    let head_dim = f.usize_opt("head_dim")?.unwrap_or(dim / n_heads.max(1));
    let mut config = LlamaConfig {
        n_layers: f.usize("num_hidden_layers")?,
        dim,
        n_heads,
        n_kv_heads: f.usize_opt("num_key_value_heads")?.unwrap_or(n_heads),
        head_dim,
        hidden_dim: f.usize("intermediate_size")?,
        vocab_size: f.usize("vocab_size")?,
        context_length: f.usize("max_position_embeddings")?,
        rms_eps: f.f32_or("rms_norm_eps", 1e-6)?,
        rope: RopeConfig {
            theta: f.f32_or("rope_theta", 10000.0)?,
            scaling: rope_scaling(&f)?,
            pairing: RopePairing::HalfSplit,
            rotated: rotated_dims(&f, head_dim)?,
            ..RopeConfig::default()
        },
        tied_output: f.bool_or("tie_word_embeddings", false)?,
        block: Block {
            qkv_bias: f.bool_or("attention_bias", false)?,
            ..Block::default()
        },
        embed_scale: None,
        final_softcap: None,
        special: SpecialTokens {
            bos: f.ids("bos_token_id")?.0,
            eos,
            eot,
            pad: f.ids("pad_token_id")?.0,
        },
        layer_windows: layer_windows(&f)?,
    };
    long_rope(&f, &mut config.rope, config.context_length)?;
    (family.hf)(&mut config, &json).map_err(|why| f.err(why))?;
    config.validate().map_err(|e| e.in_file(origin))?;
    Ok((config, family))
}

/// `partial_rotary_factor` times the head width, checked; `None` when the whole head rotates.
fn rotated_dims(f: &Fields<'_>, head_dim: usize) -> Result<Option<usize>, Error> {
    let factor = f.f32_or("partial_rotary_factor", 1.0)?;
    let rotated = (factor * head_dim as f32).round();
    let rotated = if rotated.is_finite() && rotated >= 0.0 {
        rotated as usize
    } else {
        0
    };
    crate::config::valid_rotated(rotated, head_dim)
        .map_err(|why| f.err(format!("partial_rotary_factor = {factor}: {why}")))?;
    Ok((rotated != head_dim).then_some(rotated))
}

/// Per-layer windows: `layer_types` (`sliding_attention` / `full_attention` per layer) with
/// `sliding_window` when present; else none (all global; a family may set them).
fn layer_windows(f: &Fields<'_>) -> Result<Vec<Option<usize>>, Error> {
    let window = f.usize_opt("sliding_window")?;
    let types = &f.json["layer_types"];
    if types.is_null() {
        return Ok(Vec::new());
    }
    let Some(types) = types.as_array() else {
        return Err(f.err("layer_types is not a list".into()));
    };
    types
        .iter()
        .map(|t| match (t.as_str(), window) {
            (Some("full_attention"), _) => Ok(None),
            (Some("sliding_attention"), Some(w)) => Ok(Some(w)),
            (Some("sliding_attention"), None) => Err(f.err(
                "layer_types lists a sliding_attention layer but sliding_window is missing".into(),
            )),
            _ => Err(f.err(format!(
                "layer_types entry {t} is not supported (sliding_attention, full_attention)"
            ))),
        })
        .collect()
}

/// The `rope_scaling` types of Phi-3's LongRoPE (`su` in early configs).
const LONG_ROPE: [&str; 2] = ["longrope", "su"];

/// `rope_scaling` of type `longrope` into `rope`: its `short_factor` and `long_factor` lists,
/// `original_max_position_embeddings` (in `rope_scaling` or at the top level) and the attention
/// factor (`rope_scaling.attention_factor`, else `sqrt(1 + ln(s) / ln(original))` for
/// `s = max_position_embeddings / original` above 1, else 1: the rule of Hugging Face's LongRoPE
/// and of llama.cpp's converter). The description starts bound to the short set.
fn long_rope(f: &Fields<'_>, rope: &mut RopeConfig, context: usize) -> Result<(), Error> {
    let s = &f.json["rope_scaling"];
    let ty = s["rope_type"].as_str().or(s["type"].as_str()).unwrap_or("");
    if !LONG_ROPE.contains(&ty) {
        return Ok(());
    }
    let sub = Fields {
        json: s,
        origin: f.origin,
    };
    let original = match sub.usize_opt("original_max_position_embeddings")? {
        Some(o) => o,
        None => f.usize("original_max_position_embeddings")?,
    };
    let factors = |key: &str| -> Result<Vec<f32>, Error> {
        let list = s[key].as_array().and_then(|v| {
            v.iter()
                .map(|x| x.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<f32>>>()
        });
        list.ok_or_else(|| f.err(format!("rope_scaling.{key} is not a list of numbers")))
    };
    let (short, long) = (factors("short_factor")?, factors("long_factor")?);
    let scale = context as f64 / original.max(1) as f64;
    let computed = if scale > 1.0 {
        (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32
    } else {
        1.0
    };
    rope.attn_factor = Some(sub.f32_or("attention_factor", computed)?);
    rope.freq_factors = Some(short.clone());
    rope.long_rope = Some(LongRope {
        short,
        long,
        original_context: original,
    });
    Ok(())
}

/// `rope_scaling`: absent/null, `longrope` (read by [`long_rope`]), or `llama3` (key `rope_type`,
/// or `type` in older files).
fn rope_scaling(f: &Fields<'_>) -> Result<Option<Llama3Scaling>, Error> {
    let s = &f.json["rope_scaling"];
    if s.is_null() {
        return Ok(None);
    }
    let ty = s["rope_type"].as_str().or(s["type"].as_str()).unwrap_or("");
    if ty == "default" || LONG_ROPE.contains(&ty) {
        return Ok(None);
    }
    if ty != "llama3" {
        return Err(f.err(format!(
            "rope_scaling type {ty:?} is not supported (llama3, longrope)"
        )));
    }
    let sub = Fields {
        json: s,
        origin: f.origin,
    };
    let num = |k: &str| sub.f32_or(k, f32::NAN);
    Ok(Some(Llama3Scaling {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_context: sub.usize("original_max_position_embeddings")?,
    }))
}

#[cfg(test)]
pub(crate) mod tests;
