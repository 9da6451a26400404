//! QNN fixed-point quantization math.
//!
//! Convention (QNN's): `real = (q + offset) * scale`, `scale > 0`, `offset = -zero_point`.

mod types;

pub use types::{DataType, Encoding, QuantSpec, ScaleOffset};

/// Errors of the quantization crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("unknown data type `{name}` (expected one of u8, u16, i8, i16, f16, f32)")]
    UnknownDataType { name: String },
    #[error("invalid scale {scale}: a scale must be finite and greater than zero")]
    InvalidScale { scale: f32 },
    #[error("encoding does not fit data type {dtype}: {reason}")]
    EncodingMismatch {
        dtype: DataType,
        reason: &'static str,
    },
}
