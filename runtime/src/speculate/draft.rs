//! `draft:PATH[:K]`: a second, cheaper model sharing the tokenizer proposes K tokens greedily, on
//! its own session and cache.
//!
//! Each step the draft's cache is brought to the target's text by prefix reuse
//! ([`Session::prefill_reusing`]: roll back to the common prefix, prefill the rest, usually the one
//! or two tokens the target accepted or chose), then it decodes K tokens. A lower-precision build of
//! the target's own model serves as a draft (the CLI compiles PATH with i8 weights and u8 K/V): it
//! agrees with the target on most tokens, and pays off where its step is much cheaper than the
//! target's (a target with f16/f32 weights; on HTP, a draft of fewer layers or a smaller model).

use super::{Proposal, SpeculateError, Speculator, during};
use crate::backend::Backend;
use crate::sampler::{Sampler, SamplerOptions};
use crate::session::Session;

/// A draft model on its own session.
pub struct DraftModel<B: Backend> {
    session: Session<B>,
    k: usize,
    label: String,
}

impl<B: Backend> DraftModel<B> {
    /// Proposes `k` tokens per step from `session` (a model sharing the target's tokenizer);
    /// `label` names it (`draft:PATH`).
    pub fn new(session: Session<B>, k: usize, label: String) -> DraftModel<B> {
        DraftModel { session, k, label }
    }

    /// The draft's session (its cache and counters).
    pub fn session(&self) -> &Session<B> {
        &self.session
    }
}

impl<B: Backend> std::fmt::Debug for DraftModel<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("label", &self.label)
            .field("len", &self.session.len())
            .finish()
    }
}

impl<B: Backend> Speculator for DraftModel<B> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn max_proposal(&self) -> usize {
        self.k
    }

    fn propose(&mut self, history: &[u32], max: usize) -> Result<Proposal, SpeculateError> {
        let max = max.min(self.k);
        // A draft that cannot hold the text and its proposal proposes nothing (plain steps).
        if history.is_empty() || history.len() + max > self.session.capacity() {
            return Ok(Proposal::default());
        }
        let what = "the draft model";
        self.session
            .prefill_reusing(history)
            .map_err(during(what))?;
        let mut greedy = Sampler::new(SamplerOptions {
            temperature: 0.0,
            ..SamplerOptions::default()
        })
        .map_err(|e| during(what)(e.into()))?;
        let mut tokens = Vec::with_capacity(max);
        while tokens.len() < max {
            let t = self.session.sample(&mut greedy).map_err(during(what))?;
            tokens.push(t);
            if tokens.len() < max {
                self.session.decode(t).map_err(during(what))?;
            }
        }
        Ok(Proposal { tokens, class: 0 })
    }
}
