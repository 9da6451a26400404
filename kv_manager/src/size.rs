//! The limits on every dimension of a cache, and checked arithmetic for the sizes, counts and offsets
//! derived from them.
//!
//! Every dimension comes from input (a YAML config, a command line, a compiled model's header), so
//! each has an explicit maximum that no real model reaches, enforced by [`crate::Geometry::validate`]
//! before anything is sized or allocated. The limits bound the small per-buffer tables (encodings,
//! tensor ids, offsets) to a few MB; the products that can still be large (region bytes, bytes
//! copied over a whole run) go through [`Size`], whose overflow is a typed error naming the quantity.
//!
//! | limit | value | why it is enough |
//! |---|---|---|
//! | [`MAX_LAYERS`] | 4,096 | the deepest public LLMs have about 128 layers (Llama-3.1-405B: 126) |
//! | [`MAX_HEADS`] | 4,096 | attention and KV heads; the widest have 128 query heads |
//! | [`MAX_HEAD_DIM`] | 4,096 | real head sizes are 64..256 |
//! | [`MAX_BUFFERS`] | 262,144 | B = 2 x layers x kv_heads; Llama-3.1-405B has 2,016, a 160-layer MHA model with 128 heads 40,960 |
//! | [`MAX_CONTEXT`] | 16,777,216 (2^24) | 16x the longest contexts shipped today (1M tokens) |
//! | [`MAX_AR_VARIANTS`] | 64 | deployments use 1..4 graphs sharing a cache |
//! | [`MAX_RESERVE_ROWS`] | 67,108,864 (2^26) | a `shift` reservation of 4 x [`MAX_CONTEXT`]; `2x` needs 2 x S |
//!
//! With these limits a region is at most 2^18 buffers x 2^26 rows x 2^14 bytes = 2^58 bytes, so on
//! 64-bit targets only run totals (bytes copied by `naive` over a whole 2^24-token context) can
//! overflow; on 32-bit targets the region itself can, and both are reported, never wrapped.

use crate::KvError;

/// Most layers a geometry may have.
pub const MAX_LAYERS: usize = 1 << 12;
/// Most attention heads, and most KV heads, a geometry may have.
pub const MAX_HEADS: usize = 1 << 12;
/// Largest head dimension D.
pub const MAX_HEAD_DIM: usize = 1 << 12;
/// Most K/V buffers B = 2 x layers x kv_heads.
pub const MAX_BUFFERS: usize = 1 << 18;
/// Largest context length S.
pub const MAX_CONTEXT: usize = 1 << 24;
/// Most AR variants sharing one cache.
pub const MAX_AR_VARIANTS: usize = 64;
/// Largest `shift` reservation R, in rows per buffer.
pub const MAX_RESERVE_ROWS: usize = 1 << 26;

/// A size, count or offset computed with checked arithmetic: the first overflow sticks, and
/// [`Size::get`] reports it as [`KvError::SizeOverflow`] naming the quantity.
///
/// ```
/// use kv_manager::Size;
/// assert_eq!(Size::new("region bytes", 3).times(4).plus(1).get(), Ok(13));
/// assert!(Size::new("region bytes", usize::MAX).times(2).get().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a Size is only checked by `get`"]
pub struct Size {
    what: &'static str,
    value: Option<usize>,
}

impl Size {
    /// Starts the computation of `what` (e.g. `"region bytes"`) from `value`.
    pub fn new(what: &'static str, value: usize) -> Size {
        Size {
            what,
            value: Some(value),
        }
    }

    /// `self x n`.
    pub fn times(self, n: usize) -> Size {
        self.map(|v| v.checked_mul(n))
    }

    /// `self + n`.
    pub fn plus(self, n: usize) -> Size {
        self.map(|v| v.checked_add(n))
    }

    /// `self + other`, where `other` may itself have overflowed.
    pub fn plus_size(self, other: Size) -> Size {
        match other.value {
            Some(n) => self.plus(n),
            None => Size {
                value: None,
                what: other.what,
            },
        }
    }

    /// `self - n` (going below zero is an overflow too).
    pub fn minus(self, n: usize) -> Size {
        self.map(|v| v.checked_sub(n))
    }

    fn map(self, f: impl FnOnce(usize) -> Option<usize>) -> Size {
        Size {
            value: self.value.and_then(f),
            ..self
        }
    }

    /// The value, or [`KvError::SizeOverflow`] naming the quantity.
    pub fn get(self) -> Result<usize, KvError> {
        self.value.ok_or(KvError::SizeOverflow { what: self.what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_sticks_and_names_the_quantity() {
        let e = Size::new("rows copied", usize::MAX)
            .plus(1)
            .minus(5)
            .times(0)
            .get()
            .unwrap_err();
        assert_eq!(
            e,
            KvError::SizeOverflow {
                what: "rows copied"
            }
        );
        assert_eq!(
            e.to_string(),
            format!("rows copied overflow the {}-bit size type", usize::BITS)
        );
        assert!(Size::new("x", 1).minus(2).get().is_err());
        assert_eq!(Size::new("x", 7).minus(2).times(3).plus(1).get(), Ok(16));
        let over = Size::new("bytes copied", usize::MAX).times(2);
        assert_eq!(
            Size::new("rows", 1).plus_size(over).get(),
            Err(KvError::SizeOverflow {
                what: "bytes copied"
            })
        );
        assert_eq!(
            Size::new("rows", 1).plus_size(Size::new("x", 2)).get(),
            Ok(3)
        );
    }

    #[test]
    fn the_largest_region_fits_on_64_bit() {
        let bytes = Size::new("region bytes", MAX_BUFFERS)
            .times(MAX_RESERVE_ROWS)
            .times(MAX_HEAD_DIM * 4)
            .get();
        assert_eq!(bytes.is_ok(), usize::BITS == 64);
    }
}
