//! The high-level entry point: find a model, compile it on first use (cached), load it on a backend
//! and serve generations. The CLI's `generate` and the JNI bridge both use it.

use crate::backend::Backend;
use crate::reference::ReferenceBackend;
use crate::sampler::SamplerError;
use crate::session::{GenerateOptions, Generation, Session, SessionError, SessionStats};
use kv_manager::{HostAllocator, RegionAllocator, Reserve, Strategy};
use llama2c::{Checkpoint, ModelFiles, Tokenizer};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Model directory; `None` searches `$HTPKV_MODEL_DIR`, `./models/stories260K`,
    /// `../shared/models/stories260K`.
    pub model_dir: Option<PathBuf>,
    /// A compiled model file to load instead of compiling (the tokenizer still comes from the model
    /// directory).
    pub compiled: Option<PathBuf>,
    pub backend: BackendChoice,
    pub strategy: Strategy,
    /// KV cache element type: u8, u16, f16 or f32.
    pub kv_dtype: DataType,
    /// Weights: "i8", "f16" or "f32".
    pub weights: String,
    /// Context length S; `None` uses the model's `seq_len`.
    pub context: Option<usize>,
    /// AR variants of the compiled graphs (prefill and decode).
    pub ar: Vec<usize>,
    /// Where compiled models are cached; `None` uses `$HTPKV_CACHE_DIR`, `$XDG_CACHE_HOME/htpkv`,
    /// `$HOME/.cache/htpkv`, then `./.htpkv-cache`.
    pub cache_dir: Option<PathBuf>,
}

impl Default for EngineOptions {
    /// The reference backend, model discovery, `shift` 2x, u16 KV with i8 weights (W8A16, the usual
    /// HTP configuration), the model's context, AR [1, 32].
    fn default() -> Self {
        EngineOptions {
            model_dir: None,
            compiled: None,
            backend: BackendChoice::Reference,
            strategy: Strategy::SHIFT_2X,
            kv_dtype: DataType::U16,
            weights: "i8".into(),
            context: None,
            ar: vec![1, 32],
            cache_dir: None,
        }
    }
}

impl EngineOptions {
    /// The update strategy used when none is asked for: `shift` (2x) on the reference backend,
    /// `smart_mask` through QNN, where every distinct window offset of a sliding strategy is a new
    /// memory handle (see the README's handle-budget measurements).
    pub fn default_strategy(backend: &BackendChoice) -> Strategy {
        match backend {
            BackendChoice::Reference => Strategy::SHIFT_2X,
            BackendChoice::Qnn { .. } => Strategy::SmartMask,
        }
    }

    /// Parses an update strategy name: `shift` (2x), `conveyor`, `smart_mask`, `naive`.
    pub fn parse_strategy(name: &str) -> Result<Strategy, EngineError> {
        Ok(match name {
            "shift" => Strategy::SHIFT_2X,
            "shift-1.5x" => Strategy::Shift {
                reserve: Reserve::Factor(1.5),
                stagger: true,
            },
            "conveyor" => Strategy::Conveyor,
            "smart_mask" => Strategy::SmartMask,
            "naive" => Strategy::Naive,
            other => {
                return Err(EngineError::BadOption(format!(
                    "unknown update strategy `{other}` (expected shift, conveyor, smart_mask or naive)"
                )));
            }
        })
    }
}

/// Errors of the engine, each with a stable [`EngineError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] llama2c::ModelError),
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
    #[error("{0}")]
    BadOption(String),
    /// An I/O failure: the message says what was done to which file, the I/O error is the source.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// A file that could not be read (it names the file; capped, see `llama2c::fsio`).
    #[error(transparent)]
    File(#[from] llama2c::fsio::FileError),
    #[error("QNN backend: {0}")]
    Qnn(String),
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
    /// `bad_option`, `context_full`, `kv`, `backend`, `io`, `qnn`, `budget`).
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Model(llama2c::ModelError::ModelNotFound { .. }) => "model_not_found",
            EngineError::Model(llama2c::ModelError::File(_)) => "io",
            EngineError::Model(_) => "bad_model",
            EngineError::Compile(_) => "compile",
            EngineError::Format(ref_backend::FormatError::File(_)) => "io",
            EngineError::Format(_) => "bad_model",
            EngineError::CheckpointMismatch { .. } => "bad_model",
            EngineError::Session(SessionError::Kv(kv_manager::KvError::ContextFull { .. })) => {
                "context_full"
            }
            EngineError::Session(SessionError::Kv(_)) => "kv",
            EngineError::Session(SessionError::Backend(_)) => "backend",
            EngineError::Session(SessionError::Sampler(_)) => "bad_option",
            EngineError::Session(SessionError::Input(_)) => "bad_option",
            EngineError::Session(SessionError::PromptTooLong { .. }) => "context_full",
            EngineError::Session(SessionError::Token { .. }) => "bad_option",
            EngineError::Session(SessionError::Graphs(_)) => "bad_model",
            EngineError::BadOption(_) => "bad_option",
            EngineError::Io { .. } | EngineError::File(_) => "io",
            EngineError::Qnn(_) => "qnn",
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

/// The compile options an [`EngineOptions`] asks for, for a checkpoint.
pub fn compile_options(
    options: &EngineOptions,
    checkpoint: &Checkpoint,
) -> Result<CompileOptions, EngineError> {
    let context = options.context.unwrap_or(checkpoint.config.seq_len);
    check_geometry(&checkpoint.config, context, &options.ar, options.kv_dtype)?;
    let mut opts = CompileOptions::new(context, options.ar.clone());
    opts.kv_dtype = options.kv_dtype;
    opts.weights = options
        .weights
        .parse::<WeightType>()
        .map_err(EngineError::BadOption)?;
    Ok(opts)
}

/// The calibration sequences the engine compiles with: the default prompts, tokenized with BOS.
pub fn calibration_sequences(tokenizer: &Tokenizer) -> Vec<Vec<u32>> {
    ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|text| tokenizer.encode(text, true, false))
        .collect()
}

/// Checks, before anything is compiled, that a KV cache can serve graphs of this context and these
/// AR variants (the rules of [`kv_manager::Geometry::validate`], e.g. the largest and the smallest
/// AR variant must fit in the context together).
pub fn check_geometry(
    config: &llama2c::Config,
    context: usize,
    ar: &[usize],
    kv_dtype: DataType,
) -> Result<(), EngineError> {
    let geometry = kv_manager::Geometry::new(
        config.n_layers,
        config.n_kv_heads,
        config.head_dim(),
        context,
        ar,
        kv_dtype,
    );
    geometry
        .validate()
        .map_err(|e| EngineError::BadOption(e.to_string()))
}

/// Loads the compiled model for `checkpoint` and `opts` from `cache_dir`, or compiles it and
/// stores it there (atomically). A cache entry is used only when it was compiled from this
/// checkpoint (the SHA-256 recorded in the file, not only the one in its name) with these
/// options and calibration sequences. `progress` receives human-readable status lines.
pub fn compiled_model(
    checkpoint_path: &Path,
    checkpoint: &Checkpoint,
    opts: &CompileOptions,
    calibration: &[Vec<u32>],
    cache_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(CompiledModel, PathBuf), EngineError> {
    let stem = checkpoint_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let digest = checkpoint.sha256_hex();
    let path = cache_dir.join(format!(
        "{stem}-{}-{}.htpkv",
        &digest[..16],
        opts.fingerprint_hex()
    ));
    if path.exists() {
        match CompiledModel::read(&path) {
            Ok(model) if model.model_sha256_hex() != digest => progress(&format!(
                "{} was compiled from another checkpoint; recompiling",
                path.display()
            )),
            Ok(model) if model.options() == opts && model.calibration() == calibration => {
                return Ok((model, path));
            }
            Ok(_) => progress(&format!(
                "{} was compiled with other options; recompiling",
                path.display()
            )),
            Err(e) => progress(&format!(
                "{} is unusable ({e}); recompiling",
                path.display()
            )),
        }
    }
    progress(&format!(
        "compiling {} (first use) ...",
        checkpoint_path.display()
    ));
    let mut last = (ref_backend::Stage::BuildGraphs, u64::MAX);
    let config = llama2c::llama_config(&checkpoint.config);
    let fingerprint = checkpoint.sha256();
    let model = ref_backend::compile(
        &config,
        checkpoint,
        calibration,
        opts,
        fingerprint,
        &mut |p| {
            let pct = (p.done * 100).checked_div(p.total).unwrap_or(100);
            if (p.stage, pct / 25) != (last.0, last.1) {
                last = (p.stage, pct / 25);
                progress(&format!("  {} {pct}%", p.stage.name()));
            }
        },
    )?;
    std::fs::create_dir_all(cache_dir).map_err(|error| EngineError::Io {
        what: "creating the cache directory",
        path: cache_dir.to_path_buf(),
        error,
    })?;
    model.write(&path, &[checkpoint_path])?;
    progress(&format!("compiled model cached at {}", path.display()));
    Ok((model, path))
}

/// Reads a compiled model given by the user and checks that it was compiled from `checkpoint`
/// (whose tokenizer will decode its output).
fn read_compiled(
    path: &Path,
    checkpoint_path: &Path,
    checkpoint: &Checkpoint,
) -> Result<CompiledModel, EngineError> {
    let model = CompiledModel::read(path)?;
    let (compiled_from, checkpoint_sha256) = (model.model_sha256_hex(), checkpoint.sha256_hex());
    if compiled_from != checkpoint_sha256 {
        return Err(EngineError::CheckpointMismatch {
            compiled: path.to_path_buf(),
            compiled_from,
            checkpoint: checkpoint_path.to_path_buf(),
            checkpoint_sha256,
        });
    }
    Ok(model)
}

/// A model ready to generate: session (backend + KV cache) and tokenizer.
pub struct Engine {
    session: Session<Box<dyn Backend>>,
    tokenizer: Tokenizer,
    compiled_path: PathBuf,
    compiled_options: Option<CompileOptions>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.session.backend().name())
            .field("compiled_path", &self.compiled_path)
            .field("len", &self.session.len())
            .finish()
    }
}

impl Engine {
    /// Finds the model, compiles it on first use (cached), loads it on the chosen backend and builds
    /// the KV cache from the compiled graphs' own tensor descriptions.
    pub fn open(
        options: &EngineOptions,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Engine, EngineError> {
        let files = ModelFiles::discover(options.model_dir.as_deref())?;
        let checkpoint = Checkpoint::load(&files.checkpoint)?;
        let tokenizer = Tokenizer::load(&files.tokenizer, checkpoint.config.vocab_size)?;
        // A given compiled file is only parsed by the reference backend; the QNN backend hands it to the
        // QNN library as it is (on a device: a context binary made by Qualcomm's tools).
        let (model, compiled_path) = match &options.compiled {
            Some(path) => (None, path.clone()),
            None => {
                let opts = compile_options(options, &checkpoint)?;
                let cache_dir = options.cache_dir.clone().unwrap_or_else(default_cache_dir);
                let (model, path) = compiled_model(
                    &files.checkpoint,
                    &checkpoint,
                    &opts,
                    &calibration_sequences(&tokenizer),
                    &cache_dir,
                    progress,
                )?;
                (Some(model), path)
            }
        };
        let mut compiled_options = None;
        let (backend, allocator): (Box<dyn Backend>, Box<dyn RegionAllocator>) =
            match &options.backend {
                BackendChoice::Reference => {
                    let model = match model {
                        Some(m) => m,
                        None => read_compiled(&compiled_path, &files.checkpoint, &checkpoint)?,
                    };
                    compiled_options = Some(model.options().clone());
                    let backend = ReferenceBackend::new(Arc::new(model));
                    (Box::new(backend), Box::new(HostAllocator::default()))
                }
                BackendChoice::Qnn {
                    backend_lib,
                    system_lib,
                    memory,
                    max_handles,
                } => {
                    let qnn = crate::qnn::QnnBackend::open(
                        backend_lib,
                        system_lib.as_deref(),
                        &compiled_path,
                        *memory,
                        *max_handles,
                    )?;
                    let allocator = qnn.region_allocator();
                    (Box::new(qnn), allocator)
                }
            };
        let session = Session::new(backend, options.strategy, allocator.as_ref())?;
        if session.vocab_size() != tokenizer.vocab_size() {
            return Err(EngineError::BadOption(format!(
                "the compiled model's logits cover {} tokens but the tokenizer has {}",
                session.vocab_size(),
                tokenizer.vocab_size()
            )));
        }
        Ok(Engine {
            session,
            tokenizer,
            compiled_path,
            compiled_options,
        })
    }

    /// Generates text after `prompt` (see [`Session::generate`]).
    pub fn generate(
        &mut self,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        Ok(self
            .session
            .generate(&self.tokenizer, prompt, options, on_text)?)
    }

    /// Runs `text` into the cache without generating (BOS first when the cache is empty); returns the
    /// number of cached tokens.
    pub fn prefill(&mut self, text: &str) -> Result<usize, EngineError> {
        let tokens = self.session.encode_fitting(&self.tokenizer, text)?;
        if tokens.is_empty() {
            return Ok(self.session.len());
        }
        self.session.prefill(&tokens)?;
        Ok(self.session.len())
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
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
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The options the model in use was compiled with, as read from its file (`None` with the QNN
    /// backend, which hands the file to the QNN library unparsed).
    pub fn compiled_options(&self) -> Option<&CompileOptions> {
        self.compiled_options.as_ref()
    }

    /// The compiled model file in use.
    pub fn compiled_path(&self) -> &Path {
        &self.compiled_path
    }
}

/// The memory budget of one YAML config (every strategy it supports, full-context decode run) as a
/// JSON array, the document `htpkv budget --json` prints.
pub fn budget_json(config_yaml: &str) -> Result<String, EngineError> {
    let config = crate::config::Config::from_yaml(config_yaml, Path::new("<config>"))
        .map_err(|e| EngineError::Budget(e.to_string()))?;
    let mut reports = Vec::new();
    for update in crate::config::Update::ALL {
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
