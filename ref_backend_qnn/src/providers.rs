//! The provider tables and the two exported entry points.

use qnn_ffi::bindings as b;

use crate::backend::{
    backend_create, backend_free, backend_get_api_version, backend_get_build_id, device_create,
    device_free,
};
use crate::errors::error_get_message;
use crate::graph::{context_create_from_binary, context_free, graph_execute, graph_retrieve};
use crate::log::{log_create, log_free, log_set_level};
use crate::memory::{mem_deregister, mem_register};
use crate::state::guard;
use crate::system::{system_context_create, system_context_free, system_context_get_binary_info};
use crate::{BACKEND_API, BACKEND_ID, CORE_API, OK, PROVIDER_NAME, SYSTEM_API, code};

/// The provider followed by NULL entries, so that clients built against newer (longer)
/// tables that read past htpkv's table find NULL ("not supported") rather than garbage.
#[repr(C)]
struct PaddedProvider {
    provider: b::QnnInterface_t,
    _tail: [usize; 64],
}

#[repr(C)]
struct PaddedSystemProvider {
    provider: b::QnnSystemInterface_t,
    _tail: [usize; 32],
}

/// A static holding raw pointers (provider names, provider lists).
#[repr(transparent)]
struct Shared<T>(T);

// SAFETY: the wrapped values are immutable statics whose raw pointers point to other immutable
// statics (string literals, providers); sharing them between threads is sound.
unsafe impl<T> Sync for Shared<T> {}

/// A table of NULL entries.
const EMPTY_TABLE: b::HtpkvQnnInterface_t =
    // SAFETY: every field is an optional function pointer, for which all-zero bytes are None.
    unsafe { std::mem::zeroed() };

/// Providers live in statics (no heap), so unloading the library leaks nothing.
static CORE: Shared<PaddedProvider> = Shared(PaddedProvider {
    provider: b::QnnInterface_t {
        backendId: BACKEND_ID,
        providerName: PROVIDER_NAME.as_ptr(),
        apiVersion: b::Qnn_ApiVersion_t {
            coreApiVersion: b::Qnn_Version_t {
                major: CORE_API.0,
                minor: CORE_API.1,
                patch: CORE_API.2,
            },
            backendApiVersion: b::Qnn_Version_t {
                major: BACKEND_API.0,
                minor: BACKEND_API.1,
                patch: BACKEND_API.2,
            },
        },
        __bindgen_anon_1: b::QnnInterface_t__bindgen_ty_1 {
            htpkv: b::HtpkvQnnInterface_t {
                backendCreate: Some(backend_create),
                backendGetApiVersion: Some(backend_get_api_version),
                backendGetBuildId: Some(backend_get_build_id),
                backendFree: Some(backend_free),
                contextCreateFromBinary: Some(context_create_from_binary),
                contextFree: Some(context_free),
                graphRetrieve: Some(graph_retrieve),
                graphExecute: Some(graph_execute),
                logCreate: Some(log_create),
                logSetLogLevel: Some(log_set_level),
                logFree: Some(log_free),
                memRegister: Some(mem_register),
                memDeRegister: Some(mem_deregister),
                deviceCreate: Some(device_create),
                deviceFree: Some(device_free),
                errorGetMessage: Some(error_get_message),
                ..EMPTY_TABLE
            },
        },
    },
    _tail: [0; 64],
});

static CORE_LIST: Shared<[*const b::QnnInterface_t; 1]> = Shared([&CORE.0.provider]);

static SYSTEM: Shared<PaddedSystemProvider> = Shared(PaddedSystemProvider {
    provider: b::QnnSystemInterface_t {
        backendId: BACKEND_ID,
        providerName: PROVIDER_NAME.as_ptr(),
        systemApiVersion: b::Qnn_Version_t {
            major: SYSTEM_API.0,
            minor: SYSTEM_API.1,
            patch: SYSTEM_API.2,
        },
        __bindgen_anon_1: b::QnnSystemInterface_t__bindgen_ty_1 {
            htpkv: b::HtpkvQnnSystemInterface_t {
                systemContextCreate: Some(system_context_create),
                systemContextGetBinaryInfo: Some(system_context_get_binary_info),
                systemContextGetMetaData: None,
                systemContextFree: Some(system_context_free),
            },
        },
    },
    _tail: [0; 32],
});

static SYSTEM_LIST: Shared<[*const b::QnnSystemInterface_t; 1]> = Shared([&SYSTEM.0.provider]);

/// QNN core entry point: one provider, htpkv's reference backend.
///
/// # Safety
/// `list` and `count` must be NULL (rejected) or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnInterface_getProviders(
    list: *mut *mut *const b::QnnInterface_t,
    count: *mut u32,
) -> u64 {
    guard(|| {
        if list.is_null() || count.is_null() {
            return code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; the list is a static.
        unsafe {
            *list = CORE_LIST.0.as_ptr().cast_mut();
            *count = 1;
        }
        OK
    })
}

/// QNN system entry point: one provider describing htpkv compiled files.
///
/// # Safety
/// `list` and `count` must be NULL (rejected) or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnSystemInterface_getProviders(
    list: *mut *mut *const b::QnnSystemInterface_t,
    count: *mut u32,
) -> u64 {
    guard(|| {
        if list.is_null() || count.is_null() {
            return code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; the list is a static.
        unsafe {
            *list = SYSTEM_LIST.0.as_ptr().cast_mut();
            *count = 1;
        }
        OK
    })
}
