//! Round trips through an in-memory GGUF writer, and hostile headers.

use std::io::Cursor;

use super::*;

/// Minimal GGUF v3 writer for tests: metadata as raw (type, payload) pairs, tensors as
/// (name, dims innermost first, type, data).
#[derive(Default)]
pub(crate) struct Writer {
    pub kv: Vec<(String, u32, Vec<u8>)>,
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

pub(crate) fn gguf_str(s: &str) -> Vec<u8> {
    [
        (s.len() as u64).to_le_bytes().to_vec(),
        s.as_bytes().to_vec(),
    ]
    .concat()
}

impl Writer {
    pub fn u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.kv.push((k.into(), 4, v.to_le_bytes().to_vec()));
        self
    }
    pub fn f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.kv.push((k.into(), 6, v.to_le_bytes().to_vec()));
        self
    }
    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        self.kv.push((k.into(), 8, gguf_str(v)));
        self
    }
    pub fn str_array(&mut self, k: &str, v: &[&str]) -> &mut Self {
        let mut p = 8u32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|s| p.extend(gguf_str(s)));
        self.kv.push((k.into(), 9, p));
        self
    }
    pub fn i32_array(&mut self, k: &str, v: &[i32]) -> &mut Self {
        let mut p = 5u32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| p.extend(x.to_le_bytes()));
        self.kv.push((k.into(), 9, p));
        self
    }
    pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.kv.push((k.into(), 7, vec![u8::from(v)]));
        self
    }
    pub fn f32_tensor(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.into(), dims.to_vec(), GgmlType::F32, bytes));
        self
    }
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, payload) in &self.kv {
            b.extend(gguf_str(k));
            b.extend(ty.to_le_bytes());
            b.extend(payload);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            b.extend(gguf_str(name));
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.id().to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in &self.tensors {
            b.extend(data);
            b.resize(b.len().div_ceil(32) * 32, 0);
        }
        b
    }
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::read(Cursor::new(bytes), bytes.len() as u64)
}

fn sample() -> Writer {
    let mut w = Writer::default();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 2)
        .f32("x.eps", 1e-5);
    w.str_array("tokenizer.ggml.tokens", &["a", "b", "ĠHello"]);
    w.f32_tensor("t.weight", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let mut q8 = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    q8.extend((0..32).map(|i| i as u8));
    w.tensors
        .push(("q.weight".into(), vec![32], GgmlType::Q8_0, q8));
    w
}

#[test]
fn round_trip_metadata_and_tensors() {
    let bytes = sample().bytes();
    let f = parse(&bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(
        f.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(f.get("llama.block_count").and_then(Value::as_u64), Some(2));
    assert_eq!(f.get("x.eps").and_then(Value::as_f32), Some(1e-5));
    let toks = ["a", "b", "ĠHello"].map(String::from).to_vec();
    assert_eq!(
        f.get("tokenizer.ggml.tokens").and_then(Value::as_array),
        Some(&Array::String(toks))
    );
    let t = f.tensor("t.weight").unwrap();
    assert_eq!((t.shape(), t.n_elements, t.n_bytes), (vec![2, 3], 6, 24));
    let mut r = Cursor::new(&bytes);
    assert_eq!(
        f.read_f32(&mut r, t).unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    let q = f.tensor("q.weight").unwrap();
    let want: Vec<f32> = (0..32).map(|i| i as f32 * 0.5).collect();
    assert_eq!(f.read_f32(&mut r, q).unwrap(), want);
}

#[test]
fn hand_made_tensor_infos_are_checked_before_reading() {
    let bytes = sample().bytes();
    let f = parse(&bytes).unwrap();
    let mut r = Cursor::new(&bytes);
    let mut t = f.tensor("t.weight").unwrap().clone();
    (t.n_elements, t.n_bytes) = (1 << 60, 1 << 62);
    let err = f.read_f32(&mut r, &t).unwrap_err();
    assert!(matches!(err, GgufError::BadTensorData { .. }), "{err}");
    t.n_bytes = 24; // 6 floats' bytes for 2^60 elements
    let err = f.read_f32(&mut r, &t).unwrap_err();
    assert!(matches!(err, GgufError::BadTensorData { .. }), "{err}");
    let mut q = f.tensor("q.weight").unwrap().clone();
    q.n_elements = 16; // not a whole Q8_0 block
    assert!(f.read_f32(&mut r, &q).is_err());
}

#[test]
fn numeric_arrays_are_typed() {
    let mut w = Writer::default();
    let mut p = 5u32.to_le_bytes().to_vec(); // i32
    p.extend(3u64.to_le_bytes());
    [-1i32, 2, -3]
        .iter()
        .for_each(|v| p.extend(v.to_le_bytes()));
    w.kv.push(("ints".into(), 9, p));
    let f = parse(&w.bytes()).unwrap();
    assert_eq!(
        f.get("ints").and_then(Value::as_array),
        Some(&Array::Signed(vec![-1, 2, -3]))
    );
}

fn expect_err(bytes: &[u8], pred: impl Fn(&GgufError) -> bool) {
    match parse(bytes) {
        Err(e) if pred(&e) => {}
        other => panic!("unexpected result {other:?}"),
    }
}

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

#[test]
fn hostile_counts_and_lengths_fail_before_allocating() {
    expect_err(b"GGU", |e| matches!(e, GgufError::Truncated { .. }));
    expect_err(b"GGMLxxxxxxxxxxxxxxxxxxxx", |e| {
        matches!(e, GgufError::BadMagic(_))
    });
    let mut v1 = header(0, 0);
    v1[4] = 1;
    expect_err(&v1, |e| matches!(e, GgufError::UnsupportedVersion(1)));
    // 2^62 tensors / keys: fail at the first missing entry, without reserving space for them.
    expect_err(&header(1 << 62, 0), |e| {
        matches!(e, GgufError::Truncated { .. })
    });
    expect_err(&header(0, 1 << 62), |e| {
        matches!(e, GgufError::Truncated { .. })
    });
    // A key whose string length is 2^63.
    let mut b = header(0, 1);
    b.extend((1u64 << 63).to_le_bytes());
    expect_err(
        &b,
        |e| matches!(e, GgufError::Truncated { need, .. } if *need == 1 << 63),
    );
    // An array of u64::MAX strings.
    let mut b = header(0, 1);
    b.extend(gguf_str("k"));
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    expect_err(&b, |e| matches!(e, GgufError::Truncated { .. }));
    // Arrays nested past the limit.
    let mut b = header(0, 1);
    b.extend(gguf_str("deep"));
    b.extend(9u32.to_le_bytes());
    for _ in 0..=MAX_ARRAY_DEPTH {
        b.extend(9u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
    }
    b.extend([0u8; 64]);
    expect_err(&b, |e| matches!(e, GgufError::TooDeep { .. }));
    // Unknown value type, bad UTF-8, duplicate key.
    let mut b = header(0, 1);
    b.extend(gguf_str("k"));
    b.extend(13u32.to_le_bytes());
    expect_err(&b, |e| {
        matches!(e, GgufError::UnknownValueType { ty: 13, .. })
    });
    let mut w = Writer::default();
    w.kv.push((
        "k".into(),
        8,
        [1u64.to_le_bytes().to_vec(), vec![0xFF]].concat(),
    ));
    expect_err(&w.bytes(), |e| matches!(e, GgufError::BadUtf8 { .. }));
    let mut w = Writer::default();
    w.u32("k", 1).u32("k", 2);
    expect_err(&w.bytes(), |e| matches!(e, GgufError::Duplicate(_)));
}

/// The sample with its first tensor info's dims, type or offset replaced.
fn with_tensor(dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut w = Writer::default();
    w.tensors
        .push(("x".into(), dims.to_vec(), GgmlType::F32, vec![0; 64]));
    let mut b = w.bytes();
    let info = 24 + 8 + 1; // header, name
    let mut at = info;
    b[at..at + 4].copy_from_slice(&(dims.len() as u32).to_le_bytes());
    at += 4 + 8 * dims.len();
    b[at..at + 4].copy_from_slice(&ty.to_le_bytes());
    b[at + 4..at + 12].copy_from_slice(&offset.to_le_bytes());
    b
}

#[test]
fn hostile_tensor_infos_are_rejected() {
    assert!(parse(&with_tensor(&[16], 0, 0)).is_ok());
    let dims_err = |e: &GgufError| matches!(e, GgufError::BadDims { .. });
    expect_err(&with_tensor(&[1 << 32, 1 << 32, 1 << 32], 0, 0), dims_err);
    expect_err(&with_tensor(&[16, 0], 0, 0), dims_err);
    expect_err(&with_tensor(&[16], 8, 0), dims_err); // 16 is not a whole Q8_0 block
    expect_err(&with_tensor(&[16], 99, 0), |e| {
        matches!(e, GgufError::UnknownTensorType { ty: 99, .. })
    });
    let data_err = |e: &GgufError| matches!(e, GgufError::BadTensorData { .. });
    expect_err(&with_tensor(&[1 << 40], 0, 0), data_err);
    expect_err(&with_tensor(&[16], 0, 32), data_err);
    expect_err(&with_tensor(&[16], 0, u64::MAX - 31), data_err);
    expect_err(&with_tensor(&[4], 0, 4), data_err); // misaligned
    let mut w = Writer::default();
    w.f32_tensor("x", &[1], &[1.0])
        .f32_tensor("x", &[1], &[1.0]);
    expect_err(&w.bytes(), |e| matches!(e, GgufError::Duplicate(_)));
}

/// Every block type (the 5-bit and 2/3/5-bit k-quants included) needs whole blocks in each row,
/// also when the element count as a whole is a multiple of the block.
#[test]
fn rows_must_be_whole_blocks_of_every_type() {
    let dims_err = |e: &GgufError| matches!(e, GgufError::BadDims { .. });
    for ty in (0..64).filter_map(GgmlType::from_id) {
        let be = ty.block_elems();
        if be == 1 {
            continue;
        }
        expect_err(&with_tensor(&[be / 2], ty.id(), 0), dims_err);
        expect_err(&with_tensor(&[be / 2, 2], ty.id(), 0), dims_err);
        expect_err(&with_tensor(&[be * 3 / 2, 2], ty.id(), 0), dims_err);
    }
}

#[test]
fn an_unsupported_type_is_named_with_its_tensor() {
    let mut w = Writer::default();
    let name = "blk.0.ffn_up.weight";
    w.tensors
        .push((name.into(), vec![32], GgmlType::Q8_1, vec![0; 36]));
    let bytes = w.bytes();
    let f = parse(&bytes).unwrap();
    let err = f
        .read_f32(&mut Cursor::new(&bytes), &f.tensors[0])
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            GgufError::UnsupportedType {
                ty: GgmlType::Q8_1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        msg.contains(name) && msg.contains("Q8_1") && msg.contains("Q5_K"),
        "{msg}"
    );
}

#[test]
fn alignment_must_be_a_power_of_two() {
    let mut w = sample();
    w.u32("general.alignment", 24);
    expect_err(&w.bytes(), |e| matches!(e, GgufError::BadAlignment(24)));
}

/// Fuzzing of the GGUF parser (issue 14): arbitrary bytes, and a valid file with random byte
/// edits and truncations, through the header parser, the tensor reader and the description. Each
/// must end in `Ok` or a typed error: never a panic, a hang or an allocation the file cannot back.
mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    fn check(bytes: &[u8]) {
        let Ok(file) = parse(bytes) else { return };
        let mut cursor = Cursor::new(bytes);
        for t in &file.tensors {
            let _ = file.read_f32(&mut cursor, t);
        }
        let _ = crate::gguf::llama_config(&file, "fuzz", &mut Cursor::new(bytes));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]

        #[test]
        fn arbitrary_bytes_after_a_valid_magic(tail in proptest::collection::vec(any::<u8>(), 0..400)) {
            check(&tail);
            let mut bytes = b"GGUF\x03\0\0\0".to_vec();
            bytes.extend(&tail);
            check(&bytes);
        }

        #[test]
        fn edited_and_truncated_valid_files(
            edits in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..8),
            cut in any::<Index>(),
        ) {
            let mut bytes = sample().bytes();
            for (at, value) in edits {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            check(&bytes);
            check(&bytes[..cut.index(bytes.len() + 1)]);
        }
    }
}

#[test]
fn a_path_that_is_no_regular_file_is_refused_by_the_capped_reader() {
    let dir = std::env::temp_dir();
    let err = crate::gguf::GgufModel::describe(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            crate::Error::File(crate::fsio::FileError::IsDirectory { .. })
        ),
        "{err:?}"
    );
}
