//! The one bounded little-endian reader: every file format htpkv parses by hand (GGUF headers,
//! compiled models, saved sessions) reads its fields through [`LeReader`].
//!
//! The reader knows how many bytes the input holds and checks every read against what is left
//! before reading or allocating, so a damaged length can never ask for more memory than the input
//! has bytes. A failure is a [`ReadError`] naming the field and its offset; each format turns it
//! into its own error type (`GgufError::Truncated`, `FormatError::Truncated`,
//! `PersistError::Truncated`), so messages stay the format's own.
//!
//! Over a byte slice ([`LeReader::from_slice`]) [`LeReader::take`] borrows without copying; over
//! any [`Read`] ([`LeReader::new`], e.g. the start of a multi-gigabyte GGUF file) fields are
//! copied out as they are read.

use std::fmt::Display;
use std::io::Read;

/// A field could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Fewer bytes are left than the field needs.
    #[error("{what} at offset {offset} needs {needed} bytes, {available} left")]
    Short {
        /// The field.
        what: String,
        /// Offset of the field from the start of the input.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the input.
        available: u64,
    },
    /// The underlying reader failed (never for a slice).
    #[error("reading {what} at offset {offset}")]
    Io {
        /// The field.
        what: String,
        /// Offset of the field from the start of the input.
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

/// Reads little-endian fields from an input of known length, checking each against the bytes
/// left (see the [module docs](self)).
#[derive(Debug)]
pub struct LeReader<R> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read> LeReader<R> {
    /// A reader of the `len` bytes `r` yields from its current position.
    pub fn new(r: R, len: u64) -> Self {
        LeReader { r, pos: 0, len }
    }

    /// Offset of the next byte from the start of the input.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails unless `n` more bytes are left; reads nothing.
    pub fn need(&self, n: u64, what: impl Display) -> Result<(), ReadError> {
        let available = self.remaining();
        if n > available {
            return Err(ReadError::Short {
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                available,
            });
        }
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8], what: impl Display) -> Result<(), ReadError> {
        self.need(buf.len() as u64, &what)?;
        self.r.read_exact(buf).map_err(|source| ReadError::Io {
            what: what.to_string(),
            offset: self.pos,
            source,
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    /// The next `N` bytes.
    pub fn array<const N: usize>(&mut self, what: impl Display) -> Result<[u8; N], ReadError> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    /// A byte.
    pub fn u8(&mut self, what: impl Display) -> Result<u8, ReadError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: impl Display) -> Result<u32, ReadError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian i32.
    pub fn i32(&mut self, what: impl Display) -> Result<i32, ReadError> {
        self.array(what).map(i32::from_le_bytes)
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: impl Display) -> Result<u64, ReadError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A little-endian f32.
    pub fn f32(&mut self, what: impl Display) -> Result<f32, ReadError> {
        self.array(what).map(f32::from_le_bytes)
    }

    /// The next `n` bytes, copied; checked against the bytes left before anything is allocated.
    pub fn bytes(&mut self, n: u64, what: impl Display) -> Result<Vec<u8>, ReadError> {
        self.need(n, &what)?;
        let mut v = vec![0u8; n as usize];
        self.fill(&mut v, what)?;
        Ok(v)
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: u64, what: impl Display) -> Result<(), ReadError> {
        self.need(n, &what)?;
        let copied = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink());
        match copied {
            Ok(c) if c == n => {
                self.pos += n;
                Ok(())
            }
            Ok(_) => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            Err(e) => Err(e),
        }
        .map_err(|source| ReadError::Io {
            what: what.to_string(),
            offset: self.pos,
            source,
        })
    }
}

impl<'a> LeReader<&'a [u8]> {
    /// A reader of `data`.
    pub fn from_slice(data: &'a [u8]) -> Self {
        LeReader::new(data, data.len() as u64)
    }

    /// The next `n` bytes, borrowed.
    pub fn take(&mut self, n: usize, what: impl Display) -> Result<&'a [u8], ReadError> {
        self.need(n as u64, what)?;
        let (head, tail) = self.r.split_at(n);
        self.r = tail;
        self.pos += n as u64;
        Ok(head)
    }

    /// The bytes left, without consuming them.
    pub fn rest(&self) -> &'a [u8] {
        self.r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_little_endian_and_a_short_read_names_field_offset_and_sizes() {
        let data = [1u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 9];
        let mut r = LeReader::from_slice(&data);
        assert_eq!(r.u32("a").unwrap(), 1);
        assert_eq!(r.i32("b").unwrap(), -1);
        assert_eq!((r.position(), r.remaining(), r.rest()), (8, 1, &[9u8][..]));
        match r.u32(format_args!("field {}", 3)) {
            Err(ReadError::Short {
                what,
                offset,
                needed,
                available,
            }) => assert_eq!(
                (what.as_str(), offset, needed, available),
                ("field 3", 8, 4, 1)
            ),
            other => panic!("{other:?}"),
        }
        // A failed read consumes nothing.
        assert_eq!(r.take(1, "c").unwrap(), &[9]);
        assert!(r.take(1, "d").is_err());
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut r = LeReader::new(&[0u8; 4][..], 4);
        assert!(matches!(
            r.bytes(u64::MAX, "blob"),
            Err(ReadError::Short {
                needed: u64::MAX,
                available: 4,
                ..
            })
        ));
        r.skip(3, "pad").unwrap();
        assert_eq!(r.u8("last").unwrap(), 0);
    }

    #[test]
    fn a_stream_shorter_than_its_declared_length_is_an_io_error() {
        let mut r = LeReader::new(&[1u8, 2][..], 8);
        assert!(matches!(r.u32("x"), Err(ReadError::Io { offset: 0, .. })));
        let mut r = LeReader::new(&[1u8, 2][..], 8);
        assert!(matches!(r.skip(4, "pad"), Err(ReadError::Io { .. })));
    }
}
