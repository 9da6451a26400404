//! An rpcmem allocator for KV regions on Qualcomm devices: shared buffers from
//! `libcdsprpc.so` (`rpcmem_alloc`, `rpcmem_free`, `rpcmem_to_fd`) that the HTP can access
//! directly and QNN registers as (fd, offset) memory handles.
//!
//! On a desktop the library is absent: [`RpcMemAllocator::new`] returns
//! [`QnnError::RpcMemUnavailable`] and callers choose other memory. This crate does not know the KV
//! cache: the runtime (`htpkv`) adapts [`RpcBuffer`] to its region allocator.

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::QnnError;

/// Default library name (found through the dynamic loader's search path).
pub const RPCMEM_LIBRARY: &str = "libcdsprpc.so";
/// rpcmem heap id of the system heap (`RPCMEM_HEAP_ID_SYSTEM`).
pub const RPCMEM_HEAP_ID_SYSTEM: i32 = 25;
/// rpcmem default flags (`RPCMEM_DEFAULT_FLAGS`: cached).
pub const RPCMEM_DEFAULT_FLAGS: u32 = 1;

type AllocFn = unsafe extern "C" fn(heap_id: i32, flags: u32, size: i32) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(ptr: *mut c_void);
type ToFdFn = unsafe extern "C" fn(ptr: *mut c_void) -> i32;

struct RpcMemLib {
    alloc: AllocFn,
    free: FreeFn,
    to_fd: ToFdFn,
    _lib: libloading::Library,
}

/// Allocates region memory with rpcmem. Cheap to clone; the library stays loaded while any
/// allocation lives.
#[derive(Clone)]
pub struct RpcMemAllocator {
    lib: Arc<RpcMemLib>,
    library: String,
    heap_id: i32,
    flags: u32,
}

impl std::fmt::Debug for RpcMemAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcMemAllocator")
            .field("library", &self.library)
            .field("heap_id", &self.heap_id)
            .field("flags", &self.flags)
            .finish()
    }
}

impl RpcMemAllocator {
    /// Loads `libcdsprpc.so` with the system heap and default flags.
    pub fn new() -> Result<RpcMemAllocator, QnnError> {
        RpcMemAllocator::with_library(RPCMEM_LIBRARY, RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS)
    }

    /// Loads rpcmem from `library` and allocates from `heap_id` with `flags`.
    pub fn with_library(
        library: &str,
        heap_id: i32,
        flags: u32,
    ) -> Result<RpcMemAllocator, QnnError> {
        let unavailable = |reason: String| QnnError::RpcMemUnavailable {
            library: library.to_string(),
            reason,
        };
        // SAFETY: libcdsprpc is an ordinary shared library without initializer preconditions.
        let lib = unsafe { libloading::Library::new(library) }
            .map_err(|e| unavailable(crate::loader::loader_reason(&e)))?;
        // SAFETY: the symbols have the rpcmem signatures declared by the type aliases.
        let (alloc, free, to_fd) = unsafe {
            let missing = |symbol: &str, e: libloading::Error| {
                unavailable(format!("{symbol}: {}", crate::loader::loader_reason(&e)))
            };
            let alloc = *lib
                .get::<AllocFn>(b"rpcmem_alloc")
                .map_err(|e| missing("rpcmem_alloc", e))?;
            let free = *lib
                .get::<FreeFn>(b"rpcmem_free")
                .map_err(|e| missing("rpcmem_free", e))?;
            let to_fd = *lib
                .get::<ToFdFn>(b"rpcmem_to_fd")
                .map_err(|e| missing("rpcmem_to_fd", e))?;
            (alloc, free, to_fd)
        };
        Ok(RpcMemAllocator {
            lib: Arc::new(RpcMemLib {
                alloc,
                free,
                to_fd,
                _lib: lib,
            }),
            library: library.to_string(),
            heap_id,
            flags,
        })
    }
}

/// One rpcmem allocation: zeroed, page aligned, freed on drop.
pub struct RpcBuffer {
    lib: Arc<RpcMemLib>,
    ptr: *mut u8,
    len: usize,
    fd: i32,
}

impl std::fmt::Debug for RpcBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("fd", &self.fd)
            .finish()
    }
}

// SAFETY: the allocation is exclusively owned by this value; rpcmem allows freeing from any thread.
unsafe impl Send for RpcBuffer {}

impl RpcBuffer {
    /// Start of the allocation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty allocation (never: sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The dma-buf file descriptor QNN registers (`QnnMemHtp` shared buffer).
    pub fn fd(&self) -> i32 {
        self.fd
    }
}

impl Drop for RpcBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by this library's rpcmem_alloc, freed exactly once.
        unsafe { (self.lib.free)(self.ptr.cast()) }
    }
}

impl RpcMemAllocator {
    /// Allocates `bytes` (at least 1) zeroed bytes aligned to `align`.
    pub fn allocate(&self, bytes: usize, align: usize) -> Result<RpcBuffer, QnnError> {
        let size = i32::try_from(bytes.max(1)).map_err(|_| QnnError::RpcMemAlloc { bytes })?;
        // SAFETY: plain allocation call with a positive size.
        let ptr = unsafe { (self.lib.alloc)(self.heap_id, self.flags, size) }.cast::<u8>();
        if ptr.is_null() {
            return Err(QnnError::RpcMemAlloc { bytes });
        }
        // SAFETY: `ptr` is a live rpcmem allocation.
        let fd = unsafe { (self.lib.to_fd)(ptr.cast()) };
        let buffer = RpcBuffer {
            lib: self.lib.clone(),
            ptr,
            len: size as usize,
            fd,
        };
        if !(ptr as usize).is_multiple_of(align.max(1)) || fd < 0 {
            return Err(QnnError::RpcMemAlloc { bytes });
        }
        // SAFETY: the allocation is `size` bytes, writable and ours.
        unsafe { std::ptr::write_bytes(ptr, 0, size as usize) };
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_typed_error() {
        match RpcMemAllocator::with_library("libhtpkv_no_such_rpcmem.so", 25, 1) {
            Err(QnnError::RpcMemUnavailable { library, reason }) => {
                assert_eq!(library, "libhtpkv_no_such_rpcmem.so");
                assert!(!reason.is_empty());
            }
            other => panic!("expected RpcMemUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn library_without_rpcmem_symbols_is_a_typed_error() {
        match RpcMemAllocator::with_library("libc.so.6", 25, 1) {
            Err(QnnError::RpcMemUnavailable { reason, .. }) => {
                assert!(reason.contains("rpcmem_alloc"), "{reason}");
            }
            other => panic!("expected RpcMemUnavailable, got {other:?}"),
        }
    }
}
