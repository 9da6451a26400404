//! The system provider: `systemContextCreate`, `systemContextGetBinaryInfo` (binary, graph and
//! tensor info in the layout [`LAYOUT_ENV`] asks for), `systemContextFree`.

use std::ffi::{CString, c_void};

use qnn_ffi::bindings as b;
use qnn_ffi::{OwnedRawTensor, TensorType};
use ref_backend::{CompiledModel, IoTensor, Preset};

use crate::backend::version;
use crate::present::{presented, reported_graph_name, reported_order, tensor_info};
use crate::state::{SysCtxObj, SysInfo, as_handle, guard, key, state};
use crate::{BACKEND_API, BACKEND_ID, BUILD_ID, CONTEXT_BLOB_VERSION, CORE_API, OK, Rc, code};

/// Environment variable choosing the struct versions of the binary info this library hands out:
/// `3` (default: binary info V3, graph info V3 with HTP graph blob info, tensors V2, as current
/// SDKs), `2` (binary info V2, graph info V2, tensors V2) or `1` (all version 1, as old SDKs).
pub const LAYOUT_ENV: &str = "HTPKV_REF_QNN_LAYOUT";

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

pub(crate) unsafe extern "C" fn system_context_create(
    out: *mut b::QnnSystemContext_Handle_t,
) -> Rc {
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

pub(crate) unsafe extern "C" fn system_context_get_binary_info(
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

pub(crate) unsafe extern "C" fn system_context_free(handle: b::QnnSystemContext_Handle_t) -> Rc {
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
