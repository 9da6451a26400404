//! Little-endian writer, the compiled-model file's reader over [`model::le::LeReader`] (errors
//! with the file's offsets), and FNV-1a (CRC-32 is [`model::checksum`]).

use crate::error::FormatError;
use model::le::{LeReader, ReadError};

/// 64-bit FNV-1a hash (stable across platforms and releases).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// Appends little-endian fields to a byte vector.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A `usize` stored as u64.
    pub(crate) fn len(&mut self, v: usize) {
        self.u64(v as u64);
    }
    pub(crate) fn f32(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }
    pub(crate) fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        for &x in v {
            self.f32(x);
        }
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
}

/// Reads little-endian fields ([`model::le::LeReader`]); every error names the field, its offset
/// (from the start of the file) and how many bytes were expected and available.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    le: LeReader<&'a [u8]>,
    /// Offset of `data[0]` in the file.
    base: u64,
    pub(crate) origin: &'a str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8], base: u64, origin: &'a str) -> Self {
        Reader {
            le: LeReader::from_slice(data),
            base,
            origin,
        }
    }

    /// File offset of the next byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.le.position()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.le.rest().len()
    }

    /// True when the next bytes are `prefix` (nothing is consumed).
    pub(crate) fn starts_with(&self, prefix: &[u8]) -> bool {
        self.le.rest().starts_with(prefix)
    }

    /// A short read as this file's [`FormatError::Truncated`] (a slice reader has no other
    /// failure).
    fn truncated(&self, e: ReadError) -> FormatError {
        match e {
            ReadError::Short {
                what,
                offset,
                needed,
                available,
            } => FormatError::Truncated {
                origin: self.origin.to_string(),
                what,
                offset: self.base + offset,
                expected: needed,
                available,
            },
            other => self.corrupt_at(self.offset(), other.to_string()),
        }
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        self.le.take(n, what).map_err(|e| self.truncated(e))
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        self.le.array(what).map_err(|e| self.truncated(e))
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, FormatError> {
        self.le.u8(what).map_err(|e| self.truncated(e))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        self.le.u32(what).map_err(|e| self.truncated(e))
    }
    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, FormatError> {
        self.le.i32(what).map_err(|e| self.truncated(e))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        self.le.u64(what).map_err(|e| self.truncated(e))
    }
    pub(crate) fn f32(&mut self, what: &str) -> Result<f32, FormatError> {
        self.le.f32(what).map_err(|e| self.truncated(e))
    }

    /// A length/count stored as u64, checked against `max` (so a damaged length cannot ask for
    /// an absurd allocation).
    pub(crate) fn len(&mut self, what: &str, max: usize) -> Result<usize, FormatError> {
        let at = self.offset();
        let v = self.u64(what)?;
        if v > max as u64 {
            return Err(self.corrupt_at(at, format!("{what} is {v}, at most {max} allowed")));
        }
        Ok(v as usize)
    }

    /// A count of elements of `elem_size` bytes that must all fit in the remaining data.
    pub(crate) fn count(&mut self, what: &str, elem_size: usize) -> Result<usize, FormatError> {
        let at = self.offset();
        let v = self.u64(what)?;
        let avail = self.remaining() as u64;
        let need = v.checked_mul(elem_size as u64);
        match need {
            Some(need) if need <= avail => Ok(v as usize),
            _ => Err(FormatError::Truncated {
                origin: self.origin.to_string(),
                what: format!(
                    "{what} ({v} element(s) of {elem_size} byte(s), count at offset {at})"
                ),
                offset: self.offset(),
                expected: need.unwrap_or(u64::MAX),
                available: avail,
            }),
        }
    }

    pub(crate) fn str(&mut self, what: &str) -> Result<String, FormatError> {
        let n = self.count(what, 1)?;
        let at = self.offset();
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| self.corrupt_at(at, format!("{what} is not valid UTF-8")))
    }

    pub(crate) fn f32s(&mut self, what: &str) -> Result<Vec<f32>, FormatError> {
        let n = self.count(what, 4)?;
        let b = self.take(n * 4, what)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub(crate) fn corrupt_at(&self, offset: u64, reason: String) -> FormatError {
        FormatError::Corrupt {
            origin: self.origin.to_string(),
            offset,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_known_values() {
        let mut h = Fnv64::new();
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn reader_reports_truncation_offsets() {
        let data = [1u8, 0, 0, 0, 9];
        let mut r = Reader::new(&data, 100, "t");
        assert_eq!(r.u32("a").unwrap(), 1);
        match r.u32("b") {
            Err(FormatError::Truncated {
                offset,
                expected,
                available,
                ..
            }) => assert_eq!((offset, expected, available), (104, 4, 1)),
            other => panic!("{other:?}"),
        }
    }
}
