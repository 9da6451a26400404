//! Hand-computed cases of the convention, and every error path of the public API.

use half::f16;
use ndarray::{Array2, array};
use quant::{
    DataType, Encoding, HistogramObserver, MinMaxObserver, Observer, QuantError, QuantSpec,
    ScaleOffset, Symmetry, decode_bytes_to_f32, dequantize, dequantize_per_axis, dequantize_slice,
    encode_f32_to_bytes, f16_to_f32_slice, f32_to_f16_slice, quantize, quantize_per_axis,
    quantize_slice, quantize_value, requantize_slice,
};

fn so(scale: f32, offset: i32) -> ScaleOffset {
    ScaleOffset::new(scale, offset).expect("valid scale")
}

#[test]
fn ties_away_from_zero_every_type() {
    let half = so(0.5, 0);
    for dtype in [DataType::I8, DataType::I16] {
        assert_eq!(quantize_value(0.25, dtype, half), 1);
        assert_eq!(quantize_value(-0.25, dtype, half), -1);
        assert_eq!(quantize_value(1.25, dtype, half), 3);
        assert_eq!(quantize_value(-1.25, dtype, half), -3);
    }
    // Unsigned types see ties only through the offset: round happens before it.
    assert_eq!(quantize::<u8>(0.25, so(0.5, -128)), 129);
    assert_eq!(quantize::<u8>(-0.25, so(0.5, -128)), 127);
    assert_eq!(quantize::<u16>(-0.25, so(0.5, -32768)), 32767);
    // Ties to even would give 0 and 2 here.
    assert_eq!(quantize::<i8>(0.25, half), 1);
    assert_eq!(quantize::<i8>(0.75, half), 2);
}

#[test]
fn qnn_convention_examples() {
    // u8, zero point 128 (offset -128), scale 1/128: codes cover [-1, 127/128].
    let s = so(1.0 / 128.0, -128);
    assert_eq!(quantize::<u8>(-1.0, s), 0);
    assert_eq!(quantize::<u8>(0.0, s), 128);
    assert_eq!(quantize::<u8>(0.5, s), 192);
    assert_eq!(quantize::<u8>(1.0, s), 255); // saturated: 1.0 needs code 256
    assert_eq!(dequantize::<u8>(192, s), 0.5);
    assert_eq!(
        s.representable_range(DataType::U8),
        Some((-1.0, 127.0 / 128.0))
    );
    // u16, offset -32768.
    let s = so(2.0f32.powi(-12), -32768);
    assert_eq!(quantize::<u16>(-8.0, s), 0);
    assert_eq!(quantize::<u16>(1.0, s), 32768 + 4096);
    assert_eq!(dequantize::<u16>(0, s), -8.0);
    // i16 symmetric from a range: scale = 2 / 32767.
    let s = ScaleOffset::from_range(-2.0, 0.5, DataType::I16, Symmetry::Symmetric).unwrap();
    assert_eq!(s.offset, 0);
    assert_eq!(quantize::<i16>(-2.0, s), -32767);
    assert_eq!(quantize::<i16>(2.0, s), 32767);
    assert_eq!(quantize::<i16>(-2.1, s), -32768);
    assert_eq!(quantize::<i16>(1.0, s), 16384); // 16383.5 rounds away from zero
    // A positive offset (negative zero point) on a signed type.
    let s = so(0.25, 10);
    assert_eq!(quantize::<i8>(0.0, s), -10);
    assert_eq!(dequantize::<i8>(-10, s), 0.0);
    assert_eq!(dequantize::<i8>(127, s), 34.25);
}

#[test]
fn requantize_u8_to_i16_hand_computed() {
    let from = so(0.5, -128);
    let to = so(0.25, 0);
    let src = [0u8, 128, 129, 255];
    let mut dst = [0i16; 4];
    requantize_slice(&src, from, &mut dst, to).unwrap();
    // real: -64, 0, 0.5, 63.5 -> codes / 0.25
    assert_eq!(dst, [-256, 0, 2, 254]);
    let mut narrow = [0i8; 4];
    requantize_slice(&src, from, &mut narrow, to).unwrap();
    assert_eq!(narrow, [-128, 0, 2, 127]);
}

#[test]
fn bad_scale_is_rejected() {
    for scale in [0.0f32, -0.5, f32::INFINITY, f32::NAN] {
        assert!(matches!(
            ScaleOffset::new(scale, 0),
            Err(QuantError::InvalidScale { .. })
        ));
        let bad = ScaleOffset { scale, offset: 0 };
        assert!(bad.validate().is_err());
        let good = so(1.0, 0);
        let is_bad = |r: Result<(), QuantError>| matches!(r, Err(QuantError::InvalidScale { .. }));
        assert!(is_bad(quantize_slice(&[1.0], &mut [0u8], bad)));
        assert!(is_bad(dequantize_slice(&[1u8], &mut [0.0], bad)));
        assert!(is_bad(requantize_slice(&[1u8], bad, &mut [0i8], good)));
        assert!(is_bad(requantize_slice(&[1u8], good, &mut [0i8], bad)));
        let x = Array2::<f32>::zeros((2, 2));
        assert!(matches!(
            quantize_per_axis::<u8, _>(x.view(), 0, &[good, bad]),
            Err(QuantError::InvalidScale { .. })
        ));
        let spec = QuantSpec {
            dtype: DataType::U16,
            encoding: Encoding::PerTensor(bad),
        };
        assert!(is_bad(encode_f32_to_bytes(&[1.0], &spec, &mut [0u8; 2])));
        assert!(is_bad(decode_bytes_to_f32(&[0u8; 2], &spec, &mut [0.0])));
    }
}

#[test]
fn length_mismatches() {
    let s = so(1.0, 0);
    let e = quantize_slice(&[1.0, 2.0], &mut [0u8; 3], s).unwrap_err();
    assert!(matches!(
        e,
        QuantError::LengthMismatch {
            expected: 2,
            found: 3,
            ..
        }
    ));
    assert!(e.to_string().contains("expected 2, found 3"), "{e}");
    assert!(matches!(
        dequantize_slice(&[1i16; 4], &mut [0.0; 2], s),
        Err(QuantError::LengthMismatch {
            expected: 4,
            found: 2,
            ..
        })
    ));
    assert!(matches!(
        requantize_slice(&[1u16; 4], s, &mut [0u8; 5], s),
        Err(QuantError::LengthMismatch {
            expected: 4,
            found: 5,
            ..
        })
    ));
    assert!(matches!(
        f32_to_f16_slice(&[1.0; 3], &mut [f16::ZERO; 2]),
        Err(QuantError::LengthMismatch {
            expected: 3,
            found: 2,
            ..
        })
    ));
    assert!(matches!(
        f16_to_f32_slice(&[f16::ONE; 1], &mut [0.0; 2]),
        Err(QuantError::LengthMismatch {
            expected: 1,
            found: 2,
            ..
        })
    ));
    let spec = QuantSpec::float(DataType::F32).unwrap();
    assert!(matches!(
        encode_f32_to_bytes(&[1.0; 2], &spec, &mut [0u8; 7]),
        Err(QuantError::LengthMismatch {
            expected: 8,
            found: 7,
            ..
        })
    ));
    assert!(matches!(
        decode_bytes_to_f32(&[0u8; 9], &spec, &mut [0.0; 2]),
        Err(QuantError::LengthMismatch {
            expected: 8,
            found: 9,
            ..
        })
    ));
}

#[test]
fn per_axis_shape_errors() {
    let x: Array2<f32> = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let p3 = [so(1.0, 0); 3];
    assert_eq!(
        quantize_per_axis::<i8, _>(x.view(), 2, &p3),
        Err(QuantError::AxisOutOfRange { axis: 2, ndim: 2 })
    );
    assert_eq!(
        quantize_per_axis::<i8, _>(x.view(), 0, &p3),
        Err(QuantError::ParamCountMismatch {
            axis: 0,
            expected: 2,
            found: 3
        })
    );
    let q = quantize_per_axis::<i8, _>(x.view(), 1, &p3).unwrap();
    assert_eq!(q, array![[1, 2, 3], [4, 5, 6]]);
    assert_eq!(
        dequantize_per_axis(q.view(), 0, &p3),
        Err(QuantError::ParamCountMismatch {
            axis: 0,
            expected: 2,
            found: 3
        })
    );
    let msg = QuantError::ParamCountMismatch {
        axis: 0,
        expected: 2,
        found: 3,
    }
    .to_string();
    assert!(msg.contains("needs 2") && msg.contains("found 3"), "{msg}");
}

#[test]
fn observer_errors() {
    assert_eq!(
        MinMaxObserver::new().encoding(DataType::I8, Symmetry::Symmetric),
        Err(QuantError::NoObservations)
    );
    assert_eq!(
        HistogramObserver::new(256, 99.99).encoding(DataType::I8, Symmetry::Symmetric),
        Err(QuantError::NoObservations)
    );
    assert!(matches!(
        HistogramObserver::try_new(0, 99.0),
        Err(QuantError::InvalidHistogramConfig { bins: 0, .. })
    ));
    assert!(matches!(
        ScaleOffset::from_range(2.0, 1.0, DataType::U8, Symmetry::Asymmetric),
        Err(QuantError::InvalidRange { min, max }) if min == 2.0 && max == 1.0
    ));
}

#[test]
fn encodings_that_do_not_fit_the_type() {
    let cases = [
        QuantSpec {
            dtype: DataType::I8,
            encoding: Encoding::Float,
        },
        QuantSpec {
            dtype: DataType::F32,
            encoding: Encoding::PerTensor(so(1.0, 0)),
        },
        QuantSpec {
            dtype: DataType::I16,
            encoding: Encoding::PerAxis {
                axis: 0,
                params: vec![so(1.0, 0)],
            },
        },
    ];
    for spec in &cases {
        let size = spec.dtype.size_bytes();
        let mut bytes = vec![0u8; size];
        assert!(
            matches!(
                encode_f32_to_bytes(&[1.0], spec, &mut bytes),
                Err(QuantError::EncodingMismatch { .. })
            ),
            "{spec:?}"
        );
        assert!(matches!(
            decode_bytes_to_f32(&bytes, spec, &mut [0.0]),
            Err(QuantError::EncodingMismatch { .. })
        ));
    }
}
