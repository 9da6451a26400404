//! The high-level entry point: find a model, compile it on first use (cached), load it on a backend
//! and serve generations. The CLI's `generate` and the JNI bridge both use it.

use crate::backend::Backend;
use crate::reference::ReferenceBackend;
use crate::sampler::SamplerError;
use crate::session::{
    GenerateOptions, Generation, Session, SessionError, SessionStats, TextCodec, check_text_fits,
    max_text_bytes,
};
use crate::text::{ChatFormat, HfCodec};
use kv_manager::{HostAllocator, RegionAllocator, Strategy};
use model::fsio::{FileKind, read_capped};
use model::llama2c::{Checkpoint, ModelFiles, Tokenizer};
use model::{LlamaConfig, Message, WeightSource};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod layer_windows;
mod spec;
pub mod speculator;
pub use layer_windows::{LayerWindows, apply_layer_windows};
pub use spec::EngineSpec;

/// Which backend runs the graphs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    /// The reference executor, in this process.
    Reference,
    /// A QNN backend library loaded at run time (`libQnnHtp.so` on a device; the reference backend's
    /// QNN library on a desktop) and its system library (for the binary's tensor descriptions).
    Qnn {
        backend_lib: PathBuf,
        system_lib: Option<PathBuf>,
        /// How K/V memory is passed ([`crate::qnn_memory`]).
        memory: crate::qnn_memory::QnnMemory,
        /// Cap on live memory handles (least recently used ones are deregistered).
        max_handles: usize,
    },
}

/// How to open an [`Engine`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// The model: a llama2.c directory, a GGUF file or a Hugging Face folder (`config.json`,
    /// safetensors, `tokenizer.json`); `None` searches `$HTPKV_MODEL_DIR`,
    /// `./models/stories260K`, `../shared/models/stories260K`.
    pub model_dir: Option<PathBuf>,
    /// A compiled model file to load instead of compiling (the tokenizer still comes from the model
    /// directory).
    pub compiled: Option<PathBuf>,
    pub backend: BackendChoice,
    pub strategy: Strategy,
    /// KV cache element type: u8, u16, f16 or f32.
    pub kv_dtype: DataType,
    /// Weights: "i8", "i4", "i8f16", "f16" or "f32" ([`ref_backend::WeightType`]).
    pub weights: String,
    /// Context length S; `None` uses the model's context length, at most [`DEFAULT_MAX_CONTEXT`].
    pub context: Option<usize>,
    /// AR variants of the compiled graphs (prefill and decode).
    pub ar: Vec<usize>,
    /// Whether compiling adds, beside each AR-n graph (n > 1), a prefill graph returning only
    /// the last row's logits ([`ref_backend::CompileOptions::last_row`]), which plain prefill
    /// runs; `false` compiles all-row graphs only (`--all-row-prefill`). Only when compiling.
    pub last_row: bool,
    /// Where compiled models are cached; `None` uses `$HTPKV_CACHE_DIR`, `$XDG_CACHE_HOME/htpkv`,
    /// `$HOME/.cache/htpkv`, then `./.htpkv-cache`.
    pub cache_dir: Option<PathBuf>,
    /// Per-layer attention windows to set on a model that has none (`--layer-window`; see
    /// [`apply_layer_windows`]); only when compiling (a compiled file has its own).
    pub layer_windows: Vec<LayerWindows>,
    /// A chat template (Jinja, as Hugging Face's `chat_template`) used instead of the model's
    /// own or its absence (`--chat-template FILE`).
    pub chat_template: Option<PathBuf>,
    /// A llama2.c model's tokenizer file, when not the one beside its checkpoint
    /// ([`OpenedModel::open`]).
    pub tokenizer: Option<PathBuf>,
}

impl Default for EngineOptions {
    /// The reference backend, model discovery, `conveyor`, u16 KV with
    /// [`WeightType::DEFAULT`] weights, the model's context, AR [1, 32].
    fn default() -> Self {
        EngineOptions {
            model_dir: None,
            compiled: None,
            backend: BackendChoice::Reference,
            strategy: Strategy::Conveyor,
            kv_dtype: DataType::U16,
            weights: WeightType::DEFAULT.name().into(),
            context: None,
            ar: crate::config::default_ar(usize::MAX),
            last_row: true,
            cache_dir: None,
            layer_windows: Vec::new(),
            chat_template: None,
            tokenizer: None,
        }
    }
}

impl EngineOptions {
    /// The update strategy used when none is asked for: `conveyor` on the reference backend (no
    /// copies, and a region of about one context per buffer, half of `shift` 2x's), `smart_mask`
    /// through QNN, where every distinct window offset of a sliding strategy is a new memory handle
    /// (see the handle budget in docs/design/qnn-memory.md), except for a model with sliding-window
    /// layers (`windowed`, Gemma 3), whose left-padded windows `smart_mask` cannot serve: `shift`
    /// there.
    pub fn default_strategy(backend: &BackendChoice, windowed: bool) -> Strategy {
        match backend {
            BackendChoice::Qnn { .. } if !windowed => Strategy::SmartMask,
            BackendChoice::Qnn { .. } => Strategy::SHIFT_2X,
            _ => Strategy::Conveyor,
        }
    }

    /// Whether the model at `model` (a GGUF file or a Hugging Face folder) has sliding-window
    /// layers, from its description alone; `false` for anything else or an unreadable file (whose
    /// error comes when it is opened).
    pub fn model_is_windowed(model: Option<&Path>) -> bool {
        let Some(path) = model.filter(|p| model::format_of(p).is_ok()) else {
            return false;
        };
        model::describe(path).is_ok_and(|c| c.layer_windows.iter().any(Option::is_some))
    }

    /// Parses an update strategy: [`Strategy`]'s spelling, the one parser of strategy names
    /// (`shift` (2x), `conveyor`, `smart_mask`, `naive`, and `shift-1.5x`, `shift-+64`,
    /// `shift-1.5x-staggered`, ...).
    pub fn parse_strategy(name: &str) -> Result<Strategy, EngineError> {
        name.parse().map_err(EngineError::BadOption)
    }
}

/// Errors of the engine, each with a stable [`EngineError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] model::llama2c::ModelError),
    /// A GGUF file or Hugging Face folder that cannot be used (the message names it).
    #[error(transparent)]
    ModelFile(#[from] model::Error),
    #[error("compiling the model")]
    Compile(#[from] ref_backend::CompileError),
    /// The compiled model file cannot be used (its message names the file).
    #[error(transparent)]
    Format(#[from] ref_backend::FormatError),
    /// A compiled model file was compiled from another checkpoint than the one in use.
    #[error(
        "{} was compiled from a checkpoint with sha256 {compiled_from}, but {} has sha256 {checkpoint_sha256}; recompile it or use the model it was made from",
        compiled.display(),
        checkpoint.display()
    )]
    CheckpointMismatch {
        compiled: PathBuf,
        compiled_from: String,
        checkpoint: PathBuf,
        checkpoint_sha256: String,
    },
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Speculate(#[from] crate::speculate::SpeculateError),
    #[error("{0}")]
    BadOption(String),
    /// A `--model` file that is neither a GGUF file nor a llama2.c checkpoint (the source says
    /// what its checkpoint header holds).
    #[error("{} is neither a GGUF file, a folder with a config.json nor a usable llama2.c checkpoint", path.display())]
    NotAModel {
        path: PathBuf,
        #[source]
        source: model::llama2c::ModelError,
    },
    /// An I/O failure: the message says what was done to which file, the I/O error is the source.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// A file that could not be read or written (it names the file; see `model::fsio`).
    #[error(transparent)]
    File(#[from] model::fsio::FileError),
    /// The QNN backend could not open the compiled model's context binary.
    #[error(transparent)]
    Qnn(#[from] crate::qnn::QnnOpenError),
    #[error("budget: {0}")]
    Budget(String),
}

impl From<SamplerError> for EngineError {
    fn from(e: SamplerError) -> Self {
        EngineError::Session(SessionError::Sampler(e))
    }
}

impl EngineError {
    /// A short, stable name of the error's kind (`model_not_found`, `bad_model`, `compile`,
    /// `bad_option`, `context_full`, `kv`, `backend`, `io`, `qnn`, `budget`). A wrapped error
    /// names its own kind.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Model(e) => e.kind(),
            EngineError::ModelFile(e) => e.kind(),
            EngineError::Compile(e) => e.kind(),
            EngineError::Format(e) => e.kind(),
            EngineError::CheckpointMismatch { .. } => "bad_model",
            EngineError::Session(e) => e.kind(),
            EngineError::Speculate(e) => e.kind(),
            EngineError::BadOption(_) => "bad_option",
            EngineError::NotAModel { source, .. } => source.kind(),
            EngineError::Io { .. } | EngineError::File(_) => "io",
            EngineError::Qnn(e) => e.kind(),
            EngineError::Budget(_) => "budget",
        }
    }
}

/// Where compiled models are cached.
pub fn default_cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("HTPKV_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("htpkv")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("htpkv")))
        .unwrap_or_else(|| PathBuf::from(".htpkv-cache"))
}

/// The longest context the engine compiles for when none is asked for (the model's own context
/// length when shorter): a longer one costs K/V memory most runs never use.
pub const DEFAULT_MAX_CONTEXT: usize = 2048;

/// The compile options an [`EngineOptions`] asks for, for a model described by `config`.
pub fn compile_options(
    options: &EngineOptions,
    config: &LlamaConfig,
) -> Result<CompileOptions, EngineError> {
    let context = options
        .context
        .unwrap_or(config.context_length.min(DEFAULT_MAX_CONTEXT));
    check_geometry(config, context, &options.ar, options.kv_dtype)?;
    let mut opts = CompileOptions::new(context, options.ar.clone());
    opts.last_row = options.last_row;
    opts.kv_dtype = options.kv_dtype;
    opts.weights = options
        .weights
        .parse::<WeightType>()
        .map_err(EngineError::BadOption)?;
    Ok(opts)
}

/// The calibration sequences the engine (and `htpkv compile`) compiles with, tokenized with BOS.
///
/// A model with its own chat template is calibrated on what a chat model sees: ref_backend's
/// default conversations ([`ref_backend::DEFAULT_CALIBRATION_CHATS`]) rendered with that template,
/// then the default story prompts. Calibrated on the story prompts alone, SmolLM2's fixed-point
/// K/V ranges clipped 0.058% of the values of an unrelated text and u16 K/V missed the 99% top-1
/// goal; with the conversations, 0.0045% and 99.41% (docs/measurements/accuracy-smollm2.md). A model
/// without a template (llama2.c stories) gets the story prompts.
pub fn calibration_sequences(
    codec: &dyn TextCodec,
    chat: &ChatFormat,
) -> Result<Vec<Vec<u32>>, EngineError> {
    let mut out = Vec::new();
    if chat.has_template() {
        for (question, answer) in ref_backend::DEFAULT_CALIBRATION_CHATS {
            let turns = [
                Message::new("user", question),
                Message::new("assistant", answer),
            ];
            out.push(codec.encode(&chat.render(&turns, false)?, true));
        }
    }
    out.extend(
        ref_backend::DEFAULT_CALIBRATION_PROMPTS
            .iter()
            .map(|text| codec.encode(text, true)),
    );
    Ok(out)
}

/// Checks, before anything is compiled, that a KV cache can serve graphs of this context and these
/// AR variants (the rules of [`kv_manager::Geometry::validate`], e.g. the largest and the smallest
/// AR variant must fit in the context together).
pub fn check_geometry(
    config: &LlamaConfig,
    context: usize,
    ar: &[usize],
    kv_dtype: DataType,
) -> Result<(), EngineError> {
    let geometry = kv_manager::Geometry::new(
        config.n_layers,
        config.n_kv_heads,
        config.head_dim,
        context,
        ar,
        kv_dtype,
    );
    geometry
        .validate()
        .map_err(|e| EngineError::BadOption(e.to_string()))
}

/// Where a model's weights come from when it must be compiled.
enum WeightsFrom {
    /// A llama2.c checkpoint (already loaded: its hash keys the cache).
    Checkpoint(Box<Checkpoint>),
    /// A GGUF file or Hugging Face folder, loaded (and dequantized) only to compile.
    File,
}

/// A model found on disk, opened as far as the engine needs before compiling: its description,
/// fingerprint, tokenizer and chat format.
pub struct OpenedModel {
    /// The checkpoint file, GGUF file or Hugging Face folder.
    pub path: PathBuf,
    /// The description.
    pub config: LlamaConfig,
    /// SHA-256 of the model's files: keys the compiled cache and is recorded in compiled files.
    pub fingerprint: [u8; 32],
    /// The tokenizer, with the model's stop tokens.
    pub codec: Box<dyn TextCodec + Send + Sync>,
    /// The chat template, or the plain fallback.
    pub chat: ChatFormat,
    /// Tokens the tokenizer knows.
    pub vocab: usize,
    /// Every file the model was read from (no output may replace one of them).
    pub inputs: Vec<PathBuf>,
    weights: WeightsFrom,
}

impl std::fmt::Debug for OpenedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedModel")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Where a model's files are, found from what the user named, before anything is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file or a Hugging Face folder (`config.json`), which brings its own tokenizer.
    File(PathBuf),
    /// A llama2.c checkpoint and its tokenizer.
    Llama2c(ModelFiles),
}

impl ModelSource {
    /// The model `model` names: a GGUF file or a folder with `config.json` is read by the `model`
    /// crate; any other folder is a llama2.c model directory, and any other path a llama2.c
    /// checkpoint (`None`: discovery, see [`EngineOptions::model_dir`]). `tokenizer` is a llama2.c
    /// model's tokenizer (default: the one beside its checkpoint, see
    /// [`ModelFiles::for_checkpoint`]); the other formats bring their own and refuse one. Only a
    /// checkpoint's header is read here.
    pub fn find(
        model: Option<&Path>,
        tokenizer: Option<&Path>,
    ) -> Result<ModelSource, EngineError> {
        match model {
            Some(p) if model::format_of(p).is_ok() => match tokenizer {
                None => Ok(ModelSource::File(p.to_path_buf())),
                Some(t) => Err(EngineError::BadOption(format!(
                    "--tokenizer {} is for llama2.c checkpoints; {} brings its own tokenizer",
                    t.display(),
                    p.display()
                ))),
            },
            Some(p) if p.exists() && !p.is_dir() => {
                Ok(ModelSource::Llama2c(checkpoint_files(p, tokenizer)?))
            }
            other => {
                let mut files = ModelFiles::discover(other)?;
                if let Some(t) = tokenizer {
                    files.tokenizer = t.to_path_buf();
                }
                Ok(ModelSource::Llama2c(files))
            }
        }
    }

    /// Every file the model is read from (no output may replace one of them).
    pub fn inputs(&self) -> Result<Vec<PathBuf>, EngineError> {
        match self {
            ModelSource::File(path) => model_inputs(path),
            ModelSource::Llama2c(f) => Ok(vec![f.checkpoint.clone(), f.tokenizer.clone()]),
        }
    }

    /// True for a GGUF file or Hugging Face folder, which carry a tokenizer.json.
    pub fn brings_tokenizer(&self) -> bool {
        matches!(self, ModelSource::File(_))
    }
}

/// The files of the llama2.c checkpoint `path`: a file that cannot be read is that file's error; one
/// whose header is no checkpoint's is refused as no model at all.
fn checkpoint_files(path: &Path, tokenizer: Option<&Path>) -> Result<ModelFiles, EngineError> {
    use model::llama2c::ModelError;
    ModelFiles::for_checkpoint(path, tokenizer).map_err(|source| match source {
        ModelError::File(_) | ModelError::ModelNotFound { .. } => EngineError::Model(source),
        source => EngineError::NotAModel {
            path: path.to_path_buf(),
            source,
        },
    })
}

impl OpenedModel {
    /// Finds and opens the model `model` names ([`ModelSource::find`]).
    pub fn open(
        model: Option<&Path>,
        tokenizer: Option<&Path>,
    ) -> Result<OpenedModel, EngineError> {
        Self::open_source(&ModelSource::find(model, tokenizer)?)
    }

    /// Opens a model found with [`ModelSource::find`].
    pub fn open_source(source: &ModelSource) -> Result<OpenedModel, EngineError> {
        match source {
            ModelSource::File(path) => Self::open_file(path),
            ModelSource::Llama2c(files) => Self::open_llama2c(files),
        }
    }

    fn open_llama2c(files: &ModelFiles) -> Result<OpenedModel, EngineError> {
        let checkpoint = Checkpoint::load(&files.checkpoint)?;
        let tokenizer = Tokenizer::load(&files.tokenizer, checkpoint.config.vocab_size)?;
        Ok(OpenedModel {
            path: files.checkpoint.clone(),
            config: model::llama2c::llama_config(&checkpoint.config),
            fingerprint: checkpoint.sha256(),
            vocab: tokenizer.vocab_size(),
            codec: Box::new(tokenizer),
            chat: ChatFormat::new(None),
            inputs: vec![files.checkpoint.clone(), files.tokenizer.clone()],
            weights: WeightsFrom::Checkpoint(Box::new(checkpoint)),
        })
    }

    fn open_file(path: &Path) -> Result<OpenedModel, EngineError> {
        let text = model::load_text(path)?;
        let stops = text.config.special.stop_tokens();
        Ok(OpenedModel {
            path: path.to_path_buf(),
            fingerprint: fingerprint(path)?,
            vocab: text.tokenizer.vocab_size(),
            codec: Box::new(HfCodec::new(text.tokenizer, stops)),
            chat: match text.chat {
                Some(t) => ChatFormat::new(Some(t)),
                None => ChatFormat::missing(path.display().to_string()),
            },
            config: text.config,
            inputs: model_inputs(path)?,
            weights: WeightsFrom::File,
        })
    }

    /// Uses the Jinja chat template in `path` (read through the capped reader) instead of the
    /// model's own; its BOS/EOS strings are the tokenizer's spelling of the model's ids.
    pub fn use_chat_template(&mut self, path: &Path) -> Result<(), EngineError> {
        let source = model::fsio::read_text_capped(path, model::fsio::FileKind::CONFIG)
            .map_err(model::Error::from)?;
        let spell = |id: Option<u32>| {
            id.map(|t| String::from_utf8_lossy(&self.codec.token_bytes(t)).into_owned())
                .unwrap_or_default()
        };
        let special = &self.config.special;
        let (bos, eos) = (spell(special.bos), spell(special.eos));
        let t = model::ChatTemplate::new(&source, &bos, &eos)?.named(path.display().to_string());
        self.chat = ChatFormat::new(Some(t));
        self.inputs.push(path.to_path_buf());
        Ok(())
    }

    /// Lower-case hex of [`OpenedModel::fingerprint`].
    pub fn fingerprint_hex(&self) -> String {
        model::llama2c::hex(&self.fingerprint)
    }

    /// Runs `f` on the model's weights (loading a GGUF or Hugging Face model's weights first).
    pub fn with_weights<T>(
        &self,
        f: impl FnOnce(&dyn WeightSource) -> T,
    ) -> Result<T, EngineError> {
        Ok(match &self.weights {
            WeightsFrom::Checkpoint(c) => f(&**c),
            WeightsFrom::File => f(&*model::load(&self.path)?.weights),
        })
    }

    /// Compiles the model for the reference executor.
    pub fn compile(
        &self,
        opts: &CompileOptions,
        calibration: &[Vec<u32>],
        progress: &mut dyn FnMut(ref_backend::Progress),
    ) -> Result<CompiledModel, EngineError> {
        let compiled = self.with_weights(|weights| {
            ref_backend::compile(
                &self.config,
                weights,
                calibration,
                opts,
                self.fingerprint,
                progress,
            )
        })?;
        Ok(compiled?)
    }
}

/// SHA-256 over a model's files: a GGUF file's bytes, or for a Hugging Face folder the name and
/// SHA-256 of each of `config.json`, `tokenizer.json`, `tokenizer_config.json` and the
/// `*.safetensors` files, in name order.
fn fingerprint(path: &Path) -> Result<[u8; 32], EngineError> {
    let files = model_files(path)?;
    if path.is_file() {
        return Ok(model::llama2c::sha256(&read_capped(path, FileKind::GGUF)?));
    }
    let mut all = Vec::new();
    for (file, kind) in files {
        let name = file.file_name().unwrap_or_default();
        all.extend_from_slice(name.as_encoded_bytes());
        all.extend_from_slice(&model::llama2c::sha256(&read_capped(&file, kind)?));
    }
    Ok(model::llama2c::sha256(&all))
}

/// The files of the model at `path` (a GGUF file, or a Hugging Face folder's `config.json`,
/// tokenizer files and `*.safetensors`): what no output may replace.
pub fn model_inputs(path: &Path) -> Result<Vec<PathBuf>, EngineError> {
    Ok(model_files(path)?.into_iter().map(|(p, _)| p).collect())
}

/// The files of the model at `path` and the cap each is read under: a GGUF file itself, or the
/// `config.json`, `tokenizer.json`, `tokenizer_config.json` and `*.safetensors` of a Hugging
/// Face folder, by name in name order.
fn model_files(path: &Path) -> Result<Vec<(PathBuf, FileKind)>, EngineError> {
    if path.is_file() {
        return Ok(vec![(path.to_path_buf(), FileKind::GGUF)]);
    }
    let entries = std::fs::read_dir(path).map_err(|error| EngineError::Io {
        what: "listing",
        path: path.to_path_buf(),
        error,
    })?;
    let mut files: Vec<(String, FileKind)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter_map(|n| {
            let kind = match n.as_str() {
                "config.json" | "tokenizer_config.json" => FileKind::HF_JSON,
                "tokenizer.json" => FileKind::TOKENIZER,
                _ if n.ends_with(".safetensors") => FileKind::SAFETENSORS,
                _ => return None,
            };
            Some((n, kind))
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files.into_iter().map(|(n, k)| (path.join(n), k)).collect())
}

/// Loads the compiled model for `model` and `opts` from `cache_dir`, or compiles it and stores it
/// there (atomically). A cache entry is used only when it was compiled from this model (the
/// SHA-256 recorded in the file, not only the one in its name) with these options and
/// calibration sequences. `status` receives human-readable status lines, `progress` the
/// compiler's progress.
pub fn compiled_model(
    model: &OpenedModel,
    opts: &CompileOptions,
    calibration: &[Vec<u32>],
    cache_dir: &Path,
    status: &mut dyn FnMut(&str),
    progress: &mut dyn FnMut(ref_backend::Progress),
) -> Result<(CompiledModel, PathBuf), EngineError> {
    let stem = model
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let digest = model.fingerprint_hex();
    let windows = windows_key(&model.config);
    let path = cache_dir.join(format!(
        "{stem}-{}-{}-c{}{windows}.htpkv",
        &digest[..16],
        opts.fingerprint_hex(),
        calibration_key(calibration)
    ));
    if path.exists() {
        match CompiledModel::read(&path) {
            Ok(m) if m.model_sha256_hex() != digest => status(&format!(
                "{} was compiled from another checkpoint; recompiling",
                path.display()
            )),
            Ok(m) if windows_key(m.config()) != windows => status(&format!(
                "{} was compiled with other per-layer windows; recompiling",
                path.display()
            )),
            Ok(m) if m.options() == opts && m.calibration() == calibration => {
                return Ok((m, path));
            }
            Ok(_) => status(&format!(
                "{} was compiled with other options; recompiling",
                path.display()
            )),
            Err(e) => status(&format!(
                "{} is unusable ({e}); recompiling",
                path.display()
            )),
        }
    }
    status(&format!(
        "compiling {} (first use) ...",
        model.path.display()
    ));
    let compiled = model.compile(opts, calibration, progress)?;
    std::fs::create_dir_all(cache_dir).map_err(|error| EngineError::Io {
        what: "creating the cache directory",
        path: cache_dir.to_path_buf(),
        error,
    })?;
    let inputs: Vec<&Path> = model.inputs.iter().map(PathBuf::as_path).collect();
    compiled.write(&path, &inputs)?;
    status(&format!("compiled model cached at {}", path.display()));
    Ok((compiled, path))
}

/// 16 hex digits of the SHA-256 of the calibration sequences, in a cached file's name: they change
/// the compiled model (a chat template adds conversations), so a model opened with and without
/// `--chat-template` keeps two entries instead of recompiling over one.
fn calibration_key(calibration: &[Vec<u32>]) -> String {
    let mut bytes = Vec::new();
    for sequence in calibration {
        bytes.extend((sequence.len() as u64).to_le_bytes());
        bytes.extend(sequence.iter().flat_map(|t| t.to_le_bytes()));
    }
    model::llama2c::hex(&model::llama2c::sha256(&bytes))[..16].to_owned()
}

/// The part of a cached file's name that keys its per-layer windows: empty without windows, else
/// `-w` and 16 hex digits of the SHA-256 of the windows (`--layer-window` changes the compiled
/// model, not the model's files).
fn windows_key(config: &LlamaConfig) -> String {
    if !config.layer_windows.iter().any(Option::is_some) {
        return String::new();
    }
    let text: Vec<String> = (config.layer_windows.iter())
        .map(|w| w.map_or("-".into(), |w| w.to_string()))
        .collect();
    let digest = model::llama2c::hex(&model::llama2c::sha256(text.join(",").as_bytes()));
    format!("-w{}", &digest[..16])
}

/// Status lines for a compile: one per stage and quarter of it (for logs and the JNI layer; the
/// CLI draws progress bars instead).
pub fn progress_lines(status: &mut dyn FnMut(&str)) -> impl FnMut(ref_backend::Progress) + '_ {
    let mut last = (ref_backend::Stage::BuildGraphs, u64::MAX);
    move |p| {
        let pct = (p.done * 100).checked_div(p.total).unwrap_or(100);
        if (p.stage, pct / 25) != (last.0, last.1) {
            last = (p.stage, pct / 25);
            status(&format!("  {} {pct}%", p.stage.name()));
        }
    }
}

/// Reads a compiled model given by the user and checks that it was compiled from `checkpoint`
/// (whose tokenizer will decode its output).
fn read_compiled(path: &Path, model: &OpenedModel) -> Result<CompiledModel, EngineError> {
    let compiled = CompiledModel::read(path)?;
    let (compiled_from, checkpoint_sha256) = (compiled.model_sha256_hex(), model.fingerprint_hex());
    if compiled_from != checkpoint_sha256 {
        return Err(EngineError::CheckpointMismatch {
            compiled: path.to_path_buf(),
            compiled_from,
            checkpoint: model.path.clone(),
            checkpoint_sha256,
        });
    }
    Ok(compiled)
}

/// How a [`Model`] makes a session's backend.
enum Loaded {
    /// The reference executor: every session shares the compiled model (weights and graphs).
    Reference(Arc<CompiledModel>),
    /// A QNN backend library: each session opens its own QNN context from the same binary (QNN
    /// graphs are not executed concurrently from one context, and each session registers its own
    /// region), so weights are not shared between sessions on this path.
    Qnn {
        backend_lib: PathBuf,
        system_lib: Option<PathBuf>,
        memory: crate::qnn_memory::QnnMemory,
        max_handles: usize,
    },
}

/// A loaded model (weights, compiled graphs, tokenizer) that serves any number of sessions, each with
/// its own KV region, from any threads: `Model` is `Send + Sync` and a [`Session`] is `Send`.
///
/// With the reference backend the compiled model is shared (each graph's scratch sits behind a
/// mutex, so executions of one graph by several sessions take turns). With the QNN backend each
/// session opens its own context (see `Loaded::Qnn`).
pub struct Model {
    loaded: Loaded,
    tokenizer: Box<dyn TextCodec + Send + Sync>,
    /// Tokens the tokenizer knows (at most the model's vocabulary: padded vocabularies).
    vocab: usize,
    vocab_size: usize,
    strategy: Strategy,
    /// The description the graphs run (the compiled file's, or the model's for QNN): its RoPE and
    /// layer windows re-rotate K rows after a slide.
    config: LlamaConfig,
    /// The model's chat template, or the plain fallback ([`crate::text`]).
    chat: ChatFormat,
    compiled_path: PathBuf,
    compiled_options: Option<CompileOptions>,
    /// The model's files and the compiled file: what an output must never replace.
    inputs: Vec<PathBuf>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("compiled_path", &self.compiled_path)
            .field("strategy", &self.strategy)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Finds the model, compiles it on first use (cached) and loads it for the chosen backend;
    /// `status` receives human-readable status lines (the compiler's progress included).
    pub fn open(
        options: &EngineOptions,
        status: &mut dyn FnMut(&str),
    ) -> Result<Model, EngineError> {
        let mut lines = |s: &str| status(s);
        let mut progress = progress_lines(&mut lines);
        Self::open_with(options, &mut |_| {}, &mut progress)
    }

    /// [`Model::open`] with the compiler's progress passed on as it is (e.g. to progress bars).
    pub fn open_with(
        options: &EngineOptions,
        status: &mut dyn FnMut(&str),
        progress: &mut dyn FnMut(ref_backend::Progress),
    ) -> Result<Model, EngineError> {
        let mut opened =
            OpenedModel::open(options.model_dir.as_deref(), options.tokenizer.as_deref())?;
        if options.compiled.is_some() && !options.layer_windows.is_empty() {
            return Err(EngineError::BadOption(
                "--layer-window applies when compiling; a compiled file has its own windows".into(),
            ));
        }
        apply_layer_windows(&mut opened.config, &options.layer_windows)?;
        if let Some(path) = &options.chat_template {
            opened.use_chat_template(path)?;
        }
        // A given compiled file is only parsed by the reference backend; the QNN backend hands it to the
        // QNN library as it is (on a device: a context binary made by Qualcomm's tools).
        let (model, compiled_path) = match &options.compiled {
            Some(path) => (None, path.clone()),
            None => {
                let opts = compile_options(options, &opened.config)?;
                let cache_dir = options.cache_dir.clone().unwrap_or_else(default_cache_dir);
                let (model, path) = compiled_model(
                    &opened,
                    &opts,
                    &calibration_sequences(&*opened.codec, &opened.chat)?,
                    &cache_dir,
                    status,
                    progress,
                )?;
                (Some(model), path)
            }
        };
        let mut compiled_options = None;
        let mut config = opened.config.clone();
        let loaded = match &options.backend {
            BackendChoice::Reference => {
                let model = match model {
                    Some(m) => m,
                    None => read_compiled(&compiled_path, &opened)?,
                };
                compiled_options = Some(model.options().clone());
                config = model.config().clone();
                Loaded::Reference(Arc::new(model))
            }
            BackendChoice::Qnn {
                backend_lib,
                system_lib,
                memory,
                max_handles,
            } => Loaded::Qnn {
                backend_lib: backend_lib.clone(),
                system_lib: system_lib.clone(),
                memory: *memory,
                max_handles: *max_handles,
            },
        };
        Ok(Model {
            loaded,
            vocab: opened.vocab,
            vocab_size: opened.config.vocab_size,
            tokenizer: opened.codec,
            strategy: options.strategy,
            config,
            chat: opened.chat,
            inputs: opened
                .inputs
                .into_iter()
                .chain([compiled_path.clone()])
                .collect(),
            compiled_path,
            compiled_options,
        })
    }

    /// A new session with its own KV cache (built from the graphs' own tensor descriptions), the
    /// model's RoPE known (for re-rotating slides) and the `stop` overflow policy.
    pub fn new_session(&self) -> Result<Session<Box<dyn Backend>>, EngineError> {
        let (backend, allocator): (Box<dyn Backend>, Box<dyn RegionAllocator>) = match &self.loaded
        {
            Loaded::Reference(model) => (
                Box::new(ReferenceBackend::new(model.clone())),
                Box::new(HostAllocator::default()),
            ),
            Loaded::Qnn {
                backend_lib,
                system_lib,
                memory,
                max_handles,
            } => {
                let qnn = crate::qnn::QnnBackend::open(
                    backend_lib,
                    system_lib.as_deref(),
                    &self.compiled_path,
                    *memory,
                    *max_handles,
                )?;
                let allocator = qnn.region_allocator();
                (Box::new(qnn), allocator)
            }
        };
        let mut session = Session::new(backend, self.strategy, allocator.as_ref())?;
        // A tokenizer may know fewer tokens than the model has rows (padded vocabularies), never
        // more.
        if session.vocab_size() < self.vocab || session.vocab_size() != self.vocab_size {
            return Err(EngineError::BadOption(format!(
                "the compiled model's logits cover {} tokens but the model has {} and its tokenizer {}",
                session.vocab_size(),
                self.vocab_size,
                self.vocab
            )));
        }
        session.set_rope(&self.config)?;
        Ok(session)
    }

    /// Bytes every session shares: the compiled model (weights and graph descriptions) as its file
    /// holds it, for the reference backend; 0 with QNN, where each session loads its own context.
    pub fn shared_bytes(&self) -> u64 {
        match self.loaded {
            Loaded::Reference(_) => std::fs::metadata(&self.compiled_path).map_or(0, |m| m.len()),
            Loaded::Qnn { .. } => 0,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn TextCodec {
        &self.tokenizer
    }

    /// True when the model has its own chat template (else chat uses the plain fallback).
    pub fn has_chat_template(&self) -> bool {
        self.chat.has_template()
    }

    /// How a conversation becomes a prompt: the model's chat template or the plain fallback.
    pub fn chat_format(&self) -> &ChatFormat {
        &self.chat
    }

    /// The options the model was compiled with (`None` with the QNN backend).
    pub fn compiled_options(&self) -> Option<&CompileOptions> {
        self.compiled_options.as_ref()
    }

    /// The compiled model file in use.
    pub fn compiled_path(&self) -> &Path {
        &self.compiled_path
    }

    /// Every file the model was read from (its checkpoint and tokenizer, GGUF file or folder's
    /// files, and the compiled file): outputs such as a saved session may not replace them.
    pub fn inputs(&self) -> Vec<&Path> {
        self.inputs.iter().map(PathBuf::as_path).collect()
    }
}

/// One model and one session: the convenience the CLI's `generate` and the JNI bridge use.
pub struct Engine {
    model: Arc<Model>,
    session: Session<Box<dyn Backend>>,
    /// The conversation so far when [`Engine::append_turn`] is used.
    chat: Option<Chat>,
    /// Speculative decoding, when set ([`Engine::set_speculation`]).
    speculation: Option<crate::speculate::Speculation>,
    /// The `tools` the chat template renders ([`Engine::set_template_tools`]).
    template_tools: Option<serde_json::Value>,
}

/// A multi-turn conversation: its turns and the text fed to the model so far.
#[derive(Debug, Default)]
struct Chat {
    turns: Vec<Message>,
    text: String,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.session.backend().name())
            .field("compiled_path", &self.model.compiled_path)
            .field("len", &self.session.len())
            .finish()
    }
}

impl Engine {
    /// Opens the model ([`Model::open`]) and one session on it.
    pub fn open(
        options: &EngineOptions,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Engine, EngineError> {
        let model = Arc::new(Model::open(options, progress)?);
        Engine::on(model)
    }

    /// [`Engine::open`] with the compiler's progress passed on as it is (e.g. to progress bars).
    pub fn open_with(
        options: &EngineOptions,
        status: &mut dyn FnMut(&str),
        progress: &mut dyn FnMut(ref_backend::Progress),
    ) -> Result<Engine, EngineError> {
        let model = Arc::new(Model::open_with(options, status, progress)?);
        Engine::on(model)
    }

    /// A new session on an open model.
    pub fn on(model: Arc<Model>) -> Result<Engine, EngineError> {
        let session = model.new_session()?;
        Ok(Engine {
            model,
            session,
            chat: None,
            speculation: None,
            template_tools: None,
        })
    }

    /// Passes `tools` (an OpenAI `tools` array) to the model's chat template from now on, in
    /// [`Engine::chat`] and [`Engine::append_turn`]; `None` stops. Only templates that refer to
    /// `tools` use them ([`Engine::template_takes_tools`]); for the others,
    /// `htpkv_structured::tools` describes the tools in a system message instead.
    pub fn set_template_tools(&mut self, tools: Option<serde_json::Value>) {
        self.template_tools = tools;
    }

    /// True when the model's chat template describes tools itself.
    pub fn template_takes_tools(&self) -> bool {
        self.model.chat.takes_tools()
    }

    /// Adds a turn (`system`, `user`, `assistant`, ...) to the conversation and prefills only the
    /// text it adds to the rendered conversation ([`ChatFormat`]: the model's chat template with
    /// the generation prompt after a `user` turn, or the plain fallback). `generate("")` then
    /// answers, and its text is recorded as the assistant's turn. Turn by turn, text-level: what
    /// the cache holds is never re-fed, so a long chat keeps going across slides of an overflow
    /// policy (a template that rewrites earlier turns cannot change what the cache holds). Returns
    /// the number of cached tokens.
    pub fn append_turn(&mut self, role: &str, text: &str) -> Result<usize, EngineError> {
        let codec = &self.model.tokenizer;
        check_text_fits(codec, text, self.session.capacity(), false)?;
        let chat = self.chat.get_or_insert_with(Chat::default);
        let mut turns = chat.turns.clone();
        turns.push(Message::new(role, text));
        let cap = chat
            .text
            .len()
            .saturating_add(max_text_bytes(codec, self.session.capacity()));
        let tools = self.template_tools.as_ref();
        let rendered = (self.model.chat).render_with_tools(&turns, tools, role == "user", cap)?;
        let common = chat
            .text
            .char_indices()
            .zip(rendered.chars())
            .find(|((_, a), b)| a != b)
            .map_or(chat.text.len().min(rendered.len()), |((i, _), _)| i);
        let delta = rendered[common..].to_string();
        let tokens = self.session.encode_fitting(&self.model.tokenizer, &delta)?;
        if !tokens.is_empty() {
            self.session.prefill(&tokens)?;
        }
        let chat = self.chat.get_or_insert_with(Chat::default);
        chat.turns = turns;
        chat.text.push_str(&delta);
        Ok(self.session.len())
    }

    /// Answers the last turn of the whole conversation `messages` (rendered with the model's
    /// [`ChatFormat`]), keeping the cache across calls: token-level prefix reuse
    /// ([`Session::prefill_reusing`]) keeps the cached tokens that are a prefix of the rendered
    /// conversation, rolls back where they differ (an edited history, an answer that re-tokenizes
    /// differently) and prefills only the rest — the history is never prefilled twice. The result's
    /// `prompt_tokens` are the tokens fed. (`generate --chat` uses this; [`Engine::append_turn`]
    /// is the turn-by-turn form that survives slides, which `htpkv chat` uses.)
    pub fn chat(
        &mut self,
        messages: &[Message],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        let (codec, capacity) = (&self.model.tokenizer, self.session.capacity());
        for m in messages {
            check_text_fits(codec, &m.content, capacity, false)?;
        }
        let cap = max_text_bytes(codec, capacity);
        let tools = self.template_tools.as_ref();
        let prompt = (self.model.chat).render_with_tools(messages, tools, true, cap)?;
        check_text_fits(codec, &prompt, capacity, true)?;
        let full = codec.encode(&prompt, true);
        if full.is_empty() {
            return Err(SessionError::Input("the conversation encodes to no tokens".into()).into());
        }
        if full.len() > self.session.capacity() {
            return Err(SessionError::PromptTooLong {
                prompt: full.len(),
                room: self.session.capacity(),
                at_least: false,
            }
            .into());
        }
        let reused_before = self.session.stats().reused_tokens;
        self.session.prefill_reusing(&full)?;
        let reused = self.session.stats().reused_tokens - reused_before;
        let fed = full[reused.min(full.len())..].to_vec();
        let mut generation = self.decode_text("", options, on_text)?;
        generation.prompt_tokens = fed;
        Ok(generation)
    }

    /// True when the model has its own chat template (else chat uses the plain fallback).
    pub fn has_chat_template(&self) -> bool {
        self.model.has_chat_template()
    }

    /// The shared model, to open more sessions on it.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Generates text after `prompt` (see [`Session::generate`]).
    pub fn generate(
        &mut self,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        let generation = self.decode_text(prompt, options, on_text)?;
        if let Some(chat) = &mut self.chat {
            chat.text.push_str(prompt);
            chat.text.push_str(&generation.text);
            chat.turns.push(Message::new("assistant", &generation.text));
        }
        Ok(generation)
    }

    /// [`Session::generate`], or its speculative form when speculation is set.
    fn decode_text(
        &mut self,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        let codec = &self.model.tokenizer;
        Ok(match &mut self.speculation {
            Some(s) => s.generate(&mut self.session, codec, prompt, options, on_text)?,
            None => self.session.generate(codec, prompt, options, on_text)?,
        })
    }

    /// Generates with speculative decoding from now on (`None`: plain decoding again).
    pub fn set_speculation(&mut self, speculation: Option<crate::speculate::Speculation>) {
        self.speculation = speculation;
    }

    /// Turns on speculative decoding with `kind` for this session (`target`: the options it was
    /// opened with, which a draft model follows). Refused (`bad_option`) when no AR variant of two
    /// or more rows can verify a proposal.
    pub fn speculate(
        &mut self,
        kind: &crate::speculate::SpecKind,
        target: &EngineOptions,
    ) -> Result<(), EngineError> {
        let g = &self.session.cache().spec().geometry;
        if !g.ar_variants.iter().any(|&ar| ar >= 2) {
            return Err(EngineError::BadOption(format!(
                "speculative decoding needs an AR variant of 2 or more rows to verify proposals; \
                 the model has {:?} (add {})",
                g.ar_variants,
                kind.verify_ar()
            )));
        }
        let speculator = speculator::open(kind, target, g.context)?;
        self.speculation = Some(crate::speculate::Speculation::new(speculator));
        Ok(())
    }

    /// Speculative decoding in use, with its counters.
    pub fn speculation(&self) -> Option<&crate::speculate::Speculation> {
        self.speculation.as_ref()
    }

    /// Runs `text` into the cache without generating (BOS first when the cache is empty); returns the
    /// number of cached tokens.
    pub fn prefill(&mut self, text: &str) -> Result<usize, EngineError> {
        let tokens = self.session.encode_fitting(&self.model.tokenizer, text)?;
        if tokens.is_empty() {
            return Ok(self.session.len());
        }
        self.session.prefill(&tokens)?;
        Ok(self.session.len())
    }

    /// Makes the cache hold BOS + `text` and returns the number of cached tokens, prefilling only
    /// what the cache does not already hold (see [`Session::prefill_reusing`]).
    pub fn prefill_reusing(&mut self, text: &str) -> Result<usize, EngineError> {
        check_text_fits(&self.model.tokenizer, text, self.session.capacity(), true)?;
        let tokens = self.model.tokenizer.encode(text, true);
        if tokens.len() > self.session.capacity() {
            return Err(SessionError::PromptTooLong {
                prompt: tokens.len(),
                room: self.session.capacity(),
                at_least: false,
            }
            .into());
        }
        self.session.prefill_reusing(&tokens)?;
        Ok(self.session.len())
    }

    /// Sets the policy for a full context (see [`crate::session::Overflow`]).
    pub fn set_overflow(&mut self, overflow: crate::session::Overflow) -> Result<(), EngineError> {
        Ok(self.session.set_overflow(overflow)?)
    }

    /// Saves the session ([`Session::save`]), refusing to replace one of the model's files
    /// ([`Model::inputs`]).
    pub fn save(&self, path: &Path) -> Result<(), crate::persist::PersistError> {
        self.session.save(path, &self.model.inputs())
    }

    /// Restores a saved session ([`Session::restore`]); later turns continue after its text.
    pub fn restore(&mut self, path: &Path) -> Result<(), crate::persist::PersistError> {
        self.session.restore(path)?;
        self.chat = None;
        Ok(())
    }

    /// Empties the cache (and forgets the conversation).
    pub fn reset(&mut self) {
        self.chat = None;
        self.session.reset();
    }

    /// Truncates the cache to `len` tokens.
    pub fn rollback(&mut self, len: usize) -> Result<(), EngineError> {
        Ok(self.session.rollback(len)?)
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.session.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.session.is_empty()
    }

    /// Tokens the cache can hold.
    pub fn capacity(&self) -> usize {
        self.session.capacity()
    }

    /// Timing and KV counters.
    pub fn stats(&self) -> SessionStats {
        self.session.stats()
    }

    /// Bytes the reference executor's weights take in memory (`None` on QNN, whose weights
    /// live in its context).
    pub fn weight_bytes(&self) -> Option<u64> {
        match &self.model.loaded {
            Loaded::Reference(c) => Some(c.weight_bytes()),
            Loaded::Qnn { .. } => None,
        }
    }

    /// Bytes of the reference executor's scratch: every graph's preallocated intermediate
    /// activations (`None` on QNN).
    pub fn scratch_bytes(&self) -> Option<u64> {
        match &self.model.loaded {
            Loaded::Reference(c) => Some(c.graphs().iter().map(|g| g.scratch_bytes() as u64).sum()),
            Loaded::Qnn { .. } => None,
        }
    }

    /// How the backend was handed the KV region, and the memory handles it cost (QNN only).
    pub fn memory_report(&self) -> Option<crate::backend::MemoryReport> {
        self.session.backend().memory_report()
    }

    /// The session.
    pub fn session(&self) -> &Session<Box<dyn Backend>> {
        &self.session
    }

    /// The session, to save, restore or step it.
    pub fn session_mut(&mut self) -> &mut Session<Box<dyn Backend>> {
        &mut self.session
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn TextCodec {
        &self.model.tokenizer
    }

    /// The options the model in use was compiled with, as read from its file (`None` with the QNN
    /// backend, which hands the file to the QNN library unparsed).
    pub fn compiled_options(&self) -> Option<&CompileOptions> {
        self.model.compiled_options()
    }

    /// The compiled model file in use.
    pub fn compiled_path(&self) -> &Path {
        self.model.compiled_path()
    }
}

/// The memory budget of one YAML config (every strategy it supports, full-context decode run) as a
/// JSON array, the document `htpkv budget --json` prints.
pub fn budget_json(config_yaml: &str) -> Result<String, EngineError> {
    let config = crate::config::Config::from_yaml(config_yaml, Path::new("<config>"))
        .map_err(|e| EngineError::Budget(e.to_string()))?;
    let mut reports = Vec::new();
    for update in Strategy::ALL {
        match crate::budget::report(&config, update, 0) {
            Ok(r) => reports.push(r),
            Err(crate::budget::BudgetError::Kv(kv_manager::KvError::UnsupportedCombination {
                ..
            })) => {}
            Err(e) => return Err(EngineError::Budget(e.to_string())),
        }
    }
    serde_json::to_string_pretty(&reports).map_err(|e| EngineError::Budget(e.to_string()))
}

/// Peak resident memory of this process in bytes (`VmHWM` of /proc/self/status); `None` where
/// the system does not say (not Linux). What `--stats`, `--json` and the server's load test report.
pub fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}
