//! Property tests of the quantization math against independent oracles: the error bound of a
//! round trip, nearest-code selection, saturation, and agreement of every slice, array, byte and
//! table path with the scalar reference functions.

use approx::assert_abs_diff_eq;
use half::f16;
use ndarray::{Array2, Array3};
use proptest::prelude::*;
use quant::{
    DataType, FixedPoint, QuantSpec, ScaleOffset, Symmetry, decode_bytes_to_f32, dequantize,
    dequantize_array, dequantize_per_axis, dequantize_slice, encode_f32_to_bytes, f16_to_f32_slice,
    f32_to_f16_slice, quantize, quantize_array, quantize_per_axis, quantize_slice, quantize_value,
    requantize_slice,
};

/// A scale spread over many orders of magnitude.
fn scale() -> impl Strategy<Value = f32> {
    (-4.0f32..2.0).prop_map(|e| 10f32.powf(e))
}

/// An offset that keeps zero representable or not, for either signedness.
fn offset() -> impl Strategy<Value = i32> {
    -70_000i32..70_000
}

/// Rounding slack of the f32 arithmetic around values of magnitude `m`.
fn slack(m: f32) -> f32 {
    4.0 * f32::EPSILON * m
}

/// The real value of code `q` computed independently of the crate (f64, one rounding).
fn real(q: i32, so: ScaleOffset) -> f64 {
    (f64::from(q) + f64::from(so.offset)) * f64::from(so.scale)
}

fn check_round_trip<T: FixedPoint + PartialEq + std::fmt::Debug>(
    s: f32,
    off: i32,
    t: f64,
) -> Result<(), TestCaseError> {
    let so = ScaleOffset::new(s, off).expect("positive scale");
    let (qmin, qmax) = (T::QMIN, T::QMAX);
    let lo = real(qmin, so);
    let hi = real(qmax, so);
    let x = (lo + (hi - lo) * t).clamp(lo, hi) as f32;
    let q: T = quantize(x, so);
    let qi = q.to_i32();
    let back = dequantize(q, so);
    let bound = s / 2.0 + slack(x.abs().max(lo.abs() as f32).max(hi.abs() as f32));
    prop_assert!(
        (back - x).abs() <= bound,
        "x={x} q={qi} back={back} scale={s} offset={off}"
    );
    // Nearest code: no neighbour in range is strictly closer (ties may go either way only
    // by rounding noise, so compare with a tiny tolerance).
    let err = (real(qi, so) - f64::from(x)).abs();
    for n in [qi - 1, qi + 1] {
        if (qmin..=qmax).contains(&n) {
            let ne = (real(n, so) - f64::from(x)).abs();
            prop_assert!(err <= ne + 1e-9 * f64::from(s), "q={qi} n={n} x={x}");
        }
    }
    // The generic and the dtype-tagged scalar functions agree.
    prop_assert_eq!(quantize_value(x, T::DTYPE, so), qi);
    Ok(())
}

fn check_saturation<T: FixedPoint>(s: f32, off: i32, beyond: f64) -> Result<(), TestCaseError> {
    let so = ScaleOffset::new(s, off).expect("positive scale");
    let lo = real(T::QMIN, so);
    let hi = real(T::QMAX, so);
    let margin = f64::from(s) * (0.6 + beyond);
    let above = (hi + margin) as f32;
    let below = (lo - margin) as f32;
    prop_assert_eq!(quantize::<T>(above, so).to_i32(), T::QMAX, "x={}", above);
    prop_assert_eq!(quantize::<T>(below, so).to_i32(), T::QMIN, "x={}", below);
    prop_assert_eq!(quantize::<T>(f32::INFINITY, so).to_i32(), T::QMAX);
    prop_assert_eq!(quantize::<T>(f32::NEG_INFINITY, so).to_i32(), T::QMIN);
    prop_assert_eq!(quantize::<T>(f32::MAX, so).to_i32(), T::QMAX);
    prop_assert_eq!(quantize::<T>(f32::MIN, so).to_i32(), T::QMIN);
    // NaN is the code of 0.0.
    prop_assert_eq!(
        quantize::<T>(f32::NAN, so).to_i32(),
        quantize::<T>(0.0, so).to_i32()
    );
    Ok(())
}

macro_rules! per_type_properties {
    ($name:ident, $t:ty) => {
        mod $name {
            use super::*;

            proptest! {
                #[test]
                fn round_trip_within_half_step(s in scale(), off in offset(), t in 0.0f64..=1.0) {
                    check_round_trip::<$t>(s, off, t)?;
                }

                #[test]
                fn saturates_outside_range(s in scale(), off in offset(), beyond in 0.0f64..1e4) {
                    check_saturation::<$t>(s, off, beyond)?;
                }

                #[test]
                fn monotonic(s in scale(), off in offset(), a in -1e4f32..1e4, b in -1e4f32..1e4) {
                    let so = ScaleOffset::new(s, off).unwrap();
                    let (x, y) = if a <= b { (a, b) } else { (b, a) };
                    prop_assert!(quantize::<$t>(x, so).to_i32() <= quantize::<$t>(y, so).to_i32());
                }

                #[test]
                fn slices_and_arrays_match_scalar(
                    s in scale(),
                    off in offset(),
                    xs in prop::collection::vec(-1e3f32..1e3, 0..64),
                ) {
                    let so = ScaleOffset::new(s, off).unwrap();
                    let mut q = vec![<$t>::from_i32_saturating(0); xs.len()];
                    quantize_slice(&xs, &mut q, so).unwrap();
                    let mut back = vec![0f32; xs.len()];
                    dequantize_slice(&q, &mut back, so).unwrap();
                    for i in 0..xs.len() {
                        prop_assert_eq!(q[i], quantize::<$t>(xs[i], so));
                        prop_assert_eq!(back[i].to_bits(), dequantize(q[i], so).to_bits());
                    }
                    let arr = ndarray::Array1::from(xs.clone());
                    let qa = quantize_array::<$t, _>(arr.view(), so);
                    prop_assert_eq!(qa.as_slice().unwrap(), &q[..]);
                    let ba = dequantize_array(qa.view(), so);
                    prop_assert_eq!(ba.as_slice().unwrap(), &back[..]);
                }

                #[test]
                fn bytes_match_scalar(
                    s in scale(),
                    off in offset(),
                    xs in prop::collection::vec(-1e3f32..1e3, 0..64),
                ) {
                    let so = ScaleOffset::new(s, off).unwrap();
                    let spec = QuantSpec::per_tensor(<$t as FixedPoint>::DTYPE, so).unwrap();
                    let size = std::mem::size_of::<$t>();
                    let mut bytes = vec![0u8; xs.len() * size];
                    encode_f32_to_bytes(&xs, &spec, &mut bytes).unwrap();
                    let mut back = vec![0f32; xs.len()];
                    decode_bytes_to_f32(&bytes, &spec, &mut back).unwrap();
                    for (i, &x) in xs.iter().enumerate() {
                        let q = quantize::<$t>(x, so);
                        prop_assert_eq!(&bytes[i * size..(i + 1) * size], &q.to_le_bytes()[..]);
                        prop_assert_eq!(back[i].to_bits(), dequantize(q, so).to_bits());
                    }
                }
            }
        }
    };
}

per_type_properties!(u8_props, u8);
per_type_properties!(u16_props, u16);
per_type_properties!(i8_props, i8);
per_type_properties!(i16_props, i16);

/// Requantization of `A` into every fixed-point type, against dequantize + quantize.
fn check_requantize<A: FixedPoint + std::fmt::Debug>(
    src: &[A],
    from: ScaleOffset,
    to: ScaleOffset,
) -> Result<(), TestCaseError> {
    fn into<A: FixedPoint, B: FixedPoint + PartialEq + std::fmt::Debug>(
        src: &[A],
        from: ScaleOffset,
        to: ScaleOffset,
    ) -> Result<(), TestCaseError> {
        let mut dst = vec![B::from_i32_saturating(0); src.len()];
        requantize_slice(src, from, &mut dst, to).unwrap();
        for (&a, &b) in src.iter().zip(&dst) {
            prop_assert_eq!(b, quantize::<B>(dequantize(a, from), to));
        }
        Ok(())
    }
    into::<A, u8>(src, from, to)?;
    into::<A, u16>(src, from, to)?;
    into::<A, i8>(src, from, to)?;
    into::<A, i16>(src, from, to)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Short inputs take the direct path, long 8-bit inputs the table path.
    #[test]
    fn requantize_matches_dequantize_then_quantize(
        s1 in scale(), o1 in offset(), s2 in scale(), o2 in offset(),
        raw in prop::collection::vec(any::<u16>(), 0..400),
    ) {
        let from = ScaleOffset::new(s1, o1).unwrap();
        let to = ScaleOffset::new(s2, o2).unwrap();
        let u8s: Vec<u8> = raw.iter().map(|&v| v as u8).collect();
        let i8s: Vec<i8> = raw.iter().map(|&v| v as i8).collect();
        let i16s: Vec<i16> = raw.iter().map(|&v| v as i16).collect();
        check_requantize(&u8s, from, to)?;
        check_requantize(&i8s, from, to)?;
        check_requantize(&raw, from, to)?;
        check_requantize(&i16s, from, to)?;
    }

    /// Every x in [min, max] round-trips within half a step through the encoding from_range
    /// makes, and 0.0 is exact.
    #[test]
    fn from_range_covers_range(
        a in -1e4f32..1e4, b in -1e4f32..1e4, t in 0.0f32..=1.0,
        dtype in prop::sample::select(vec![DataType::U8, DataType::U16, DataType::I8, DataType::I16]),
        symmetric in any::<bool>(),
    ) {
        let (min, max) = if a <= b { (a, b) } else { (b, a) };
        let symmetry = if symmetric { Symmetry::Symmetric } else { Symmetry::Asymmetric };
        let so = ScaleOffset::from_range(min, max, dtype, symmetry).unwrap();
        prop_assert!(so.scale > 0.0);
        let x = (min + (max - min) * t).clamp(min, max);
        for v in [min, max, x, 0.0] {
            let q = quantize_value(v, dtype, so);
            let back = so.dequantize_i32(q);
            let bound = so.scale / 2.0 + slack(min.abs().max(max.abs()));
            prop_assert!((back - v).abs() <= bound, "v={} back={} so={:?}", v, back, so);
        }
        prop_assert_eq!(so.dequantize_i32(quantize_value(0.0, dtype, so)), 0.0);
        if symmetric {
            let expected = match dtype {
                DataType::U8 => -128,
                DataType::U16 => -32768,
                _ => 0,
            };
            prop_assert_eq!(so.offset, expected);
        }
    }

    /// Per-axis quantization of a 2-D array equals per-element quantization with the row's
    /// (or column's) encoding, and dequantizes back the same way.
    #[test]
    fn per_axis_2d_matches_scalar(
        rows in 1usize..6, cols in 1usize..6, axis in 0usize..2,
        seed in prop::collection::vec((scale(), -200i32..200), 6),
        data in prop::collection::vec(-50f32..50.0, 36),
    ) {
        let x = Array2::from_shape_fn((rows, cols), |(r, c)| data[r * 6 + c]);
        let n = if axis == 0 { rows } else { cols };
        let params: Vec<ScaleOffset> =
            seed[..n].iter().map(|&(s, o)| ScaleOffset::new(s, o).unwrap()).collect();
        let q = quantize_per_axis::<i16, _>(x.view(), axis, &params).unwrap();
        let back = dequantize_per_axis(q.view(), axis, &params).unwrap();
        for ((r, c), &v) in x.indexed_iter() {
            let so = params[if axis == 0 { r } else { c }];
            prop_assert_eq!(q[[r, c]], quantize::<i16>(v, so));
            prop_assert_eq!(back[[r, c]], dequantize(q[[r, c]], so));
        }
        // A transposed (non-contiguous) view along the swapped axis gives the transposed result.
        let qt = quantize_per_axis::<i16, _>(x.t(), 1 - axis, &params).unwrap();
        prop_assert_eq!(qt.t(), q.view());
    }

    /// f32 -> f16 slices equal the scalar conversion and are within half an f16 ulp.
    #[test]
    fn f16_slice_matches_scalar(xs in prop::collection::vec(-70000f32..70000.0, 0..100)) {
        let mut h = vec![f16::ZERO; xs.len()];
        f32_to_f16_slice(&xs, &mut h).unwrap();
        let mut back = vec![0f32; xs.len()];
        f16_to_f32_slice(&h, &mut back).unwrap();
        for (i, &x) in xs.iter().enumerate() {
            prop_assert_eq!(h[i].to_bits(), f16::from_f32(x).to_bits());
            prop_assert_eq!(back[i].to_bits(), h[i].to_f32().to_bits());
            if x.abs() <= 65504.0 {
                // binary16 has 11 significant bits: relative error <= 2^-11 (normal range),
                // absolute error <= 2^-25 (subnormal range).
                assert_abs_diff_eq!(back[i], x, epsilon = x.abs() * 2f32.powi(-11) + 2f32.powi(-25));
            } else {
                prop_assert!(back[i].is_infinite() || back[i].abs() == 65504.0);
            }
        }
    }
}

/// Every finite f16 survives f16 -> f32 -> f16 exactly (exhaustive over all 65536 bit patterns).
#[test]
fn f16_round_trip_exhaustive() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut wide = vec![0f32; all.len()];
    f16_to_f32_slice(&all, &mut wide).unwrap();
    let mut narrow = vec![f16::ZERO; all.len()];
    f32_to_f16_slice(&wide, &mut narrow).unwrap();
    for (a, b) in all.iter().zip(&narrow) {
        if a.is_nan() {
            assert!(b.is_nan());
        } else {
            assert_eq!(a.to_bits(), b.to_bits(), "{a}");
        }
    }
    // Through the byte encoding too.
    let spec = QuantSpec::float(DataType::F16).unwrap();
    let mut bytes = vec![0u8; wide.len() * 2];
    encode_f32_to_bytes(&wide, &spec, &mut bytes).unwrap();
    for (i, a) in all.iter().enumerate() {
        if !a.is_nan() {
            assert_eq!([bytes[2 * i], bytes[2 * i + 1]], a.to_bits().to_le_bytes());
        }
    }
}

/// Every value of every 8-bit type survives dequantize -> quantize exactly (exhaustive), and so
/// does every 16-bit value (exhaustive, 65536 each).
#[test]
fn codes_survive_dequantize_quantize() {
    fn all<T: FixedPoint + PartialEq + std::fmt::Debug>(so: ScaleOffset) {
        for q in T::QMIN..=T::QMAX {
            let v = T::from_i32_saturating(q);
            assert_eq!(quantize::<T>(dequantize(v, so), so), v, "q={q} so={so:?}");
        }
    }
    for so in [
        ScaleOffset::new(0.1, -128).unwrap(),
        ScaleOffset::new(3.7e-3, 17).unwrap(),
        ScaleOffset::new(1.0 / 3.0, -40_000).unwrap(),
    ] {
        all::<u8>(so);
        all::<i8>(so);
        all::<u16>(so);
        all::<i16>(so);
    }
}

/// Per-axis along the middle axis of a 3-D array.
#[test]
fn per_axis_3d_middle_axis() {
    let x = Array3::from_shape_fn((2, 3, 4), |(a, b, c)| {
        a as f32 * 0.7 - b as f32 * 1.3 + c as f32 * 0.25
    });
    let params = [
        ScaleOffset::new(0.01, 0).unwrap(),
        ScaleOffset::new(0.05, -128).unwrap(),
        ScaleOffset::new(0.1, 64).unwrap(),
    ];
    let q = quantize_per_axis::<u8, _>(x.view(), 1, &params).unwrap();
    for ((a, b, c), &v) in x.indexed_iter() {
        assert_eq!(q[[a, b, c]], quantize::<u8>(v, params[b]), "{a},{b},{c}");
    }
}
