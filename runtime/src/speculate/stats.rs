//! The counters of speculative decoding.

/// What speculative decoding did: its target calls, proposals, acceptances and their cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Target-model steps of the generation loop: verification steps and plain AR-1 steps (when
    /// nothing was proposed or no verification variant had room).
    pub calls: usize,
    /// Verification steps (one AR-n call each).
    pub verify_calls: usize,
    /// Tokens those calls ran into the cache (every call commits at least its first token).
    pub tokens: usize,
    /// Tokens proposed and verified.
    pub proposed: usize,
    /// Proposed tokens the target accepted.
    pub accepted: usize,
    /// Rows a verification computed for a proposed token and then dropped (rejected, or after a
    /// stop).
    pub rolled_back_rows: usize,
    /// Rows of the AR-n steps beyond the tokens given (padding; computed and dropped).
    pub padded_rows: usize,
    /// KV bytes the cache copied committing the rows of verification steps (0 with
    /// `shift`/`conveyor`, whose commit moves a pointer; `smart_mask` copies every kept row).
    pub commit_bytes_copied: usize,
    /// KV bytes the cache copied planning verification steps (`shift` rebases when a window end
    /// reaches its reservation, e.g. after slides; not a cost of accepting).
    pub plan_bytes_copied: usize,
    /// Wall time of proposing, of the verification steps and of the plain steps.
    pub propose_seconds: f64,
    pub verify_seconds: f64,
    pub plain_seconds: f64,
    /// Plain AR-1 steps.
    pub plain_calls: usize,
    /// Per AR variant used for verification: (AR, calls, seconds).
    pub variants: Vec<(usize, usize, f64)>,
}

impl SpecStats {
    /// Tokens run into the cache per target call.
    pub fn tokens_per_call(&self) -> f64 {
        ratio(self.tokens, self.calls)
    }

    /// Accepted share of the proposed tokens.
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted, self.proposed)
    }

    /// KV bytes copied by commits per token committed by a verification step.
    pub fn bytes_copied_per_token(&self) -> f64 {
        ratio(self.commit_bytes_copied, self.tokens - self.plain_calls)
    }

    /// Wall time of all the steps (proposals included).
    pub fn seconds(&self) -> f64 {
        self.propose_seconds + self.verify_seconds + self.plain_seconds
    }

    /// Mean wall time of a plain AR-1 step of this run, if there was one.
    pub fn plain_step_seconds(&self) -> Option<f64> {
        (self.plain_calls > 0).then(|| self.plain_seconds / self.plain_calls as f64)
    }

    /// Decode speedup against plain AR-1 decoding estimated within this run: the time
    /// [`SpecStats::tokens`] AR-1 steps take at the mean of this run's plain steps, over the time
    /// taken. `None` without a plain step to time. (`examples/spec_bench` measures the speedup
    /// against a plain run instead.)
    pub fn estimated_speedup(&self) -> Option<f64> {
        let step = self.plain_step_seconds()?;
        (self.seconds() > 0.0).then(|| step * self.tokens as f64 / self.seconds())
    }

    pub(crate) fn plain_step(&mut self, seconds: f64) {
        self.calls += 1;
        self.plain_calls += 1;
        self.tokens += 1;
        self.plain_seconds += seconds;
    }

    pub(crate) fn verify_step(&mut self, ar: usize, seconds: f64) {
        self.verify_seconds += seconds;
        match self.variants.iter_mut().find(|v| v.0 == ar) {
            Some(v) => (v.1, v.2) = (v.1 + 1, v.2 + seconds),
            None => {
                self.variants.push((ar, 1, seconds));
                self.variants.sort_by_key(|v| v.0);
            }
        }
    }

    /// One verification of `proposed` tokens on AR-`ar`: `accepted` of them matched, `kept` rows
    /// were committed, `[plan, commit]` KV bytes copied.
    pub(crate) fn outcome(
        &mut self,
        proposed: usize,
        accepted: usize,
        kept: usize,
        ar: usize,
        [plan, commit]: [usize; 2],
    ) {
        self.calls += 1;
        self.verify_calls += 1;
        self.tokens += kept;
        self.proposed += proposed;
        self.accepted += accepted;
        self.rolled_back_rows += 1 + proposed - kept;
        self.padded_rows += ar - 1 - proposed;
        self.plan_bytes_copied += plan;
        self.commit_bytes_copied += commit;
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
