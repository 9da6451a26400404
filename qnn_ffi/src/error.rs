//! Typed errors and the table of QNN error codes.

use std::path::PathBuf;

use crate::version::Version;

/// A provider found in a library, reported when none is compatible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderVersion {
    /// The provider's name, when it has one.
    pub name: Option<String>,
    /// The backend id it reports.
    pub backend_id: u32,
    /// Core API version (core providers) or system API version (system providers).
    pub api: Version,
}

impl std::fmt::Display for ProviderVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{name} (backend {}) API {}", self.backend_id, self.api),
            None => write!(f, "unnamed (backend {}) API {}", self.backend_id, self.api),
        }
    }
}

/// Everything that can go wrong in `qnn_ffi`.
#[derive(Debug, thiserror::Error)]
pub enum QnnError {
    /// The shared library could not be opened.
    #[error("cannot load QNN library {}: {reason}", path.display())]
    LibraryNotFound {
        /// The path that was tried.
        path: PathBuf,
        /// The dynamic loader's message.
        reason: String,
    },
    /// Neither an explicit path nor the environment variable names a library.
    #[error("no {what} library given: pass a path or set {env_var}")]
    NoLibraryPath {
        /// `backend` or `system`.
        what: &'static str,
        /// The environment variable that was consulted.
        env_var: &'static str,
    },
    /// The library does not export the provider entry point.
    #[error("{} does not export {symbol}: {reason}", path.display())]
    SymbolMissing {
        /// The library.
        path: PathBuf,
        /// The missing symbol.
        symbol: &'static str,
        /// The dynamic loader's message.
        reason: String,
    },
    /// No provider in the library has a compatible API version.
    #[error("{} has no compatible provider: found [{}], need {needed}",
        path.display(), found.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    NoCompatibleProvider {
        /// The library.
        path: PathBuf,
        /// Every provider it listed.
        found: Vec<ProviderVersion>,
        /// What htpkv needs, e.g. `core API 2.x with x >= 10`.
        needed: String,
    },
    /// A QNN call returned an error code.
    #[error("{function} failed: QNN error {code} {name}: {message}")]
    Qnn {
        /// The QNN function, e.g. `graphExecute`.
        function: &'static str,
        /// The error code (low 16 bits of the returned handle).
        code: u64,
        /// The code's symbolic name, `UNKNOWN` when htpkv does not declare it.
        name: &'static str,
        /// A description of the code (the backend's own message when it provides one).
        message: String,
    },
    /// `graphAddNode` refused an operation.
    #[error("graph `{graph}`: node `{node}` ({op})")]
    Node {
        /// The graph being composed.
        graph: String,
        /// The node's name.
        node: String,
        /// Its op type.
        op: String,
        /// The backend's error.
        #[source]
        source: Box<QnnError>,
    },
    /// The provider's function table has NULL where htpkv needs a function.
    #[error("the QNN provider of {} does not implement {function}", path.display())]
    FunctionMissing {
        /// The library.
        path: PathBuf,
        /// The table entry.
        function: &'static str,
    },
    /// A buffer bound to a tensor has the wrong size.
    #[error("tensor `{tensor}`: buffer has {found} bytes, the tensor needs {expected}")]
    TensorSize {
        /// Tensor name.
        tensor: String,
        /// Bytes the tensor's shape and type require.
        expected: usize,
        /// Bytes bound.
        found: usize,
    },
    /// The tensor description cannot be used (unknown type, size overflow, bad name).
    #[error("tensor `{tensor}`: {reason}")]
    InvalidTensor {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A memory registration request is inconsistent (offset outside the region, ...).
    #[error("memory registration: {reason}")]
    InvalidRegistration {
        /// What is wrong.
        reason: String,
    },
    /// A graph name is not in the context binary's metadata.
    #[error("graph `{name}` is not in the context binary (graphs: {available:?})")]
    UnknownGraph {
        /// The requested name.
        name: String,
        /// The graphs the binary has.
        available: Vec<String>,
    },
    /// The system library reported a struct version htpkv cannot read (binary info, graph info
    /// or tensor): reading it through another version's layout would give a silent wrong answer.
    #[error("context binary info: unknown {what} version {version} (htpkv reads {known})")]
    UnknownVersion {
        /// `binary info`, `graph info` or `tensor`.
        what: &'static str,
        /// The version field's value.
        version: u32,
        /// The versions htpkv reads, e.g. `1, 2, 3`.
        known: &'static str,
    },
    /// The system library returned metadata htpkv cannot read.
    #[error("context binary info: {reason}")]
    BinaryInfo {
        /// What is wrong.
        reason: String,
    },
    /// `libcdsprpc.so` (rpcmem) is not available on this machine.
    #[error("rpcmem is unavailable ({library}): {reason}")]
    RpcMemUnavailable {
        /// The library that was tried.
        library: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// rpcmem could not allocate.
    #[error("rpcmem_alloc of {bytes} bytes failed")]
    RpcMemAlloc {
        /// Requested size.
        bytes: usize,
    },
}

/// Symbolic name and description of a QNN error code (the low 16 bits of a `Qnn_ErrorHandle_t`),
/// `None` for codes htpkv does not declare. Codes shared by several components (e.g. 1000
/// "not supported") have one entry.
pub fn error_code_info(code: u64) -> Option<(&'static str, &'static str)> {
    Some(match code {
        0 => ("QNN_SUCCESS", "success"),
        1000 => (
            "QNN_COMMON_ERROR_NOT_SUPPORTED",
            "API or feature not supported by the backend",
        ),
        1002 => ("QNN_COMMON_ERROR_MEM_ALLOC", "memory allocation failed"),
        1003 => ("QNN_COMMON_ERROR_SYSTEM", "platform or OS service error"),
        1004 => (
            "QNN_COMMON_ERROR_INVALID_ARGUMENT",
            "invalid function argument",
        ),
        1005 => (
            "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED",
            "operation not permitted",
        ),
        1006 => (
            "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED",
            "platform not supported",
        ),
        1007 => (
            "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION",
            "communication with platform service failed",
        ),
        1008 => (
            "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES",
            "loaded libraries have incompatible versions",
        ),
        1009 => (
            "QNN_COMMON_ERROR_LOADING_BINARIES",
            "library already loaded in this process",
        ),
        1010 => (
            "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE",
            "resource unavailable",
        ),
        1100 => ("QNN_COMMON_ERROR_GENERAL", "unspecified error"),
        4000 => (
            "QNN_BACKEND_ERROR_CANNOT_INITIALIZE",
            "backend failed to initialize",
        ),
        4002 => (
            "QNN_BACKEND_ERROR_TERMINATE_FAILED",
            "backend failed to free its resources",
        ),
        4003 => (
            "QNN_BACKEND_ERROR_NOT_SUPPORTED",
            "backend does not support the request",
        ),
        4004 => (
            "QNN_BACKEND_ERROR_INVALID_ARGUMENT",
            "invalid backend argument",
        ),
        4005 => (
            "QNN_BACKEND_ERROR_OP_PACKAGE_NOT_FOUND",
            "op package not found",
        ),
        4006 => (
            "QNN_BACKEND_ERROR_OP_PACKAGE_IF_PROVIDER_NOT_FOUND",
            "op package interface provider not found",
        ),
        4007 => (
            "QNN_BACKEND_ERROR_OP_PACKAGE_REGISTRATION_FAILED",
            "op package registration failed",
        ),
        4008 => (
            "QNN_BACKEND_ERROR_OP_PACKAGE_UNSUPPORTED_VERSION",
            "op package version not supported",
        ),
        4009 => (
            "QNN_BACKEND_ERROR_OP_PACKAGE_DUPLICATE",
            "op already registered",
        ),
        4010 => (
            "QNN_BACKEND_ERROR_INCONSISTENT_CONFIG",
            "inconsistent backend configuration",
        ),
        4011 => ("QNN_BACKEND_ERROR_INVALID_HANDLE", "invalid backend handle"),
        4012 => (
            "QNN_BACKEND_ERROR_INVALID_CONFIG",
            "invalid backend configuration",
        ),
        5000 => (
            "QNN_CONTEXT_ERROR_INVALID_ARGUMENT",
            "invalid context argument",
        ),
        5001 => (
            "QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST",
            "context does not exist",
        ),
        5002 => ("QNN_CONTEXT_ERROR_INVALID_HANDLE", "invalid context handle"),
        5003 => (
            "QNN_CONTEXT_ERROR_NOT_FINALIZED",
            "context has graphs that are not finalized",
        ),
        5004 => (
            "QNN_CONTEXT_ERROR_BINARY_VERSION",
            "context binary has an incompatible version",
        ),
        5005 => (
            "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY",
            "cannot create the context from the binary",
        ),
        5006 => (
            "QNN_CONTEXT_ERROR_GET_BINARY_SIZE_FAILED",
            "cannot compute the context binary size",
        ),
        5007 => (
            "QNN_CONTEXT_ERROR_GET_BINARY_FAILED",
            "cannot serialize the context",
        ),
        5008 => (
            "QNN_CONTEXT_ERROR_BINARY_CONFIGURATION",
            "invalid context binary configuration",
        ),
        5009 => ("QNN_CONTEXT_ERROR_SET_PROFILE", "cannot set the profile"),
        5010 => (
            "QNN_CONTEXT_ERROR_INVALID_CONFIG",
            "invalid context configuration",
        ),
        6000 => ("QNN_GRAPH_ERROR_INVALID_ARGUMENT", "invalid graph argument"),
        6001 => ("QNN_GRAPH_ERROR_INVALID_HANDLE", "invalid graph handle"),
        6002 => (
            "QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST",
            "no graph with that name in the context",
        ),
        6003 => (
            "QNN_GRAPH_ERROR_INVALID_NAME",
            "invalid or duplicate graph name",
        ),
        6004 => ("QNN_GRAPH_ERROR_INVALID_TENSOR", "invalid or NULL tensor"),
        6005 => (
            "QNN_GRAPH_ERROR_INVALID_OP_CONFIG",
            "invalid op configuration",
        ),
        6006 => ("QNN_GRAPH_ERROR_SET_PROFILE", "cannot set the profile"),
        6007 => (
            "QNN_GRAPH_ERROR_UNCONNECTED_NODE",
            "node added before its inputs",
        ),
        6020 => ("QNN_GRAPH_ERROR_CREATE_FAILED", "graph creation failed"),
        6021 => (
            "QNN_GRAPH_ERROR_OPTIMIZATION_FAILED",
            "graph optimization failed",
        ),
        6022 => ("QNN_GRAPH_ERROR_FINALIZE_FAILED", "graph finalize failed"),
        6023 => (
            "QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED",
            "graph executed before finalize",
        ),
        6024 => (
            "QNN_GRAPH_ERROR_GRAPH_FINALIZED",
            "graph modified after finalize",
        ),
        6025 => (
            "QNN_GRAPH_ERROR_EXECUTION_ASYNC_FIFO_FULL",
            "async execution queue full",
        ),
        6030 => ("QNN_GRAPH_ERROR_SIGNAL_IN_USE", "signal already in use"),
        6031 => ("QNN_GRAPH_ERROR_ABORTED", "execution aborted by a signal"),
        6032 => (
            "QNN_GRAPH_ERROR_PROFILE_IN_USE",
            "profile handle already bound to a graph",
        ),
        6033 => ("QNN_GRAPH_ERROR_TIMED_OUT", "execution timed out"),
        6034 => (
            "QNN_GRAPH_ERROR_SUBGRAPH",
            "operation not permitted on a subgraph",
        ),
        6035 => ("QNN_GRAPH_ERROR_DISABLED", "graph is not enabled"),
        8000 => (
            "QNN_MEM_ERROR_INVALID_ARGUMENT",
            "invalid memory registration argument",
        ),
        8001 => ("QNN_MEM_ERROR_INVALID_HANDLE", "invalid memory handle"),
        8002 => (
            "QNN_MEM_ERROR_ALREADY_REGISTERED",
            "memory already registered",
        ),
        8003 => ("QNN_MEM_ERROR_MAPPING", "cannot map the memory"),
        8004 => (
            "QNN_MEM_ERROR_INVALID_SHAPE",
            "memory shape not supported by the backend",
        ),
        8005 => (
            "QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE",
            "memory type not supported by the backend",
        ),
        11002 => (
            "QNN_LOG_ERROR_INITIALIZATION",
            "logging could not be initialized",
        ),
        11003 => ("QNN_LOG_ERROR_INVALID_ARGUMENT", "invalid log argument"),
        11004 => ("QNN_LOG_ERROR_INVALID_HANDLE", "invalid log handle"),
        30000 => (
            "QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE",
            "invalid system context handle",
        ),
        30001 => (
            "QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT",
            "invalid system context argument",
        ),
        30002 => (
            "QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED",
            "system context operation failed",
        ),
        30010 => (
            "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY",
            "malformed context binary",
        ),
        _ => return None,
    })
}

/// Every error code [`error_code_info`] knows (for tests and documentation).
pub const DECLARED_ERROR_CODES: &[u64] = &[
    0, 1000, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1100, 4000, 4002, 4003, 4004,
    4005, 4006, 4007, 4008, 4009, 4010, 4011, 4012, 5000, 5001, 5002, 5003, 5004, 5005, 5006, 5007,
    5008, 5009, 5010, 6000, 6001, 6002, 6003, 6004, 6005, 6006, 6007, 6020, 6021, 6022, 6023, 6024,
    6025, 6030, 6031, 6032, 6033, 6034, 6035, 8000, 8001, 8002, 8003, 8004, 8005, 11002, 11003,
    11004, 30000, 30001, 30002, 30010,
];

/// Builds [`QnnError::Qnn`] for a failed call, from the raw handle returned by `function`.
/// `backend_message` is the backend's own message for the code, when it offered one.
pub fn qnn_error(function: &'static str, handle: u64, backend_message: Option<String>) -> QnnError {
    let code = handle & u64::from(crate::bindings::HTPKV_QNN_ERROR_CODE_MASK);
    let (name, description) =
        error_code_info(code).unwrap_or(("UNKNOWN", "error code not declared by htpkv"));
    // Backends often start their message with the code's name; say it once.
    let message = backend_message.map(|m| match m.strip_prefix(name) {
        Some(rest) => rest.trim_start_matches([':', ' ']).to_string(),
        None => m,
    });
    QnnError::Qnn {
        function,
        code,
        name,
        message: message.unwrap_or_else(|| description.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_message_that_repeats_the_name_is_said_once() {
        let e = qnn_error(
            "memRegister",
            8005,
            Some("QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE: no".into()),
        );
        assert_eq!(
            e.to_string(),
            "memRegister failed: QNN error 8005 QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE: no"
        );
    }

    #[test]
    fn every_declared_code_has_a_distinct_name() {
        let mut names = std::collections::HashSet::new();
        for &code in DECLARED_ERROR_CODES {
            let (name, message) = error_code_info(code).expect("declared code has info");
            assert!(name.starts_with("QNN_"), "{name}");
            assert!(!message.is_empty());
            assert!(names.insert(name), "duplicate name {name}");
        }
        assert_eq!(error_code_info(4001), None);
        assert_eq!(error_code_info(65535), None);
    }

    #[test]
    fn header_constants_agree_with_the_table() {
        use crate::bindings as b;
        let pairs: &[(u32, &str)] = &[
            (
                b::QNN_COMMON_ERROR_INVALID_ARGUMENT,
                "QNN_COMMON_ERROR_INVALID_ARGUMENT",
            ),
            (
                b::QNN_BACKEND_ERROR_INVALID_HANDLE,
                "QNN_BACKEND_ERROR_INVALID_HANDLE",
            ),
            (
                b::QNN_CONTEXT_ERROR_CREATE_FROM_BINARY,
                "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY",
            ),
            (
                b::QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST,
                "QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST",
            ),
            (
                b::QNN_GRAPH_ERROR_INVALID_TENSOR,
                "QNN_GRAPH_ERROR_INVALID_TENSOR",
            ),
            (
                b::QNN_MEM_ERROR_INVALID_HANDLE,
                "QNN_MEM_ERROR_INVALID_HANDLE",
            ),
            (
                b::QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY,
                "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY",
            ),
        ];
        for &(code, name) in pairs {
            assert_eq!(error_code_info(u64::from(code)).map(|i| i.0), Some(name));
        }
    }

    #[test]
    fn qnn_error_masks_the_low_16_bits() {
        match qnn_error("graphExecute", (7u64 << 32) | 6004, None) {
            QnnError::Qnn {
                code,
                name,
                function,
                ..
            } => {
                assert_eq!(code, 6004);
                assert_eq!(name, "QNN_GRAPH_ERROR_INVALID_TENSOR");
                assert_eq!(function, "graphExecute");
            }
            other => panic!("unexpected {other:?}"),
        }
        let unknown = qnn_error("x", 4001, None).to_string();
        assert!(unknown.contains("UNKNOWN"), "{unknown}");
    }
}
