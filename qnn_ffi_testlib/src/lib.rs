//! Test fixture for `qnn_ffi`: a shared library that exports `QnnInterface_getProviders` and
//! `QnnSystemInterface_getProviders`, but whose providers report API versions htpkv must reject
//! (core API 1.99 and 3.0; system API 2.0). With `QNN_FFI_TESTLIB_SYSTEM=v3` or `=v1` its system
//! provider is instead a working, independent one (system API 1.1) that describes an AI Hub-style
//! binary with foreign tensor names ([`foreign`]). `qnn_ffi`'s loader must answer with
//! `QnnError::NoCompatibleProvider` listing these versions, and must never call into the (all
//! NULL) function tables.
//!
//! The structs are declared here independently of `qnn_ffi` (as a foreign library would); only
//! the leading fields up to the version matter to the loader.

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

mod foreign;

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

/// Environment variable that turns on the independent system provider (`v3` or `v1`).
pub const SYSTEM_ENV: &str = "QNN_FFI_TESTLIB_SYSTEM";

/// Binary infos handed out, by system-context handle (the handle is the key, never a pointer).
static BUILT: Mutex<Vec<(usize, Vec<foreign::Built>)>> = Mutex::new(Vec::new());

unsafe extern "C" fn sys_create(out: *mut *mut c_void) -> u64 {
    if out.is_null() {
        return 30001;
    }
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let key = 0x5157_0000 + 16 * (built.len() + 1);
    built.push((key, Vec::new()));
    // SAFETY: checked non-NULL; the caller provides a writable slot.
    unsafe { *out = key as *mut c_void };
    0
}

unsafe extern "C" fn sys_info(
    handle: *mut c_void,
    _binary: *mut c_void,
    _size: u64,
    out: *mut *const c_void,
    out_size: *mut u64,
) -> u64 {
    let v3 = std::env::var(SYSTEM_ENV).as_deref() != Ok("v1");
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_, infos)) = built.iter_mut().find(|(k, _)| *k == handle as usize) else {
        return 30000;
    };
    if out.is_null() {
        return 30001;
    }
    let info = foreign::build(v3);
    // SAFETY: checked non-NULL; the info lives until the system context is freed.
    unsafe { *out = info.info_ptr() };
    if !out_size.is_null() {
        // SAFETY: a non-NULL out-pointer supplied by the caller.
        unsafe { *out_size = 144 };
    }
    infos.push(info);
    0
}

unsafe extern "C" fn sys_free(handle: *mut c_void) -> u64 {
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    built.retain(|(k, _)| *k != handle as usize);
    0
}

/// The working, independent system provider (see [`SYSTEM_ENV`]).
static FOREIGN_SYSTEM: SystemProvider = SystemProvider {
    backend_id: 6,
    name: c"foreign_system".as_ptr(),
    system: Version {
        major: 1,
        minor: 1,
        patch: 0,
    },
    table: [0; 8],
};

/// The foreign provider's table: create, get binary info, get metadata (absent), free.
fn foreign_table() -> [usize; 8] {
    let mut t = [0usize; 8];
    t[0] = sys_create as *const () as usize;
    t[1] = sys_info as *const () as usize;
    t[3] = sys_free as *const () as usize;
    t
}

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
    if std::env::var_os(SYSTEM_ENV).is_some() {
        // The table holds function addresses, which a `static` initializer cannot take as
        // integers: the provider is made once and kept for the life of the library.
        static TABLED: Mutex<Option<&'static List<SystemProvider, 1>>> = Mutex::new(None);
        let mut tabled = TABLED.lock().unwrap_or_else(|p| p.into_inner());
        let list_ref = *tabled.get_or_insert_with(|| {
            let provider: &'static SystemProvider = Box::leak(Box::new(SystemProvider {
                table: foreign_table(),
                ..FOREIGN_SYSTEM
            }));
            Box::leak(Box::new(List([provider])))
        });
        // SAFETY: both pointers were checked for NULL; the caller guarantees they are writable.
        unsafe {
            *list = list_ref.0.as_ptr().cast();
            *count = 1;
        }
        return 0;
    }
    // SAFETY: both pointers were checked for NULL; the caller guarantees they are writable.
    unsafe {
        *list = SYSTEM_LIST.0.as_ptr().cast();
        *count = 1;
    }
    0
}
