//! htpkv's reference backend as a QNN backend library: `libhtpkv_ref_qnn.so` exports
//! `QnnInterface_getProviders` and `QnnSystemInterface_getProviders`, so the whole FFI path
//! (dlopen, provider table, context binary, tensors, memory registration with offsets,
//! execute) runs on a desktop exactly as it does with `libQnnHtp.so` + `libQnnSystem.so`.
//!
//! # What it implements
//! Core provider (core API 2.20.0, backend id [`BACKEND_ID`], name `htpkv_ref`): `logCreate`,
//! `logSetLogLevel`, `logFree`, `backendCreate`, `backendGetApiVersion`, `backendGetBuildId`,
//! `backendFree`, `deviceCreate`, `deviceFree`, `contextCreateFromBinary` (the binary is
//! htpkv's compiled file, [`ref_backend::CompiledModel::from_bytes`]), `contextFree`,
//! `graphRetrieve`, `graphExecute`, `memRegister`, `memDeRegister`, `errorGetMessage`. Every
//! other entry is NULL ("not supported", as the ABI allows). System provider (system API
//! 1.1.0): `systemContextCreate`, `systemContextGetBinaryInfo`, `systemContextFree`.
//!
//! # Memory registration
//! `memRegister` accepts three descriptors, each giving the tensor's bytes as
//! `memShape` × `dataType`:
//! - `QNN_MEM_TYPE_CUSTOM` with a `QnnMemHtp_Descriptor_t` of type `QNN_HTP_MEM_SHARED_BUFFER`
//!   (HTP's fd + offset form): the backend maps the fd (`mmap`, shared) and uses the bytes at
//!   `offset`; on Linux a `memfd` works. The mapping is released at `memDeRegister`.
//! - `QNN_MEM_TYPE_CUSTOM` with an `HtpkvRefMem_HostDescriptor_t` (htpkv extension, told apart
//!   by its magic first field): host memory by address — the desktop KV region, which has no fd.
//!   Refused in strict mode ([`STRICT_ENV`]), as a real HTP backend refuses it.
//!
//! # Binary info layouts
//! `systemContextGetBinaryInfo` answers with binary info V3, graph info V3 (with HTP-style graph
//! blob info giving each graph's scratch size as its spill-fill size) and tensors V2, as current
//! SDKs do; [`LAYOUT_ENV`] asks for V2 or V1 instead.
//! - `QNN_MEM_TYPE_ION` with an fd: the fd is mapped from offset 0.
//!
//! # Robustness
//! Every export validates its arguments (NULL pointers, versions, sizes, unknown handles —
//! handles are opaque integers looked up in tables, never dereferenced) and returns a QNN error
//! code; panics are caught at every export and reported as `QNN_COMMON_ERROR_GENERAL`. Tensor
//! buffers must not overlap outputs (checked). State lives behind one mutex, so calls are
//! serialized; log callbacks are invoked with that mutex held and must not call back into the
//! library.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use qnn_ffi::bindings as b;
use qnn_ffi::{OwnedRawTensor, Quantization, TensorInfo, TensorType, dtype_to_qnn, qnn_dtype_size};
use ref_backend::{CompiledModel, IoRole, IoTensor, Preset};

/// Backend id reported by the provider and in binary info ("HTKV").
pub const BACKEND_ID: u32 = 0x4854_4B56;
/// Provider name.
pub const PROVIDER_NAME: &CStr = c"htpkv_ref";
/// Core API version the provider reports.
pub const CORE_API: (u32, u32, u32) = (2, 20, 0);
/// The backend's own API version.
pub const BACKEND_API: (u32, u32, u32) = (0, 1, 0);
/// System API version the system provider reports.
pub const SYSTEM_API: (u32, u32, u32) = (1, 1, 0);
const BUILD_ID: &CStr = c"htpkv-ref-qnn 0.1.0";
/// Version reported for the context blob (htpkv's compiled-file format).
const CONTEXT_BLOB_VERSION: (u32, u32, u32) = (ref_backend::FORMAT_VERSION, 0, 0);

type Rc = u64;
const OK: Rc = 0;

fn code(c: u32) -> Rc {
    u64::from(c)
}

// ------------------------------------------------------------------------------------------
// State
// ------------------------------------------------------------------------------------------

#[derive(Debug)]
struct LogObj {
    callback: b::QnnLog_Callback_t,
    level: u32,
}

#[derive(Debug)]
struct BackendObj {
    log: Option<usize>,
}

#[derive(Debug)]
struct ContextObj {
    backend: usize,
    model: Arc<CompiledModel>,
}

#[derive(Debug)]
struct GraphObj {
    context: usize,
    index: usize,
}

#[derive(Debug)]
struct MemObj {
    context: usize,
    ptr: *mut u8,
    len: usize,
    /// A mapping made for this registration, unmapped at deregistration.
    mapping: Option<(*mut c_void, usize)>,
}

/// Binary info handed out by `systemContextGetBinaryInfo`; every pointer inside `info` points
/// into the boxed/heap parts of this value, which never move while it lives.
struct SysInfo {
    _owned: Vec<OwnedRawTensor>,
    _tensors: Vec<Vec<b::Qnn_Tensor_t>>,
    _names: Vec<CString>,
    _blobs: Vec<b::QnnHtpSystemContext_GraphBlobInfo_t>,
    _graphs: Vec<b::QnnSystemContext_GraphInfo_t>,
    info: Box<b::QnnSystemContext_BinaryInfo_t>,
}

#[derive(Default)]
struct SysCtxObj {
    infos: Vec<SysInfo>,
}

#[derive(Default)]
struct State {
    next: usize,
    logs: HashMap<usize, LogObj>,
    backends: HashMap<usize, BackendObj>,
    devices: HashMap<usize, ()>,
    contexts: HashMap<usize, ContextObj>,
    graphs: HashMap<usize, GraphObj>,
    mems: HashMap<usize, MemObj>,
    sys: HashMap<usize, SysCtxObj>,
}

// SAFETY: the raw pointers in `State` (registered memory, mappings, binary-info storage) are
// plain addresses owned by the client or by this state; the state is only ever accessed under
// the global mutex, so moving it between threads is sound.
unsafe impl Send for State {}

impl State {
    /// A fresh opaque handle value: small multiples of 16 offset from a base, never 0.
    fn fresh(&mut self) -> usize {
        self.next += 1;
        0x7e57_0000 + self.next * 16
    }

    /// Releases the tables' heap memory once every object is gone: the library may be
    /// unloaded afterwards (dlclose), and memory still owned by its statics would leak.
    fn compact(&mut self) {
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

    fn emit(&self, backend: Option<usize>, level: u32, msg: &str) {
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

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| Mutex::new(State::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Runs an export body, turning a panic into `QNN_COMMON_ERROR_GENERAL`.
fn guard(f: impl FnOnce() -> Rc) -> Rc {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or(code(b::QNN_COMMON_ERROR_GENERAL))
}

fn key(h: *mut c_void) -> usize {
    h as usize
}

fn as_handle(k: usize) -> *mut c_void {
    k as *mut c_void
}

// ------------------------------------------------------------------------------------------
// Log
// ------------------------------------------------------------------------------------------

unsafe extern "C" fn log_create(
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

unsafe extern "C" fn log_set_level(log: b::Qnn_LogHandle_t, level: u32) -> Rc {
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

unsafe extern "C" fn log_free(log: b::Qnn_LogHandle_t) -> Rc {
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

// ------------------------------------------------------------------------------------------
// Backend, device
// ------------------------------------------------------------------------------------------

unsafe extern "C" fn backend_create(
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

unsafe extern "C" fn backend_get_api_version(out: *mut b::Qnn_ApiVersion_t) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_BACKEND_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; writable per the API contract.
        unsafe { *out = api_version() };
        OK
    })
}

unsafe extern "C" fn backend_get_build_id(out: *mut *const c_char) -> Rc {
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
fn drop_context(s: &mut State, ctx: usize) {
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

unsafe extern "C" fn backend_free(backend: b::Qnn_BackendHandle_t) -> Rc {
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

unsafe extern "C" fn device_create(
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

unsafe extern "C" fn device_free(device: b::Qnn_DeviceHandle_t) -> Rc {
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

// ------------------------------------------------------------------------------------------
// Context, graph
// ------------------------------------------------------------------------------------------

unsafe extern "C" fn context_create_from_binary(
    backend: b::Qnn_BackendHandle_t,
    device: b::Qnn_DeviceHandle_t,
    _config: *mut *const b::QnnContext_Config_t,
    binary: *const c_void,
    size: u64,
    out: *mut b::Qnn_ContextHandle_t,
    _profile: b::Qnn_ProfileHandle_t,
) -> Rc {
    guard(|| {
        if binary.is_null() || out.is_null() || size == 0 {
            return code(b::QNN_CONTEXT_ERROR_INVALID_ARGUMENT);
        }
        let Ok(len) = usize::try_from(size) else {
            return code(b::QNN_CONTEXT_ERROR_INVALID_ARGUMENT);
        };
        {
            let s = state();
            if !s.backends.contains_key(&key(backend)) {
                return code(b::QNN_CONTEXT_ERROR_INVALID_HANDLE);
            }
            if !device.is_null() && !s.devices.contains_key(&key(device)) {
                return code(b::QNN_CONTEXT_ERROR_INVALID_HANDLE);
            }
        }
        // SAFETY: the caller provides `size` readable bytes at `binary` for this call.
        let bytes = unsafe { std::slice::from_raw_parts(binary.cast::<u8>(), len) };
        let parsed = CompiledModel::from_bytes(bytes, "contextCreateFromBinary");
        let mut s = state();
        let model = match parsed {
            Ok(m) => m,
            Err(e) => {
                s.emit(
                    Some(key(backend)),
                    b::QNN_LOG_LEVEL_ERROR,
                    &format!("contextCreateFromBinary: {e}"),
                );
                return code(b::QNN_CONTEXT_ERROR_CREATE_FROM_BINARY);
            }
        };
        if !s.backends.contains_key(&key(backend)) {
            return code(b::QNN_CONTEXT_ERROR_INVALID_HANDLE);
        }
        let id = s.fresh();
        s.contexts.insert(
            id,
            ContextObj {
                backend: key(backend),
                model: Arc::new(model),
            },
        );
        // SAFETY: checked non-NULL.
        unsafe { *out = as_handle(id) };
        OK
    })
}

unsafe extern "C" fn context_free(
    context: b::Qnn_ContextHandle_t,
    _profile: b::Qnn_ProfileHandle_t,
) -> Rc {
    guard(|| {
        let mut s = state();
        if !s.contexts.contains_key(&key(context)) {
            return code(b::QNN_CONTEXT_ERROR_INVALID_HANDLE);
        }
        drop_context(&mut s, key(context));
        s.compact();
        OK
    })
}

unsafe extern "C" fn graph_retrieve(
    context: b::Qnn_ContextHandle_t,
    name: *const c_char,
    out: *mut b::Qnn_GraphHandle_t,
) -> Rc {
    guard(|| {
        if name.is_null() || out.is_null() {
            return code(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL graph names are NUL-terminated strings per the API.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let mut s = state();
        let Some(ctx) = s.contexts.get(&key(context)) else {
            return code(b::QNN_GRAPH_ERROR_INVALID_HANDLE);
        };
        let Some(index) = ctx
            .model
            .graphs()
            .iter()
            .position(|g| reported_graph_name(g) == name)
        else {
            let backend = ctx.backend;
            s.emit(
                Some(backend),
                b::QNN_LOG_LEVEL_ERROR,
                &format!("graphRetrieve: no graph named `{name}`"),
            );
            return code(b::QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST);
        };
        let existing = s
            .graphs
            .iter()
            .find(|(_, g)| g.context == key(context) && g.index == index)
            .map(|(k, _)| *k);
        let id = match existing {
            Some(id) => id,
            None => {
                let id = s.fresh();
                s.graphs.insert(
                    id,
                    GraphObj {
                        context: key(context),
                        index,
                    },
                );
                id
            }
        };
        // SAFETY: checked non-NULL.
        unsafe { *out = as_handle(id) };
        OK
    })
}

/// A tensor's bytes resolved from a client buffer or a registered handle.
struct Bound {
    ptr: *mut u8,
    len: usize,
}

/// Resolves one raw tensor against its expected description; `Err` carries the error code.
///
/// # Safety
/// `t` must point to a readable `Qnn_Tensor_t` whose `name` (if non-NULL) is NUL-terminated and
/// whose `dimensions` (if non-NULL) has `rank` entries.
unsafe fn resolve(
    s: &State,
    context: usize,
    t: *const b::Qnn_Tensor_t,
    desc: &IoTensor,
    naming: Preset,
) -> Result<Bound, (Rc, String)> {
    let bad = |msg: String| Err((code(b::QNN_GRAPH_ERROR_INVALID_TENSOR), msg));
    // SAFETY: caller's contract.
    let t = unsafe { &*t };
    if t.version != b::QNN_TENSOR_VERSION_1 && t.version != b::QNN_TENSOR_VERSION_2 {
        return bad(format!(
            "tensor `{}`: unsupported tensor version {}",
            desc.name, t.version
        ));
    }
    // SAFETY: versions 1 and 2 share v1's leading fields.
    let v1 = unsafe { &t.__bindgen_anon_1.v1 };
    if !v1.name.is_null() {
        // SAFETY: caller's contract.
        let name = unsafe { CStr::from_ptr(v1.name) };
        if name.to_bytes() != reported_tensor_name(desc, naming).as_bytes() {
            return bad(format!(
                "expected tensor `{}` at this position, got `{}`",
                reported_tensor_name(desc, naming),
                name.to_string_lossy()
            ));
        }
    }
    let expected_dtype = dtype_to_qnn(desc.dtype);
    if v1.dataType != expected_dtype {
        return bad(format!(
            "tensor `{}`: data type {:#x}, expected {expected_dtype:#x}",
            desc.name, v1.dataType
        ));
    }
    if !v1.dimensions.is_null() {
        // SAFETY: caller's contract.
        let dims = unsafe { std::slice::from_raw_parts(v1.dimensions, v1.rank as usize) };
        let shape = reported_shape(desc, naming);
        if dims.len() != shape.len() || dims.iter().zip(&shape).any(|(&a, &b)| a as usize != b) {
            return bad(format!(
                "tensor `{}`: shape {dims:?}, expected {shape:?}",
                desc.name
            ));
        }
    }
    let expected = desc.byte_size();
    match v1.memType {
        b::QNN_TENSORMEMTYPE_RAW => {
            // SAFETY: memType RAW selects the client buffer member.
            let cb = unsafe { v1.__bindgen_anon_1.clientBuf };
            if cb.data.is_null() {
                return bad(format!("tensor `{}`: NULL client buffer", desc.name));
            }
            if cb.dataSize as usize != expected {
                return bad(format!(
                    "tensor `{}`: client buffer of {} bytes, expected {expected}",
                    desc.name, cb.dataSize
                ));
            }
            Ok(Bound {
                ptr: cb.data.cast(),
                len: expected,
            })
        }
        b::QNN_TENSORMEMTYPE_MEMHANDLE => {
            // SAFETY: memType MEMHANDLE selects the handle member.
            let h = unsafe { v1.__bindgen_anon_1.memHandle };
            let Some(mem) = s.mems.get(&key(h)) else {
                return Err((
                    code(b::QNN_MEM_ERROR_INVALID_HANDLE),
                    format!("tensor `{}`: unknown memory handle", desc.name),
                ));
            };
            if mem.context != context {
                return bad(format!(
                    "tensor `{}`: memory handle registered on another context",
                    desc.name
                ));
            }
            if mem.len != expected {
                return bad(format!(
                    "tensor `{}`: registered memory of {} bytes, expected {expected}",
                    desc.name, mem.len
                ));
            }
            Ok(Bound {
                ptr: mem.ptr,
                len: expected,
            })
        }
        other => bad(format!(
            "tensor `{}`: unsupported memory type {other}",
            desc.name
        )),
    }
}

fn overlaps(a: &Bound, b: &Bound) -> bool {
    let (a0, b0) = (a.ptr as usize, b.ptr as usize);
    a0 < b0 + b.len && b0 < a0 + a.len && a.len > 0 && b.len > 0
}

unsafe extern "C" fn graph_execute(
    graph: b::Qnn_GraphHandle_t,
    inputs: *const b::Qnn_Tensor_t,
    n_inputs: u32,
    outputs: *mut b::Qnn_Tensor_t,
    n_outputs: u32,
    _profile: b::Qnn_ProfileHandle_t,
    _signal: b::Qnn_SignalHandle_t,
) -> Rc {
    guard(|| {
        let s = state();
        let Some(g) = s.graphs.get(&key(graph)) else {
            return code(b::QNN_GRAPH_ERROR_INVALID_HANDLE);
        };
        let Some(ctx) = s.contexts.get(&g.context) else {
            return code(b::QNN_GRAPH_ERROR_INVALID_HANDLE);
        };
        let backend = ctx.backend;
        let Some(exec) = ctx.model.graphs().get(g.index) else {
            return code(b::QNN_GRAPH_ERROR_INVALID_HANDLE);
        };
        let fail = |rc: Rc, msg: String| {
            s.emit(
                Some(backend),
                b::QNN_LOG_LEVEL_ERROR,
                &format!("graphExecute `{}`: {msg}", exec.name()),
            );
            rc
        };
        if n_inputs as usize != exec.inputs().len() || n_outputs as usize != exec.outputs().len() {
            return fail(
                code(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT),
                format!(
                    "{n_inputs} inputs and {n_outputs} outputs given, graph has {} and {}",
                    exec.inputs().len(),
                    exec.outputs().len()
                ),
            );
        }
        if (n_inputs > 0 && inputs.is_null()) || (n_outputs > 0 && outputs.is_null()) {
            return fail(
                code(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT),
                "NULL tensor array".into(),
            );
        }
        // Position `p` of the caller's arrays holds the model's tensor `order[p]`.
        let position = |order: Vec<usize>| {
            let mut at = vec![0; order.len()];
            for (p, i) in order.into_iter().enumerate() {
                at[i] = p;
            }
            at
        };
        let naming = presented(exec);
        let (in_at, out_at) = (
            position(reported_order(exec.inputs(), naming)),
            position(reported_order(exec.outputs(), naming)),
        );
        let mut ins = Vec::with_capacity(exec.inputs().len());
        for (i, desc) in exec.inputs().iter().enumerate() {
            // SAFETY: `inputs` holds `n_inputs` tensors (checked non-NULL, count matches).
            match unsafe { resolve(&s, g.context, inputs.add(in_at[i]), desc, naming) } {
                Ok(bound) => ins.push(bound),
                Err((rc, msg)) => return fail(rc, msg),
            }
        }
        let mut outs = Vec::with_capacity(exec.outputs().len());
        for (i, desc) in exec.outputs().iter().enumerate() {
            // SAFETY: `outputs` holds `n_outputs` tensors.
            match unsafe { resolve(&s, g.context, outputs.add(out_at[i]), desc, naming) } {
                Ok(bound) => outs.push(bound),
                Err((rc, msg)) => return fail(rc, msg),
            }
        }
        // ExecuTorch's mask, converted; it must outlive the execution below.
        let mut converted: Vec<u8>;
        if naming == Preset::ExecuTorch {
            let mask = exec
                .inputs()
                .iter()
                .position(|d| d.role == IoRole::Mask && d.dtype == quant::DataType::U16);
            if let Some(m) = mask {
                // SAFETY: the caller's mask buffer is valid for its (checked) length during the call.
                let bytes = unsafe { std::slice::from_raw_parts(ins[m].ptr, ins[m].len) };
                let Some(v) = additive_from_attend_max(&exec.inputs()[m], bytes) else {
                    return fail(
                        code(b::QNN_GRAPH_ERROR_INVALID_TENSOR),
                        "the mask's encoding has no u16 zero point".into(),
                    );
                };
                converted = v;
                ins[m] = Bound {
                    ptr: converted.as_mut_ptr(),
                    len: converted.len(),
                };
            }
        }
        for (i, o) in outs.iter().enumerate() {
            let clash = outs
                .iter()
                .enumerate()
                .any(|(j, p)| j != i && overlaps(o, p))
                || ins.iter().any(|p| overlaps(o, p));
            if clash {
                return fail(
                    code(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT),
                    format!(
                        "output `{}` overlaps another tensor's memory",
                        exec.outputs()[i].name
                    ),
                );
            }
        }
        let in_raw: Vec<(*const u8, usize)> =
            ins.iter().map(|b| (b.ptr.cast_const(), b.len)).collect();
        let out_raw: Vec<(*mut u8, usize)> = outs.iter().map(|b| (b.ptr, b.len)).collect();
        // SAFETY: every range was supplied by the client for this call (client buffers) or is
        // registered memory the client keeps valid while registered; sizes match the graph's
        // tensors; outputs overlap nothing (checked above); the global lock serializes access.
        match unsafe { exec.execute_raw(&in_raw, &out_raw) } {
            Ok(()) => OK,
            Err(e) => fail(code(b::QNN_GRAPH_ERROR_INVALID_TENSOR), e.to_string()),
        }
    })
}

// ------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------

mod sys {
    use std::ffi::c_void;
    pub const PROT_READ: i32 = 1;
    pub const PROT_WRITE: i32 = 2;
    pub const MAP_SHARED: i32 = 1;
    unsafe extern "C" {
        pub fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void;
        pub fn munmap(addr: *mut c_void, len: usize) -> i32;
    }
}

fn map_fd(fd: i32, len: usize) -> Option<*mut c_void> {
    if fd < 0 || len == 0 {
        return None;
    }
    // SAFETY: a fresh shared mapping of `len` bytes of `fd`; failure is reported as MAP_FAILED.
    let p = unsafe {
        sys::mmap(
            std::ptr::null_mut(),
            len,
            sys::PROT_READ | sys::PROT_WRITE,
            sys::MAP_SHARED,
            fd,
            0,
        )
    };
    if p as isize == -1 || p.is_null() {
        None
    } else {
        Some(p)
    }
}

fn unmap(mapping: Option<(*mut c_void, usize)>) {
    if let Some((p, len)) = mapping {
        // SAFETY: `p`/`len` came from a successful mmap made by this library, unmapped once.
        unsafe { sys::munmap(p, len) };
    }
}

/// Validates one descriptor and produces the registered memory.
///
/// # Safety
/// `d` must point to a readable descriptor whose `dimSize` (if non-NULL) has `numDim` entries
/// and whose `customInfo` (if non-NULL) points to a readable descriptor of at least 32 bytes.
unsafe fn register_one(context: usize, d: &b::Qnn_MemDescriptor_t) -> Result<MemObj, Rc> {
    let invalid = Err(code(b::QNN_MEM_ERROR_INVALID_ARGUMENT));
    let shape = &d.memShape;
    if shape.numDim == 0 || shape.dimSize.is_null() {
        return Err(code(b::QNN_MEM_ERROR_INVALID_SHAPE));
    }
    // SAFETY: caller's contract.
    let dims = unsafe { std::slice::from_raw_parts(shape.dimSize, shape.numDim as usize) };
    let Some(esize) = qnn_dtype_size(d.dataType) else {
        return invalid;
    };
    let Some(bytes) = dims
        .iter()
        .try_fold(esize, |a, &x| a.checked_mul(x as usize))
    else {
        return Err(code(b::QNN_MEM_ERROR_INVALID_SHAPE));
    };
    match d.memType {
        b::QNN_MEM_TYPE_CUSTOM => {
            // SAFETY: memType CUSTOM selects customInfo.
            let info = unsafe { d.__bindgen_anon_1.customInfo };
            if info.is_null() {
                return invalid;
            }
            // SAFETY: caller's contract: a readable descriptor; both kinds start with a u32.
            let tag = unsafe { *info.cast::<u32>() };
            if tag == b::HTPKV_REF_MEM_HOST_MAGIC {
                if strict() {
                    return Err(code(b::QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE));
                }
                // SAFETY: the magic identifies htpkv's host descriptor.
                let h = unsafe { &*info.cast::<b::HtpkvRefMem_HostDescriptor_t>() };
                let end = h.offset.checked_add(bytes as u64);
                if h.base.is_null() || end.is_none_or(|e| e > h.size) {
                    return invalid;
                }
                Ok(MemObj {
                    context,
                    // The offset is within the client's region (checked against its size).
                    ptr: h.base.cast::<u8>().wrapping_add(h.offset as usize),
                    len: bytes,
                    mapping: None,
                })
            } else if tag == b::QNN_HTP_MEM_SHARED_BUFFER {
                // SAFETY: the type field identifies HTP's descriptor.
                let h = unsafe { &*info.cast::<b::QnnMemHtp_Descriptor_t>() };
                // SAFETY: SHARED_BUFFER selects the shared-buffer member.
                let sb = unsafe { h.__bindgen_anon_1.sharedBufferConfig };
                let end = sb.offset.checked_add(bytes as u64);
                if end.is_none_or(|e| e > h.size) {
                    return invalid;
                }
                let total =
                    usize::try_from(h.size).map_err(|_| code(b::QNN_MEM_ERROR_INVALID_ARGUMENT))?;
                let map = map_fd(sb.fd, total).ok_or(code(b::QNN_MEM_ERROR_MAPPING))?;
                Ok(MemObj {
                    context,
                    ptr: map.cast::<u8>().wrapping_add(sb.offset as usize),
                    len: bytes,
                    mapping: Some((map, total)),
                })
            } else {
                Err(code(b::QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE))
            }
        }
        b::QNN_MEM_TYPE_ION => {
            // SAFETY: memType ION selects ionInfo.
            let fd = unsafe { d.__bindgen_anon_1.ionInfo.fd };
            let map = map_fd(fd, bytes).ok_or(code(b::QNN_MEM_ERROR_MAPPING))?;
            Ok(MemObj {
                context,
                ptr: map.cast(),
                len: bytes,
                mapping: Some((map, bytes)),
            })
        }
        _ => Err(code(b::QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE)),
    }
}

unsafe extern "C" fn mem_register(
    context: b::Qnn_ContextHandle_t,
    descs: *const b::Qnn_MemDescriptor_t,
    n: u32,
    handles: *mut b::Qnn_MemHandle_t,
) -> Rc {
    guard(|| {
        if descs.is_null() || handles.is_null() || n == 0 {
            return code(b::QNN_MEM_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        if !s.contexts.contains_key(&key(context)) {
            return code(b::QNN_MEM_ERROR_INVALID_HANDLE);
        }
        let mut made = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // SAFETY: `descs` holds `n` descriptors; `handles` has `n` writable slots.
            unsafe { *handles.add(i) = std::ptr::null_mut() };
            // SAFETY: as above; the descriptor's own pointers follow the API contract.
            match unsafe { register_one(key(context), &*descs.add(i)) } {
                Ok(m) => made.push(m),
                Err(rc) => {
                    for m in made {
                        unmap(m.mapping);
                    }
                    return rc;
                }
            }
        }
        for (i, m) in made.into_iter().enumerate() {
            let id = s.fresh();
            s.mems.insert(id, m);
            // SAFETY: `handles` has `n` writable slots.
            unsafe { *handles.add(i) = as_handle(id) };
        }
        OK
    })
}

unsafe extern "C" fn mem_deregister(handles: *const b::Qnn_MemHandle_t, n: u32) -> Rc {
    guard(|| {
        if handles.is_null() || n == 0 {
            return code(b::QNN_MEM_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        let mut rc = OK;
        for i in 0..n as usize {
            // SAFETY: `handles` holds `n` handles.
            let h = unsafe { *handles.add(i) };
            match s.mems.remove(&key(h)) {
                Some(m) => unmap(m.mapping),
                None => rc = code(b::QNN_MEM_ERROR_INVALID_HANDLE),
            }
        }
        s.compact();
        rc
    })
}

// ------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------

/// The backend's message for an error code: static strings, so nothing is allocated (the
/// library may be unloaded while a client still holds none of its memory).
fn message(code: u64) -> Option<&'static CStr> {
    Some(match code {
        1000 => c"QNN_COMMON_ERROR_NOT_SUPPORTED: not supported by the htpkv reference backend",
        1004 => c"QNN_COMMON_ERROR_INVALID_ARGUMENT: invalid argument (htpkv reference backend)",
        1100 => c"QNN_COMMON_ERROR_GENERAL: internal error (htpkv reference backend)",
        4004 => c"QNN_BACKEND_ERROR_INVALID_ARGUMENT: invalid argument (htpkv reference backend)",
        4011 => c"QNN_BACKEND_ERROR_INVALID_HANDLE: unknown backend handle (htpkv reference backend)",
        5000 => c"QNN_CONTEXT_ERROR_INVALID_ARGUMENT: invalid argument (htpkv reference backend)",
        5002 => c"QNN_CONTEXT_ERROR_INVALID_HANDLE: unknown context, backend or device handle (htpkv reference backend)",
        5005 => c"QNN_CONTEXT_ERROR_CREATE_FROM_BINARY: not a valid htpkv compiled file (htpkv reference backend)",
        6000 => c"QNN_GRAPH_ERROR_INVALID_ARGUMENT: wrong tensor counts, NULL arrays or overlapping outputs (htpkv reference backend)",
        6001 => c"QNN_GRAPH_ERROR_INVALID_HANDLE: unknown graph or context handle (htpkv reference backend)",
        6002 => c"QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST: no graph with that name in the context (htpkv reference backend)",
        6004 => c"QNN_GRAPH_ERROR_INVALID_TENSOR: a tensor does not match the graph (name, type, shape or size) (htpkv reference backend)",
        8000 => c"QNN_MEM_ERROR_INVALID_ARGUMENT: invalid memory descriptor (htpkv reference backend)",
        8001 => c"QNN_MEM_ERROR_INVALID_HANDLE: unknown memory or context handle (htpkv reference backend)",
        8003 => c"QNN_MEM_ERROR_MAPPING: cannot map the file descriptor (htpkv reference backend)",
        8004 => c"QNN_MEM_ERROR_INVALID_SHAPE: invalid memory shape (htpkv reference backend)",
        8005 => c"QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE: unsupported memory type (htpkv reference backend)",
        11003 => c"QNN_LOG_ERROR_INVALID_ARGUMENT: invalid log argument (htpkv reference backend)",
        11004 => c"QNN_LOG_ERROR_INVALID_HANDLE: unknown log handle (htpkv reference backend)",
        30000 => c"QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE: unknown system context handle (htpkv reference backend)",
        30001 => c"QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT: invalid argument (htpkv reference backend)",
        30002 => c"QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED: cannot describe the binary (htpkv reference backend)",
        30010 => c"QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY: not a valid htpkv compiled file (htpkv reference backend)",
        _ => return None,
    })
}

unsafe extern "C" fn error_get_message(handle: u64, out: *mut *const c_char) -> Rc {
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

// ------------------------------------------------------------------------------------------
// System context
// ------------------------------------------------------------------------------------------

/// The QNN description of a compiled tensor (what the system provider reports) under `naming`.
pub fn tensor_info(
    desc: &IoTensor,
    id: u32,
    tensor_type: TensorType,
    naming: Preset,
) -> TensorInfo {
    let executorch_mask = naming == Preset::ExecuTorch
        && desc.role == IoRole::Mask
        && desc.dtype == quant::DataType::U16;
    let quant = match &desc.encoding() {
        // ExecuTorch's mask is a 0..1 multiplier quantized to u16 (65535 attend, 0 masked).
        _ if executorch_mask => Quantization::PerTensor {
            scale: 1.0 / 65535.0,
            offset: 0,
        },
        quant::Encoding::Float => Quantization::None,
        quant::Encoding::PerTensor(so) => Quantization::PerTensor {
            scale: so.scale,
            offset: so.offset,
        },
        quant::Encoding::PerAxis { axis, params } => Quantization::PerAxis {
            axis: *axis as i32,
            scale_offsets: params.iter().map(|p| (p.scale, p.offset)).collect(),
        },
    };
    TensorInfo {
        id,
        name: reported_tensor_name(desc, naming),
        tensor_type,
        dtype: dtype_to_qnn(desc.dtype),
        shape: reported_shape(desc, naming)
            .iter()
            .map(|&d| d as u32)
            .collect(),
        quant,
    }
}

/// Environment variable choosing the struct versions of the binary info this library hands out:
/// `3` (default: binary info V3, graph info V3 with HTP graph blob info, tensors V2, as current
/// SDKs), `2` (binary info V2, graph info V2, tensors V2) or `1` (all version 1, as old SDKs).
pub const LAYOUT_ENV: &str = "HTPKV_REF_QNN_LAYOUT";

/// Environment variable: when `1`, the library refuses htpkv's host-memory descriptor the way a
/// real HTP backend does (`QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE`), accepting only shared buffers
/// (fd + offset) and client buffers.
pub const STRICT_ENV: &str = "HTPKV_REF_QNN_STRICT";

/// Environment variable overriding how the library presents graphs and tensors. Unset, each model
/// is presented by the naming its file records ([`ref_backend::Preset`]: `htpkv compile
/// --convention htpkv|aihub|executorch`); set, every model is presented one way, so that the
/// runtime's conventions are exercised on binaries compiled otherwise (a test device, not a
/// setting for users):
/// - `htpkv`: htpkv's own names and order;
/// - `aihub`: the names of Qualcomm AI Hub's LLM exports — graphs `{token|prompt}_ar{n}_cl{S}_{i}_of_{N}` (`1_of_1` for a whole model),
///   `position_ids`, `past_key_{layer}_in` / `_out`, `past_value_{layer}_in` / `_out` (per head:
///   `past_key_{layer}_h{head}_in`, …);
/// - `executorch`: ExecuTorch's Qualcomm llama layout — graphs `kv_forward` (AR-1) and
///   `prefill_forward`, IO in index order (tokens, mask, positions, K of every layer, V of every
///   layer; outputs logits, K…, V…) under names no convention knows, K/V dims `[1, kv_heads, ., .]`,
///   and a u16 mask reported as ExecuTorch's 0..1 multiplier (scale 1/65535, offset 0: 65535
///   attend, 0 masked) and converted to the executor's additive encoding.
pub const NAMES_ENV: &str = "HTPKV_REF_QNN_NAMES";

/// How graph `g` is presented: the naming its file records, unless [`NAMES_ENV`] overrides it.
pub fn presented(g: &ref_backend::Graph) -> Preset {
    std::env::var(NAMES_ENV)
        .ok()
        .and_then(|v| v.parse::<Preset>().ok())
        .unwrap_or(g.part().naming)
}

/// The name graph `g` is reported and retrieved under (see [`presented`]).
pub fn reported_graph_name(g: &ref_backend::Graph) -> String {
    let naming = presented(g);
    if naming == g.part().naming {
        return g.name().to_string();
    }
    let mut part = g.part().clone();
    part.naming = naming;
    part.graph_name(g.ar(), g.context())
}

/// The name tensor `desc` is reported under `naming`: htpkv's as the file has it; AI Hub's written
/// by its convention (a sliding window's mask keeps its name in every convention, and a tensor the
/// convention has no name for, the hidden state, keeps the file's); ExecuTorch's prefixed so that
/// no convention knows them (its IO is found by index).
pub fn reported_tensor_name(desc: &IoTensor, naming: Preset) -> String {
    match naming {
        Preset::Htpkv => return desc.name.clone(),
        Preset::ExecuTorch => return format!("et_{}", desc.name),
        Preset::AiHub => {}
    }
    if desc.role == IoRole::Mask {
        return desc.name.clone();
    }
    let name = naming
        .convention()
        .tensor_name(desc.role, desc.layer, desc.head);
    name.ok().flatten().unwrap_or_else(|| desc.name.clone())
}

/// The dims tensor `desc` is reported with: ExecuTorch's K/V put the heads second.
pub fn reported_shape(desc: &IoTensor, naming: Preset) -> Vec<usize> {
    let mut shape = desc.shape.clone();
    if naming == Preset::ExecuTorch && desc.role.is_kv() && shape.len() == 4 {
        shape.swap(0, 1);
    }
    shape
}

/// The graph's tensor indices in the order they are reported (ExecuTorch's index order; else as
/// the model lists them).
pub fn reported_order(descs: &[IoTensor], naming: Preset) -> Vec<usize> {
    let mut order: Vec<usize> = (0..descs.len()).collect();
    if naming == Preset::ExecuTorch {
        let rank = |r: IoRole| match r {
            IoRole::InputIds | IoRole::Embeddings | IoRole::SourceIds => 0,
            IoRole::Logits | IoRole::HiddenIn | IoRole::HiddenOut => 0,
            IoRole::Mask | IoRole::NewKey => 1,
            IoRole::Positions | IoRole::RopeCos | IoRole::RopeSin => 2,
            IoRole::NewValue => 2,
            IoRole::PastKey | IoRole::CrossKey => 3,
            IoRole::PastValue | IoRole::CrossValue => 4,
        };
        order.sort_by_key(|&i| (rank(descs[i].role), descs[i].layer, descs[i].head));
    }
    order
}

/// ExecuTorch's u16 mask (65535 attend, 0 masked; reported with scale 1/65535 and offset 0) in
/// the executor's additive encoding (the zero point where visible, 0 where masked).
fn additive_from_attend_max(desc: &IoTensor, bytes: &[u8]) -> Option<Vec<u8>> {
    let Some(quant::Encoding::PerTensor(so)) = desc.quant.as_ref().map(|q| &q.encoding) else {
        return None;
    };
    let visible = u16::try_from(-so.offset).ok()?.to_le_bytes();
    Some(
        bytes
            .chunks_exact(2)
            .flat_map(|c| {
                if u16::from_le_bytes([c[0], c[1]]) >= 1 << 15 {
                    visible
                } else {
                    [0, 0]
                }
            })
            .collect(),
    )
}

fn strict() -> bool {
    std::env::var(STRICT_ENV).as_deref() == Ok("1")
}

/// The struct versions `systemContextGetBinaryInfo` emits (see [`LAYOUT_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Binary info and graph info version (1 to 3).
    pub info: u32,
    /// Tensor version (1 or 2).
    pub tensor: u32,
}

impl Layout {
    /// The layout [`LAYOUT_ENV`] asks for; `None` for a value it does not name.
    pub fn from_env() -> Option<Layout> {
        match std::env::var(LAYOUT_ENV).as_deref() {
            Err(_) | Ok("") | Ok("3") => Some(Layout { info: 3, tensor: 2 }),
            Ok("2") => Some(Layout { info: 2, tensor: 2 }),
            Ok("1") => Some(Layout { info: 1, tensor: 1 }),
            Ok(_) => None,
        }
    }
}

/// The raw tensors of one graph's inputs or outputs, numbered from `*id`.
fn raw_tensors(
    descs: &[IoTensor],
    id: &mut u32,
    tensor_type: TensorType,
    layout: Layout,
    naming: Preset,
) -> Option<Vec<OwnedRawTensor>> {
    reported_order(descs, naming)
        .into_iter()
        .map(|i| {
            let t = OwnedRawTensor::new(&tensor_info(&descs[i], *id, tensor_type, naming)).ok()?;
            *id += 1;
            Some(if layout.tensor == 2 { t.version_2() } else { t })
        })
        .collect()
}

/// One graph info entry in the layout's version; pointers borrow the caller's storage.
fn graph_entry(
    layout: Layout,
    name: &CString,
    ins: &mut [b::Qnn_Tensor_t],
    outs: &mut [b::Qnn_Tensor_t],
    blob: &mut b::QnnHtpSystemContext_GraphBlobInfo_t,
) -> b::QnnSystemContext_GraphInfo_t {
    let v3 = b::QnnSystemContext_GraphInfoV3_t {
        graphName: name.as_ptr(),
        numGraphInputs: ins.len() as u32,
        graphInputs: ins.as_mut_ptr(),
        numGraphOutputs: outs.len() as u32,
        graphOutputs: outs.as_mut_ptr(),
        numUpdateableTensors: 0,
        updateableTensors: std::ptr::null_mut(),
        graphBlobInfoSize: std::mem::size_of::<b::QnnHtpSystemContext_GraphBlobInfo_t>() as u32,
        graphBlobInfo: std::ptr::from_mut(blob).cast(),
        startOpIndex: 0,
        endOpIndex: 0,
    };
    let union = match layout.info {
        1 => b::QnnSystemContext_GraphInfo_t__bindgen_ty_1 {
            graphInfoV1: b::QnnSystemContext_GraphInfoV1_t {
                graphName: v3.graphName,
                numGraphInputs: v3.numGraphInputs,
                graphInputs: v3.graphInputs,
                numGraphOutputs: v3.numGraphOutputs,
                graphOutputs: v3.graphOutputs,
            },
        },
        2 => b::QnnSystemContext_GraphInfo_t__bindgen_ty_1 {
            graphInfoV2: b::QnnSystemContext_GraphInfoV2_t {
                graphName: v3.graphName,
                numGraphInputs: v3.numGraphInputs,
                graphInputs: v3.graphInputs,
                numGraphOutputs: v3.numGraphOutputs,
                graphOutputs: v3.graphOutputs,
                numUpdateableTensors: 0,
                updateableTensors: std::ptr::null_mut(),
            },
        },
        _ => b::QnnSystemContext_GraphInfo_t__bindgen_ty_1 { graphInfoV3: v3 },
    };
    b::QnnSystemContext_GraphInfo_t {
        version: layout.info,
        __bindgen_anon_1: union,
    }
}

/// HTP-style graph blob info recording the graph's spill-fill (scratch) size.
fn graph_blob(scratch_bytes: usize) -> b::QnnHtpSystemContext_GraphBlobInfo_t {
    b::QnnHtpSystemContext_GraphBlobInfo_t {
        version: b::QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1,
        __bindgen_anon_1: b::QnnHtpSystemContext_GraphBlobInfo_t__bindgen_ty_1 {
            contextBinaryGraphBlobInfoV1: b::QnnHtpSystemContext_GraphBlobInfoV1_t {
                spillFillBufferSize: scratch_bytes as u64,
                ..Default::default()
            },
        },
    }
}

/// A binary-info struct of another version with the fields every version shares copied from
/// `$v1` (the rest default).
macro_rules! with_common_fields {
    ($($ty:ident)::+, $v1:expr) => {
        $($ty)::+ {
            backendId: $v1.backendId,
            buildId: $v1.buildId,
            coreApiVersion: $v1.coreApiVersion,
            backendApiVersion: $v1.backendApiVersion,
            contextBlobVersion: $v1.contextBlobVersion,
            contextBlobSize: $v1.contextBlobSize,
            numGraphs: $v1.numGraphs,
            graphs: $v1.graphs,
            ..Default::default()
        }
    };
}

/// The binary info header in the layout's version.
fn binary_header(
    layout: Layout,
    graphs: &mut [b::QnnSystemContext_GraphInfo_t],
    blob_bytes: u64,
) -> b::QnnSystemContext_BinaryInfo_t {
    let v1 = b::QnnSystemContext_BinaryInfoV1_t {
        backendId: BACKEND_ID,
        buildId: BUILD_ID.as_ptr(),
        coreApiVersion: version(CORE_API),
        backendApiVersion: version(BACKEND_API),
        contextBlobVersion: version(CONTEXT_BLOB_VERSION),
        contextBlobSize: blob_bytes,
        numGraphs: graphs.len() as u32,
        graphs: graphs.as_mut_ptr(),
        ..Default::default()
    };
    let union = match layout.info {
        1 => b::QnnSystemContext_BinaryInfo_t__bindgen_ty_1 {
            contextBinaryInfoV1: v1,
        },
        2 => b::QnnSystemContext_BinaryInfo_t__bindgen_ty_1 {
            contextBinaryInfoV2: with_common_fields!(b::QnnSystemContext_BinaryInfoV2_t, v1),
        },
        _ => b::QnnSystemContext_BinaryInfo_t__bindgen_ty_1 {
            contextBinaryInfoV3: with_common_fields!(b::QnnSystemContext_BinaryInfoV3_t, v1),
        },
    };
    b::QnnSystemContext_BinaryInfo_t {
        version: layout.info,
        __bindgen_anon_1: union,
    }
}

fn build_sys_info(model: &CompiledModel, binary_bytes: u64, layout: Layout) -> Option<SysInfo> {
    let mut owned = Vec::new();
    let mut tensors = Vec::new();
    let mut names = Vec::new();
    let mut blobs = Vec::new();
    let mut id = 1u32;
    for g in model.graphs() {
        let naming = presented(g);
        let ins = raw_tensors(g.inputs(), &mut id, TensorType::AppWrite, layout, naming)?;
        let outs = raw_tensors(g.outputs(), &mut id, TensorType::AppRead, layout, naming)?;
        tensors.push(ins.iter().map(OwnedRawTensor::raw).collect::<Vec<_>>());
        tensors.push(outs.iter().map(OwnedRawTensor::raw).collect::<Vec<_>>());
        names.push(CString::new(reported_graph_name(g)).ok()?);
        blobs.push(graph_blob(g.scratch_bytes()));
        owned.extend(ins);
        owned.extend(outs);
    }
    let mut graphs = Vec::new();
    let mut lists = tensors.chunks_mut(2);
    for (name, blob) in names.iter().zip(blobs.iter_mut()) {
        let [ins, outs] = lists.next()? else {
            return None;
        };
        graphs.push(graph_entry(layout, name, ins, outs, blob));
    }
    let info = Box::new(binary_header(layout, &mut graphs, binary_bytes));
    Some(SysInfo {
        _owned: owned,
        _tensors: tensors,
        _names: names,
        _blobs: blobs,
        _graphs: graphs,
        info,
    })
}

unsafe extern "C" fn system_context_create(out: *mut b::QnnSystemContext_Handle_t) -> Rc {
    guard(|| {
        if out.is_null() {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT);
        }
        let mut s = state();
        let id = s.fresh();
        s.sys.insert(id, SysCtxObj::default());
        // SAFETY: checked non-NULL.
        unsafe { *out = as_handle(id) };
        OK
    })
}

unsafe extern "C" fn system_context_get_binary_info(
    handle: b::QnnSystemContext_Handle_t,
    binary: *mut c_void,
    size: u64,
    out: *mut *const b::QnnSystemContext_BinaryInfo_t,
    out_size: *mut u64,
) -> Rc {
    guard(|| {
        if binary.is_null() || out.is_null() || size == 0 {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT);
        }
        let Ok(len) = usize::try_from(size) else {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT);
        };
        if !state().sys.contains_key(&key(handle)) {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE);
        }
        // SAFETY: the caller provides `size` readable bytes at `binary`.
        let bytes = unsafe { std::slice::from_raw_parts(binary.cast::<u8>(), len) };
        let Ok(model) = CompiledModel::from_bytes(bytes, "systemContextGetBinaryInfo") else {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY);
        };
        let Some(layout) = Layout::from_env() else {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT);
        };
        let Some(info) = build_sys_info(&model, size, layout) else {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED);
        };
        let mut s = state();
        let Some(ctx) = s.sys.get_mut(&key(handle)) else {
            return code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE);
        };
        let ptr: *const b::QnnSystemContext_BinaryInfo_t = &*info.info;
        ctx.infos.push(info);
        // SAFETY: checked non-NULL; the info lives until systemContextFree.
        unsafe { *out = ptr };
        if !out_size.is_null() {
            // SAFETY: non-NULL out-pointer supplied by the caller.
            unsafe { *out_size = std::mem::size_of::<b::QnnSystemContext_BinaryInfo_t>() as u64 };
        }
        OK
    })
}

unsafe extern "C" fn system_context_free(handle: b::QnnSystemContext_Handle_t) -> Rc {
    guard(|| {
        let mut s = state();
        match s.sys.remove(&key(handle)) {
            Some(_) => {
                s.compact();
                OK
            }
            None => code(b::QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE),
        }
    })
}

// ------------------------------------------------------------------------------------------
// Providers
// ------------------------------------------------------------------------------------------

fn version(v: (u32, u32, u32)) -> b::Qnn_Version_t {
    b::Qnn_Version_t {
        major: v.0,
        minor: v.1,
        patch: v.2,
    }
}

fn api_version() -> b::Qnn_ApiVersion_t {
    b::Qnn_ApiVersion_t {
        coreApiVersion: version(CORE_API),
        backendApiVersion: version(BACKEND_API),
    }
}

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
