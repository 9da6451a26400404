//! llama2.c tokenizer (`tokenizer.bin` / `tok512.bin`): a SentencePiece BPE vocabulary exported as
//! `i32 max_token_length`, then per id `f32 score, i32 len, len bytes`.
//!
//! Encoding follows llama2.c: optional BOS, a dummy-prefix space when the text is non-empty, one
//! token per Unicode scalar if the vocabulary has it, otherwise its UTF-8 bytes as byte-fallback
//! tokens (`byte + 3`), then repeatedly merge the adjacent pair whose concatenation is in the
//! vocabulary with the highest score (leftmost on ties), optional EOS.

use std::collections::HashMap;
use std::path::Path;

use super::ModelError;
use crate::fsio::{FileKind, read_capped};
use crate::le::{LeReader, ReadError};

/// A loaded vocabulary with scores and a piece → id lookup.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    max_token_length: usize,
    /// The longest piece, in bytes (the file's `max_token_length` is not trusted).
    max_piece_bytes: usize,
    /// True when some piece is empty: then a merge can cover more text than its piece holds, and
    /// [`Tokenizer::min_tokens`] gives no bound.
    has_empty_piece: bool,
    lookup: HashMap<Vec<u8>, u32>,
}

/// One symbol of the merge loop: a token in a doubly linked list.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    /// Incremented whenever `id` changes, to recognise stale candidates.
    generation: u32,
    alive: bool,
}

/// A candidate merge of symbol `left` with its successor `right` into `id`.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    id: u32,
    left_generation: u32,
    right_generation: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    /// Higher score first, then the leftmost pair (the heap pops the greatest).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Parses `<0xNN>` into the byte `NN`.
/// How many whole tokenizer entries (score, length, bytes) `rest` holds from its start, to report
/// the real size of a tokenizer with more entries than the vocabulary.
fn whole_entries(rest: &[u8]) -> usize {
    let mut r = LeReader::from_slice(rest);
    let mut n = 0;
    while let (Ok(_), Ok(len)) = (r.f32(""), r.i32("")) {
        if len < 0 || r.take(len as usize, "").is_err() {
            break;
        }
        n += 1;
    }
    n
}

fn byte_piece(piece: &[u8]) -> Option<u8> {
    if piece.len() == 6 && piece.starts_with(b"<0x") && piece[5] == b'>' {
        let hex = std::str::from_utf8(&piece[3..5]).ok()?;
        u8::from_str_radix(hex, 16).ok()
    } else {
        None
    }
}

impl Tokenizer {
    /// Beginning-of-sequence id.
    pub const BOS: u32 = 1;
    /// End-of-sequence id.
    pub const EOS: u32 = 2;
    /// Offset of byte-fallback tokens: byte `b` is token `b + 3`.
    pub const BYTE_OFFSET: u32 = 3;

    /// Reads a tokenizer file holding exactly `vocab_size` entries.
    /// The file is read under [`FileKind::TOKENIZER`]'s cap.
    pub fn load(path: &Path, vocab_size: usize) -> Result<Tokenizer, ModelError> {
        let bytes = read_capped(path, FileKind::TOKENIZER)?;
        Tokenizer::from_bytes(&bytes, vocab_size, &path.display().to_string())
    }

    /// Parses a tokenizer from memory; `origin` labels errors.
    ///
    /// Errors: [`ModelError::Truncated`] naming the entry that is cut off (or, when the data ends
    /// exactly between entries, [`ModelError::VocabMismatch`] with the number of entries present);
    /// [`ModelError::BadTokenizer`] for a negative length or max_token_length;
    /// [`ModelError::VocabMismatch`] when bytes remain after `vocab_size` entries.
    pub fn from_bytes(
        bytes: &[u8],
        vocab_size: usize,
        origin: &str,
    ) -> Result<Tokenizer, ModelError> {
        // Offsets count from the start of `bytes`, so a short read's end is the size needed.
        let truncated = |e: ReadError| match e {
            ReadError::Short {
                what,
                offset,
                needed,
                available,
            } => ModelError::Truncated {
                origin: origin.to_owned(),
                what,
                expected: offset + needed,
                found: offset + available,
            },
            // A slice reader has no other failure.
            other => ModelError::BadTokenizer {
                origin: origin.to_owned(),
                index: 0,
                reason: other.to_string(),
            },
        };
        let mut r = LeReader::from_slice(bytes);
        let max_len = r.i32("max_token_length").map_err(truncated)?;
        if max_len < 0 {
            return Err(ModelError::BadTokenizer {
                origin: origin.to_owned(),
                index: 0,
                reason: format!("max_token_length is negative ({max_len})"),
            });
        }
        let mut pieces = Vec::with_capacity(vocab_size);
        let mut scores = Vec::with_capacity(vocab_size);
        for id in 0..vocab_size {
            if r.remaining() == 0 {
                return Err(ModelError::VocabMismatch {
                    origin: origin.to_owned(),
                    expected: vocab_size,
                    found: id,
                });
            }
            let score = r
                .f32(format_args!("tokenizer entry {id} (score)"))
                .map_err(truncated)?;
            let len = r
                .i32(format_args!("tokenizer entry {id} (length)"))
                .map_err(truncated)?;
            if score.is_nan() {
                return Err(ModelError::BadTokenizer {
                    origin: origin.to_owned(),
                    index: id,
                    reason: "the score is NaN".to_owned(),
                });
            }
            if len < 0 {
                return Err(ModelError::BadTokenizer {
                    origin: origin.to_owned(),
                    index: id,
                    reason: format!("negative byte length {len}"),
                });
            }
            let piece = r
                .take(
                    len as usize,
                    format_args!("tokenizer entry {id} ({len} bytes)"),
                )
                .map_err(truncated)?;
            pieces.push(piece.to_vec());
            scores.push(score);
        }
        if r.remaining() != 0 {
            return Err(ModelError::VocabMismatch {
                origin: origin.to_owned(),
                expected: vocab_size,
                found: vocab_size + whole_entries(r.rest()).max(1),
            });
        }
        Ok(Tokenizer::from_pieces(pieces, scores, max_len as usize))
    }

    /// Builds a tokenizer from pieces and scores (same length; id = index). When a piece occurs
    /// twice, lookups resolve to the first id.
    ///
    /// # Panics
    /// If `pieces` and `scores` differ in length.
    pub fn from_pieces(pieces: Vec<Vec<u8>>, scores: Vec<f32>, max_token_length: usize) -> Self {
        assert_eq!(
            pieces.len(),
            scores.len(),
            "pieces and scores differ in length"
        );
        let mut lookup = HashMap::with_capacity(pieces.len());
        for (id, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(id as u32);
        }
        let max_piece_bytes = pieces.iter().map(Vec::len).max().unwrap_or(0);
        let has_empty_piece = pieces.iter().any(Vec::is_empty);
        Tokenizer {
            pieces,
            scores,
            max_token_length,
            max_piece_bytes,
            has_empty_piece,
            lookup,
        }
    }

    /// Number of entries.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The raw bytes of piece `id` (e.g. `b" the"`, `b"<0x0A>"`), or `None` out of range.
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// The merge score of `id`, or `None` out of range.
    pub fn score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// The `max_token_length` field of the file.
    pub fn max_token_length(&self) -> usize {
        self.max_token_length
    }

    /// The id of an exact piece, if in the vocabulary.
    pub fn lookup(&self, piece: &[u8]) -> Option<u32> {
        self.lookup.get(piece).copied()
    }

    /// Byte-fallback id for `b` (`b + 3`), clamped into the vocabulary (`<unk>` = 0 if the
    /// vocabulary is too small to hold byte tokens).
    fn byte_token(&self, b: u8) -> u32 {
        let id = u32::from(b) + Self::BYTE_OFFSET;
        if (id as usize) < self.pieces.len() {
            id
        } else {
            0
        }
    }

    /// Encodes `text` with llama2.c's rules (see the module docs). With `bos`, the sequence
    /// starts with [`Self::BOS`]; with `eos`, it ends with [`Self::EOS`].
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(text.len() + 3);
        if bos {
            tokens.push(Self::BOS);
        }
        let start = tokens.len();
        if !text.is_empty() {
            tokens.push(self.lookup(b" ").unwrap_or_else(|| self.byte_token(b' ')));
        }
        let mut buf = [0u8; 4];
        for ch in text.chars() {
            let s = ch.encode_utf8(&mut buf).as_bytes();
            match self.lookup(s) {
                Some(id) => tokens.push(id),
                None => tokens.extend(s.iter().map(|&b| self.byte_token(b))),
            }
        }
        self.merge(&mut tokens, start);
        if eos {
            tokens.push(Self::EOS);
        }
        tokens
    }

    /// Greedy merges over `tokens[start..]`: the adjacent pair whose concatenation is in the
    /// vocabulary with the best score is merged, leftmost on ties, until no pair is left.
    ///
    /// The same result as rescanning all pairs after every merge, in O(n log n): the symbols form
    /// a linked list and the candidate pairs a max-heap keyed by (score, leftmost); a candidate
    /// is dropped when either of its symbols changed after it was pushed. A pair whose merged
    /// piece has a NaN score is never merged (files with NaN scores are refused on load).
    fn merge(&self, tokens: &mut Vec<u32>, start: usize) {
        let ids = &tokens[start..];
        let n = ids.len();
        if n < 2 {
            return;
        }
        let mut syms: Vec<Symbol> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                generation: 0,
                alive: true,
            })
            .collect();
        let mut heap = std::collections::BinaryHeap::new();
        let mut pair = Vec::with_capacity(2 * self.max_piece_bytes.max(8));
        for left in 0..n - 1 {
            self.push_candidate(&mut heap, &mut pair, &syms, left);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left, c.right);
            if !syms[l].alive
                || !syms[r].alive
                || syms[l].generation != c.left_generation
                || syms[r].generation != c.right_generation
            {
                continue;
            }
            syms[l].id = c.id;
            syms[l].generation += 1;
            syms[r].alive = false;
            syms[l].next = syms[r].next;
            if let Some(nn) = syms[r].next {
                syms[nn].prev = Some(l);
            }
            if let Some(p) = syms[l].prev {
                self.push_candidate(&mut heap, &mut pair, &syms, p);
            }
            self.push_candidate(&mut heap, &mut pair, &syms, l);
        }
        let merged: Vec<u32> = syms.iter().filter(|s| s.alive).map(|s| s.id).collect();
        tokens.truncate(start);
        tokens.extend(merged);
    }

    /// Pushes the pair (`left`, its successor) when its concatenation is a piece.
    fn push_candidate(
        &self,
        heap: &mut std::collections::BinaryHeap<Candidate>,
        pair: &mut Vec<u8>,
        syms: &[Symbol],
        left: usize,
    ) {
        let Some(right) = syms[left].next else {
            return;
        };
        pair.clear();
        pair.extend_from_slice(self.piece(syms[left].id).unwrap_or_default());
        pair.extend_from_slice(self.piece(syms[right].id).unwrap_or_default());
        let Some(id) = self.lookup(pair) else {
            return;
        };
        let score = self.scores.get(id as usize).copied().unwrap_or(f32::MIN);
        if score.is_nan() {
            return;
        }
        heap.push(Candidate {
            // + 0.0 turns -0.0 into 0.0, so that they tie as in a `>` comparison.
            score: score + 0.0,
            left,
            right,
            id,
            left_generation: syms[left].generation,
            right_generation: syms[right].generation,
        });
    }

    /// A lower bound on the number of tokens `text` encodes to (without BOS/EOS): when no piece
    /// is empty, every token stands for at most as many bytes of text as its piece has (a merged
    /// piece is the concatenation of its parts), so a text of `b` bytes (plus the dummy-prefix
    /// space) needs at least `ceil((b + 1) / longest piece)` tokens. With an empty piece in the
    /// vocabulary there is no such bound and this returns 0. Callers use it to refuse a prompt
    /// that cannot fit before encoding it.
    pub fn min_tokens(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        self.max_piece_bytes()
            .map_or(0, |b| (text.len() + 1).div_ceil(b))
    }

    /// The most bytes of text one token stands for (its longest piece), or `None` when a piece
    /// is empty (then a token may stand for no text and there is no such bound).
    pub fn max_piece_bytes(&self) -> Option<usize> {
        (!self.has_empty_piece).then_some(self.max_piece_bytes.max(1))
    }

    /// Bytes to print for `token` following `prev` (llama2.c's `decode`): the piece with its
    /// leading space removed when `prev` is BOS, and `<0xNN>` turned into the raw byte `NN`.
    /// Returns an empty vector for an id outside the vocabulary.
    pub fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8> {
        let Some(mut piece) = self.piece(token) else {
            return Vec::new();
        };
        if prev == Self::BOS && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        match byte_piece(piece) {
            Some(b) => vec![b],
            None => piece.to_vec(),
        }
    }

    /// Decodes a token sequence to bytes: BOS and EOS tokens are not printed (but a BOS still
    /// strips the next piece's leading space, so `decode(&encode(t, true, _)) == t`).
    /// Decoding starts as if preceded by `<unk>`, so without a leading BOS the dummy-prefix
    /// space is kept.
    pub fn decode(&self, tokens: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev = 0;
        for &t in tokens {
            if t != Self::BOS && t != Self::EOS {
                out.extend(self.decode_piece(prev, t));
            }
            prev = t;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary laid out like llama2.c's: unk, bos, eos, 256 byte tokens, then pieces.
    fn toy(extra: &[(&str, f32)]) -> Tokenizer {
        let mut pieces: Vec<Vec<u8>> =
            vec![b"<unk>".to_vec(), b"\n<s>\n".to_vec(), b"\n</s>\n".to_vec()];
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>").into_bytes()));
        let mut scores = vec![0.0; pieces.len()];
        for (p, s) in extra {
            pieces.push(p.as_bytes().to_vec());
            scores.push(*s);
        }
        Tokenizer::from_pieces(pieces, scores, 8)
    }

    #[test]
    fn merges_by_best_score_then_leftmost() {
        // ids: 259 " ", 260 "a", 261 "b", 262 "ab", 263 " a", 264 "ba"
        let t = toy(&[
            (" ", 0.0),
            ("a", 0.0),
            ("b", 0.0),
            ("ab", -1.0),
            (" a", -2.0),
            ("ba", -0.5),
        ]);
        // " abab": pairs " a"(-2) "ab"(-1) "ba"(-0.5) "ab"(-1) -> merge "ba" first:
        // [" ", "a", "ba", "b"]; then " a"(-2) vs nothing else ("aba","bab" absent) -> [" a","ba","b"].
        assert_eq!(t.encode("abab", false, false), vec![263, 264, 261]);
        // tie: " aa" has " a"(-2) and "aa" absent -> " a","a"
        assert_eq!(t.encode("aa", true, true), vec![1, 263, 260, 2]);
        assert_eq!(t.encode("", true, false), vec![1]);
        assert_eq!(t.encode("", false, false), Vec::<u32>::new());
        // A degenerate empty vocabulary does not panic.
        let empty = Tokenizer::from_pieces(Vec::new(), Vec::new(), 0);
        assert_eq!(empty.encode("ab", true, true), vec![1, 0, 0, 0, 2]);
        assert_eq!(empty.decode(&[1, 0, 5]), b"");
    }

    #[test]
    fn equal_scores_merge_leftmost() {
        // "ab" and "bc" both score -1: in " abc" the leftmost ("ab") wins, leaving "ab","c".
        let t = toy(&[
            (" ", 0.0),
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -1.0),
            ("bc", -1.0),
        ]);
        let ab = t.lookup(b"ab").unwrap();
        let c = t.lookup(b"c").unwrap();
        assert_eq!(t.encode("abc", false, false), vec![259, ab, c]);
    }

    #[test]
    fn byte_fallback_and_decode() {
        let t = toy(&[(" ", 0.0), ("h", 0.0), ("i", 0.0)]);
        let ids = t.encode("hié", true, false);
        // é = C3 A9, not in the vocabulary -> bytes + 3.
        assert_eq!(&ids[ids.len() - 2..], &[0xC3 + 3, 0xA9 + 3]);
        assert_eq!(t.decode(&ids), "hié".as_bytes());
        assert_eq!(t.decode_piece(1, 259), b"");
        assert_eq!(t.decode_piece(5, 0x0A + 3), b"\n");
        assert_eq!(t.decode_piece(5, 9999), b"");
    }

    fn file(max_len: i32, entries: &[(f32, i32, &[u8])]) -> Vec<u8> {
        let mut b = max_len.to_le_bytes().to_vec();
        for (s, l, p) in entries {
            b.extend(s.to_le_bytes());
            b.extend(l.to_le_bytes());
            b.extend(*p);
        }
        b
    }

    #[test]
    fn parse_errors() {
        let good = file(2, &[(0.0, 1, b"a"), (-1.0, 2, b"ab")]);
        let t = Tokenizer::from_bytes(&good, 2, "g").unwrap();
        assert_eq!(t.piece(1), Some(&b"ab"[..]));
        assert_eq!(t.score(1), Some(-1.0));
        assert!(matches!(
            Tokenizer::from_bytes(&good, 3, "g"),
            Err(ModelError::VocabMismatch {
                expected: 3,
                found: 2,
                ..
            })
        ));
        assert!(matches!(
            Tokenizer::from_bytes(&good, 1, "g"),
            Err(ModelError::VocabMismatch {
                expected: 1,
                found: 2,
                ..
            })
        ));
        let neg = file(2, &[(0.0, -1, b"")]);
        assert!(matches!(
            Tokenizer::from_bytes(&neg, 1, "n"),
            Err(ModelError::BadTokenizer { index: 0, .. })
        ));
        let cut = &good[..good.len() - 1];
        match Tokenizer::from_bytes(cut, 2, "c") {
            Err(ModelError::Truncated {
                what,
                expected,
                found,
                ..
            }) => {
                assert!(what.contains("entry 1"), "{what}");
                assert_eq!((expected, found), (good.len() as u64, cut.len() as u64));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Tokenizer::from_bytes(&[1, 0], 2, "e"),
            Err(ModelError::Truncated { .. })
        ));
    }
}
