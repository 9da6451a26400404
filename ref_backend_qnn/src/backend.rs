//! `backendCreate`, `backendGetApiVersion`, `backendGetBuildId`, `backendFree`, `deviceCreate`,
//! `deviceFree`.

use std::ffi::c_char;

use qnn_ffi::bindings as b;

use crate::memory::unmap;
use crate::state::{BackendObj, State, as_handle, guard, key, state};
use crate::{BACKEND_API, BUILD_ID, CORE_API, OK, Rc, code};

pub(crate) unsafe extern "C" fn backend_create(
    log: b::Qnn_LogHandle_t,
    _config: *mut *const b::QnnBackend_Config_t,
    out: *mut b::Qnn_BackendHandle_t,
) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_BACKEND_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        let log = if log.is_null() {
            None
        } else if s.logs.contains_key(&key(log)) {
            Some(key(log))
        } else {
            return code(b::QNN_BACKEND_ERROR_INVALID_HANDLE);
        };
        let id = s.fresh();
        s.backends.insert(id, BackendObj { log });
        s.emit(
            Some(id),
            b::QNN_LOG_LEVEL_INFO,
            "htpkv reference backend created",
        );
        // SAFETY: checked non-NULL; writable per the API contract.
        unsafe { *out = as_handle(id) };
        OK
    })
}

pub(crate) unsafe extern "C" fn backend_get_api_version(out: *mut b::Qnn_ApiVersion_t) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_BACKEND_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; writable per the API contract.
        unsafe { *out = api_version() };
        OK
    })
}

pub(crate) unsafe extern "C" fn backend_get_build_id(out: *mut *const c_char) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_BACKEND_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; the string is static.
        unsafe { *out = BUILD_ID.as_ptr() };
        OK
    })
}

/// Removes a context and everything registered on it (graphs, memory).
pub(crate) fn drop_context(s: &mut State, ctx: usize) {
    s.contexts.remove(&ctx);
    s.graphs.retain(|_, g| g.context != ctx);
    let mems: Vec<usize> = s
        .mems
        .iter()
        .filter(|(_, m)| m.context == ctx)
        .map(|(k, _)| *k)
        .collect();
    for m in mems {
        if let Some(mem) = s.mems.remove(&m) {
            unmap(mem.mapping);
        }
    }
}

pub(crate) unsafe extern "C" fn backend_free(backend: b::Qnn_BackendHandle_t) -> Rc {
    guard(|| {
        let mut s = state();
        if s.backends.remove(&key(backend)).is_none() {
            return code(b::QNN_BACKEND_ERROR_INVALID_HANDLE);
        }
        let contexts: Vec<usize> = s
            .contexts
            .iter()
            .filter(|(_, c)| c.backend == key(backend))
            .map(|(k, _)| *k)
            .collect();
        for c in contexts {
            drop_context(&mut s, c);
        }
        s.compact();
        OK
    })
}

pub(crate) unsafe extern "C" fn device_create(
    _log: b::Qnn_LogHandle_t,
    _config: *mut *const b::QnnDevice_Config_t,
    out: *mut b::Qnn_DeviceHandle_t,
) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        let id = s.fresh();
        s.devices.insert(id, ());
        // SAFETY: checked non-NULL.
        unsafe { *out = as_handle(id) };
        OK
    })
}

pub(crate) unsafe extern "C" fn device_free(device: b::Qnn_DeviceHandle_t) -> Rc {
    guard(|| {
        let mut s = state();
        match s.devices.remove(&key(device)) {
            Some(()) => {
                s.compact();
                OK
            }
            None => code(b::QNN_COMMON_ERROR_INVALID_ARGUMENT),
        }
    })
}

pub(crate) fn version(v: (u32, u32, u32)) -> b::Qnn_Version_t {
    b::Qnn_Version_t {
        major: v.0,
        minor: v.1,
        patch: v.2,
    }
}

pub(crate) fn api_version() -> b::Qnn_ApiVersion_t {
    b::Qnn_ApiVersion_t {
        coreApiVersion: version(CORE_API),
        backendApiVersion: version(BACKEND_API),
    }
}
