//! Hand-made blocks with known values, packed from the layout descriptions, and random valid
//! blocks against the dequantization of llama.cpp's Python package `gguf`, recorded as fixtures.

use super::*;

fn h(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

fn run(ty: GgmlType, block: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; ty.block_elems() as usize];
    assert!(dequantize(ty, block, &mut out));
    out
}

#[test]
fn plain_floats() {
    let mut b = Vec::new();
    for v in [1.5f32, -2.25] {
        b.extend(v.to_le_bytes());
    }
    let mut out = [0.0; 2];
    assert!(dequantize(GgmlType::F32, &b, &mut out));
    assert_eq!(out, [1.5, -2.25]);
    let b: Vec<u8> = [h(0.5), h(-3.0)].concat();
    assert!(dequantize(GgmlType::F16, &b, &mut out));
    assert_eq!(out, [0.5, -3.0]);
    let b: Vec<u8> = [
        bf16::from_f32(0.75).to_le_bytes(),
        bf16::from_f32(-8.0).to_le_bytes(),
    ]
    .concat();
    assert!(dequantize(GgmlType::BF16, &b, &mut out));
    assert_eq!(out, [0.75, -8.0]);
}

/// 16 bytes: element j (0..16) in the low nibble of byte j, element j+16 in its high nibble.
fn pack_nibbles(q: &[u8; 32]) -> Vec<u8> {
    (0..16).map(|j| q[j] | (q[j + 16] << 4)).collect()
}

fn test_quants() -> [u8; 32] {
    let mut q = [0u8; 32];
    for (i, v) in q.iter_mut().enumerate() {
        *v = ((i * 7 + 3) % 16) as u8;
    }
    q
}

#[test]
fn q4_0_block() {
    let q = test_quants();
    let b = [h(0.5).to_vec(), pack_nibbles(&q)].concat();
    let out = run(GgmlType::Q4_0, &b);
    for i in 0..32 {
        assert_eq!(out[i], (f32::from(q[i]) - 8.0) * 0.5, "{i}");
    }
}

#[test]
fn q4_1_block() {
    let q = test_quants();
    let b = [h(0.25).to_vec(), h(-1.0).to_vec(), pack_nibbles(&q)].concat();
    let out = run(GgmlType::Q4_1, &b);
    for i in 0..32 {
        assert_eq!(out[i], f32::from(q[i]) * 0.25 - 1.0, "{i}");
    }
}

#[test]
fn q8_0_block() {
    let mut b = h(2.0).to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let out = run(GgmlType::Q8_0, &b);
    for (i, &o) in out.iter().enumerate() {
        assert_eq!(o, (i as f32 - 16.0) * 2.0, "{i}");
    }
}

/// Packs 8 six-bit scales and mins into Q4_K's 12 bytes: sub-blocks 0–3 in the low 6 bits of
/// bytes 0–3 (scales) and 4–7 (mins); sub-blocks 4–7 keep their low 4 bits in bytes 8–11
/// (scale low nibble, min high nibble) and their top 2 bits in the top bits of bytes 0–3
/// (scales) and 4–7 (mins).
fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    s
}

#[test]
fn q4_k_super_block() {
    let sc = [1u8, 5, 63, 17, 33, 48, 7, 62];
    let m = [0u8, 9, 40, 63, 21, 50, 2, 35];
    let q: Vec<u8> = (0..256).map(|i| ((i * 5 + 1) % 16) as u8).collect();
    let (d, dmin) = (0.125f32, 0.0625f32);
    let mut b = [h(d), h(dmin)].concat();
    b.extend(pack_k4_scales(&sc, &m));
    // 4 groups of 32 bytes; group g: low nibbles = sub-block 2g, high nibbles = sub-block 2g+1.
    for g in 0..4 {
        b.extend((0..32).map(|l| q[64 * g + l] | (q[64 * g + 32 + l] << 4)));
    }
    assert_eq!(b.len(), 144);
    let out = run(GgmlType::Q4_K, &b);
    for i in 0..256 {
        let s = i / 32;
        let want = d * f32::from(sc[s]) * f32::from(q[i]) - dmin * f32::from(m[s]);
        assert_eq!(out[i], want, "{i}");
    }
}

#[test]
fn q6_k_super_block() {
    let q: Vec<u8> = (0..256).map(|i| ((i * 11 + 5) % 64) as u8).collect();
    let sc: Vec<i8> = (0..16).map(|i: i16| (i * 9 - 70) as i8).collect();
    let d = 0.03125f32;
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    // Element e = 128·half + 32·k + l: low 4 bits in ql[64·half + l + 32·(k%2)] (low nibble for
    // k < 2, high for k >= 2), high 2 bits in qh[32·half + l] at bit 2k; scale e / 16.
    for (e, &v) in q.iter().enumerate() {
        let (half, k, l) = (e / 128, (e % 128) / 32, e % 32);
        let lo = 64 * half + l + 32 * (k % 2);
        ql[lo] |= (v & 0x0F) << (4 * (k / 2));
        qh[32 * half + l] |= (v >> 4) << (2 * k);
    }
    let mut b = [ql.to_vec(), qh.to_vec()].concat();
    b.extend(sc.iter().map(|&s| s as u8));
    b.extend(h(d));
    assert_eq!(b.len(), 210);
    let out = run(GgmlType::Q6_K, &b);
    for e in 0..256 {
        let want = d * f32::from(sc[e / 16]) * (f32::from(q[e]) - 32.0);
        assert_eq!(out[e], want, "{e}");
    }
}

#[test]
fn ids_and_geometry() {
    assert_eq!(GgmlType::from_id(3), Some(GgmlType::Q4_1));
    assert_eq!(
        GgmlType::from_id(14).map(|t| (t.block_elems(), t.block_bytes())),
        Some((256, 210))
    );
    assert_eq!(GgmlType::from_id(4), None); // removed Q4_2
    assert_eq!(GgmlType::Q8_0.id(), 8);
    let mut out = vec![0.0; 32];
    assert!(!dequantize(GgmlType::Q8_1, &[0; 36], &mut out));
    assert!(!GgmlType::dequantizable().contains(&GgmlType::Q8_1));
}

/// Random valid blocks of each quantized type and their dequantization by `gguf` 0.19.0
/// (`gguf.quants.dequantize`), written by `scripts/gguf-dequant-fixtures.py`, whose docstring
/// gives the format and how the blocks cover extreme scales and every bit pattern.
const FIXTURES: [(GgmlType, &[u8]); 10] = [
    (GgmlType::Q4_0, include_bytes!("fixtures/q4_0.bin")),
    (GgmlType::Q4_1, include_bytes!("fixtures/q4_1.bin")),
    (GgmlType::Q5_0, include_bytes!("fixtures/q5_0.bin")),
    (GgmlType::Q5_1, include_bytes!("fixtures/q5_1.bin")),
    (GgmlType::Q8_0, include_bytes!("fixtures/q8_0.bin")),
    (GgmlType::Q2_K, include_bytes!("fixtures/q2_k.bin")),
    (GgmlType::Q3_K, include_bytes!("fixtures/q3_k.bin")),
    (GgmlType::Q4_K, include_bytes!("fixtures/q4_k.bin")),
    (GgmlType::Q5_K, include_bytes!("fixtures/q5_k.bin")),
    (GgmlType::Q6_K, include_bytes!("fixtures/q6_k.bin")),
];

fn u32s<const N: usize>(b: &[u8]) -> [u32; N] {
    std::array::from_fn(|i| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()))
}

/// Dequantizes the fixture's blocks and compares with gguf's values bit for bit (NaN with NaN).
fn check_fixture(ty: GgmlType, file: &[u8]) {
    let [id, elems, size, n] = u32s::<4>(file).map(|v| v as usize);
    assert_eq!(
        (id, elems, size),
        (
            ty.id() as usize,
            ty.block_elems() as usize,
            ty.block_bytes() as usize
        ),
        "{ty:?}: gguf's id and block geometry"
    );
    let (raw, want) = file[16..].split_at(n * size);
    assert_eq!(want.len(), n * elems * 4, "{ty:?}: fixture length");
    let mut got = vec![f32::NAN; n * elems];
    assert!(dequantize(ty, raw, &mut got), "{ty:?}");
    let mut bad = Vec::new();
    for (i, (g, w)) in got.iter().zip(want.chunks_exact(4)).enumerate() {
        let w = f32::from_le_bytes(w.try_into().unwrap());
        if g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()) {
            bad.push(format!(
                "block {} element {}: {g:e} != {w:e}",
                i / elems,
                i % elems
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{ty:?}: {} of {} values differ from gguf's, first: {:?}",
        bad.len(),
        got.len(),
        &bad[..bad.len().min(8)]
    );
}

#[test]
fn random_blocks_match_the_gguf_python_package() {
    for (ty, file) in FIXTURES {
        check_fixture(ty, file);
    }
}

#[test]
fn every_dequantized_block_type_has_a_fixture() {
    for ty in GgmlType::dequantizable() {
        let recorded = FIXTURES.iter().any(|f| f.0 == ty);
        assert!(
            recorded || ty.block_elems() == 1,
            "{ty:?} has no gguf fixture"
        );
    }
}
