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

mod backend;
mod errors;
mod graph;
mod log;
mod memory;
mod present;
mod providers;
mod state;
mod system;

use std::ffi::CStr;

pub use memory::STRICT_ENV;
pub use present::{
    NAMES_ENV, presented, reported_graph_name, reported_order, reported_shape,
    reported_tensor_name, tensor_info,
};
pub use providers::{QnnInterface_getProviders, QnnSystemInterface_getProviders};
pub use system::{LAYOUT_ENV, Layout};

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
pub(crate) const BUILD_ID: &CStr = c"htpkv-ref-qnn 0.1.0";
/// Version reported for the context blob (htpkv's compiled-file format).
pub(crate) const CONTEXT_BLOB_VERSION: (u32, u32, u32) = (ref_backend::FORMAT_VERSION, 0, 0);

pub(crate) type Rc = u64;
pub(crate) const OK: Rc = 0;

pub(crate) fn code(c: u32) -> Rc {
    u64::from(c)
}
