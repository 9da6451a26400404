//! Where a matrix's values live: in a vector of its own, or in the bytes of the compiled file it
//! was read from.
//!
//! [`CompiledModel::read`](crate::CompiledModel::read) reads a file once, whole, into one buffer
//! ([`FileBytes`]), checks it (checksum, every count, every value) and builds the matrices as
//! views of that buffer instead of copying their values out of it: the file's bytes are the
//! weights' one copy in memory. An i8 matrix can always be viewed in place; an f16 matrix only
//! where its values start at an even address (the format does not align them), else it is copied.
//!
//! The buffer is an ordinary allocation, not a mapping of the file: a file truncated or
//! rewritten on disk after it was read changes nothing in memory (no `SIGBUS`, no weights other
//! than the ones checked), at the cost of the pages being anonymous memory rather than page cache.

use std::ops::{Deref, Range};
use std::sync::Arc;

/// A compiled file's bytes, shared by every matrix that reads its values from them.
pub(crate) type FileBytes = Arc<Vec<u8>>;

/// An element type whose values can be read in place from a file's little-endian bytes.
pub(crate) trait InPlace: Sized {
    /// `bytes` as values; `None` when they cannot be read in place (misaligned, a length that is
    /// not a whole number of values, or a host whose byte order differs from the file's).
    fn view(bytes: &[u8]) -> Option<&[Self]>;
}

impl InPlace for i8 {
    fn view(bytes: &[u8]) -> Option<&[i8]> {
        Some(bytemuck::cast_slice(bytes))
    }
}

impl InPlace for half::f16 {
    fn view(bytes: &[u8]) -> Option<&[half::f16]> {
        use half::slice::HalfBitsSliceExt;
        if cfg!(target_endian = "big") {
            return None;
        }
        let bits: &[u16] = bytemuck::try_cast_slice(bytes).ok()?;
        Some(bits.reinterpret_cast())
    }
}

/// A matrix's values: its own vector, or a range of the file's bytes read in place.
#[derive(Clone)]
pub(crate) enum Stored<T> {
    Own(Vec<T>),
    InFile {
        file: FileBytes,
        range: Range<usize>,
    },
}

impl<T: InPlace> Stored<T> {
    /// `range` of `file` read in place, or `None` where [`InPlace::view`] refuses it (or the
    /// range is outside the file).
    pub(crate) fn in_file(file: &FileBytes, range: Range<usize>) -> Option<Stored<T>> {
        T::view(file.get(range.clone())?)?;
        Some(Stored::InFile {
            file: Arc::clone(file),
            range,
        })
    }

    /// Bytes of memory held beyond the file's (0 for a view of the file).
    pub(crate) fn own_bytes(&self) -> usize {
        match self {
            Stored::Own(v) => std::mem::size_of_val(v.as_slice()),
            Stored::InFile { .. } => 0,
        }
    }

    /// The file the values are read from (`None` for values of their own).
    pub(crate) fn file(&self) -> Option<&FileBytes> {
        match self {
            Stored::Own(_) => None,
            Stored::InFile { file, .. } => Some(file),
        }
    }
}

impl<T> From<Vec<T>> for Stored<T> {
    fn from(v: Vec<T>) -> Stored<T> {
        Stored::Own(v)
    }
}

impl<T: InPlace> Deref for Stored<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Stored::Own(v) => v,
            Stored::InFile { file, range } => T::view(&file[range.clone()])
                .unwrap_or_else(|| unreachable!("a view `Stored::in_file` checked")),
        }
    }
}

impl<T: InPlace + PartialEq> PartialEq for Stored<T> {
    fn eq(&self, other: &Stored<T>) -> bool {
        **self == **other
    }
}

impl<T> std::fmt::Debug for Stored<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stored::Own(v) => write!(f, "Own({} values)", v.len()),
            Stored::InFile { range, .. } => write!(f, "InFile({range:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_values_are_read_in_place_and_f16_values_only_where_aligned() {
        let file: FileBytes = Arc::new(vec![0x01, 0xff, 0x00, 0x3c, 0x00, 0xbc, 0x7f]);
        let q = Stored::<i8>::in_file(&file, 1..7).expect("i8 reads in place");
        assert_eq!(&*q, &[-1i8, 0, 60, 0, -68, 127]);
        assert_eq!(q.own_bytes(), 0);
        assert!(Stored::<i8>::in_file(&file, 5..9).is_none(), "past the end");
        let even = (file.as_ptr() as usize).is_multiple_of(2);
        let (aligned, odd) = if even { (2..6, 1..5) } else { (1..5, 2..6) };
        let h = Stored::<half::f16>::in_file(&file, aligned).expect("aligned f16 reads in place");
        assert_eq!(h.len(), 2);
        if even {
            assert_eq!([h[0].to_f32(), h[1].to_f32()], [1.0, -1.0]);
        }
        assert!(Stored::<half::f16>::in_file(&file, odd).is_none());
        assert!(
            Stored::<half::f16>::in_file(&file, 2..5).is_none(),
            "half a value"
        );
        let own = Stored::from(vec![3i8, 4]);
        assert_eq!(own.own_bytes(), 2);
        assert!(own.file().is_none() && q.file().is_some());
    }
}
