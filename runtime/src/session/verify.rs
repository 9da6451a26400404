//! Verification steps for speculative decoding (`crate::speculate`): run several proposed tokens
//! through one AR-n step, read every row's logits, then keep the first `k` rows.
//!
//! Protocol: [`Session::verify`] plans and runs the step without committing;
//! [`Session::accept`] commits the first `k` of the tokens verified (`1 <= k <=` the tokens given),
//! which leaves the cache exactly as `k` AR-1 decode steps would: the strategy's `commit(k)` makes
//! the first `k` new rows part of the window and drops the rest (a pointer move for
//! `shift`/`conveyor`, `k` row copies per buffer for `smart_mask`, one window move for `naive`),
//! and the next step's mask and positions start after the `k`-th token. A verified step that is
//! not accepted is dropped by the next plan, [`Session::rollback`] or [`Session::reset`].

use super::{Session, SessionError};
use crate::backend::Backend;

impl<B: Backend> Session<B> {
    /// The AR variant a verification of `tokens` tokens would run on now: the smallest compiled
    /// variant of at least `tokens` rows, else the largest one, among those whose rows fit in the
    /// cache's current geometry after the cached tokens. `None` when no variant of 2 or more rows
    /// fits (near the end of the context, where plain AR-1 decoding goes on).
    pub fn verify_variant(&self, tokens: usize) -> Option<usize> {
        let g = &self.cache.spec().geometry;
        let fits: Vec<usize> = (g.ar_variants.iter().copied())
            .filter(|&ar| ar >= 2 && self.cache.len() + ar <= g.capacity())
            .collect();
        let smallest_enough = fits.iter().copied().filter(|&ar| ar >= tokens).min();
        smallest_enough.or_else(|| fits.iter().copied().max())
    }

    /// Runs `tokens` (the next token and the proposed ones after it) through one step of the AR
    /// variant [`Session::verify_variant`] picks, without committing, and returns the logits of
    /// every token (`[tokens.len(), vocab]`: row `i` predicts the token after `tokens[i]`).
    pub fn verify(&mut self, tokens: &[u32]) -> Result<&[f32], SessionError> {
        let ar = self.verify_variant(tokens.len()).ok_or_else(|| {
            SessionError::Input(format!(
                "no AR variant of 2 or more rows has room to verify {} tokens after {} cached",
                tokens.len(),
                self.cache.len()
            ))
        })?;
        if tokens.len() > ar {
            return Err(SessionError::Input(format!(
                "{} tokens to verify, but the largest AR variant with room has {ar} rows",
                tokens.len()
            )));
        }
        let slot = self.slot_for(ar);
        self.check_step(slot, tokens)?;
        self.cache.plan(ar)?;
        self.verified.clear();
        self.execute(slot, tokens, None)?;
        self.verified.extend_from_slice(tokens);
        Ok(&self.logits[..tokens.len() * self.vocab])
    }

    /// Commits the first `accepted.len()` tokens of the step [`Session::verify`] ran (they must be
    /// its first tokens, in order); the last logits become those of the last accepted token.
    pub fn accept(&mut self, accepted: &[u32]) -> Result<(), SessionError> {
        if self.cache.pending_plan().is_none() || self.verified.is_empty() {
            return Err(SessionError::Input("no verified step to accept".into()));
        }
        if accepted.is_empty() || !self.verified.starts_with(accepted) {
            return Err(SessionError::Input(format!(
                "accepting {accepted:?}, which is not a non-empty prefix of the tokens verified"
            )));
        }
        let k = accepted.len();
        self.cache.commit(k)?;
        self.verified.clear();
        self.tokens.extend_from_slice(accepted);
        let row = (k - 1) * self.vocab;
        self.last_logits.clear();
        self.last_logits
            .extend_from_slice(&self.logits[row..row + self.vocab]);
        Ok(())
    }

    /// Adds the work of speculative decoding to the session's decode counters: `tokens` run into
    /// the cache in `seconds` (proposals included).
    pub fn record_decode(&mut self, tokens: usize, seconds: f64) {
        self.stats.decode_tokens += tokens;
        self.stats.decode_seconds += seconds;
    }
}
