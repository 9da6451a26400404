//! llama2.c legacy ("v0") checkpoints: header, weights, validation and serialization.
//!
//! Layout (all little-endian): 7 × `i32` header `dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//! vocab_size, seq_len` (a negative `vocab_size` means an untied classifier follows the weights),
//! then `f32` arrays `token_embedding (vocab, dim)`, `rms_att (L, dim)`, `wq (L, dim, dim)`,
//! `wk (L, kv_dim, dim)`, `wv (L, kv_dim, dim)`, `wo (L, dim, dim)`, `rms_ffn (L, dim)`,
//! `w1 (L, hidden, dim)`, `w2 (L, dim, hidden)`, `w3 (L, hidden, dim)`, `rms_final (dim)`, two legacy
//! RoPE tables of `seq_len * head_dim / 2` floats each (ignored on load), and `wcls (vocab, dim)`
//! only when the classifier is not shared. The file size must match exactly.

use std::path::Path;

use super::ModelError;
use super::files::sha256;
use crate::fsio::{CappedFile, FileKind};
use crate::le::LeReader;

/// Size of the checkpoint header in bytes (7 × i32).
pub const HEADER_BYTES: usize = 28;

/// Upper bounds accepted for header fields: generous for real models, small enough that size
/// arithmetic can't overflow and a corrupted header fails fast instead of allocating terabytes.
pub mod limits {
    /// Max `dim`.
    pub const MAX_DIM: usize = 1 << 16;
    /// Max `hidden_dim`.
    pub const MAX_HIDDEN_DIM: usize = 1 << 18;
    /// Max `n_layers`.
    pub const MAX_LAYERS: usize = 1 << 10;
    /// Max `n_heads` (and `n_kv_heads`).
    pub const MAX_HEADS: usize = 1 << 10;
    /// Max `vocab_size` (absolute value).
    pub const MAX_VOCAB: usize = 1 << 22;
    /// Max `seq_len`.
    pub const MAX_SEQ_LEN: usize = 1 << 20;
}

/// Model hyper-parameters from the checkpoint header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Model (residual stream) width.
    pub dim: usize,
    /// FFN hidden width.
    pub hidden_dim: usize,
    /// Number of transformer layers.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    /// Vocabulary size (always positive here).
    pub vocab_size: usize,
    /// Maximum context length.
    pub seq_len: usize,
    /// True when the classifier is the token embedding (header `vocab_size` positive).
    pub shared_classifier: bool,
}

impl Config {
    /// Per-head width, `dim / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Width of one position's keys (or values) over all KV heads, `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim()
    }

    /// Query heads per KV head, `n_heads / n_kv_heads`.
    pub fn kv_mul(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Parses and validates the 28-byte header. `origin` labels errors.
    pub fn from_header(bytes: &[u8], origin: &str) -> Result<Config, ModelError> {
        let mut r = LeReader::from_slice(bytes);
        let mut f = [0i32; 7];
        for v in &mut f {
            *v = r.i32("header").map_err(|_| ModelError::Truncated {
                origin: origin.to_owned(),
                what: "header".to_owned(),
                expected: HEADER_BYTES as u64,
                found: bytes.len() as u64,
            })?;
        }
        let bad = |field: &'static str, value: i32, reason: String| ModelError::BadHeader {
            origin: origin.to_owned(),
            field,
            value: i64::from(value),
            reason,
        };
        let positive = |field: &'static str, value: i32, max: usize| {
            if value <= 0 {
                Err(bad(field, value, "must be positive".to_owned()))
            } else if value as usize > max {
                Err(bad(field, value, format!("must be at most {max}")))
            } else {
                Ok(value as usize)
            }
        };
        let dim = positive("dim", f[0], limits::MAX_DIM)?;
        let hidden_dim = positive("hidden_dim", f[1], limits::MAX_HIDDEN_DIM)?;
        let n_layers = positive("n_layers", f[2], limits::MAX_LAYERS)?;
        let n_heads = positive("n_heads", f[3], limits::MAX_HEADS)?;
        let n_kv_heads = positive("n_kv_heads", f[4], limits::MAX_HEADS)?;
        let shared_classifier = f[5] > 0;
        let vocab_size = if f[5] == 0 || f[5] == i32::MIN {
            return Err(bad("vocab_size", f[5], "must be non-zero".to_owned()));
        } else {
            let v = f[5].unsigned_abs() as usize;
            if v > limits::MAX_VOCAB {
                return Err(bad(
                    "vocab_size",
                    f[5],
                    format!("absolute value must be at most {}", limits::MAX_VOCAB),
                ));
            }
            v
        };
        let seq_len = positive("seq_len", f[6], limits::MAX_SEQ_LEN)?;
        if dim % n_heads != 0 {
            return Err(bad("n_heads", f[3], format!("must divide dim = {dim}")));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(bad(
                "n_kv_heads",
                f[4],
                format!("must divide n_heads = {n_heads}"),
            ));
        }
        if (dim / n_heads) % 2 != 0 {
            return Err(bad(
                "n_heads",
                f[3],
                format!(
                    "head_dim = dim / n_heads = {} must be even for RoPE",
                    dim / n_heads
                ),
            ));
        }
        Ok(Config {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            seq_len,
            shared_classifier,
        })
    }

    /// Serializes the header (vocab_size negated when the classifier is not shared).
    ///
    /// Returns `None` if a field does not fit in an `i32`.
    pub fn to_header(&self) -> Option<[u8; HEADER_BYTES]> {
        let vocab = i32::try_from(self.vocab_size).ok()?;
        let fields = [
            i32::try_from(self.dim).ok()?,
            i32::try_from(self.hidden_dim).ok()?,
            i32::try_from(self.n_layers).ok()?,
            i32::try_from(self.n_heads).ok()?,
            i32::try_from(self.n_kv_heads).ok()?,
            if self.shared_classifier {
                vocab
            } else {
                -vocab
            },
            i32::try_from(self.seq_len).ok()?,
        ];
        let mut out = [0u8; HEADER_BYTES];
        for (chunk, v) in out.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Some(out)
    }

    /// The file sections in order, with their element counts (f32s). The RoPE tables are listed
    /// as `freq_cis_real` / `freq_cis_imag`; `wcls` is present only for an unshared classifier.
    pub fn sections(&self) -> Vec<(&'static str, usize)> {
        let (d, h, l, v, kv) = (
            self.dim,
            self.hidden_dim,
            self.n_layers,
            self.vocab_size,
            self.kv_dim(),
        );
        let rope = self.seq_len * self.head_dim() / 2;
        let mut s = vec![
            ("token_embedding", v * d),
            ("rms_att", l * d),
            ("wq", l * d * d),
            ("wk", l * kv * d),
            ("wv", l * kv * d),
            ("wo", l * d * d),
            ("rms_ffn", l * d),
            ("w1", l * h * d),
            ("w2", l * d * h),
            ("w3", l * h * d),
            ("rms_final", d),
            ("freq_cis_real", rope),
            ("freq_cis_imag", rope),
        ];
        if !self.shared_classifier {
            s.push(("wcls", v * d));
        }
        s
    }

    /// Exact checkpoint file size implied by this config.
    pub fn file_bytes(&self) -> u64 {
        HEADER_BYTES as u64
            + self
                .sections()
                .iter()
                .map(|(_, n)| *n as u64 * 4)
                .sum::<u64>()
    }
}

/// All weights as f32, row-major `(out, in)` (so `y = W x`), per-layer tensors concatenated over
/// layers. Use the accessors (`wq(layer)` etc.) for one layer's slice.
///
/// The accessors derive `dim` from `rms_final.len()` and the layer count from
/// `rms_att.len() / dim`, so they are only meaningful for weights consistent with a [`Config`]
/// (as guaranteed by [`Checkpoint::new`] / [`Checkpoint::from_bytes`]); they panic if `layer` is
/// out of range.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// `(vocab, dim)`.
    pub token_embedding: Vec<f32>,
    /// `(layers, dim)`: RMSNorm weights before attention.
    pub rms_att: Vec<f32>,
    /// `(layers, dim, dim)`.
    pub wq: Vec<f32>,
    /// `(layers, kv_dim, dim)`.
    pub wk: Vec<f32>,
    /// `(layers, kv_dim, dim)`.
    pub wv: Vec<f32>,
    /// `(layers, dim, dim)`.
    pub wo: Vec<f32>,
    /// `(layers, dim)`: RMSNorm weights before the FFN.
    pub rms_ffn: Vec<f32>,
    /// `(layers, hidden, dim)`: gate projection.
    pub w1: Vec<f32>,
    /// `(layers, dim, hidden)`: down projection.
    pub w2: Vec<f32>,
    /// `(layers, hidden, dim)`: up projection.
    pub w3: Vec<f32>,
    /// `(dim)`: final RMSNorm weights.
    pub rms_final: Vec<f32>,
    /// `(vocab, dim)` classifier when not tied to the embedding.
    pub wcls: Option<Vec<f32>>,
}

fn layer_slice(v: &[f32], n_layers: usize, layer: usize) -> &[f32] {
    let per = v.len() / n_layers.max(1);
    &v[layer * per..(layer + 1) * per]
}

impl Weights {
    /// Number of layers implied by `rms_att.len() / rms_final.len()`.
    pub fn n_layers(&self) -> usize {
        self.rms_att.len() / self.rms_final.len().max(1)
    }
    /// Embedding row of `token` (`dim` floats). Panics if `token >= vocab_size` (callers such as
    /// [`super::FloatModel::forward`] range-check ids first).
    pub fn embedding(&self, token: usize) -> &[f32] {
        let d = self.rms_final.len();
        &self.token_embedding[token * d..(token + 1) * d]
    }
    /// Attention RMSNorm weights of `layer` (`dim`).
    pub fn rms_att(&self, layer: usize) -> &[f32] {
        layer_slice(&self.rms_att, self.n_layers(), layer)
    }
    /// Query projection of `layer` (`dim × dim`).
    pub fn wq(&self, layer: usize) -> &[f32] {
        layer_slice(&self.wq, self.n_layers(), layer)
    }
    /// Key projection of `layer` (`kv_dim × dim`).
    pub fn wk(&self, layer: usize) -> &[f32] {
        layer_slice(&self.wk, self.n_layers(), layer)
    }
    /// Value projection of `layer` (`kv_dim × dim`).
    pub fn wv(&self, layer: usize) -> &[f32] {
        layer_slice(&self.wv, self.n_layers(), layer)
    }
    /// Output projection of `layer` (`dim × dim`).
    pub fn wo(&self, layer: usize) -> &[f32] {
        layer_slice(&self.wo, self.n_layers(), layer)
    }
    /// FFN RMSNorm weights of `layer` (`dim`).
    pub fn rms_ffn(&self, layer: usize) -> &[f32] {
        layer_slice(&self.rms_ffn, self.n_layers(), layer)
    }
    /// Gate projection of `layer` (`hidden × dim`).
    pub fn w1(&self, layer: usize) -> &[f32] {
        layer_slice(&self.w1, self.n_layers(), layer)
    }
    /// Down projection of `layer` (`dim × hidden`).
    pub fn w2(&self, layer: usize) -> &[f32] {
        layer_slice(&self.w2, self.n_layers(), layer)
    }
    /// Up projection of `layer` (`hidden × dim`).
    pub fn w3(&self, layer: usize) -> &[f32] {
        layer_slice(&self.w3, self.n_layers(), layer)
    }
}

/// A loaded checkpoint: validated config plus weights whose sizes match it.
///
/// Two checkpoints are equal when their config and weights are (the digest of their bytes may
/// differ in the ignored legacy RoPE tables).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Hyper-parameters.
    pub config: Config,
    /// Weights (sizes consistent with `config`).
    pub weights: Weights,
    /// SHA-256 of the bytes it was parsed from (of [`Checkpoint::to_bytes`] when built from
    /// parts).
    sha256: [u8; 32],
}

impl PartialEq for Checkpoint {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && self.weights == other.weights
    }
}

fn read_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Checkpoint {
    /// Reads and validates a checkpoint file (see the module docs for the format).
    ///
    /// The file must be a regular file under [`FileKind::CHECKPOINT`]'s cap; its header is
    /// checked, and its size compared with the size the header implies, before the rest is read.
    pub fn load(path: &Path) -> Result<Checkpoint, ModelError> {
        let origin = path.display().to_string();
        let mut file = CappedFile::open(path, FileKind::CHECKPOINT)?;
        let mut bytes = Vec::new();
        file.read_up_to(&mut bytes, HEADER_BYTES as u64)?;
        let config = Config::from_header(&bytes, &origin)?;
        if file.len() > config.file_bytes() {
            return Err(ModelError::TrailingBytes {
                origin,
                expected: config.file_bytes(),
                found: file.len(),
            });
        }
        file.read_rest(&mut bytes)?;
        Checkpoint::from_bytes(&bytes, &origin)
    }

    /// SHA-256 (lower-case hex) of the checkpoint's bytes: of the file for a loaded checkpoint
    /// (what `sha256sum` prints), of [`Checkpoint::to_bytes`] for one built from parts.
    pub fn sha256_hex(&self) -> String {
        super::files::hex(&self.sha256)
    }

    /// [`Self::sha256_hex`] as bytes.
    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }

    /// Parses a checkpoint from memory. `origin` labels errors (e.g. a path).
    ///
    /// Errors: [`ModelError::BadHeader`] for an invalid header, [`ModelError::Truncated`] naming
    /// the first section that is short, [`ModelError::TrailingBytes`] when the data is longer
    /// than the header implies, [`ModelError::NonFinite`] for a NaN or infinite weight.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Checkpoint, ModelError> {
        let config = Config::from_header(bytes, origin)?;
        let found = bytes.len() as u64;
        let mut r = LeReader::from_slice(&bytes[HEADER_BYTES..]);
        let mut parts: Vec<(&'static str, &[u8])> = Vec::new();
        for (name, n) in config.sections() {
            let part = r
                .take(n.saturating_mul(4), name)
                .map_err(|_| ModelError::Truncated {
                    origin: origin.to_owned(),
                    what: format!("section {name}"),
                    expected: config.file_bytes(),
                    found,
                })?;
            parts.push((name, part));
        }
        if r.remaining() != 0 {
            return Err(ModelError::TrailingBytes {
                origin: origin.to_owned(),
                expected: HEADER_BYTES as u64 + r.position(),
                found,
            });
        }
        // The legacy RoPE tables are ignored; every weight must be finite.
        let mut at = HEADER_BYTES as u64;
        for (name, b) in &parts {
            if !name.starts_with("freq_cis")
                && let Some(i) = b
                    .chunks_exact(4)
                    .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
            {
                return Err(ModelError::NonFinite {
                    origin: origin.to_owned(),
                    tensor: name,
                    index: i,
                    offset: at + 4 * i as u64,
                });
            }
            at += b.len() as u64;
        }
        let get = |want: &str| -> Vec<f32> {
            parts
                .iter()
                .find(|(n, _)| *n == want)
                .map(|(_, b)| read_f32s(b))
                .unwrap_or_default()
        };
        let weights = Weights {
            token_embedding: get("token_embedding"),
            rms_att: get("rms_att"),
            wq: get("wq"),
            wk: get("wk"),
            wv: get("wv"),
            wo: get("wo"),
            rms_ffn: get("rms_ffn"),
            w1: get("w1"),
            w2: get("w2"),
            w3: get("w3"),
            rms_final: get("rms_final"),
            wcls: if config.shared_classifier {
                None
            } else {
                Some(get("wcls"))
            },
        };
        Ok(Checkpoint {
            config,
            weights,
            sha256: sha256(bytes),
        })
    }

    /// Builds a checkpoint from parts, checking every tensor's size against `config` (and that
    /// `wcls` is present exactly when `config.shared_classifier` is false).
    pub fn new(config: Config, weights: Weights) -> Result<Checkpoint, ModelError> {
        let expect = config.sections();
        let size_of = |name: &str| {
            expect
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, s)| *s)
                .unwrap_or(0)
        };
        let w = &weights;
        let tensors: [(&'static str, usize); 11] = [
            ("token_embedding", w.token_embedding.len()),
            ("rms_att", w.rms_att.len()),
            ("wq", w.wq.len()),
            ("wk", w.wk.len()),
            ("wv", w.wv.len()),
            ("wo", w.wo.len()),
            ("rms_ffn", w.rms_ffn.len()),
            ("w1", w.w1.len()),
            ("w2", w.w2.len()),
            ("w3", w.w3.len()),
            ("rms_final", w.rms_final.len()),
        ];
        for (name, found) in tensors {
            let expected = size_of(name);
            if found != expected {
                return Err(ModelError::WeightShape {
                    tensor: name,
                    expected,
                    found,
                });
            }
        }
        let cls_expected = if config.shared_classifier {
            0
        } else {
            config.vocab_size * config.dim
        };
        let cls_found = w.wcls.as_ref().map_or(0, Vec::len);
        if cls_found != cls_expected || w.wcls.is_some() == config.shared_classifier {
            return Err(ModelError::WeightShape {
                tensor: "wcls",
                expected: cls_expected,
                found: cls_found,
            });
        }
        // Re-validate the config itself through the header path.
        if let Some(h) = config.to_header() {
            Config::from_header(&h, "Checkpoint::new config")?;
        } else {
            return Err(ModelError::BadHeader {
                origin: "Checkpoint::new config".to_owned(),
                field: "dim",
                value: config.dim as i64,
                reason: "a field does not fit in i32".to_owned(),
            });
        }
        let mut ckpt = Checkpoint {
            config,
            weights,
            sha256: [0; 32],
        };
        ckpt.sha256 = sha256(&ckpt.to_bytes());
        Ok(ckpt)
    }

    /// The classifier matrix `(vocab, dim)`: `wcls` if present, else the token embedding.
    pub fn classifier(&self) -> &[f32] {
        self.weights
            .wcls
            .as_deref()
            .unwrap_or(&self.weights.token_embedding)
    }

    /// Serializes to the llama2.c v0 format. The legacy RoPE tables are written as
    /// `cos(pos·f_i)` / `sin(pos·f_i)` computed in f32 (they are ignored on load, so the bytes
    /// may differ from an upstream file's while every weight round-trips exactly).
    pub fn to_bytes(&self) -> Vec<u8> {
        let c = &self.config;
        let mut out = Vec::with_capacity(c.file_bytes() as usize);
        // Checkpoint::new / from_bytes validated the config, so the header fits.
        out.extend_from_slice(&c.to_header().unwrap_or([0; HEADER_BYTES]));
        let w = &self.weights;
        let mut put = |v: &[f32]| {
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
        for v in [
            &w.token_embedding,
            &w.rms_att,
            &w.wq,
            &w.wk,
            &w.wv,
            &w.wo,
            &w.rms_ffn,
            &w.w1,
            &w.w2,
            &w.w3,
            &w.rms_final,
        ] {
            put(v);
        }
        let hd = c.head_dim();
        let (mut re, mut im) = (Vec::new(), Vec::new());
        for pos in 0..c.seq_len {
            for i in 0..hd / 2 {
                let f = 1.0 / 10000f32.powf((2 * i) as f32 / hd as f32);
                let a = pos as f32 * f;
                re.push(a.cos());
                im.push(a.sin());
            }
        }
        put(&re);
        put(&im);
        if let Some(cls) = &w.wcls {
            put(cls);
        }
        out
    }

    /// A deterministic pseudo-random checkpoint for tests of code that needs *some* model of a
    /// given shape. Weights are uniform in ±`1/sqrt(fan_in)`, norms around 1. `config` must be
    /// valid (same rules as the header).
    pub fn synthetic(config: Config, seed: u64) -> Result<Checkpoint, ModelError> {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let mut fill = |n: usize, scale: f32, bias: f32| -> Vec<f32> {
            (0..n).map(|_| bias + scale * next()).collect()
        };
        let (d, h, l, v, kv) = (
            config.dim,
            config.hidden_dim,
            config.n_layers,
            config.vocab_size,
            config.kv_dim(),
        );
        let sd = 1.0 / (d as f32).sqrt();
        let sh = 1.0 / (h as f32).sqrt();
        let weights = Weights {
            token_embedding: fill(v * d, 1.0, 0.0),
            rms_att: fill(l * d, 0.2, 1.0),
            wq: fill(l * d * d, sd, 0.0),
            wk: fill(l * kv * d, sd, 0.0),
            wv: fill(l * kv * d, sd, 0.0),
            wo: fill(l * d * d, sd, 0.0),
            rms_ffn: fill(l * d, 0.2, 1.0),
            w1: fill(l * h * d, sd, 0.0),
            w2: fill(l * d * h, sh, 0.0),
            w3: fill(l * h * d, sd, 0.0),
            rms_final: fill(d, 0.2, 1.0),
            wcls: if config.shared_classifier {
                None
            } else {
                Some(fill(v * d, sd, 0.0))
            },
        };
        Checkpoint::new(config, weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(f: [i32; 7]) -> Vec<u8> {
        f.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn header_parses_and_derives_dims() {
        let c = Config::from_header(&header([64, 172, 5, 8, 4, 512, 512]), "t").unwrap();
        assert_eq!(c.head_dim(), 8);
        assert_eq!(c.kv_dim(), 32);
        assert_eq!(c.kv_mul(), 2);
        assert!(c.shared_classifier);
        let c2 = Config::from_header(&header([64, 172, 5, 8, 4, -512, 512]), "t").unwrap();
        assert!(!c2.shared_classifier);
        assert_eq!(c2.vocab_size, 512);
        assert_eq!(c2.file_bytes() - c.file_bytes(), 512 * 64 * 4);
    }

    #[test]
    fn header_rejections_name_the_field() {
        let cases: [([i32; 7], &str); 9] = [
            ([0, 172, 5, 8, 4, 512, 512], "dim"),
            ([64, -1, 5, 8, 4, 512, 512], "hidden_dim"),
            ([64, 172, 0, 8, 4, 512, 512], "n_layers"),
            ([64, 172, 5, 7, 1, 512, 512], "n_heads"), // 64 % 7 != 0
            ([64, 172, 5, 8, 3, 512, 512], "n_kv_heads"), // 8 % 3 != 0
            ([64, 172, 5, 64, 4, 512, 512], "n_heads"), // head_dim 1 is odd
            ([64, 172, 5, 8, 4, 0, 512], "vocab_size"),
            ([64, 172, 5, 8, 4, 512, 0], "seq_len"),
            ([i32::MAX, 172, 5, 8, 4, 512, 512], "dim"),
        ];
        for (f, field) in cases {
            match Config::from_header(&header(f), "t") {
                Err(ModelError::BadHeader { field: got, .. }) => assert_eq!(got, field, "{f:?}"),
                other => panic!("{f:?}: expected BadHeader({field}), got {other:?}"),
            }
        }
        match Config::from_header(&[0u8; 27], "short") {
            Err(ModelError::Truncated {
                expected, found, ..
            }) => assert_eq!((expected, found), (28, 27)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn synthetic_roundtrips_through_bytes() {
        for shared in [true, false] {
            let cfg = Config {
                dim: 16,
                hidden_dim: 24,
                n_layers: 2,
                n_heads: 4,
                n_kv_heads: 2,
                vocab_size: 40,
                seq_len: 8,
                shared_classifier: shared,
            };
            let ck = Checkpoint::synthetic(cfg, 7).unwrap();
            let bytes = ck.to_bytes();
            assert_eq!(bytes.len() as u64, cfg.file_bytes());
            let back = Checkpoint::from_bytes(&bytes, "synthetic").unwrap();
            assert_eq!(back, ck);
            assert_eq!(back.weights.wq(1).len(), 16 * 16);
            assert_eq!(back.weights.wk(1), &ck.weights.wk[8 * 16..]);
            let cls_is_emb = std::ptr::eq(
                back.classifier().as_ptr(),
                back.weights.token_embedding.as_ptr(),
            );
            assert_eq!(cls_is_emb, shared);
        }
    }

    #[test]
    fn new_rejects_wrong_shapes() {
        let cfg = Config {
            dim: 8,
            hidden_dim: 12,
            n_layers: 1,
            n_heads: 2,
            n_kv_heads: 1,
            vocab_size: 10,
            seq_len: 4,
            shared_classifier: true,
        };
        let ck = Checkpoint::synthetic(cfg, 1).unwrap();
        let mut w = ck.weights.clone();
        w.w2.pop();
        assert!(matches!(
            Checkpoint::new(cfg, w),
            Err(ModelError::WeightShape { tensor: "w2", .. })
        ));
        let mut w = ck.weights.clone();
        w.wcls = Some(vec![0.0; 80]);
        assert!(matches!(
            Checkpoint::new(cfg, w),
            Err(ModelError::WeightShape { tensor: "wcls", .. })
        ));
    }
}
