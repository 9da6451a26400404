//! Quantization of `ndarray` views, per tensor and per axis.

use ndarray::{Array, ArrayView, Dimension};

use crate::fixed::{FixedPoint, dequantize, quantize};
use crate::{QuantError, ScaleOffset};

/// Quantizes every element of `x` with one encoding (see [`quantize`]). The result has `x`'s
/// shape.
///
/// The scale is assumed valid ([`ScaleOffset::validate`]); an invalid one gives saturated
/// values, not a panic.
pub fn quantize_array<T: FixedPoint, D: Dimension>(
    x: ArrayView<'_, f32, D>,
    so: ScaleOffset,
) -> Array<T, D> {
    x.mapv(|v| quantize::<T>(v, so))
}

/// Dequantizes every element of `q` with one encoding (see [`dequantize`]). The result has
/// `q`'s shape.
pub fn dequantize_array<T: FixedPoint, D: Dimension>(
    q: ArrayView<'_, T, D>,
    so: ScaleOffset,
) -> Array<f32, D> {
    q.mapv(|v| dequantize(v, so))
}

/// Checks a per-axis encoding against an array shape and the scales in it.
fn check_per_axis(shape: &[usize], axis: usize, params: &[ScaleOffset]) -> Result<(), QuantError> {
    let ndim = shape.len();
    let Some(&expected) = shape.get(axis) else {
        return Err(QuantError::AxisOutOfRange { axis, ndim });
    };
    if params.len() != expected {
        return Err(QuantError::ParamCountMismatch {
            axis,
            expected,
            found: params.len(),
        });
    }
    for p in params {
        p.validate()?;
    }
    Ok(())
}

/// Maps `src` into a new standard-layout array of the same shape, giving `f` the encoding of
/// each element's index along `axis`.
///
/// Walks both arrays in logical (row-major) order: consecutive runs of `inner` elements (the
/// product of the dimensions after `axis`) share one index along `axis`, which then advances
/// cyclically. This works for every `Dimension` without needing `RemoveAxis`.
fn map_per_axis<A: Copy, B: Copy, D: Dimension>(
    src: ArrayView<'_, A, D>,
    axis: usize,
    params: &[ScaleOffset],
    init: B,
    f: impl Fn(A, ScaleOffset) -> B,
) -> Array<B, D> {
    let inner: usize = src.shape().iter().skip(axis + 1).product();
    let mut out = Array::from_elem(src.raw_dim(), init);
    let (mut index, mut run) = (0usize, 0usize);
    for (d, &v) in out.iter_mut().zip(src.iter()) {
        // params.len() equals the axis length, and a non-empty array has index < that length.
        if let Some(&so) = params.get(index) {
            *d = f(v, so);
        }
        run += 1;
        if run == inner {
            run = 0;
            index += 1;
            if index == params.len() {
                index = 0;
            }
        }
    }
    out
}

/// Quantizes `x` with one encoding per index along `axis`: the element at index `i` of that
/// axis uses `params[i]`.
///
/// Errors: [`QuantError::AxisOutOfRange`] when `axis >= x.ndim()`,
/// [`QuantError::ParamCountMismatch`] unless `params.len()` equals the axis length, and
/// [`QuantError::InvalidScale`] for any invalid scale.
pub fn quantize_per_axis<T: FixedPoint, D: Dimension>(
    x: ArrayView<'_, f32, D>,
    axis: usize,
    params: &[ScaleOffset],
) -> Result<Array<T, D>, QuantError> {
    check_per_axis(x.shape(), axis, params)?;
    Ok(map_per_axis(
        x,
        axis,
        params,
        T::from_i32_saturating(0),
        quantize::<T>,
    ))
}

/// Dequantizes `q` with one encoding per index along `axis` (the inverse of
/// [`quantize_per_axis`], with the same errors).
pub fn dequantize_per_axis<T: FixedPoint, D: Dimension>(
    q: ArrayView<'_, T, D>,
    axis: usize,
    params: &[ScaleOffset],
) -> Result<Array<f32, D>, QuantError> {
    check_per_axis(q.shape(), axis, params)?;
    Ok(map_per_axis(q, axis, params, 0.0f32, dequantize::<T>))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3, IxDyn, array};

    fn so(scale: f32, offset: i32) -> ScaleOffset {
        ScaleOffset::new(scale, offset).expect("valid scale")
    }

    #[test]
    fn per_tensor_matches_scalar_any_dimension() {
        let x = Array3::from_shape_fn((2, 3, 4), |(a, b, c)| {
            (a as f32 - 0.5) * 1.7 + b as f32 * 0.31 - c as f32 * 0.77
        });
        let s = so(0.05, -128);
        let q = quantize_array::<u8, _>(x.view(), s);
        assert_eq!(q.shape(), x.shape());
        for (qi, &xi) in q.iter().zip(x.iter()) {
            assert_eq!(*qi, quantize::<u8>(xi, s));
        }
        let back = dequantize_array(q.view(), s);
        for (b, qi) in back.iter().zip(q.iter()) {
            assert_eq!(*b, dequantize(*qi, s));
        }
        // Dynamic dimension and a non-contiguous (transposed) view.
        let xd = x.view().into_dyn();
        let qd = quantize_array::<i16, IxDyn>(xd, s);
        assert_eq!(qd.ndim(), 3);
        let xt = x.view().reversed_axes();
        let qt = quantize_array::<i8, _>(xt, so(0.02, 0));
        assert_eq!(qt[[3, 2, 1]], quantize::<i8>(x[[1, 2, 3]], so(0.02, 0)));
    }

    #[test]
    fn per_axis_2d_hand_computed() {
        let x: Array2<f32> = array![[1.0, -1.0, 0.5], [1.0, -1.0, 0.5]];
        // Row 0: scale 0.5, offset 0; row 1: scale 0.25, offset -10.
        let rows = [so(0.5, 0), so(0.25, -10)];
        let q = quantize_per_axis::<i8, _>(x.view(), 0, &rows).unwrap();
        assert_eq!(q, array![[2, -2, 1], [14, 6, 12]]);
        let back = dequantize_per_axis(q.view(), 0, &rows).unwrap();
        assert_eq!(back, x);
        // Along columns.
        let cols = [so(1.0, 0), so(0.5, 0), so(0.25, 0)];
        let q = quantize_per_axis::<i8, _>(x.view(), 1, &cols).unwrap();
        assert_eq!(q, array![[1, -2, 2], [1, -2, 2]]);
        let back = dequantize_per_axis(q.view(), 1, &cols).unwrap();
        assert_eq!(back, x);
    }

    #[test]
    fn per_axis_errors() {
        let x = Array2::<f32>::zeros((2, 3));
        let p2 = [so(1.0, 0); 2];
        assert_eq!(
            quantize_per_axis::<u8, _>(x.view(), 2, &p2),
            Err(QuantError::AxisOutOfRange { axis: 2, ndim: 2 })
        );
        assert_eq!(
            quantize_per_axis::<u8, _>(x.view(), 1, &p2),
            Err(QuantError::ParamCountMismatch {
                axis: 1,
                expected: 3,
                found: 2
            })
        );
        let bad = [
            so(1.0, 0),
            ScaleOffset {
                scale: 0.0,
                offset: 0,
            },
        ];
        assert_eq!(
            quantize_per_axis::<u8, _>(x.view(), 0, &bad),
            Err(QuantError::InvalidScale { scale: 0.0 })
        );
        let q = Array2::<u8>::zeros((2, 3));
        assert_eq!(
            dequantize_per_axis(q.view(), 5, &p2),
            Err(QuantError::AxisOutOfRange { axis: 5, ndim: 2 })
        );
        // A 0-dimensional array has no axis at all.
        let scalar = ndarray::arr0(1.0f32);
        assert_eq!(
            quantize_per_axis::<u8, _>(scalar.view(), 0, &[]),
            Err(QuantError::AxisOutOfRange { axis: 0, ndim: 0 })
        );
    }
}
