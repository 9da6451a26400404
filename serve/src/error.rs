//! The one error type of the server: a kind that picks the HTTP status, a message for the client,
//! the request field at fault and, when there is one, the error that caused it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What went wrong, from the client's point of view; each kind has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A malformed or out-of-range request (400).
    BadRequest,
    /// A request field the server understands but cannot honour yet (400).
    Unsupported,
    /// The prompt, or prompt plus `max_tokens`, does not fit the context (400).
    ContextLength,
    /// No such route (404).
    NotFound,
    /// The route does not take this method (405).
    MethodNotAllowed,
    /// The client did not send its request in time (408).
    Timeout,
    /// The request body is larger than the server takes (413).
    TooLarge,
    /// Every session is busy and the queue is full (429).
    QueueFull,
    /// The server is shutting down (503).
    ShuttingDown,
    /// The engine failed (500).
    Internal,
}

impl ErrorKind {
    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::BadRequest | ErrorKind::Unsupported | ErrorKind::ContextLength => {
                StatusCode::BAD_REQUEST
            }
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error body's `type` (OpenAI's names where it has one).
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::BadRequest
            | ErrorKind::ContextLength
            | ErrorKind::TooLarge
            | ErrorKind::MethodNotAllowed
            | ErrorKind::Timeout => "invalid_request_error",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::QueueFull => "rate_limit_error",
            ErrorKind::ShuttingDown => "service_unavailable",
            ErrorKind::Internal => "server_error",
        }
    }

    /// The error body's `code`.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ContextLength => "context_length_exceeded",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::Timeout => "request_timeout",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::QueueFull => "queue_full",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An error answered to the client as `{"error":{"message","type","param","code"}}`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ApiError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            source: None,
        }
    }

    /// A 400 about the field `param`.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::BadRequest, message).with_param(param)
    }

    /// Names the request field at fault.
    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_owned());
        self
    }

    /// Keeps `source` as the cause.
    pub fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> ApiError {
        self.source = Some(Box::new(source));
        self
    }

    /// The engine's error: a bad option or a full context is the request's fault (400), the rest
    /// the server's (500). The message names the cause.
    pub fn from_engine(error: htpkv::engine::EngineError) -> ApiError {
        let kind = match error.kind() {
            "bad_option" | "constraint" => ErrorKind::BadRequest,
            "context_full" => ErrorKind::ContextLength,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, format!("generation failed: {error}")).with_source(error)
    }

    /// The JSON error body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind.type_name(),
                "param": self.param,
                "code": self.kind.code(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.kind.status(), axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_status_and_the_body_has_openai_fields() {
        let statuses = [
            (ErrorKind::BadRequest, 400),
            (ErrorKind::Unsupported, 400),
            (ErrorKind::ContextLength, 400),
            (ErrorKind::NotFound, 404),
            (ErrorKind::MethodNotAllowed, 405),
            (ErrorKind::Timeout, 408),
            (ErrorKind::TooLarge, 413),
            (ErrorKind::QueueFull, 429),
            (ErrorKind::ShuttingDown, 503),
            (ErrorKind::Internal, 500),
        ];
        for (kind, status) in statuses {
            assert_eq!(kind.status().as_u16(), status, "{kind:?}");
        }
        let e = ApiError::bad_param("stop", "too many");
        let body = e.body();
        assert_eq!(body["error"]["message"], "too many");
        assert_eq!(body["error"]["param"], "stop");
        assert_eq!(body["error"]["code"], "bad_request");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn the_cause_is_the_source() {
        let io = std::io::Error::other("disk");
        let e = ApiError::new(ErrorKind::Internal, "failed").with_source(io);
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "disk");
    }
}
