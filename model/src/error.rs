//! The crate's error types.

use std::path::PathBuf;

use crate::gguf_file::GgufError;

/// Everything that can go wrong describing, loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A model description field is out of range or inconsistent with another field.
    #[error("invalid model description: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The field, e.g. `n_kv_heads`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What was expected instead.
        reason: String,
    },

    /// A weight tensor the description needs is absent.
    #[error("weight tensor {name} is missing")]
    MissingTensor {
        /// Tensor name in the file's naming scheme.
        name: String,
    },

    /// A weight tensor has the wrong number of elements or the wrong shape.
    #[error("weight tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected shape, outermost dimension first.
        expected: Vec<usize>,
        /// Shape found.
        found: Vec<usize>,
    },

    /// A tensor of a model file disagrees with the description its metadata gives (missing, of
    /// another shape, not accounted for), appears twice, or holds a NaN or infinite value.
    #[error("{origin}: tensor {name} {reason}")]
    BadTensor {
        /// The file (a GGUF file, a safetensors shard, a model folder).
        origin: String,
        /// The tensor's name in the file.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// An error about what a model file holds (its description, its tokenizer), with the file.
    #[error("{origin}")]
    InFile {
        /// The file (a GGUF file, a config.json, a tokenizer.json).
        origin: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// A file could not be read whole (missing, over its size cap, ...); it names the file.
    #[error(transparent)]
    File(#[from] crate::fsio::FileError),
    /// Reading a file failed.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The path is neither a GGUF file nor a folder with a config.json.
    #[error("{path} is neither a GGUF file nor a folder with a config.json")]
    UnknownFormat {
        /// The path.
        path: PathBuf,
    },

    /// A GGUF file is malformed or holds something this crate does not support.
    #[error("bad GGUF file {origin}")]
    Gguf {
        /// File path or caller label.
        origin: String,
        /// What is wrong.
        #[source]
        source: GgufError,
    },

    /// A metadata key the loader needs is missing or has the wrong type.
    #[error("{origin}: metadata {key}: {reason}")]
    Metadata {
        /// File path or caller label.
        origin: String,
        /// The key, e.g. `llama.block_count`.
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// A safetensors file is malformed.
    #[error("bad safetensors file {origin}: {reason}")]
    Safetensors {
        /// File path.
        origin: String,
        /// What is wrong (the safetensors crate's message).
        reason: String,
    },

    /// A config.json is malformed or misses a needed field.
    #[error("bad model config {origin}: {reason}")]
    HfConfig {
        /// File path.
        origin: String,
        /// What is wrong.
        reason: String,
    },

    /// The chat template could not be compiled or rendered.
    #[error("{origin}")]
    Template {
        /// The template's source: `FILE: tokenizer.chat_template`, `FILE: chat_template`, or
        /// `chat template` when unnamed.
        origin: String,
        /// The template engine's error.
        #[source]
        source: minijinja::Error,
    },

    /// Rendering the chat template went past a limit: its work (fuel) or its output cap.
    #[error(
        "{origin} has no chat template (a base model): give one with --chat-template FILE, or \
         generate from a plain prompt"
    )]
    NoChatTemplate {
        /// The model file or folder.
        origin: String,
    },
    #[error("{origin}: {reason}")]
    TemplateLimit {
        /// The template's source, as for [`Error::Template`].
        origin: String,
        /// Which limit, with its value.
        reason: String,
    },

    /// A token id is not below the vocabulary size.
    #[error("token {token} is out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },

    /// A position is not below the cache's context length.
    #[error("position {pos} is out of range for a context of {context}")]
    PositionOutOfRange {
        /// The position.
        pos: usize,
        /// Context length of the KV cache.
        context: usize,
    },

    /// A position skips ahead of the cached positions.
    #[error("position {pos} skips ahead: only {filled} positions are cached")]
    PositionGap {
        /// The position.
        pos: usize,
        /// Number of cached positions.
        filled: usize,
    },

    /// A forward pass was asked for with inconsistent inputs (row counts, layer range, tables).
    #[error("invalid forward pass: {reason}")]
    InvalidPass {
        /// What does not fit.
        reason: String,
    },

    /// Building or running a tokenizer failed.
    #[error("tokenizer: {reason}")]
    Tokenizer {
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// The error's kind: `io` when a file or folder could not be read, `bad_model` when what was
    /// read cannot be used.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Io { .. } | Error::File(_) => "io",
            _ => "bad_model",
        }
    }

    /// The message followed by each cause's, `: `-separated (as the CLI prints an error).
    pub fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text += &format!(": {s}");
            source = s.source();
        }
        text
    }

    /// `self` as an error about the file `origin` ([`Error::InFile`]).
    pub(crate) fn in_file(self, origin: impl std::fmt::Display) -> Self {
        Error::InFile {
            origin: origin.to_string(),
            source: Box::new(self),
        }
    }

    pub(crate) fn config(
        field: &'static str,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        Error::InvalidConfig {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
