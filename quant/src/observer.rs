//! Calibration observers: turn the values a tensor takes into an encoding.

use crate::{DataType, QuantError, ScaleOffset, Symmetry};

/// Accumulates the values a tensor takes during calibration and turns them into an encoding.
///
/// Non-finite inputs (`NaN`, `±inf`) are ignored by every observer of this crate; they are
/// counted, and each observer reports the count (`non_finite_count`).
pub trait Observer {
    /// Records a batch of values.
    fn observe(&mut self, values: &[f32]);
    /// The encoding of `dtype` for everything observed so far (see
    /// [`ScaleOffset::from_range`] for how a range becomes an encoding).
    ///
    /// Errors: [`QuantError::NoObservations`] before any finite value was observed, and the
    /// errors of [`ScaleOffset::from_range`] (e.g. a float `dtype`).
    fn encoding(&self, dtype: DataType, symmetry: Symmetry) -> Result<ScaleOffset, QuantError>;
}

/// Tracks the exact minimum and maximum of the finite values observed.
#[derive(Debug, Clone, PartialEq)]
pub struct MinMaxObserver {
    min: f32,
    max: f32,
    count: u64,
    non_finite: u64,
}

impl Default for MinMaxObserver {
    fn default() -> Self {
        Self::new()
    }
}

impl MinMaxObserver {
    /// An observer that has seen nothing.
    pub fn new() -> Self {
        MinMaxObserver {
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            count: 0,
            non_finite: 0,
        }
    }

    /// `(min, max)` of the finite values observed; `None` before the first one.
    pub fn range(&self) -> Option<(f32, f32)> {
        (self.count > 0).then_some((self.min, self.max))
    }

    /// Number of finite values observed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Number of non-finite values (`NaN`, `±inf`) seen and ignored.
    pub fn non_finite_count(&self) -> u64 {
        self.non_finite
    }

    /// Forgets everything observed.
    pub fn reset(&mut self) {
        *self = Self::new();
    }
}

impl Observer for MinMaxObserver {
    fn observe(&mut self, values: &[f32]) {
        for &v in values {
            if v.is_finite() {
                self.min = self.min.min(v);
                self.max = self.max.max(v);
                self.count += 1;
            } else {
                self.non_finite += 1;
            }
        }
    }

    /// The encoding of the exact observed range `[min, max]`.
    fn encoding(&self, dtype: DataType, symmetry: Symmetry) -> Result<ScaleOffset, QuantError> {
        let (min, max) = self.range().ok_or(QuantError::NoObservations)?;
        ScaleOffset::from_range(min, max, dtype, symmetry)
    }
}

/// One histogram bin of magnitudes: how many values fell in it and the smallest and largest
/// magnitude among them (used to interpolate inside the bin).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bin {
    count: u64,
    lo: f32,
    hi: f32,
}

impl Bin {
    const EMPTY: Bin = Bin {
        count: 0,
        lo: f32::INFINITY,
        hi: 0.0,
    };

    fn add(&mut self, a: f32) {
        self.count += 1;
        self.lo = self.lo.min(a);
        self.hi = self.hi.max(a);
    }

    fn merge(&mut self, o: &Bin) {
        if o.count > 0 {
            self.count += o.count;
            self.lo = self.lo.min(o.lo);
            self.hi = self.hi.max(o.hi);
        }
    }
}

/// Clips outliers: the encoding covers a percentile of the observed values instead of their
/// full range.
///
/// * [`Symmetry::Symmetric`]: the range is `[-t, t]` (intersected with the observed range)
///   where `t` is the `percentile`-th percentile of `|x|`.
/// * [`Symmetry::Asymmetric`]: each tail is clipped separately: the range is from the
///   `(100 - percentile)`-th to the `percentile`-th percentile of `x`.
///
/// With `percentile = 100` the result is exactly [`MinMaxObserver`]'s.
///
/// **Histogram.** Two histograms of `bins` bins each count the magnitudes `|x|` of the
/// non-negative and the negative values over `[0, limit]`. `limit` is set by the first batch
/// with a nonzero value (its largest magnitude) and **grows by doubling** when a later value is
/// larger: doubling merges bins pairwise, which is exact (bin `i` of width `w` lies inside bin
/// `i / 2` of width `2w`), so nothing is re-read and the observer works in one pass. The cost
/// is resolution: the final bin width is at most twice `max|x| / bins`. Each bin also keeps
/// the smallest and largest magnitude it received, and a percentile interpolates linearly
/// between those, so a bin that contains only the top of the distribution does not stretch the
/// clip point to the bin's edge. Percentiles are clamped to the exact observed `[min, max]`.
///
/// Non-finite values are ignored and counted ([`Self::non_finite_count`]).
///
/// A configuration outside `1..=`[`Self::MAX_BINS`] bins or a percentile outside `(50, 100]`
/// is accepted by [`Self::new`] (which never fails) and reported by [`Observer::encoding`]
/// and [`Self::clip_range`]; [`Self::try_new`] rejects it up front.
#[derive(Debug, Clone)]
pub struct HistogramObserver {
    bins: usize,
    percentile: f64,
    /// Magnitudes of values `>= 0` (including `-0.0`).
    pos: Vec<Bin>,
    /// Magnitudes of values `< 0`.
    neg: Vec<Bin>,
    /// The histograms cover magnitudes `[0, limit]`; 0 until a nonzero value arrives (all
    /// values so far are then zeros, in bin 0).
    limit: f64,
    minmax: MinMaxObserver,
}

impl HistogramObserver {
    /// The largest number of bins accepted.
    pub const MAX_BINS: usize = 1 << 20;

    /// An observer with `bins` bins per sign that clips at `percentile` (e.g. `99.99`).
    /// Never fails; an invalid configuration is reported by [`Observer::encoding`].
    pub fn new(bins: usize, percentile: f64) -> Self {
        let n = if Self::config_ok(bins, percentile) {
            bins
        } else {
            0
        };
        HistogramObserver {
            bins,
            percentile,
            pos: vec![Bin::EMPTY; n],
            neg: vec![Bin::EMPTY; n],
            limit: 0.0,
            minmax: MinMaxObserver::new(),
        }
    }

    /// Like [`Self::new`], but rejects `bins` outside `1..=MAX_BINS` and a percentile outside
    /// `(50, 100]` with [`QuantError::InvalidHistogramConfig`].
    pub fn try_new(bins: usize, percentile: f64) -> Result<Self, QuantError> {
        if Self::config_ok(bins, percentile) {
            Ok(Self::new(bins, percentile))
        } else {
            Err(Self::config_error(bins, percentile))
        }
    }

    fn config_ok(bins: usize, percentile: f64) -> bool {
        (1..=Self::MAX_BINS).contains(&bins) && percentile > 50.0 && percentile <= 100.0
    }

    fn config_error(bins: usize, percentile: f64) -> QuantError {
        QuantError::InvalidHistogramConfig {
            bins,
            percentile,
            max_bins: Self::MAX_BINS,
        }
    }

    /// Number of finite values observed.
    pub fn count(&self) -> u64 {
        self.minmax.count()
    }

    /// Number of non-finite values seen and ignored.
    pub fn non_finite_count(&self) -> u64 {
        self.minmax.non_finite_count()
    }

    /// The exact `(min, max)` of the finite values observed; `None` before the first one.
    pub fn observed_range(&self) -> Option<(f32, f32)> {
        self.minmax.range()
    }

    /// The magnitude range the histograms currently cover, `[0, limit]`.
    pub fn histogram_limit(&self) -> f64 {
        self.limit
    }

    /// Grows `limit` by doublings until it covers `peak`, merging bins accordingly.
    fn grow(&mut self, peak: f64) {
        if self.limit == 0.0 {
            // Everything so far was a zero, which stays in bin 0 whatever the width.
            self.limit = peak;
            return;
        }
        let mut doublings = 0u32;
        while self.limit < peak {
            self.limit *= 2.0;
            doublings += 1;
        }
        for hist in [&mut self.pos, &mut self.neg] {
            let mut merged = vec![Bin::EMPTY; hist.len()];
            for (i, b) in hist.iter().enumerate() {
                let j = i.checked_shr(doublings).unwrap_or(0);
                if let Some(m) = merged.get_mut(j) {
                    m.merge(b);
                }
            }
            *hist = merged;
        }
    }

    /// Bin index of magnitude `a` (`0 <= a <= limit`).
    fn bin_of(&self, a: f64) -> usize {
        let n = self.pos.len();
        if self.limit <= 0.0 {
            return 0;
        }
        // Truncation of a non-negative value; a == limit goes to the last bin.
        ((a / self.limit * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// The value below which `frac` of the values lie, walking `segments` in ascending order of
    /// value; each segment is `(lowest value, highest value, count)`.
    fn quantile(segments: impl Iterator<Item = (f64, f64, u64)>, total: u64, frac: f64) -> f64 {
        let target = frac * total as f64;
        let mut cumulative = 0.0;
        let mut last = 0.0;
        for (lo, hi, count) in segments {
            if count == 0 {
                continue;
            }
            let next = cumulative + count as f64;
            if next >= target {
                let t = ((target - cumulative) / count as f64).clamp(0.0, 1.0);
                return lo + (hi - lo) * t;
            }
            cumulative = next;
            last = hi;
        }
        last
    }

    /// The range the encoding will cover: the percentile clip of the observed values for
    /// `symmetry` (before [`ScaleOffset::from_range`] widens it to include 0).
    ///
    /// Errors: [`QuantError::InvalidHistogramConfig`], [`QuantError::NoObservations`].
    pub fn clip_range(&self, symmetry: Symmetry) -> Result<(f32, f32), QuantError> {
        if !Self::config_ok(self.bins, self.percentile) {
            return Err(Self::config_error(self.bins, self.percentile));
        }
        let (min, max) = self.minmax.range().ok_or(QuantError::NoObservations)?;
        let total = self.minmax.count();
        let p = self.percentile / 100.0;
        let (lo, hi) = match symmetry {
            Symmetry::Symmetric => {
                let segments = self.pos.iter().zip(&self.neg).map(|(a, b)| {
                    let mut m = *a;
                    m.merge(b);
                    (f64::from(m.lo), f64::from(m.hi), m.count)
                });
                let t = Self::quantile(segments, total, p);
                (f64::from(min).max(-t), f64::from(max).min(t))
            }
            Symmetry::Asymmetric => {
                let ascending = || {
                    let negatives = self
                        .neg
                        .iter()
                        .rev()
                        .map(|b| (-f64::from(b.hi), -f64::from(b.lo), b.count));
                    let positives = self
                        .pos
                        .iter()
                        .map(|b| (f64::from(b.lo), f64::from(b.hi), b.count));
                    negatives.chain(positives)
                };
                let lo = Self::quantile(ascending(), total, 1.0 - p);
                let hi = Self::quantile(ascending(), total, p);
                let clamp = |v: f64| v.clamp(f64::from(min), f64::from(max));
                (clamp(lo), clamp(hi))
            }
        };
        // Both bounds are observed f32 values or interpolations between them: the casts are
        // exact or round once.
        Ok((lo as f32, (hi as f32).max(lo as f32)))
    }
}

impl Observer for HistogramObserver {
    fn observe(&mut self, values: &[f32]) {
        self.minmax.observe(values);
        if self.pos.is_empty() {
            return; // invalid configuration: reported by encoding()
        }
        let peak = values
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, &v| m.max(f64::from(v.abs())));
        if peak > self.limit {
            self.grow(peak);
        }
        for &v in values {
            if !v.is_finite() {
                continue;
            }
            let a = v.abs();
            let i = self.bin_of(f64::from(a));
            let hist = if v < 0.0 {
                &mut self.neg
            } else {
                &mut self.pos
            };
            if let Some(b) = hist.get_mut(i) {
                b.add(a);
            }
        }
    }

    /// The encoding of [`HistogramObserver::clip_range`].
    fn encoding(&self, dtype: DataType, symmetry: Symmetry) -> Result<ScaleOffset, QuantError> {
        let (lo, hi) = self.clip_range(symmetry)?;
        ScaleOffset::from_range(lo, hi, dtype, symmetry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minmax_tracks_exact_range_and_ignores_non_finite() {
        let mut o = MinMaxObserver::new();
        assert_eq!(
            o.encoding(DataType::U8, Symmetry::Asymmetric),
            Err(QuantError::NoObservations)
        );
        o.observe(&[1.0, f32::NAN, -2.0, f32::INFINITY]);
        o.observe(&[0.5, f32::NEG_INFINITY, 3.0]);
        assert_eq!(o.range(), Some((-2.0, 3.0)));
        assert_eq!(o.count(), 4);
        assert_eq!(o.non_finite_count(), 3);
        assert_eq!(
            o.encoding(DataType::I8, Symmetry::Asymmetric),
            ScaleOffset::from_range(-2.0, 3.0, DataType::I8, Symmetry::Asymmetric)
        );
        o.reset();
        assert_eq!(o.range(), None);
        o.observe(&[f32::NAN]);
        assert_eq!(
            o.encoding(DataType::U8, Symmetry::Symmetric),
            Err(QuantError::NoObservations)
        );
    }

    #[test]
    fn growth_merges_bins_exactly() {
        let mut h = HistogramObserver::new(8, 100.0);
        h.observe(&[0.0, 0.0]);
        assert_eq!(h.histogram_limit(), 0.0);
        h.observe(&[1.0, -0.5, 0.1]);
        assert_eq!(h.histogram_limit(), 1.0);
        h.observe(&[3.0]);
        assert_eq!(h.histogram_limit(), 4.0);
        let pos: Vec<u64> = h.pos.iter().map(|b| b.count).collect();
        let neg: Vec<u64> = h.neg.iter().map(|b| b.count).collect();
        // At width 0.125, 1.0 sat in the last bin [0.875, 1] and -0.5 in bin 4 [0.5, 0.625);
        // two doublings merge groups of four: both land in bin 1 [0.5, 1) of width 0.5.
        // 3.0 is binned directly at width 0.5: bin 6.
        assert_eq!(pos, [3, 1, 0, 0, 0, 0, 1, 0]);
        assert_eq!(neg, [0, 1, 0, 0, 0, 0, 0, 0]);
        // A huge jump collapses everything seen so far into bin 0 without panicking; the new
        // value itself lands in the last bin (limit = 4 * 2^126 = 2^128 just above f32::MAX).
        h.observe(&[f32::MAX]);
        assert_eq!(h.histogram_limit(), 2f64.powi(128));
        assert_eq!(h.pos[0].count, 5);
        assert_eq!(h.pos[7].count, 1);
        assert_eq!(h.neg[0].count, 1);
        assert_eq!(h.count(), 7);
        assert_eq!(h.clip_range(Symmetry::Asymmetric), Ok((-0.5, f32::MAX)));
    }

    #[test]
    fn invalid_config_is_reported() {
        for (bins, p) in [
            (0, 99.0),
            (16, 50.0),
            (16, 100.5),
            (16, f64::NAN),
            (usize::MAX, 99.0),
        ] {
            assert!(HistogramObserver::try_new(bins, p).is_err());
            let mut h = HistogramObserver::new(bins, p);
            h.observe(&[1.0, 2.0]);
            assert!(matches!(
                h.encoding(DataType::U8, Symmetry::Asymmetric),
                Err(QuantError::InvalidHistogramConfig { .. })
            ));
        }
        let h = HistogramObserver::try_new(16, 99.0).unwrap();
        assert_eq!(
            h.encoding(DataType::U8, Symmetry::Asymmetric),
            Err(QuantError::NoObservations)
        );
    }
}
