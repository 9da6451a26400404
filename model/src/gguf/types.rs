//! ggml tensor types: their ids, block geometry, and dequantization to f32 of the supported
//! ones. Block layouts follow the public GGUF/ggml specification; every quantized block starts
//! with its f16 scale(s), little-endian.

use half::{bf16, f16};

/// A ggml tensor data type (the `type` field of a GGUF tensor info).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 4-bit, blocks of 32: f16 scale, 16 bytes of nibbles, `x = (q - 8) · d`.
    Q4_0,
    /// 4-bit, blocks of 32: f16 scale and min, 16 bytes of nibbles, `x = q · d + m`.
    Q4_1,
    /// 5-bit, blocks of 32 (sized, not dequantized).
    Q5_0,
    /// 5-bit with min, blocks of 32 (sized, not dequantized).
    Q5_1,
    /// 8-bit, blocks of 32: f16 scale, 32 × i8, `x = q · d`.
    Q8_0,
    /// 8-bit with sum, blocks of 32 (sized, not dequantized).
    Q8_1,
    /// 2-bit k-quant, super-blocks of 256 (sized, not dequantized).
    Q2_K,
    /// 3-bit k-quant, super-blocks of 256 (sized, not dequantized).
    Q3_K,
    /// 4-bit k-quant, super-blocks of 256 in 8 sub-blocks with 6-bit scales and mins.
    Q4_K,
    /// 5-bit k-quant, super-blocks of 256 (sized, not dequantized).
    Q5_K,
    /// 6-bit k-quant, super-blocks of 256 in 16 sub-blocks with i8 scales.
    Q6_K,
    /// 8-bit k-quant (intermediate type; sized, not dequantized).
    Q8_K,
    /// 8-bit integer (sized, not dequantized).
    I8,
    /// 16-bit integer (sized, not dequantized).
    I16,
    /// 32-bit integer (sized, not dequantized).
    I32,
    /// 64-bit integer (sized, not dequantized).
    I64,
    /// 64-bit float (sized, not dequantized).
    F64,
    /// bfloat16.
    BF16,
}

/// `(type, id, elements per block, bytes per block)`.
const TABLE: [(GgmlType, u32, u64, u64); 20] = [
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2_K, 10, 256, 84),
    (GgmlType::Q3_K, 11, 256, 110),
    (GgmlType::Q4_K, 12, 256, 144),
    (GgmlType::Q5_K, 13, 256, 176),
    (GgmlType::Q6_K, 14, 256, 210),
    (GgmlType::Q8_K, 15, 256, 292),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::BF16, 30, 1, 2),
];

impl GgmlType {
    /// The type with ggml id `id`, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    fn entry(self) -> (GgmlType, u32, u64, u64) {
        *TABLE.iter().find(|e| e.0 == self).unwrap_or(&TABLE[0])
    }

    /// ggml id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Elements per block.
    pub fn block_elems(self) -> u64 {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.entry().3
    }

    /// True for the types [`dequantize`] handles.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q8_0 | Q4_K | Q6_K)
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes whole blocks of `ty` from `bytes` into `out`
/// (`out.len() / block_elems * block_bytes == bytes.len()`).
///
/// Returns `false` (leaving `out` untouched) when `ty` cannot be dequantized
/// ([`GgmlType::can_dequantize`]).
///
/// # Panics
/// If the lengths do not match as above (the GGUF reader sizes both from the tensor info).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> bool {
    let (be, bb) = (ty.block_elems() as usize, ty.block_bytes() as usize);
    assert!(
        out.len().is_multiple_of(be) && out.len() / be * bb == bytes.len(),
        "dequantize {ty:?}: {} bytes for {} elements",
        bytes.len(),
        out.len()
    );
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, o| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        _ => return false,
    };
    for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        block(b, o);
    }
    true
}

/// Nibble layout of the 32-element 4-bit blocks: byte `j` holds element `j` in its low nibble
/// and element `j + 16` in its high nibble.
fn nibbles(qs: &[u8], out: &mut [f32], f: impl Fn(u8) -> f32) {
    for (j, &q) in qs.iter().enumerate() {
        out[j] = f(q & 0x0F);
        out[j + 16] = f(q >> 4);
    }
}

fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    nibbles(&b[2..18], out, |q| (i32::from(q) - 8) as f32 * d);
}

fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    nibbles(&b[4..20], out, |q| f32::from(q) * d + m);
}

fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// 6-bit scale and min of sub-block `j` (0..8) from Q4_K's 12 packed bytes: sub-blocks 0–3 use
/// the low 6 bits of bytes `j` and `j+4`; 4–7 combine a nibble of byte `j+4` with the top two
/// bits of bytes `j-4` and `j`.
fn q4_k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc, m)
    }
}

/// Q4_K super-block (144 bytes): f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of
/// nibbles. Each 32-byte group of `qs` holds two sub-blocks of 32: the low nibbles then the
/// high nibbles; `x = d · scale · q − dmin · min`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (g, (q, o)) in qs
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = q4_k_scale_min(2 * g, scales);
        let (sc2, m2) = q4_k_scale_min(2 * g + 1, scales);
        let (d1, d2) = (d * f32::from(sc1), d * f32::from(sc2));
        let (m1, m2) = (dmin * f32::from(m1), dmin * f32::from(m2));
        for (l, &qv) in q.iter().enumerate() {
            o[l] = d1 * f32::from(qv & 0x0F) - m1;
            o[l + 32] = d2 * f32::from(qv >> 4) - m2;
        }
    }
}

/// Q6_K super-block (210 bytes): 128 bytes `ql` (low 4 bits), 64 bytes `qh` (high 2 bits),
/// 16 × i8 scales (one per 16 elements), f16 d; `x = d · scale · (q − 32)`. Each half of 128
/// elements uses 64 bytes of `ql`, 32 of `qh` and 8 scales.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let o = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            let h = qh[l];
            let q = [
                (ql[l] & 0x0F) | ((h & 3) << 4),
                (ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4),
                (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let scale = f32::from(sc[l / 16 + 2 * k] as i8);
                o[l + 32 * k] = d * scale * (i32::from(qk) - 32) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests;
