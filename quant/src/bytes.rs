//! Half-precision slices and little-endian byte buffers of any [`DataType`].

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::fixed::{check_len, dequantize, quantize};
use crate::{DataType, Encoding, QuantError, QuantSpec, ScaleOffset};

/// Converts `src` to half precision, rounding to nearest, ties to even (IEEE 754); values
/// beyond `f16`'s range become `±inf`, `NaN` stays `NaN`.
///
/// Uses `half`'s slice conversion (hardware instructions where available), which gives the same
/// results as `f16::from_f32` element by element.
///
/// Errors: [`QuantError::LengthMismatch`] unless `dst.len() == src.len()`.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [f16]) -> Result<(), QuantError> {
    check_len(
        "f32_to_f16_slice: destination elements (= source elements)",
        src.len(),
        dst.len(),
    )?;
    dst.convert_from_f32_slice(src);
    Ok(())
}

/// Converts half-precision values to `f32` (exact).
///
/// Errors: [`QuantError::LengthMismatch`] unless `dst.len() == src.len()`.
pub fn f16_to_f32_slice(src: &[f16], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len(
        "f16_to_f32_slice: destination elements (= source elements)",
        src.len(),
        dst.len(),
    )?;
    src.convert_to_f32_slice(dst);
    Ok(())
}

fn encode_with<const N: usize>(src: &[f32], dst: &mut [u8], f: impl Fn(f32) -> [u8; N]) {
    let (chunks, _) = dst.as_chunks_mut::<N>();
    for (c, &x) in chunks.iter_mut().zip(src) {
        *c = f(x);
    }
}

fn decode_with<const N: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    let (chunks, _) = src.as_chunks::<N>();
    for (d, &c) in dst.iter_mut().zip(chunks) {
        *d = f(c);
    }
}

/// The per-tensor encoding of `spec`, after checking that it fits `spec.dtype`.
/// `Ok(None)` means a float tensor.
fn storage_encoding(spec: &QuantSpec) -> Result<Option<ScaleOffset>, QuantError> {
    let dtype = spec.dtype;
    if !dtype.is_real() {
        return Err(QuantError::EncodingMismatch {
            dtype,
            reason: "i32 holds integers (token ids, positions), not encoded real values",
        });
    }
    match (&spec.encoding, dtype.is_fixed_point()) {
        (Encoding::Float, false) => Ok(None),
        (Encoding::Float, true) => Err(QuantError::EncodingMismatch {
            dtype,
            reason: "a fixed-point type needs a scale/offset encoding",
        }),
        (Encoding::PerTensor(so), true) => Ok(Some(so.validate()?)),
        (Encoding::PerTensor(_), false) => Err(QuantError::EncodingMismatch {
            dtype,
            reason: "a float type carries no scale/offset",
        }),
        (Encoding::PerAxis { .. }, _) => Err(QuantError::EncodingMismatch {
            dtype,
            reason: "byte encoding supports per-tensor and float encodings only; per-axis needs the tensor shape (use quantize_per_axis)",
        }),
    }
}

/// Encodes `src` into `dst` as little-endian elements of `spec.dtype`: quantized with the
/// per-tensor encoding (exactly as [`crate::quantize`]) for fixed-point types, converted with
/// `f16::from_f32` for `F16`, copied for `F32`.
///
/// Errors: [`QuantError::EncodingMismatch`] for a per-axis encoding or an encoding that does not
/// fit the data type; [`QuantError::InvalidScale`]; [`QuantError::LengthMismatch`] unless
/// `dst.len() == src.len() * spec.dtype.size_bytes()`. Nothing is written on error.
pub fn encode_f32_to_bytes(
    src: &[f32],
    spec: &QuantSpec,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let so = storage_encoding(spec)?;
    check_len(
        "encode_f32_to_bytes: destination bytes (= source elements x element size)",
        src.len().saturating_mul(spec.dtype.size_bytes()),
        dst.len(),
    )?;
    match (spec.dtype, so) {
        (DataType::F32, _) => encode_with(src, dst, f32::to_le_bytes),
        (DataType::F16, _) => encode_with(src, dst, |x| f16::from_f32(x).to_le_bytes()),
        (DataType::U8, Some(so)) => encode_with(src, dst, |x| [quantize::<u8>(x, so)]),
        (DataType::I8, Some(so)) => encode_with(src, dst, |x| quantize::<i8>(x, so).to_le_bytes()),
        (DataType::U16, Some(so)) => {
            encode_with(src, dst, |x| quantize::<u16>(x, so).to_le_bytes())
        }
        (DataType::I16, Some(so)) => {
            encode_with(src, dst, |x| quantize::<i16>(x, so).to_le_bytes())
        }
        // storage_encoding returns Some for every fixed-point type and rejects I32.
        (DataType::U8 | DataType::I8 | DataType::U16 | DataType::I16, None)
        | (DataType::I32, _) => {}
    }
    Ok(())
}

/// Decodes little-endian elements of `spec.dtype` from `src` into `dst` (the inverse of
/// [`encode_f32_to_bytes`]; fixed-point values are dequantized exactly as
/// [`crate::dequantize`]).
///
/// Errors: as [`encode_f32_to_bytes`], with
/// `src.len() == dst.len() * spec.dtype.size_bytes()` required.
pub fn decode_bytes_to_f32(
    src: &[u8],
    spec: &QuantSpec,
    dst: &mut [f32],
) -> Result<(), QuantError> {
    let so = storage_encoding(spec)?;
    check_len(
        "decode_bytes_to_f32: source bytes (= destination elements x element size)",
        dst.len().saturating_mul(spec.dtype.size_bytes()),
        src.len(),
    )?;
    match (spec.dtype, so) {
        (DataType::F32, _) => decode_with(src, dst, f32::from_le_bytes),
        (DataType::F16, _) => decode_with(src, dst, |b| f16::from_le_bytes(b).to_f32()),
        (DataType::U8, Some(so)) => decode_with(src, dst, |[b]: [u8; 1]| dequantize(b, so)),
        (DataType::I8, Some(so)) => decode_with(src, dst, |b| dequantize(i8::from_le_bytes(b), so)),
        (DataType::U16, Some(so)) => {
            decode_with(src, dst, |b| dequantize(u16::from_le_bytes(b), so))
        }
        (DataType::I16, Some(so)) => {
            decode_with(src, dst, |b| dequantize(i16::from_le_bytes(b), so))
        }
        (DataType::U8 | DataType::I8 | DataType::U16 | DataType::I16, None)
        | (DataType::I32, _) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dtype: DataType, scale: f32, offset: i32) -> QuantSpec {
        QuantSpec::per_tensor(dtype, ScaleOffset::new(scale, offset).unwrap()).unwrap()
    }

    #[test]
    fn fixed_point_bytes_are_little_endian() {
        let x = [0.0f32, 1.0, -1.0, 1000.0];
        let mut b = [0u8; 8];
        encode_f32_to_bytes(&x, &spec(DataType::I16, 0.5, 0), &mut b).unwrap();
        // Codes 0, 2, -2, 2000.
        assert_eq!(b, [0, 0, 2, 0, 0xfe, 0xff, 0xd0, 0x07]);
        let mut b = [0u8; 8];
        encode_f32_to_bytes(&x, &spec(DataType::U16, 0.5, -32768), &mut b).unwrap();
        assert_eq!(b, [0, 0x80, 2, 0x80, 0xfe, 0x7f, 0xd0, 0x87]);
        let mut b = [0u8; 4];
        encode_f32_to_bytes(&x, &spec(DataType::U8, 0.5, -128), &mut b).unwrap();
        assert_eq!(b, [128, 130, 126, 255]);
        let mut b = [0u8; 4];
        encode_f32_to_bytes(&x, &spec(DataType::I8, 0.5, 0), &mut b).unwrap();
        assert_eq!(b, [0, 2, 0xfe, 127]);
        let mut back = [0f32; 4];
        decode_bytes_to_f32(&b, &spec(DataType::I8, 0.5, 0), &mut back).unwrap();
        assert_eq!(back, [0.0, 1.0, -1.0, 63.5]);
    }

    #[test]
    fn float_bytes() {
        let x = [1.0f32, -2.5, 65504.0, 1e-3];
        let f32_spec = QuantSpec::float(DataType::F32).unwrap();
        let mut b = [0u8; 16];
        encode_f32_to_bytes(&x, &f32_spec, &mut b).unwrap();
        assert_eq!(&b[..4], &1.0f32.to_le_bytes());
        let mut back = [0f32; 4];
        decode_bytes_to_f32(&b, &f32_spec, &mut back).unwrap();
        assert_eq!(back, x);

        let f16_spec = QuantSpec::float(DataType::F16).unwrap();
        let mut b = [0u8; 8];
        encode_f32_to_bytes(&x, &f16_spec, &mut b).unwrap();
        assert_eq!(&b[..2], &[0x00, 0x3c]); // 1.0 in binary16
        decode_bytes_to_f32(&b, &f16_spec, &mut back).unwrap();
        assert_eq!(back[..3], x[..3]);
        assert_eq!(back[3], f16::from_f32(1e-3).to_f32());
    }

    #[test]
    fn byte_errors() {
        let mut b = [0u8; 3];
        assert_eq!(
            encode_f32_to_bytes(&[1.0, 2.0], &spec(DataType::U16, 1.0, 0), &mut b),
            Err(QuantError::LengthMismatch {
                what: "encode_f32_to_bytes: destination bytes (= source elements x element size)",
                expected: 4,
                found: 3
            })
        );
        let mut out = [0f32; 2];
        assert!(matches!(
            decode_bytes_to_f32(&b, &spec(DataType::U16, 1.0, 0), &mut out),
            Err(QuantError::LengthMismatch {
                expected: 4,
                found: 3,
                ..
            })
        ));
        let per_axis = QuantSpec {
            dtype: DataType::U8,
            encoding: Encoding::PerAxis {
                axis: 0,
                params: vec![ScaleOffset::new(1.0, 0).unwrap()],
            },
        };
        let mut b = [0u8; 1];
        assert!(matches!(
            encode_f32_to_bytes(&[1.0], &per_axis, &mut b),
            Err(QuantError::EncodingMismatch { .. })
        ));
        let float_u8 = QuantSpec {
            dtype: DataType::U8,
            encoding: Encoding::Float,
        };
        assert!(matches!(
            decode_bytes_to_f32(&b, &float_u8, &mut out[..1]),
            Err(QuantError::EncodingMismatch { .. })
        ));
        let bad_scale = QuantSpec {
            dtype: DataType::I8,
            encoding: Encoding::PerTensor(ScaleOffset {
                scale: -1.0,
                offset: 0,
            }),
        };
        assert_eq!(
            encode_f32_to_bytes(&[1.0], &bad_scale, &mut b),
            Err(QuantError::InvalidScale { scale: -1.0 })
        );
        let f16_with_scale = QuantSpec {
            dtype: DataType::F16,
            encoding: Encoding::PerTensor(ScaleOffset::new(1.0, 0).unwrap()),
        };
        let mut b2 = [0u8; 2];
        assert!(matches!(
            encode_f32_to_bytes(&[1.0], &f16_with_scale, &mut b2),
            Err(QuantError::EncodingMismatch {
                dtype: DataType::F16,
                ..
            })
        ));
    }

    #[test]
    fn f16_slices() {
        let x = [0.0f32, 1.0, -1.5, 65504.0, 1e6, f32::NAN, 3.3];
        let mut h = [f16::ZERO; 7];
        f32_to_f16_slice(&x, &mut h).unwrap();
        for (hi, &xi) in h.iter().zip(&x) {
            let r = f16::from_f32(xi);
            assert!(hi.to_bits() == r.to_bits() || (hi.is_nan() && r.is_nan()));
        }
        assert!(h[4].is_infinite());
        let mut back = [0f32; 7];
        f16_to_f32_slice(&h, &mut back).unwrap();
        assert_eq!(back[..4], x[..4]);
        assert_eq!(back[6], f16::from_f32(3.3).to_f32());
        assert!(back[5].is_nan());
        assert!(f32_to_f16_slice(&x, &mut h[..3]).is_err());
        assert!(f16_to_f32_slice(&h, &mut back[..6]).is_err());
    }
}
