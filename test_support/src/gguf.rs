//! A GGUF v3 writer for tests: metadata of every GGUF value type (arrays included) and tensors in
//! F32, F16 or raw bytes of any ggml type, laid out at the file's alignment.
//!
//! Layout (the GGUF v3 format, all little-endian): magic `GGUF`, version 3 (u32), tensor count
//! (u64), metadata count (u64); each metadata entry as key string, value type (u32), value; each
//! tensor info as name string, dimension count (u32), dimensions (u64 each, innermost first), ggml
//! type (u32), offset (u64, relative to the data section); zero padding up to the alignment; then
//! every tensor's data, each starting at a multiple of the alignment. A string is its byte length
//! (u64) then its UTF-8 bytes. The alignment is `general.alignment` when the writer was given one
//! ([`GgufWriter::with_alignment`] writes that key), 32 otherwise.

/// The GGUF default alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// ggml's type ids for the tensor types this writer encodes itself.
pub const GGML_TYPE_F32: u32 = 0;
/// ggml's id of IEEE half precision.
pub const GGML_TYPE_F16: u32 = 1;

/// One metadata value, typed as GGUF types it.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array (GGUF arrays carry one element type).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Nested arrays, all of the element type of the first (GGUF allows arrays of arrays).
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaValue {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            MetaValue::U8(v) => out.push(*v),
            MetaValue::I8(v) => out.extend(v.to_le_bytes()),
            MetaValue::U16(v) => out.extend(v.to_le_bytes()),
            MetaValue::I16(v) => out.extend(v.to_le_bytes()),
            MetaValue::U32(v) => out.extend(v.to_le_bytes()),
            MetaValue::I32(v) => out.extend(v.to_le_bytes()),
            MetaValue::F32(v) => out.extend(v.to_le_bytes()),
            MetaValue::Bool(v) => out.push(u8::from(*v)),
            MetaValue::Str(s) => put_str(out, s),
            MetaValue::Array(a) => a.write(out),
            MetaValue::U64(v) => out.extend(v.to_le_bytes()),
            MetaValue::I64(v) => out.extend(v.to_le_bytes()),
            MetaValue::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

impl MetaArray {
    /// The GGUF type id of the elements.
    pub fn element_type_id(&self) -> u32 {
        match self {
            MetaArray::U8(_) => 0,
            MetaArray::I8(_) => 1,
            MetaArray::U16(_) => 2,
            MetaArray::I16(_) => 3,
            MetaArray::U32(_) => 4,
            MetaArray::I32(_) => 5,
            MetaArray::F32(_) => 6,
            MetaArray::Bool(_) => 7,
            MetaArray::Str(_) => 8,
            MetaArray::Array(_) => 9,
            MetaArray::U64(_) => 10,
            MetaArray::I64(_) => 11,
            MetaArray::F64(_) => 12,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::Str(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend(self.element_type_id().to_le_bytes());
        out.extend((self.len() as u64).to_le_bytes());
        fn each<T: Copy>(out: &mut Vec<u8>, v: &[T], f: impl Fn(T) -> MetaValue) {
            v.iter().for_each(|x| f(*x).write_payload(out));
        }
        match self {
            MetaArray::U8(v) => out.extend(v),
            MetaArray::I8(v) => each(out, v, MetaValue::I8),
            MetaArray::U16(v) => each(out, v, MetaValue::U16),
            MetaArray::I16(v) => each(out, v, MetaValue::I16),
            MetaArray::U32(v) => each(out, v, MetaValue::U32),
            MetaArray::I32(v) => each(out, v, MetaValue::I32),
            MetaArray::F32(v) => each(out, v, MetaValue::F32),
            MetaArray::Bool(v) => each(out, v, MetaValue::Bool),
            MetaArray::Str(v) => v.iter().for_each(|s| put_str(out, s)),
            MetaArray::Array(v) => v.iter().for_each(|a| a.write(out)),
            MetaArray::U64(v) => each(out, v, MetaValue::U64),
            MetaArray::I64(v) => each(out, v, MetaValue::I64),
            MetaArray::F64(v) => each(out, v, MetaValue::F64),
        }
    }
}

macro_rules! meta_from {
    ($($t:ty => $v:ident / $a:ident),* $(,)?) => {$(
        impl From<$t> for MetaValue {
            fn from(x: $t) -> Self {
                MetaValue::$v(x)
            }
        }
        impl From<Vec<$t>> for MetaValue {
            fn from(x: Vec<$t>) -> Self {
                MetaValue::Array(MetaArray::$a(x))
            }
        }
    )*};
}

meta_from!(u8 => U8 / U8, i8 => I8 / I8, u16 => U16 / U16, i16 => I16 / I16, u32 => U32 / U32,
    i32 => I32 / I32, f32 => F32 / F32, bool => Bool / Bool, String => Str / Str, u64 => U64 / U64,
    i64 => I64 / I64, f64 => F64 / F64);

impl From<&str> for MetaValue {
    fn from(s: &str) -> Self {
        MetaValue::Str(s.to_owned())
    }
}

impl From<MetaArray> for MetaValue {
    fn from(a: MetaArray) -> Self {
        MetaValue::Array(a)
    }
}

/// One tensor to write: its name, dimensions innermost first (ggml's `ne` order), ggml type id
/// and encoded bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

/// An in-memory GGUF v3 file under construction. Keys and tensors are written in insertion order.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    alignment: u32,
    kv: Vec<(String, MetaValue)>,
    tensors: Vec<TensorEntry>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment (no `general.alignment` key).
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// An empty file whose tensor data is aligned to `alignment` (a power of two), declared by a
    /// `general.alignment` u32 key.
    pub fn with_alignment(alignment: u32) -> Self {
        assert!(
            alignment.is_power_of_two(),
            "GGUF alignment {alignment} is not a power of two"
        );
        let mut w = Self::new();
        w.alignment = alignment;
        w.kv("general.alignment", alignment);
        w
    }

    /// Adds one metadata entry. A key given twice is a bug in the caller.
    pub fn kv(&mut self, key: &str, value: impl Into<MetaValue>) -> &mut Self {
        assert!(
            self.kv.iter().all(|(k, _)| k != key),
            "GGUF key {key} given twice"
        );
        self.kv.push((key.to_owned(), value.into()));
        self
    }

    /// Removes the metadata entry `key` (a toy without a key its family writes, e.g. a base model
    /// without `tokenizer.chat_template`). Removing a key that is not there is a bug in the caller.
    pub fn remove(&mut self, key: &str) -> &mut Self {
        let before = self.kv.len();
        self.kv.retain(|(k, _)| k != key);
        assert!(self.kv.len() < before, "GGUF key {key} is not there");
        self
    }

    /// Adds an array of strings.
    pub fn str_array<S: AsRef<str>>(&mut self, key: &str, v: &[S]) -> &mut Self {
        let v = v.iter().map(|s| s.as_ref().to_owned()).collect();
        self.kv(key, MetaArray::Str(v))
    }

    /// Adds a tensor of raw encoded bytes of ggml type `ggml_type` (any type: the caller encodes).
    pub fn tensor_raw(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: u32,
        data: Vec<u8>,
    ) -> &mut Self {
        assert!(
            self.tensors.iter().all(|t| t.name != name),
            "GGUF tensor {name} given twice"
        );
        assert!(
            !dims.is_empty() && dims.len() <= 4,
            "tensor {name}: {} dims",
            dims.len()
        );
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        self
    }

    /// Adds an F32 tensor. `dims` are innermost first: a `[rows, cols]` row-major matrix is
    /// `&[cols, rows]`.
    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
        check_len(name, dims, data.len());
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, dims, GGML_TYPE_F32, bytes)
    }

    /// Adds an F16 tensor, rounding each value to the nearest half.
    pub fn tensor_f16(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
        check_len(name, dims, data.len());
        let bytes = data
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        self.tensor_raw(name, dims, GGML_TYPE_F16, bytes)
    }

    /// The metadata entries so far.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.kv
    }

    /// The tensors so far.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = u64::from(self.alignment);
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut b, k);
            b.extend(v.type_id().to_le_bytes());
            v.write_payload(&mut b);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(t.ggml_type.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(align) * align;
        }
        pad(&mut b, align);
        for t in &self.tensors {
            b.extend(&t.data);
            pad(&mut b, align);
        }
        b
    }
}

fn check_len(name: &str, dims: &[u64], n: usize) {
    let want: u64 = dims.iter().product();
    assert_eq!(
        want, n as u64,
        "tensor {name}: dims {dims:?} but {n} values"
    );
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn pad(b: &mut Vec<u8>, align: u64) {
    let len = (b.len() as u64).div_ceil(align) * align;
    b.resize(len as usize, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_one_scalar_have_the_spec_layout() {
        let mut w = GgufWriter::new();
        w.kv("a", 7u32);
        let b = w.to_bytes();
        let mut want = b"GGUF".to_vec();
        want.extend(3u32.to_le_bytes());
        want.extend(0u64.to_le_bytes());
        want.extend(1u64.to_le_bytes());
        want.extend(1u64.to_le_bytes());
        want.push(b'a');
        want.extend(4u32.to_le_bytes());
        want.extend(7u32.to_le_bytes());
        want.resize(64, 0);
        assert_eq!(b, want);
    }

    #[test]
    fn tensor_data_starts_at_the_declared_alignment() {
        let mut w = GgufWriter::with_alignment(64);
        w.tensor_f32("x", &[3], &[1.0, 2.0, 3.0]);
        w.tensor_f16("y", &[2], &[1.0, -2.0]);
        let b = w.to_bytes();
        assert_eq!(b.len() % 64, 0);
        // The second tensor's data sits one alignment unit after the first's.
        let data = b.len() - 128;
        assert_eq!(&b[data..data + 4], &1.0f32.to_le_bytes());
        assert_eq!(
            &b[data + 64..data + 66],
            &half::f16::from_f32(1.0).to_le_bytes()
        );
        assert_eq!(
            &b[data + 66..data + 68],
            &half::f16::from_f32(-2.0).to_le_bytes()
        );
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn a_repeated_key_is_refused() {
        GgufWriter::new().kv("k", 1u8).kv("k", 2u8);
    }
}
