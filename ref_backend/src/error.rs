//! Error types of the reference backend.

/// Errors reading or writing a compiled model file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Reading or writing the file failed, it is too large, or the output path was refused.
    #[error(transparent)]
    File(#[from] model::fsio::FileError),
    /// The data ends before a field that must be there.
    #[error(
        "{origin}: truncated compiled model: expected {expected} byte(s) of {what} at offset {offset}, but only {available} remain"
    )]
    Truncated {
        /// Label of the data (a path, or what the caller passed to `from_bytes`).
        origin: String,
        /// The field that is cut.
        what: String,
        /// Offset of the field from the start of the file.
        offset: u64,
        expected: u64,
        available: u64,
    },
    /// The file does not start with the format's magic bytes.
    #[error(
        "{origin}: not an htpkv reference-backend model: magic {found:02x?}, expected {expected:02x?}"
    )]
    BadMagic {
        origin: String,
        found: Vec<u8>,
        expected: Vec<u8>,
    },
    /// The file has a format version this build cannot read (older files: compile the model
    /// again).
    #[error(
        "{origin}: unsupported format version {found} (this build reads versions 3 to {supported}); recompile the model with this build"
    )]
    UnsupportedVersion {
        origin: String,
        found: u32,
        supported: u32,
    },
    /// The payload checksum does not match: the file is damaged.
    #[error(
        "{origin}: checksum mismatch: header says crc32 {stored:#010x}, payload has {computed:#010x} (file damaged)"
    )]
    ChecksumMismatch {
        origin: String,
        stored: u32,
        computed: u32,
    },
    /// Bytes follow the declared payload.
    #[error("{origin}: {extra} unexpected byte(s) after the payload at offset {offset}")]
    TrailingBytes {
        origin: String,
        offset: u64,
        extra: u64,
    },
    /// A weight, norm or scale is NaN or infinite (the checksum may be right: it only proves
    /// the bytes are the ones written).
    #[error("{origin}: {what}[{index}] is {value} at offset {offset}: weights must be finite")]
    NonFinite {
        origin: String,
        /// The tensor (e.g. `rms_att`, `wq scale`).
        what: String,
        /// Index of the value within the tensor.
        index: usize,
        offset: u64,
        value: f32,
    },
    /// A field holds a value that is invalid or inconsistent with the rest of the file.
    #[error("{origin}: invalid compiled model at offset {offset}: {reason}")]
    Corrupt {
        origin: String,
        offset: u64,
        reason: String,
    },
}

impl FormatError {
    /// The error's kind: `io` when the file could not be read or written, `bad_model` when its
    /// contents cannot be used.
    pub fn kind(&self) -> &'static str {
        match self {
            FormatError::File(_) => "io",
            _ => "bad_model",
        }
    }
}

/// Errors of [`crate::compile`]. Each message says what failed; the cause, if any, is the
/// `source` (printed after it by a `{:#}` report), never repeated in the message.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The options cannot be compiled for this model.
    #[error("invalid compile options: {reason}")]
    InvalidOptions { reason: String },
    /// The model description or weights are unusable (invalid description, missing or
    /// missized tensor).
    #[error("the model cannot be compiled")]
    Model {
        #[source]
        source: model::Error,
    },
    /// The float model rejected a calibration input (e.g. a token id out of range).
    #[error("calibration sequence {prompt}")]
    Calibration {
        prompt: usize,
        #[source]
        source: model::Error,
    },
    /// An encoding could not be made (e.g. an observer that saw no finite value).
    #[error("cannot make the encoding of {what}")]
    Quant {
        what: String,
        #[source]
        source: quant::QuantError,
    },
    /// The weights given alongside a compiled model are not the ones it was compiled from
    /// (a lowering that needs both, e.g. [`crate::lpbq_multipliers`]).
    #[error("the compiled model's {tensor} does not come from these weights: {reason}")]
    WeightsMismatch { tensor: String, reason: String },
}

impl CompileError {
    /// The error's kind: always `compile`.
    pub fn kind(&self) -> &'static str {
        "compile"
    }
}

/// Errors of [`crate::Graph::execute`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Wrong number of input buffers.
    #[error("graph {graph}: expected {expected} input buffer(s), got {found}")]
    InputCount {
        graph: String,
        expected: usize,
        found: usize,
    },
    /// Wrong number of output buffers.
    #[error("graph {graph}: expected {expected} output buffer(s), got {found}")]
    OutputCount {
        graph: String,
        expected: usize,
        found: usize,
    },
    /// An input buffer has the wrong length.
    #[error("graph {graph}: input {index} `{tensor}` must be {expected} bytes, got {found}")]
    InputSize {
        graph: String,
        tensor: String,
        index: usize,
        expected: usize,
        found: usize,
    },
    /// An output buffer has the wrong length.
    #[error("graph {graph}: output {index} `{tensor}` must be {expected} bytes, got {found}")]
    OutputSize {
        graph: String,
        tensor: String,
        index: usize,
        expected: usize,
        found: usize,
    },
    /// A raw input or output pointer is null.
    #[error("graph {graph}: buffer of `{tensor}` is a null pointer")]
    NullPointer { graph: String, tensor: String },
    /// A token id outside the vocabulary.
    #[error(
        "graph {graph}: `{tensor}`[{index}] = {value} is not a token id (vocabulary {vocab_size})"
    )]
    TokenOutOfRange {
        graph: String,
        tensor: String,
        index: usize,
        value: i32,
        vocab_size: usize,
    },
    /// A negative RoPE position.
    #[error("graph {graph}: `{tensor}`[{index}] = {value} is negative (positions must be >= 0)")]
    NegativePosition {
        graph: String,
        tensor: String,
        index: usize,
        value: i32,
    },
}
