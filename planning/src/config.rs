//! The model configuration schema: one YAML file describes a model, its static graphs and how its KV
//! cache is stored and updated. `htpkv budget`, `htpkv plan` and the runtime all read this one schema.
//!
//! ```yaml
//! model: { name: llama-2-7b, layers: 32, heads: 32, kv_heads: 32, head_dim: 128, vocab: 32000 }
//! graph: { context: 2048, ar: [1] }
//! kv:    { dtype: u16, k_layout: rows, tensors: per_head, update: shift, reserve: 2x }
//! ```
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `model.name` | string | shown in reports |
//! | `model.layers`, `model.heads`, `model.kv_heads`, `model.head_dim` | integer >= 1 | attention geometry; `heads` must be a multiple of `kv_heads` (GQA) |
//! | `model.vocab` | integer >= 1 | vocabulary size (logits are `[n, vocab]`) |
//! | `model.dim` | integer, optional | hidden size; when given it must equal `heads x head_dim` |
//! | `model.sliding_window` | integer, optional | W, the attention window of the model's sliding layers: each of their tokens sees the last W positions. A layer whose window exceeds `S - max(ar) + 1` is served as a global layer (a static graph of context S sees at most S tokens anyway) |
//! | `model.global_every` | integer, optional | with `sliding_window`: every N-th layer (layers N-1, 2N-1, ...) is global and the others slide (Gemma 3: 6, i.e. 5 local : 1 global); without it every layer slides (Mistral) |
//! | `graph.context` | integer | S, the context length of every static graph (the mask is `[n, S]`) |
//! | `graph.ar` | list of integers | the AR variants n sharing the cache, e.g. `[1, 128]`; each must be smaller than S |
//! | `kv.dtype` | `u8` `u16` `i8` `i16` `f16` `f32` | element type of the K/V tensors |
//! | `kv.k_layout` | `rows` (default) or `transposed` | layout of the K tensors |
//! | `kv.tensors` | `per_head` (default) or `per_layer` | tensor granularity |
//! | `kv.update` | `shift` `conveyor` `smart_mask` `naive` | update strategy |
//! | `kv.reserve` | `2x` (default), `1.5x`, a row count, or `+K` | `shift` only: rows per buffer, see [`ReserveConfig`] |
//! | `kv.stagger` | bool (default false) | `shift` only: stagger the layers' rebases |
//!
//! Every count has an explicit maximum that no real model reaches, checked before anything is sized:
//! `layers` <= 4,096 ([`kv_manager::MAX_LAYERS`]), `heads` and `kv_heads` <= 4,096
//! ([`kv_manager::MAX_HEADS`]) with 2 x layers x kv_heads <= 262,144 buffers
//! ([`kv_manager::MAX_BUFFERS`]), `head_dim` <= 4,096, `vocab` <= 16,777,216 ([`MAX_VOCAB`]),
//! `context` and `sliding_window` <= 16,777,216 ([`kv_manager::MAX_CONTEXT`]), at most 64 AR variants,
//! and a `shift` reservation of at most 67,108,864 rows per buffer ([`kv_manager::MAX_RESERVE_ROWS`]);
//! the reasons are in [`kv_manager::size`].
//!
//! Unknown fields are rejected. Every error names the file, the field path (`model.heads`,
//! `graph.ar[1]`, ...) and what was expected; syntax and type errors also give the line and column.

use kv_manager::{
    CacheSpec, Geometry, Granularity, KLayout, KvError, MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS,
    MAX_LAYERS, Reserve, Strategy,
};
use quant::DataType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A config that could not be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, a directory, over the 1 MiB config cap — so
    /// `/dev/zero` stops at the cap —, an I/O error); the error names the file.
    #[error(transparent)]
    File(#[from] model::fsio::FileError),
    /// The file is not UTF-8 text.
    #[error("{}: the config is not UTF-8 text", .path.display())]
    NotText { path: PathBuf },
    /// A field is missing, unknown, of the wrong type, or has a value the schema or the KV manager
    /// refuses.
    #[error("{}{}: field `{field}`: {problem}; expected {expected}", .path.display(), location(*.line, *.column))]
    Field {
        /// The config file (`<string>` for text not read from a file).
        path: PathBuf,
        /// Dotted field path, e.g. `model.heads` or `graph.ar[1]`.
        field: String,
        /// What is wrong.
        problem: String,
        /// What the schema expects there.
        expected: String,
        /// 1-based line of the offending text, when known.
        line: Option<u32>,
        /// 1-based column of the offending text, when known.
        column: Option<u32>,
    },
    /// A GGUF file or Hugging Face folder whose description cannot be read. The path is said
    /// here only when the cause does not say it already (a GGUF error names its file).
    #[error("{}cannot read the model's description", unnamed_path(path, source))]
    Model {
        path: PathBuf,
        #[source]
        source: model::Error,
    },
}

fn location(line: Option<u32>, column: Option<u32>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// `PATH: ` when `source`'s message does not name `path`, else nothing: the file is named once.
fn unnamed_path(path: &Path, source: &model::Error) -> String {
    let shown = path.display().to_string();
    if source.to_string().contains(&shown) {
        String::new()
    } else {
        format!("{shown}: ")
    }
}

impl ConfigError {
    /// The dotted path of the offending field, if the error is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Field { field, .. } => Some(field),
            ConfigError::File(_) | ConfigError::NotText { .. } | ConfigError::Model { .. } => None,
        }
    }

    fn field_error(
        path: &Path,
        field: impl Into<String>,
        problem: impl Into<String>,
        expected: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Field {
            path: path.to_path_buf(),
            field: field.into(),
            problem: problem.into(),
            expected: expected.into(),
            line: None,
            column: None,
        }
    }
}

/// A model config: the model, its static graphs and its KV cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub graph: GraphConfig,
    pub kv: KvConfig,
    /// The file the config was loaded from (`<string>` otherwise); named in every error.
    #[serde(skip)]
    pub origin: PathBuf,
}

/// `model:` the transformer's attention geometry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    pub layers: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (== heads for MHA, fewer for GQA/MQA).
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size (informational; checked against heads x head_dim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// The attention window of the sliding layers, if the model has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// With `sliding_window`: every N-th layer is global, the others slide (none: all slide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_every: Option<usize>,
}

/// A model's per-layer windows as the pattern [`ModelConfig`] plans: `(None, None)` without
/// windows, `(Some(W), None)` when every layer slides by `W`, `(Some(W), Some(N))` when every
/// `N`-th layer is global and the others slide by `W` (Gemma 3: 512 and 6); `None` for windows of
/// another shape.
pub fn window_pattern(windows: &[Option<usize>]) -> Option<(Option<usize>, Option<usize>)> {
    let Some(w) = windows.iter().flatten().copied().next() else {
        return Some((None, None));
    };
    let n = windows.iter().position(Option::is_none).map(|i| i + 1);
    let fits = |l: usize, got: &Option<usize>| match n {
        Some(n) if (l + 1).is_multiple_of(n) => got.is_none(),
        _ => *got == Some(w),
    };
    windows
        .iter()
        .enumerate()
        .all(|(l, got)| fits(l, got))
        .then_some((Some(w), n))
}

impl ModelConfig {
    /// The per-layer windows of a graph of context `context` whose largest AR variant is
    /// `max_ar` (empty when no layer slides within that context; see the module docs).
    pub fn layer_windows(&self, context: usize, max_ar: usize) -> Vec<Option<usize>> {
        let Some(w) = self
            .sliding_window
            .filter(|&w| w <= (context + 1).saturating_sub(max_ar))
        else {
            return Vec::new();
        };
        (0..self.layers)
            .map(|l| match self.global_every {
                Some(n) if (l + 1).is_multiple_of(n) => None,
                _ => Some(w),
            })
            .collect()
    }
}

/// `graph:` the static graphs sharing the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphConfig {
    /// Context length S.
    pub context: usize,
    /// AR variants (tokens per step), e.g. `[1, 128]`.
    pub ar: Vec<usize>,
}

/// `kv:` how the cache is stored and updated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvConfig {
    /// Element type of the K/V tensors.
    #[serde(with = "kv_dtype_serde")]
    pub dtype: DataType,
    #[serde(default)]
    pub k_layout: KLayout,
    #[serde(default)]
    pub tensors: Granularity,
    /// The strategy, by name (`shift` means 2x unstaggered here; its options are `reserve` and
    /// `stagger`, see [`Config::strategy`]).
    pub update: Strategy,
    #[serde(default)]
    pub reserve: ReserveConfig,
    #[serde(default)]
    pub stagger: bool,
    /// Static cross-attention K/V of an encoder-decoder model (`kv_manager::CrossSpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross: Option<CrossConfig>,
}

/// `kv.cross:` static cross-attention K/V buffers, one per (layer, kv-head, K|V), grouped like the
/// self-attention tensors (`kv.tensors`), in the same region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrossConfig {
    /// E: rows per buffer (the encoder's output length).
    pub rows: usize,
    /// Element type of the static K/V (may differ from `kv.dtype`).
    #[serde(with = "kv_dtype_serde")]
    pub dtype: DataType,
}

/// Parses a K/V element type: a [`DataType`] that stores real values (any but `i32`), by its
/// lowercase name (`u8`, `u16`, `i8`, `i16`, `f16`, `f32`).
pub fn parse_kv_dtype(name: &str) -> Result<DataType, String> {
    DataType::REAL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| format!("unknown variant `{name}`; expected {EXPECT_DTYPE}"))
}

/// Serde for `kv.dtype`: the lowercase name, checked by [`parse_kv_dtype`].
mod kv_dtype_serde {
    use quant::DataType;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(d: &DataType, s: S) -> Result<S::Ok, S::Error> {
        d.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DataType, D::Error> {
        let name = String::deserialize(d)?;
        super::parse_kv_dtype(&name).map_err(serde::de::Error::custom)
    }
}

/// `kv.reserve`: the `shift` reservation.
///
/// - `Fx` (e.g. `2x`, `1.5x`, F >= 1): [`Reserve::Factor`]; with W = S - min(ar) the buffer has
///   R = W + floor((F - 1) x W) rows (`2x` = 2W: never rebases within a context; `1.5x` for S = 2048,
///   `ar: [1]` is 2047 + floor(0.5 x 2047) = 2047 + 1023 = 3070 rows);
/// - a bare integer N: [`Reserve::Rows`], exactly N rows;
/// - `+K`: [`Reserve::Spare`], W + K rows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ReserveRepr", into = "String")]
pub struct ReserveConfig(pub Reserve);

impl Default for ReserveConfig {
    fn default() -> Self {
        ReserveConfig(Reserve::Factor(2.0))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ReserveRepr {
    Rows(u64),
    Text(String),
}

impl TryFrom<ReserveRepr> for ReserveConfig {
    type Error = String;
    fn try_from(r: ReserveRepr) -> Result<Self, String> {
        match r {
            ReserveRepr::Rows(n) => usize::try_from(n)
                .map(|n| ReserveConfig(Reserve::Rows(n)))
                .map_err(|_| format!("{n} rows is too large")),
            ReserveRepr::Text(s) => s.parse(),
        }
    }
}

/// [`Reserve`]'s own spelling (`Reserve`'s `FromStr`, the one parser of reservations).
impl FromStr for ReserveConfig {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(ReserveConfig)
    }
}

impl fmt::Display for ReserveConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.spelling())
    }
}

impl From<ReserveConfig> for String {
    fn from(r: ReserveConfig) -> String {
        r.to_string()
    }
}

/// Largest vocabulary a config may declare: 2^24, 64x the largest vocabularies in use (about 256K).
pub const MAX_VOCAB: usize = 1 << 24;

const EXPECT_DTYPE: &str = "one of u8, u16, i8, i16, f16, f32";
const EXPECT_RESERVE: &str = Reserve::EXPECTED;
const EXPECT_POSITIVE: &str = "a positive integer";

/// What the schema expects at a field path (for error messages).
fn expected_at(field: &str) -> String {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    let top = field.split(['.', '[']).next().unwrap_or(field);
    match (top, leaf) {
        ("", _) | (".", _) => "a mapping with the sections model, graph and kv".into(),
        ("model", "model") => {
            "a mapping with name, layers, heads, kv_heads, head_dim, vocab (dim, sliding_window, global_every optional)"
                .into()
        }
        ("graph", "graph") => "a mapping with context and ar, e.g. { context: 2048, ar: [1] }".into(),
        ("kv", "kv") => {
            "a mapping with dtype and update (k_layout, tensors, reserve, stagger, cross optional)"
                .into()
        }
        ("model", "name") => "a string".into(),
        ("graph", "context") => "a positive integer, the context length S".into(),
        ("graph", "ar") if !field.ends_with(']') => {
            "a list of AR variants (tokens per step), e.g. [1, 128]".into()
        }
        ("kv", "dtype") => EXPECT_DTYPE.into(),
        ("kv", "k_layout") => "rows or transposed".into(),
        ("kv", "tensors") => "per_head or per_layer".into(),
        ("kv", "update") => format!("one of {}", Strategy::NAMES.join(", ")),
        ("kv", "reserve") => EXPECT_RESERVE.into(),
        ("kv", "stagger") => "true or false".into(),
        ("kv", "cross") => "a mapping { rows, dtype }: the static cross-attention K/V".into(),
        _ => EXPECT_POSITIVE.into(),
    }
}

/// Splits a message that already says what was expected (serde's `unknown field`/`unknown variant`
/// lists, this module's own `...; expected ...` texts) so that the expectation is printed once.
fn split_expected(message: &str) -> Option<(&str, &str)> {
    message.split_once("; expected ").or_else(|| {
        (message.starts_with("unknown field") || message.starts_with("unknown variant"))
            .then(|| message.split_once(", expected "))
            .flatten()
    })
}

/// Turns a parse error into a [`ConfigError::Field`] naming the field path (`at`, as tracked while
/// deserializing; `None` when the YAML itself could not be parsed).
fn parse_error(path: &Path, at: Option<String>, err: &serde_saphyr::Error) -> ConfigError {
    let at = at.unwrap_or_default();
    let message =
        serde_saphyr::MessageFormatter::format_message(&serde_saphyr::UserMessageFormatter, err)
            .into_owned();
    let (line, column) = err.location().map_or((None, None), |l| {
        (Some(l.line() as u32), Some(l.column() as u32))
    });
    let join = |parent: &str, child: &str| {
        if parent.is_empty() || parent == "." {
            child.to_string()
        } else {
            format!("{parent}.{child}")
        }
    };
    // `missing field `x`` is reported at the parent mapping: name the missing field itself.
    let (field, problem, expected) = if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or(rest);
        let field = join(&at, name);
        let expected = expected_at(&field);
        (field, "missing".to_string(), expected)
    } else if let Some((problem, expected)) = split_expected(&message) {
        (at.clone(), problem.to_string(), expected.to_string())
    } else {
        let expected = expected_at(&at);
        (at, message, expected)
    };
    ConfigError::Field {
        path: path.to_path_buf(),
        field: if field.is_empty() || field == "." {
            "(document)".into()
        } else {
            field
        },
        problem,
        expected,
        line,
        column,
    }
}

/// The AR variant a prefill steps on when none is asked for.
pub const DEFAULT_PREFILL_AR: usize = 32;

/// The AR variants used when none are asked for (`generate`, `chat`, `compile`, `budget` and
/// `plan` of a model file): `[1, 32]`, or `[1]` when the context is too short to hold an AR-32
/// step beside an AR-1 one (below 33 tokens).
pub fn default_ar(context: usize) -> Vec<usize> {
    if context > DEFAULT_PREFILL_AR {
        vec![1, DEFAULT_PREFILL_AR]
    } else {
        vec![1]
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let bytes = model::fsio::read_capped(path, model::fsio::FileKind::CONFIG)?;
        let text = String::from_utf8(bytes).map_err(|_| ConfigError::NotText {
            path: path.to_path_buf(),
        })?;
        Config::from_yaml(&text, path)
    }

    /// A config for `path`: for a GGUF file or a Hugging Face folder (`config.json`), the model's
    /// own geometry ([`model::describe`]) with these defaults — context: the model's context
    /// length; AR variants [`default_ar`] of it; KV: `u16`, rows,
    /// per head, `shift` 2x, no stagger. Anything else is read as YAML ([`Config::load`]).
    pub fn load_any(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        if model::format_of(path).is_err() {
            return Config::load(path);
        }
        let c = model::describe(path).map_err(|source| ConfigError::Model {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        let context = c.context_length;
        let (sliding_window, global_every) =
            window_pattern(&c.layer_windows).ok_or_else(|| ConfigError::Field {
                path: path.to_path_buf(),
                field: "model.sliding_window".into(),
                problem: format!("the model's layer windows {:?}", c.layer_windows),
                expected: "one window with every N-th layer global (the shapes budgets plan)"
                    .into(),
                line: None,
                column: None,
            })?;
        let config = Config {
            model: ModelConfig {
                name,
                layers: c.n_layers,
                heads: c.n_heads,
                kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                vocab: c.vocab_size,
                dim: None,
                sliding_window,
                global_every,
            },
            graph: GraphConfig {
                context,
                ar: default_ar(context),
            },
            kv: KvConfig {
                dtype: DataType::U16,
                k_layout: KLayout::default(),
                tensors: Granularity::default(),
                update: Strategy::SHIFT_2X,
                reserve: ReserveConfig::default(),
                stagger: false,
                cross: None,
            },
            origin: path.to_path_buf(),
        };
        config.validate()?;
        Ok(config)
    }

    /// True when this config was made from a model file ([`Config::load_any`]) rather than read
    /// from YAML: its AR variants are then the default for its context ([`default_ar`]).
    pub fn from_model(&self) -> bool {
        model::format_of(&self.origin).is_ok()
    }

    /// Parses and validates YAML text; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let mut at = None;
        let mut config: Config = serde_saphyr::with_deserializer_from_str(text, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                at = Some(e.path().to_string());
                e.into_inner()
            })
        })
        .map_err(|e| parse_error(origin, at.take(), &e))?;
        config.origin = origin.to_path_buf();
        config.validate()?;
        Ok(config)
    }

    /// Checks the values: every count >= 1, `heads` a multiple of `kv_heads`, `dim` (if given) equal to
    /// `heads x head_dim`, a context larger than every AR variant, then the KV manager's own checks of
    /// the geometry and of the configured strategy (e.g. a `shift` reserve too small for the largest
    /// step). Call again after changing fields (command-line overrides).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let path = self.origin.as_path();
        let err = |field: &str, problem: String, expected: String| {
            Err(ConfigError::field_error(path, field, problem, expected))
        };
        let m = &self.model;
        if m.name.trim().is_empty() {
            return err("model.name", "is empty".into(), "a model name".into());
        }
        if !Strategy::ALL.contains(&self.kv.update) {
            return err(
                "kv.update",
                format!("`{}` names shift's options", self.kv.update),
                format!(
                    "one of {}, with shift's options in kv.reserve and kv.stagger",
                    Strategy::NAMES.join(", ")
                ),
            );
        }
        for (field, value, max) in [
            ("model.layers", m.layers, MAX_LAYERS),
            ("model.heads", m.heads, MAX_HEADS),
            ("model.kv_heads", m.kv_heads, MAX_HEADS),
            ("model.head_dim", m.head_dim, MAX_HEAD_DIM),
            ("model.vocab", m.vocab, MAX_VOCAB),
            (
                "model.sliding_window",
                m.sliding_window.unwrap_or(1),
                MAX_CONTEXT,
            ),
            (
                "model.global_every",
                m.global_every.unwrap_or(1),
                MAX_LAYERS,
            ),
            ("graph.context", self.graph.context, MAX_CONTEXT),
        ] {
            if value == 0 {
                return err(field, "is 0".into(), EXPECT_POSITIVE.into());
            }
            if value > max {
                return err(
                    field,
                    format!("{value} is above the limit"),
                    format!("{EXPECT_POSITIVE} up to {max}"),
                );
            }
        }
        if !m.heads.is_multiple_of(m.kv_heads) {
            return err(
                "model.kv_heads",
                format!(
                    "{} heads are not a multiple of {} kv heads",
                    m.heads, m.kv_heads
                ),
                "a divisor of model.heads (heads = kv_heads x queries per kv head)".into(),
            );
        }
        if let Some(dim) = m.dim
            && dim != m.heads * m.head_dim
        {
            return err(
                "model.head_dim",
                format!(
                    "head_dim mismatch: dim {dim} != heads {} x head_dim {} = {}",
                    m.heads,
                    m.head_dim,
                    m.heads * m.head_dim
                ),
                format!(
                    "head_dim = dim / heads{}",
                    if dim.is_multiple_of(m.heads) {
                        format!(" = {}", dim / m.heads)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        let g = &self.graph;
        if g.ar.is_empty() {
            return err("graph.ar", "is empty".into(), expected_at("graph.ar"));
        }
        for (i, &n) in g.ar.iter().enumerate() {
            if n == 0 {
                return err(
                    &format!("graph.ar[{i}]"),
                    "is 0".into(),
                    EXPECT_POSITIVE.into(),
                );
            }
            if n >= MAX_CONTEXT {
                return err(
                    &format!("graph.ar[{i}]"),
                    format!("{n} is above the limit"),
                    format!(
                        "a positive integer smaller than graph.context (at most {})",
                        MAX_CONTEXT - 1
                    ),
                );
            }
            if n >= g.context {
                return err(
                    "graph.context",
                    format!(
                        "context {} is not larger than the AR-{n} variant (graph.ar[{i}])",
                        g.context
                    ),
                    format!(
                        "a context larger than every AR variant (at least {})",
                        n + 1
                    ),
                );
            }
        }
        let geometry = self.geometry();
        geometry.validate().map_err(|e| self.kv_error(e))?;
        // The reservation is checked whatever the update: `budget` reports `shift` for every config.
        self.kv
            .reserve
            .0
            .rows(&geometry)
            .map_err(|e| self.kv_error(e))?;
        self.cache_spec()
            .region_bytes()
            .map_err(|e| self.kv_error(e))?;
        Ok(())
    }

    /// Maps a KV manager refusal to the config field it is about.
    pub fn kv_error(&self, e: KvError) -> ConfigError {
        let path = self.origin.as_path();
        match &e {
            KvError::InvalidGeometry { field, reason } => {
                let field = match *field {
                    "layers" | "kv_heads" | "head_dim" => format!("model.{field}"),
                    "context" => "graph.context".into(),
                    "ar" => "graph.ar".into(),
                    "windows" => "model.sliding_window".into(),
                    other => other.to_string(),
                };
                let expected = expected_at(&field);
                ConfigError::field_error(path, field, reason.clone(), expected)
            }
            KvError::ReserveTooSmall { minimum, .. } => ConfigError::field_error(
                path,
                "kv.reserve",
                e.to_string(),
                format!("a reservation of at least {minimum} rows"),
            ),
            KvError::UnsupportedCombination { .. } => ConfigError::field_error(
                path,
                "kv.update",
                e.to_string(),
                format!(
                    "an update strategy that serves tensors: {} and k_layout: {} (smart_mask or naive)",
                    self.kv.tensors.name(),
                    self.kv.k_layout.name()
                ),
            ),
            KvError::InvalidCross { reason } => ConfigError::field_error(
                path,
                "kv.cross",
                reason.clone(),
                "{ rows: E, dtype: u8 } with 1 <= E <= 16777216",
            ),
            KvError::ReserveTooLarge { .. } => ConfigError::field_error(
                path,
                "kv.reserve",
                e.to_string(),
                "a smaller reservation, e.g. 2x (twice the largest window) or +K",
            ),
            KvError::SizeOverflow { .. } => ConfigError::field_error(
                path,
                "kv.update",
                format!("update {}: {e}", self.kv.update.name()),
                "a smaller cache: its size must fit this machine's addresses",
            ),
            _ => ConfigError::field_error(
                path,
                "kv",
                e.to_string(),
                "a cache the KV manager can build",
            ),
        }
    }

    /// The KV manager geometry of this config.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            layers: self.model.layers,
            kv_heads: self.model.kv_heads,
            head_dim: self.model.head_dim,
            context: self.graph.context,
            ar_variants: self.graph.ar.clone(),
            dtype: self.kv.dtype,
            k_layout: self.kv.k_layout,
            granularity: self.kv.tensors,
            windows: self.model.layer_windows(
                self.graph.context,
                self.graph.ar.iter().copied().max().unwrap_or(1),
            ),
        }
    }

    /// The configured strategy (`kv.update`, with `kv.reserve` and `kv.stagger` for `shift`).
    pub fn strategy(&self) -> Strategy {
        self.strategy_for(self.kv.update)
    }

    /// The strategy `update` names, with this config's `shift` parameters (`kv.reserve`,
    /// `kv.stagger`) when it is `shift`.
    pub fn strategy_for(&self, update: Strategy) -> Strategy {
        update.with_shift_options(self.kv.reserve.0, self.kv.stagger)
    }

    /// A cache spec for the configured strategy, with simulation encodings
    /// ([`CacheSpec::for_simulation`]); the runtime takes real encodings from the model's graphs.
    pub fn cache_spec(&self) -> CacheSpec {
        self.cache_spec_for(self.kv.update)
    }

    /// A simulation cache spec for the strategy `update` names ([`Config::strategy_for`]).
    pub fn cache_spec_for(&self, update: Strategy) -> CacheSpec {
        let mut spec = CacheSpec::for_simulation(self.geometry(), self.strategy_for(update));
        if let Some(cross) = &self.kv.cross {
            let g = &spec.geometry;
            let encoding = CacheSpec::for_simulation(
                kv_manager::Geometry {
                    dtype: cross.dtype,
                    ..g.clone()
                },
                spec.strategy,
            )
            .encodings
            .first()
            .cloned();
            spec.cross =
                encoding.map(|e| kv_manager::CrossSpec::uniform(g, cross.rows, g.granularity, e));
        }
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model's windows become the planned pattern, and windows of another shape are named.
    #[test]
    fn model_windows_become_the_planned_pattern() {
        let gemma: Vec<Option<usize>> =
            (0..12).map(|l| ((l + 1) % 6 != 0).then_some(512)).collect();
        assert_eq!(window_pattern(&gemma), Some((Some(512), Some(6))));
        assert_eq!(window_pattern(&[Some(8); 4]), Some((Some(8), None)));
        assert_eq!(window_pattern(&[]), Some((None, None)));
        assert_eq!(window_pattern(&[None, None]), Some((None, None)));
        assert_eq!(window_pattern(&[Some(8), Some(16)]), None);
        assert_eq!(window_pattern(&[Some(8), None, None]), None);
    }

    const SEED: &str = "model: { name: llama-2-7b, layers: 32, heads: 32, kv_heads: 32, head_dim: 128, vocab: 32000 }
graph: { context: 2048, ar: [1] }
kv: { dtype: u16, k_layout: rows, tensors: per_head, update: shift, reserve: 2x }
";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(text, Path::new("test.yaml"))
    }

    #[test]
    fn seed_parses_to_the_seed_geometry() {
        let c = parse(SEED).unwrap();
        let g = c.geometry();
        assert_eq!(
            g,
            Geometry::new(32, 32, 128, 2048, &[1], DataType::U16),
            "{c:?}"
        );
        assert_eq!(c.strategy(), Strategy::SHIFT_2X);
        assert_eq!(c.cache_spec().region_bytes().unwrap(), 2_146_435_072);
    }

    #[test]
    fn reserve_forms() {
        for (text, reserve) in [
            ("2x", Reserve::Factor(2.0)),
            ("1.5x", Reserve::Factor(1.5)),
            ("3070", Reserve::Rows(3070)),
            ("+64", Reserve::Spare(64)),
        ] {
            let c = parse(&SEED.replace("reserve: 2x", &format!("reserve: \"{text}\""))).unwrap();
            assert_eq!(c.kv.reserve.0, reserve, "{text}");
            assert_eq!(text.parse::<ReserveConfig>().unwrap().to_string(), text);
        }
        // A bare YAML integer is a row count too.
        let c = parse(&SEED.replace("reserve: 2x", "reserve: 3070, stagger: true")).unwrap();
        assert_eq!(c.kv.reserve.0, Reserve::Rows(3070));
        assert!(c.kv.stagger);
        for bad in ["0.5x", "x", "+", "2y", "-3"] {
            assert!(bad.parse::<ReserveConfig>().is_err(), "{bad}");
        }
        let e = parse(&SEED.replace("reserve: 2x", "reserve: 2y")).unwrap_err();
        assert_eq!(e.field(), Some("kv.reserve"), "{e}");
    }

    #[test]
    fn errors_name_file_field_and_expectation() {
        let e = parse(&SEED.replace("heads: 32, kv_heads", "kv_heads")).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.field(), Some("model.heads"), "{msg}");
        assert!(msg.starts_with("test.yaml"), "{msg}");
        assert!(
            msg.contains("missing") && msg.contains("positive integer"),
            "{msg}"
        );

        let e = parse(&SEED.replace("layers: 32", "layers: many")).unwrap_err();
        assert_eq!(e.field(), Some("model.layers"), "{e}");
        assert!(e.to_string().contains("test.yaml:1:"), "{e}");

        let e = parse(&SEED.replace("vocab: 32000", "vocab: 32000, colour: red")).unwrap_err();
        assert_eq!(e.field(), Some("model.colour"), "{e}");
        assert!(e.to_string().contains("head_dim"), "{e}");

        let e = parse(&SEED.replace("update: shift", "update: rotate")).unwrap_err();
        assert_eq!(e.field(), Some("kv.update"), "{e}");
        assert!(e.to_string().contains("smart_mask"), "{e}");

        let e = parse(&SEED.replace("ar: [1]", "ar: [1, x]")).unwrap_err();
        assert_eq!(e.field(), Some("graph.ar[1]"), "{e}");
    }

    #[test]
    fn semantic_errors() {
        let cases = [
            (
                SEED.replace("heads: 32, kv", "heads: 0, kv"),
                "model.heads",
                "is 0",
            ),
            (
                SEED.replace("kv_heads: 32", "kv_heads: 0"),
                "model.kv_heads",
                "is 0",
            ),
            (
                SEED.replace("kv_heads: 32", "kv_heads: 5"),
                "model.kv_heads",
                "multiple",
            ),
            (
                SEED.replace("vocab: 32000", "vocab: 32000, dim: 4000"),
                "model.head_dim",
                "head_dim mismatch",
            ),
            (
                SEED.replace("ar: [1]", "ar: [1, 4096]"),
                "graph.context",
                "AR-4096",
            ),
            (SEED.replace("ar: [1]", "ar: [1, 1]"), "graph.ar", "twice"),
            (
                SEED.replace("reserve: 2x", "reserve: 100"),
                "kv.reserve",
                "too small",
            ),
            (
                SEED.replace("tensors: per_head", "tensors: per_layer"),
                "kv.update",
                "per_head",
            ),
        ];
        for (text, field, needle) in cases {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }
        // `kv.update` is a name: shift's options are kv.reserve and kv.stagger.
        let e = parse(&SEED.replace("update: shift", "update: shift-1.5x")).unwrap_err();
        assert_eq!(e.field(), Some("kv.update"), "{e}");
        assert!(e.to_string().contains("kv.reserve"), "{e}");
        // dim that agrees is fine, and per_layer works with a slot strategy.
        parse(&SEED.replace("vocab: 32000", "vocab: 32000, dim: 4096")).unwrap();
        parse(
            &SEED
                .replace("tensors: per_head", "tensors: per_layer")
                .replace("update: shift", "update: smart_mask"),
        )
        .unwrap();
    }

    /// Each error says what is wrong once and what was expected once (serde's own "expected" lists
    /// used to be printed twice).
    #[test]
    fn errors_print_the_cause_and_the_expectation_once() {
        let cases = [
            (
                SEED.replace("update: shift", "update: rotate"),
                "test.yaml:3:62: field `kv.update`: unknown variant `rotate`; \
                 expected one of shift, conveyor, smart_mask, naive",
            ),
            (
                SEED.replace("dtype: u16", "dtype: u17"),
                "test.yaml:3:14: field `kv.dtype`: unknown variant `u17`; \
                 expected one of u8, u16, i8, i16, f16, f32",
            ),
            (
                SEED.replace("k_layout: rows", "k_layout: cols"),
                "test.yaml:3:29: field `kv.k_layout`: unknown variant `cols`; \
                 expected one of rows, transposed",
            ),
            (
                SEED.replace("reserve: 2x", "reserve: 2y"),
                "test.yaml:3:78: field `kv.reserve`: invalid reserve `2y`; expected `2x`, `1.5x` \
                 (a factor >= 1 followed by x), a row count such as 3070, or `+K` spare rows",
            ),
            (
                SEED.replace("layers: 32", "layers: 1099511627776"),
                "test.yaml: field `model.layers`: 1099511627776 is above the limit; \
                 expected a positive integer up to 4096",
            ),
            (
                SEED.replace("vocab: 32000", "vocab: 16777217"),
                "test.yaml: field `model.vocab`: 16777217 is above the limit; \
                 expected a positive integer up to 16777216",
            ),
            (
                SEED.replace("ar: [1]", "ar: [18446744073709551615]"),
                "test.yaml: field `graph.ar[0]`: 18446744073709551615 is above the limit; \
                 expected a positive integer smaller than graph.context (at most 16777215)",
            ),
            (
                SEED.replace("kv_heads: 32", "kv_heads: 4096")
                    .replace("heads: 32", "heads: 4096")
                    .replace("layers: 32", "layers: 64"),
                "test.yaml: field `model.kv_heads`: gives 2 x layers x kv_heads = 524288 K/V \
                 buffers, above the limit of 262144; expected a positive integer",
            ),
        ];
        let (found, expected): (Vec<String>, Vec<&str>) = cases
            .iter()
            .map(|(text, message)| (parse(text).unwrap_err().to_string(), *message))
            .unzip();
        assert_eq!(found, expected);
    }
}
