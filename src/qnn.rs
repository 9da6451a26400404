//! The QNN backend: the graphs of a context binary executed through a QNN backend library loaded at
//! run time (`libQnnHtp.so` on a device, the reference backend's `libhtpkv_ref_qnn.so` on a desktop).
//!
//! Tensor descriptions come from the system library's binary info (names, shapes, data types,
//! encodings), never from htpkv's own file. Roles are read from the tensor names htpkv's graphs use:
//! `input_ids`, `positions`, `attention_mask`, `logits`, `past_key_{layer}[_{head}]`,
//! `past_value_…`, `new_key_…`, `new_value_…` (a context binary made with Qualcomm's tools must name
//! its IO tensors the same way). K/V bindings inside the cache region are passed as registered memory
//! handles (one per distinct offset and shape, cached); everything else as client buffers.

use crate::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoDType, IoRole, IoTensor, OutputBuffer,
};
use crate::engine::EngineError;
use qnn_ffi::{
    ClientBuffer, Context, DataType as QnnType, Device, Graph, LogLevel, MemDescriptor,
    MemHandleCache, QnnLibrary, QnnSystemLibrary, Quantization, SystemContext, TensorData,
    TensorInfo,
};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use std::path::Path;
use std::sync::Arc;

fn qnn_err(e: qnn_ffi::QnnError) -> EngineError {
    EngineError::Qnn(e.to_string())
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
    for (prefix, role) in [
        ("past_key_", IoRole::PastKey),
        ("past_value_", IoRole::PastValue),
        ("new_key_", IoRole::NewKey),
        ("new_value_", IoRole::NewValue),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            let mut parts = rest.split('_').map(str::parse::<usize>);
            let layer = parts.next()?.ok()?;
            let head = match parts.next() {
                Some(h) => Some(h.ok()?),
                None => None,
            };
            if parts.next().is_some() {
                return None;
            }
            return Some((role, Some(layer), head));
        }
    }
    None
}

fn quant_type(t: QnnType) -> Option<IoDType> {
    Some(match t {
        QnnType::I32 => IoDType::I32,
        QnnType::UFixed8 => IoDType::Quant(DataType::U8),
        QnnType::UFixed16 => IoDType::Quant(DataType::U16),
        QnnType::SFixed8 => IoDType::Quant(DataType::I8),
        QnnType::SFixed16 => IoDType::Quant(DataType::I16),
        QnnType::F16 => IoDType::Quant(DataType::F16),
        QnnType::F32 => IoDType::Quant(DataType::F32),
        _ => return None,
    })
}

/// Converts binary-info tensors to the runtime's descriptions.
pub fn io_tensor(t: &TensorInfo) -> Result<IoTensor, String> {
    let (role, layer, head) = role_of(&t.name).ok_or_else(|| {
        format!(
            "tensor `{}`: name does not follow htpkv's IO naming",
            t.name
        )
    })?;
    let dtype = quant_type(t.dtype)
        .ok_or_else(|| format!("tensor `{}`: unsupported data type {:?}", t.name, t.dtype))?;
    let quant = match (dtype, &t.quant) {
        (IoDType::I32, _) => None,
        (IoDType::Quant(d), Quantization::None) if !d.is_fixed_point() => Some(QuantSpec {
            dtype: d,
            encoding: Encoding::Float,
        }),
        (IoDType::Quant(d), Quantization::PerTensor { scale, offset }) if d.is_fixed_point() => {
            Some(QuantSpec {
                dtype: d,
                encoding: Encoding::PerTensor(ScaleOffset {
                    scale: *scale,
                    offset: *offset,
                }),
            })
        }
        (
            IoDType::Quant(d),
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
                "tensor `{}`: encoding {q:?} does not fit {:?}",
                t.name, t.dtype
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
    _device: Option<Arc<Device>>,
}

impl std::fmt::Debug for QnnBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QnnBackend")
            .field(
                "graphs",
                &self.descs.iter().map(|g| &g.name).collect::<Vec<_>>(),
            )
            .field("registrations", &self.handles.registrations())
            .finish()
    }
}

impl QnnBackend {
    /// Loads the libraries and the context binary and retrieves every graph.
    pub fn open(
        backend_lib: &Path,
        system_lib: Option<&Path>,
        binary_path: &Path,
    ) -> Result<QnnBackend, EngineError> {
        let lib = QnnLibrary::load(backend_lib).map_err(qnn_err)?;
        let system = QnnSystemLibrary::load(system_lib.unwrap_or(backend_lib)).map_err(qnn_err)?;
        let binary = std::fs::read(binary_path).map_err(|error| EngineError::Io {
            what: "reading the context binary",
            path: binary_path.to_path_buf(),
            error,
        })?;
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
        let handles = MemHandleCache::new(&context);
        Ok(QnnBackend {
            descs,
            graphs: retrieved,
            context,
            handles,
            region: None,
            _device: device,
        })
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
        let region = self.region?;
        let offset = (ptr as usize).checked_sub(region.base as usize)?;
        if offset.checked_add(len)? > region.len {
            return None;
        }
        // SAFETY: the region was attached by the session that owns it and outlives this backend's use
        // of it (`Backend::attach_region`'s contract); the offset and length lie inside it.
        Some(unsafe {
            match region.fd {
                Some(fd) => MemDescriptor::shared_buffer(
                    info.shape.clone(),
                    info.dtype,
                    fd,
                    region.len,
                    offset,
                ),
                None => MemDescriptor::host(
                    info.shape.clone(),
                    info.dtype,
                    region.base,
                    region.len,
                    offset,
                ),
            }
        })
    }
}

/// Opens a QNN backend as a boxed [`Backend`].
pub fn open_backend(
    backend_lib: &Path,
    system_lib: Option<&Path>,
    compiled: &Path,
) -> Result<Box<dyn Backend>, EngineError> {
    Ok(Box::new(QnnBackend::open(
        backend_lib,
        system_lib,
        compiled,
    )?))
}

impl Backend for QnnBackend {
    fn name(&self) -> &'static str {
        "qnn"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.descs
    }

    fn attach_region(
        &mut self,
        base: *mut u8,
        len: usize,
        fd: Option<i32>,
    ) -> Result<(), BackendError> {
        self.handles.clear();
        self.region = Some(RegionInfo { base, len, fd });
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
        for d in descs_in.iter().chain(&descs_out).flatten() {
            self.handles
                .get(d)
                .map_err(|e| backend_err(format!("registering memory: {e}")))?;
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
        g.execute(&ins, &outs).map_err(|e| BackendError {
            backend: "qnn",
            message: e.to_string(),
            source: Some(Box::new(e)),
        })
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
}
