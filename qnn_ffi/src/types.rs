//! Plain Rust descriptions of QNN tensors, and conversion to and from the raw `Qnn_Tensor_t`.

use std::ffi::{CStr, CString};

use quant::DataType;

use crate::bindings as b;
use crate::error::QnnError;

pub use crate::version::Version;

/// Every raw `Qnn_DataType_t` value with a fixed element size. The low byte spells the bit width
/// in decimal digits (`0x0008` is 8 bits, `0x0032` is 32).
const SIZED_QNN_TYPES: [u32; 18] = [
    b::QNN_DATATYPE_INT_8,
    b::QNN_DATATYPE_INT_16,
    b::QNN_DATATYPE_INT_32,
    b::QNN_DATATYPE_INT_64,
    b::QNN_DATATYPE_UINT_8,
    b::QNN_DATATYPE_UINT_16,
    b::QNN_DATATYPE_UINT_32,
    b::QNN_DATATYPE_UINT_64,
    b::QNN_DATATYPE_FLOAT_16,
    b::QNN_DATATYPE_FLOAT_32,
    b::QNN_DATATYPE_FLOAT_64,
    b::QNN_DATATYPE_SFIXED_POINT_8,
    b::QNN_DATATYPE_SFIXED_POINT_16,
    b::QNN_DATATYPE_SFIXED_POINT_32,
    b::QNN_DATATYPE_UFIXED_POINT_8,
    b::QNN_DATATYPE_UFIXED_POINT_16,
    b::QNN_DATATYPE_UFIXED_POINT_32,
    b::QNN_DATATYPE_BOOL_8,
];

/// The workspace's data type ([`quant::DataType`]) of a raw `Qnn_DataType_t`.
///
/// The fixed-point types map to `u8`/`u16`/`i8`/`i16`, `FLOAT_16/32` to `f16`/`f32` and `INT_32`
/// to `i32`; every other QNN type (64-bit, plain unsigned, 32-bit fixed point, bool, packed
/// 4-bit, unknown) gives `None`: htpkv's graphs never use them.
pub fn dtype_from_qnn(raw: u32) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| dtype_to_qnn(d) == raw)
}

/// The raw `Qnn_DataType_t` of a workspace data type (fixed-point types map to QNN's
/// `*FIXED_POINT_*`, `i32` to `INT_32`).
pub const fn dtype_to_qnn(dtype: DataType) -> u32 {
    match dtype {
        DataType::U8 => b::QNN_DATATYPE_UFIXED_POINT_8,
        DataType::U16 => b::QNN_DATATYPE_UFIXED_POINT_16,
        DataType::I8 => b::QNN_DATATYPE_SFIXED_POINT_8,
        DataType::I16 => b::QNN_DATATYPE_SFIXED_POINT_16,
        DataType::F16 => b::QNN_DATATYPE_FLOAT_16,
        DataType::F32 => b::QNN_DATATYPE_FLOAT_32,
        DataType::I32 => b::QNN_DATATYPE_INT_32,
    }
}

/// Bytes per element of a raw `Qnn_DataType_t`, `None` for packed 4-bit, string and unknown
/// types.
pub fn qnn_dtype_size(raw: u32) -> Option<usize> {
    SIZED_QNN_TYPES.contains(&raw).then(|| {
        let bits = (raw & 0xFF) as usize;
        ((bits >> 4) * 10 + (bits & 0xF)) / 8
    })
}

/// A short name for a raw `Qnn_DataType_t`: the workspace name (`u8`, `f32`, `i32`, ...) when
/// htpkv uses the type, else `qnn_type_0x....`.
pub fn qnn_dtype_name(raw: u32) -> String {
    match dtype_from_qnn(raw) {
        Some(d) => d.name().to_string(),
        None => format!("qnn_type_{raw:#06x}"),
    }
}

/// Who reads and writes a tensor (`Qnn_TensorType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    /// Graph input written by the application.
    AppWrite,
    /// Graph output read by the application.
    AppRead,
    /// Read and written by the application.
    AppReadWrite,
    /// Internal to the graph.
    Native,
    /// Constant data.
    Static,
    /// An absent optional tensor.
    Null,
    /// Any other value.
    Other(u32),
}

impl TensorType {
    /// From the raw enum value.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            b::QNN_TENSOR_TYPE_APP_WRITE => TensorType::AppWrite,
            b::QNN_TENSOR_TYPE_APP_READ => TensorType::AppRead,
            b::QNN_TENSOR_TYPE_APP_READWRITE => TensorType::AppReadWrite,
            b::QNN_TENSOR_TYPE_NATIVE => TensorType::Native,
            b::QNN_TENSOR_TYPE_STATIC => TensorType::Static,
            b::QNN_TENSOR_TYPE_NULL => TensorType::Null,
            other => TensorType::Other(other),
        }
    }

    /// The raw enum value.
    pub fn to_raw(self) -> u32 {
        match self {
            TensorType::AppWrite => b::QNN_TENSOR_TYPE_APP_WRITE,
            TensorType::AppRead => b::QNN_TENSOR_TYPE_APP_READ,
            TensorType::AppReadWrite => b::QNN_TENSOR_TYPE_APP_READWRITE,
            TensorType::Native => b::QNN_TENSOR_TYPE_NATIVE,
            TensorType::Static => b::QNN_TENSOR_TYPE_STATIC,
            TensorType::Null => b::QNN_TENSOR_TYPE_NULL,
            TensorType::Other(raw) => raw,
        }
    }
}

/// A tensor's quantization encoding. Fixed-point values decode as `(q + offset) * scale`.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantization {
    /// No encoding (float and plain integer tensors).
    None,
    /// One scale/offset for the whole tensor (also from the bit-width variant).
    PerTensor {
        /// Scale (> 0).
        scale: f32,
        /// Offset (= -zero point).
        offset: i32,
    },
    /// One scale/offset per index along `axis` (also from the bit-width variant).
    PerAxis {
        /// The quantized axis.
        axis: i32,
        /// `(scale, offset)` per index.
        scale_offsets: Vec<(f32, i32)>,
    },
    /// QNN's blockwise expansion (the "LPBQ" of AI Hub's W4A16 exports): a scale/offset per
    /// index along `axis` times an unsigned integer multiplier per block of the other axis, so
    /// `real = (q + offset) * scale * multiplier`. htpkv writes it (graph composition); a
    /// binary's description reads back as [`Quantization::Unsupported`].
    BlockwiseExpansion {
        /// The quantized axis (the output channels).
        axis: i32,
        /// `(scale, offset)` per index along `axis`.
        scale_offsets: Vec<(f32, i32)>,
        /// Blocks along the other axis.
        blocks_per_axis: u32,
        /// Bits of a multiplier (stored one per byte).
        multiplier_bits: u32,
        /// The multipliers, `blocks_per_axis` per index along `axis`.
        multipliers: Vec<u8>,
    },
    /// An encoding htpkv does not read (block, blockwise expansion, vector).
    Unsupported {
        /// The raw `Qnn_QuantizationEncoding_t`.
        encoding: u32,
    },
}

/// Description of one graph input or output, converted from the system library's binary info.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The backend's tensor id (passed back on execute).
    pub id: u32,
    /// Tensor name.
    pub name: String,
    /// Input (`AppWrite`) or output (`AppRead`).
    pub tensor_type: TensorType,
    /// Element type: the raw `Qnn_DataType_t` (a context binary may hold any QNN type;
    /// [`TensorInfo::data_type`] converts the ones htpkv uses).
    pub dtype: u32,
    /// Dimensions, outermost first.
    pub shape: Vec<u32>,
    /// Quantization encoding.
    pub quant: Quantization,
}

impl TensorInfo {
    /// The workspace data type, `None` for a QNN type htpkv does not use ([`dtype_from_qnn`]).
    pub fn data_type(&self) -> Option<DataType> {
        dtype_from_qnn(self.dtype)
    }

    /// Number of elements, `None` on overflow.
    pub fn element_count(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
    }

    /// Bytes of the tensor's buffer, `None` for types without a fixed element size or on
    /// overflow.
    pub fn byte_size(&self) -> Option<usize> {
        self.element_count()?
            .checked_mul(qnn_dtype_size(self.dtype)?)
    }

    /// The byte size, or [`QnnError::InvalidTensor`].
    pub fn required_bytes(&self) -> Result<usize, QnnError> {
        self.byte_size().ok_or_else(|| QnnError::InvalidTensor {
            tensor: self.name.clone(),
            reason: format!(
                "cannot size a {} tensor of shape {:?}",
                qnn_dtype_name(self.dtype),
                self.shape
            ),
        })
    }

    /// Reads a raw tensor (version 1 or 2).
    ///
    /// # Safety
    /// `raw` must be a valid tensor as QNN hands it out: when `version` is 1 or 2, `name` is NULL
    /// or a NUL-terminated string, `dimensions` points to `rank` values (or is NULL with rank 0),
    /// and a per-axis encoding's array has `numScaleOffsets` (or `numElements`) entries.
    pub unsafe fn from_raw(raw: &b::Qnn_Tensor_t) -> Result<TensorInfo, QnnError> {
        // Both versions start with the same fields in the same order, so v1 reads either.
        let v1 = match raw.version {
            // SAFETY: the version tag says which union member is live; v2 begins with v1's
            // fields at the same offsets.
            b::QNN_TENSOR_VERSION_1 | b::QNN_TENSOR_VERSION_2 => unsafe {
                &raw.__bindgen_anon_1.v1
            },
            other => {
                return Err(QnnError::UnknownVersion {
                    what: "tensor",
                    version: other,
                    known: "1, 2",
                });
            }
        };
        let name = if v1.name.is_null() {
            String::new()
        } else {
            // SAFETY: non-NULL name is a NUL-terminated string per the caller's contract.
            unsafe { CStr::from_ptr(v1.name) }
                .to_string_lossy()
                .into_owned()
        };
        let shape = if v1.rank == 0 {
            Vec::new()
        } else if v1.dimensions.is_null() {
            return Err(QnnError::BinaryInfo {
                reason: format!("tensor `{name}` has rank {} but no dimensions", v1.rank),
            });
        } else {
            // SAFETY: `dimensions` points to `rank` u32 values per the caller's contract.
            unsafe { std::slice::from_raw_parts(v1.dimensions, v1.rank as usize) }.to_vec()
        };
        // SAFETY: forwarded contract on the encoding arrays.
        let quant = unsafe { quantization_from_raw(&v1.quantizeParams) };
        Ok(TensorInfo {
            id: v1.id,
            name,
            tensor_type: TensorType::from_raw(v1.type_),
            dtype: v1.dataType,
            shape,
            quant,
        })
    }
}

/// Reads a raw encoding.
///
/// # Safety
/// Per-axis arrays must hold the number of entries their count field says (or be NULL).
unsafe fn quantization_from_raw(q: &b::Qnn_QuantizeParams_t) -> Quantization {
    if q.encodingDefinition != b::QNN_DEFINITION_DEFINED {
        return Quantization::None;
    }
    match q.quantizationEncoding {
        b::QNN_QUANTIZATION_ENCODING_SCALE_OFFSET => {
            // SAFETY: the encoding tag selects the scale/offset member.
            let so = unsafe { q.__bindgen_anon_1.scaleOffsetEncoding };
            Quantization::PerTensor {
                scale: so.scale,
                offset: so.offset,
            }
        }
        b::QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET => {
            // SAFETY: the encoding tag selects the bit-width scale/offset member.
            let so = unsafe { q.__bindgen_anon_1.bwScaleOffsetEncoding };
            Quantization::PerTensor {
                scale: so.scale,
                offset: so.offset,
            }
        }
        b::QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET => {
            // SAFETY: the encoding tag selects the per-axis member.
            let axis = unsafe { q.__bindgen_anon_1.axisScaleOffsetEncoding };
            let scale_offsets = if axis.scaleOffset.is_null() || axis.numScaleOffsets == 0 {
                Vec::new()
            } else {
                // SAFETY: the array holds `numScaleOffsets` entries (caller's contract).
                unsafe {
                    std::slice::from_raw_parts(axis.scaleOffset, axis.numScaleOffsets as usize)
                }
                .iter()
                .map(|so| (so.scale, so.offset))
                .collect()
            };
            Quantization::PerAxis {
                axis: axis.axis,
                scale_offsets,
            }
        }
        b::QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET => {
            // SAFETY: the encoding tag selects the bit-width per-axis member.
            let axis = unsafe { q.__bindgen_anon_1.bwAxisScaleOffsetEncoding };
            let n = axis.numElements as usize;
            let scales: &[f32] = if axis.scales.is_null() || n == 0 {
                &[]
            } else {
                // SAFETY: `scales` holds `numElements` entries (caller's contract).
                unsafe { std::slice::from_raw_parts(axis.scales, n) }
            };
            let offsets: Option<&[i32]> = if axis.offsets.is_null() || n == 0 {
                None
            } else {
                // SAFETY: non-NULL `offsets` holds `numElements` entries (caller's contract).
                Some(unsafe { std::slice::from_raw_parts(axis.offsets, n) })
            };
            Quantization::PerAxis {
                axis: axis.axis,
                scale_offsets: scales
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| (s, offsets.map_or(0, |o| o[i])))
                    .collect(),
            }
        }
        other => Quantization::Unsupported { encoding: other },
    }
}

/// A raw `Qnn_Tensor_t` (version 1 by default, or 2) together with the memory its pointers refer
/// to (name, dimensions, per-axis scale/offset array). Used to pass tensors to `graphExecute` and
/// by backends that hand out tensor descriptions.
pub struct OwnedRawTensor {
    version: u32,
    name: CString,
    dims: Vec<u32>,
    scale_offsets: Vec<b::Qnn_ScaleOffset_t>,
    /// A blockwise-expansion encoding's parameters; its pointers refer to `scale_offsets` and
    /// `multipliers`, whose heap buffers do not move with `self`.
    blockwise: Option<Box<b::Qnn_BlockwiseExpansion_t>>,
    #[expect(dead_code, reason = "QNN reads it through `blockwise`")]
    multipliers: Vec<u8>,
    info_quant: Quantization,
    id: u32,
    tensor_type: u32,
    dtype: u32,
}

impl std::fmt::Debug for OwnedRawTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRawTensor")
            .field("name", &self.name)
            .field("dims", &self.dims)
            .field("quant", &self.info_quant)
            .finish_non_exhaustive()
    }
}

impl OwnedRawTensor {
    /// Copies `info` into owned storage. Fails when the name contains a NUL byte.
    pub fn new(info: &TensorInfo) -> Result<OwnedRawTensor, QnnError> {
        let name = CString::new(info.name.clone()).map_err(|_| QnnError::InvalidTensor {
            tensor: info.name.clone(),
            reason: "name contains a NUL byte".into(),
        })?;
        let raw_pairs = |pairs: &[(f32, i32)]| -> Vec<b::Qnn_ScaleOffset_t> {
            pairs
                .iter()
                .map(|&(scale, offset)| b::Qnn_ScaleOffset_t { scale, offset })
                .collect()
        };
        let (mut scale_offsets, mut multipliers, mut blockwise) = (Vec::new(), Vec::new(), None);
        match &info.quant {
            Quantization::PerAxis {
                scale_offsets: p, ..
            } => scale_offsets = raw_pairs(p),
            Quantization::BlockwiseExpansion {
                axis,
                scale_offsets: p,
                blocks_per_axis,
                multiplier_bits,
                multipliers: m,
            } => {
                scale_offsets = raw_pairs(p);
                multipliers = m.clone();
                blockwise = Some(Box::new(b::Qnn_BlockwiseExpansion_t {
                    axis: *axis,
                    scaleOffsets: scale_offsets.as_mut_ptr(),
                    numBlocksPerAxis: *blocks_per_axis,
                    blockScaleBitwidth: *multiplier_bits,
                    blockScaleStorageType: b::QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8,
                    __bindgen_anon_1: b::Qnn_BlockwiseExpansion_t__bindgen_ty_1 {
                        blocksScale8: multipliers.as_mut_ptr(),
                    },
                }));
            }
            _ => {}
        }
        Ok(OwnedRawTensor {
            version: b::QNN_TENSOR_VERSION_1,
            name,
            dims: info.shape.clone(),
            scale_offsets,
            blockwise,
            multipliers,
            info_quant: info.quant.clone(),
            id: info.id,
            tensor_type: info.tensor_type.to_raw(),
            dtype: info.dtype,
        })
    }

    /// Records the id a backend gave the tensor (`tensorCreateGraphTensor`).
    pub(crate) fn set_id(&mut self, id: u32) {
        self.id = id;
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u32] {
        &self.dims
    }

    /// The same tensor as a `Qnn_TensorV2_t` (no dynamic dimensions, dense, produced).
    pub fn version_2(mut self) -> OwnedRawTensor {
        self.version = b::QNN_TENSOR_VERSION_2;
        self
    }

    /// The raw tensor with no data bound (`memType` undefined). Its pointers borrow `self`: it
    /// must not be used after `self` is dropped or moved.
    pub fn raw(&self) -> b::Qnn_Tensor_t {
        self.raw_bound(
            b::QNN_TENSORMEMTYPE_UNDEFINED,
            b::Qnn_TensorV1_t__bindgen_ty_1::default(),
        )
    }

    /// The raw tensor with `mem_type` and its data member.
    fn raw_bound(&self, mem_type: u32, data: b::Qnn_TensorV1_t__bindgen_ty_1) -> b::Qnn_Tensor_t {
        let mut quant = b::Qnn_QuantizeParams_t {
            encodingDefinition: b::QNN_DEFINITION_UNDEFINED,
            quantizationEncoding: b::QNN_QUANTIZATION_ENCODING_UNDEFINED,
            ..Default::default()
        };
        match &self.info_quant {
            Quantization::None | Quantization::Unsupported { .. } => {}
            Quantization::PerTensor { scale, offset } => {
                quant.encodingDefinition = b::QNN_DEFINITION_DEFINED;
                quant.quantizationEncoding = b::QNN_QUANTIZATION_ENCODING_SCALE_OFFSET;
                quant.__bindgen_anon_1.scaleOffsetEncoding = b::Qnn_ScaleOffset_t {
                    scale: *scale,
                    offset: *offset,
                };
            }
            Quantization::PerAxis { axis, .. } => {
                quant.encodingDefinition = b::QNN_DEFINITION_DEFINED;
                quant.quantizationEncoding = b::QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET;
                quant.__bindgen_anon_1.axisScaleOffsetEncoding = b::Qnn_AxisScaleOffset_t {
                    axis: *axis,
                    numScaleOffsets: self.scale_offsets.len() as u32,
                    scaleOffset: self.scale_offsets.as_ptr().cast_mut(),
                };
            }
            Quantization::BlockwiseExpansion { .. } => {
                let raw = self.blockwise.as_deref().expect("built with the encoding");
                quant.encodingDefinition = b::QNN_DEFINITION_DEFINED;
                quant.quantizationEncoding = b::QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION;
                quant.__bindgen_anon_1.blockwiseExpansion = std::ptr::from_ref(raw).cast_mut();
            }
        }
        let v1 = b::Qnn_TensorV1_t {
            id: self.id,
            name: self.name.as_ptr(),
            type_: self.tensor_type,
            dataFormat: b::QNN_TENSOR_DATA_FORMAT_DENSE,
            dataType: self.dtype,
            quantizeParams: quant,
            rank: self.dims.len() as u32,
            dimensions: if self.dims.is_empty() {
                std::ptr::null_mut()
            } else {
                self.dims.as_ptr().cast_mut()
            },
            memType: mem_type,
            __bindgen_anon_1: data,
        };
        if self.version == b::QNN_TENSOR_VERSION_1 {
            return b::Qnn_Tensor_t {
                version: b::QNN_TENSOR_VERSION_1,
                __bindgen_anon_1: b::Qnn_Tensor_t__bindgen_ty_1 { v1 },
            };
        }
        let mut v2_data = b::Qnn_TensorV2_t__bindgen_ty_1::default();
        if mem_type == b::QNN_TENSORMEMTYPE_RAW {
            // SAFETY: memType RAW says the client buffer member was written.
            v2_data.clientBuf = unsafe { data.clientBuf };
        } else if mem_type == b::QNN_TENSORMEMTYPE_MEMHANDLE {
            // SAFETY: memType MEMHANDLE says the handle member was written.
            v2_data.memHandle = unsafe { data.memHandle };
        }
        let v2 = b::Qnn_TensorV2_t {
            id: v1.id,
            name: v1.name,
            type_: v1.type_,
            dataFormat: v1.dataFormat,
            dataType: v1.dataType,
            quantizeParams: v1.quantizeParams,
            rank: v1.rank,
            dimensions: v1.dimensions,
            memType: v1.memType,
            __bindgen_anon_1: v2_data,
            isDynamicDimensions: std::ptr::null_mut(),
            sparseParams: b::Qnn_SparseParams_t {
                type_: b::QNN_SPARSE_LAYOUT_UNDEFINED,
                ..Default::default()
            },
            isProduced: 1,
        };
        b::Qnn_Tensor_t {
            version: b::QNN_TENSOR_VERSION_2,
            __bindgen_anon_1: b::Qnn_Tensor_t__bindgen_ty_1 { v2 },
        }
    }

    /// The raw tensor with a client buffer bound.
    pub fn raw_with_client_buffer(&self, data: *mut u8, size: u32) -> b::Qnn_Tensor_t {
        let client_buf = b::Qnn_ClientBuffer_t {
            data: data.cast(),
            dataSize: size,
        };
        let member = b::Qnn_TensorV1_t__bindgen_ty_1 {
            clientBuf: client_buf,
        };
        self.raw_bound(b::QNN_TENSORMEMTYPE_RAW, member)
    }

    /// The raw tensor with a registered memory handle bound.
    pub fn raw_with_mem_handle(&self, handle: b::Qnn_MemHandle_t) -> b::Qnn_Tensor_t {
        let member = b::Qnn_TensorV1_t__bindgen_ty_1 { memHandle: handle };
        self.raw_bound(b::QNN_TENSORMEMTYPE_MEMHANDLE, member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_type_round_trips_and_sizes() {
        for d in DataType::ALL {
            let raw = dtype_to_qnn(d);
            assert_eq!(dtype_from_qnn(raw), Some(d));
            assert_eq!(qnn_dtype_size(raw), Some(d.size_bytes()), "{d}");
            assert_eq!(qnn_dtype_name(raw), d.name());
        }
        // Plain unsigned (not fixed point), 64-bit and bool types are sized but not used.
        for raw in [
            b::QNN_DATATYPE_UINT_8,
            b::QNN_DATATYPE_INT_64,
            b::QNN_DATATYPE_BOOL_8,
        ] {
            assert_eq!(dtype_from_qnn(raw), None);
        }
        assert_eq!(qnn_dtype_size(b::QNN_DATATYPE_INT_64), Some(8));
        assert_eq!(qnn_dtype_size(b::QNN_DATATYPE_BOOL_8), Some(1));
        assert_eq!(qnn_dtype_size(b::QNN_DATATYPE_UFIXED_POINT_32), Some(4));
        assert_eq!(qnn_dtype_size(0x0404), None);
        assert_eq!(qnn_dtype_name(0x0404), "qnn_type_0x0404");
    }

    #[test]
    fn raw_tensor_round_trips_through_tensor_info() {
        let infos = [
            TensorInfo {
                id: 7,
                name: "past_key_0".into(),
                tensor_type: TensorType::AppWrite,
                dtype: b::QNN_DATATYPE_UFIXED_POINT_8,
                shape: vec![4, 1, 31, 8],
                quant: Quantization::PerAxis {
                    axis: 0,
                    scale_offsets: vec![(0.5, -128), (0.25, -127), (1.0, 0), (2.0, -3)],
                },
            },
            TensorInfo {
                id: 1,
                name: "logits".into(),
                tensor_type: TensorType::AppRead,
                dtype: b::QNN_DATATYPE_FLOAT_32,
                shape: vec![1, 1, 512],
                quant: Quantization::None,
            },
            TensorInfo {
                id: 2,
                name: "mask".into(),
                tensor_type: TensorType::AppWrite,
                dtype: b::QNN_DATATYPE_UFIXED_POINT_16,
                shape: vec![1, 1, 1, 32],
                quant: Quantization::PerTensor {
                    scale: 1.5e-5,
                    offset: -65535,
                },
            },
        ];
        for info in infos {
            let owned = OwnedRawTensor::new(&info).unwrap();
            let raw = owned.raw();
            // SAFETY: `raw` points into `owned`, which is alive.
            let back = unsafe { TensorInfo::from_raw(&raw) }.unwrap();
            assert_eq!(back, info);
        }
    }

    #[test]
    fn tensor_sizes_and_errors() {
        let mut info = TensorInfo {
            id: 0,
            name: "x".into(),
            tensor_type: TensorType::AppWrite,
            dtype: b::QNN_DATATYPE_FLOAT_16,
            shape: vec![2, 3],
            quant: Quantization::None,
        };
        assert_eq!(info.byte_size(), Some(12));
        info.dtype = 0x0404;
        assert!(matches!(
            info.required_bytes(),
            Err(QnnError::InvalidTensor { .. })
        ));
        info.name = "a\0b".into();
        assert!(OwnedRawTensor::new(&info).is_err());
    }

    #[test]
    fn version_compatibility() {
        let need = Version::new(2, 10, 0);
        assert!(Version::new(2, 10, 0).satisfies(need));
        assert!(Version::new(2, 34, 1).satisfies(need));
        assert!(!Version::new(2, 9, 9).satisfies(need));
        assert!(!Version::new(3, 10, 0).satisfies(need));
        assert!(!Version::new(1, 99, 0).satisfies(need));
    }

    #[test]
    fn abi_sizes_match_lp64_layout() {
        // Facts of the ABI on 64-bit Linux/Android, independent of bindgen's own layout tests.
        assert_eq!(std::mem::size_of::<b::Qnn_QuantizeParams_t>(), 40);
        assert_eq!(std::mem::size_of::<b::Qnn_ClientBuffer_t>(), 16);
        assert_eq!(std::mem::size_of::<b::HtpkvQnnInterface_t>(), 448);
        assert_eq!(
            std::mem::offset_of!(b::HtpkvQnnInterface_t, graphExecute),
            168
        );
        assert_eq!(
            std::mem::offset_of!(b::HtpkvQnnInterface_t, memRegister),
            280
        );
        assert_eq!(
            std::mem::offset_of!(b::HtpkvQnnInterface_t, errorGetMessage),
            384
        );
        assert_eq!(std::mem::size_of::<b::QnnMemHtp_Descriptor_t>(), 32);
        assert_eq!(std::mem::size_of::<b::Qnn_TensorV1_t>(), 112);
        assert_eq!(std::mem::size_of::<b::Qnn_Tensor_t>(), 144);
    }
}
