//! `errorGetMessage`: this backend's message for each error code it returns.

use std::ffi::{CStr, c_char};
use std::sync::OnceLock;

use qnn_ffi::bindings as b;
use qnn_ffi::error_code_info;

use crate::state::guard;

use crate::{OK, Rc, code};

/// This backend's explanation of each code it returns; the code's symbolic name comes from
/// `qnn_ffi`'s table ([`qnn_ffi::error_code_info`]), the one QNN error table of the workspace.
const DETAILS: [(u32, &str); 23] = [
    (
        b::QNN_COMMON_ERROR_NOT_SUPPORTED,
        "not supported by the htpkv reference backend",
    ),
    (
        b::QNN_COMMON_ERROR_INVALID_ARGUMENT,
        "invalid argument (htpkv reference backend)",
    ),
    (
        b::QNN_COMMON_ERROR_GENERAL,
        "internal error (htpkv reference backend)",
    ),
    (
        b::QNN_BACKEND_ERROR_INVALID_ARGUMENT,
        "invalid argument (htpkv reference backend)",
    ),
    (
        b::QNN_BACKEND_ERROR_INVALID_HANDLE,
        "unknown backend handle (htpkv reference backend)",
    ),
    (
        b::QNN_CONTEXT_ERROR_INVALID_ARGUMENT,
        "invalid argument (htpkv reference backend)",
    ),
    (
        b::QNN_CONTEXT_ERROR_INVALID_HANDLE,
        "unknown context, backend or device handle (htpkv reference backend)",
    ),
    (
        b::QNN_CONTEXT_ERROR_CREATE_FROM_BINARY,
        "not a valid htpkv compiled file (htpkv reference backend)",
    ),
    (
        b::QNN_GRAPH_ERROR_INVALID_ARGUMENT,
        "wrong tensor counts, NULL arrays or overlapping outputs (htpkv reference backend)",
    ),
    (
        b::QNN_GRAPH_ERROR_INVALID_HANDLE,
        "unknown graph or context handle (htpkv reference backend)",
    ),
    (
        b::QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST,
        "no graph with that name in the context (htpkv reference backend)",
    ),
    (
        b::QNN_GRAPH_ERROR_INVALID_TENSOR,
        "a tensor does not match the graph (name, type, shape or size) (htpkv reference backend)",
    ),
    (
        b::QNN_MEM_ERROR_INVALID_ARGUMENT,
        "invalid memory descriptor (htpkv reference backend)",
    ),
    (
        b::QNN_MEM_ERROR_INVALID_HANDLE,
        "unknown memory or context handle (htpkv reference backend)",
    ),
    (
        b::QNN_MEM_ERROR_MAPPING,
        "cannot map the file descriptor (htpkv reference backend)",
    ),
    (
        b::QNN_MEM_ERROR_INVALID_SHAPE,
        "invalid memory shape (htpkv reference backend)",
    ),
    (
        b::QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE,
        "unsupported memory type (htpkv reference backend)",
    ),
    (
        b::QNN_LOG_ERROR_INVALID_ARGUMENT,
        "invalid log argument (htpkv reference backend)",
    ),
    (
        b::QNN_LOG_ERROR_INVALID_HANDLE,
        "unknown log handle (htpkv reference backend)",
    ),
    (
        b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE,
        "unknown system context handle (htpkv reference backend)",
    ),
    (
        b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT,
        "invalid argument (htpkv reference backend)",
    ),
    (
        b::QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED,
        "cannot describe the binary (htpkv reference backend)",
    ),
    (
        b::QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY,
        "not a valid htpkv compiled file (htpkv reference backend)",
    ),
];

/// Longest message, terminating NUL included (longer ones are cut).
const MESSAGE_BYTES: usize = 192;

/// `{name}: {detail}` as a NUL-terminated string in a fixed buffer.
fn compose(code: u32, detail: &str) -> [u8; MESSAGE_BYTES] {
    let name = error_code_info(u64::from(code)).map_or("UNKNOWN", |(name, _)| name);
    let text = format!("{name}: {detail}");
    let mut out = [0u8; MESSAGE_BYTES];
    let n = text.len().min(MESSAGE_BYTES - 1);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

/// The backend's message for an error code. The messages live in a static made once, not on the
/// heap: the library may be unloaded while a client holds none of its memory, and nothing of it
/// may leak then.
fn message(code: u64) -> Option<&'static CStr> {
    static MESSAGES: OnceLock<[[u8; MESSAGE_BYTES]; DETAILS.len()]> = OnceLock::new();
    let i = DETAILS.iter().position(|&(c, _)| u64::from(c) == code)?;
    let all = MESSAGES.get_or_init(|| DETAILS.map(|(c, detail)| compose(c, detail)));
    CStr::from_bytes_until_nul(&all[i]).ok()
}

pub(crate) unsafe extern "C" fn error_get_message(handle: u64, out: *mut *const c_char) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT);
        }
        match message(handle & 0xFFFF) {
            Some(m) => {
                // SAFETY: checked non-NULL; the string is static.
                unsafe { *out = m.as_ptr() };
                OK
            }
            None => code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_names_its_code_as_qnn_ffi_does() {
        for (c, detail) in DETAILS {
            let (name, _) = error_code_info(u64::from(c)).expect("a declared code");
            let m = message(u64::from(c)).unwrap().to_str().unwrap();
            assert_eq!(m, format!("{name}: {detail}"));
        }
        assert!(message(1).is_none());
    }
}
