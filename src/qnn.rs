//! The QNN backend: the graphs of a context binary executed through a QNN backend library loaded at
//! run time (`libQnnHtp.so` on a device, the reference backend's `libhtpkv_ref_qnn.so` on a desktop).
//!
//! Tensor descriptions come from the system library's binary info (names, shapes, data types,
//! encodings), never from htpkv's own file. Roles are read from the tensor names htpkv's graphs use:
//! `input_ids`, `positions`, `attention_mask`, `logits`, `past_key_{layer}[_{head}]`,
//! `past_value_…`, `new_key_…`, `new_value_…` (a context binary made with Qualcomm's tools must name
//! its IO tensors the same way). K/V bindings inside the cache region are passed as registered memory
//! handles (one per distinct offset and shape, cached, at most `max_handles` alive with least recently
//! used ones deregistered) or as client buffers, as [`crate::qnn_memory`] decides; everything else as
//! client buffers.

use crate::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoRole, IoTensor, MemoryReport, OutputBuffer,
};
use crate::engine::EngineError;
use crate::qnn_memory::{MemoryUse, QnnMemory};
use kv_manager::{KvIo, KvTensor, RegionAllocator, TensorKind};
use qnn_ffi::{
    ClientBuffer, Context, Device, Graph, LogLevel, MemDescriptor, MemHandleCache, QnnLibrary,
    QnnSystemLibrary, Quantization, RpcMemAllocator, SystemContext, TensorData, TensorInfo,
    qnn_dtype_name,
};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use std::path::Path;
use std::sync::Arc;

fn qnn_err(e: qnn_ffi::QnnError) -> EngineError {
    EngineError::Qnn(e.to_string())
}

/// A backend error whose cause is a QNN error: the message says what was being done, the cause is
/// the source (printed once by reports).
fn backend_err_from(what: &str, e: qnn_ffi::QnnError) -> BackendError {
    BackendError {
        backend: "qnn",
        message: what.to_string(),
        source: Some(Box::new(e)),
    }
}

fn backend_err(message: String) -> BackendError {
    BackendError {
        backend: "qnn",
        message,
        source: None,
    }
}

/// Reads role, layer and head from an htpkv tensor name.
fn role_of(name: &str) -> Option<(IoRole, Option<usize>, Option<usize>)> {
    let fixed = match name {
        "input_ids" => Some(IoRole::InputIds),
        "positions" => Some(IoRole::Positions),
        "attention_mask" | "mask" => Some(IoRole::Mask),
        "logits" => Some(IoRole::Logits),
        _ => None,
    };
    if let Some(role) = fixed {
        return Some((role, None, None));
    }
    let t = KvTensor::parse(name)?;
    let role = match (t.io, t.kind) {
        (KvIo::Past, TensorKind::Key) => IoRole::PastKey,
        (KvIo::Past, TensorKind::Value) => IoRole::PastValue,
        (KvIo::New, TensorKind::Key) => IoRole::NewKey,
        (KvIo::New, TensorKind::Value) => IoRole::NewValue,
    };
    Some((role, Some(t.layer), t.head))
}

/// A short label for the role htpkv recognises in a tensor name, for `htpkv inspect`: htpkv's own
/// names first, then the names of Qualcomm AI Hub LLM exports (`input_ids`, `attention_mask`,
/// `position_ids_cos`/`_sin`, `past_key_{layer}_in`/`_out`, `past_value_{layer}_in`/`_out`,
/// `logits`). `None` for a name it does not recognise (never an error).
pub fn role_label(name: &str) -> Option<String> {
    if let Some((role, layer, head)) = role_of(name) {
        let what = match role {
            IoRole::InputIds => "token ids",
            IoRole::Positions => "position ids",
            IoRole::Mask => "attention mask",
            IoRole::Logits => "logits",
            IoRole::PastKey => "past K",
            IoRole::PastValue => "past V",
            IoRole::NewKey => "new K",
            IoRole::NewValue => "new V",
        };
        let layer = layer.map_or(String::new(), |l| format!(" layer {l}"));
        let head = head.map_or(String::new(), |h| format!(" head {h}"));
        return Some(format!("{what}{layer}{head}"));
    }
    let fixed = match name {
        "position_ids_cos" => Some("RoPE cos"),
        "position_ids_sin" => Some("RoPE sin"),
        "input_embeds" | "inputs_embeds" => Some("embeddings"),
        _ => None,
    };
    if let Some(label) = fixed {
        return Some(label.to_string());
    }
    for (prefix, what) in [("past_key_", "K"), ("past_value_", "V")] {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        for (suffix, dir) in [("_in", "past"), ("_out", "new")] {
            if let Some(layer) = rest
                .strip_suffix(suffix)
                .and_then(|l| l.parse::<usize>().ok())
            {
                return Some(format!("{dir} {what} layer {layer}"));
            }
        }
    }
    None
}

/// Converts binary-info tensors to the runtime's descriptions.
pub fn io_tensor(t: &TensorInfo) -> Result<IoTensor, String> {
    let (role, layer, head) = role_of(&t.name).ok_or_else(|| {
        format!(
            "tensor `{}`: name does not follow htpkv's IO naming",
            t.name
        )
    })?;
    let dtype = t.data_type().ok_or_else(|| {
        format!(
            "tensor `{}`: unsupported data type {}",
            t.name,
            qnn_dtype_name(t.dtype)
        )
    })?;
    let quant = match (dtype, &t.quant) {
        (DataType::I32, Quantization::None) => None,
        (d, Quantization::None) if d.is_float() => Some(QuantSpec {
            dtype: d,
            encoding: Encoding::Float,
        }),
        (d, Quantization::PerTensor { scale, offset }) if d.is_fixed_point() => Some(QuantSpec {
            dtype: d,
            encoding: Encoding::PerTensor(ScaleOffset {
                scale: *scale,
                offset: *offset,
            }),
        }),
        (
            d,
            Quantization::PerAxis {
                axis,
                scale_offsets,
            },
        ) if d.is_fixed_point() => Some(QuantSpec {
            dtype: d,
            encoding: Encoding::PerAxis {
                axis: (*axis).max(0) as usize,
                params: scale_offsets
                    .iter()
                    .map(|&(scale, offset)| ScaleOffset { scale, offset })
                    .collect(),
            },
        }),
        (_, q) => {
            return Err(format!(
                "tensor `{}`: encoding {q:?} does not fit {dtype}",
                t.name
            ));
        }
    };
    Ok(IoTensor {
        name: t.name.clone(),
        role,
        layer,
        head,
        shape: t.shape.iter().map(|&d| d as usize).collect(),
        dtype,
        quant,
    })
}

/// Graphs of a context binary read through the system library.
pub fn binary_graphs(
    system: &Arc<QnnSystemLibrary>,
    binary: &[u8],
) -> Result<Vec<(GraphDesc, qnn_ffi::GraphInfo)>, EngineError> {
    let mut ctx = SystemContext::new(system).map_err(qnn_err)?;
    let info = ctx.binary_info(binary).map_err(qnn_err)?;
    let mut graphs = Vec::new();
    for g in info.graphs {
        let desc = GraphDesc {
            name: g.name.clone(),
            inputs: g
                .inputs
                .iter()
                .map(io_tensor)
                .collect::<Result<_, _>>()
                .map_err(EngineError::Qnn)?,
            outputs: g
                .outputs
                .iter()
                .map(io_tensor)
                .collect::<Result<_, _>>()
                .map_err(EngineError::Qnn)?,
        };
        graphs.push((desc, g));
    }
    graphs.sort_by_key(|(d, _)| d.ar().unwrap_or(usize::MAX));
    Ok(graphs)
}

#[derive(Debug, Clone, Copy)]
struct RegionInfo {
    base: *mut u8,
    len: usize,
    fd: Option<i32>,
}

// SAFETY: `base` identifies the KV region of the session that owns this backend; the region (host
// memory or rpcmem) has no thread affinity and moves with the session, and the pointer is only passed to
// the QNN library while the session executes a step.
unsafe impl Send for RegionInfo {}

/// A QNN backend library running the graphs of one context binary.
pub struct QnnBackend {
    descs: Vec<GraphDesc>,
    graphs: Vec<Graph>,
    context: Arc<Context>,
    handles: MemHandleCache,
    region: Option<RegionInfo>,
    memory: MemoryUse,
    /// `auto` chose host descriptors: confirm with a probe when the region arrives.
    probe_host: bool,
    rpcmem: Option<RpcMemAllocator>,
    _device: Option<Arc<Device>>,
}

impl std::fmt::Debug for QnnBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QnnBackend")
            .field(
                "graphs",
                &self.descs.iter().map(|g| &g.name).collect::<Vec<_>>(),
            )
            .field("memory", &self.memory.name())
            .field("registrations", &self.handles.registrations())
            .finish()
    }
}

impl QnnBackend {
    /// Loads the libraries and the context binary and retrieves every graph; `memory` chooses
    /// how K/V tensors are passed, `max_handles` caps the live memory handles.
    pub fn open(
        backend_lib: &Path,
        system_lib: Option<&Path>,
        binary_path: &Path,
        memory: QnnMemory,
        max_handles: usize,
    ) -> Result<QnnBackend, EngineError> {
        let lib = QnnLibrary::load(backend_lib).map_err(qnn_err)?;
        let reference = lib
            .provider()
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("htpkv_ref"));
        let rpcmem = RpcMemAllocator::new().ok();
        let probe_host = memory == QnnMemory::Auto;
        let memory = MemoryUse::resolve(memory, reference, rpcmem.is_some());
        let system = QnnSystemLibrary::load(system_lib.unwrap_or(backend_lib)).map_err(qnn_err)?;
        let binary = llama2c::fsio::read_capped(binary_path, llama2c::fsio::FileKind::COMPILED)?;
        let graphs = binary_graphs(&system, &binary)?;
        let log = qnn_ffi::Log::new(&lib, LogLevel::Warn).ok();
        let backend = qnn_ffi::Backend::new(&lib, log.as_ref()).map_err(qnn_err)?;
        let device = Device::new(&backend).map_err(qnn_err)?;
        let context = Context::from_binary(&backend, device.as_ref(), &binary).map_err(qnn_err)?;
        let mut descs = Vec::new();
        let mut retrieved = Vec::new();
        for (desc, info) in graphs {
            retrieved.push(
                context
                    .graph(&info.name, info.inputs, info.outputs)
                    .map_err(qnn_err)?,
            );
            descs.push(desc);
        }
        let handles = MemHandleCache::with_capacity(&context, max_handles);
        Ok(QnnBackend {
            descs,
            graphs: retrieved,
            context,
            handles,
            region: None,
            memory,
            probe_host: probe_host && memory == MemoryUse::Host,
            rpcmem,
            _device: device,
        })
    }

    /// The allocator the KV region must come from for the chosen memory.
    pub fn region_allocator(&self) -> Box<dyn RegionAllocator> {
        self.memory.allocator(self.rpcmem.clone())
    }

    /// Host descriptors are htpkv's own: a library may refuse them (the reference library in its
    /// strict mode, like a real HTP). One registration of the region's first byte tells; on
    /// refusal the backend uses client buffers.
    fn probe_host_memory(&mut self) {
        let Some(region) = self.region else { return };
        // SAFETY: the region was just attached by the session that owns it and is at least one
        // byte long; the descriptor covers its first byte only.
        let probe =
            unsafe { MemDescriptor::host(vec![1], DataType::U8, region.base, region.len, 0) };
        if self.handles.get(&probe).is_err() {
            self.memory = MemoryUse::Client;
        }
        self.handles.clear();
    }

    /// Memory registrations made so far (one per distinct offset and shape).
    pub fn registrations(&self) -> u64 {
        self.handles.registrations()
    }

    /// The QNN context.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    fn descriptor(&self, info: &TensorInfo, ptr: *const u8, len: usize) -> Option<MemDescriptor> {
        if !self.memory.registers() {
            return None;
        }
        let region = self.region?;
        let offset = (ptr as usize).checked_sub(region.base as usize)?;
        if offset.checked_add(len)? > region.len {
            return None;
        }
        // SAFETY: the region was attached by the session that owns it and outlives this backend's use
        // of it (`Backend::attach_region`'s contract); the offset and length lie inside it.
        Some(unsafe {
            match region.fd.filter(|_| self.memory != MemoryUse::Host) {
                Some(fd) => MemDescriptor::shared_buffer(
                    info.shape.clone(),
                    info.data_type()?,
                    fd,
                    region.len,
                    offset,
                ),
                None => MemDescriptor::host(
                    info.shape.clone(),
                    info.data_type()?,
                    region.base,
                    region.len,
                    offset,
                ),
            }
        })
    }
}

impl Backend for QnnBackend {
    fn name(&self) -> &'static str {
        "qnn"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.descs
    }

    fn memory_report(&self) -> Option<MemoryReport> {
        Some(MemoryReport {
            memory: self.memory.name(),
            registrations: self.handles.registrations(),
            deregistrations: self.handles.deregistrations(),
            live_handles: self.handles.len(),
            peak_handles: self.handles.peak(),
            max_handles: self.handles.capacity(),
        })
    }

    fn attach_region(
        &mut self,
        base: *mut u8,
        len: usize,
        fd: Option<i32>,
    ) -> Result<(), BackendError> {
        self.handles.clear();
        self.region = Some(RegionInfo { base, len, fd });
        if self.probe_host {
            self.probe_host_memory();
        }
        if matches!(self.memory, MemoryUse::RpcMem | MemoryUse::Memfd) && fd.is_none() {
            return Err(backend_err(format!(
                "{} memory needs a region with a file descriptor",
                self.memory.name()
            )));
        }
        Ok(())
    }

    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        let g = self
            .graphs
            .get(graph)
            .ok_or_else(|| backend_err(format!("no graph #{graph}")))?;
        if inputs.len() != g.inputs().len() || outputs.len() != g.outputs().len() {
            return Err(backend_err(format!(
                "graph `{}` takes {} inputs and {} outputs, got {} and {}",
                g.name(),
                g.inputs().len(),
                g.outputs().len(),
                inputs.len(),
                outputs.len()
            )));
        }
        // Register region-backed tensors first (cached), then bind.
        self.handles.begin_step();
        let mut descs_in = Vec::with_capacity(inputs.len());
        for (info, b) in g.inputs().iter().zip(inputs) {
            descs_in.push(self.descriptor(info, b.ptr, b.len));
        }
        let mut descs_out = Vec::with_capacity(outputs.len());
        for (info, b) in g.outputs().iter().zip(outputs) {
            descs_out.push(self.descriptor(info, b.ptr, b.len));
        }
        for d in descs_in.iter().chain(&descs_out).flatten() {
            self.handles
                .get(d)
                .map_err(|e| backend_err_from("registering memory", e))?;
        }
        let bind = |d: &Option<MemDescriptor>, ptr: *mut u8, len: usize| -> TensorData<'_> {
            match d.as_ref().and_then(|d| self.handles.get_existing(d)) {
                Some(h) => TensorData::Mem(h),
                // SAFETY: the caller guarantees the buffer is valid for `len` bytes during the call.
                None => TensorData::Client(unsafe { ClientBuffer::from_raw(ptr, len) }),
            }
        };
        let ins: Vec<TensorData<'_>> = descs_in
            .iter()
            .zip(inputs)
            .map(|(d, b)| bind(d, b.ptr.cast_mut(), b.len))
            .collect();
        let outs: Vec<TensorData<'_>> = descs_out
            .iter()
            .zip(outputs)
            .map(|(d, b)| bind(d, b.ptr, b.len))
            .collect();
        let what = format!("executing graph `{}`", g.name());
        g.execute(&ins, &outs)
            .map_err(|e| backend_err_from(&what, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_give_roles() {
        assert_eq!(
            role_of("past_key_3_1"),
            Some((IoRole::PastKey, Some(3), Some(1)))
        );
        assert_eq!(
            role_of("new_value_0"),
            Some((IoRole::NewValue, Some(0), None))
        );
        assert_eq!(role_of("attention_mask"), Some((IoRole::Mask, None, None)));
        assert_eq!(role_of("past_key_x"), None);
        assert_eq!(role_of("past_key_1_2_3"), None);
        assert_eq!(role_of("weights"), None);
    }

    #[test]
    fn role_labels_cover_htpkv_and_ai_hub_names() {
        assert_eq!(
            role_label("past_key_3_1").as_deref(),
            Some("past K layer 3 head 1")
        );
        assert_eq!(
            role_label("past_value_12_in").as_deref(),
            Some("past V layer 12")
        );
        assert_eq!(
            role_label("past_key_0_out").as_deref(),
            Some("new K layer 0")
        );
        assert_eq!(role_label("position_ids_cos").as_deref(), Some("RoPE cos"));
        assert_eq!(role_label("logits").as_deref(), Some("logits"));
        assert_eq!(role_label("_model_layers_0_Add_output_0"), None);
        assert_eq!(role_label("past_key_x_in"), None);
    }
}
