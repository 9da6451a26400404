//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading llama2.c files or running the float model.
///
/// `origin` fields name where bytes came from: a file path for [`super::Checkpoint::load`] and
/// [`super::Tokenizer::load`], or the caller-supplied label for the `from_bytes` constructors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Reading a file failed, or it is larger than its cap.
    #[error(transparent)]
    File(#[from] crate::fsio::FileError),

    /// The data ends inside `what` (a checkpoint section or a tokenizer entry).
    #[error(
        "{origin} is truncated in {what}: expected at least {expected} bytes, found {found} bytes"
    )]
    Truncated {
        /// File path or caller label.
        origin: String,
        /// The section or entry that is short, e.g. `section wk` or `tokenizer entry 300 (bytes)`.
        what: String,
        /// Bytes needed up to the end of `what`.
        expected: u64,
        /// Bytes actually available.
        found: u64,
    },

    /// The checkpoint is longer than its header says it should be.
    #[error(
        "{origin} has the wrong size for its header: expected exactly {expected} bytes, found {found} bytes ({} trailing bytes)",
        found - expected
    )]
    TrailingBytes {
        /// File path or caller label.
        origin: String,
        /// Exact size implied by the header.
        expected: u64,
        /// Actual size.
        found: u64,
    },

    /// A checkpoint weight is NaN or infinite.
    #[error("{origin}: weight {tensor}[{index}] at offset {offset} is not finite")]
    NonFinite {
        /// File path or caller label.
        origin: String,
        /// The tensor (section) holding it.
        tensor: &'static str,
        /// Index of the value in the tensor.
        index: usize,
        /// Byte offset in the file.
        offset: u64,
    },

    /// A checkpoint header field is out of range or inconsistent with another field.
    #[error("{origin}: bad checkpoint header field {field} = {value}: {reason}")]
    BadHeader {
        /// File path or caller label.
        origin: String,
        /// Header field name (`dim`, `hidden_dim`, `n_layers`, `n_heads`, `n_kv_heads`, `vocab_size`, `seq_len`).
        field: &'static str,
        /// The offending value as stored.
        value: i64,
        /// What was expected instead.
        reason: String,
    },

    /// A tokenizer entry is malformed (e.g. negative byte length, bad max_token_length).
    #[error("{origin}: bad tokenizer entry {index}: {reason}")]
    BadTokenizer {
        /// File path or caller label.
        origin: String,
        /// Token id of the entry (or 0 for the leading max_token_length field, see `reason`).
        index: usize,
        /// What is wrong.
        reason: String,
    },

    /// The tokenizer holds a different number of entries than the model's vocabulary size.
    #[error(
        "{origin}: tokenizer vocabulary size mismatch: expected {expected} entries, the file holds {found}"
    )]
    VocabMismatch {
        /// File path or caller label.
        origin: String,
        /// Vocabulary size asked for (the model's).
        expected: usize,
        /// Entries the file actually holds (counted as far as they parse).
        found: usize,
    },

    /// A token id outside `0..vocab_size` was passed to the model.
    #[error("token id {token} out of range: vocabulary size is {vocab_size}")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },

    /// A position at or past the model's context length was passed to the model.
    #[error("position {pos} out of range: the model's seq_len is {seq_len}")]
    PositionOutOfRange {
        /// The offending position.
        pos: usize,
        /// The model's context length.
        seq_len: usize,
    },

    /// A position was skipped: `forward` needs positions `0..pos` to be in the KV cache.
    #[error(
        "position {pos} skips ahead: the KV cache holds positions 0..{filled}, so the next position may be at most {filled}"
    )]
    PositionGap {
        /// The requested position.
        pos: usize,
        /// Number of positions currently in the cache.
        filled: usize,
    },

    /// Weights handed to [`super::Checkpoint::new`] do not match the config.
    #[error("weight tensor {tensor} has {found} elements, expected {expected} for this config")]
    WeightShape {
        /// Field name of the tensor.
        tensor: &'static str,
        /// Element count implied by the config.
        expected: usize,
        /// Element count found.
        found: usize,
    },

    /// No model directory with a checkpoint and a tokenizer was found.
    #[error("{}", not_found_message(tried))]
    ModelNotFound {
        /// Every directory tried, in order, with the reason it was rejected.
        tried: Vec<(PathBuf, String)>,
    },
}

impl ModelError {
    /// The error's kind: `model_not_found` when no model directory was found, `io` when a file
    /// could not be read, `bad_model` otherwise.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::ModelNotFound { .. } => "model_not_found",
            ModelError::File(_) => "io",
            _ => "bad_model",
        }
    }
}

fn not_found_message(tried: &[(PathBuf, String)]) -> String {
    use std::fmt::Write as _;
    let mut s = String::from("no llama2.c model directory found; tried:\n");
    for (p, why) in tried {
        let _ = writeln!(s, "  - {}: {why}", p.display());
    }
    let _ = write!(
        s,
        "A model directory holds {ckpt} and {tok} (or model.bin and tokenizer.bin). \
         Set $HTPKV_MODEL_DIR to it, or download the upstream files from Andrej Karpathy's \
         tinyllamas release on Hugging Face (repository karpathy/tinyllamas): \
         stories260K/{ckpt} ({ckpt_size} bytes, sha256 {ckpt_sha}) and \
         stories260K/{tok} ({tok_size} bytes, sha256 {tok_sha}).",
        ckpt = super::files::CHECKPOINT_NAME,
        tok = super::files::TOKENIZER_NAME,
        ckpt_size = super::files::STORIES260K_BYTES,
        ckpt_sha = super::files::STORIES260K_SHA256,
        tok_size = super::files::TOK512_BYTES,
        tok_sha = super::files::TOK512_SHA256,
    );
    s
}
