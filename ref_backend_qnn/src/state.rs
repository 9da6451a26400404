//! The library's state: every object a client holds a handle to, in tables behind one mutex;
//! handles are opaque integers looked up in them, never dereferenced.

use std::collections::HashMap;

use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use qnn_ffi::OwnedRawTensor;
use qnn_ffi::bindings as b;
use ref_backend::CompiledModel;

use crate::{Rc, code};

#[derive(Debug)]
pub(crate) struct LogObj {
    pub(crate) callback: b::QnnLog_Callback_t,
    pub(crate) level: u32,
}

#[derive(Debug)]
pub(crate) struct BackendObj {
    pub(crate) log: Option<usize>,
}

#[derive(Debug)]
pub(crate) struct ContextObj {
    pub(crate) backend: usize,
    pub(crate) model: Arc<CompiledModel>,
}

#[derive(Debug)]
pub(crate) struct GraphObj {
    pub(crate) context: usize,
    pub(crate) index: usize,
}

#[derive(Debug)]
pub(crate) struct MemObj {
    pub(crate) context: usize,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// A mapping made for this registration, unmapped at deregistration.
    pub(crate) mapping: Option<(*mut c_void, usize)>,
}

/// Binary info handed out by `systemContextGetBinaryInfo`; every pointer inside `info` points
/// into the boxed/heap parts of this value, which never move while it lives.
pub(crate) struct SysInfo {
    pub(crate) _owned: Vec<OwnedRawTensor>,
    pub(crate) _tensors: Vec<Vec<b::Qnn_Tensor_t>>,
    pub(crate) _names: Vec<CString>,
    pub(crate) _blobs: Vec<b::QnnHtpSystemContext_GraphBlobInfo_t>,
    pub(crate) _graphs: Vec<b::QnnSystemContext_GraphInfo_t>,
    pub(crate) info: Box<b::QnnSystemContext_BinaryInfo_t>,
}

#[derive(Default)]
pub(crate) struct SysCtxObj {
    pub(crate) infos: Vec<SysInfo>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) next: usize,
    pub(crate) logs: HashMap<usize, LogObj>,
    pub(crate) backends: HashMap<usize, BackendObj>,
    pub(crate) devices: HashMap<usize, ()>,
    pub(crate) contexts: HashMap<usize, ContextObj>,
    pub(crate) graphs: HashMap<usize, GraphObj>,
    pub(crate) mems: HashMap<usize, MemObj>,
    pub(crate) sys: HashMap<usize, SysCtxObj>,
}

// SAFETY: the raw pointers in `State` (registered memory, mappings, binary-info storage) are
// plain addresses owned by the client or by this state; the state is only ever accessed under
// the global mutex, so moving it between threads is sound.
unsafe impl Send for State {}

impl State {
    /// A fresh opaque handle value: small multiples of 16 offset from a base, never 0.
    pub(crate) fn fresh(&mut self) -> usize {
        self.next += 1;
        0x7e57_0000 + self.next * 16
    }

    /// Releases the tables' heap memory once every object is gone: the library may be
    /// unloaded afterwards (dlclose), and memory still owned by its statics would leak.
    pub(crate) fn compact(&mut self) {
        if self.logs.is_empty()
            && self.backends.is_empty()
            && self.devices.is_empty()
            && self.contexts.is_empty()
            && self.graphs.is_empty()
            && self.mems.is_empty()
            && self.sys.is_empty()
        {
            let next = self.next;
            *self = State {
                next,
                ..State::default()
            };
        }
    }

    pub(crate) fn emit(&self, backend: Option<usize>, level: u32, msg: &str) {
        let log = backend
            .and_then(|b| self.backends.get(&b))
            .and_then(|b| b.log)
            .and_then(|l| self.logs.get(&l));
        let Some(log) = log else { return };
        let Some(cb) = log.callback else { return };
        if level > log.level {
            return;
        }
        let Ok(fmt) = CString::new(msg.replace('%', "%%")) else {
            return;
        };
        // A zeroed block the size of a va_list: the format has no conversions, so the callee
        // never reads arguments from it, but copying it (va_copy) stays within valid memory.
        let mut dummy_va = [0u64; 8];
        // SAFETY: `cb` is the client's callback with the QnnLog_Callback_t ABI; `fmt` is a
        // NUL-terminated format without conversion specifiers.
        unsafe { cb(fmt.as_ptr(), level, 0, dummy_va.as_mut_ptr().cast()) };
    }
}

pub(crate) fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| Mutex::new(State::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Runs an export body, turning a panic into `QNN_COMMON_ERROR_GENERAL`.
pub(crate) fn guard(f: impl FnOnce() -> Rc) -> Rc {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or(code(b::QNN_COMMON_ERROR_GENERAL))
}

pub(crate) fn key(h: *mut c_void) -> usize {
    h as usize
}

pub(crate) fn as_handle(k: usize) -> *mut c_void {
    k as *mut c_void
}
