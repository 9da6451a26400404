//! GGUF metadata values.

use std::io::Read;

use super::{GgufError, MAX_ARRAY_DEPTH, read_string};
use crate::le::LeReader;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9.
    Array(Array),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

/// A metadata array, stored by element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Unsigned integers (u8, u16, u32, u64 elements).
    Unsigned(Vec<u64>),
    /// Signed integers (i8, i16, i32, i64 elements).
    Signed(Vec<i64>),
    /// Floats (f32 elements; f64 elements are narrowed).
    Float(Vec<f32>),
    /// Booleans.
    Bool(Vec<bool>),
    /// Strings.
    String(Vec<String>),
    /// Arrays.
    Array(Vec<Array>),
}

/// Bytes of one scalar of metadata type `ty`, `None` for strings, arrays and unknown types.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Smallest encoding of one element of type `ty` (strings and arrays carry a u64 length; an
/// array also its u32 type).
fn min_size(ty: u32) -> u64 {
    match ty {
        8 => 8,
        9 => 12,
        other => scalar_size(other).unwrap_or(1),
    }
}

pub(super) fn read_value<R: Read>(
    b: &mut LeReader<R>,
    key: &str,
    ty: u32,
    depth: usize,
) -> Result<Value, GgufError> {
    let what = format_args!("metadata {key}");
    Ok(match ty {
        0 => Value::U8(b.array::<1>(what)?[0]),
        1 => Value::I8(b.array::<1>(what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(b.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(b.array(what)?)),
        4 => Value::U32(b.u32(what)?),
        5 => Value::I32(i32::from_le_bytes(b.array(what)?)),
        6 => Value::F32(f32::from_le_bytes(b.array(what)?)),
        7 => Value::Bool(b.array::<1>(what)?[0] != 0),
        8 => Value::String(read_string(b, what)?),
        9 => Value::Array(read_array(b, key, depth)?),
        10 => Value::U64(b.u64(what)?),
        11 => Value::I64(i64::from_le_bytes(b.array(what)?)),
        12 => Value::F64(f64::from_le_bytes(b.array(what)?)),
        ty => {
            let key = key.to_owned();
            return Err(GgufError::UnknownValueType { key, ty });
        }
    })
}

fn read_array<R: Read>(b: &mut LeReader<R>, key: &str, depth: usize) -> Result<Array, GgufError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::TooDeep {
            key: key.to_owned(),
        });
    }
    let ty = b.u32(format_args!("metadata {key} element type"))?;
    let n = b.u64(format_args!("metadata {key} length"))?;
    let what = format_args!("metadata {key}: {n} elements of type {ty}");
    b.need(n.saturating_mul(min_size(ty)), what)?;
    // `n` elements of at least `min_size` bytes each remain, so `n` fits in memory.
    let n = n as usize;
    if let Some(size) = scalar_size(ty) {
        let raw = b.bytes(n as u64 * size, what)?;
        return Ok(scalars(ty, &raw));
    }
    match ty {
        8 => (0..n)
            .map(|i| read_string(b, format_args!("metadata {key}[{i}]")))
            .collect::<Result<_, _>>()
            .map(Array::String),
        9 => (0..n)
            .map(|_| read_array(b, key, depth + 1))
            .collect::<Result<_, _>>()
            .map(Array::Array),
        ty => {
            let key = key.to_owned();
            Err(GgufError::UnknownValueType { key, ty })
        }
    }
}

/// Decodes little-endian scalars of type `ty` (a scalar type) into the matching array kind.
fn scalars(ty: u32, raw: &[u8]) -> Array {
    let le = |c: &[u8]| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    };
    let size = scalar_size(ty).unwrap_or(1) as usize;
    let words = raw.chunks_exact(size).map(le);
    // Sign-extend a `size`-byte word.
    let signed = |w: u64| ((w << (64 - 8 * size)) as i64) >> (64 - 8 * size);
    match ty {
        0 | 2 | 4 | 10 => Array::Unsigned(words.collect()),
        1 | 3 | 5 | 11 => Array::Signed(words.map(signed).collect()),
        6 => Array::Float(words.map(|w| f32::from_bits(w as u32)).collect()),
        12 => Array::Float(words.map(|w| f64::from_bits(w) as f32).collect()),
        _ => Array::Bool(words.map(|w| w != 0).collect()),
    }
}

impl Value {
    /// A non-negative integer value of any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float value (f32 or f64, narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}
