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

/// Aligned, zeroed host memory. With `prefault` (the default) every page is touched at allocation
/// so that, like a device allocation, the memory is committed before the first step and page faults
/// never land in a step's latency. Without it the memory comes zeroed from `calloc`, which maps
/// large allocations lazily: pages that are never written (e.g. by a short `htpkv plan` simulation of
/// a large cache) are never backed by RAM.
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
    /// The aligned start handed out, inside the allocation.
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// The allocation itself (over-sized by the alignment) and its layout, for `dealloc`.
    base: std::ptr::NonNull<u8>,
    layout: Layout,
}

// SAFETY: HostMemory exclusively owns its allocation; moving that ownership between threads is sound.
unsafe impl Send for HostMemory {}

// SAFETY: `base` comes from `alloc_zeroed` with `layout`, whose size is `len + align - 1`; `ptr` is
// the first `align`-aligned address in it, so `ptr .. ptr + len` lies inside the allocation, which is
// owned by this value alone and freed only in Drop.
unsafe impl RegionMemory for HostMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `HostAllocator::allocate` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

impl RegionAllocator for HostAllocator {
    fn allocate(&self, bytes: usize, align: usize) -> Result<Box<dyn RegionMemory>, KvError> {
        let fail = |reason: String| KvError::Allocation {
            bytes,
            align,
            reason,
        };
        if !align.is_power_of_two() {
            return Err(fail("the alignment is not a power of two".into()));
        }
        let len = bytes.max(1);
        // A small alignment makes `alloc_zeroed` a `calloc` (lazily mapped when large) rather than an
        // aligned allocation followed by a memset of every page; the region is aligned by hand inside.
        let size = len
            .checked_add(align - 1)
            .ok_or_else(|| fail("the size overflows".into()))?;
        let layout = Layout::from_size_align(size, 16).map_err(|e| fail(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = std::ptr::NonNull::new(raw).ok_or_else(|| fail("out of memory".into()))?;
        let skip = (align - base.as_ptr() as usize % align) % align;
        // SAFETY: `skip < align`, so `base + skip + len <= base + size`: inside the allocation.
        let ptr = unsafe { base.add(skip) };
        if self.prefault {
            const PAGE: usize = 4096;
            let mut at = 0;
            while at < len {
                // SAFETY: `at < len`, inside the region we own; a volatile write of the zero already
                // there commits the page without changing the contents.
                unsafe { std::ptr::write_volatile(ptr.as_ptr().add(at), 0) };
                at += PAGE;
            }
        }
        Ok(Box::new(HostMemory {
            ptr,
            len,
            base,
            layout,
        }))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident set size of this process, from /proc/self/statm (Linux), in bytes.
    #[cfg(target_os = "linux")]
    fn rss_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    #[test]
    fn regions_are_aligned_zeroed_and_writable() {
        for prefault in [false, true] {
            for bytes in [0, 1, 4095, 4097, 1 << 20] {
                let mut r = Region::allocate(&HostAllocator { prefault }, bytes).unwrap();
                assert_eq!(r.len(), bytes);
                assert!((r.as_ptr() as usize).is_multiple_of(REGION_ALIGN));
                assert!(r.as_slice().iter().all(|&b| b == 0));
                r.as_mut_slice().fill(7);
                assert!(r.as_slice().iter().all(|&b| b == 7));
            }
        }
    }

    /// Without prefaulting, a large region costs no RAM until written.
    #[cfg(target_os = "linux")]
    #[test]
    fn without_prefault_untouched_pages_stay_unmapped() {
        const GIB: usize = 1 << 30;
        let before = rss_bytes();
        let mut r = Region::allocate(&HostAllocator { prefault: false }, 2 * GIB).unwrap();
        r.as_mut_slice()[GIB] = 1;
        let grown = rss_bytes().saturating_sub(before);
        assert!(grown < GIB / 4, "RSS grew by {grown} bytes");
        assert_eq!(r.as_slice()[GIB + 1], 0);
    }
}
