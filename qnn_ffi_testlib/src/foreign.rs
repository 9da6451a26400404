//! An independent system provider describing a made-up AI Hub-style context binary, so that
//! `qnn_ffi` and `htpkv inspect` are tested against binary info that htpkv's own header and
//! reference library did not produce.
//!
//! Every struct is declared here from the public field lists (Qualcomm's BSD-licensed Python ctypes
//! declarations of the system-context and tensor structs), not from `qnn_ffi`'s bindings. Enabled by
//! `QNN_FFI_TESTLIB_SYSTEM=v3` (binary info V3, graph info V3 with HTP graph blob info, tensors V2)
//! or `=v1` (all version 1); see [`crate::QnnSystemInterface_getProviders`].

use std::ffi::{CString, c_char, c_void};

use crate::Version;

#[repr(C)]
#[derive(Clone, Copy)]
struct ScaleOffset {
    scale: f32,
    offset: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AxisScaleOffset {
    axis: i32,
    num: u32,
    scale_offset: *const ScaleOffset,
}

/// `Qnn_QuantizeParams_t`: definition, encoding, then a union whose largest member (the
/// bit-width per-axis encoding) is 32 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct QuantizeParams {
    definition: u32,
    encoding: u32,
    payload: QuantPayload,
}

#[repr(C)]
#[derive(Clone, Copy)]
union QuantPayload {
    per_tensor: ScaleOffset,
    per_axis: AxisScaleOffset,
    _size: [u64; 4],
}

/// The fields `Qnn_TensorV1_t` and `Qnn_TensorV2_t` share, in order.
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorV2 {
    id: u32,
    name: *const c_char,
    tensor_type: u32,
    data_format: u32,
    data_type: u32,
    quant: QuantizeParams,
    rank: u32,
    dims: *const u32,
    mem_type: u32,
    client_buf: [u64; 2],
    // Version 2 only.
    is_dynamic: *const u8,
    sparse: [u32; 3],
    is_produced: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Tensor {
    version: u32,
    body: TensorV2,
}

/// Graph info version 3 (versions 1 and 2 are its prefixes).
#[repr(C)]
#[derive(Clone, Copy)]
struct GraphInfoV3 {
    name: *const c_char,
    num_inputs: u32,
    inputs: *const Tensor,
    num_outputs: u32,
    outputs: *const Tensor,
    num_updateable: u32,
    updateable: *const Tensor,
    blob_size: u32,
    blob: *const c_void,
    start_op: u32,
    end_op: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct GraphInfo {
    version: u32,
    body: GraphInfoV3,
}

/// HTP graph blob info version 1: version, then spill-fill size first.
#[repr(C)]
struct GraphBlob {
    version: u32,
    spill_fill: u64,
    vtcm_mb: u32,
    optimization: u32,
    dlbc: u8,
    hvx_threads: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct BinaryInfoV1 {
    backend_id: u32,
    build_id: *const c_char,
    core_api: Version,
    backend_api: Version,
    soc_version: *const c_char,
    hw_blob_version: Version,
    context_blob_version: Version,
    hw_blob_size: u32,
    hw_blob: *const c_void,
    context_blob_size: u64,
    num_context_tensors: u32,
    context_tensors: *const Tensor,
    num_graphs: u32,
    graphs: *const GraphInfo,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct BinaryInfoV3 {
    backend_id: u32,
    build_id: *const c_char,
    core_api: Version,
    backend_api: Version,
    soc_version: *const c_char,
    context_blob_version: Version,
    context_blob_size: u64,
    num_context_tensors: u32,
    context_tensors: *const Tensor,
    num_graphs: u32,
    graphs: *const GraphInfo,
    platform_info: *const c_void,
    metadata_size: u32,
    metadata: *const c_void,
    soc_model: u32,
}

#[repr(C)]
union BinaryBody {
    v1: BinaryInfoV1,
    v3: BinaryInfoV3,
}

#[repr(C)]
struct BinaryInfo {
    version: u32,
    body: BinaryBody,
}

/// One described tensor: name, type, data type, dims, encoding.
struct Spec {
    name: &'static str,
    output: bool,
    dtype: u32,
    dims: Vec<u32>,
    quant: Option<(f32, i32)>,
    per_axis: Option<Vec<ScaleOffset>>,
}

/// Everything one binary info points to, kept alive until the system context is freed.
pub(crate) struct Built {
    _names: Vec<CString>,
    _graph_names: Vec<CString>,
    _dims: Vec<Vec<u32>>,
    _axis: Vec<Vec<ScaleOffset>>,
    _tensors: Vec<Vec<Tensor>>,
    _blobs: Vec<GraphBlob>,
    _graphs: Vec<GraphInfo>,
    _strings: Vec<CString>,
    info: Box<BinaryInfo>,
}

// SAFETY: every pointer inside `Built` points into heap storage owned by the same value, which is
// only read by the client while the owning system context lives and is never mutated.
unsafe impl Send for Built {}

impl Built {
    pub(crate) fn info_ptr(&self) -> *const c_void {
        std::ptr::from_ref(&*self.info).cast()
    }
}

const UFIXED_8: u32 = 0x0408;
const UFIXED_16: u32 = 0x0416;
const INT_32: u32 = 0x0032;

fn graph_specs(ar: u32, ctx: u32) -> Vec<Spec> {
    let (heads, dim) = (8, 64);
    let spec = |name, output, dtype, dims: Vec<u32>, quant| Spec {
        name,
        output,
        dtype,
        dims,
        quant,
        per_axis: None,
    };
    let mut key_in = spec(
        "past_key_0_in",
        false,
        UFIXED_8,
        vec![heads, 1, dim, ctx - ar],
        None,
    );
    key_in.per_axis = Some(
        (0..heads)
            .map(|h| ScaleOffset {
                scale: 0.01 * (h + 1) as f32,
                offset: -128,
            })
            .collect(),
    );
    vec![
        spec("input_ids", false, INT_32, vec![1, ar], None),
        spec(
            "attention_mask",
            false,
            UFIXED_16,
            vec![1, 1, ar, ctx],
            Some((7.6e-4, -65535)),
        ),
        spec(
            "position_ids_cos",
            false,
            UFIXED_16,
            vec![1, 1, ar, dim / 2],
            Some((3.1e-5, -32768)),
        ),
        spec(
            "position_ids_sin",
            false,
            UFIXED_16,
            vec![1, 1, ar, dim / 2],
            Some((3.1e-5, -32768)),
        ),
        key_in,
        spec(
            "past_value_0_in",
            false,
            UFIXED_8,
            vec![heads, 1, ctx - ar, dim],
            Some((0.02, -128)),
        ),
        spec(
            "_model_layers_0_Add_1_output_0",
            true,
            UFIXED_16,
            vec![1, ar, 2048],
            Some((1e-3, -30000)),
        ),
        spec(
            "past_key_0_out",
            true,
            UFIXED_8,
            vec![heads, 1, dim, ar],
            Some((0.03, -128)),
        ),
        spec(
            "past_value_0_out",
            true,
            UFIXED_8,
            vec![heads, 1, ar, dim],
            Some((0.02, -128)),
        ),
    ]
}

fn raw_tensor(
    id: u32,
    spec: &Spec,
    name: &CString,
    dims: &[u32],
    axis: &[ScaleOffset],
    v2: bool,
) -> Tensor {
    let mut quant = QuantizeParams {
        definition: 0x7FFF_FFFF,
        encoding: 0x7FFF_FFFF,
        payload: QuantPayload { _size: [0; 4] },
    };
    if let Some((scale, offset)) = spec.quant {
        quant.definition = 1;
        quant.encoding = 0;
        quant.payload.per_tensor = ScaleOffset { scale, offset };
    } else if !axis.is_empty() {
        quant.definition = 1;
        quant.encoding = 1;
        quant.payload.per_axis = AxisScaleOffset {
            axis: 0,
            num: axis.len() as u32,
            scale_offset: axis.as_ptr(),
        };
    }
    Tensor {
        version: if v2 { 2 } else { 1 },
        body: TensorV2 {
            id,
            name: name.as_ptr(),
            tensor_type: u32::from(spec.output),
            data_format: 0,
            data_type: spec.dtype,
            quant,
            rank: dims.len() as u32,
            dims: dims.as_ptr(),
            mem_type: 0x7FFF_FFFF,
            client_buf: [0; 2],
            is_dynamic: std::ptr::null(),
            sparse: [0x7FFF_FFFF, 0, 0],
            is_produced: 0,
        },
    }
}

/// Builds binary info for a two-graph part of an AI Hub-style export (`v3`: current layouts).
pub(crate) fn build(v3: bool) -> Built {
    let mut names = Vec::new();
    let (mut all_dims, mut all_axis, mut tensors, mut blobs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut graph_names = Vec::new();
    let mut id = 1;
    for (phase, ar) in [("prompt", 128), ("token", 1)] {
        graph_names.push(CString::new(format!("{phase}_ar{ar}_cl4096_1_of_3")).unwrap());
        let specs = graph_specs(ar, 4096);
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        for spec in &specs {
            let name = CString::new(spec.name).unwrap();
            let dims = spec.dims.clone();
            let axis = spec.per_axis.clone().unwrap_or_default();
            let t = raw_tensor(id, spec, &name, &dims, &axis, v3);
            id += 1;
            if spec.output {
                outs.push(t)
            } else {
                ins.push(t)
            }
            names.push(name);
            all_dims.push(dims);
            all_axis.push(axis);
        }
        tensors.push(ins);
        tensors.push(outs);
        blobs.push(GraphBlob {
            version: 1,
            spill_fill: if ar == 1 { 1_048_576 } else { 25_165_824 },
            vtcm_mb: 8,
            optimization: 3,
            dlbc: 0,
            hvx_threads: 4,
        });
    }
    let graphs: Vec<GraphInfo> = graph_names
        .iter()
        .enumerate()
        .map(|(i, name)| GraphInfo {
            version: if v3 { 3 } else { 1 },
            body: GraphInfoV3 {
                name: name.as_ptr(),
                num_inputs: tensors[2 * i].len() as u32,
                inputs: tensors[2 * i].as_ptr(),
                num_outputs: tensors[2 * i + 1].len() as u32,
                outputs: tensors[2 * i + 1].as_ptr(),
                num_updateable: 0,
                updateable: std::ptr::null(),
                blob_size: std::mem::size_of::<GraphBlob>() as u32,
                blob: std::ptr::from_ref(&blobs[i]).cast(),
                start_op: 0,
                end_op: 1000,
            },
        })
        .collect();
    let build_id = CString::new("foreign-testlib 2.37.0").unwrap();
    let soc = CString::new("V75").unwrap();
    let v = |major, minor, patch| Version {
        major,
        minor,
        patch,
    };
    let body = if v3 {
        BinaryBody {
            v3: BinaryInfoV3 {
                backend_id: 6,
                build_id: build_id.as_ptr(),
                core_api: v(2, 28, 0),
                backend_api: v(5, 37, 0),
                soc_version: soc.as_ptr(),
                context_blob_version: v(3, 3, 0),
                context_blob_size: 123_456_789,
                num_context_tensors: 0,
                context_tensors: std::ptr::null(),
                num_graphs: graphs.len() as u32,
                graphs: graphs.as_ptr(),
                platform_info: std::ptr::null(),
                metadata_size: 0,
                metadata: std::ptr::null(),
                soc_model: 57,
            },
        }
    } else {
        BinaryBody {
            v1: BinaryInfoV1 {
                backend_id: 6,
                build_id: build_id.as_ptr(),
                core_api: v(2, 14, 0),
                backend_api: v(5, 14, 0),
                soc_version: soc.as_ptr(),
                hw_blob_version: v(0, 0, 1),
                context_blob_version: v(3, 1, 0),
                hw_blob_size: 0,
                hw_blob: std::ptr::null(),
                context_blob_size: 123_456_789,
                num_context_tensors: 0,
                context_tensors: std::ptr::null(),
                num_graphs: graphs.len() as u32,
                graphs: graphs.as_ptr(),
            },
        }
    };
    let info = Box::new(BinaryInfo {
        version: if v3 { 3 } else { 1 },
        body,
    });
    Built {
        _names: names,
        _graph_names: graph_names,
        _dims: all_dims,
        _axis: all_axis,
        _tensors: tensors,
        _blobs: blobs,
        _graphs: graphs,
        _strings: vec![build_id, soc],
        info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the public field lists give on LP64 (independent of qnn_ffi's header).
    #[test]
    fn layouts_match_the_public_field_lists() {
        assert_eq!(std::mem::size_of::<Tensor>(), 144);
        assert_eq!(std::mem::size_of::<GraphInfo>(), 88);
        assert_eq!(std::mem::size_of::<BinaryInfoV1>(), 128);
        assert_eq!(std::mem::size_of::<BinaryInfoV3>(), 136);
        assert_eq!(std::mem::size_of::<BinaryInfo>(), 144);
    }
}
