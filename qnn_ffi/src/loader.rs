//! Loading backend and system libraries and choosing a compatible provider.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bindings as b;
use crate::error::{ProviderVersion, QnnError, qnn_error};
use crate::types::Version;

/// Environment variable naming the backend library (`libQnnHtp.so`, `libhtpkv_ref_qnn.so`).
pub const ENV_BACKEND: &str = "HTPKV_QNN_BACKEND";
/// Environment variable naming the system library (`libQnnSystem.so`).
pub const ENV_SYSTEM: &str = "HTPKV_QNN_SYSTEM";

/// Core API version htpkv needs: major 2, minor at least 10 (the table layout it declares).
pub const REQUIRED_CORE_API: Version = Version::new(
    b::HTPKV_QNN_API_VERSION_MAJOR,
    b::HTPKV_QNN_API_VERSION_MINOR,
    0,
);
/// System API version htpkv needs.
pub const REQUIRED_SYSTEM_API: Version = Version::new(
    b::HTPKV_QNN_SYSTEM_API_VERSION_MAJOR,
    b::HTPKV_QNN_SYSTEM_API_VERSION_MINOR,
    0,
);

/// Resolves the library path: the explicit path when given, else the environment variable.
pub fn resolve_path(
    explicit: Option<&Path>,
    env_var: &'static str,
    what: &'static str,
) -> Result<PathBuf, QnnError> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    match std::env::var_os(env_var) {
        Some(value) if !value.is_empty() => Ok(PathBuf::from(value)),
        _ => Err(QnnError::NoLibraryPath { what, env_var }),
    }
}

/// The dynamic loader's own words for `e` (libloading keeps them in the error's source).
pub(crate) fn loader_reason(e: &libloading::Error) -> String {
    use std::error::Error as _;
    match e.source() {
        Some(cause) => cause.to_string(),
        None => e.to_string(),
    }
}

/// Opens a library. A bare file name (no `/`) is searched on the dynamic loader's path, as
/// `dlopen` does, never in the current directory; the error says so when such a file is there.
/// Runs `f` with file descriptor 1 pointing at standard error, then flushes C's stdio buffers and
/// restores it. Qualcomm's `libQnnHtp.so` prints a line to C's stdout from its initializers (seen
/// with QNN 2.51 on x86: `# LIBNATIVE: No alternate configuration ...`); C stdio holds it until the
/// process exits, when it would land after htpkv's own output (`generate --json` would no longer be
/// one JSON document). Loading happens before htpkv writes anything, so moving fd 1 for the
/// duration races with nothing of htpkv's.
fn with_stdout_on_stderr<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: dup/dup2/close/fflush on the process's own standard descriptors; every descriptor
    // passed is either a standard one or the one dup just returned; fflush(NULL) flushes all C
    // streams.
    let saved = unsafe { libc::dup(1) };
    if saved < 0 {
        return f();
    }
    // SAFETY: as above.
    unsafe { libc::dup2(2, 1) };
    let out = f();
    // SAFETY: as above; fd 1 gets back what it was and the copy is closed.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::dup2(saved, 1);
        libc::close(saved);
    }
    out
}

fn open(path: &Path) -> Result<libloading::Library, QnnError> {
    crate::elf::check_library(path).map_err(|reason| QnnError::LibraryNotFound {
        path: path.to_path_buf(),
        reason,
    })?;
    // SAFETY: loading a library runs its initializers; QNN backends (and htpkv's reference
    // backend) are ordinary shared libraries whose initializers have no preconditions.
    with_stdout_on_stderr(|| unsafe { libloading::Library::new(path) }).map_err(|e| {
        // dlerror() starts with the path, which the error names already.
        let mut reason = loader_reason(&e);
        if let Some(rest) = reason.strip_prefix(&format!("{}: ", path.display())) {
            reason = rest.to_string();
        }
        let bare = path.components().count() == 1 && !path.has_root();
        if bare && path.is_file() {
            reason += &format!(
                " (a bare name is searched on the loader's path, not in the current directory: \
                 pass ./{})",
                path.display()
            );
        }
        QnnError::LibraryNotFound {
            path: path.to_path_buf(),
            reason,
        }
    })
}

fn c_name(ptr: *const std::ffi::c_char) -> Option<String> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: provider names are NUL-terminated static strings owned by the library.
        Some(
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// Identity of the provider htpkv chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Backend id.
    pub backend_id: u32,
    /// Provider name, if any.
    pub name: Option<String>,
    /// Core API version (system API version for system providers).
    pub api: Version,
    /// Backend-specific API version (core providers only).
    pub backend_api: Option<Version>,
}

/// A loaded backend library (`libQnnHtp.so`, `libQnnCpu.so`, `libhtpkv_ref_qnn.so`) with its
/// chosen provider's function table. Kept alive by every object created from it (`Arc`).
pub struct QnnLibrary {
    table: b::HtpkvQnnInterface_t,
    provider: ProviderInfo,
    path: PathBuf,
    // Declared last: dropped after everything else (the table points into it).
    _lib: libloading::Library,
}

impl std::fmt::Debug for QnnLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QnnLibrary")
            .field("path", &self.path)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl QnnLibrary {
    /// Loads the backend library at `path`, resolves only `QnnInterface_getProviders`, and picks
    /// the first provider whose core API major is 2 and minor at least 10.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<QnnLibrary>, QnnError> {
        let path = path.as_ref();
        let lib = open(path)?;
        // SAFETY: `QnnInterface_getProviders` returns `QnnInterface_t` providers (the ABI).
        let (p, provider) = unsafe {
            choose_provider::<b::QnnInterface_t>(
                &lib,
                path,
                "QnnInterface_getProviders",
                REQUIRED_CORE_API,
                "core",
                |provider| ProviderInfo {
                    backend_id: provider.backendId,
                    name: c_name(provider.providerName),
                    api: Version::from_raw(&provider.apiVersion.coreApiVersion),
                    backend_api: Some(Version::from_raw(&provider.apiVersion.backendApiVersion)),
                },
            )?
        };
        // SAFETY: the table is the first member of the provider's union, so it starts at the
        // union's address; the provider's version (>= 2.10) guarantees every entry up to
        // `signalFree` exists. Entries after it are only read when the version says they exist
        // (see `has_error_entries`), so copy the prefix and the tail separately.
        let table = unsafe {
            let union_ptr =
                std::ptr::addr_of!((*p).__bindgen_anon_1).cast::<b::HtpkvQnnInterface_t>();
            let mut table = b::HtpkvQnnInterface_t::default();
            let prefix = std::mem::offset_of!(b::HtpkvQnnInterface_t, errorGetMessage);
            std::ptr::copy_nonoverlapping(
                union_ptr.cast::<u8>(),
                std::ptr::addr_of_mut!(table).cast::<u8>(),
                prefix,
            );
            if provider.api.minor >= b::HTPKV_QNN_API_VERSION_MINOR_ERROR_ENTRIES {
                table = *union_ptr;
            }
            table
        };
        Ok(Arc::new(QnnLibrary {
            table,
            provider,
            path: path.to_path_buf(),
            _lib: lib,
        }))
    }

    /// Loads the library named by `explicit`, else by `$HTPKV_QNN_BACKEND`.
    pub fn load_from(explicit: Option<&Path>) -> Result<Arc<QnnLibrary>, QnnError> {
        QnnLibrary::load(resolve_path(explicit, ENV_BACKEND, "backend")?)
    }

    /// The chosen provider.
    pub fn provider(&self) -> &ProviderInfo {
        &self.provider
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The provider's function table (entries after `signalFree` are NULL unless the provider
    /// reports a core API minor of at least `HTPKV_QNN_API_VERSION_MINOR_ERROR_ENTRIES`).
    pub fn table(&self) -> &b::HtpkvQnnInterface_t {
        &self.table
    }

    /// `Err(FunctionMissing)` for a NULL table entry.
    pub(crate) fn need<F>(&self, f: Option<F>, name: &'static str) -> Result<F, QnnError> {
        f.ok_or_else(|| QnnError::FunctionMissing {
            path: self.path.clone(),
            function: name,
        })
    }

    /// The backend's own message for an error handle, when the provider has `errorGetMessage`.
    pub fn backend_message(&self, handle: u64) -> Option<String> {
        let f = self.table.errorGetMessage?;
        let mut msg: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `f` is the provider's errorGetMessage; `msg` is valid for a write.
        let rc = unsafe { f(handle, &mut msg) };
        if rc != 0 {
            return None;
        }
        c_name(msg)
    }

    /// Converts a return value into a result, with the backend's message when available.
    pub(crate) fn check(&self, function: &'static str, rc: u64) -> Result<(), QnnError> {
        if rc == 0 {
            Ok(())
        } else {
            Err(qnn_error(function, rc, self.backend_message(rc)))
        }
    }
}

/// A loaded system library (`libQnnSystem.so`, or htpkv's reference backend, which also
/// exports the system entry point) with its chosen provider's function table.
pub struct QnnSystemLibrary {
    table: b::HtpkvQnnSystemInterface_t,
    provider: ProviderInfo,
    path: PathBuf,
    _lib: libloading::Library,
}

impl std::fmt::Debug for QnnSystemLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QnnSystemLibrary")
            .field("path", &self.path)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl QnnSystemLibrary {
    /// Loads the system library at `path`, resolves only `QnnSystemInterface_getProviders`, and
    /// picks the first provider whose system API major is 1 (minor at least 1).
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<QnnSystemLibrary>, QnnError> {
        let path = path.as_ref();
        let lib = open(path)?;
        // SAFETY: `QnnSystemInterface_getProviders` returns `QnnSystemInterface_t` providers (the ABI).
        let (p, provider) = unsafe {
            choose_provider::<b::QnnSystemInterface_t>(
                &lib,
                path,
                "QnnSystemInterface_getProviders",
                REQUIRED_SYSTEM_API,
                "system",
                |provider| ProviderInfo {
                    backend_id: provider.backendId,
                    name: c_name(provider.providerName),
                    api: Version::from_raw(&provider.systemApiVersion),
                    backend_api: None,
                },
            )?
        };
        // SAFETY: the table is the first member of the provider's union (starts at its
        // address) and a system API >= 1.1 provider has all four entries.
        let table = unsafe {
            *std::ptr::addr_of!((*p).__bindgen_anon_1).cast::<b::HtpkvQnnSystemInterface_t>()
        };
        Ok(Arc::new(QnnSystemLibrary {
            table,
            provider,
            path: path.to_path_buf(),
            _lib: lib,
        }))
    }

    /// Loads the library named by `explicit`, else by `$HTPKV_QNN_SYSTEM`.
    pub fn load_from(explicit: Option<&Path>) -> Result<Arc<QnnSystemLibrary>, QnnError> {
        QnnSystemLibrary::load(resolve_path(explicit, ENV_SYSTEM, "system")?)
    }

    /// The chosen provider.
    pub fn provider(&self) -> &ProviderInfo {
        &self.provider
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The provider's function table.
    pub fn table(&self) -> &b::HtpkvQnnSystemInterface_t {
        &self.table
    }

    pub(crate) fn need<F>(&self, f: Option<F>, name: &'static str) -> Result<F, QnnError> {
        f.ok_or_else(|| QnnError::FunctionMissing {
            path: self.path.clone(),
            function: name,
        })
    }
}

/// Resolves `symbol` (a `…_getProviders` entry point) in `lib`, lists its providers and picks the
/// first whose API version satisfies `needed`; the error lists every version found.
///
/// # Safety
/// `T` must be the provider struct the entry point returns (its signature is
/// `Qnn_ErrorHandle_t (const T*** providers, uint32_t* count)`), and `describe` may only read the
/// provider's leading fields (id, name, versions), which every provider version has.
unsafe fn choose_provider<T>(
    lib: &libloading::Library,
    path: &Path,
    symbol: &'static str,
    needed: Version,
    api_name: &str,
    describe: impl Fn(&T) -> ProviderInfo,
) -> Result<(*const T, ProviderInfo), QnnError> {
    // SAFETY: the caller guarantees the entry point's signature for `T`.
    let get: libloading::Symbol<'_, unsafe extern "C" fn(*mut *mut *const T, *mut u32) -> u64> =
        unsafe { lib.get(symbol.as_bytes()) }.map_err(|e| QnnError::SymbolMissing {
            path: path.to_path_buf(),
            symbol,
            reason: loader_reason(&e),
        })?;
    let mut list: *mut *const T = std::ptr::null_mut();
    let mut count = 0u32;
    // SAFETY: both out-pointers are valid for writes.
    let rc = unsafe { get(&mut list, &mut count) };
    if rc != 0 {
        return Err(qnn_error(symbol, rc, None));
    }
    let mut found = Vec::new();
    let mut chosen = None;
    if !list.is_null() {
        for i in 0..count as usize {
            // SAFETY: the library returned `count` provider pointers at `list`.
            let p = unsafe { *list.add(i) };
            if p.is_null() {
                continue;
            }
            // SAFETY: a non-NULL provider pointer refers to a provider that lives as long as the
            // library; `describe` reads only its leading fields (the caller's contract).
            let info = describe(unsafe { &*p });
            found.push(ProviderVersion {
                name: info.name.clone(),
                backend_id: info.backend_id,
                api: info.api,
            });
            if chosen.is_none() && info.api.satisfies(needed) {
                chosen = Some((p, info));
            }
        }
    }
    chosen.ok_or_else(|| QnnError::NoCompatibleProvider {
        path: path.to_path_buf(),
        found,
        needed: format!(
            "{api_name} API {}.x with x >= {}",
            needed.major, needed.minor
        ),
    })
}
