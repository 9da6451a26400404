//! Where the KV region lives when it runs through a QNN backend library, and how its tensors are
//! handed to the library.
//!
//! | `--qnn-memory` | region | K/V tensors passed as |
//! |---|---|---|
//! | `shared-buffer` | rpcmem (`libcdsprpc.so`, dma-buf); on a machine without it a Linux `memfd` (which only the reference library can map) | registered HTP shared buffers (fd + offset) |
//! | `host` | host memory | htpkv's host descriptor (only the reference library understands it) |
//! | `client` | host memory | client buffers (`QNN_TENSORMEMTYPE_RAW`): works with every backend, at the cost of a copy per execute on HTP |
//! | `auto` (default) | rpcmem when it loads, else as below | shared buffers with rpcmem; with the reference library (its provider is named `htpkv_ref`) host descriptors when it accepts them (probed once; its strict mode refuses them as a real HTP would); otherwise client buffers |

use std::str::FromStr;

use kv_manager::{HostAllocator, KvError, RegionAllocator, RegionMemory};
pub use qnn_ffi::DEFAULT_MAX_HANDLES;
use qnn_ffi::{RpcBuffer, RpcMemAllocator};

/// The memory choice asked for (`--qnn-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QnnMemory {
    /// Decide from what is available (see the module docs).
    #[default]
    Auto,
    /// Registered shared buffers (fd + offset).
    SharedBuffer,
    /// Client buffers, no registration.
    Client,
    /// htpkv's host descriptor (reference library only).
    Host,
}

impl FromStr for QnnMemory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => QnnMemory::Auto,
            "shared-buffer" => QnnMemory::SharedBuffer,
            "client" => QnnMemory::Client,
            "host" => QnnMemory::Host,
            other => {
                return Err(format!(
                    "unknown QNN memory `{other}` (expected auto, shared-buffer, client or host)"
                ));
            }
        })
    }
}

/// What is used, after `auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryUse {
    /// Shared buffers from rpcmem.
    RpcMem,
    /// Shared buffers from a Linux memfd (desktop stand-in for a dma-buf).
    Memfd,
    /// Host memory registered with htpkv's host descriptor.
    Host,
    /// Client buffers.
    Client,
}

impl MemoryUse {
    /// The name shown by `--stats` and `--json`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryUse::RpcMem => "shared-buffer (rpcmem)",
            MemoryUse::Memfd => "shared-buffer (memfd)",
            MemoryUse::Host => "host",
            MemoryUse::Client => "client",
        }
    }

    /// True when K/V tensors are registered as memory handles.
    pub fn registers(self) -> bool {
        self != MemoryUse::Client
    }

    /// Resolves `mode` for a backend library whose provider is (or is not) htpkv's reference
    /// library, with rpcmem if it loaded. `Auto` with the reference library gives `Host`, which
    /// the backend confirms with one probe registration (falling back to `Client`).
    pub fn resolve(mode: QnnMemory, reference: bool, rpcmem: bool) -> MemoryUse {
        match mode {
            QnnMemory::SharedBuffer if rpcmem => MemoryUse::RpcMem,
            QnnMemory::SharedBuffer => MemoryUse::Memfd,
            QnnMemory::Client => MemoryUse::Client,
            QnnMemory::Host => MemoryUse::Host,
            QnnMemory::Auto if rpcmem => MemoryUse::RpcMem,
            QnnMemory::Auto if reference => MemoryUse::Host,
            QnnMemory::Auto => MemoryUse::Client,
        }
    }

    /// The allocator for the region.
    pub fn allocator(self, rpcmem: Option<RpcMemAllocator>) -> Box<dyn RegionAllocator + Send> {
        match (self, rpcmem) {
            (MemoryUse::RpcMem, Some(rpc)) => Box::new(RpcRegionAllocator(rpc)),
            (MemoryUse::Memfd, _) => Box::new(MemfdAllocator),
            _ => Box::new(HostAllocator::default()),
        }
    }
}

/// rpcmem allocations as KV region memory.
#[derive(Debug)]
pub struct RpcRegionAllocator(pub RpcMemAllocator);

#[derive(Debug)]
struct RpcRegion(RpcBuffer);

// SAFETY: an rpcmem allocation of `len` bytes, zeroed, page aligned (checked against the requested
// alignment at allocation), owned by this value and freed only when it drops.
unsafe impl RegionMemory for RpcRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn fd(&self) -> Option<i32> {
        Some(self.0.fd())
    }
}

impl RegionAllocator for RpcRegionAllocator {
    fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError> {
        let buffer = self
            .0
            .allocate(bytes, align)
            .map_err(|e| KvError::Allocation {
                bytes,
                align,
                reason: e.to_string(),
            })?;
        Ok(Box::new(RpcRegion(buffer)))
    }
}

/// Shared memory from a Linux `memfd`, mapped here and by the backend through its fd: the
/// desktop stand-in for an rpcmem dma-buf, so the fd + offset registration path runs without a
/// device. On other systems allocation fails with a message saying so.
#[derive(Debug, Clone, Copy)]
pub struct MemfdAllocator;

#[cfg(any(target_os = "linux", target_os = "android"))]
mod memfd {
    use super::MemfdAllocator;
    use kv_manager::{KvError, RegionAllocator, RegionMemory};

    #[derive(Debug)]
    struct MemfdRegion {
        ptr: *mut u8,
        len: usize,
        fd: i32,
    }

    // SAFETY: the mapping is exclusively owned by this value; unmapping from another thread is
    // sound.
    unsafe impl Send for MemfdRegion {}

    // SAFETY: a fresh shared mapping of `len` bytes of a new memfd (zero-filled by the kernel, page
    // aligned), owned by this value and unmapped only when it drops.
    unsafe impl RegionMemory for MemfdRegion {
        fn as_ptr(&self) -> *mut u8 {
            self.ptr
        }
        fn len(&self) -> usize {
            self.len
        }
        fn fd(&self) -> Option<i32> {
            Some(self.fd)
        }
    }

    impl Drop for MemfdRegion {
        fn drop(&mut self) {
            // SAFETY: mapped and opened by `MemfdAllocator::allocate`, released exactly once.
            unsafe {
                libc::munmap(self.ptr.cast(), self.len);
                libc::close(self.fd);
            }
        }
    }

    impl RegionAllocator for MemfdAllocator {
        fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError> {
            let fail = |reason: String| KvError::Allocation {
                bytes,
                align,
                reason,
            };
            let len = bytes.max(1);
            if align > 4096 {
                return Err(fail(format!(
                    "memfd mappings are page aligned, not {align}"
                )));
            }
            let size = libc::off_t::try_from(len).map_err(|_| fail("size exceeds off_t".into()))?;
            // SAFETY: plain system calls on a file descriptor this function owns; every failure is
            // checked and releases what was acquired.
            unsafe {
                let fd = libc::memfd_create(c"htpkv-kv-region".as_ptr(), libc::MFD_CLOEXEC);
                if fd < 0 {
                    return Err(fail(std::io::Error::last_os_error().to_string()));
                }
                if libc::ftruncate(fd, size) != 0 {
                    let e = std::io::Error::last_os_error();
                    libc::close(fd);
                    return Err(fail(e.to_string()));
                }
                let prot = libc::PROT_READ | libc::PROT_WRITE;
                let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0);
                if p == libc::MAP_FAILED || p.is_null() {
                    let e = std::io::Error::last_os_error();
                    libc::close(fd);
                    return Err(fail(e.to_string()));
                }
                Ok(Box::new(MemfdRegion {
                    ptr: p.cast(),
                    len,
                    fd,
                }))
            }
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
impl RegionAllocator for MemfdAllocator {
    fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError> {
        Err(KvError::Allocation {
            bytes,
            align,
            reason: "memfd shared memory needs Linux".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_rpcmem_then_host_for_the_reference_library_then_client() {
        assert_eq!(
            MemoryUse::resolve(QnnMemory::Auto, false, true),
            MemoryUse::RpcMem
        );
        assert_eq!(
            MemoryUse::resolve(QnnMemory::Auto, true, false),
            MemoryUse::Host
        );
        assert_eq!(
            MemoryUse::resolve(QnnMemory::Auto, false, false),
            MemoryUse::Client
        );
        assert_eq!(
            MemoryUse::resolve(QnnMemory::SharedBuffer, true, false),
            MemoryUse::Memfd
        );
        assert!("dma".parse::<QnnMemory>().is_err());
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn memfd_region_is_zeroed_shared_memory_with_an_fd() {
        let region = MemfdAllocator.allocate(10_000, 64).unwrap();
        assert!(region.fd().is_some_and(|fd| fd >= 0));
        // SAFETY: the region is 10,000 bytes, owned here.
        let bytes = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[9_999] = 7;
        assert_eq!(bytes[9_999], 7);
    }
}
