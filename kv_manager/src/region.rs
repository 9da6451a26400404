//! The one contiguous region that holds every K/V buffer, and the allocators that provide it.

use crate::KvError;
use std::alloc::Layout;

/// Alignment of regions from [`HostAllocator`]: one page, as rpcmem/dma-buf allocations are.
pub const REGION_ALIGN: usize = 4096;

/// Memory that backs a [`Region`].
///
/// # Safety
/// Implementors guarantee that `as_ptr()` points to `len()` bytes that are readable and writable, stay
/// valid and do not move until the value is dropped, are aligned to at least the alignment that was
/// requested, and are not accessed by anything else while the value lives (except a device that the
/// owner hands the memory to, e.g. through QNN memory registration).
pub unsafe trait RegionMemory: Send + std::fmt::Debug {
    /// Start of the memory.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when `len() == 0`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The file descriptor of a shared (rpcmem/dma-buf) allocation, when there is one; a QNN HTP backend
    /// registers memory handles as (fd, offset).
    fn fd(&self) -> Option<i32> {
        None
    }
}

/// Provides region memory. The host allocator serves desktops; the QNN crate adds an rpcmem allocator.
pub trait RegionAllocator: std::fmt::Debug {
    /// Allocates `bytes` bytes (at least 1) aligned to `align`, filled with zeros.
    fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError>;
}

/// Aligned, zeroed host memory. Every page is touched at allocation (`prefault`, on by default) so
/// that, like a device allocation, the memory is committed before the first step and page faults
/// never land in a step's latency.
#[derive(Debug, Clone, Copy)]
pub struct HostAllocator {
    /// Touch every page when allocating.
    pub prefault: bool,
}

impl Default for HostAllocator {
    fn default() -> Self {
        HostAllocator { prefault: true }
    }
}

#[derive(Debug)]
struct HostMemory {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

// SAFETY: HostMemory exclusively owns its allocation; moving that ownership between threads is sound.
unsafe impl Send for HostMemory {}

// SAFETY: `ptr` comes from `alloc_zeroed` with `layout` (size `layout.size()`, the requested alignment),
// is owned by this value alone and freed only in Drop.
unsafe impl RegionMemory for HostMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `HostAllocator::allocate` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl RegionAllocator for HostAllocator {
    fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError> {
        let fail = |reason: String| KvError::Allocation {
            bytes,
            align,
            reason,
        };
        let layout =
            Layout::from_size_align(bytes.max(1), align).map_err(|e| fail(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).ok_or_else(|| fail("out of memory".into()))?;
        if self.prefault {
            const PAGE: usize = 4096;
            let mut at = 0;
            while at < layout.size() {
                // SAFETY: `at < layout.size()`, inside the allocation we own; a volatile write of the
                // zero already there commits the page without changing the contents.
                unsafe { std::ptr::write_volatile(ptr.as_ptr().add(at), 0) };
                at += PAGE;
            }
        }
        Ok(Box::new(HostMemory { ptr, layout }))
    }
}

/// The region: one contiguous allocation holding every K/V buffer (and, for the copying strategies,
/// the graph's output buffers).
#[derive(Debug)]
pub struct Region {
    memory: Box<dyn RegionMemory>,
    len: usize,
}

impl Region {
    /// Allocates `bytes` bytes with `allocator`, aligned to [`REGION_ALIGN`].
    pub fn allocate(allocator: &dyn RegionAllocator, bytes: usize) -> Result<Region, KvError> {
        let memory = allocator.allocate(bytes, REGION_ALIGN)?;
        if memory.len() < bytes || !(memory.as_ptr() as usize).is_multiple_of(REGION_ALIGN) {
            return Err(KvError::Allocation {
                bytes,
                align: REGION_ALIGN,
                reason: format!(
                    "allocator returned {} bytes at {:p}",
                    memory.len(),
                    memory.as_ptr()
                ),
            });
        }
        Ok(Region { memory, len: bytes })
    }

    /// Size in bytes (the size the cache asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-sized region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base pointer, for binding tensors of a graph execution (QNN client buffers or memory handles).
    /// Writes through it must respect Rust's aliasing rules: no live borrow of the region may overlap.
    pub fn as_ptr(&self) -> *mut u8 {
        self.memory.as_ptr()
    }

    /// The file descriptor of a shared allocation, if any.
    pub fn fd(&self) -> Option<i32> {
        self.memory.fd()
    }

    /// The whole region as bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: RegionMemory guarantees `len() >= self.len` valid bytes that nothing else accesses;
        // the shared borrow of `self` prevents mutation through this type.
        unsafe { std::slice::from_raw_parts(self.memory.as_ptr(), self.len) }
    }

    /// The whole region as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the exclusive borrow of `self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_ptr(), self.len) }
    }
}
