//! Genie bundles (Qualcomm AI Hub's `genie_bundle/`): `genie_config.json`, the context binaries it
//! lists and `tokenizer.json`.
//!
//! Read from `genie_config.json`: `dialog.context.size`, `n-vocab`, `bos-token` (−1 or absent: none),
//! `eos-token` (one id or a list); `dialog.tokenizer.path` (default `tokenizer.json`);
//! `dialog.engine.model.binary.ctx-bins`; `dialog.engine.model.positional-encoding` (`rope-dim`,
//! `rope-theta`, `rope-scaling` of `rope-type` `llama3` or `default`), or, in older bundles,
//! `dialog.engine.backend.QnnHtp.rope-theta` and `pos-id-dim`. Every other field is ignored. Paths
//! are relative to the bundle directory and may not leave it, as text (no `..`, not absolute) nor
//! through a symbolic link (the canonical path must lie inside the bundle's canonical path). The
//! file is read through the capped reader and every number is checked before use.

use model::fsio::{FileError, FileKind, read_capped};
use model::{Llama3Scaling, RopeConfig, RopePairing};
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

/// Most context binaries a bundle may list.
pub const MAX_CTX_BINS: usize = 64;

/// Errors reading a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading the bundle")]
    File(#[from] FileError),
    /// `genie_config.json` is not JSON of the expected shape (the source names the field).
    #[error("{} is not a Genie configuration", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_path_to_error::Error<serde_json::Error>,
    },
    /// A field has a value htpkv cannot use.
    #[error("{}: `{field}` {reason}", path.display())]
    Field {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
}

/// What a Genie bundle describes.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub dir: PathBuf,
    /// `dialog.context.size`.
    pub context: usize,
    /// `dialog.context.n-vocab`.
    pub vocab: usize,
    pub bos: Option<u32>,
    /// Tokens that end generation.
    pub eos: Vec<u32>,
    /// The context binaries, inside `dir`.
    pub ctx_bins: Vec<PathBuf>,
    /// The tokenizer, inside `dir`.
    pub tokenizer: PathBuf,
    /// RoPE theta and scaling for the cos/sin tables the runtime computes (`None`: the bundle
    /// names no positional encoding).
    pub rope: Option<RopeConfig>,
    /// `rope-dim` (or `pos-id-dim`): the width of the RoPE tables, when given.
    pub rope_dim: Option<usize>,
}

#[derive(Deserialize)]
struct Config {
    dialog: Dialog,
}

#[derive(Deserialize)]
struct Dialog {
    context: Context,
    #[serde(default)]
    tokenizer: Option<TokenizerCfg>,
    engine: Engine,
}

#[derive(Deserialize)]
struct Context {
    size: u64,
    #[serde(rename = "n-vocab")]
    n_vocab: u64,
    #[serde(rename = "bos-token", default)]
    bos: Option<i64>,
    #[serde(rename = "eos-token", default)]
    eos: Option<OneOrMany>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(i64),
    Many(Vec<i64>),
}

#[derive(Deserialize)]
struct TokenizerCfg {
    path: String,
}

#[derive(Deserialize)]
struct Engine {
    #[serde(default)]
    backend: Option<BackendCfg>,
    model: ModelCfg,
}

#[derive(Deserialize)]
struct BackendCfg {
    #[serde(rename = "QnnHtp", default)]
    qnn_htp: Option<QnnHtpCfg>,
}

#[derive(Deserialize)]
struct QnnHtpCfg {
    #[serde(rename = "rope-theta", default)]
    rope_theta: Option<f64>,
    #[serde(rename = "pos-id-dim", default)]
    pos_id_dim: Option<u64>,
}

#[derive(Deserialize)]
struct ModelCfg {
    binary: BinaryCfg,
    #[serde(rename = "positional-encoding", default)]
    positional_encoding: Option<PositionalEncoding>,
}

#[derive(Deserialize)]
struct BinaryCfg {
    #[serde(rename = "ctx-bins")]
    ctx_bins: Vec<String>,
}

#[derive(Deserialize)]
struct PositionalEncoding {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(rename = "rope-dim", default)]
    rope_dim: Option<u64>,
    #[serde(rename = "rope-theta", default)]
    rope_theta: Option<f64>,
    #[serde(rename = "rope-scaling", default)]
    rope_scaling: Option<RopeScaling>,
}

#[derive(Deserialize)]
struct RopeScaling {
    #[serde(rename = "rope-type", default)]
    rope_type: Option<String>,
    #[serde(default)]
    factor: Option<f64>,
    #[serde(rename = "low-freq-factor", default)]
    low_freq_factor: Option<f64>,
    #[serde(rename = "high-freq-factor", default)]
    high_freq_factor: Option<f64>,
    #[serde(rename = "original-max-position-embeddings", default)]
    original_context: Option<u64>,
}

impl Bundle {
    /// The bundle's `genie_config.json` (for messages about what it lists).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("genie_config.json")
    }

    /// Reads `DIR/genie_config.json` and checks what it names.
    pub fn open(dir: &Path) -> Result<Bundle, BundleError> {
        let path = dir.join("genie_config.json");
        let bytes = read_capped(&path, FileKind::CONFIG)?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let config: Config =
            serde_path_to_error::deserialize(&mut de).map_err(|source| BundleError::Json {
                path: path.clone(),
                source,
            })?;
        Bundle::check(dir, &path, config.dialog)
    }

    fn check(dir: &Path, path: &Path, d: Dialog) -> Result<Bundle, BundleError> {
        let bad = |field: &'static str, reason: String| BundleError::Field {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let context = bounded(d.context.size, 2, kv_manager::MAX_CONTEXT as u64)
            .map_err(|r| bad("dialog.context.size", r))?;
        let vocab = bounded(d.context.n_vocab, 1, model::limits::MAX_VOCAB as u64)
            .map_err(|r| bad("dialog.context.n-vocab", r))?;
        let token = |id: i64, field| -> Result<Option<u32>, BundleError> {
            match id {
                i64::MIN..=-1 => Ok(None),
                id if (id as u64) < vocab as u64 => Ok(Some(id as u32)),
                id => Err(bad(field, format!("{id} is not below n-vocab {vocab}"))),
            }
        };
        let bos = match d.context.bos {
            Some(id) => token(id, "dialog.context.bos-token")?,
            None => None,
        };
        let eos_ids = match d.context.eos {
            None => Vec::new(),
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(v)) => v,
        };
        let mut eos = Vec::new();
        for id in eos_ids.into_iter().take(1024) {
            eos.extend(token(id, "dialog.context.eos-token")?);
        }
        let bins = &d.engine.model.binary.ctx_bins;
        if bins.is_empty() || bins.len() > MAX_CTX_BINS {
            return Err(bad(
                "dialog.engine.model.binary.ctx-bins",
                format!("lists {} binaries (1 to {MAX_CTX_BINS})", bins.len()),
            ));
        }
        let ctx_bins = bins
            .iter()
            .map(|b| inside(dir, b).map_err(|r| bad("dialog.engine.model.binary.ctx-bins", r)))
            .collect::<Result<Vec<_>, _>>()?;
        let tok = d.tokenizer.map_or("tokenizer.json".to_string(), |t| t.path);
        let tokenizer = inside(dir, &tok).map_err(|r| bad("dialog.tokenizer.path", r))?;
        let htp = d.engine.backend.and_then(|b| b.qnn_htp);
        let pe = d.engine.model.positional_encoding;
        if let Some(kind) = pe.as_ref().and_then(|p| p.kind.as_deref())
            && kind != "rope"
        {
            return Err(bad(
                "positional-encoding.type",
                format!("`{kind}` is not supported (rope)"),
            ));
        }
        let theta = pe
            .as_ref()
            .and_then(|p| p.rope_theta)
            .or(htp.as_ref().and_then(|h| h.rope_theta));
        let rope_dim = pe
            .as_ref()
            .and_then(|p| p.rope_dim)
            .or(htp.as_ref().and_then(|h| h.pos_id_dim))
            .map(|v| bounded(v, 1, 1 << 14).map_err(|r| bad("positional-encoding.rope-dim", r)))
            .transpose()?;
        let scaling = match pe.and_then(|p| p.rope_scaling) {
            Some(s) => llama3(s)
                .map_err(|r| bad("dialog.engine.model.positional-encoding.rope-scaling", r))?,
            None => None,
        };
        let rope = match theta {
            Some(t) if t.is_finite() && t > 1.0 && t < 1e12 => Some(RopeConfig {
                theta: t as f32,
                scaling,
                // Tables do not depend on the pairing; AI Hub's exports use Hugging Face's.
                pairing: RopePairing::HalfSplit,
                ..RopeConfig::default()
            }),
            Some(t) => {
                return Err(bad(
                    "positional-encoding.rope-theta",
                    format!("{t} is not a RoPE base"),
                ));
            }
            None => None,
        };
        Ok(Bundle {
            dir: dir.to_path_buf(),
            context,
            vocab,
            bos,
            eos,
            ctx_bins,
            tokenizer,
            rope,
            rope_dim,
        })
    }
}

fn bounded(v: u64, min: u64, max: u64) -> Result<usize, String> {
    if v < min || v > max {
        return Err(format!("is {v}, outside {min}..={max}"));
    }
    Ok(v as usize)
}

/// `name` as a path inside `dir`: relative, without `..`, and, when it exists, resolving (through
/// any symlinked directory or file) to a path inside `dir`'s canonical path. The resolved path is
/// returned, so the file read is the one checked. A missing file is left to the reader to report.
pub fn inside(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let p = Path::new(name);
    let ok = !name.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !ok {
        return Err(format!(
            "`{name}` must be a relative path inside the bundle directory"
        ));
    }
    let joined = dir.join(p);
    let Ok(resolved) = std::fs::canonicalize(&joined) else {
        return Ok(joined);
    };
    let root = std::fs::canonicalize(dir)
        .map_err(|e| format!("cannot resolve the bundle directory: {e}"))?;
    if !resolved.starts_with(&root) {
        return Err(format!(
            "`{name}` resolves to {}, outside the bundle directory {} (through a symbolic link)",
            resolved.display(),
            root.display()
        ));
    }
    Ok(resolved)
}

/// Llama 3 scaling from `rope-scaling` (`None` for `default`).
fn llama3(s: RopeScaling) -> Result<Option<Llama3Scaling>, String> {
    match s.rope_type.as_deref().unwrap_or("default") {
        "default" => return Ok(None),
        "llama3" => {}
        other => {
            return Err(format!(
                "rope-type `{other}` is not supported (llama3, default)"
            ));
        }
    }
    let f = |v: Option<f64>, name: &str| -> Result<f32, String> {
        match v {
            Some(x) if x.is_finite() && x > 0.0 && x < 1e6 => Ok(x as f32),
            Some(x) => Err(format!("{name} {x} is not a positive factor")),
            None => Err(format!("llama3 needs {name}")),
        }
    };
    let (low, high) = (
        f(s.low_freq_factor, "low-freq-factor")?,
        f(s.high_freq_factor, "high-freq-factor")?,
    );
    if high <= low {
        return Err(format!(
            "high-freq-factor {high} must exceed low-freq-factor {low}"
        ));
    }
    let original = s
        .original_context
        .ok_or("llama3 needs original-max-position-embeddings")?;
    Ok(Some(Llama3Scaling {
        factor: f(s.factor, "factor")?,
        low_freq_factor: low,
        high_freq_factor: high,
        original_context: bounded(original, 1, kv_manager::MAX_CONTEXT as u64)?,
    }))
}

#[cfg(test)]
mod tests;
