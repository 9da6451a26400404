//! KV saturation: how many of the K/V codes the graphs wrote sit at their encoding's extremes.
//!
//! A fixed-point K/V value outside its calibrated range is clipped to the smallest or largest code
//! (0 or 255 for u8, 0 or 65535 for u16): on a device, the first sign of an encoding that does not
//! fit the text ("garbage output"). Counting is opt-in ([`crate::KvCache::set_saturation_counting`]):
//! when on, the cache scans the rows each commit keeps, where the graph just wrote them, per buffer
//! (layer, KV head, K or V) as contiguous slices ([`count_saturated_bytes`]); when off (the default),
//! a commit reads no code. Float caches never saturate. Only the committed rows count (rejected
//! speculative rows do not).

use crate::{Geometry, TensorKind};
use quant::{DataType, QuantSpec};

/// Saturated codes and codes written, of one buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferSaturation {
    /// Codes at the smallest or the largest value of the data type.
    pub saturated: u64,
    /// Codes written (committed rows × head dim).
    pub values: u64,
}

impl BufferSaturation {
    /// The saturated fraction (0 when nothing was written).
    pub fn rate(&self) -> f64 {
        if self.values == 0 {
            0.0
        } else {
            self.saturated as f64 / self.values as f64
        }
    }
}

/// Per-buffer saturation counts since the cache was made (or reset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saturation {
    /// Indexed by [`Geometry::buffer_index`].
    pub buffers: Vec<BufferSaturation>,
}

/// The most saturated buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Worst {
    pub layer: usize,
    pub head: usize,
    pub kind: TensorKind,
    pub counts: BufferSaturation,
}

impl Saturation {
    /// Zeroed counts for `buffers` buffers.
    pub fn new(buffers: usize) -> Saturation {
        Saturation {
            buffers: vec![BufferSaturation::default(); buffers],
        }
    }

    /// Every buffer's counts added up.
    pub fn total(&self) -> BufferSaturation {
        self.buffers
            .iter()
            .fold(BufferSaturation::default(), |a, b| BufferSaturation {
                saturated: a.saturated + b.saturated,
                values: a.values + b.values,
            })
    }

    /// The buffer with the highest saturated fraction (ties: the first), if any code saturated.
    pub fn worst(&self, geometry: &Geometry) -> Option<Worst> {
        let (index, counts) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.saturated > 0)
            .max_by(|a, b| a.1.rate().total_cmp(&b.1.rate()).then(b.0.cmp(&a.0)))?;
        let (layer, head, kind) = geometry.buffer_coords(index);
        Some(Worst {
            layer,
            head,
            kind,
            counts: *counts,
        })
    }
}

/// The two extreme codes of a fixed-point type, as the unsigned little-endian bit pattern read
/// from the region; `None` for float types.
fn extremes(dtype: DataType) -> Option<[u16; 2]> {
    match dtype {
        DataType::U8 => Some([0, 0xFF]),
        DataType::I8 => Some([0x80, 0x7F]),
        DataType::U16 => Some([0, 0xFFFF]),
        DataType::I16 => Some([0x8000, 0x7FFF]),
        _ => None,
    }
}

/// Counts the saturated codes among `codes` (little-endian elements of `spec`'s type), one at a
/// time: the plain statement of what [`count_saturated_bytes`] computes.
pub fn count_saturated(spec: &QuantSpec, codes: impl Iterator<Item = u16>) -> (u64, u64) {
    let Some([lo, hi]) = extremes(spec.dtype) else {
        return (0, 0);
    };
    codes.fold((0, 0), |(s, n), c| {
        (s + u64::from(c == lo || c == hi), n + 1)
    })
}

/// The saturated codes among `bytes`, the little-endian elements of `dtype` side by side (0 for a
/// float type). A straight scan the compiler vectorizes: blocks small enough for a narrow
/// per-lane count.
pub fn count_saturated_bytes(dtype: DataType, bytes: &[u8]) -> u64 {
    let Some([lo, hi]) = extremes(dtype) else {
        return 0;
    };
    match dtype.size_bytes() {
        1 => count_u8(bytes, lo as u8, hi as u8),
        _ => count_u16(bytes, lo, hi),
    }
}

/// Elements per block of the scans: each lane's count fits a `u16`.
const BLOCK: usize = 4096;

fn count_u8(bytes: &[u8], lo: u8, hi: u8) -> u64 {
    bytes
        .chunks(BLOCK)
        .map(|block| {
            let n: u16 = block
                .iter()
                .map(|&b| u16::from((b == lo) | (b == hi)))
                .sum();
            u64::from(n)
        })
        .sum()
}

fn count_u16(bytes: &[u8], lo: u16, hi: u16) -> u64 {
    bytes
        .chunks(2 * BLOCK)
        .map(|block| {
            let n: u16 = (block.chunks_exact(2))
                .map(|c| {
                    let v = u16::from_le_bytes([c[0], c[1]]);
                    u16::from((v == lo) | (v == hi))
                })
                .sum();
            u64::from(n)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quant::ScaleOffset;

    fn spec(dtype: DataType) -> QuantSpec {
        QuantSpec::per_tensor(dtype, ScaleOffset::new(0.1, 0).unwrap()).unwrap()
    }

    #[test]
    fn only_the_extreme_codes_count() {
        let u8s = [0u16, 1, 254, 255, 128];
        assert_eq!(
            count_saturated(&spec(DataType::U8), u8s.into_iter()),
            (2, 5)
        );
        let u16s = [0u16, 65535, 65534, 1];
        assert_eq!(
            count_saturated(&spec(DataType::U16), u16s.into_iter()),
            (2, 4)
        );
        let i8s = [0x80u16, 0x7F, 0x81, 0];
        assert_eq!(
            count_saturated(&spec(DataType::I8), i8s.into_iter()),
            (2, 4)
        );
        let f16 = QuantSpec::float(DataType::F16).unwrap();
        assert_eq!(count_saturated(&f16, [0u16, 0xFFFF].into_iter()), (0, 0));
    }

    proptest::proptest! {
        /// The block scan counts what the one-code-at-a-time count counts, on random codes with
        /// many at the extremes, across block boundaries, for every fixed-point type (and none for
        /// a float type).
        #[test]
        fn the_block_scan_counts_as_the_plain_count(
            pick in 0usize..5,
            codes in proptest::collection::vec((0u8..4, proptest::prelude::any::<u16>()), 0..3 * BLOCK),
        ) {
            let dtype = [DataType::U8, DataType::I8, DataType::U16, DataType::I16, DataType::F16][pick];
            let size = dtype.size_bytes();
            let [lo, hi] = extremes(dtype).unwrap_or([0, 0xFFFF]);
            let mask = if size == 1 { 0xFF } else { 0xFFFF };
            // One code in four is each extreme, the rest anything (the extremes again, by chance).
            let codes: Vec<u16> = (codes.iter())
                .map(|&(k, v)| match k { 0 => lo, 1 => hi, _ => v & mask })
                .collect();
            let bytes: Vec<u8> = (codes.iter())
                .flat_map(|c| c.to_le_bytes().into_iter().take(size))
                .collect();
            let spec = match dtype {
                DataType::F16 => QuantSpec::float(dtype).unwrap(),
                _ => spec(dtype),
            };
            let (plain, _) = count_saturated(&spec, codes.iter().copied());
            proptest::prop_assert_eq!(count_saturated_bytes(dtype, &bytes), plain);
        }
    }

    #[test]
    fn the_worst_buffer_is_the_highest_rate() {
        let g = Geometry::new(2, 2, 4, 16, &[1], DataType::U8);
        let mut s = Saturation::new(g.buffers());
        s.buffers[1] = BufferSaturation {
            saturated: 2,
            values: 100,
        };
        s.buffers[5] = BufferSaturation {
            saturated: 3,
            values: 10,
        };
        let w = s.worst(&g).unwrap();
        assert_eq!((w.layer, w.head, w.kind), g.buffer_coords(5));
        assert_eq!(s.total().saturated, 5);
        assert!(Saturation::new(4).worst(&g).is_none());
    }
}
