//! `logCreate`, `logSetLogLevel`, `logFree`.

use qnn_ffi::bindings as b;

use crate::state::{LogObj, as_handle, guard, key, state};
use crate::{OK, Rc, code};

pub(crate) unsafe extern "C" fn log_create(
    callback: b::QnnLog_Callback_t,
    level: u32,
    out: *mut b::Qnn_LogHandle_t,
) -> Rc {
    guard(|| {
        if out.is_null() || !(b::QNN_LOG_LEVEL_ERROR..=b::QNN_LOG_LEVEL_DEBUG).contains(&level) {
            return code(b::QNN_LOG_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        let id = s.fresh();
        s.logs.insert(id, LogObj { callback, level });
        // SAFETY: checked non-NULL; the caller provides a writable handle slot.
        unsafe { *out = as_handle(id) };
        OK
    })
}

pub(crate) unsafe extern "C" fn log_set_level(log: b::Qnn_LogHandle_t, level: u32) -> Rc {
    guard(|| {
        if !(b::QNN_LOG_LEVEL_ERROR..=b::QNN_LOG_LEVEL_DEBUG).contains(&level) {
            return code(b::QNN_LOG_ERROR_INVALID_ARGUMENT);
        }
        match state().logs.get_mut(&key(log)) {
            Some(l) => {
                l.level = level;
                OK
            }
            None => code(b::QNN_LOG_ERROR_INVALID_HANDLE),
        }
    })
}

pub(crate) unsafe extern "C" fn log_free(log: b::Qnn_LogHandle_t) -> Rc {
    guard(|| {
        let mut s = state();
        if s.logs.remove(&key(log)).is_none() {
            return code(b::QNN_LOG_ERROR_INVALID_HANDLE);
        }
        for backend in s.backends.values_mut() {
            if backend.log == Some(key(log)) {
                backend.log = None;
            }
        }
        s.compact();
        OK
    })
}
