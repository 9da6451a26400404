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
    /// 5-bit, blocks of 32: f16 scale, 32 high bits, 16 bytes of nibbles, `x = (q - 16) · d`.
    Q5_0,
    /// 5-bit, blocks of 32: f16 scale and min, 32 high bits, 16 bytes of nibbles, `x = q · d + m`.
    Q5_1,
    /// 8-bit, blocks of 32: f16 scale, 32 × i8, `x = q · d`.
    Q8_0,
    /// 8-bit with sum, blocks of 32 (sized, not dequantized).
    Q8_1,
    /// 2-bit k-quant, super-blocks of 256 in 16 sub-blocks with 4-bit scales and mins.
    Q2_K,
    /// 3-bit k-quant, super-blocks of 256 in 16 sub-blocks with signed 6-bit scales.
    Q3_K,
    /// 4-bit k-quant, super-blocks of 256 in 8 sub-blocks with 6-bit scales and mins.
    Q4_K,
    /// 5-bit k-quant, super-blocks of 256 in 8 sub-blocks with 6-bit scales and mins.
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

    /// True for the types [`dequantize`] handles (asked of it with no blocks).
    pub fn can_dequantize(self) -> bool {
        dequantize(self, &[], &mut [])
    }

    /// The types [`dequantize`] handles, for messages.
    pub fn dequantizable() -> Vec<GgmlType> {
        TABLE
            .iter()
            .map(|e| e.0)
            .filter(|t| t.can_dequantize())
            .collect()
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes whole blocks of `ty` from `bytes` into `out`
/// (`out.len() / block_elems * block_bytes == bytes.len()`).
///
/// Returns `false` (leaving `out` untouched) when `ty` cannot be dequantized; this match is the
/// one list of the types that can ([`GgmlType::can_dequantize`]).
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
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be));
    match ty {
        GgmlType::F32 => each(blocks, |b, o| {
            o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }),
        GgmlType::F16 => each(blocks, |b, o| o[0] = f16_at(b, 0)),
        GgmlType::BF16 => each(blocks, |b, o| {
            o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
        }),
        GgmlType::Q4_0 => each(blocks, q4_0),
        GgmlType::Q4_1 => each(blocks, q4_1),
        GgmlType::Q5_0 => each(blocks, q5_0),
        GgmlType::Q5_1 => each(blocks, q5_1),
        GgmlType::Q8_0 => each(blocks, q8_0),
        GgmlType::Q2_K => each(blocks, q2_k),
        GgmlType::Q3_K => each(blocks, q3_k),
        GgmlType::Q4_K => each(blocks, q4_k),
        GgmlType::Q5_K => each(blocks, q5_k),
        GgmlType::Q6_K => each(blocks, q6_k),
        _ => return false,
    }
    true
}

/// Dequantizes each `(block bytes, block elements)` pair with `f`; generic, so each type's loop
/// is compiled around its own block function instead of calling a function pointer per block
/// (per element for the plain floats).
fn each<'a>(
    blocks: impl Iterator<Item = (&'a [u8], &'a mut [f32])>,
    f: impl Fn(&[u8], &mut [f32]),
) {
    for (b, o) in blocks {
        f(b, o);
    }
}

/// Maps the quants of a 32-element block through `f` into `out`: byte `j` of `qs` (16 bytes)
/// holds element `j` in its low nibble and element `j + 16` in its high nibble; bit `i` of
/// `high` is element `i`'s fifth bit (the 5-bit types; 0 for the 4-bit ones).
// Inlined: as a call, Q4_0 took 1.7x as long per element (measured against the loop written
// out in place, one run).
#[inline(always)]
fn quants32(qs: &[u8], high: u32, out: &mut [f32], f: impl Fn(u8) -> f32) {
    for (j, &b) in qs.iter().enumerate() {
        let (h_lo, h_hi) = ((high >> j) & 1, (high >> (j + 16)) & 1);
        out[j] = f((b & 0x0F) | (h_lo << 4) as u8);
        out[j + 16] = f((b >> 4) | (h_hi << 4) as u8);
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    quants32(&b[2..18], 0, out, |q| (i32::from(q) - 8) as f32 * d);
}

fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    quants32(&b[4..20], 0, out, |q| f32::from(q) * d + m);
}

/// Q5_0 block (22 bytes): f16 d, u32 of high bits, 16 bytes of nibbles.
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    quants32(&b[6..22], u32_at(b, 2), out, |q| {
        (i32::from(q) - 16) as f32 * d
    });
}

/// Q5_1 block (24 bytes): f16 d, f16 m, u32 of high bits, 16 bytes of nibbles.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    quants32(&b[8..24], u32_at(b, 4), out, |q| f32::from(q) * d + m);
}

fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// The 2-bit quant of element `e` (0..256) of a super-block from its 64 bytes `qs`: each 32-byte
/// half holds 128 elements, four per byte: element `128·n + 32·s + l` is in bits `2s..2s+2` of
/// byte `32·n + l`.
fn two_bits(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// Q2_K super-block (84 bytes): 16 bytes of scales (low nibble) and mins (high nibble), one per
/// 16 elements, 64 bytes of 2-bit quants, f16 d, f16 dmin; `x = d · scale · q − dmin · min`.
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (j, o) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[j] & 0x0F);
        let ml = dmin * f32::from(scales[j] >> 4);
        for (i, o) in o.iter_mut().enumerate() {
            *o = dl * f32::from(two_bits(qs, 16 * j + i)) - ml;
        }
    }
}

/// Signed scale of sub-block `j` (0..16) from Q3_K's 12 packed bytes, stored as 6 bits plus 32:
/// the low 4 bits in byte `j % 8` (its low nibble for `j < 8`, its high one after), the top 2 in
/// byte `8 + j % 4` at bits `2·(j / 4)`.
fn q3_k_scale(j: usize, s: &[u8]) -> i32 {
    let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// Q3_K super-block (110 bytes): 32 bytes `hmask`, 64 bytes of 2-bit quants, 12 bytes of scales,
/// f16 d. Element `e`'s mask bit is bit `e / 32` of `hmask[e % 32]`; a clear bit subtracts 4:
/// `x = d · scale · (q − 4·(1 − h))`.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (j, o) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * q3_k_scale(j, scales) as f32;
        for (i, o) in o.iter_mut().enumerate() {
            let e = 16 * j + i;
            let h = (hmask[e % 32] >> (e / 32)) & 1;
            let q = i32::from(two_bits(qs, e)) - 4 * i32::from(1 - h);
            *o = dl * q as f32;
        }
    }
}

/// 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K and Q5_K:
/// sub-blocks 0–3 use the low 6 bits of bytes `j` and `j+4`; 4–7 combine a nibble of byte `j+4`
/// with the top two bits of bytes `j-4` and `j`.
fn k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc, m)
    }
}

/// The super-blocks of Q4_K and Q5_K: f16 d, f16 dmin, 12 bytes of scales/mins, then (Q5_K)
/// 32 bytes `qh` and 128 bytes of nibbles `qs`. Each 32-byte group of `qs` holds two
/// sub-blocks of 32: the low nibbles then the high nibbles; element `l` of sub-block `j` takes
/// bit `j` of `qh[l]` as its fifth bit; `x = d · scale · q − dmin · min`.
fn k_scaled_with_mins(b: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    for (j, o) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(j, scales);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let (group, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
        for (l, o) in o.iter_mut().enumerate() {
            let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
            *o = dl * f32::from(((group[l] >> shift) & 0x0F) | high) - ml;
        }
    }
}

/// Q4_K super-block (144 bytes), see [`k_scaled_with_mins`].
fn q4_k(b: &[u8], out: &mut [f32]) {
    k_scaled_with_mins(b, None, &b[16..144], out);
}

/// Q5_K super-block (176 bytes), see [`k_scaled_with_mins`].
fn q5_k(b: &[u8], out: &mut [f32]) {
    k_scaled_with_mins(b, Some(&b[16..48]), &b[48..176], out);
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
