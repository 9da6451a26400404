//! W8A16 on HTP: each matrix product reads its input quantized to u16 (the reference executor's
//! static activation encoding, moved from i16 to u16 without changing its grid), multiplies by
//! the reference executor's own i8 weights (symmetric, one scale per output channel) and writes a
//! u16 output whose encoding comes from [`crate::calibrate`]; everything between the products
//! stays float (fp16 on HTP), as it is f32 in the reference executor.

use std::collections::{HashMap, HashSet};

use model::Tensor;

use crate::encoding::Fixed;

/// One i8 matrix with the encodings of its product's input and output.
#[derive(Debug, Clone, PartialEq)]
pub struct W8Matrix {
    /// Rows (output channels).
    pub rows: usize,
    /// Columns (input channels).
    pub cols: usize,
    /// Values, row-major, in `[-127, 127]`.
    pub q: Vec<i8>,
    /// One scale per row: `w[r][c] = q[r][c] * scales[r]` (times the block's multiplier, with
    /// `blocks`).
    pub scales: Vec<f32>,
    /// Integer multipliers per block of columns (QNN's blockwise expansion), or none.
    pub blocks: Option<BlockMultipliers>,
    /// u16 encoding of the product's input.
    pub input: Fixed,
    /// u16 encoding of the product's output.
    pub output: Fixed,
}

impl W8Matrix {
    /// For a blockwise-expansion matrix with more rows than columns, the consecutive slices of at
    /// most `cols` rows the HTP can multiply; `None` when it multiplies the matrix whole. Measured on QNN 2.51's
    /// `libQnnHtp.so` (x86_64, v73/v75/v79/v81 alike, `qnn_compile`'s `w8a16_product` tests): a
    /// `FullyConnected` with blockwise-expansion weights computes only its first `cols` output
    /// channels and writes 0 for the others; per-channel weights are not affected.
    pub fn row_parts(&self) -> Option<Vec<W8Matrix>> {
        let b = self.blocks.as_ref().filter(|_| self.rows > self.cols)?;
        let per_row = self.cols / b.size;
        let parts = (0..self.rows).step_by(self.cols.max(1)).map(|lo| {
            let hi = (lo + self.cols).min(self.rows);
            W8Matrix {
                rows: hi - lo,
                cols: self.cols,
                q: self.q[lo * self.cols..hi * self.cols].to_vec(),
                scales: self.scales[lo..hi].to_vec(),
                blocks: Some(BlockMultipliers {
                    size: b.size,
                    bits: b.bits,
                    m: b.m[lo * per_row..hi * per_row].to_vec(),
                }),
                input: self.input,
                output: self.output,
            }
        });
        Some(parts.collect())
    }
}

/// Blockwise expansion ("LPBQ"): `w[r][c] = q[r][c] * scales[r] * m[r][c / size]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockMultipliers {
    /// Columns per block.
    pub size: usize,
    /// Bits of a multiplier.
    pub bits: u32,
    /// `cols / size` multipliers per row, row-major.
    pub m: Vec<u8>,
}

/// The quantized weights of a model: every matrix product, and the embedding table the
/// reference executor gathers from (its i8 rows dequantized, so both gather the same values).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct W8A16 {
    /// Matrices by weight tensor (the classifier under `TokenEmbedding` when tied).
    pub matrices: HashMap<Tensor, W8Matrix>,
    /// Matrices kept in float (a mixed build's f16 matrices): products of the float input with
    /// the model's own weights, run in fp16 as a float graph runs every product.
    pub float: HashSet<Tensor>,
    /// The embedding table `[vocab, dim]`, f32 values of the i8 table.
    pub embedding: Vec<f32>,
}

/// The u16 encoding of the i16 encoding `(scale, offset)`: the same grid, `q_u16 = q_i16 +
/// 32768`.
pub fn u16_from_i16(scale: f32, offset: i32) -> Fixed {
    Fixed {
        dtype: qnn_ffi::bindings::QNN_DATATYPE_UFIXED_POINT_16,
        scale,
        offset: offset - 32768,
    }
}

/// How far past the calibrated range a product's output encoding reaches, as a fraction of the
/// range on each side: an output beyond the encoding saturates (a large error), a wider encoding
/// only costs resolution (u16 keeps 32,768 levels over the calibrated range with this margin,
/// more than fp16's 11-bit mantissa).
pub const OUTPUT_MARGIN: f32 = 0.5;

/// The u16 output encoding for a calibrated `(min, max)`, widened by [`OUTPUT_MARGIN`] on each
/// side and made to contain 0.
pub fn output_encoding((min, max): (f32, f32)) -> Fixed {
    let (lo, hi) = (min.min(0.0), max.max(0.0));
    let pad = (hi - lo).max(f32::MIN_POSITIVE) * OUTPUT_MARGIN;
    let (lo, hi) = (lo - pad, hi + pad);
    let scale = (hi - lo) / 65535.0;
    Fixed {
        dtype: qnn_ffi::bindings::QNN_DATATYPE_UFIXED_POINT_16,
        scale,
        offset: (lo / scale).round() as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_encoding_covers_the_widened_range_and_zero() {
        let e = output_encoding((1.0, 3.0));
        let real = |q: i32| (q + e.offset) as f32 * e.scale;
        assert!(real(0) <= -1.4 && real(0) >= -1.6, "{}", real(0));
        assert!(real(65535) >= 4.4 && real(65535) <= 4.6, "{}", real(65535));
    }

    #[test]
    fn the_u16_grid_is_the_i16_grid() {
        let (scale, offset) = (0.01, -5);
        let e = u16_from_i16(scale, offset);
        for q_i16 in [-32768, -1, 0, 32767] {
            let i16_real = (q_i16 + offset) as f32 * scale;
            let u16_real = (q_i16 + 32768 + e.offset) as f32 * e.scale;
            assert_eq!(i16_real, u16_real);
        }
    }
}
