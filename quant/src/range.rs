//! Encodings from real-value ranges.

use serde::{Deserialize, Serialize};

use crate::{DataType, QuantError, ScaleOffset};

/// The smallest scale [`ScaleOffset::from_range`] produces.
///
/// A range that is (or is nearly) all zeros would otherwise give a zero or subnormal scale, with
/// which `x / scale` overflows. With this floor a `u8` encoding spans at least about `2.6e-8`
/// and a `u16` one about `6.6e-6`, far below any value that matters in an LLM's tensors.
pub const MIN_SCALE: f32 = 1.0e-10;

/// Whether an encoding centres its zero point ([`Symmetry::Symmetric`]) or fits it to the
/// observed range ([`Symmetry::Asymmetric`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Symmetry {
    /// `scale = (max - min) / (qmax - qmin)`, zero point where `min` lands on `qmin`.
    Asymmetric,
    /// `scale = max(|min|, |max|) / qmax_abs`, zero point at the type's centre.
    Symmetric,
}

impl ScaleOffset {
    /// An encoding of `dtype` that covers the real range `[min, max]`.
    ///
    /// The range is first widened to include 0, so `0.0` is always exactly representable (its
    /// code is the zero point). Then:
    ///
    /// * [`Symmetry::Asymmetric`]: `scale = (max - min) / (qmax - qmin)` and
    ///   `offset = round(min / scale) - qmin`. Rounding the offset to an integer shifts the
    ///   representable range by less than half a step, so every `x` in `[min, max]` still
    ///   quantizes with an error of at most `scale / 2` (the end that falls outside saturates
    ///   to `qmin`/`qmax`, which is within half a step of it).
    /// * [`Symmetry::Symmetric`]: `scale = max(|min|, |max|) / qmax_abs` with `qmax_abs` 127
    ///   (8-bit) or 32767 (16-bit), and the zero point at the type's centre: offset `0` for
    ///   `i8`/`i16`, `-128` for `u8`, `-32768` for `u16`. The codes then cover
    ///   `[-(qmax_abs + 1) * scale, qmax_abs * scale]`.
    ///
    /// The scale is never below [`MIN_SCALE`]: a range that is all zeros (e.g. `min == max == 0`)
    /// gets that tiny positive scale. `min == max != 0` needs no special case, because the
    /// widening to 0 makes the range non-empty.
    ///
    /// Errors: [`QuantError::InvalidRange`] when a bound is not finite or `min > max` (or when
    /// the span overflows `f32`); [`QuantError::EncodingMismatch`] for a float `dtype`.
    pub fn from_range(
        min: f32,
        max: f32,
        dtype: DataType,
        symmetry: Symmetry,
    ) -> Result<ScaleOffset, QuantError> {
        if !(min.is_finite() && max.is_finite()) || min > max {
            return Err(QuantError::InvalidRange { min, max });
        }
        let (qmin, qmax) = dtype.integer_range().ok_or(QuantError::EncodingMismatch {
            dtype,
            reason: "a float type carries no scale/offset",
        })?;
        let lo = f64::from(min.min(0.0));
        let hi = f64::from(max.max(0.0));
        let steps = f64::from(qmax - qmin);
        let (raw_scale, offset) = match symmetry {
            Symmetry::Asymmetric => {
                let scale = floor_scale((hi - lo) / steps, min, max)?;
                let offset = (lo / f64::from(scale)).round() - f64::from(qmin);
                // lo / scale lies in [-steps, 0] up to rounding, so the offset is small; the
                // clamp only guards the conversion.
                (
                    scale,
                    offset.clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32,
                )
            }
            Symmetry::Symmetric => {
                let qmax_abs = (qmax - qmin) / 2; // 127 or 32767
                let scale = floor_scale((-lo).max(hi) / f64::from(qmax_abs), min, max)?;
                let offset = if qmin < 0 { 0 } else { -(qmax_abs + 1) };
                (scale, offset)
            }
        };
        ScaleOffset::new(raw_scale, offset)
    }
}

/// Rounds a computed scale to `f32` and applies [`MIN_SCALE`]; an overflow is an invalid range.
fn floor_scale(scale: f64, min: f32, max: f32) -> Result<f32, QuantError> {
    let s = scale as f32;
    if !s.is_finite() {
        return Err(QuantError::InvalidRange { min, max });
    }
    Ok(s.max(MIN_SCALE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize, quantize};

    #[test]
    fn asymmetric_u8() {
        let so = ScaleOffset::from_range(-1.0, 3.0, DataType::U8, Symmetry::Asymmetric).unwrap();
        assert_eq!(so.scale, (4.0f64 / 255.0) as f32);
        // round(-1 / (4/255)) = round(-63.75) = -64; offset = -64 - 0.
        assert_eq!(so.offset, -64);
        assert_eq!(quantize::<u8>(0.0, so), 64);
        assert_eq!(dequantize::<u8>(64, so), 0.0);
        assert_eq!(quantize::<u8>(-1.0, so), 0);
        assert_eq!(quantize::<u8>(3.0, so), 255);
    }

    #[test]
    fn asymmetric_widens_to_include_zero() {
        let so = ScaleOffset::from_range(2.0, 4.0, DataType::U8, Symmetry::Asymmetric).unwrap();
        assert_eq!(so.scale, (4.0f64 / 255.0) as f32);
        assert_eq!(so.offset, 0);
        let so = ScaleOffset::from_range(-4.0, -2.0, DataType::I8, Symmetry::Asymmetric).unwrap();
        // min maps to qmin = -128: offset = round(-4 / (4/255)) + 128 = -255 + 128.
        assert_eq!(so.offset, -127);
        assert_eq!(quantize::<i8>(0.0, so), 127);
        assert_eq!(quantize::<i8>(-4.0, so), -128);
    }

    #[test]
    fn asymmetric_i8_zero_min() {
        let so = ScaleOffset::from_range(0.0, 2.55, DataType::I8, Symmetry::Asymmetric).unwrap();
        assert_eq!(so.offset, 128);
        assert_eq!(quantize::<i8>(0.0, so), -128);
        assert_eq!(quantize::<i8>(2.55, so), 127);
    }

    #[test]
    fn symmetric_centres() {
        let cases = [
            (DataType::U8, 127.0, -128),
            (DataType::I8, 127.0, 0),
            (DataType::U16, 32767.0, -32768),
            (DataType::I16, 32767.0, 0),
        ];
        for (dtype, qmax_abs, offset) in cases {
            let so = ScaleOffset::from_range(-0.5, 2.0, dtype, Symmetry::Symmetric).unwrap();
            assert_eq!(so.offset, offset, "{dtype}");
            assert_eq!(so.scale, (2.0f64 / qmax_abs) as f32, "{dtype}");
        }
        let so = ScaleOffset::from_range(-3.0, 1.0, DataType::I16, Symmetry::Symmetric).unwrap();
        assert_eq!(so.scale, (3.0f64 / 32767.0) as f32);
        assert_eq!(quantize::<i16>(-3.0, so), -32767);
        assert_eq!(quantize::<i16>(3.0, so), 32767);
        assert_eq!(quantize::<i16>(0.0, so), 0);
    }

    #[test]
    fn degenerate_ranges_get_min_scale() {
        for sym in [Symmetry::Asymmetric, Symmetry::Symmetric] {
            let so = ScaleOffset::from_range(0.0, 0.0, DataType::U8, sym).unwrap();
            assert_eq!(so.scale, MIN_SCALE);
            assert_eq!(dequantize::<u8>(quantize::<u8>(0.0, so), so), 0.0);
            let so = ScaleOffset::from_range(1e-38, 1e-38, DataType::I16, sym).unwrap();
            assert_eq!(so.scale, MIN_SCALE);
        }
        // min == max != 0 is an ordinary range once widened to 0.
        let so = ScaleOffset::from_range(5.0, 5.0, DataType::U8, Symmetry::Asymmetric).unwrap();
        assert_eq!(so.scale, (5.0f64 / 255.0) as f32);
        assert_eq!(quantize::<u8>(5.0, so), 255);
    }

    #[test]
    fn errors() {
        let e = ScaleOffset::from_range(1.0, 0.0, DataType::U8, Symmetry::Asymmetric);
        assert_eq!(e, Err(QuantError::InvalidRange { min: 1.0, max: 0.0 }));
        assert!(matches!(
            ScaleOffset::from_range(f32::NAN, 0.0, DataType::U8, Symmetry::Asymmetric),
            Err(QuantError::InvalidRange { .. })
        ));
        assert!(matches!(
            ScaleOffset::from_range(0.0, f32::INFINITY, DataType::U8, Symmetry::Symmetric),
            Err(QuantError::InvalidRange { .. })
        ));
        assert!(matches!(
            ScaleOffset::from_range(-1.0, 1.0, DataType::F16, Symmetry::Symmetric),
            Err(QuantError::EncodingMismatch {
                dtype: DataType::F16,
                ..
            })
        ));
        // A span that overflows f32 after division is still finite here (f32::MAX * 2 / 255).
        let so = ScaleOffset::from_range(-f32::MAX, f32::MAX, DataType::U8, Symmetry::Asymmetric)
            .unwrap();
        assert!(so.scale.is_finite());
    }
}
