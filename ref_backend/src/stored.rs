//! Where a matrix's values live: in a vector of its own, or in the bytes of the compiled file it
//! was read from.
//!
//! [`CompiledModel::read`](crate::CompiledModel::read) reads a file once, whole, into one buffer
//! ([`FileBytes`]), checks it (checksum, every count, every value) and builds the matrices as
//! views of that buffer instead of copying their values out of it: the file's bytes are the
//! weights' one copy in memory. Both element types read in place have alignment 1: i8, and f16
//! as its little-endian bytes ([`F16Le`]), so wherever the format puts them, nothing is copied.
//!
//! The buffer is an ordinary allocation, not a mapping of the file: a file truncated or
//! rewritten on disk after it was read changes nothing in memory (no `SIGBUS`, no weights other
//! than the ones checked), at the cost of the pages being anonymous memory rather than page cache.

use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::kernels::F16Le;

/// A compiled file's bytes, shared by every matrix that reads its values from them.
pub(crate) type FileBytes = Arc<Vec<u8>>;

/// An element type whose values can be read in place from a file's little-endian bytes.
pub(crate) trait InPlace: Sized {
    /// `bytes` as values; `None` when they are not a whole number of values.
    fn view(bytes: &[u8]) -> Option<&[Self]>;
}

impl InPlace for i8 {
    fn view(bytes: &[u8]) -> Option<&[i8]> {
        Some(bytemuck::cast_slice(bytes))
    }
}

impl InPlace for F16Le {
    fn view(bytes: &[u8]) -> Option<&[F16Le]> {
        let (values, rest) = bytes.as_chunks::<2>();
        rest.is_empty().then_some(values)
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
    fn i8_and_f16_values_are_read_in_place_wherever_they_start() {
        let file: FileBytes = Arc::new(vec![0x01, 0xff, 0x00, 0x3c, 0x00, 0xbc, 0x40]);
        let q = Stored::<i8>::in_file(&file, 1..7).expect("i8 reads in place");
        assert_eq!(&*q, &[-1i8, 0, 60, 0, -68, 64]);
        assert_eq!(q.own_bytes(), 0);
        assert!(Stored::<i8>::in_file(&file, 5..9).is_none(), "past the end");
        for (range, want) in [
            (2..6, [1.0, -1.0]),
            (3..7, [60.0 / 16_777_216.0, 2.3671875]),
        ] {
            let h = Stored::<F16Le>::in_file(&file, range).expect("f16 reads in place");
            assert_eq!([h[0], h[1]].map(crate::kernels::widen_f16), want);
        }
        assert!(
            Stored::<F16Le>::in_file(&file, 2..5).is_none(),
            "half a value"
        );
        let own = Stored::from(vec![3i8, 4]);
        assert_eq!(own.own_bytes(), 2);
        assert!(own.file().is_none() && q.file().is_some());
    }
}
