//! Element types and encodings in QNN's fixed-point convention.

use serde::{Deserialize, Serialize};

/// The element type of a tensor, as QNN names them: the one data-type enum of the workspace
/// (KV caches, weights, graph tensors, configs and the QNN edge all use it).
///
/// `U8`/`U16`/`I8`/`I16` are fixed point (`QNN_DATATYPE_UFIXED_POINT_8/16`,
/// `QNN_DATATYPE_SFIXED_POINT_8/16`); `F16`/`F32` are IEEE floats; `I32` is a plain signed
/// integer (`QNN_DATATYPE_INT_32`: token ids, positions) that carries no encoding and holds no
/// real value. The serde and command-line names are the lowercase variant names (`u8`, `f16`,
/// `i32`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    U8,
    U16,
    I8,
    I16,
    F16,
    F32,
    I32,
}

impl DataType {
    /// Every data type, in a stable order.
    pub const ALL: [DataType; 7] = [
        DataType::U8,
        DataType::U16,
        DataType::I8,
        DataType::I16,
        DataType::F16,
        DataType::F32,
        DataType::I32,
    ];

    /// The types that store real values (fixed point or float): what a KV cache, an activation
    /// or a weight can be. Every type but [`DataType::I32`].
    pub const REAL: [DataType; 6] = [
        DataType::U8,
        DataType::U16,
        DataType::I8,
        DataType::I16,
        DataType::F16,
        DataType::F32,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 | DataType::F16 => 2,
            DataType::F32 | DataType::I32 => 4,
        }
    }

    /// True for the fixed-point types, which need a [`ScaleOffset`] to mean a real number.
    pub const fn is_fixed_point(self) -> bool {
        matches!(
            self,
            DataType::U8 | DataType::U16 | DataType::I8 | DataType::I16
        )
    }

    /// True for the IEEE float types (`F16`, `F32`).
    pub const fn is_float(self) -> bool {
        matches!(self, DataType::F16 | DataType::F32)
    }

    /// True for the types that store real values (fixed point or float), i.e. all but `I32`.
    pub const fn is_real(self) -> bool {
        self.is_fixed_point() || self.is_float()
    }

    /// Bit width of one element.
    pub const fn bits(self) -> u32 {
        (self.size_bytes() * 8) as u32
    }

    /// Smallest and largest stored integer of a fixed-point type; `None` for floats and `I32`.
    pub const fn integer_range(self) -> Option<(i32, i32)> {
        match self {
            DataType::U8 => Some((0, u8::MAX as i32)),
            DataType::U16 => Some((0, u16::MAX as i32)),
            DataType::I8 => Some((i8::MIN as i32, i8::MAX as i32)),
            DataType::I16 => Some((i16::MIN as i32, i16::MAX as i32)),
            DataType::F16 | DataType::F32 | DataType::I32 => None,
        }
    }

    /// The lowercase name used in configs and on the command line (`u8`, `f16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::U8 => "u8",
            DataType::U16 => "u16",
            DataType::I8 => "i8",
            DataType::I16 => "i16",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::I32 => "i32",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DataType {
    type Err = crate::QuantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| crate::QuantError::UnknownDataType {
                name: s.to_string(),
            })
    }
}

/// One QNN scale/offset pair: `real = (q + offset) * scale`, with `scale > 0` and
/// `offset = -zero_point` (u8 with zero point 128 has offset -128).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

impl ScaleOffset {
    /// Builds a scale/offset pair, rejecting a scale that is not finite and positive.
    pub fn new(scale: f32, offset: i32) -> Result<Self, crate::QuantError> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(crate::QuantError::InvalidScale { scale });
        }
        Ok(ScaleOffset { scale, offset })
    }

    /// The zero point (`-offset`).
    pub const fn zero_point(self) -> i32 {
        -self.offset
    }

    /// Checks that the scale is finite and positive (a struct literal can bypass [`Self::new`]).
    ///
    /// Every function of this crate that returns a `Result` calls this; the infallible ones
    /// ([`crate::quantize`], [`crate::quantize_array`], ...) assume a valid scale and, given an
    /// invalid one, return saturated or meaningless values without panicking.
    pub fn validate(self) -> Result<Self, crate::QuantError> {
        if self.scale.is_finite() && self.scale > 0.0 {
            Ok(self)
        } else {
            Err(crate::QuantError::InvalidScale { scale: self.scale })
        }
    }

    /// The real value of the stored integer `q`: `(q + offset) * scale`.
    ///
    /// Computed in `f64` (the sum cannot overflow) and rounded once to `f32`. `q` is not checked
    /// against any type's range.
    pub fn dequantize_i32(self, q: i32) -> f32 {
        ((i64::from(q) + i64::from(self.offset)) as f64 * f64::from(self.scale)) as f32
    }

    /// [`Self::dequantize_i32`] computed in `f32`, for the fast paths that dequantize runs of
    /// values (it vectorizes; the `f64` form does not). Equal to it bit for bit whenever
    /// `|q + offset| <= 2^24` (check [`Self::dequantizes_exactly_in_f32`] first): the sum is then
    /// exact in `f32`, and the product of two `f32` values rounded once to `f32` is the same
    /// number whether it is computed in `f32` or exactly in `f64` and then rounded.
    #[inline]
    pub fn dequantize_i32_in_f32(self, q: i32) -> f32 {
        q.wrapping_add(self.offset) as f32 * self.scale
    }

    /// True when [`Self::dequantize_i32_in_f32`] equals [`Self::dequantize_i32`] for every
    /// stored value of `dtype` (an integer type whose `q + offset` stays within `±2^24`).
    pub fn dequantizes_exactly_in_f32(self, dtype: DataType) -> bool {
        const EXACT: i64 = 1 << 24;
        dtype.integer_range().is_some_and(|(qmin, qmax)| {
            let off = i64::from(self.offset);
            (i64::from(qmin) + off).abs() <= EXACT && (i64::from(qmax) + off).abs() <= EXACT
        })
    }

    /// The smallest and largest real values `dtype` can represent with this encoding:
    /// `((qmin + offset) * scale, (qmax + offset) * scale)`; `None` for float types.
    pub fn representable_range(self, dtype: DataType) -> Option<(f32, f32)> {
        let (qmin, qmax) = dtype.integer_range()?;
        Some((self.dequantize_i32(qmin), self.dequantize_i32(qmax)))
    }
}

/// How the values of one tensor are encoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Encoding {
    /// Float tensors (`f16`/`f32`) carry no quantization parameters.
    Float,
    /// One scale/offset for the whole tensor.
    PerTensor(ScaleOffset),
    /// One scale/offset per index along `axis`.
    PerAxis {
        axis: usize,
        params: Vec<ScaleOffset>,
    },
}

/// A tensor's element type together with its encoding: what two tensors must share
/// for a byte copy between them to be exact (no requantization).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantSpec {
    pub dtype: DataType,
    pub encoding: Encoding,
}

impl QuantSpec {
    /// A float tensor of `dtype` (must be `F16` or `F32`).
    pub fn float(dtype: DataType) -> Result<Self, crate::QuantError> {
        if !dtype.is_float() {
            return Err(crate::QuantError::EncodingMismatch {
                dtype,
                reason: "only f16 and f32 are float types; fixed-point types need a scale/offset and i32 holds no real values",
            });
        }
        Ok(QuantSpec {
            dtype,
            encoding: Encoding::Float,
        })
    }

    /// A fixed-point tensor of `dtype` with one scale/offset.
    pub fn per_tensor(dtype: DataType, params: ScaleOffset) -> Result<Self, crate::QuantError> {
        if !dtype.is_fixed_point() {
            return Err(crate::QuantError::EncodingMismatch {
                dtype,
                reason: "a float type carries no scale/offset",
            });
        }
        Ok(QuantSpec {
            dtype,
            encoding: Encoding::PerTensor(params),
        })
    }
}
