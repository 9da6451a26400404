//! The graph-building half of the QNN API: a context made empty (`contextCreate`), graphs composed
//! in it (`graphCreate`, `tensorCreateGraphTensor`, `graphAddNode`, `graphFinalize`) and the
//! context serialized into a context binary (`contextGetBinarySize` / `contextGetBinary`).
//!
//! On HTP, `graphFinalize` runs the backend's preparation (on x86 Linux, Qualcomm's
//! `libQnnHtp.so` prepares and later executes in emulation). A device made with an [`HtpTarget`]
//! tells the backend which SoC and HTP architecture to prepare for; float graphs need it and a
//! [`GraphOptions::precision`] of fp16 (HTP computes float in half precision).
//!
//! Tensors are named; a node refers to its inputs and outputs by name, and [`GraphBuilder`]
//! passes the backend the id `tensorCreateGraphTensor` gave each. Operation names and parameters
//! are QNN's op definitions (package `qti.aisw`).

use crate::backend::{Backend, Context, Device};
use crate::bindings as b;
use crate::error::QnnError;
use crate::types::{OwnedRawTensor, Quantization, TensorInfo, TensorType};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

/// The built-in op package.
pub const OP_PACKAGE: &str = "qti.aisw";

/// Which HTP the graphs are prepared for: a SoC model number and the HTP architecture (v68, v69,
/// v73, v75, ...). SoC 60 with arch 75 is what Qualcomm's emulation on x86 accepts for fp16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtpTarget {
    /// SoC model number (`QNN_HTP_DEVICE_CONFIG_OPTION_SOC`).
    pub soc_model: u32,
    /// HTP architecture, e.g. 75 (`QNN_HTP_DEVICE_CONFIG_OPTION_ARCH`).
    pub arch: u32,
}

impl Default for HtpTarget {
    fn default() -> Self {
        HtpTarget {
            soc_model: 60,
            arch: 75,
        }
    }
}

/// Float precision of a graph's float operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// The backend's default (fixed-point graphs).
    #[default]
    Default,
    /// Half precision (what HTP runs float graphs in).
    Fp16,
}

/// Backend-specific options of one graph (HTP custom graph configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphOptions {
    /// Float precision.
    pub precision: Precision,
    /// HTP finalize optimization level 1..=3 (`None`: the backend's default).
    pub optimization: Option<u32>,
}

/// Owned storage of a NULL-terminated array of config pointers and what they point to.
struct ConfigList<C, T> {
    custom: Vec<Box<T>>,
    configs: Vec<Box<C>>,
    pointers: Vec<*const C>,
}

impl<C, T> std::fmt::Debug for ConfigList<C, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConfigList({} entries)", self.configs.len())
    }
}

impl<C, T> ConfigList<C, T> {
    fn new(custom: Vec<T>, wrap: impl Fn(*mut T) -> C) -> Self {
        let mut custom: Vec<Box<T>> = custom.into_iter().map(Box::new).collect();
        let configs: Vec<Box<C>> = custom
            .iter_mut()
            .map(|c| Box::new(wrap(&mut **c as *mut T)))
            .collect();
        let mut pointers: Vec<*const C> = configs.iter().map(|c| &**c as *const C).collect();
        pointers.push(std::ptr::null());
        ConfigList {
            custom,
            configs,
            pointers,
        }
    }

    /// The array to pass, or NULL when it is empty.
    fn as_ptr(&mut self) -> *mut *const C {
        debug_assert_eq!(self.custom.len(), self.configs.len());
        if self.configs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.pointers.as_mut_ptr()
        }
    }
}

fn htp_device_configs(t: HtpTarget) -> Vec<b::QnnHtpDevice_CustomConfig_t> {
    let mut soc = b::QnnHtpDevice_CustomConfig_t {
        option: b::QNN_HTP_DEVICE_CONFIG_OPTION_SOC,
        ..Default::default()
    };
    soc.__bindgen_anon_1.socModel = t.soc_model;
    let mut arch = b::QnnHtpDevice_CustomConfig_t {
        option: b::QNN_HTP_DEVICE_CONFIG_OPTION_ARCH,
        ..Default::default()
    };
    arch.__bindgen_anon_1.arch = b::QnnHtpDevice_MinimumArch_t {
        deviceId: 0,
        arch: t.arch,
    };
    vec![soc, arch]
}

fn htp_graph_configs(o: GraphOptions) -> Vec<b::QnnHtpGraph_CustomConfig_t> {
    let mut out = Vec::new();
    if o.precision == Precision::Fp16 {
        let mut c = b::QnnHtpGraph_CustomConfig_t {
            option: b::QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION,
            ..Default::default()
        };
        c.__bindgen_anon_1.precision = b::QNN_PRECISION_FLOAT16;
        out.push(c);
    }
    if let Some(level) = o.optimization {
        let mut c = b::QnnHtpGraph_CustomConfig_t {
            option: b::QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION,
            ..Default::default()
        };
        c.__bindgen_anon_1.optimizationOption = b::QnnHtpGraph_OptimizationOption_t {
            type_: b::QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG,
            floatValue: level as f32,
        };
        out.push(c);
    }
    out
}

impl Device {
    /// Creates the default device of `backend` configured for an HTP `target` (SoC model and
    /// architecture); `Ok(None)` when the backend has no device API.
    pub fn with_htp_target(
        backend: &Arc<Backend>,
        target: HtpTarget,
    ) -> Result<Option<Arc<Device>>, QnnError> {
        let mut list = ConfigList::new(htp_device_configs(target), |c| b::QnnDevice_Config_t {
            option: b::QNN_DEVICE_CONFIG_OPTION_CUSTOM,
            __bindgen_anon_1: b::QnnDevice_Config_t__bindgen_ty_1 {
                customConfig: c.cast(),
            },
        });
        let configs = list.as_ptr();
        // The list's boxes do not move when it does: the pointers stay valid in the device.
        Device::create_with(backend, configs, Some(Box::new(list)))
    }
}

impl Context {
    /// Creates an empty context to compose graphs in (`contextCreate`).
    pub fn create(
        backend: &Arc<Backend>,
        device: Option<&Arc<Device>>,
    ) -> Result<Arc<Context>, QnnError> {
        let lib = backend.library();
        let create = lib.need(lib.table().contextCreate, "contextCreate")?;
        let mut handle: b::Qnn_ContextHandle_t = std::ptr::null_mut();
        let device_handle = device.map_or(std::ptr::null_mut(), |d| d.raw());
        // SAFETY: NULL config is allowed; the device (if any) is alive; `handle` is writable.
        let rc = unsafe {
            create(
                backend.raw(),
                device_handle,
                std::ptr::null_mut(),
                &mut handle,
            )
        };
        lib.check("contextCreate", rc)?;
        Ok(Context::wrap(backend, device, handle))
    }

    /// The context serialized as a context binary (`contextGetBinarySize`, `contextGetBinary`),
    /// after its graphs are finalized.
    pub fn binary(&self) -> Result<Vec<u8>, QnnError> {
        let lib = self.backend().library();
        let size_of = lib.need(lib.table().contextGetBinarySize, "contextGetBinarySize")?;
        let get = lib.need(lib.table().contextGetBinary, "contextGetBinary")?;
        let mut size: u64 = 0;
        // SAFETY: the handle is alive; `size` is writable.
        let rc = unsafe { size_of(self.raw(), &mut size) };
        lib.check("contextGetBinarySize", rc)?;
        let len = usize::try_from(size).map_err(|_| QnnError::InvalidTensor {
            tensor: "context binary".into(),
            reason: format!("{size} bytes do not fit in memory"),
        })?;
        let mut buf = vec![0u8; len];
        let mut written: u64 = 0;
        // SAFETY: `buf` is writable for `size` bytes during the call; `written` is writable.
        let rc = unsafe { get(self.raw(), buf.as_mut_ptr().cast(), size, &mut written) };
        lib.check("contextGetBinary", rc)?;
        buf.truncate(usize::try_from(written).unwrap_or(len).min(len));
        Ok(buf)
    }
}

/// What a new graph tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A graph input the application writes.
    Input,
    /// A graph output the application reads.
    Output,
    /// An intermediate value.
    Native,
    /// Constant data (weights, tables, parameter tensors).
    Static,
}

impl TensorKind {
    fn tensor_type(self) -> TensorType {
        match self {
            TensorKind::Input => TensorType::AppWrite,
            TensorKind::Output => TensorType::AppRead,
            TensorKind::Native => TensorType::Native,
            TensorKind::Static => TensorType::Static,
        }
    }
}

/// A tensor to create: its name (unique in the graph), kind, raw `Qnn_DataType_t`, shape,
/// encoding and, for [`TensorKind::Static`], its bytes.
#[derive(Debug, Clone)]
pub struct NewTensor<'a> {
    /// Name, unique in the graph.
    pub name: String,
    /// Input, output, native or static.
    pub kind: TensorKind,
    /// Raw QNN data type (e.g. `bindings::QNN_DATATYPE_FLOAT_32`).
    pub dtype: u32,
    /// Dimensions, outermost first.
    pub shape: Vec<u32>,
    /// Encoding (fixed-point types).
    pub quant: Quantization,
    /// Static data, exactly the tensor's byte size.
    pub data: Option<&'a [u8]>,
}

/// A scalar parameter value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `BOOL_8`.
    Bool(bool),
    /// `UINT_32`.
    U32(u32),
    /// `INT_32`.
    I32(i32),
    /// `FLOAT_32`.
    F32(f32),
}

impl Scalar {
    fn raw(self) -> b::Qnn_Scalar_t {
        let mut s = b::Qnn_Scalar_t::default();
        match self {
            Scalar::Bool(v) => {
                s.dataType = b::QNN_DATATYPE_BOOL_8;
                s.__bindgen_anon_1.bool8Value = u8::from(v);
            }
            Scalar::U32(v) => {
                s.dataType = b::QNN_DATATYPE_UINT_32;
                s.__bindgen_anon_1.uint32Value = v;
            }
            Scalar::I32(v) => {
                s.dataType = b::QNN_DATATYPE_INT_32;
                s.__bindgen_anon_1.int32Value = v;
            }
            Scalar::F32(v) => {
                s.dataType = b::QNN_DATATYPE_FLOAT_32;
                s.__bindgen_anon_1.floatValue = v;
            }
        }
        s
    }
}

/// A node parameter: a scalar, or a static tensor already created in the graph (by name).
#[derive(Debug, Clone, PartialEq)]
pub enum Param<'a> {
    /// A scalar.
    Scalar(&'a str, Scalar),
    /// A static tensor created with [`GraphBuilder::tensor`].
    Tensor(&'a str, String),
}

/// One graph being composed in a context. Dropping it without [`GraphBuilder::finalize`] leaves an
/// unfinished graph in the context (the context then cannot be serialized).
#[derive(Debug)]
pub struct GraphBuilder {
    context: Arc<Context>,
    handle: b::Qnn_GraphHandle_t,
    name: String,
    tensors: HashMap<String, OwnedRawTensor>,
    /// Copies of static tensors' data, alive until the graph is finalized: the HTP backend reads
    /// them after `tensorCreateGraphTensor` returns (a parameter tensor built on the stack and
    /// freed after the call crashed `graphAddNode` inside `libQnnHtp.so`).
    static_data: Vec<Vec<u8>>,
    /// The graph's configs, kept alive for the same reason.
    _configs: ConfigList<b::QnnGraph_Config_t, b::QnnHtpGraph_CustomConfig_t>,
}

fn c_string(s: &str, what: &str) -> Result<CString, QnnError> {
    CString::new(s).map_err(|_| QnnError::InvalidTensor {
        tensor: s.to_string(),
        reason: format!("{what} contains a NUL byte"),
    })
}

impl GraphBuilder {
    /// Creates graph `name` in `context` (`graphCreate`) with HTP `options`.
    pub fn new(
        context: &Arc<Context>,
        name: &str,
        options: GraphOptions,
    ) -> Result<GraphBuilder, QnnError> {
        let lib = context.backend().library();
        let create = lib.need(lib.table().graphCreate, "graphCreate")?;
        let c_name = c_string(name, "graph name")?;
        let mut list = ConfigList::new(htp_graph_configs(options), |c| b::QnnGraph_Config_t {
            option: b::QNN_GRAPH_CONFIG_OPTION_CUSTOM,
            __bindgen_anon_1: b::QnnGraph_Config_t__bindgen_ty_1 {
                customConfig: c.cast(),
            },
        });
        let mut handle: b::Qnn_GraphHandle_t = std::ptr::null_mut();
        // SAFETY: the name and the config array (with what it points to) live in locals that
        // outlive the call; `handle` is writable.
        let rc = unsafe { create(context.raw(), c_name.as_ptr(), list.as_ptr(), &mut handle) };
        lib.check("graphCreate", rc)?;
        Ok(GraphBuilder {
            context: context.clone(),
            handle,
            name: name.to_string(),
            tensors: HashMap::new(),
            static_data: Vec::new(),
            _configs: list,
        })
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when a tensor of that name was created.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of a created tensor.
    pub fn shape(&self, name: &str) -> Option<&[u32]> {
        self.tensors.get(name).map(|t| t.dims())
    }

    /// Creates a tensor (`tensorCreateGraphTensor`); static data is copied into the builder.
    pub fn tensor(&mut self, t: NewTensor<'_>) -> Result<(), QnnError> {
        if self.tensors.contains_key(&t.name) {
            return Err(QnnError::InvalidTensor {
                tensor: t.name,
                reason: format!("created twice in graph `{}`", self.name),
            });
        }
        let info = TensorInfo {
            id: 0,
            name: t.name.clone(),
            tensor_type: t.kind.tensor_type(),
            dtype: t.dtype,
            shape: t.shape,
            quant: t.quant,
        };
        if t.data.is_some() != (t.kind == TensorKind::Static) {
            return Err(QnnError::InvalidTensor {
                tensor: info.name,
                reason: "static tensors, and only they, carry data".into(),
            });
        }
        if let Some(data) = t.data {
            let need = info.required_bytes()?;
            if data.len() != need {
                return Err(QnnError::TensorSize {
                    tensor: info.name,
                    found: data.len(),
                    expected: need,
                });
            }
        }
        let mut owned = OwnedRawTensor::new(&info)?;
        // QNN may read static data after this call (until the graph is finalized): it lives in
        // the builder.
        let kept = t.data.map(|d| {
            self.static_data.push(d.to_vec());
            self.static_data.last_mut().expect("just pushed")
        });
        let mut raw = match kept {
            Some(d) => owned.raw_with_client_buffer(d.as_mut_ptr(), d.len() as u32),
            None => owned.raw_with_client_buffer(std::ptr::null_mut(), 0),
        };
        let lib = self.context.backend().library();
        let create = lib.need(
            lib.table().tensorCreateGraphTensor,
            "tensorCreateGraphTensor",
        )?;
        // SAFETY: `raw` borrows `owned` and `t.data`, both alive during the call; the backend
        // copies static data and writes the new id into `raw`.
        let rc = unsafe { create(self.handle, &mut raw) };
        lib.check("tensorCreateGraphTensor", rc)?;
        // SAFETY: a version-1 tensor was passed, so `v1` is the member the backend wrote.
        owned.set_id(unsafe { raw.__bindgen_anon_1.v1.id });
        self.tensors.insert(info.name, owned);
        Ok(())
    }

    fn created(&self, name: &str) -> Result<b::Qnn_Tensor_t, QnnError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| QnnError::InvalidTensor {
                tensor: name.to_string(),
                reason: format!("not created in graph `{}`", self.name),
            })?;
        Ok(t.raw_with_client_buffer(std::ptr::null_mut(), 0))
    }

    /// Adds operation `name` of type `op` (package `qti.aisw`) (`graphAddNode`).
    pub fn node(
        &mut self,
        name: &str,
        op: &str,
        params: &[Param<'_>],
        inputs: &[&str],
        outputs: &[&str],
    ) -> Result<(), QnnError> {
        let names: Vec<CString> = params
            .iter()
            .map(|p| match p {
                Param::Scalar(n, _) | Param::Tensor(n, _) => c_string(n, "parameter name"),
            })
            .collect::<Result<_, _>>()?;
        let mut raw_params = Vec::with_capacity(params.len());
        for (p, n) in params.iter().zip(&names) {
            let mut raw = b::Qnn_Param_t {
                name: n.as_ptr(),
                ..Default::default()
            };
            match p {
                Param::Scalar(_, s) => {
                    raw.paramType = b::QNN_PARAMTYPE_SCALAR;
                    raw.__bindgen_anon_1.scalarParam = s.raw();
                }
                Param::Tensor(_, t) => {
                    raw.paramType = b::QNN_PARAMTYPE_TENSOR;
                    raw.__bindgen_anon_1.tensorParam = self.created(t)?;
                }
            }
            raw_params.push(raw);
        }
        let mut ins: Vec<_> = inputs
            .iter()
            .map(|n| self.created(n))
            .collect::<Result<_, _>>()?;
        let mut outs: Vec<_> = outputs
            .iter()
            .map(|n| self.created(n))
            .collect::<Result<_, _>>()?;
        let (c_name, c_pkg, c_op) = (
            c_string(name, "node name")?,
            c_string(OP_PACKAGE, "package")?,
            c_string(op, "op type")?,
        );
        let config = b::Qnn_OpConfig_t {
            version: b::QNN_OPCONFIG_VERSION_1,
            __bindgen_anon_1: b::Qnn_OpConfig_t__bindgen_ty_1 {
                v1: b::Qnn_OpConfigV1_t {
                    name: c_name.as_ptr(),
                    packageName: c_pkg.as_ptr(),
                    typeName: c_op.as_ptr(),
                    numOfParams: raw_params.len() as u32,
                    params: raw_params.as_mut_ptr(),
                    numOfInputs: ins.len() as u32,
                    inputTensors: ins.as_mut_ptr(),
                    numOfOutputs: outs.len() as u32,
                    outputTensors: outs.as_mut_ptr(),
                },
            },
        };
        let lib = self.context.backend().library();
        let add = lib.need(lib.table().graphAddNode, "graphAddNode")?;
        // SAFETY: every pointer in `config` refers to locals (names, params, tensors) or to
        // `self.tensors`, all alive during the call; QNN copies what it keeps.
        let rc = unsafe { add(self.handle, config) };
        lib.check("graphAddNode", rc).map_err(|e| QnnError::Node {
            graph: self.name.clone(),
            node: name.to_string(),
            op: op.to_string(),
            source: Box::new(e),
        })
    }

    /// Finalizes the graph (`graphFinalize`: on HTP, prepares it).
    pub fn finalize(self) -> Result<(), QnnError> {
        let lib = self.context.backend().library();
        let finalize = lib.need(lib.table().graphFinalize, "graphFinalize")?;
        // SAFETY: the handle is alive; NULL profile and signal are allowed.
        let rc = unsafe { finalize(self.handle, std::ptr::null_mut(), std::ptr::null_mut()) };
        lib.check("graphFinalize", rc)
    }
}
