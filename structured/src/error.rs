//! The one error type of the crate.

use std::error::Error as StdError;

/// What kind of failure a [`StructuredError`] is, for a server to map to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong: a schema, regex, grammar, tool list or tool choice that cannot be
    /// used (an HTTP 400).
    InvalidRequest,
    /// The model's tokenizer cannot be constrained (it does not list its vocabulary).
    Unsupported,
}

impl ErrorKind {
    /// A short stable name: `invalid_request` or `unsupported`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

/// Why structured output or a tool call could not be set up. The message starts with the part of
/// the request that was wrong (`response_format.json_schema`, `tools[1].function.name`, ...);
/// [`std::error::Error::source`] gives the underlying error (llguidance's, serde_json's) when
/// there is one.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct StructuredError {
    kind: ErrorKind,
    what: String,
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl StructuredError {
    /// A wrong request: `what` names the part of the request, `message` says what is wrong.
    pub fn invalid(what: impl Into<String>, message: impl Into<String>) -> StructuredError {
        StructuredError {
            kind: ErrorKind::InvalidRequest,
            what: what.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A wrong request whose cause is `source`: `message` says what failed (the source's own text
    /// is the next link of the error chain, not repeated here).
    pub fn invalid_from(
        what: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> StructuredError {
        StructuredError {
            source: Some(source.into()),
            ..StructuredError::invalid(what, message)
        }
    }

    /// A tokenizer that cannot be constrained.
    pub fn unsupported(what: impl Into<String>, message: impl Into<String>) -> StructuredError {
        StructuredError {
            kind: ErrorKind::Unsupported,
            ..StructuredError::invalid(what, message)
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The part of the request that was wrong (e.g. `response_format.json_schema`).
    pub fn what(&self) -> &str {
        &self.what
    }
}
