//! The errors that cross into Java.

use htpkv::engine::EngineError;

/// Kind of a use of a closed session, of a handle that was never issued, or of handle 0.
pub const KIND_CLOSED: &str = "closed";
/// Kind of a call on a session that another thread is using at the same moment.
pub const KIND_BUSY: &str = "busy";
/// Kind of an argument the glue itself refuses (before the engine sees it).
pub const KIND_BAD_OPTION: &str = "bad_option";
/// Kind of a Rust panic caught at the JNI boundary.
pub const KIND_PANIC: &str = "panic";
/// Kind of a session whose last call panicked while holding it: its state is unknown, close it.
pub const KIND_POISONED: &str = "poisoned";
/// Kind of a failure of the JNI layer itself (a missing class, a bad signature, ...).
pub const KIND_JNI: &str = "jni";
/// A session file that cannot be restored (not a session, corrupted, another model or geometry).
pub const KIND_BAD_SESSION: &str = "bad_session";

/// What a native entry point reports instead of a value.
///
/// The error policy turns `Htpkv` into a thrown `org.htpkv.HtpkvException(kind, message)`;
/// `JavaPending` means a Java exception is already pending (thrown by the token callback, or by a
/// JNI call) and is left to propagate as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlueError {
    /// An error with a stable, machine-readable `kind` (see the `KIND_*` constants and
    /// `EngineError::kind`) and a message for people.
    #[error("{kind}: {message}")]
    Htpkv {
        /// Stable error kind, e.g. `closed`, `busy`, `bad_option`, `model_not_found`.
        kind: &'static str,
        /// What went wrong, naming what was expected.
        message: String,
    },
    /// A Java exception is pending and must reach the caller unchanged.
    #[error("a Java exception is pending")]
    JavaPending,
}

impl GlueError {
    /// An error of the given kind.
    pub fn new(kind: &'static str, message: impl Into<String>) -> GlueError {
        GlueError::Htpkv {
            kind,
            message: message.into(),
        }
    }

    /// A `bad_option` error.
    pub fn bad_option(message: impl Into<String>) -> GlueError {
        GlueError::new(KIND_BAD_OPTION, message)
    }

    /// The kind (`"java_exception"` for a pending Java exception).
    pub fn kind(&self) -> &'static str {
        match self {
            GlueError::Htpkv { kind, .. } => kind,
            GlueError::JavaPending => "java_exception",
        }
    }
}

/// The message of `err` followed by those of its sources that it does not already contain.
pub fn describe(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

impl From<EngineError> for GlueError {
    fn from(err: EngineError) -> GlueError {
        GlueError::new(err.kind(), describe(&err))
    }
}

impl From<htpkv::persist::PersistError> for GlueError {
    fn from(err: htpkv::persist::PersistError) -> GlueError {
        GlueError::new(err.kind(), describe(&err))
    }
}

impl From<jni::errors::Error> for GlueError {
    fn from(err: jni::errors::Error) -> GlueError {
        match err {
            jni::errors::Error::JavaException => GlueError::JavaPending,
            other => GlueError::new(KIND_JNI, describe(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn describe_appends_sources_once() {
        let err = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file",
        ));
        assert_eq!(describe(&err), "outer failed: no such file");
        let io = std::io::Error::other("plain");
        assert_eq!(describe(&io), "plain");
    }

    #[test]
    fn jni_errors_map_to_pending_or_jni_kind() {
        assert_eq!(
            GlueError::from(jni::errors::Error::JavaException),
            GlueError::JavaPending
        );
        let e = GlueError::from(jni::errors::Error::NullPtr("callback"));
        assert_eq!(e.kind(), KIND_JNI);
        assert!(e.to_string().contains("callback"), "{e}");
    }
}
