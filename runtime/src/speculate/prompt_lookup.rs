//! `prompt-lookup[:K]`: proposes what followed the last occurrence of the text's own ending.
//!
//! The longest suffix of the history (prompt and generated tokens) of at most
//! [`PromptLookup::MAX_NGRAM`] tokens that occurred before is looked up (longest first, most recent
//! occurrence first), and the K tokens that followed that occurrence are proposed. It costs no
//! model call and a scan of the history per step; it helps when the answer repeats spans of the
//! prompt or of itself (rewriting, editing, summarising, code), and proposes nothing otherwise.

use super::{Proposal, SpeculateError, Speculator};

/// The prompt-lookup speculator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptLookup {
    k: usize,
}

impl PromptLookup {
    /// The longest n-gram matched.
    pub const MAX_NGRAM: usize = 3;

    /// Proposes up to `k` tokens per step.
    pub fn new(k: usize) -> PromptLookup {
        PromptLookup { k }
    }

    /// The tokens that followed the most recent earlier occurrence of the longest suffix n-gram of
    /// `history`, at most `max`, and the n-gram's length; empty when no suffix occurred before.
    pub fn lookup(history: &[u32], max: usize) -> (&[u32], usize) {
        for n in (1..=Self::MAX_NGRAM.min(history.len().saturating_sub(1))).rev() {
            let suffix = &history[history.len() - n..];
            // Occurrences ending before the suffix itself, most recent first.
            let found = (0..history.len() - n)
                .rev()
                .find(|&start| &history[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                return (&history[from..(from + max).min(history.len())], n);
            }
        }
        (&[], 0)
    }
}

impl Speculator for PromptLookup {
    fn name(&self) -> String {
        format!("prompt-lookup:{}", self.k)
    }

    fn max_proposal(&self) -> usize {
        self.k
    }

    fn propose(&mut self, history: &[u32], max: usize) -> Result<Proposal, SpeculateError> {
        let (tokens, n) = Self::lookup(history, max.min(self.k));
        Ok(Proposal {
            tokens: tokens.to_vec(),
            class: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_most_recent_match_is_continued() {
        // "5 6 7" occurred at 1..4 (followed by 8 9) and "7" alone at 10 (followed by 3).
        let h = [4, 5, 6, 7, 8, 9, 1, 7, 3, 2, 7, 5, 6, 7];
        assert_eq!(PromptLookup::lookup(&h, 2), (&[8, 9][..], 3));
        let all = [8, 9, 1, 7, 3, 2, 7, 5, 6, 7];
        assert_eq!(PromptLookup::lookup(&h, 10), (&all[..], 3));
        // Only a 1-gram matches: its most recent occurrence wins.
        assert_eq!(PromptLookup::lookup(&[1, 2, 9, 1, 3, 1], 1), (&[3][..], 1));
        // Nothing occurred before.
        assert!(PromptLookup::lookup(&[1, 2, 3], 4).0.is_empty());
        assert!(PromptLookup::lookup(&[], 4).0.is_empty());
        assert!(PromptLookup::lookup(&[7], 4).0.is_empty());
    }
}
