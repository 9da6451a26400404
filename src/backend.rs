//! What the runtime needs from a backend: graph descriptions and graph execution on raw buffers.
//!
//! Two backends implement [`Backend`]: the in-process reference executor ([`crate::reference`]) and,
//! through the QNN C ABI, any QNN backend library (`libQnnHtp.so` on a phone, the reference backend's
//! own shared library on a desktop).

use quant::{DataType, QuantSpec};

/// The role of a graph input or output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoRole {
    InputIds,
    /// Token embeddings instead of ids (a model whose embedding lookup runs outside the graph).
    Embeddings,
    Positions,
    /// RoPE cosine table for the step's positions, `[.., n, width]`.
    RopeCos,
    /// RoPE sine table for the step's positions, `[.., n, width]`.
    RopeSin,
    Mask,
    PastKey,
    PastValue,
    NewKey,
    NewValue,
    Logits,
    /// The hidden state from the previous part of a split model.
    HiddenIn,
    /// The hidden state for the next part of a split model.
    HiddenOut,
    /// An encoder-decoder's source token ids (the encoder graph's input).
    SourceIds,
    /// A static cross-attention key tensor: an output of the encoder graph, a read-only input of
    /// every decoder graph (`cross_key_*`, see `kv_manager::CrossSpec`).
    CrossKey,
    /// A static cross-attention value tensor.
    CrossValue,
}

/// One input or output tensor of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct IoTensor {
    pub name: String,
    pub role: IoRole,
    /// Layer of a K/V tensor.
    pub layer: Option<usize>,
    /// KV head of a per-head K/V tensor (`None` for per-layer tensors and non-K/V tensors).
    pub head: Option<usize>,
    pub shape: Vec<usize>,
    pub dtype: DataType,
    /// Encoding of quantized/float tensors (`None` for i32 tensors).
    pub quant: Option<QuantSpec>,
}

impl IoTensor {
    /// Byte size of the whole tensor.
    pub fn byte_size(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_bytes()
    }
}

/// One static graph: an AR-n variant of the model, or one part of it.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphDesc {
    pub name: String,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
    /// Which part of a split model this graph runs (`0 of 1` for a whole model).
    pub part: PartOf,
    /// How the graph's mask input encodes visible and masked (from its IO convention).
    pub mask: crate::convention::MaskEncoding,
}

/// Part `index` (0-based) of a model split into `count` parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartOf {
    pub index: usize,
    pub count: usize,
}

impl Default for PartOf {
    fn default() -> Self {
        PartOf { index: 0, count: 1 }
    }
}

impl GraphDesc {
    /// n: tokens per step (the last dimension of `input_ids`; else the rows of the embeddings or
    /// of the mask, which every part of a split model takes).
    pub fn ar(&self) -> Option<usize> {
        let find = |role| self.inputs.iter().find(|t| t.role == role);
        if let Some(ids) = find(IoRole::InputIds) {
            return ids.shape.last().copied();
        }
        let rows = |t: &IoTensor| t.shape.len().checked_sub(2).map(|i| t.shape[i]);
        find(IoRole::Embeddings)
            .or_else(|| find(IoRole::Mask))
            .and_then(rows)
    }

    /// True for an encoder graph: it writes cross-attention K/V.
    pub fn is_encoder(&self) -> bool {
        self.outputs
            .iter()
            .any(|t| matches!(t.role, IoRole::CrossKey | IoRole::CrossValue))
    }

    /// S: the context length (the mask's last dimension).
    pub fn context(&self) -> Option<usize> {
        self.inputs
            .iter()
            .find(|t| t.role == IoRole::Mask)
            .and_then(|t| t.shape.last().copied())
    }
}

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
