//! `memRegister`, `memDeRegister`: shared buffers (fd + offset, mapped with `mmap`), ION fds and
//! htpkv's host-memory descriptor.

use std::ffi::c_void;

use qnn_ffi::bindings as b;
use qnn_ffi::qnn_dtype_size;

use crate::state::{MemObj, as_handle, guard, key, state};
use crate::{OK, Rc, code};

/// Environment variable: when `1`, the library refuses htpkv's host-memory descriptor the way a
/// real HTP backend does (`QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE`), accepting only shared buffers
/// (fd + offset) and client buffers.
pub const STRICT_ENV: &str = "HTPKV_REF_QNN_STRICT";

fn strict() -> bool {
    std::env::var(STRICT_ENV).as_deref() == Ok("1")
}

/// A shared read-write mapping of the first `len` bytes of `fd`; `None` when it cannot be made
/// (always, off Unix: no file descriptors to map).
#[cfg(unix)]
fn map_fd(fd: i32, len: usize) -> Option<*mut c_void> {
    if fd < 0 || len == 0 {
        return None;
    }
    // SAFETY: a fresh shared mapping of `len` bytes of `fd` at an address the kernel picks;
    // failure is reported as MAP_FAILED and nothing else is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED && !p.is_null()).then_some(p)
}

#[cfg(not(unix))]
fn map_fd(_fd: i32, _len: usize) -> Option<*mut c_void> {
    None
}

/// Releases a mapping [`map_fd`] made.
pub(crate) fn unmap(mapping: Option<(*mut c_void, usize)>) {
    #[cfg(unix)]
    if let Some((p, len)) = mapping {
        // SAFETY: `p`/`len` came from a successful mmap made by this library, unmapped once.
        unsafe { libc::munmap(p, len) };
    }
    #[cfg(not(unix))]
    let _ = mapping;
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

pub(crate) unsafe extern "C" fn mem_register(
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

pub(crate) unsafe extern "C" fn mem_deregister(handles: *const b::Qnn_MemHandle_t, n: u32) -> Rc {
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
