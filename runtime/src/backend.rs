//! What the runtime needs from a backend: graph descriptions and graph execution on raw buffers.
//!
//! Two providers implement [`Backend`]: the in-process reference executor (crate `htpkv_reference`)
//! and, through the QNN C ABI, any QNN backend library (crate `htpkv_qnn`: `libQnnHtp.so` on a
//! phone, the reference backend's own shared library on a desktop).

/// The graph and tensor descriptions are the IO vocabulary's ([`graph_io`]): one role enum and one
/// tensor description for the backends, the compiler and the runtime.
pub use graph_io::{GraphDesc, IoRole, IoTensor, LogitRows, PartOf};

/// A raw input buffer of one execution.
#[derive(Debug, Clone, Copy)]
pub struct InputBuffer {
    pub ptr: *const u8,
    pub len: usize,
}

/// A raw output buffer of one execution.
#[derive(Debug, Clone, Copy)]
pub struct OutputBuffer {
    pub ptr: *mut u8,
    pub len: usize,
}

/// Errors a backend reports.
#[derive(Debug, thiserror::Error)]
#[error("{backend} backend: {message}")]
pub struct BackendError {
    pub backend: &'static str,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// How a backend passes the KV region's tensors and what that cost in memory handles (QNN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReport {
    /// The memory used (`shared-buffer (rpcmem)`, `shared-buffer (memfd)`, `host`, `client`).
    pub memory: &'static str,
    /// `memRegister` calls made.
    pub registrations: u64,
    /// Handles deregistered to stay within the cap.
    pub deregistrations: u64,
    /// Handles alive now.
    pub live_handles: usize,
    /// The most handles alive at once.
    pub peak_handles: usize,
    /// The cap on live handles.
    pub max_handles: usize,
}

/// A backend that executes static graphs. Backends are `Send` so a session can move between threads
/// (the JNI bridge hands sessions to whichever JVM thread calls); a session is used by one thread at
/// a time.
pub trait Backend: Send {
    /// Short name for messages (`reference`, `qnn`).
    fn name(&self) -> &'static str;

    /// The graphs of the loaded model.
    fn graphs(&self) -> &[GraphDesc];

    /// How KV memory is passed to the backend, for backends that register it (QNN).
    fn memory_report(&self) -> Option<MemoryReport> {
        None
    }

    /// Called once before any execution with the KV region every K/V binding will point into, so a
    /// backend can register it (QNN memory handles). The region outlives the backend's use of it.
    fn attach_region(
        &mut self,
        base: *mut u8,
        len: usize,
        fd: Option<i32>,
    ) -> Result<(), BackendError> {
        let _ = (base, len, fd);
        Ok(())
    }

    /// Executes graph `graph` (an index into [`Backend::graphs`]).
    ///
    /// # Safety
    /// Every buffer is valid for its length and stays so for the call; buffers are in the graph's
    /// description order and sized as described; no output overlaps another output or any input.
    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError>;
}

/// A boxed backend is a backend (what the engine holds).
impl Backend for Box<dyn Backend> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn graphs(&self) -> &[GraphDesc] {
        (**self).graphs()
    }
    fn memory_report(&self) -> Option<MemoryReport> {
        (**self).memory_report()
    }
    fn attach_region(
        &mut self,
        base: *mut u8,
        len: usize,
        fd: Option<i32>,
    ) -> Result<(), BackendError> {
        (**self).attach_region(base, len, fd)
    }
    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).execute(graph, inputs, outputs) }
    }
}
