//! Closed-form predictions of what a [`crate::KvCache`] counts over a generation, derived from each
//! strategy's rule (each strategy's `predict` sits in its own module beside the code it predicts,
//! see [`crate::strategy`]), not by running a cache. `htpkv budget` reports them and `htpkv plan`
//! runs a real cache over the same schedule ([`Run::schedule`]); the tests check that both agree.
//!
//! # The run
//! A [`Run`] is a prefill of `prefill` tokens followed by `decode_steps` decode steps:
//! - prefill: chunks of m = max(ar) tokens on the AR-m graph; the last chunk is padded and commits
//!   only its real tokens (a prefill of 0 tokens is skipped);
//! - decode: steps on the smallest variant a = min(ar), each committing 1 token (the generated one).
//!
//! Every step must fit the cache: `len + n <= S - a` ([`crate::Geometry::capacity`]).
//! [`Run::full_context`] decodes until the next step would not fit: with `ar: [1]` and no prefill that
//! is S - 1 steps, after which the cache holds S - 1 tokens and the last sampled token completes a
//! context of S.
//!
//! # Hostile input
//! Geometries are bounded by the crate's limits (see [`crate::size`]), a run's prefill and decode
//! steps are compared with the cache's capacity before any arithmetic ([`Run::check`]), and run
//! totals (rows and bytes copied, handles) use [`Size`]: a total beyond `usize` is a
//! [`KvError::SizeOverflow`] naming it, never a wrapped number.

use crate::{CacheSpec, Counters, Geometry, KvError, Size};

/// One step of a schedule: plan the AR-`ar` graph, then commit `commit` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Step {
    pub ar: usize,
    pub commit: usize,
    /// True for decode steps, false for prefill chunks.
    pub decode: bool,
}

/// A generation: a prefill of `prefill` tokens, then `decode_steps` decode steps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Run {
    pub prefill: usize,
    pub decode_steps: usize,
}

/// Steps that share a variant and a commit size: step i plans at length `len0 + i x commit`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    pub ar: usize,
    pub len0: usize,
    pub commit: usize,
    pub count: usize,
    pub decode: bool,
}

impl Run {
    /// The most decode steps that fit after a prefill of `prefill` tokens (fails when the prefill itself
    /// does not fit).
    pub fn max_decode_steps(geometry: &Geometry, prefill: usize) -> Result<usize, KvError> {
        Run {
            prefill,
            decode_steps: 0,
        }
        .check(geometry)?;
        let (a, cap) = (geometry.min_ar(), geometry.capacity());
        Ok((cap + 1).saturating_sub(a + prefill))
    }

    /// The run that fills the whole context with decode steps after a prefill of `prefill` tokens.
    pub fn full_context(geometry: &Geometry, prefill: usize) -> Result<Run, KvError> {
        Ok(Run {
            prefill,
            decode_steps: Run::max_decode_steps(geometry, prefill)?,
        })
    }

    /// Checks that every step fits the cache.
    pub fn check(&self, geometry: &Geometry) -> Result<(), KvError> {
        let (a, m, cap) = (geometry.min_ar(), geometry.max_ar(), geometry.capacity());
        let fail = |reason: String| KvError::RunTooLong {
            prefill: self.prefill,
            decode_steps: self.decode_steps,
            reason,
        };
        // Each count is compared with the capacity (at most 2^24) before any arithmetic, so nothing
        // below can overflow.
        if self.prefill > cap {
            return Err(fail(format!(
                "the cache holds {cap} tokens (context {} - {a})",
                geometry.context
            )));
        }
        let chunks = self.prefill.div_ceil(m);
        if chunks * m > cap {
            return Err(fail(format!(
                "{chunks} AR-{m} prefill chunks need {} rows but the cache holds {cap} tokens \
                 (context {} - {a})",
                chunks * m,
                geometry.context
            )));
        }
        if self.decode_steps > cap
            || (self.decode_steps > 0 && self.prefill + self.decode_steps - 1 + a > cap)
        {
            let max = (cap + 1).saturating_sub(a + self.prefill);
            return Err(fail(format!(
                "at most {max} AR-{a} decode steps fit after the prefill (the cache holds {cap} tokens)"
            )));
        }
        Ok(())
    }

    pub(crate) fn segments(&self, geometry: &Geometry) -> Vec<Segment> {
        let (a, m) = (geometry.min_ar(), geometry.max_ar());
        let mut out = Vec::new();
        let (full, rest) = (self.prefill / m, self.prefill % m);
        for (len0, commit, count) in [(0, m, full), (full * m, rest, usize::from(rest > 0))] {
            if count > 0 {
                out.push(Segment {
                    ar: m,
                    len0,
                    commit,
                    count,
                    decode: false,
                });
            }
        }
        if self.decode_steps > 0 {
            out.push(Segment {
                ar: a,
                len0: self.prefill,
                commit: 1,
                count: self.decode_steps,
                decode: true,
            });
        }
        out
    }

    /// Every step of the run, in order.
    pub fn schedule(&self, geometry: &Geometry) -> Vec<Step> {
        self.segments(geometry)
            .iter()
            .flat_map(|s| {
                std::iter::repeat_n(
                    Step {
                        ar: s.ar,
                        commit: s.commit,
                        decode: s.decode,
                    },
                    s.count,
                )
            })
            .collect()
    }
}

/// What the KV manager will count over a run: the same quantities as [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Prediction {
    /// Steps planned (prefill chunks + decode steps).
    pub steps: usize,
    pub tokens_committed: usize,
    /// Decode steps (one generated token each).
    pub decode_tokens: usize,
    pub bytes_copied: usize,
    /// `bytes_copied` in rows (one token of one buffer: head_dim x element size bytes).
    pub rows_copied: usize,
    /// Rows copied during the decode steps.
    pub decode_rows_copied: usize,
    pub worst_step_bytes_copied: usize,
    pub worst_step_rows_copied: usize,
    pub rebases: usize,
    /// Distinct memory handles (Counters::handles).
    pub handles: usize,
    /// Counters::max_window_offsets_per_buffer.
    pub max_window_offsets_per_buffer: usize,
}

impl Prediction {
    /// Rows copied per generated token: decode-step rows / decode steps (0 without decode steps).
    pub fn rows_copied_per_token(&self) -> f64 {
        if self.decode_tokens == 0 {
            0.0
        } else {
            self.decode_rows_copied as f64 / self.decode_tokens as f64
        }
    }

    /// The fields that differ from a cache's counters, as `name: predicted vs counted` (empty when the
    /// prediction is exact).
    pub fn mismatches(&self, c: &Counters) -> Vec<String> {
        [
            ("steps", self.steps, c.steps),
            (
                "tokens_committed",
                self.tokens_committed,
                c.tokens_committed,
            ),
            ("bytes_copied", self.bytes_copied, c.bytes_copied),
            (
                "worst_step_bytes_copied",
                self.worst_step_bytes_copied,
                c.worst_step_bytes_copied,
            ),
            ("rebases", self.rebases, c.rebases),
            ("handles", self.handles, c.handles),
            (
                "max_window_offsets_per_buffer",
                self.max_window_offsets_per_buffer,
                c.max_window_offsets_per_buffer,
            ),
        ]
        .into_iter()
        .filter(|(_, p, c)| p != c)
        .map(|(name, p, c)| format!("{name}: predicted {p} vs counted {c}"))
        .collect()
    }
}

/// Copies per step, accumulated with checked arithmetic (a `naive` run over a long context of a large
/// model copies more than 2^64 bytes).
#[derive(Debug)]
pub(crate) struct Copies {
    rows: Size,
    decode_rows: Size,
    worst: usize,
}

impl Default for Copies {
    fn default() -> Self {
        Copies {
            rows: Size::new("rows copied over the run", 0),
            decode_rows: Size::new("rows copied by the decode steps", 0),
            worst: 0,
        }
    }
}

impl Copies {
    /// `n` steps copying `rows` rows each.
    pub(crate) fn add(&mut self, rows: usize, n: usize, decode: bool) {
        if n == 0 {
            return;
        }
        let total = Size::new("rows copied over the run", rows).times(n);
        self.rows = self.rows.plus_size(total);
        if decode {
            self.decode_rows = self.decode_rows.plus_size(total);
        }
        self.worst = self.worst.max(rows);
    }
}

/// Predicts the counters of a fresh [`crate::KvCache`] built from `spec` after `run`, in closed
/// form (each strategy's rule predicts itself). Fails when the spec is refused or the run does not
/// fit.
pub fn predict(spec: &CacheSpec, run: &Run) -> Result<Prediction, KvError> {
    spec.region_bytes()?;
    let rule = spec.rule()?;
    let g = &spec.geometry;
    run.check(g)?;
    let segments = run.segments(g);
    let steps: usize = segments.iter().map(|s| s.count).sum();
    let mut copies = Copies::default();
    let (rebases, handles, max_keys) = rule.predict(g, &segments, &mut copies)?;
    let rb = g.row_bytes();
    let rows_copied = copies.rows.get()?;
    Ok(Prediction {
        steps,
        tokens_committed: run.prefill + run.decode_steps,
        decode_tokens: run.decode_steps,
        bytes_copied: Size::new("bytes copied over the run", rows_copied)
            .times(rb)
            .get()?,
        rows_copied,
        decode_rows_copied: copies.decode_rows.get()?,
        handles: handles.get()?,
        worst_step_bytes_copied: copies.worst * rb,
        worst_step_rows_copied: copies.worst,
        rebases,
        max_window_offsets_per_buffer: max_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Granularity, HostAllocator, KLayout, KvCache, Reserve, Strategy};
    use quant::DataType;

    fn simulate(spec: &CacheSpec, run: &Run) -> Counters {
        let mut cache = KvCache::new(spec.clone(), &HostAllocator { prefault: false }).unwrap();
        for step in run.schedule(&spec.geometry) {
            cache.plan(step.ar).unwrap();
            cache.commit(step.commit).unwrap();
        }
        *cache.counters()
    }

    #[test]
    fn predictions_match_small_caches() {
        let geometries = [
            Geometry::new(3, 2, 4, 24, &[1], DataType::U8),
            Geometry::new(3, 2, 4, 40, &[1, 8], DataType::U16),
            Geometry::new(2, 1, 2, 30, &[3, 5], DataType::F32),
            // Sliding layers: smaller buffers, their own rebases and naive copies.
            Geometry::new(3, 2, 4, 40, &[1, 8], DataType::U16).with_windows(&[0, 2], 12),
            Geometry::new(4, 1, 2, 32, &[1], DataType::U8).with_windows(&[1, 2, 3], 5),
        ];
        let strategies = [
            Strategy::SHIFT_2X,
            Strategy::Shift {
                reserve: Reserve::Factor(1.5),
                stagger: true,
            },
            Strategy::Shift {
                reserve: Reserve::Spare(9),
                stagger: false,
            },
            Strategy::Conveyor,
            Strategy::SmartMask,
            Strategy::Naive,
        ];
        for g in geometries {
            for strategy in strategies {
                for prefill in [0, 1, 7, 13] {
                    let spec = CacheSpec::for_simulation(g.clone(), strategy);
                    let Ok(run) = Run::full_context(&g, prefill) else {
                        continue;
                    };
                    if g.has_windows() && strategy == Strategy::SmartMask {
                        assert!(spec.region_bytes().is_err());
                        continue;
                    }
                    for run in [
                        run,
                        Run {
                            decode_steps: run.decode_steps / 2,
                            ..run
                        },
                    ] {
                        assert_predicted(&spec, &run);
                    }
                }
            }
        }
    }

    /// The prediction of `run` on `spec` equals what the real cache counts.
    fn assert_predicted(spec: &CacheSpec, run: &Run) {
        let p = predict(spec, run).unwrap();
        let c = simulate(spec, run);
        let (g, strategy) = (&spec.geometry, spec.strategy);
        assert!(
            p.mismatches(&c).is_empty(),
            "{g:?} {strategy:?} {run:?}: {:?}",
            p.mismatches(&c)
        );
    }

    #[test]
    fn strided_slot_layouts_are_predicted_too() {
        for (granularity, k_layout) in [
            (Granularity::PerLayer, KLayout::Rows),
            (Granularity::PerHead, KLayout::Transposed),
            (Granularity::PerLayer, KLayout::Transposed),
        ] {
            let mut g = Geometry::new(2, 2, 4, 33, &[1, 8], DataType::U8);
            g.granularity = granularity;
            g.k_layout = k_layout;
            for strategy in [Strategy::SmartMask, Strategy::Naive] {
                let spec = CacheSpec::for_simulation(g.clone(), strategy);
                for prefill in [0, 5, 8, 20, 24, 27, 32] {
                    let run = Run::full_context(&g, prefill).unwrap();
                    assert_predicted(&spec, &run);
                }
            }
        }
    }

    #[test]
    fn runs_that_do_not_fit_are_refused() {
        let g = Geometry::new(1, 1, 2, 16, &[1, 4], DataType::U8);
        assert_eq!(Run::max_decode_steps(&g, 0).unwrap(), 15);
        assert_eq!(Run::max_decode_steps(&g, 6).unwrap(), 9);
        // 4 chunks of 4 = 16 rows > 15.
        assert!(Run::max_decode_steps(&g, 13).is_err());
        let run = Run {
            prefill: 6,
            decode_steps: 10,
        };
        assert!(matches!(run.check(&g), Err(KvError::RunTooLong { .. })));
    }

    #[test]
    fn counts_near_usize_max_are_refused_before_any_arithmetic() {
        let g = Geometry::new(1, 1, 2, 16, &[1, 4], DataType::U8);
        for (prefill, decode_steps) in [(usize::MAX, 0), (usize::MAX, 1), (0, usize::MAX)] {
            let run = Run {
                prefill,
                decode_steps,
            };
            assert!(matches!(run.check(&g), Err(KvError::RunTooLong { .. })));
            let spec = CacheSpec::for_simulation(g.clone(), Strategy::Naive);
            assert!(predict(&spec, &run).is_err());
        }
        assert!(Run::max_decode_steps(&g, usize::MAX).is_err());
    }

    #[test]
    fn run_totals_beyond_64_bits_are_an_error_naming_the_quantity() {
        let g = Geometry::new(32, 32, 128, crate::MAX_CONTEXT, &[1], DataType::U16);
        let spec = CacheSpec::for_simulation(g.clone(), Strategy::Naive);
        let run = Run::full_context(&g, 0).unwrap();
        assert_eq!(
            predict(&spec, &run),
            Err(KvError::SizeOverflow {
                what: "bytes copied over the run"
            })
        );
        // Rows alone still fit: 2048 buffers x (S - 1) rows x (S - 1) steps.
        let w = crate::MAX_CONTEXT - 1;
        let spec = CacheSpec::for_simulation(g.clone(), Strategy::SmartMask);
        assert_eq!(predict(&spec, &run).unwrap().rows_copied, 2048 * w);
    }
}
