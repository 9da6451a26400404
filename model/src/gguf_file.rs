//! GGUF (v2/v3, little-endian) reader: header, metadata, tensor infos and tensor data
//! dequantized to f32. The model loader above it is [`crate::gguf`], which re-exports this
//! module's items (the dependency goes one way: the loader and the families read files, the
//! reader knows no model).
//!
//! Every count, length, dimension product, offset and size read from the file is checked
//! against the bytes that remain before anything is allocated for it, so a hostile header gives
//! a [`GgufError`], never a huge allocation or a panic. Metadata is held compactly (numeric
//! arrays as typed vectors), so its memory is a small multiple of the bytes it was read from.

mod types;
mod value;

use std::collections::HashSet;
use std::fmt::Display;
use std::io::{Read, Seek, SeekFrom};

use crate::le::{LeReader, ReadError};

pub use types::{GgmlType, dequantize};
pub use value::{Array, Value};

/// Arrays nested deeper than this are rejected (bounds the parser's recursion).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// At most this many dimensions per tensor (ggml's limit).
pub const MAX_DIMS: usize = 4;
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// What is wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Reading failed.
    #[error("read failed")]
    Io(#[from] std::io::Error),
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// Only versions 2 and 3 are read.
    #[error("unsupported GGUF version {0} (2 and 3 are read)")]
    UnsupportedVersion(u32),
    /// A field needs more bytes than the file has left.
    #[error("{what} needs {need} bytes but only {available} remain")]
    Truncated {
        /// The field.
        what: String,
        /// Bytes it needs.
        need: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")]
    TooDeep {
        /// The key.
        key: String,
    },
    /// A string is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 {
        /// The field.
        what: String,
    },
    /// Unknown metadata value type.
    #[error("metadata {key}: unknown value type {ty}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type id.
        ty: u32,
    },
    /// A key or tensor name appears twice.
    #[error("duplicate {0}")]
    Duplicate(String),
    /// `general.alignment` is not a power of two.
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(u64),
    /// Unknown tensor type id.
    #[error("tensor {name}: unknown ggml type {ty}")]
    UnknownTensorType {
        /// Tensor name.
        name: String,
        /// The id.
        ty: u32,
    },
    /// Bad dimensions (count, zero, overflow, not a whole number of blocks).
    #[error("tensor {name}: dimensions {dims:?}: {reason}")]
    BadDims {
        /// Tensor name.
        name: String,
        /// As stored (innermost first).
        dims: Vec<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's data does not lie inside the file, or is misaligned.
    #[error("tensor {name}: data at offset {offset} ({bytes} bytes) {reason}")]
    BadTensorData {
        /// Tensor name.
        name: String,
        /// Offset relative to the data section.
        offset: u64,
        /// Size in bytes.
        bytes: u64,
        /// What is wrong.
        reason: String,
    },
    /// The tensor's type cannot be dequantized.
    #[error(
        "tensor {name}: its type {ty:?} cannot be dequantized (htpkv reads {:?})",
        GgmlType::dequantizable()
    )]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as stored, innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// Data type.
    pub ty: GgmlType,
    /// Offset of the data relative to the data section.
    pub offset: u64,
    /// Number of elements.
    pub n_elements: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Dimensions outermost first (row-major shape: `(rows, cols)` for a matrix).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF header: metadata in file order and tensor infos, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key-value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of each tensor's offset.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl From<ReadError> for GgufError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Short {
                what,
                needed,
                available,
                ..
            } => GgufError::Truncated {
                what,
                need: needed,
                available,
            },
            ReadError::Io { source, .. } => GgufError::Io(source),
        }
    }
}

/// A GGUF string: a u64 byte length, then UTF-8.
fn read_string<R: Read>(b: &mut LeReader<R>, what: impl Display) -> Result<String, GgufError> {
    let n = b.u64(&what)?;
    let bytes = b.bytes(n, &what)?;
    String::from_utf8(bytes).map_err(|_| GgufError::BadUtf8 {
        what: what.to_string(),
    })
}

impl GgufFile {
    /// Parses the header of a GGUF file of `len` bytes from its start.
    pub fn read(r: impl Read, len: u64) -> Result<GgufFile, GgufError> {
        let mut b = LeReader::new(r, len);
        let magic = b.array::<4>("magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic(magic));
        }
        let version = b.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = b.u64("tensor count")?;
        let n_kv = b.u64("metadata count")?;
        let metadata = read_metadata(&mut b, n_kv)?;
        let alignment = alignment_of(&metadata)?;
        let mut names = HashSet::new();
        let mut tensors = Vec::new();
        for i in 0..n_tensors {
            let t = read_tensor_info(&mut b, i)?;
            if !names.insert(t.name.clone()) {
                return Err(GgufError::Duplicate(format!("tensor {}", t.name)));
            }
            tensors.push(t);
        }
        let data_offset = b.position().div_ceil(alignment) * alignment;
        b.skip(data_offset.min(len) - b.position(), "alignment padding")?;
        let file = GgufFile {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        };
        file.check_tensor_data(len)?;
        Ok(file)
    }

    fn check_tensor_data(&self, len: u64) -> Result<(), GgufError> {
        for t in &self.tensors {
            if !t.offset.is_multiple_of(self.alignment) {
                let why = format!("is not aligned to {}", self.alignment);
                return Err(bad_data(t, why));
            }
            self.data_start(t, len)?;
        }
        Ok(())
    }

    /// Absolute offset of `t`'s data, checked to end within a file of `len` bytes.
    fn data_start(&self, t: &TensorInfo, len: u64) -> Result<u64, GgufError> {
        let start = self.data_offset.checked_add(t.offset);
        match start.and_then(|s| s.checked_add(t.n_bytes)) {
            Some(end) if end <= len => Ok(self.data_offset + t.offset),
            _ => {
                let start = self.data_offset.saturating_add(t.offset);
                let why = format!(
                    "starts at byte {start}, and does not end within the file's {len} bytes"
                );
                Err(bad_data(t, why))
            }
        }
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads tensor `t` of this file from `r` (the same file) and dequantizes it to f32. The
    /// tensor's size is checked against its element count and against `r`'s length before
    /// anything is allocated, so a hand-made [`TensorInfo`] cannot cause a huge allocation.
    pub fn read_f32(
        &self,
        r: &mut (impl Read + Seek),
        t: &TensorInfo,
    ) -> Result<Vec<f32>, GgufError> {
        if !t.ty.can_dequantize() {
            return Err(GgufError::UnsupportedType {
                name: t.name.clone(),
                ty: t.ty,
            });
        }
        let be = t.ty.block_elems();
        let bytes = (t.n_elements / be).checked_mul(t.ty.block_bytes());
        if !t.n_elements.is_multiple_of(be) || bytes != Some(t.n_bytes) {
            let why = format!("{} bytes do not hold {} elements", t.n_bytes, t.n_elements);
            return Err(bad_data(t, why));
        }
        let len = r.seek(SeekFrom::End(0))?;
        let start = self.data_start(t, len)?;
        r.seek(SeekFrom::Start(start))?;
        let mut raw = vec![0u8; t.n_bytes as usize];
        r.read_exact(&mut raw)?;
        let mut out = vec![0.0f32; t.n_elements as usize];
        dequantize(t.ty, &raw, &mut out);
        Ok(out)
    }
}

fn bad_data(t: &TensorInfo, reason: String) -> GgufError {
    GgufError::BadTensorData {
        name: t.name.clone(),
        offset: t.offset,
        bytes: t.n_bytes,
        reason,
    }
}

fn read_metadata<R: Read>(b: &mut LeReader<R>, n: u64) -> Result<Vec<(String, Value)>, GgufError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for i in 0..n {
        let key = read_string(b, format_args!("metadata key {i}"))?;
        let ty = b.u32(format_args!("metadata {key} type"))?;
        let v = value::read_value(b, &key, ty, 0)?;
        if !seen.insert(key.clone()) {
            return Err(GgufError::Duplicate(format!("metadata key {key}")));
        }
        out.push((key, v));
    }
    Ok(out)
}

fn alignment_of(metadata: &[(String, Value)]) -> Result<u64, GgufError> {
    let v = metadata.iter().find(|(k, _)| k == "general.alignment");
    let Some((_, v)) = v else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        Some(a) => Err(GgufError::BadAlignment(a)),
        None => Err(GgufError::BadAlignment(0)),
    }
}

fn read_tensor_info<R: Read>(b: &mut LeReader<R>, i: u64) -> Result<TensorInfo, GgufError> {
    let name = read_string(b, format_args!("tensor {i} name"))?;
    let n_dims = b.u32(format_args!("tensor {name} dimension count"))?;
    let bad = |dims: &[u64], reason: String| GgufError::BadDims {
        name: name.clone(),
        dims: dims.to_vec(),
        reason,
    };
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(bad(
            &[],
            format!("{n_dims} dimensions (1..={MAX_DIMS} allowed)"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(b.u64(format_args!("tensor {name} dimension {d}"))?);
    }
    let ty_id = b.u32(format_args!("tensor {name} type"))?;
    let offset = b.u64(format_args!("tensor {name} offset"))?;
    let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        ty: ty_id,
    })?;
    if dims.contains(&0) {
        return Err(bad(&dims, "a dimension is zero".to_owned()));
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(&dims, "element count overflows".to_owned()))?;
    if !dims[0].is_multiple_of(ty.block_elems()) {
        let why = format!("rows are not whole {ty:?} blocks of {}", ty.block_elems());
        return Err(bad(&dims, why));
    }
    let n_bytes = (n_elements / ty.block_elems())
        .checked_mul(ty.block_bytes())
        .ok_or_else(|| bad(&dims, "byte size overflows".to_owned()))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_elements,
        n_bytes,
    })
}

#[cfg(test)]
pub(crate) mod tests;
