//! `contextCreateFromBinary`, `contextFree`, `graphRetrieve`, `graphExecute`: a context is one
//! compiled file, a graph one of its AR variants (or parts), executed on the client's buffers.

use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;

use qnn_ffi::bindings as b;
use qnn_ffi::dtype_to_qnn;
use ref_backend::{CompiledModel, IoTensor, Preset};

use crate::backend::drop_context;
use crate::present::{
    additive_from_attend_max, converts_mask, is_u16_mask, presented, reported_graph_name,
    reported_order, reported_shape, reported_tensor_name,
};
use crate::state::{ContextObj, GraphObj, State, as_handle, guard, key, state};
use crate::{OK, Rc, code};

pub(crate) unsafe extern "C" fn context_create_from_binary(
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

pub(crate) unsafe extern "C" fn context_free(
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

pub(crate) unsafe extern "C" fn graph_retrieve(
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

pub(crate) unsafe extern "C" fn graph_execute(
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
        // An attend-max mask (ExecuTorch's), converted; it must outlive the execution below.
        let mut converted: Vec<u8>;
        if converts_mask(naming) {
            let mask = exec.inputs().iter().position(is_u16_mask);
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
