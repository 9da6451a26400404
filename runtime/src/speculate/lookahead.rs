//! `lookahead:W,N,G`: Jacobi iteration with an n-gram pool (Genie's `lade` with `window`, `ngram`
//! and `gcap`).
//!
//! Every verification step is also a Jacobi step: row `i` of the AR-n step gives the target's
//! greedy token after the run's first `i + 1` tokens. After the accepted prefix, the rows' greedy
//! tokens are the next iterate of the guesses for the positions that follow, so the speculator
//! keeps them (up to W) and proposes them next. The whole guessed continuation (the step's first
//! token and every row's greedy token) is cut into N-grams that go into a pool keyed by their
//! first token, at most G per key, most recent first, as do the text's own N-grams (prompt and
//! accepted tokens); when the text's last token keys an N-gram,
//! its N - 1 tokens are proposed before the Jacobi guesses. Where there are no guesses (at the
//! start, after a plain step), they are seeded from the text ([`seed`]).
//!
//! Genie and the lookahead paper run the guess window and the n-gram verification in the same
//! forward pass through a two-dimensional mask. htpkv's static graphs run one causal run per step,
//! so each step verifies either a pool n-gram or the Jacobi window: the window converges more
//! slowly, and acceptance is the measure (`--stats`). Verification is the same for every
//! speculator, so the text stays plain decoding's.

use std::collections::{HashMap, VecDeque};

use super::{Proposal, SpeculateError, Speculator};

/// The lookahead speculator.
#[derive(Debug, Clone)]
pub struct Lookahead {
    window: usize,
    ngram: usize,
    cap: usize,
    /// N-grams' last N - 1 tokens keyed by their first, most recent first.
    pool: HashMap<u32, VecDeque<Vec<u32>>>,
    /// The Jacobi guesses for the tokens after the next one.
    guesses: Vec<u32>,
    /// How much of the text its n-grams were harvested from.
    harvested: usize,
}

/// Proposal class of a pool n-gram (the planner tracks acceptance per class).
const CLASS_POOL: usize = 2;
/// Proposal class of the Jacobi window.
const CLASS_JACOBI: usize = 1;

impl Lookahead {
    /// `window` W Jacobi guesses, `ngram` N (at least 2), at most `cap` G n-grams per first token.
    pub fn new(window: usize, ngram: usize, cap: usize) -> Lookahead {
        Lookahead {
            window,
            ngram: ngram.max(2),
            cap: cap.max(1),
            pool: HashMap::new(),
            guesses: Vec::new(),
            harvested: 0,
        }
    }

    /// Puts every N-gram of `seq` into the pool (a repeated one moves to the front).
    fn harvest(&mut self, seq: &[u32]) {
        for g in seq.windows(self.ngram) {
            let list = self.pool.entry(g[0]).or_default();
            list.retain(|c| c[..] != g[1..]);
            list.push_front(g[1..].to_vec());
            list.truncate(self.cap);
        }
    }
}

impl Speculator for Lookahead {
    fn name(&self) -> String {
        format!("lookahead:{},{},{}", self.window, self.ngram, self.cap)
    }

    fn max_proposal(&self) -> usize {
        self.window.max(self.ngram - 1)
    }

    fn propose(&mut self, history: &[u32], max: usize) -> Result<Proposal, SpeculateError> {
        // The text's own n-grams (prompt and accepted tokens) join the pool as they appear.
        let from = self
            .harvested
            .min(history.len())
            .saturating_sub(self.ngram - 1);
        self.harvest(&history[from..]);
        self.harvested = history.len();
        let last = history.last().copied();
        if let Some(found) = last.and_then(|t| self.pool.get(&t)).and_then(|l| l.front()) {
            let tokens = found[..found.len().min(max)].to_vec();
            return Ok(Proposal {
                tokens,
                class: CLASS_POOL,
            });
        }
        if self.guesses.is_empty() {
            self.guesses = seed(history, self.window);
        }
        let n = self.guesses.len().min(max).min(self.window);
        Ok(Proposal {
            tokens: self.guesses[..n].to_vec(),
            class: CLASS_JACOBI,
        })
    }

    fn observe(&mut self, run: &[u32], greedy: &[u32], accepted: usize) {
        let mut seq = Vec::with_capacity(1 + greedy.len());
        seq.extend(run.first());
        seq.extend_from_slice(greedy);
        self.harvest(&seq);
        // Row `accepted` gave the next token; the rows after it are the next Jacobi iterate.
        self.guesses = greedy.get(accepted + 1..).unwrap_or(&[]).to_vec();
        self.guesses.truncate(self.window);
    }
}

/// First Jacobi guesses where there are none (at the start, or after a plain step): what followed
/// the text's ending where it occurred before, else the text's last `window` tokens (Jacobi
/// converges from any start; text-like guesses converge sooner).
fn seed(history: &[u32], window: usize) -> Vec<u32> {
    let (found, _) = super::PromptLookup::lookup(history, window);
    if !found.is_empty() {
        return found.to_vec();
    }
    history[history.len().saturating_sub(window)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_proposes_the_latest_ngram_of_the_last_token_before_the_jacobi_guesses() {
        let mut l = Lookahead::new(3, 3, 2);
        // run [5, 6, 7] verified: greedy rows 6, 9, 4; one proposed token accepted (6).
        l.observe(&[5, 6, 7], &[6, 9, 4], 1);
        // Pool: 5 -> [6, 9], 6 -> [9, 4]; guesses after the accepted prefix and next (9): [4].
        assert_eq!(l.propose(&[1, 5], 4).unwrap().tokens, vec![6, 9]);
        assert_eq!(l.propose(&[1, 6], 1).unwrap().tokens, vec![9]);
        let jacobi = l.propose(&[1, 9], 4).unwrap();
        assert_eq!((jacobi.tokens, jacobi.class), (vec![4], CLASS_JACOBI));
        // The text's own n-grams join the pool: 2 -> [3, 1] from [1, 2, 3, 1, 2].
        let mut l = Lookahead::new(3, 3, 2);
        let p = l.propose(&[1, 2, 3, 1, 2], 4).unwrap();
        assert_eq!((p.tokens, p.class), (vec![3, 1], CLASS_POOL));
        // No n-gram and no guesses: seeded from the text's end.
        let mut l = Lookahead::new(4, 3, 2);
        assert_eq!(
            l.propose(&[10, 11, 12], 4).unwrap().tokens,
            vec![10, 11, 12]
        );
        // A newer n-gram of the same first token goes first; the cap keeps two.
        l.observe(&[5, 8, 8], &[8, 8, 8], 0);
        l.observe(&[5, 7, 7], &[7, 7, 7], 0);
        assert_eq!(l.propose(&[5], 4).unwrap().tokens, vec![7, 7]);
        assert_eq!(l.pool[&5].len(), 2);
    }
}
