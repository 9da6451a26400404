//! How many proposed tokens a step verifies, and so on which AR variant: the choice that maximises
//! the expected tokens per second, from the step times and the acceptance measured so far.
//!
//! A step verifying `k` proposed tokens on AR-n costs the mean measured time of an AR-n step
//! (before the first one, the AR-1 step's: every variant is tried once) and is expected to run
//! `1 + mean(min(a, k))` tokens into the cache, `a` the accepted counts of the earlier
//! verifications of the proposal's class (a speculator puts proposals in classes by its
//! confidence: prompt lookup by the length of the n-gram matched; a verification that accepted
//! every proposed token counts as accepting any longer proposal too), with one verification
//! accepting everything counted before the first. Acceptance is all-or-nothing more often than
//! geometric (a copied span is accepted whole), which the mean of the counts keeps. On HTP an AR-n step costs little more than an
//! AR-1 step, so long proposals win; on a CPU an AR-n step costs nearly n AR-1 steps, so only
//! proposals likely to be accepted are verified and the others decode plainly.

/// An accepted count standing for "every proposed token" (so also any longer proposal's).
const ALL: usize = usize::MAX / 2;

/// Measured step times and acceptance.
#[derive(Debug, Clone, Default)]
pub(crate) struct Planner {
    /// (AR, steps, seconds) of every variant run.
    costs: Vec<(usize, usize, f64)>,
    /// Per proposal class: the accepted count of each verification ([`ALL`]: every token).
    classes: Vec<Vec<usize>>,
}

impl Planner {
    /// Records a step of `ar` rows that took `seconds`.
    pub(crate) fn step(&mut self, ar: usize, seconds: f64) {
        match self.costs.iter_mut().find(|c| c.0 == ar) {
            Some(c) => (c.1, c.2) = (c.1 + 1, c.2 + seconds),
            None => self.costs.push((ar, 1, seconds)),
        }
    }

    /// Records the outcome of a verification of `proposed` tokens of `class`.
    pub(crate) fn outcome(&mut self, class: usize, proposed: usize, accepted: usize) {
        if self.classes.len() <= class {
            self.classes.resize(class + 1, Vec::new());
        }
        let count = if accepted >= proposed { ALL } else { accepted };
        self.classes[class].push(count);
    }

    /// Tokens a verification of `k` proposed tokens of `class` is expected to commit.
    fn expected(&self, class: usize, k: usize) -> f64 {
        let seen = self.classes.get(class).map_or(&[][..], Vec::as_slice);
        let accepted: usize = seen.iter().map(|&a| a.min(k)).sum::<usize>() + k;
        1.0 + accepted as f64 / (seen.len() + 1) as f64
    }

    /// Mean time of an AR-`ar` step (in AR-1 steps' units before any AR-1 step is measured).
    fn cost(&self, ar: usize) -> f64 {
        let mean = |ar: usize| {
            (self.costs.iter())
                .find(|c| c.0 == ar && c.1 > 0)
                .map(|c| c.2 / c.1 as f64)
        };
        mean(ar).unwrap_or_else(|| mean(1).unwrap_or(1.0))
    }

    /// How many of `available` proposed tokens of `class` to verify (0: a plain AR-1 step), given
    /// `variant(n)`, the AR variant a verification of n tokens runs on (`None`: none has room).
    pub(crate) fn choose(
        &self,
        class: usize,
        available: usize,
        variant: impl Fn(usize) -> Option<usize>,
    ) -> usize {
        let mut best = (0, 1.0 / self.cost(1));
        for k in 1..=available {
            let expected = self.expected(class, k);
            let Some(ar) = variant(1 + k).filter(|&ar| ar > k) else {
                break;
            };
            let rate = expected / self.cost(ar);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smallest(variants: &'static [usize]) -> impl Fn(usize) -> Option<usize> {
        move |n| variants.iter().copied().find(|&ar| ar >= n)
    }

    #[test]
    fn cheap_wide_steps_verify_everything_and_dear_ones_only_likely_tokens() {
        let mut p = Planner::default();
        assert_eq!(
            p.choose(0, 4, smallest(&[1, 5])),
            4,
            "an unmeasured variant is tried"
        );
        p.step(1, 0.040);
        p.step(5, 0.048); // HTP-like: AR-5 costs 1.2 AR-1
        assert_eq!(p.choose(0, 4, smallest(&[1, 5])), 4);
        let mut cpu = Planner::default();
        cpu.step(1, 0.040);
        cpu.step(3, 0.090);
        cpu.step(5, 0.130); // CPU-like: AR-n costs nearly n AR-1
        for _ in 0..10 {
            cpu.outcome(1, 4, 0); // short matches: rejected
            cpu.outcome(3, 4, 4); // long matches: copied whole
        }
        assert_eq!(cpu.choose(1, 4, smallest(&[1, 3, 5])), 0);
        assert_eq!(cpu.choose(3, 4, smallest(&[1, 3, 5])), 4);
        // No variant with room: plain.
        assert_eq!(cpu.choose(3, 4, |_| None), 0);
    }
}
