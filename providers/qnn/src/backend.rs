//! The QNN backend: the graphs of a context binary executed through a QNN backend library loaded at
//! run time (`libQnnHtp.so` on a device, the reference backend's `libhtpkv_ref_qnn.so` on a desktop).
//!
//! Tensor descriptions come from the system library's binary info (names, shapes, data types,
//! encodings), never from htpkv's own file. Roles come from an IO convention ([`htpkv_runtime::convention`]):
//! given, or detected from the graph and tensor names. Several binaries (the parts of a split model)
//! load as one context each on one backend and device. K/V bindings inside the cache region are passed as registered memory
//! handles (one per distinct offset and shape, cached, at most `max_handles` alive with least recently
//! used ones deregistered) or as client buffers, as [`crate::memory`] decides; everything else as
//! client buffers.

use crate::memory::{MemoryUse, QnnMemory};
use htpkv_runtime::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoTensor, MemoryReport, OutputBuffer, PartOf,
};
use htpkv_runtime::convention::{self, Assigned, Convention, ConventionError, GraphNames};
use kv_manager::RegionAllocator;
use model::fsio::{FileError, FileKind, read_capped};
use qnn_ffi::{
    ClientBuffer, Context, Device, Graph, LogLevel, MemDescriptor, MemHandleCache, QnnError,
    QnnLibrary, QnnSystemLibrary, Quantization, RpcMemAllocator, SystemContext, TensorData,
    TensorInfo, qnn_dtype_name,
};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why context binaries could not be opened as a QNN backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QnnOpenError {
    /// A QNN call failed: loading a library, creating the backend, the device or a graph handle.
    #[error("QNN backend")]
    Qnn(#[source] QnnError),
    /// QNN could not read or load one context binary: the path says which of the parts.
    #[error("QNN cannot {what} the context binary {}", path.display())]
    Binary {
        /// `read` (binary info) or `load` (context creation).
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<QnnError>,
    },
    /// The graphs do not describe a model the runtime can run (the message names the graph or
    /// tensor), or no binary was given.
    #[error("QNN backend: {0}")]
    Graphs(String),
    /// The graphs do not fit the IO convention, or none could be chosen.
    #[error(transparent)]
    Convention(#[from] ConventionError),
    /// A context binary could not be read (it names the file; see `model::fsio`).
    #[error(transparent)]
    File(#[from] FileError),
}

impl QnnOpenError {
    /// The error's kind in the engine's vocabulary: `io` for a file that cannot be read, `qnn`
    /// otherwise.
    pub fn kind(&self) -> &'static str {
        match self {
            QnnOpenError::File(_) => "io",
            _ => "qnn",
        }
    }
}

/// A QNN error about one context binary, naming it.
fn binary_err(what: &'static str, path: &Path) -> impl FnOnce(QnnError) -> QnnOpenError {
    move |source| QnnOpenError::Binary {
        what,
        path: path.to_path_buf(),
        source: Box::new(source),
    }
}

/// A backend error whose cause is a QNN error: the message says what was being done, the cause is
/// the source (printed once by reports).
fn backend_err_from(what: &str, e: QnnError) -> BackendError {
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

fn tensor_names(list: &[TensorInfo]) -> Vec<&str> {
    list.iter().map(|t| t.name.as_str()).collect()
}

/// The convention of a set of graphs: `given`, or else the one preset that fits every graph.
pub fn convention_for(
    graphs: &[qnn_ffi::GraphInfo],
    given: Option<&Convention>,
) -> Result<Convention, ConventionError> {
    if let Some(c) = given {
        return Ok(c.clone());
    }
    let names: Vec<GraphNames<'_>> = graphs
        .iter()
        .map(|g| GraphNames {
            name: &g.name,
            inputs: g.inputs.iter().map(|t| t.name.as_str()).collect(),
            outputs: g.outputs.iter().map(|t| t.name.as_str()).collect(),
        })
        .collect();
    convention::detect(&names)
}

/// Role labels of a graph's inputs and of its outputs (`None`: no role known).
pub type RoleLabels = (Vec<Option<String>>, Vec<Option<String>>);

/// Role labels of every graph's inputs and outputs under the detected convention, for `htpkv
/// inspect`: `None` for every tensor of a binary no preset convention fits (never an error).
pub fn role_labels(graphs: &[qnn_ffi::GraphInfo]) -> Vec<RoleLabels> {
    let convention = convention_for(graphs, None).ok();
    graphs
        .iter()
        .map(|g| {
            let (ins, outs) = (tensor_names(&g.inputs), tensor_names(&g.outputs));
            match convention
                .as_ref()
                .and_then(|c| c.assign(&g.name, &ins, &outs).ok())
            {
                Some((i, o)) => (
                    i.iter().map(|a| Some(convention::role_label(a))).collect(),
                    o.iter().map(|a| Some(convention::role_label(a))).collect(),
                ),
                None => (vec![None; ins.len()], vec![None; outs.len()]),
            }
        })
        .collect()
}

/// Converts a binary-info tensor with the role its convention assigned to the runtime's
/// description.
pub fn io_tensor(t: &TensorInfo, assigned: Assigned) -> Result<IoTensor, String> {
    let Assigned { role, layer, head } = assigned;
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

/// One graph's description under `convention`: roles from the convention, part from the graph
/// name, shapes and encodings from the binary info.
pub fn graph_desc(
    g: &qnn_ffi::GraphInfo,
    convention: &Convention,
) -> Result<GraphDesc, QnnOpenError> {
    let (ins, outs) =
        convention.assign(&g.name, &tensor_names(&g.inputs), &tensor_names(&g.outputs))?;
    let name = convention.graph_name(&g.name)?;
    let convert = |list: &[TensorInfo], roles: Vec<Assigned>| {
        list.iter()
            .zip(roles)
            .map(|(t, a)| io_tensor(t, a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(QnnOpenError::Graphs)
    };
    let desc = GraphDesc {
        name: g.name.clone(),
        inputs: convert(&g.inputs, ins)?,
        outputs: convert(&g.outputs, outs)?,
        part: PartOf {
            index: name.part,
            count: name.parts,
        },
        mask: convention.mask,
    };
    // A part without a mask (AI Hub's part 1, the embedding alone) gives no context length.
    let check = |what: &str, named: Option<usize>, found: Option<usize>| match named {
        Some(n) if found.is_some_and(|f| f != n) => Err(QnnOpenError::Graphs(format!(
            "graph `{}`: the name says {what} {n} but its tensors give {found:?}",
            g.name
        ))),
        _ => Ok(()),
    };
    check("AR", name.ar, desc.ar())?;
    check("context", name.context, desc.context())?;
    Ok(desc)
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

/// How [`QnnBackend::open_binaries`] loads: K/V memory, the handle cap, the convention.
#[derive(Debug, Clone)]
pub struct QnnOpenOptions {
    pub memory: QnnMemory,
    pub max_handles: usize,
    /// `None`: detected from the graph and tensor names.
    pub convention: Option<Convention>,
}

/// A QNN backend library running the graphs of one or more context binaries (the parts of a split
/// model, or several context lengths).
pub struct QnnBackend {
    descs: Vec<GraphDesc>,
    graphs: Vec<Graph>,
    /// The context (index into `contexts`) each graph belongs to.
    graph_context: Vec<usize>,
    /// One context per binary, all on the one backend and device.
    contexts: Vec<Arc<Context>>,
    /// Memory handles are registered with a context: one cache per context.
    handles: Vec<MemHandleCache>,
    convention: Convention,
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
            .field("registrations", &self.registrations())
            .finish()
    }
}

impl QnnBackend {
    /// Loads the libraries and the context binary and retrieves every graph; `memory` chooses
    /// how K/V tensors are passed, `max_handles` caps the live memory handles. The convention is
    /// detected from the names.
    pub fn open(
        backend_lib: &Path,
        system_lib: Option<&Path>,
        binary_path: &Path,
        memory: QnnMemory,
        max_handles: usize,
    ) -> Result<QnnBackend, QnnOpenError> {
        let options = QnnOpenOptions {
            memory,
            max_handles,
            convention: None,
        };
        QnnBackend::open_binaries(backend_lib, system_lib, &[binary_path], &options)
    }

    /// Loads the libraries and every context binary (one context each, on one backend and one
    /// device) and retrieves every graph, described under the convention of `options` (detected
    /// from all binaries' names when `None`). Graphs are ordered by context length, AR and part.
    pub fn open_binaries(
        backend_lib: &Path,
        system_lib: Option<&Path>,
        binary_paths: &[&Path],
        options: &QnnOpenOptions,
    ) -> Result<QnnBackend, QnnOpenError> {
        if binary_paths.is_empty() {
            return Err(QnnOpenError::Graphs("no context binary given".into()));
        }
        let lib = QnnLibrary::load(backend_lib).map_err(QnnOpenError::Qnn)?;
        let reference = lib
            .provider()
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("htpkv_ref"));
        let rpcmem = RpcMemAllocator::new().ok();
        let probe_host = options.memory == QnnMemory::Auto;
        let memory = MemoryUse::resolve(options.memory, reference, rpcmem.is_some());
        let system =
            QnnSystemLibrary::load(system_lib.unwrap_or(backend_lib)).map_err(QnnOpenError::Qnn)?;
        let mut binaries = Vec::new();
        let mut infos = Vec::new();
        for path in binary_paths {
            let binary = read_capped(path, FileKind::CONTEXT_BINARY)?;
            let mut ctx = SystemContext::new(&system).map_err(QnnOpenError::Qnn)?;
            let info = ctx.binary_info(&binary).map_err(binary_err("read", path))?;
            infos.push(info.graphs);
            binaries.push(binary);
        }
        let all: Vec<qnn_ffi::GraphInfo> = infos.iter().flatten().cloned().collect();
        let convention = convention_for(&all, options.convention.as_ref())?;
        let log = qnn_ffi::Log::new(&lib, LogLevel::Warn).ok();
        let backend = qnn_ffi::Backend::new(&lib, log.as_ref()).map_err(QnnOpenError::Qnn)?;
        let device = Device::new(&backend).map_err(QnnOpenError::Qnn)?;
        let mut found = Vec::new();
        let mut contexts = Vec::new();
        for (index, (binary, graphs)) in binaries.iter().zip(infos).enumerate() {
            let context = Context::from_binary(&backend, device.as_ref(), binary)
                .map_err(binary_err("load", binary_paths[index]))?;
            for info in graphs {
                let desc = graph_desc(&info, &convention)?;
                let graph = context
                    .graph(&info.name, info.inputs, info.outputs)
                    .map_err(QnnOpenError::Qnn)?;
                found.push((desc, graph, index));
            }
            contexts.push(context);
        }
        found.sort_by_key(|(d, _, _)| (d.context(), d.ar().unwrap_or(usize::MAX), d.part.index));
        let handles = contexts
            .iter()
            .map(|c| MemHandleCache::with_capacity(c, options.max_handles))
            .collect();
        Ok(QnnBackend {
            descs: found.iter().map(|f| f.0.clone()).collect(),
            graph_context: found.iter().map(|f| f.2).collect(),
            graphs: found.into_iter().map(|f| f.1).collect(),
            contexts,
            handles,
            convention,
            region: None,
            memory,
            probe_host: probe_host && memory == MemoryUse::Host,
            rpcmem,
            _device: device,
        })
    }

    /// The convention the graphs were described under.
    pub fn convention(&self) -> &Convention {
        &self.convention
    }

    /// The allocator the KV region must come from for the chosen memory.
    pub fn region_allocator(&self) -> Box<dyn RegionAllocator + Send> {
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
        if self.handles[0].get(&probe).is_err() {
            self.memory = MemoryUse::Client;
        }
        self.clear_handles();
    }

    fn clear_handles(&mut self) {
        self.handles.iter_mut().for_each(MemHandleCache::clear);
    }

    /// Memory registrations made so far (one per distinct offset, shape and context).
    pub fn registrations(&self) -> u64 {
        self.handles.iter().map(MemHandleCache::registrations).sum()
    }

    /// The QNN context of the first binary.
    pub fn context(&self) -> &Arc<Context> {
        &self.contexts[0]
    }

    /// The QNN contexts, one per binary.
    pub fn contexts(&self) -> &[Arc<Context>] {
        &self.contexts
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
        let sum = |f: fn(&MemHandleCache) -> usize| self.handles.iter().map(f).sum::<usize>();
        Some(MemoryReport {
            memory: self.memory.name(),
            registrations: self.registrations(),
            deregistrations: self.handles.iter().map(|h| h.deregistrations()).sum(),
            live_handles: sum(MemHandleCache::len),
            peak_handles: sum(MemHandleCache::peak),
            max_handles: sum(MemHandleCache::capacity),
        })
    }

    fn attach_region(
        &mut self,
        base: *mut u8,
        len: usize,
        fd: Option<i32>,
    ) -> Result<(), BackendError> {
        self.clear_handles();
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
        let mut descs_in = Vec::with_capacity(inputs.len());
        for (info, b) in g.inputs().iter().zip(inputs) {
            descs_in.push(self.descriptor(info, b.ptr, b.len));
        }
        let mut descs_out = Vec::with_capacity(outputs.len());
        for (info, b) in g.outputs().iter().zip(outputs) {
            descs_out.push(self.descriptor(info, b.ptr, b.len));
        }
        let handles = &mut self.handles[self.graph_context[graph]];
        handles.begin_step();
        for d in descs_in.iter().chain(&descs_out).flatten() {
            handles
                .get(d)
                .map_err(|e| backend_err_from("registering memory", e))?;
        }
        let handles = &*handles;
        let bind = |d: &Option<MemDescriptor>, ptr: *mut u8, len: usize| -> TensorData<'_> {
            match d.as_ref().and_then(|d| handles.get_existing(d)) {
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
