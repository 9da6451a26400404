//! Calibration observers against exact oracles computed from the sorted data.

use proptest::prelude::*;
use quant::{DataType, HistogramObserver, MinMaxObserver, Observer, ScaleOffset, Symmetry};

/// The value of 1-based rank `ceil(frac * n)` (at least 1) of `sorted`: the sample quantile
/// the histogram approximates.
fn exact_quantile(sorted: &[f32], frac: f64) -> f32 {
    let rank = ((frac * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A deterministic spread of `n` values over `[-1, 1]` (no RNG needed).
fn spread(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.618_034).fract() * 2.0) - 1.0)
        .collect()
}

#[test]
fn minmax_symmetric_vs_asymmetric() {
    let mut o = MinMaxObserver::new();
    o.observe(&[0.5, 4.0, 1.0, 0.0]);
    let asym = o.encoding(DataType::U8, Symmetry::Asymmetric).unwrap();
    assert_eq!(asym, ScaleOffset::new((4.0f64 / 255.0) as f32, 0).unwrap());
    let sym = o.encoding(DataType::U8, Symmetry::Symmetric).unwrap();
    assert_eq!(
        sym,
        ScaleOffset::new((4.0f64 / 127.0) as f32, -128).unwrap()
    );

    let mut o = MinMaxObserver::new();
    o.observe(&[-1.0, 3.0]);
    let sym = o.encoding(DataType::I8, Symmetry::Symmetric).unwrap();
    assert_eq!(sym, ScaleOffset::new((3.0f64 / 127.0) as f32, 0).unwrap());
    let asym = o.encoding(DataType::I8, Symmetry::Asymmetric).unwrap();
    // scale 4/255; offset = round(-1 / scale) - (-128) = -64 + 128.
    assert_eq!(asym, ScaleOffset::new((4.0f64 / 255.0) as f32, 64).unwrap());
    let sym16 = o.encoding(DataType::I16, Symmetry::Symmetric).unwrap();
    assert_eq!(
        sym16,
        ScaleOffset::new((3.0f64 / 32767.0) as f32, 0).unwrap()
    );
    let symu16 = o.encoding(DataType::U16, Symmetry::Symmetric).unwrap();
    assert_eq!(symu16.offset, -32768);
}

#[test]
fn percentile_clips_an_outlier() {
    let mut data = spread(10_000);
    // The outlier either arrives first (it sets the histogram range) or last (the range grows).
    for outlier_first in [true, false] {
        let mut h = HistogramObserver::new(2048, 99.9);
        let mut m = MinMaxObserver::new();
        if outlier_first {
            h.observe(&[1000.0]);
            m.observe(&[1000.0]);
        }
        for chunk in data.chunks(1000) {
            h.observe(chunk);
            m.observe(chunk);
        }
        if !outlier_first {
            h.observe(&[1000.0]);
            m.observe(&[1000.0]);
        }
        let max = data.iter().copied().fold(f32::MIN, f32::max);
        let min = data.iter().copied().fold(f32::MAX, f32::min);

        let (lo, hi) = h.clip_range(Symmetry::Asymmetric).unwrap();
        assert!(
            hi <= max && hi > 0.99,
            "outlier_first={outlier_first}: hi={hi}"
        );
        assert!(
            lo >= min && lo < -0.99,
            "outlier_first={outlier_first}: lo={lo}"
        );
        let (slo, shi) = h.clip_range(Symmetry::Symmetric).unwrap();
        assert!(
            shi <= 1.0 && shi > 0.99 && slo >= min && slo < -0.99,
            "{slo} {shi}"
        );

        let clipped = h.encoding(DataType::U8, Symmetry::Asymmetric).unwrap();
        let full = m.encoding(DataType::U8, Symmetry::Asymmetric).unwrap();
        assert!(clipped.scale < 2.0 / 255.0 * 1.01, "{clipped:?}");
        assert!(full.scale > 1000.0 / 255.0, "{full:?}");
        // The clipped encoding saturates the outlier.
        assert_eq!(quant::quantize::<u8>(1000.0, clipped), 255);
        assert_eq!(h.count(), 10_001);
    }
    // The same with the outlier on the negative side, symmetric.
    data.push(-500.0);
    let mut h = HistogramObserver::new(1024, 99.9);
    h.observe(&data);
    let (slo, shi) = h.clip_range(Symmetry::Symmetric).unwrap();
    assert!(
        shi <= 1.0 && shi > 0.98 && (-1.0..-0.98).contains(&slo),
        "{slo} {shi}"
    );
    let sym = h.encoding(DataType::I8, Symmetry::Symmetric).unwrap();
    assert_eq!(sym.offset, 0);
    assert!(sym.scale <= 1.0 / 127.0 * 1.001);
}

#[test]
fn non_finite_values_are_ignored_and_counted() {
    let mut h = HistogramObserver::new(64, 99.0);
    h.observe(&[f32::NAN, 1.0, f32::INFINITY, -1.0, f32::NEG_INFINITY]);
    assert_eq!(h.count(), 2);
    assert_eq!(h.non_finite_count(), 3);
    assert_eq!(h.observed_range(), Some((-1.0, 1.0)));
    let mut m = MinMaxObserver::new();
    m.observe(&[f32::NAN, 2.0]);
    assert_eq!((m.count(), m.non_finite_count()), (1, 1));
}

#[test]
fn empty_observers_have_no_encoding() {
    let m = MinMaxObserver::new();
    let h = HistogramObserver::new(128, 99.99);
    let mut only_nan = HistogramObserver::new(128, 99.99);
    only_nan.observe(&[f32::NAN, f32::INFINITY]);
    let observers: [&dyn Observer; 3] = [&m, &h, &only_nan];
    for o in observers {
        assert_eq!(
            o.encoding(DataType::U8, Symmetry::Asymmetric),
            Err(quant::QuantError::NoObservations)
        );
    }
    let msg = quant::QuantError::NoObservations.to_string();
    assert!(msg.contains("no finite values"), "{msg}");
}

#[test]
fn float_dtype_is_rejected() {
    let mut m = MinMaxObserver::new();
    m.observe(&[1.0]);
    assert!(matches!(
        m.encoding(DataType::F32, Symmetry::Asymmetric),
        Err(quant::QuantError::EncodingMismatch { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// MinMax equals the exact extremes, and a 100th-percentile histogram equals MinMax,
    /// whatever the batching (and hence the growth of the histogram range).
    #[test]
    fn histogram_at_100_equals_minmax(
        batches in prop::collection::vec(prop::collection::vec(-1e3f32..1e3, 0..50), 1..8),
        scale_up in prop::collection::vec(prop::sample::select(vec![1e-3f32, 1.0, 10.0, 1e3]), 8),
        bins in 1usize..300,
    ) {
        let mut m = MinMaxObserver::new();
        let mut h = HistogramObserver::new(bins, 100.0);
        let mut all = Vec::new();
        for (b, k) in batches.iter().zip(&scale_up) {
            let scaled: Vec<f32> = b.iter().map(|v| v * k).collect();
            m.observe(&scaled);
            h.observe(&scaled);
            all.extend(scaled);
        }
        if all.is_empty() {
            prop_assert_eq!(m.range(), None);
            return Ok(());
        }
        let min = all.iter().copied().fold(f32::INFINITY, f32::min);
        let max = all.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        prop_assert_eq!(m.range(), Some((min, max)));
        for sym in [Symmetry::Asymmetric, Symmetry::Symmetric] {
            for dtype in [DataType::U8, DataType::I16] {
                prop_assert_eq!(h.encoding(dtype, sym), m.encoding(dtype, sym));
            }
        }
        prop_assert_eq!(h.clip_range(Symmetry::Asymmetric).unwrap(), (min, max));
    }

    /// The clip points are within one histogram bin of the exact sample quantiles.
    #[test]
    fn percentiles_within_one_bin_of_exact(
        data in prop::collection::vec(-100f32..100.0, 1..2000),
        outliers in prop::collection::vec(-1e4f32..1e4, 0..3),
        p in prop::sample::select(vec![99.0f64, 99.9, 95.0, 75.0]),
        bins in prop::sample::select(vec![64usize, 512, 2048]),
        split in 0.0f64..1.0,
    ) {
        let mut all = data.clone();
        all.extend(&outliers);
        let mut h = HistogramObserver::new(bins, p);
        let cut = (split * all.len() as f64) as usize;
        h.observe(&all[..cut]);
        h.observe(&all[cut..]);
        let width = h.histogram_limit() / bins as f64;
        let tol = width as f32 * 1.0001 + 1e-6;

        let mut sorted = all.clone();
        sorted.sort_by(f32::total_cmp);
        let frac = p / 100.0;
        let (lo, hi) = h.clip_range(Symmetry::Asymmetric).unwrap();
        let exact_hi = exact_quantile(&sorted, frac);
        let exact_lo = exact_quantile(&sorted, 1.0 - frac);
        prop_assert!((hi - exact_hi).abs() <= tol, "hi {} exact {} tol {}", hi, exact_hi, tol);
        prop_assert!((lo - exact_lo).abs() <= tol, "lo {} exact {} tol {}", lo, exact_lo, tol);

        let mut mags: Vec<f32> = all.iter().map(|v| v.abs()).collect();
        mags.sort_by(f32::total_cmp);
        let t = exact_quantile(&mags, frac);
        let (slo, shi) = h.clip_range(Symmetry::Symmetric).unwrap();
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        prop_assert!((shi - t.min(max)).abs() <= tol, "shi {} t {} max {}", shi, t, max);
        prop_assert!((slo - (-t).max(min)).abs() <= tol, "slo {} t {} min {}", slo, t, min);
    }
}
