//! The system library: reading a context binary's metadata (graphs and their IO tensors).
//!
//! Binary info and graph info each come in three struct versions (see `include/htpkv_qnn.h` for
//! the layouts and their public sources). Every version field is dispatched on: a version htpkv
//! does not know is [`QnnError::UnknownVersion`], never a read through another version's layout.

use std::ffi::CStr;
use std::sync::Arc;

use crate::bindings as b;
use crate::error::{QnnError, qnn_error};
use crate::loader::QnnSystemLibrary;
use crate::types::{TensorInfo, Version};

/// Upper bound on the graphs, tensors or updateable tensors one list may hold; a count above it
/// is a corrupt description, not a model (real binaries hold a few dozen graphs and a few
/// thousand tensors).
pub const MAX_LIST_ENTRIES: u32 = 1 << 20;

/// One graph of a context binary.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphInfo {
    /// Graph name (for `graphRetrieve`).
    pub name: String,
    /// The graph-info struct version the system library used (1 to 3).
    pub info_version: u32,
    /// Inputs in execution order.
    pub inputs: Vec<TensorInfo>,
    /// Outputs in execution order.
    pub outputs: Vec<TensorInfo>,
    /// Number of updateable tensors (graph info version 2 and later; 0 before).
    pub updateable_tensors: u32,
    /// Spill-fill buffer size in bytes from HTP graph blob info (graph info version 3), when the
    /// backend records it.
    pub spill_fill_bytes: Option<u64>,
    /// The graph's op index range `(start, end)` (graph info version 3).
    pub op_range: Option<(u32, u32)>,
}

/// A context binary's metadata, copied into plain Rust values.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryInfo {
    /// The binary-info struct version the system library used (1 to 3).
    pub info_version: u32,
    /// Backend id the binary was made for.
    pub backend_id: u32,
    /// Build id of the tool that made it, if recorded.
    pub build_id: Option<String>,
    /// Core API version it was made with.
    pub core_api: Version,
    /// Backend API version it was made with.
    pub backend_api: Version,
    /// SoC it was made for, if recorded (e.g. `V75`).
    pub soc_version: Option<String>,
    /// SoC model number (binary info version 3; `None` before or when 0).
    pub soc_model: Option<u32>,
    /// Version of the backend's context blob format.
    pub context_blob_version: Version,
    /// Size of the backend's context blob in bytes.
    pub context_blob_size: u64,
    /// Version of the hardware info blob (binary info versions 1 and 2).
    pub hw_info_blob_version: Option<Version>,
    /// Spill-fill buffer size in bytes from HTP's hardware info blob (binary info versions 1
    /// and 2; version 3 records it per graph).
    pub spill_fill_bytes: Option<u64>,
    /// Number of context tensors (shared between graphs).
    pub context_tensors: u32,
    /// Its graphs.
    pub graphs: Vec<GraphInfo>,
}

impl BinaryInfo {
    /// The graph called `name`, or [`QnnError::UnknownGraph`].
    pub fn graph(&self, name: &str) -> Result<&GraphInfo, QnnError> {
        self.graphs
            .iter()
            .find(|g| g.name == name)
            .ok_or_else(|| QnnError::UnknownGraph {
                name: name.to_string(),
                available: self.graphs.iter().map(|g| g.name.clone()).collect(),
            })
    }
}

/// A system context (`systemContextCreate` / `systemContextFree`).
#[derive(Debug)]
pub struct SystemContext {
    lib: Arc<QnnSystemLibrary>,
    handle: b::QnnSystemContext_Handle_t,
}

// SAFETY: an opaque token passed only to the system library; see `backend::Log`.
unsafe impl Send for SystemContext {}

impl SystemContext {
    /// Creates a system context.
    pub fn new(lib: &Arc<QnnSystemLibrary>) -> Result<SystemContext, QnnError> {
        let create = lib.need(lib.table().systemContextCreate, "systemContextCreate")?;
        lib.need(lib.table().systemContextFree, "systemContextFree")?;
        let mut handle: b::QnnSystemContext_Handle_t = std::ptr::null_mut();
        // SAFETY: `handle` is valid for a write.
        let rc = unsafe { create(&mut handle) };
        if rc != 0 {
            return Err(qnn_error("systemContextCreate", rc, None));
        }
        Ok(SystemContext {
            lib: lib.clone(),
            handle,
        })
    }

    /// Reads the metadata of a context binary (`systemContextGetBinaryInfo`).
    pub fn binary_info(&mut self, binary: &[u8]) -> Result<BinaryInfo, QnnError> {
        let get = self.lib.need(
            self.lib.table().systemContextGetBinaryInfo,
            "systemContextGetBinaryInfo",
        )?;
        // The API takes a non-const pointer but does not write the buffer; copy to be safe
        // against backends that do.
        let mut copy = binary.to_vec();
        let mut info: *const b::QnnSystemContext_BinaryInfo_t = std::ptr::null();
        let mut info_size: u64 = 0;
        // SAFETY: `copy` is valid for its length; both out-pointers are writable.
        let rc = unsafe {
            get(
                self.handle,
                copy.as_mut_ptr().cast(),
                copy.len() as u64,
                &mut info,
                &mut info_size,
            )
        };
        if rc != 0 {
            return Err(qnn_error("systemContextGetBinaryInfo", rc, None));
        }
        if info.is_null() {
            return Err(QnnError::BinaryInfo {
                reason: "systemContextGetBinaryInfo succeeded but returned no info".into(),
            });
        }
        // SAFETY: the info lives until this system context is freed (we hold `&mut self`).
        unsafe { convert_binary_info(&*info) }
    }
}

impl Drop for SystemContext {
    fn drop(&mut self) {
        if let Some(free) = self.lib.table().systemContextFree {
            // SAFETY: created by systemContextCreate, freed exactly once.
            unsafe { free(self.handle) };
        }
    }
}

fn opt_str(p: *const std::ffi::c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-NULL strings in binary info are NUL-terminated and owned by the system
        // context, alive during conversion.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// Views a counted array handed out by the system library.
///
/// # Safety
/// `ptr` must point to `n` valid `T`s when non-NULL.
unsafe fn counted<'a, T>(ptr: *const T, n: u32, what: &str) -> Result<&'a [T], QnnError> {
    if n == 0 {
        return Ok(&[]);
    }
    if n > MAX_LIST_ENTRIES {
        return Err(QnnError::BinaryInfo {
            reason: format!("{n} {what} listed, more than the {MAX_LIST_ENTRIES} htpkv accepts"),
        });
    }
    if ptr.is_null() {
        return Err(QnnError::BinaryInfo {
            reason: format!("{n} {what} listed but the array is NULL"),
        });
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) })
}

/// Reads tensors from a raw array.
///
/// # Safety
/// `ptr` must point to `n` valid tensors (or be NULL with `n == 0`).
unsafe fn tensors(
    ptr: *const b::Qnn_Tensor_t,
    n: u32,
    what: &str,
) -> Result<Vec<TensorInfo>, QnnError> {
    // SAFETY: caller's contract.
    let raw = unsafe { counted(ptr, n, what) }?;
    // SAFETY: each element is a valid tensor (caller's contract).
    raw.iter()
        .map(|t| unsafe { TensorInfo::from_raw(t) })
        .collect()
}

/// The fields every binary-info version has, gathered from whichever layout is live.
struct Common {
    backend_id: u32,
    build_id: *const std::ffi::c_char,
    core_api: b::Qnn_Version_t,
    backend_api: b::Qnn_Version_t,
    soc_version: *const std::ffi::c_char,
    context_blob_version: b::Qnn_Version_t,
    context_blob_size: u64,
    num_context_tensors: u32,
    num_graphs: u32,
    graphs: *const b::QnnSystemContext_GraphInfo_t,
}

macro_rules! common_of {
    ($v:expr) => {
        Common {
            backend_id: $v.backendId,
            build_id: $v.buildId,
            core_api: $v.coreApiVersion,
            backend_api: $v.backendApiVersion,
            soc_version: $v.socVersion,
            context_blob_version: $v.contextBlobVersion,
            context_blob_size: $v.contextBlobSize,
            num_context_tensors: $v.numContextTensors,
            num_graphs: $v.numGraphs,
            graphs: $v.graphs,
        }
    };
}

/// True when the backend describes its graphs with HTP's blob formats.
fn htp_blobs(backend_id: u32) -> bool {
    backend_id == b::QNN_BACKEND_ID_HTP || backend_id == b::HTPKV_REF_BACKEND_ID
}

/// A copy of the backend blob at `blob` read as a `T`, when it holds at least a `T` (blobs carry
/// no alignment promise, so the read is unaligned).
///
/// # Safety
/// `blob` must point to `size` readable bytes when non-NULL.
unsafe fn blob_as<T: Copy>(blob: *const std::ffi::c_void, size: u32) -> Option<T> {
    if blob.is_null() || (size as usize) < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: caller's contract; the size check covers a `T`, and every bit pattern is a valid
    // value of these plain C structs.
    Some(unsafe { std::ptr::read_unaligned(blob.cast::<T>()) })
}

/// Spill-fill size from HTP's hardware info blob (binary info versions 1 and 2).
///
/// # Safety
/// As [`blob_as`].
unsafe fn hw_blob_spill_fill(blob: *const std::ffi::c_void, size: u32) -> Option<u64> {
    // SAFETY: caller's contract.
    let hw: b::QnnHtpSystemContext_HwBlobInfo_t = unsafe { blob_as(blob, size) }?;
    if hw.version != b::QNN_SYSTEM_CONTEXT_HTP_HW_INFO_BLOB_VERSION_V1 {
        return None;
    }
    // SAFETY: version 1 selects the only member.
    let v1 = unsafe { hw.__bindgen_anon_1.contextBinaryHwInfoBlobV1_t };
    Some(v1.spillFillBufferSize)
}

/// Spill-fill size from HTP's graph blob info (graph info version 3).
///
/// # Safety
/// As [`blob_as`].
unsafe fn graph_blob_spill_fill(blob: *const std::ffi::c_void, size: u32) -> Option<u64> {
    // SAFETY: caller's contract.
    let g: b::QnnHtpSystemContext_GraphBlobInfo_t = unsafe { blob_as(blob, size) }?;
    if g.version != b::QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1 {
        return None;
    }
    // SAFETY: version 1 selects the only member.
    let v1 = unsafe { g.__bindgen_anon_1.contextBinaryGraphBlobInfoV1 };
    Some(v1.spillFillBufferSize)
}

/// Converts raw binary info, dispatching on its version.
///
/// # Safety
/// `info` and everything it points to must be valid QNN binary info.
pub unsafe fn convert_binary_info(
    info: &b::QnnSystemContext_BinaryInfo_t,
) -> Result<BinaryInfo, QnnError> {
    let (common, hw_version, spill_fill, soc_model) = match info.version {
        b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &info.__bindgen_anon_1.contextBinaryInfoV1 };
            let htp = htp_blobs(v.backendId);
            // SAFETY: the blob holds `hwInfoBlobSize` bytes (the library's contract).
            let sf = htp.then(|| unsafe { hw_blob_spill_fill(v.hwInfoBlob, v.hwInfoBlobSize) });
            (common_of!(v), Some(v.hwInfoBlobVersion), sf.flatten(), None)
        }
        b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_2 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &info.__bindgen_anon_1.contextBinaryInfoV2 };
            let htp = htp_blobs(v.backendId);
            // SAFETY: as for version 1.
            let sf = htp.then(|| unsafe { hw_blob_spill_fill(v.hwInfoBlob, v.hwInfoBlobSize) });
            (common_of!(v), Some(v.hwInfoBlobVersion), sf.flatten(), None)
        }
        b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &info.__bindgen_anon_1.contextBinaryInfoV3 };
            let soc = (v.socModel != 0).then_some(v.socModel);
            (common_of!(v), None, None, soc)
        }
        other => {
            return Err(QnnError::UnknownVersion {
                what: "binary info",
                version: other,
                known: "1, 2, 3",
            });
        }
    };
    // SAFETY: `graphs` holds `numGraphs` entries (the library's contract).
    let raw = unsafe { counted(common.graphs, common.num_graphs, "graphs") }?;
    let htp = htp_blobs(common.backend_id);
    let graphs = raw
        .iter()
        // SAFETY: each entry is a valid graph info.
        .map(|g| unsafe { convert_graph_info(g, htp) })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BinaryInfo {
        info_version: info.version,
        backend_id: common.backend_id,
        build_id: opt_str(common.build_id),
        core_api: Version::from_raw(&common.core_api),
        backend_api: Version::from_raw(&common.backend_api),
        soc_version: opt_str(common.soc_version),
        soc_model,
        context_blob_version: Version::from_raw(&common.context_blob_version),
        context_blob_size: common.context_blob_size,
        hw_info_blob_version: hw_version.map(|v| Version::from_raw(&v)),
        spill_fill_bytes: spill_fill,
        context_tensors: common.num_context_tensors,
        graphs,
    })
}

/// Converts one raw graph info, dispatching on its version.
///
/// # Safety
/// `g` and everything it points to must be valid QNN graph info.
unsafe fn convert_graph_info(
    g: &b::QnnSystemContext_GraphInfo_t,
    htp: bool,
) -> Result<GraphInfo, QnnError> {
    let (head, updateable, v3) = match g.version {
        b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &g.__bindgen_anon_1.graphInfoV1 };
            (
                (
                    v.graphName,
                    v.numGraphInputs,
                    v.graphInputs,
                    v.numGraphOutputs,
                    v.graphOutputs,
                ),
                0,
                None,
            )
        }
        b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_2 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &g.__bindgen_anon_1.graphInfoV2 };
            let head = (
                v.graphName,
                v.numGraphInputs,
                v.graphInputs,
                v.numGraphOutputs,
                v.graphOutputs,
            );
            (head, v.numUpdateableTensors, None)
        }
        b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_3 => {
            // SAFETY: the version tag selects the live member.
            let v = unsafe { &g.__bindgen_anon_1.graphInfoV3 };
            let head = (
                v.graphName,
                v.numGraphInputs,
                v.graphInputs,
                v.numGraphOutputs,
                v.graphOutputs,
            );
            (head, v.numUpdateableTensors, Some(v))
        }
        other => {
            return Err(QnnError::UnknownVersion {
                what: "graph info",
                version: other,
                known: "1, 2, 3",
            });
        }
    };
    let (name, n_in, ins, n_out, outs) = head;
    let name = opt_str(name).ok_or_else(|| QnnError::BinaryInfo {
        reason: "a graph has no name".into(),
    })?;
    // SAFETY: arrays as described by their counts.
    let inputs = unsafe { tensors(ins, n_in, "inputs") }?;
    // SAFETY: as above.
    let outputs = unsafe { tensors(outs, n_out, "outputs") }?;
    let spill_fill_bytes = match v3 {
        // SAFETY: the blob holds `graphBlobInfoSize` bytes (the library's contract).
        Some(v) if htp => unsafe { graph_blob_spill_fill(v.graphBlobInfo, v.graphBlobInfoSize) },
        _ => None,
    };
    Ok(GraphInfo {
        name,
        info_version: g.version,
        inputs,
        outputs,
        updateable_tensors: updateable,
        spill_fill_bytes,
        op_range: v3.map(|v| (v.startOpIndex, v.endOpIndex)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_binary_info_version_is_a_typed_error() {
        let info = b::QnnSystemContext_BinaryInfo_t {
            version: 4,
            ..Default::default()
        };
        // SAFETY: version 4 is refused before any field is read.
        let err = unsafe { convert_binary_info(&info) }.unwrap_err();
        assert_eq!(
            err.to_string(),
            "context binary info: unknown binary info version 4 (htpkv reads 1, 2, 3)"
        );
    }

    #[test]
    fn an_unknown_graph_info_version_is_a_typed_error() {
        let mut graphs = [b::QnnSystemContext_GraphInfo_t {
            version: 9,
            ..Default::default()
        }];
        let mut info = b::QnnSystemContext_BinaryInfo_t {
            version: b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3,
            ..Default::default()
        };
        info.__bindgen_anon_1.contextBinaryInfoV3 = b::QnnSystemContext_BinaryInfoV3_t {
            numGraphs: 1,
            graphs: graphs.as_mut_ptr(),
            ..Default::default()
        };
        // SAFETY: one graph info entry, refused before its fields are read.
        let err = unsafe { convert_binary_info(&info) }.unwrap_err();
        assert!(matches!(
            err,
            QnnError::UnknownVersion {
                what: "graph info",
                version: 9,
                ..
            }
        ));
    }

    #[test]
    fn absurd_counts_are_refused_before_reading() {
        let mut info = b::QnnSystemContext_BinaryInfo_t {
            version: b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1,
            ..Default::default()
        };
        info.__bindgen_anon_1.contextBinaryInfoV1 = b::QnnSystemContext_BinaryInfoV1_t {
            numGraphs: u32::MAX,
            graphs: std::ptr::NonNull::dangling().as_ptr(),
            ..Default::default()
        };
        // SAFETY: the count is refused before the (dangling) array is read.
        let err = unsafe { convert_binary_info(&info) }.unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
    }
}
