//! The system library: reading a context binary's metadata (graphs and their IO tensors).

use std::ffi::CStr;
use std::sync::Arc;

use crate::bindings as b;
use crate::error::{QnnError, qnn_error};
use crate::loader::QnnSystemLibrary;
use crate::types::{TensorInfo, Version};

/// One graph of a context binary.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphInfo {
    /// Graph name (for `graphRetrieve`).
    pub name: String,
    /// Inputs in execution order.
    pub inputs: Vec<TensorInfo>,
    /// Outputs in execution order.
    pub outputs: Vec<TensorInfo>,
}

/// A context binary's metadata, copied into plain Rust values.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryInfo {
    /// Backend id the binary was made for.
    pub backend_id: u32,
    /// Build id of the tool that made it, if recorded.
    pub build_id: Option<String>,
    /// Core API version it was made with.
    pub core_api: Version,
    /// Backend API version it was made with.
    pub backend_api: Version,
    /// SoC it was made for, if recorded.
    pub soc_version: Option<String>,
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

/// Reads tensors from a raw array.
///
/// # Safety
/// `ptr` must point to `n` valid tensors (or be NULL with `n == 0`).
unsafe fn tensors(
    ptr: *const b::Qnn_Tensor_t,
    n: u32,
    what: &str,
) -> Result<Vec<TensorInfo>, QnnError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(QnnError::BinaryInfo {
            reason: format!("{n} {what} listed but the array is NULL"),
        });
    }
    // SAFETY: caller's contract.
    let raw = unsafe { std::slice::from_raw_parts(ptr, n as usize) };
    // SAFETY: each element is a valid tensor (caller's contract).
    raw.iter()
        .map(|t| unsafe { TensorInfo::from_raw(t) })
        .collect()
}

/// Converts raw binary info (versions 1 to 3: htpkv reads only the leading fields, which
/// versions 2 and 3 share with version 1).
///
/// # Safety
/// `info` and everything it points to must be valid QNN binary info.
pub unsafe fn convert_binary_info(
    info: &b::QnnSystemContext_BinaryInfo_t,
) -> Result<BinaryInfo, QnnError> {
    let v1 = match info.version {
        b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1
        | b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_2
        | b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3 => {
            // SAFETY: every version begins with version 1's fields at the same offsets.
            unsafe { &info.__bindgen_anon_1.contextBinaryInfoV1 }
        }
        other => {
            return Err(QnnError::BinaryInfo {
                reason: format!("unsupported binary info version {other}"),
            });
        }
    };
    let mut graphs = Vec::new();
    if v1.numGraphs > 0 {
        if v1.graphs.is_null() {
            return Err(QnnError::BinaryInfo {
                reason: format!("{} graphs listed but the array is NULL", v1.numGraphs),
            });
        }
        // SAFETY: `graphs` holds `numGraphs` entries.
        let raw = unsafe { std::slice::from_raw_parts(v1.graphs, v1.numGraphs as usize) };
        for g in raw {
            if !matches!(
                g.version,
                b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1
                    | b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_2
                    | b::QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_3
            ) {
                return Err(QnnError::BinaryInfo {
                    reason: format!("unsupported graph info version {}", g.version),
                });
            }
            // SAFETY: versions 1-3 share the leading five fields of version 1.
            let gi = unsafe { &g.__bindgen_anon_1.graphInfoV1 };
            let name = opt_str(gi.graphName).ok_or_else(|| QnnError::BinaryInfo {
                reason: "a graph has no name".into(),
            })?;
            // SAFETY: arrays as described by their counts.
            let inputs = unsafe { tensors(gi.graphInputs, gi.numGraphInputs, "inputs") }?;
            // SAFETY: as above.
            let outputs = unsafe { tensors(gi.graphOutputs, gi.numGraphOutputs, "outputs") }?;
            graphs.push(GraphInfo {
                name,
                inputs,
                outputs,
            });
        }
    }
    Ok(BinaryInfo {
        backend_id: v1.backendId,
        build_id: opt_str(v1.buildId),
        core_api: Version::from_raw(&v1.coreApiVersion),
        backend_api: Version::from_raw(&v1.backendApiVersion),
        soc_version: opt_str(v1.socVersion),
        graphs,
    })
}
