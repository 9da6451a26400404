//! QNN fixed-point quantization math for htpkv.
//!
//! # The convention
//!
//! This crate follows QNN's fixed-point convention throughout:
//!
//! ```text
//! real = (q + offset) * scale        scale > 0,  offset = -zero_point
//! q    = round(real / scale) - offset, saturated to the type's integer range
//! ```
//!
//! `offset` is the **negated** zero point: a `u8` tensor whose zero point is 128 has
//! `offset = -128`, so the stored byte 128 means exactly `0.0`. Rounding is **half away from
//! zero** (`0.25 / 0.5 = 0.5` rounds to `1`, `-0.25 / 0.5` to `-1`), as `f64::round` does. Values
//! beyond the representable range saturate to the type's `qmin`/`qmax`, `±inf` saturates the same
//! way, and `NaN` quantizes to the code of `0.0` (that is `-offset`, saturated).
//!
//! The element types are QNN's `UFIXED_POINT_8/16` ([`u8`]/[`u16`]), `SFIXED_POINT_8/16`
//! ([`i8`]/[`i16`]), `FLOAT_16` ([`half::f16`]) and `FLOAT_32` ([`f32`]); see [`DataType`].
//! An [`Encoding`] is per tensor (one [`ScaleOffset`]) or per axis (one per index along an axis).
//!
//! # What is here
//!
//! * Scalar reference functions: [`quantize_value`], [`quantize`], [`dequantize`],
//!   [`ScaleOffset::dequantize_i32`]. They compute in `f64` and round once, so they are the
//!   oracle every faster path in the project is tested against.
//! * Slices: [`quantize_slice`], [`dequantize_slice`], [`requantize_slice`] (with a lookup-table
//!   fast path, tested against the scalar functions).
//! * `ndarray` views of any dimension: [`quantize_array`], [`dequantize_array`],
//!   [`quantize_per_axis`], [`dequantize_per_axis`].
//! * Half precision: [`f32_to_f16_slice`], [`f16_to_f32_slice`].
//! * Little-endian byte buffers of any [`DataType`]: [`encode_f32_to_bytes`],
//!   [`decode_bytes_to_f32`] (what the KV manager and the executors store).
//! * Encodings from ranges: [`ScaleOffset::from_range`] with [`Symmetry`], and calibration
//!   [`Observer`]s: [`MinMaxObserver`] and the outlier-clipping [`HistogramObserver`].
//!
//! ```
//! use quant::{DataType, ScaleOffset, Symmetry, dequantize, quantize};
//!
//! // u8 with zero point 128: offset -128.
//! let so = ScaleOffset::new(0.5, -128).unwrap();
//! assert_eq!(quantize::<u8>(0.0, so), 128);
//! assert_eq!(quantize::<u8>(0.25, so), 129); // 0.5 rounds away from zero
//! assert_eq!(quantize::<u8>(1000.0, so), 255); // saturates
//! assert_eq!(dequantize::<u8>(130, so), 1.0);
//!
//! // An encoding that covers [-1, 3] in u8, with 0.0 exactly representable.
//! let so = ScaleOffset::from_range(-1.0, 3.0, DataType::U8, Symmetry::Asymmetric).unwrap();
//! assert_eq!(dequantize::<u8>(quantize::<u8>(0.0, so), so), 0.0);
//! ```

#![forbid(unsafe_code)]

mod array;
mod bytes;
mod fixed;
mod observer;
mod range;
mod types;

pub use array::{dequantize_array, dequantize_per_axis, quantize_array, quantize_per_axis};
pub use bytes::{decode_bytes_to_f32, encode_f32_to_bytes, f16_to_f32_slice, f32_to_f16_slice};
pub use fixed::{
    FixedPoint, dequantize, dequantize_slice, quantize, quantize_slice, quantize_value,
    requantize_slice, requantize_value, try_quantize_value,
};
pub use observer::{HistogramObserver, MinMaxObserver, Observer};
pub use range::{MIN_SCALE, Symmetry};
pub use types::{DataType, Encoding, QuantSpec, ScaleOffset};

/// Errors of the quantization crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// A data type name that is not one of the known types.
    #[error("unknown data type `{name}` (expected one of u8, u16, i8, i16, f16, f32, i32)")]
    UnknownDataType { name: String },
    /// A scale that is zero, negative, infinite or NaN.
    #[error("invalid scale {scale}: a scale must be finite and greater than zero")]
    InvalidScale { scale: f32 },
    /// An encoding that does not fit the data type (e.g. a scale/offset on a float type).
    #[error("encoding does not fit data type {dtype}: {reason}")]
    EncodingMismatch {
        dtype: DataType,
        reason: &'static str,
    },
    /// Two buffers whose lengths must agree do not.
    #[error("length mismatch in {what}: expected {expected}, found {found}")]
    LengthMismatch {
        /// Which buffer, and in what unit its length is counted.
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// A per-axis operation named an axis the array does not have.
    #[error("axis {axis} is out of range for an array with {ndim} dimension(s)")]
    AxisOutOfRange { axis: usize, ndim: usize },
    /// A per-axis encoding whose parameter count differs from the length of its axis.
    #[error(
        "per-axis encoding along axis {axis} needs {expected} scale/offset pair(s) (the axis length), found {found}"
    )]
    ParamCountMismatch {
        axis: usize,
        expected: usize,
        found: usize,
    },
    /// A range that is not finite or has `min > max`.
    #[error("invalid range [{min}, {max}]: expected finite bounds with min <= max")]
    InvalidRange { min: f32, max: f32 },
    /// An observer was asked for an encoding before it saw any finite value.
    #[error("the observer has seen no finite values, so it cannot produce an encoding")]
    NoObservations,
    /// A histogram observer built with parameters it cannot work with.
    #[error(
        "invalid histogram observer configuration (bins {bins}, percentile {percentile}): expected 1..={max_bins} bins and a percentile in (50, 100]"
    )]
    InvalidHistogramConfig {
        bins: usize,
        percentile: f64,
        max_bins: usize,
    },
}
