//! Test fixture for `qnn_ffi`: a shared library that exports `QnnInterface_getProviders` and
//! `QnnSystemInterface_getProviders`, but whose providers report API versions htpkv must reject
//! (core API 1.99 and 3.0; system API 2.0). `qnn_ffi`'s loader must answer with
//! `QnnError::NoCompatibleProvider` listing these versions, and must never call into the (all
//! NULL) function tables.
//!
//! The structs are declared here independently of `qnn_ffi` (as a foreign library would); only
//! the leading fields up to the version matter to the loader.

use std::ffi::c_char;

/// `Qnn_Version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

/// A core provider: backend id, name, core + backend API versions, then a table of NULLs.
#[repr(C)]
#[derive(Debug)]
pub struct CoreProvider {
    /// Backend id.
    pub backend_id: u32,
    /// Provider name (NUL-terminated).
    pub name: *const c_char,
    /// Core API version.
    pub core: Version,
    /// Backend API version.
    pub backend: Version,
    /// The function table: all NULL.
    pub table: [usize; 64],
}

/// A system provider: backend id, name, system API version, then a table of NULLs.
#[repr(C)]
#[derive(Debug)]
pub struct SystemProvider {
    /// Backend id.
    pub backend_id: u32,
    /// Provider name (NUL-terminated).
    pub name: *const c_char,
    /// System API version.
    pub system: Version,
    /// The function table: all NULL.
    pub table: [usize; 8],
}

/// A list of provider pointers that can live in a `static`.
#[repr(transparent)]
#[derive(Debug)]
pub struct List<T: 'static, const N: usize>(pub [&'static T; N]);

// SAFETY: the lists and providers are immutable statics; the raw name pointers point to static,
// immutable string literals, so sharing them between threads is sound.
unsafe impl<T, const N: usize> Sync for List<T, N> {}
// SAFETY: as above, the pointed-to data is immutable and 'static.
unsafe impl Sync for CoreProvider {}
// SAFETY: as above.
unsafe impl Sync for SystemProvider {}

const V0: Version = Version {
    major: 0,
    minor: 0,
    patch: 0,
};

static OLD_CORE: CoreProvider = CoreProvider {
    backend_id: 99,
    name: c"too_old".as_ptr(),
    core: Version {
        major: 1,
        minor: 99,
        patch: 0,
    },
    backend: V0,
    table: [0; 64],
};

static NEW_CORE: CoreProvider = CoreProvider {
    backend_id: 99,
    name: c"too_new".as_ptr(),
    core: Version {
        major: 3,
        minor: 0,
        patch: 0,
    },
    backend: V0,
    table: [0; 64],
};

static CORE_LIST: List<CoreProvider, 2> = List([&OLD_CORE, &NEW_CORE]);

static SYSTEM: SystemProvider = SystemProvider {
    backend_id: 99,
    name: c"system_too_new".as_ptr(),
    system: Version {
        major: 2,
        minor: 0,
        patch: 0,
    },
    table: [0; 8],
};

static SYSTEM_LIST: List<SystemProvider, 1> = List([&SYSTEM]);

/// The core entry point: two providers with incompatible core API versions.
///
/// # Safety
/// `list` and `count` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnInterface_getProviders(
    list: *mut *const *const CoreProvider,
    count: *mut u32,
) -> u64 {
    if list.is_null() || count.is_null() {
        return 1004;
    }
    // SAFETY: both pointers were checked for NULL; the caller guarantees they are writable.
    unsafe {
        *list = CORE_LIST.0.as_ptr().cast();
        *count = 2;
    }
    0
}

/// The system entry point: one provider with an incompatible system API version.
///
/// # Safety
/// `list` and `count` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnSystemInterface_getProviders(
    list: *mut *const *const SystemProvider,
    count: *mut u32,
) -> u64 {
    if list.is_null() || count.is_null() {
        return 1004;
    }
    // SAFETY: both pointers were checked for NULL; the caller guarantees they are writable.
    unsafe {
        *list = SYSTEM_LIST.0.as_ptr().cast();
        *count = 1;
    }
    0
}
