//! Scalar and slice quantization for the fixed-point types.

use crate::{DataType, QuantError, ScaleOffset};

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for i8 {}
    impl Sealed for i16 {}
}

/// A Rust integer type that stores one of QNN's fixed-point [`DataType`]s:
/// `u8` (`U8`), `u16` (`U16`), `i8` (`I8`), `i16` (`I16`).
///
/// The trait is sealed: those four are the only implementations, so `DTYPE`, `QMIN` and
/// `QMAX` always agree with the Rust type. Beyond the required `Copy + Send + Sync + 'static`
/// it also guarantees `PartialEq + Debug`, for generic code and tests.
pub trait FixedPoint:
    sealed::Sealed + Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    /// The QNN data type this Rust type stores.
    const DTYPE: DataType;
    /// Smallest stored integer.
    const QMIN: i32;
    /// Largest stored integer.
    const QMAX: i32;
    /// The stored integer, widened.
    fn to_i32(self) -> i32;
    /// Narrows `v`, clamping it to `[QMIN, QMAX]`.
    fn from_i32_saturating(v: i32) -> Self;
}

macro_rules! impl_fixed_point {
    ($t:ty, $dtype:expr) => {
        impl FixedPoint for $t {
            const DTYPE: DataType = $dtype;
            const QMIN: i32 = <$t>::MIN as i32;
            const QMAX: i32 = <$t>::MAX as i32;
            #[inline]
            fn to_i32(self) -> i32 {
                i32::from(self)
            }
            #[inline]
            fn from_i32_saturating(v: i32) -> Self {
                // The clamp makes the narrowing cast exact.
                v.clamp(Self::QMIN, Self::QMAX) as $t
            }
        }
    };
}

impl_fixed_point!(u8, DataType::U8);
impl_fixed_point!(u16, DataType::U16);
impl_fixed_point!(i8, DataType::I8);
impl_fixed_point!(i16, DataType::I16);

/// `round(x / scale) - offset`, clamped to `[qmin, qmax]`; the one place the rounding rule lives.
///
/// The quotient of two f32 values is computed in f64, so it is within 2^-53 (relative) of the
/// exact quotient: ties are decided correctly for every quotient a 16-bit type can hold without
/// saturating. Rounding is half away from zero (`f64::round`'s rule), computed without a libm
/// call (this runs for every activation of every matmul): the quotient is first clamped to the
/// integers `[qmin + offset, qmax + offset]` (which commutes with rounding, both being
/// monotonic and the bounds integers), so truncating it to i64 is exact, and so is the fraction
/// `q - trunc(q)`; a fraction of at least one half moves the result one away from zero. Equal
/// to the `f64::round` form for every input (`tests::rounding_equals_f64_round`).
#[inline]
fn quantize_in_range(x: f32, so: ScaleOffset, qmin: i32, qmax: i32) -> i32 {
    let offset = i64::from(so.offset);
    let (lo, hi) = (
        (i64::from(qmin) + offset) as f64,
        (i64::from(qmax) + offset) as f64,
    );
    // NaN stays NaN through the clamp and truncates to 0: the code of 0.0 (`-offset`).
    let q = (f64::from(x) / f64::from(so.scale)).clamp(lo, hi);
    let t = q as i64;
    let frac = q - t as f64;
    let r = t + i64::from(frac >= 0.5) - i64::from(frac <= -0.5);
    (r - offset).clamp(i64::from(qmin), i64::from(qmax)) as i32
}

/// Quantizes one real value to the stored integer of `dtype`: `round(x / scale) - offset`,
/// rounding half away from zero, saturated to the type's integer range.
///
/// `NaN` gives the code of `0.0` (`-offset`, saturated); `±inf` saturate.
///
/// **Float types** (`F16`, `F32`) store no integer; for them the same formula is applied with
/// `i32`'s range as the saturation bounds (use [`try_quantize_value`] to reject float types
/// instead).
///
/// The scale is assumed valid ([`ScaleOffset::validate`]); with an invalid one the result is
/// saturated or meaningless but the function does not panic.
pub fn quantize_value(x: f32, dtype: DataType, so: ScaleOffset) -> i32 {
    let (qmin, qmax) = dtype.integer_range().unwrap_or((i32::MIN, i32::MAX));
    quantize_in_range(x, so, qmin, qmax)
}

/// Like [`quantize_value`], but rejects a float `dtype` and an invalid scale.
pub fn try_quantize_value(x: f32, dtype: DataType, so: ScaleOffset) -> Result<i32, QuantError> {
    let so = so.validate()?;
    let (qmin, qmax) = dtype.integer_range().ok_or(QuantError::EncodingMismatch {
        dtype,
        reason: "a float type stores no quantized integer",
    })?;
    Ok(quantize_in_range(x, so, qmin, qmax))
}

/// Quantizes one real value to the fixed-point type `T` (see [`quantize_value`] for the rules).
#[inline]
pub fn quantize<T: FixedPoint>(x: f32, so: ScaleOffset) -> T {
    T::from_i32_saturating(quantize_in_range(x, so, T::QMIN, T::QMAX))
}

/// The real value of a stored `T`: `(q + offset) * scale`, rounded once to `f32`.
#[inline]
pub fn dequantize<T: FixedPoint>(q: T, so: ScaleOffset) -> f32 {
    so.dequantize_i32(q.to_i32())
}

/// Requantizes one stored integer from encoding `from` to type `B` with encoding `to`.
///
/// Defined as `quantize::<B>(from.dequantize_i32(q), to)`: the real value is rounded to `f32`
/// first, exactly as a dequantize followed by a quantize would do.
#[inline]
pub fn requantize_value<B: FixedPoint>(q: i32, from: ScaleOffset, to: ScaleOffset) -> B {
    quantize::<B>(from.dequantize_i32(q), to)
}

pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), QuantError> {
    if expected == found {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what,
            expected,
            found,
        })
    }
}

/// Quantizes `src` into `dst` element by element with [`quantize`].
///
/// Errors: [`QuantError::InvalidScale`]; [`QuantError::LengthMismatch`] unless
/// `dst.len() == src.len()` (nothing is written then).
pub fn quantize_slice<T: FixedPoint>(
    src: &[f32],
    dst: &mut [T],
    so: ScaleOffset,
) -> Result<(), QuantError> {
    let so = so.validate()?;
    check_len(
        "quantize_slice: destination elements (= source elements)",
        src.len(),
        dst.len(),
    )?;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = quantize::<T>(x, so);
    }
    Ok(())
}

/// Dequantizes `src` into `dst` element by element with [`dequantize`].
///
/// Errors: [`QuantError::InvalidScale`]; [`QuantError::LengthMismatch`] unless
/// `dst.len() == src.len()`.
pub fn dequantize_slice<T: FixedPoint>(
    src: &[T],
    dst: &mut [f32],
    so: ScaleOffset,
) -> Result<(), QuantError> {
    let so = so.validate()?;
    check_len(
        "dequantize_slice: destination elements (= source elements)",
        src.len(),
        dst.len(),
    )?;
    for (d, &q) in dst.iter_mut().zip(src) {
        *d = dequantize(q, so);
    }
    Ok(())
}

/// Requantizes `src` (type `A`, encoding `from`) into `dst` (type `B`, encoding `to`).
///
/// Every element equals [`requantize_value`] of it, i.e. a [`dequantize`] to `f32` followed by
/// a [`quantize`]. When `src` is long compared with `A`'s value count (at least a quarter of
/// it), the function first tabulates all of `A`'s values and then only looks them up.
///
/// Errors: [`QuantError::InvalidScale`] for either encoding; [`QuantError::LengthMismatch`]
/// unless `dst.len() == src.len()`.
pub fn requantize_slice<A: FixedPoint, B: FixedPoint>(
    src: &[A],
    from: ScaleOffset,
    dst: &mut [B],
    to: ScaleOffset,
) -> Result<(), QuantError> {
    let from = from.validate()?;
    let to = to.validate()?;
    check_len(
        "requantize_slice: destination elements (= source elements)",
        src.len(),
        dst.len(),
    )?;
    let values = (A::QMAX - A::QMIN) as usize + 1;
    if src.len() >= values / 4 {
        let table: Vec<B> = (A::QMIN..=A::QMAX)
            .map(|q| requantize_value::<B>(q, from, to))
            .collect();
        for (d, &a) in dst.iter_mut().zip(src) {
            let q = a.to_i32();
            // The index is in range for every value of A; the fallback only keeps this panic-free.
            *d = match table.get((q - A::QMIN) as usize) {
                Some(&b) => b,
                None => requantize_value::<B>(q, from, to),
            };
        }
    } else {
        for (d, &a) in dst.iter_mut().zip(src) {
            *d = requantize_value::<B>(a.to_i32(), from, to);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn so(scale: f32, offset: i32) -> ScaleOffset {
        ScaleOffset::new(scale, offset).expect("valid scale")
    }

    /// The rounding rule in its plain form: `f64::round`, then the offset, then the clamp.
    fn rounded_by_f64_round(x: f32, so: ScaleOffset, qmin: i32, qmax: i32) -> i32 {
        let offset = f64::from(so.offset);
        let mut r = (f64::from(x) / f64::from(so.scale)).round() - offset;
        if r.is_nan() {
            r = -offset;
        }
        r.clamp(f64::from(qmin), f64::from(qmax)) as i32
    }

    #[test]
    fn rounding_equals_f64_round() {
        let ranges = [
            (-128, 127),
            (0, 255),
            (-32768, 32767),
            (0, 65535),
            (i32::MIN, i32::MAX),
        ];
        let scales = [
            1.0f32,
            0.5,
            0.1,
            3.0e-5,
            1.0 / 3.0,
            7.0e4,
            f32::MIN_POSITIVE,
        ];
        let offsets = [0, -128, 5, -32768, -1, 40000];
        let mut xs = vec![
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            f32::MAX,
            -f32::MAX,
        ];
        // Every integer near zero, and every 97th out to ±70000 (past the 16-bit types).
        let ks = (-3000i32..3000).chain((-722..722).map(|i| i * 97));
        for k in ks {
            // Ties, their neighbours and ordinary values at every scale.
            let v = k as f32 * 0.5;
            xs.extend([
                v,
                f32::from_bits(v.to_bits() + 1),
                f32::from_bits(v.to_bits().wrapping_sub(1)),
            ]);
            xs.push(k as f32 * 0.37);
        }
        for &(qmin, qmax) in &ranges {
            for &scale in &scales {
                for &offset in &offsets {
                    let s = ScaleOffset { scale, offset };
                    for &x in &xs {
                        // Ties at this scale: x = (k + 0.5) * scale rounded to f32.
                        for x in [x, x * scale] {
                            assert_eq!(
                                quantize_in_range(x, s, qmin, qmax),
                                rounded_by_f64_round(x, s, qmin, qmax),
                                "x {x:e} scale {scale:e} offset {offset} range {qmin}..={qmax}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ties_round_away_from_zero() {
        let s = so(0.5, 0);
        assert_eq!(quantize::<i8>(0.25, s), 1);
        assert_eq!(quantize::<i8>(-0.25, s), -1);
        assert_eq!(quantize::<i8>(0.75, s), 2);
        assert_eq!(quantize::<i8>(-0.75, s), -2);
        assert_eq!(quantize::<i8>(0.2, s), 0);
        assert_eq!(quantize::<i8>(-0.2, s), 0);
        // Rounding happens before the offset is applied: round(0.5) - (-128) = 129.
        assert_eq!(quantize::<u8>(0.25, so(0.5, -128)), 129);
        assert_eq!(quantize::<u8>(-0.25, so(0.5, -128)), 127);
    }

    #[test]
    fn u8_offset_minus_128() {
        let s = so(0.1, -128);
        assert_eq!(quantize::<u8>(0.0, s), 128);
        assert_eq!(quantize::<u8>(-12.8, s), 0);
        assert_eq!(quantize::<u8>(12.7, s), 255);
        assert_eq!(quantize::<u8>(100.0, s), 255);
        assert_eq!(quantize::<u8>(-100.0, s), 0);
        assert_eq!(dequantize::<u8>(128, s), 0.0);
        // (0 - 128) * 0.1 rounded once to f32.
        assert_eq!(
            dequantize::<u8>(0, s),
            (-128.0f64 * f64::from(0.1f32)) as f32
        );
    }

    #[test]
    fn u16_offset_minus_32768() {
        let s = so(1.0 / 1024.0, -32768);
        assert_eq!(quantize::<u16>(0.0, s), 32768);
        assert_eq!(quantize::<u16>(1.0, s), 32768 + 1024);
        assert_eq!(quantize::<u16>(-32.0, s), 0);
        assert_eq!(quantize::<u16>(32.0, s), 65535);
        assert_eq!(dequantize::<u16>(65535, s), 32767.0 / 1024.0);
        assert_eq!(dequantize::<u16>(0, s), -32.0);
    }

    #[test]
    fn i16_symmetric() {
        let s = so(0.001, 0);
        assert_eq!(quantize::<i16>(1.0, s), 1000);
        assert_eq!(quantize::<i16>(-1.0, s), -1000);
        assert_eq!(quantize::<i16>(40.0, s), 32767);
        assert_eq!(quantize::<i16>(-40.0, s), -32768);
        assert_eq!(
            dequantize::<i16>(-1000, s),
            (-1000.0f64 * f64::from(0.001f32)) as f32
        );
    }

    #[test]
    fn nan_and_infinities() {
        let s = so(0.5, -128);
        assert_eq!(quantize::<u8>(f32::NAN, s), 128);
        assert_eq!(quantize::<u8>(f32::INFINITY, s), 255);
        assert_eq!(quantize::<u8>(f32::NEG_INFINITY, s), 0);
        // The code of 0.0 saturates when 0.0 is not representable.
        assert_eq!(quantize::<u8>(f32::NAN, so(0.5, 10)), 0);
        assert_eq!(quantize::<i8>(f32::NAN, so(0.5, -300)), 127);
    }

    #[test]
    fn float_dtypes_use_i32_range() {
        let s = so(0.5, 3);
        assert_eq!(quantize_value(10.0, DataType::F32, s), 17);
        assert_eq!(quantize_value(1e30, DataType::F16, s), i32::MAX);
        assert!(matches!(
            try_quantize_value(1.0, DataType::F32, s),
            Err(QuantError::EncodingMismatch { .. })
        ));
        assert_eq!(try_quantize_value(1.0, DataType::U8, s), Ok(0));
    }

    #[test]
    fn invalid_scale_does_not_panic() {
        for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let bad = ScaleOffset { scale, offset: 0 };
            for x in [0.0, 1.0, -1.0, f32::NAN] {
                let q = quantize::<i8>(x, bad);
                assert!((-128..=127).contains(&i32::from(q)));
            }
            let mut out = [0u8; 2];
            assert!(matches!(
                quantize_slice(&[1.0, 2.0], &mut out, bad),
                Err(QuantError::InvalidScale { .. })
            ));
        }
    }

    #[test]
    fn from_i32_saturating_clamps() {
        assert_eq!(u8::from_i32_saturating(-5), 0);
        assert_eq!(u8::from_i32_saturating(300), 255);
        assert_eq!(i8::from_i32_saturating(-300), -128);
        assert_eq!(i16::from_i32_saturating(40_000), 32767);
        assert_eq!(u16::from_i32_saturating(70_000), 65535);
        assert_eq!(u16::from_i32_saturating(1234), 1234);
    }

    #[test]
    fn requantize_table_and_direct_paths_agree_with_scalar() {
        let from = so(0.02, -128);
        let to = so(0.013, 5);
        // Long enough for the table path, and short enough for the direct path.
        let long: Vec<u8> = (0..=255).chain(0..=255).collect();
        let short: Vec<u8> = vec![0, 1, 127, 128, 200, 255];
        for src in [&long[..], &short[..]] {
            let mut dst = vec![0i16; src.len()];
            requantize_slice(src, from, &mut dst, to).expect("valid");
            for (&a, &b) in src.iter().zip(&dst) {
                let expected: i16 = quantize(dequantize(a, from), to);
                assert_eq!(b, expected, "a={a}");
            }
        }
    }

    #[test]
    fn length_mismatch_writes_nothing() {
        let mut dst = [7u8; 3];
        let err = quantize_slice(&[1.0, 2.0], &mut dst, so(1.0, 0)).unwrap_err();
        assert_eq!(
            err,
            QuantError::LengthMismatch {
                what: "quantize_slice: destination elements (= source elements)",
                expected: 2,
                found: 3
            }
        );
        assert_eq!(dst, [7; 3]);
    }

    #[test]
    fn the_f32_dequantize_path_is_bit_identical_wherever_it_claims_to_be() {
        // Scales from subnormal products to overflow, offsets at the ends of what is allowed.
        let scales = [
            1e-40f32,
            1.17e-38,
            3.1e-4,
            0.037,
            0.1,
            1.0 / 3.0,
            7.5,
            3.0e33,
        ];
        let offsets = [
            0,
            -128,
            128,
            -32768,
            -65535,
            65535,
            (1 << 24) - 65535,
            -(1 << 24),
        ];
        let mut checked = 0;
        for dtype in [DataType::U8, DataType::U16, DataType::I8, DataType::I16] {
            let (qmin, qmax) = dtype.integer_range().unwrap();
            for (&scale, &offset) in scales
                .iter()
                .flat_map(|s| offsets.iter().map(move |o| (s, o)))
            {
                let e = so(scale, offset);
                if !e.dequantizes_exactly_in_f32(dtype) {
                    continue;
                }
                for q in qmin..=qmax {
                    let (fast, exact) = (e.dequantize_i32_in_f32(q), e.dequantize_i32(q));
                    assert_eq!(fast.to_bits(), exact.to_bits(), "{dtype:?} q {q} {e:?}");
                }
                checked += 1;
            }
        }
        assert!(checked > 50, "only {checked} encodings checked");
        // Outside ±2^24 the f32 sum would round: not claimed.
        assert!(!so(0.5, 1 << 24).dequantizes_exactly_in_f32(DataType::U16));
        assert!(so(0.5, (1 << 24) - 65535).dequantizes_exactly_in_f32(DataType::U16));
        assert!(!so(0.5, 0).dequantizes_exactly_in_f32(DataType::F16));
    }
}
