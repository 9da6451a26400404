//! RAII wrappers over the core function table: log, backend, device, context, graph, memory
//! handles, and graph execution.
//!
//! Ownership: every object holds an `Arc` of its parent (graph → context → backend → library),
//! so parents are freed after their children whatever the drop order of the caller's values.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::bindings as b;
use crate::error::QnnError;
use crate::loader::QnnLibrary;
use quant::DataType;

use crate::types::{OwnedRawTensor, TensorInfo, dtype_to_qnn};

/// Maximum level of messages a backend emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Informational messages.
    Info,
    /// Verbose.
    Verbose,
    /// Debug.
    Debug,
}

impl LogLevel {
    /// The raw `QnnLog_Level_t`.
    pub fn to_raw(self) -> u32 {
        match self {
            LogLevel::Error => b::QNN_LOG_LEVEL_ERROR,
            LogLevel::Warn => b::QNN_LOG_LEVEL_WARN,
            LogLevel::Info => b::QNN_LOG_LEVEL_INFO,
            LogLevel::Verbose => b::QNN_LOG_LEVEL_VERBOSE,
            LogLevel::Debug => b::QNN_LOG_LEVEL_DEBUG,
        }
    }

    fn from_raw(raw: u32) -> LogLevel {
        match raw {
            b::QNN_LOG_LEVEL_ERROR => LogLevel::Error,
            b::QNN_LOG_LEVEL_WARN => LogLevel::Warn,
            b::QNN_LOG_LEVEL_INFO => LogLevel::Info,
            b::QNN_LOG_LEVEL_VERBOSE => LogLevel::Verbose,
            _ => LogLevel::Debug,
        }
    }
}

static LOGGED: AtomicU64 = AtomicU64::new(0);
static CAPTURE: Mutex<Vec<(LogLevel, String)>> = Mutex::new(Vec::new());
const CAPTURE_LIMIT: usize = 256;

/// Number of backend log messages received by htpkv's log callback in this process.
pub fn log_message_count() -> u64 {
    LOGGED.load(Ordering::Relaxed)
}

/// Takes the most recent backend log messages (at most 256 are kept).
pub fn take_log_messages() -> Vec<(LogLevel, String)> {
    std::mem::take(&mut *CAPTURE.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Errors the backend reports about its own defaults, whatever a client sets: recorded and
/// counted, not printed. QNN 2.51's `libQnnHtp.so` consolidates every graph's settings at
/// `graphCreate`, its built-in defaults included, and reports its default setting 66 as
/// "unexpected GraphHtpSettings option 66": with no graph, device or context config at all, and
/// in onnxruntime's QNN execution provider too (the same settings, 23 to 66, consolidated
/// there), while the graph prepares and runs as asked.
const QNN_OWN_DEFAULTS: &[&str] = &["unexpected GraphHtpSettings option 66"];

unsafe extern "C" {
    fn vsnprintf(buf: *mut c_char, size: usize, fmt: *const c_char, args: *mut c_void) -> i32;
}

/// htpkv's log callback: formats the message with the C library and records it (and prints
/// warnings and errors to stderr). Never unwinds into the backend.
unsafe extern "C" fn log_callback(
    fmt: *const c_char,
    level: u32,
    _timestamp: u64,
    args: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        if fmt.is_null() {
            return;
        }
        let mut buf = [0 as c_char; 1024];
        // SAFETY: `fmt` and `args` come from the backend as a printf format and its va_list
        // (passed as a pointer on the supported ABIs, see htpkv_qnn.h); `buf` is writable for
        // its full length and vsnprintf NUL-terminates within it.
        let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, args) };
        if n < 0 {
            return;
        }
        // SAFETY: vsnprintf wrote a NUL-terminated string into `buf`.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .trim_end()
            .to_string();
        let level = LogLevel::from_raw(level);
        LOGGED.fetch_add(1, Ordering::Relaxed);
        if level <= LogLevel::Warn && !QNN_OWN_DEFAULTS.iter().any(|m| text.contains(m)) {
            eprintln!("qnn[{level:?}]: {text}");
        }
        let mut capture = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
        if capture.len() >= CAPTURE_LIMIT {
            capture.remove(0);
        }
        capture.push((level, text));
    });
}

/// A backend logger (`logCreate` / `logFree`), routed to htpkv's callback.
#[derive(Debug)]
pub struct Log {
    lib: Arc<QnnLibrary>,
    handle: b::Qnn_LogHandle_t,
}

// SAFETY: QNN handles are opaque tokens that the backend allows to be used from any thread
// (the API is documented thread-safe per handle); htpkv never dereferences them.
unsafe impl Send for Log {}
// SAFETY: as above; all methods take `&self` and only pass the token to the backend.
unsafe impl Sync for Log {}

impl Log {
    /// Creates a logger that reports messages up to `level`.
    pub fn new(lib: &Arc<QnnLibrary>, level: LogLevel) -> Result<Arc<Log>, QnnError> {
        let create = lib.need(lib.table().logCreate, "logCreate")?;
        let mut handle: b::Qnn_LogHandle_t = std::ptr::null_mut();
        // SAFETY: `log_callback` has the callback's ABI; `handle` is valid for a write.
        let rc = unsafe { create(Some(log_callback), level.to_raw(), &mut handle) };
        lib.check("logCreate", rc)?;
        Ok(Arc::new(Log {
            lib: lib.clone(),
            handle,
        }))
    }

    /// Changes the maximum level.
    pub fn set_level(&self, level: LogLevel) -> Result<(), QnnError> {
        let set = self
            .lib
            .need(self.lib.table().logSetLogLevel, "logSetLogLevel")?;
        // SAFETY: `handle` came from logCreate and is not freed yet.
        let rc = unsafe { set(self.handle, level.to_raw()) };
        self.lib.check("logSetLogLevel", rc)
    }

    /// The raw handle.
    pub fn raw(&self) -> b::Qnn_LogHandle_t {
        self.handle
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if let Some(free) = self.lib.table().logFree {
            // SAFETY: `handle` came from logCreate and is freed exactly once, here.
            unsafe { free(self.handle) };
        }
    }
}

/// A backend instance (`backendCreate` / `backendFree`).
#[derive(Debug)]
pub struct Backend {
    lib: Arc<QnnLibrary>,
    handle: b::Qnn_BackendHandle_t,
    _log: Option<Arc<Log>>,
}

// SAFETY: see `Log`: an opaque token the backend allows on any thread.
unsafe impl Send for Backend {}
// SAFETY: see `Log`.
unsafe impl Sync for Backend {}

impl Backend {
    /// Creates a backend, logging through `log` when given.
    pub fn new(lib: &Arc<QnnLibrary>, log: Option<&Arc<Log>>) -> Result<Arc<Backend>, QnnError> {
        let create = lib.need(lib.table().backendCreate, "backendCreate")?;
        let mut handle: b::Qnn_BackendHandle_t = std::ptr::null_mut();
        let log_handle = log.map_or(std::ptr::null_mut(), |l| l.raw());
        // SAFETY: NULL config is allowed; `handle` is valid for a write; the log handle (if
        // any) is alive because this backend keeps an Arc of it.
        let rc = unsafe { create(log_handle, std::ptr::null_mut(), &mut handle) };
        lib.check("backendCreate", rc)?;
        Ok(Arc::new(Backend {
            lib: lib.clone(),
            handle,
            _log: log.cloned(),
        }))
    }

    /// The library this backend came from.
    pub fn library(&self) -> &Arc<QnnLibrary> {
        &self.lib
    }

    /// The backend's build id string, when it reports one.
    pub fn build_id(&self) -> Option<String> {
        let f = self.lib.table().backendGetBuildId?;
        let mut id: *const c_char = std::ptr::null();
        // SAFETY: `id` is valid for a write.
        let rc = unsafe { f(&mut id) };
        if rc != 0 || id.is_null() {
            return None;
        }
        // SAFETY: a non-NULL id is a NUL-terminated string owned by the library.
        Some(
            unsafe { std::ffi::CStr::from_ptr(id) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// The raw handle.
    pub fn raw(&self) -> b::Qnn_BackendHandle_t {
        self.handle
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(free) = self.lib.table().backendFree {
            // SAFETY: created by backendCreate, freed exactly once after all children (they
            // hold Arcs of this backend).
            unsafe { free(self.handle) };
        }
    }
}

/// A device (`deviceCreate` / `deviceFree`). Optional in QNN: [`Device::new`] returns `None`
/// when the backend has no device API or answers "not supported".
#[derive(Debug)]
pub struct Device {
    backend: Arc<Backend>,
    handle: b::Qnn_DeviceHandle_t,
    /// The configs the device was created with: a backend may keep pointers into them, so they
    /// live as long as the device (dropped after `deviceFree`).
    _configs: Option<Box<dyn std::fmt::Debug>>,
}

// SAFETY: see `Log`; the kept configs are never touched from Rust after `deviceCreate` (only the
// backend may read them), so sharing the device across threads shares no Rust-side access.
unsafe impl Send for Device {}
// SAFETY: as for `Send`.
unsafe impl Sync for Device {}

impl Device {
    /// Creates the default device of `backend`, `Ok(None)` when the backend has none.
    pub fn new(backend: &Arc<Backend>) -> Result<Option<Arc<Device>>, QnnError> {
        Device::create_with(backend, std::ptr::null_mut(), None)
    }

    /// Creates a device with `configs`: NULL, or a NULL-terminated array whose entries stay
    /// alive during the call.
    pub(crate) fn create_with(
        backend: &Arc<Backend>,
        configs: *mut *const b::QnnDevice_Config_t,
        keep: Option<Box<dyn std::fmt::Debug>>,
    ) -> Result<Option<Arc<Device>>, QnnError> {
        let lib = &backend.lib;
        let Some(create) = lib.table().deviceCreate else {
            return Ok(None);
        };
        let mut handle: b::Qnn_DeviceHandle_t = std::ptr::null_mut();
        // SAFETY: a NULL logger is allowed; `configs` is NULL or a live NULL-terminated array
        // (the caller's contract); `handle` is valid for a write.
        let rc = unsafe { create(std::ptr::null_mut(), configs, &mut handle) };
        if rc & u64::from(b::HTPKV_QNN_ERROR_CODE_MASK)
            == u64::from(b::QNN_COMMON_ERROR_NOT_SUPPORTED)
        {
            return Ok(None);
        }
        lib.check("deviceCreate", rc)?;
        Ok(Some(Arc::new(Device {
            backend: backend.clone(),
            handle,
            _configs: keep,
        })))
    }

    /// The raw handle.
    pub fn raw(&self) -> b::Qnn_DeviceHandle_t {
        self.handle
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(free) = self.backend.lib.table().deviceFree {
            // SAFETY: created by deviceCreate, freed once, after its contexts (they hold Arcs).
            unsafe { free(self.handle) };
        }
    }
}

/// A context created from a context binary (`contextCreateFromBinary` / `contextFree`).
#[derive(Debug)]
pub struct Context {
    backend: Arc<Backend>,
    _device: Option<Arc<Device>>,
    handle: b::Qnn_ContextHandle_t,
}

// SAFETY: see `Log`.
unsafe impl Send for Context {}
// SAFETY: see `Log`.
unsafe impl Sync for Context {}

impl Context {
    /// Deserializes `binary` into a new context on `backend` (and `device`, when given).
    pub fn from_binary(
        backend: &Arc<Backend>,
        device: Option<&Arc<Device>>,
        binary: &[u8],
    ) -> Result<Arc<Context>, QnnError> {
        let lib = &backend.lib;
        let create = lib.need(
            lib.table().contextCreateFromBinary,
            "contextCreateFromBinary",
        )?;
        let mut handle: b::Qnn_ContextHandle_t = std::ptr::null_mut();
        let device_handle = device.map_or(std::ptr::null_mut(), |d| d.raw());
        // SAFETY: `binary` is readable for its length during the call (QNN copies what it
        // keeps); NULL config and profile are allowed; `handle` is valid for a write.
        let rc = unsafe {
            create(
                backend.handle,
                device_handle,
                std::ptr::null_mut(),
                binary.as_ptr().cast(),
                binary.len() as u64,
                &mut handle,
                std::ptr::null_mut(),
            )
        };
        lib.check("contextCreateFromBinary", rc)?;
        Ok(Context::wrap(backend, device, handle))
    }

    /// Takes ownership of a context handle the backend created.
    pub(crate) fn wrap(
        backend: &Arc<Backend>,
        device: Option<&Arc<Device>>,
        handle: b::Qnn_ContextHandle_t,
    ) -> Arc<Context> {
        Arc::new(Context {
            backend: backend.clone(),
            _device: device.cloned(),
            handle,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    fn lib(&self) -> &Arc<QnnLibrary> {
        &self.backend.lib
    }

    /// Retrieves the graph `name` (`graphRetrieve`). `inputs`/`outputs` are its tensors in
    /// execution order, as the system library's binary info lists them.
    pub fn graph(
        self: &Arc<Self>,
        name: &str,
        inputs: Vec<TensorInfo>,
        outputs: Vec<TensorInfo>,
    ) -> Result<Graph, QnnError> {
        let retrieve = self
            .lib()
            .need(self.lib().table().graphRetrieve, "graphRetrieve")?;
        let c_name = CString::new(name).map_err(|_| QnnError::InvalidTensor {
            tensor: name.to_string(),
            reason: "graph name contains a NUL byte".into(),
        })?;
        let mut handle: b::Qnn_GraphHandle_t = std::ptr::null_mut();
        // SAFETY: `c_name` is NUL-terminated and alive during the call; `handle` is writable.
        let rc = unsafe { retrieve(self.handle, c_name.as_ptr(), &mut handle) };
        self.lib().check("graphRetrieve", rc)?;
        let raw_inputs = inputs
            .iter()
            .map(OwnedRawTensor::new)
            .collect::<Result<_, _>>()?;
        let raw_outputs = outputs
            .iter()
            .map(OwnedRawTensor::new)
            .collect::<Result<_, _>>()?;
        Ok(Graph {
            context: self.clone(),
            handle,
            name: name.to_string(),
            inputs,
            outputs,
            raw_inputs,
            raw_outputs,
        })
    }

    /// Registers memory (`memRegister`) and returns its handle, deregistered on drop.
    pub fn register(self: &Arc<Self>, desc: &MemDescriptor) -> Result<MemHandle, QnnError> {
        let register = self
            .lib()
            .need(self.lib().table().memRegister, "memRegister")?;
        self.lib()
            .need(self.lib().table().memDeRegister, "memDeRegister")?;
        desc.validate()?;
        let mut dims = desc.shape.clone();
        let mut htp = b::QnnMemHtp_Descriptor_t::default();
        let mut host = b::HtpkvRefMem_HostDescriptor_t::default();
        let mut raw = b::Qnn_MemDescriptor_t {
            memShape: b::Qnn_MemShape_t {
                numDim: dims.len() as u32,
                dimSize: dims.as_mut_ptr(),
                shapeConfig: std::ptr::null(),
            },
            dataType: dtype_to_qnn(desc.dtype),
            memType: b::QNN_MEM_TYPE_CUSTOM,
            ..Default::default()
        };
        match desc.memory {
            MemSource::SharedBuffer {
                fd,
                total_size,
                offset,
            } => {
                htp.type_ = b::QNN_HTP_MEM_SHARED_BUFFER;
                htp.size = total_size as u64;
                htp.__bindgen_anon_1.sharedBufferConfig = b::QnnHtpMem_SharedBufferConfig_t {
                    fd,
                    offset: offset as u64,
                };
                raw.__bindgen_anon_1.customInfo = std::ptr::addr_of_mut!(htp).cast();
            }
            MemSource::Ion { fd } => {
                raw.memType = b::QNN_MEM_TYPE_ION;
                raw.__bindgen_anon_1.ionInfo = b::Qnn_MemIonInfo_t { fd };
            }
            MemSource::Host {
                base,
                total_size,
                offset,
            } => {
                host.magic = b::HTPKV_REF_MEM_HOST_MAGIC;
                host.base = base.cast();
                host.size = total_size as u64;
                host.offset = offset as u64;
                raw.__bindgen_anon_1.customInfo = std::ptr::addr_of_mut!(host).cast();
            }
        }
        let mut handle: b::Qnn_MemHandle_t = std::ptr::null_mut();
        // SAFETY: `raw` and the descriptors it points to (`dims`, `htp`, `host`) live until the
        // call returns; one descriptor, one writable handle slot. The memory itself stays valid
        // while registered: guaranteed by `MemDescriptor`'s constructors' contracts.
        let rc = unsafe { register(self.handle, &raw, 1, &mut handle) };
        self.lib().check("memRegister", rc)?;
        Ok(MemHandle {
            context: self.clone(),
            handle,
            desc: desc.clone(),
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> b::Qnn_ContextHandle_t {
        self.handle
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(free) = self.backend.lib.table().contextFree {
            // SAFETY: created by contextCreateFromBinary, freed once after its graphs and
            // memory handles (they hold Arcs of this context).
            unsafe { free(self.handle, std::ptr::null_mut()) };
        }
    }
}

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemSource {
    /// An rpcmem/dma-buf shared buffer (QNN HTP's custom descriptor): `fd` of the whole buffer
    /// of `total_size` bytes, this tensor at byte `offset`. One handle per offset.
    SharedBuffer {
        /// File descriptor of the buffer.
        fd: i32,
        /// Size of the whole buffer.
        total_size: usize,
        /// Byte offset of the tensor.
        offset: usize,
    },
    /// An ION buffer holding exactly this tensor.
    Ion {
        /// File descriptor.
        fd: i32,
    },
    /// Host memory identified by address (htpkv extension, understood only by htpkv's
    /// reference backend): `base` of a region of `total_size` bytes, tensor at `offset`.
    Host {
        /// Base address of the region.
        base: *mut u8,
        /// Size of the region.
        total_size: usize,
        /// Byte offset of the tensor.
        offset: usize,
    },
}

// SAFETY: `Host::base` is an address used as an identifier and passed to the backend; the
// memory's validity is the contract of `MemDescriptor::host`, not of this value.
unsafe impl Send for MemSource {}
// SAFETY: as above.
unsafe impl Sync for MemSource {}

/// A request to register memory for one tensor: its shape and type and where it lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemDescriptor {
    /// Tensor dimensions.
    pub shape: Vec<u32>,
    /// Element type.
    pub dtype: DataType,
    /// The memory.
    pub memory: MemSource,
}

impl MemDescriptor {
    /// Bytes covered by the tensor.
    pub fn byte_size(&self) -> Option<usize> {
        let n = self
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d as usize))?;
        n.checked_mul(self.dtype.size_bytes())
    }

    /// A shared-buffer (fd + offset) registration.
    ///
    /// # Safety
    /// `fd` must refer to a mapping of at least `total_size` bytes that stays valid (not closed
    /// or freed) while any handle registered from this descriptor lives.
    pub unsafe fn shared_buffer(
        shape: Vec<u32>,
        dtype: DataType,
        fd: i32,
        total_size: usize,
        offset: usize,
    ) -> MemDescriptor {
        MemDescriptor {
            shape,
            dtype,
            memory: MemSource::SharedBuffer {
                fd,
                total_size,
                offset,
            },
        }
    }

    /// A host-memory registration (reference backend only).
    ///
    /// # Safety
    /// `base` must point to `total_size` bytes that stay valid, and are not accessed through
    /// Rust references while a graph executes on them, as long as any handle registered from
    /// this descriptor lives.
    pub unsafe fn host(
        shape: Vec<u32>,
        dtype: DataType,
        base: *mut u8,
        total_size: usize,
        offset: usize,
    ) -> MemDescriptor {
        MemDescriptor {
            shape,
            dtype,
            memory: MemSource::Host {
                base,
                total_size,
                offset,
            },
        }
    }

    fn validate(&self) -> Result<(), QnnError> {
        let bytes = self
            .byte_size()
            .ok_or_else(|| QnnError::InvalidRegistration {
                reason: format!(
                    "cannot size a {} tensor of shape {:?}",
                    self.dtype, self.shape
                ),
            })?;
        let (total, offset) = match self.memory {
            MemSource::SharedBuffer {
                total_size, offset, ..
            } => (total_size, offset),
            MemSource::Host {
                total_size,
                offset,
                base,
            } => {
                if base.is_null() {
                    return Err(QnnError::InvalidRegistration {
                        reason: "host memory base is NULL".into(),
                    });
                }
                (total_size, offset)
            }
            MemSource::Ion { .. } => return Ok(()),
        };
        match offset.checked_add(bytes) {
            Some(end) if end <= total => Ok(()),
            _ => Err(QnnError::InvalidRegistration {
                reason: format!(
                    "tensor of {bytes} bytes at offset {offset} does not fit a buffer of {total} bytes"
                ),
            }),
        }
    }
}

/// A registered memory handle (`memRegister`); deregistered (`memDeRegister`) on drop.
#[derive(Debug)]
pub struct MemHandle {
    context: Arc<Context>,
    handle: b::Qnn_MemHandle_t,
    desc: MemDescriptor,
}

// SAFETY: see `Log`.
unsafe impl Send for MemHandle {}
// SAFETY: see `Log`.
unsafe impl Sync for MemHandle {}

impl MemHandle {
    /// What was registered.
    pub fn descriptor(&self) -> &MemDescriptor {
        &self.desc
    }

    /// The raw handle.
    pub fn raw(&self) -> b::Qnn_MemHandle_t {
        self.handle
    }
}

impl Drop for MemHandle {
    fn drop(&mut self) {
        if let Some(dereg) = self.context.lib().table().memDeRegister {
            // SAFETY: the handle came from memRegister on this context (alive: we hold an Arc)
            // and is deregistered exactly once.
            unsafe { dereg(&self.handle, 1) };
        }
    }
}

/// Default for [`MemHandleCache::with_capacity`]: live handles kept before the least recently
/// used are deregistered. Large enough for every tensor of a whole model split into parts with
/// fixed bindings (`smart_mask`), small enough to bound the handles a sliding strategy piles up.
pub const DEFAULT_MAX_HANDLES: usize = 4096;

/// Registers each distinct (memory, offset, shape, dtype) once and hands out the same handle
/// afterwards, counting registrations and reuses. On HTP every distinct offset of a shared
/// buffer is its own handle, so sliding windows (`shift`, `conveyor`) make a new handle per
/// buffer per step. The cache holds at most `capacity` live handles: registering one more
/// deregisters the least recently used handle that the current step (see
/// [`begin_step`](Self::begin_step)) has not used; a step that alone needs more than `capacity`
/// handles keeps them all (counted in [`peak`](Self::peak)).
#[derive(Debug)]
pub struct MemHandleCache {
    context: Arc<Context>,
    handles: HashMap<MemDescriptor, (MemHandle, u64)>,
    capacity: usize,
    step: u64,
    registrations: u64,
    deregistrations: u64,
    hits: u64,
    peak: usize,
}

impl MemHandleCache {
    /// An empty cache for `context` holding at most [`DEFAULT_MAX_HANDLES`] handles.
    pub fn new(context: &Arc<Context>) -> MemHandleCache {
        MemHandleCache::with_capacity(context, DEFAULT_MAX_HANDLES)
    }

    /// An empty cache for `context` holding at most `capacity` (at least 1) live handles.
    pub fn with_capacity(context: &Arc<Context>, capacity: usize) -> MemHandleCache {
        MemHandleCache {
            context: context.clone(),
            handles: HashMap::new(),
            capacity: capacity.max(1),
            step: 0,
            registrations: 0,
            deregistrations: 0,
            hits: 0,
            peak: 0,
        }
    }

    /// Starts a new step: handles used from now on are protected from eviction until the next.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// The handle for `desc`, registering it on first use (evicting first when full).
    pub fn get(&mut self, desc: &MemDescriptor) -> Result<&MemHandle, QnnError> {
        let step = self.step;
        if let Some(entry) = self.handles.get_mut(desc) {
            self.hits += 1;
            entry.1 = step;
        } else {
            self.evict_for_one();
            let handle = self.context.register(desc)?;
            self.registrations += 1;
            self.handles.insert(desc.clone(), (handle, step));
            self.peak = self.peak.max(self.handles.len());
        }
        self.handles
            .get(desc)
            .map(|(h, _)| h)
            .ok_or_else(|| QnnError::InvalidRegistration {
                reason: "handle vanished from the cache".into(),
            })
    }

    /// Deregisters least recently used handles not used in this step until one more fits.
    fn evict_for_one(&mut self) {
        while self.handles.len() >= self.capacity {
            let victim = self
                .handles
                .iter()
                .filter(|(_, (_, used))| *used < self.step)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(d, _)| d.clone());
            let Some(victim) = victim else {
                return;
            };
            // Dropping the handle deregisters it.
            self.handles.remove(&victim);
            self.deregistrations += 1;
        }
    }

    /// The handle already registered for `desc`, without registering or counting.
    pub fn get_existing(&self, desc: &MemDescriptor) -> Option<&MemHandle> {
        self.handles.get(desc).map(|(h, _)| h)
    }

    /// Number of `memRegister` calls made.
    pub fn registrations(&self) -> u64 {
        self.registrations
    }

    /// Number of handles deregistered to stay within the capacity.
    pub fn deregistrations(&self) -> u64 {
        self.deregistrations
    }

    /// Number of requests served from the cache.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// The most handles alive at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of live handles.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// True when no handle is registered.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Deregisters every handle (e.g. before the region is freed).
    pub fn clear(&mut self) {
        self.handles.clear();
    }
}

/// Memory bound to one tensor of an execution.
#[derive(Debug)]
pub enum TensorData<'a> {
    /// Client memory (`QNN_TENSORMEMTYPE_RAW`).
    Client(ClientBuffer<'a>),
    /// A registered handle (`QNN_TENSORMEMTYPE_MEMHANDLE`); its size must equal the tensor's.
    Mem(&'a MemHandle),
}

/// A client buffer: a pointer and a length, borrowed for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct ClientBuffer<'a> {
    ptr: *mut u8,
    len: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> ClientBuffer<'a> {
    /// An input buffer (the backend only reads it).
    pub fn input(data: &'a [u8]) -> Self {
        ClientBuffer {
            ptr: data.as_ptr().cast_mut(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    /// An output buffer (the backend writes it).
    pub fn output(data: &'a mut [u8]) -> Self {
        ClientBuffer {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    /// A buffer from a raw pointer, e.g. a window inside a KV region.
    ///
    /// # Safety
    /// `ptr` must be valid for reads (inputs) or writes (outputs) of `len` bytes for `'a`, and
    /// no Rust reference may access those bytes while an execution uses the buffer.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Self {
        ClientBuffer {
            ptr,
            len,
            _borrow: PhantomData,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A graph of a context (`graphRetrieve`), with its IO tensor descriptions.
#[derive(Debug)]
pub struct Graph {
    context: Arc<Context>,
    handle: b::Qnn_GraphHandle_t,
    name: String,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    raw_inputs: Vec<OwnedRawTensor>,
    raw_outputs: Vec<OwnedRawTensor>,
}

// SAFETY: see `Log`; the owned raw tensors are plain owned data.
unsafe impl Send for Graph {}
// SAFETY: see `Log`.
unsafe impl Sync for Graph {}

impl Graph {
    /// Graph name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Input tensors, in execution order.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// Output tensors, in execution order.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// Executes the graph (`graphExecute`) with one binding per input and output, in the order
    /// of [`Graph::inputs`] / [`Graph::outputs`]. Checks counts and sizes first
    /// ([`QnnError::TensorSize`], [`QnnError::InvalidTensor`]), then the backend's verdict.
    pub fn execute(
        &self,
        inputs: &[TensorData<'_>],
        outputs: &[TensorData<'_>],
    ) -> Result<(), QnnError> {
        let lib = self.context.lib();
        let execute = lib.need(lib.table().graphExecute, "graphExecute")?;
        let raw_in = self.bind("input", &self.inputs, &self.raw_inputs, inputs)?;
        let mut raw_out = self.bind("output", &self.outputs, &self.raw_outputs, outputs)?;
        // SAFETY: the raw tensors point into `self.raw_*` (alive) and into the caller's buffers
        // and handles, which are borrowed for the duration of this call and sized as checked.
        let rc = unsafe {
            execute(
                self.handle,
                raw_in.as_ptr(),
                raw_in.len() as u32,
                raw_out.as_mut_ptr(),
                raw_out.len() as u32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        lib.check("graphExecute", rc)
    }

    fn bind(
        &self,
        side: &str,
        infos: &[TensorInfo],
        raws: &[OwnedRawTensor],
        data: &[TensorData<'_>],
    ) -> Result<Vec<b::Qnn_Tensor_t>, QnnError> {
        if data.len() != infos.len() {
            return Err(QnnError::InvalidTensor {
                tensor: format!("{}:{side}s", self.name),
                reason: format!(
                    "graph has {} {side}s, {} were bound",
                    infos.len(),
                    data.len()
                ),
            });
        }
        let mut out = Vec::with_capacity(infos.len());
        for ((info, raw), d) in infos.iter().zip(raws).zip(data) {
            let expected = info.required_bytes()?;
            match d {
                TensorData::Client(buf) => {
                    if buf.len != expected {
                        return Err(QnnError::TensorSize {
                            tensor: info.name.clone(),
                            expected,
                            found: buf.len,
                        });
                    }
                    let size = u32::try_from(buf.len).map_err(|_| QnnError::InvalidTensor {
                        tensor: info.name.clone(),
                        reason: format!("{} bytes exceed a client buffer's 32-bit size", buf.len),
                    })?;
                    out.push(raw.raw_with_client_buffer(buf.ptr, size));
                }
                TensorData::Mem(handle) => {
                    let found = handle.desc.byte_size().unwrap_or(0);
                    if found != expected {
                        return Err(QnnError::TensorSize {
                            tensor: info.name.clone(),
                            expected,
                            found,
                        });
                    }
                    out.push(raw.raw_with_mem_handle(handle.handle));
                }
            }
        }
        Ok(out)
    }
}
