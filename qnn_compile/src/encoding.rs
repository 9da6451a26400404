//! Fixed-point encodings of the graphs' tensors, as QNN defines them: `real = (q + offset) *
//! scale`.

use qnn_ffi::Quantization;

/// A per-tensor fixed-point encoding: raw QNN data type, `real = (q + offset) * scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fixed {
    /// Raw `Qnn_DataType_t` (`UFIXED_POINT_8`, `UFIXED_POINT_16`).
    pub dtype: u32,
    /// Scale (> 0).
    pub scale: f32,
    /// Offset (= -zero point).
    pub offset: i32,
}

impl Fixed {
    pub(crate) fn quantization(self) -> Quantization {
        Quantization::PerTensor {
            scale: self.scale,
            offset: self.offset,
        }
    }
}
