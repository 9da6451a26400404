//! The update strategies: one module per rule, each owning its region layout, its per-step work
//! (what `plan` moves and binds, what `commit` and `rollback` do) and the closed-form prediction of
//! what it will count over a run ([`crate::predict`]), so that a rule and its prediction sit in one
//! file and change together.
//!
//! | module | strategies | state |
//! |---|---|---|
//! | `shift.rs` | `shift` | per layer, the window end inside its R-row buffers |
//! | `conveyor.rs` | `conveyor` | none: token t of buffer b lives at `base[b] + t` |
//! | `slots.rs` | `smart_mask`, `naive` | the window the slots are laid out for |
//!
//! `smart_mask` and `naive` share one module because they share everything but where a token's
//! slot is (filled from the start, or right-aligned and slid left on every commit): the layout,
//! the slot and output addressing, the relayouts of strided layouts and the copies.
//!
//! [`KvCache`](crate::KvCache) is strategy-free: it validates a step, hands the rule a `Cx`
//! (geometry, plan, region bytes, length) and counts what the rule reports (`Moved`).
//!
//! # Adding a strategy
//! 1. A new file `strategy/NAME.rs` with a type implementing `Rule`: its constructor validates
//!    the geometry (refusals name their reason) and derives its `Layout`; `bind` fills the
//!    plan's offsets (the per-step hot path); `prepare`, `commit` and `rollback` move rows when the
//!    rule needs to; `token_row` says where a token lives (snapshots, evictions, relayouts and beams
//!    go through it); `predict` gives the counters of a [`crate::predict::Run`] in closed form.
//! 2. One arm in [`Strategy`], then the arms the compiler asks for in its exhaustive matches:
//!    [`Strategy::name`] and `Strategy::rule` here, and the plot style `strategy_style` of
//!    `htpkv budget --plot` (`cli/src/budget.rs`).
//! 3. Its default in [`Strategy::ALL`], so that its name parses (configs, `--update`) and the
//!    budget reports it; and, only if its windows are not left-padded, [`Strategy::left_padded`].
//!
//! Nothing else changes: the cache, snapshots, evictions, relayouts, beams, the budget tool, the
//! config schema and every command line take strategies through [`Strategy`] and its spellings.
//!
//! For example, the whole of `conveyor` is this diff (everything else compiles unchanged):
//!
//! ```text
//! kv_manager/src/strategy/conveyor.rs  new   struct Conveyor; impl Rule: new (one span of stride S),
//!                                            bind, token_row, predict
//! kv_manager/src/strategy/mod.rs       +1    mod conveyor;
//!                                      +1    Strategy::Conveyor (the enum arm)
//!                                      +3    its arms in Strategy::name, Strategy::rule, Strategy::ALL
//! cli/src/budget.rs                    +1    its dash pattern in strategy_style
//! ```

mod conveyor;
mod shift;
mod slots;

use crate::counters::HandleTracker;
use crate::predict::{Copies, Segment};
use crate::{CacheSpec, Geometry, Granularity, KLayout, KvError, Plan, Size};
pub use shift::Reserve;

/// How the cache is updated after each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// ShiftPointer: each buffer reserves R rows; outputs are bound right after the window and
    /// committing moves the window (a pointer shift). When the next output would pass R the valid rows
    /// are moved back (a rebase). `stagger` gives each layer a different starting offset so layers rebase
    /// on different steps.
    Shift { reserve: Reserve, stagger: bool },
    /// All buffers share one span with stride S; every window slides right together. Zero copies,
    /// about half the memory of `shift` 2x.
    Conveyor,
    /// Fixed slots; new rows are copied from the graph's output buffers into slots; the mask marks
    /// valid slots.
    SmartMask,
    /// The baseline: the whole window slides left by the committed rows every step.
    Naive,
}

impl Strategy {
    /// `shift` with the 2x reservation, no staggering.
    pub const SHIFT_2X: Strategy = Strategy::Shift {
        reserve: Reserve::Factor(2.0),
        stagger: false,
    };

    /// Every strategy, each with its defaults (`shift`: 2x, not staggered), in report order: what
    /// each [`Strategy::name`] alone spells.
    pub const ALL: [Strategy; 4] = [
        Strategy::SHIFT_2X,
        Strategy::Conveyor,
        Strategy::SmartMask,
        Strategy::Naive,
    ];

    /// Every strategy's name, in [`Strategy::ALL`]'s order.
    pub const NAMES: [&'static str; Strategy::ALL.len()] = {
        let mut names = [""; Strategy::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Strategy::ALL[i].name();
            i += 1;
        }
        names
    };

    /// The strategy's name as used in configs (`shift`, `conveyor`, `smart_mask`, `naive`).
    pub const fn name(&self) -> &'static str {
        match self {
            Strategy::Shift { .. } => "shift",
            Strategy::Conveyor => "conveyor",
            Strategy::SmartMask => "smart_mask",
            Strategy::Naive => "naive",
        }
    }

    /// This strategy with `shift`'s options replaced (other strategies have none).
    pub fn with_shift_options(self, reserve: Reserve, stagger: bool) -> Strategy {
        match self {
            Strategy::Shift { .. } => Strategy::Shift { reserve, stagger },
            other => other,
        }
    }

    /// True when past windows are left-padded (valid rows right-aligned), false when valid rows fill
    /// slots from the start of the window (`smart_mask`); what the strategy's rule says.
    pub fn left_padded(&self) -> bool {
        !matches!(self, Strategy::SmartMask)
    }

    /// Builds the rule for a validated geometry: refuses what the strategy cannot serve (the
    /// reason named) and derives the region layout.
    pub(crate) fn rule(&self, g: &Geometry) -> Result<Box<dyn Rule>, KvError> {
        Ok(match *self {
            Strategy::Shift { reserve, stagger } => {
                Box::new(shift::Shift::new(g, reserve, stagger)?)
            }
            Strategy::Conveyor => Box::new(conveyor::Conveyor::new(g)?),
            Strategy::SmartMask => Box::new(slots::Slots::new(g, false)?),
            Strategy::Naive => Box::new(slots::Slots::new(g, true)?),
        })
    }
}

/// Every strategy's one spelling, the one parser of strategy names (configs, command lines,
/// benchmarks): a [`Strategy::name`] alone is the strategy with its defaults (`shift` is 2x, not
/// staggered); `shift-R` takes a reservation R in [`Reserve`]'s spelling (`shift-1.5x`,
/// `shift-3070`, `shift-+64`), and `-staggered` after it staggers the layers
/// (`shift-1.5x-staggered`).
impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(kind) = Strategy::ALL.into_iter().find(|k| k.name() == s) {
            return Ok(kind);
        }
        let unknown = || {
            format!(
                "unknown update strategy `{s}`; expected one of {} (shift may name its reservation \
                 and staggering: shift-1.5x, shift-+64, shift-3070, shift-1.5x-staggered)",
                Strategy::NAMES.join(", ")
            )
        };
        let options = s.strip_prefix("shift-").ok_or_else(unknown)?;
        let (reserve, stagger) = match options.strip_suffix("-staggered") {
            Some(reserve) => (reserve, true),
            None => (options, false),
        };
        let reserve = reserve
            .parse()
            .map_err(|e| format!("update strategy `{s}`: {e}"))?;
        Ok(Strategy::Shift { reserve, stagger })
    }
}

/// The spelling `FromStr` reads back: the name, and for `shift` its reservation (and
/// `-staggered`): `shift-2x`, `shift-1.5x-staggered`, `shift-+64`, `conveyor`.
impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::Shift { reserve, stagger } => {
                write!(f, "shift-{}", reserve.spelling())?;
                if *stagger {
                    f.write_str("-staggered")?;
                }
                Ok(())
            }
            other => f.write_str(other.name()),
        }
    }
}

/// With the `serde` feature a strategy is its spelling ([`Strategy`]'s `FromStr` and Display); an
/// unknown name is serde's usual unknown-variant error over the four names.
#[cfg(feature = "serde")]
mod serde_impl {
    use super::Strategy;
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

    impl Serialize for Strategy {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(self)
        }
    }

    const NAMES: &[&str] = &Strategy::NAMES;

    /// Read as a unit variant, as a derived enum is (so formats treat and locate it the same),
    /// whose name is the spelling.
    impl<'de> Deserialize<'de> for Strategy {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strategy, D::Error> {
            d.deserialize_enum("Strategy", NAMES, Spelling)
        }
    }

    /// Visits the enum and parses its variant name (the spelling) as the identifier is read.
    #[derive(Debug, Clone, Copy)]
    struct Spelling;

    impl<'de> serde::de::Visitor<'de> for Spelling {
        type Value = Strategy;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an update strategy")
        }

        fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Strategy, A::Error> {
            let (strategy, variant) = data.variant_seed(self)?;
            serde::de::VariantAccess::unit_variant(variant)?;
            Ok(strategy)
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Strategy, E> {
            text.parse().map_err(|e: String| {
                if text.starts_with("shift-") {
                    E::custom(e)
                } else {
                    E::unknown_variant(text, NAMES)
                }
            })
        }
    }

    impl<'de> serde::de::DeserializeSeed<'de> for Spelling {
        type Value = Strategy;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Strategy, D::Error> {
            d.deserialize_identifier(self)
        }
    }
}

/// What a rule may use and change during one call: the cache's geometry, plan (tensors and
/// offsets), region bytes and length, the held rows of sliding layers, and the copy counters.
#[derive(Debug)]
pub(crate) struct Cx<'a> {
    pub g: &'a Geometry,
    pub plan: &'a mut Plan,
    pub region: &'a mut [u8],
    /// Tokens cached before the call.
    pub len: usize,
    /// Per layer: the first token whose rows it still holds.
    pub first_held: &'a [usize],
    pub handles: &'a mut HandleTracker,
    pub moved: Moved,
}

/// Data a rule moved during one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Moved {
    pub bytes: usize,
    pub rebases: usize,
}

/// A location of one token's row: `start` byte, then `step` bytes between consecutive channels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowRef {
    pub(crate) start: usize,
    pub(crate) step: usize,
}

/// Copies one row of D elements of `e` bytes from `src` to `dst` inside `bytes`.
pub(crate) fn copy_row(bytes: &mut [u8], src: RowRef, dst: RowRef, d: usize, e: usize) {
    if src.step == e && dst.step == e {
        bytes.copy_within(src.start..src.start + d * e, dst.start);
    } else {
        for c in 0..d {
            let at = src.start + c * src.step;
            bytes.copy_within(at..at + e, dst.start + c * dst.step);
        }
    }
}

/// What a run's prediction counts besides copies: (rebases, memory handles, distinct window
/// bindings of the busiest buffer).
pub(crate) type Predicted = (usize, Size, usize);

/// One update strategy: its layout, its per-step work and its closed-form prediction. The cache
/// calls `prepare` then `bind` in `plan`, then `commit` (or `rollback`, `reset`).
pub(crate) trait Rule: std::fmt::Debug + Send {
    /// Where everything lives in the region, in rows.
    fn layout(&self) -> &Layout;

    /// The handle tracker's shape: (groups, window positions per group).
    fn handle_groups(&self, g: &Geometry) -> (usize, usize);

    /// True when past windows are left-padded (valid rows right-aligned).
    fn left_padded(&self) -> bool {
        true
    }

    /// True when token t lives at `end - len + t`, so a shorter length moves every token's place
    /// right (evictions move the rows of such rules).
    fn anchored_at_end(&self) -> bool;

    /// Moves data before an AR-`ar` step (rebases, relayouts).
    fn prepare(&mut self, _cx: &mut Cx<'_>, _ar: usize) {}

    /// Fills the plan's past and new offsets for an AR-`ar` step on variant `variant`, marking the
    /// bindings in the handle tracker; returns the new handles. The per-step hot path: one pass
    /// over the tensors, nothing per buffer but the two offsets.
    fn bind(&mut self, cx: &mut Cx<'_>, ar: usize, variant: usize) -> usize;

    /// Keeps the first `accepted` tokens of the planned AR-`ar` step (`cx.len` is the length
    /// before them).
    fn commit(&mut self, cx: &mut Cx<'_>, ar: usize, accepted: usize);

    /// Truncates from `cx.len` tokens to `len` (the cache has checked the windows).
    fn rollback(&mut self, cx: &mut Cx<'_>, len: usize);

    /// Empties the cache: rows stay where they are, windows go back to their start.
    fn reset(&mut self) {}

    /// Before an import writes rows at [`Rule::token_row`]: any layout is free while empty.
    fn reset_layout(&mut self, _g: &Geometry) {}

    /// Where token `token` of buffer `buffer` lives at length `len`.
    fn token_row(
        &self,
        g: &Geometry,
        plan: &Plan,
        len: usize,
        buffer: usize,
        token: usize,
    ) -> RowRef;

    /// The closed-form counters of the run `segments` describe (copies into `copies`).
    fn predict(
        &self,
        g: &Geometry,
        segments: &[Segment],
        copies: &mut Copies,
    ) -> Result<Predicted, KvError>;
}

/// The derived layout of a validated spec: where everything lives in the region, in rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    /// Rows in the region.
    pub region_rows: usize,
    /// `shift` and `conveyor`: per buffer, the row of its first row (`conveyor`: of its token 0).
    /// Slot strategies: per slot tensor, the row where its heads' slot windows begin.
    pub base: Vec<usize>,
    /// `shift`: per buffer, its rows R. `conveyor`: per buffer, the gap to the next buffer (the
    /// last: the capacity). Slot strategies: per slot tensor, each head's slot window (W_max, or the
    /// kept rows K of a sliding layer).
    pub rows: Vec<usize>,
    /// Slot strategies: the first row of the new-row area (after every slot window).
    pub out_base: usize,
}

impl Layout {
    /// Units of `rows[i]` rows (times `heads` when it is non-zero) laid end to end, followed by
    /// `extra` rows.
    pub(crate) fn packed(rows: Vec<usize>, heads: usize, extra: usize) -> Result<Layout, KvError> {
        let mut base = Vec::with_capacity(rows.len());
        let mut at = Size::new("region rows", 0);
        for &r in &rows {
            base.push(at.get()?);
            at = at.plus_size(Size::new("region rows", r).times(heads.max(1)));
        }
        let out_base = at.get()?;
        Ok(Layout {
            region_rows: at.plus(extra).get()?,
            base,
            rows,
            out_base,
        })
    }
}

/// `shift` and `conveyor` bind outputs inside the buffers: they need per_head tensors with K rows.
pub(crate) fn require_in_place(g: &Geometry, name: &'static str) -> Result<(), KvError> {
    if g.granularity == Granularity::PerLayer {
        return Err(KvError::UnsupportedCombination {
            strategy: name,
            reason: format!(
                "{name} needs per_head tensors: a per_layer tensor [n_kv, 1, S-n, D] keeps its heads' \
                 windows adjacent, so no head can slide its own window or write its outputs in place"
            ),
        });
    }
    if g.k_layout == KLayout::Transposed {
        return Err(KvError::UnsupportedCombination {
            strategy: name,
            reason: format!(
                "{name} needs k_layout rows: in a transposed K [D, S-n] a new token's D values lie S-n \
                 elements apart, so the graph's new_key output cannot be bound in place"
            ),
        });
    }
    Ok(())
}

/// Sliding-window layers bind their past tensors as the last `W - 1` rows of the layer's window:
/// contiguous only with per_head tensors and K rows.
pub(crate) fn require_window_layout(g: &Geometry, name: &'static str) -> Result<(), KvError> {
    if g.has_windows()
        && (g.granularity == Granularity::PerLayer || g.k_layout == KLayout::Transposed)
    {
        return Err(KvError::UnsupportedCombination {
            strategy: name,
            reason: "sliding-window layers need per_head tensors with k_layout rows: their past \
                     tensor is the last W - 1 rows of the window, contiguous only in that layout"
                .to_owned(),
        });
    }
    Ok(())
}

impl CacheSpec {
    /// Validates the spec and derives its rule (and so its layout); every refusal names its reason.
    pub(crate) fn rule(&self) -> Result<Box<dyn Rule>, KvError> {
        self.validate_encodings()?;
        self.strategy.rule(&self.geometry)
    }

    /// Validates the spec and derives its layout; every refusal names its reason.
    pub(crate) fn layout(&self) -> Result<Layout, KvError> {
        Ok(self.rule()?.layout().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_back_to_its_strategy() {
        let factor = |f| Reserve::Factor(f);
        for (text, strategy) in [
            ("shift-2x", Strategy::SHIFT_2X),
            (
                "shift-1.5x",
                Strategy::Shift {
                    reserve: factor(1.5),
                    stagger: false,
                },
            ),
            (
                "shift-1.5x-staggered",
                Strategy::Shift {
                    reserve: factor(1.5),
                    stagger: true,
                },
            ),
            (
                "shift-+64",
                Strategy::Shift {
                    reserve: Reserve::Spare(64),
                    stagger: false,
                },
            ),
            (
                "shift-3070",
                Strategy::Shift {
                    reserve: Reserve::Rows(3070),
                    stagger: false,
                },
            ),
            ("conveyor", Strategy::Conveyor),
            ("smart_mask", Strategy::SmartMask),
            ("naive", Strategy::Naive),
        ] {
            assert_eq!(text.parse::<Strategy>(), Ok(strategy), "{text}");
            assert_eq!(strategy.to_string(), text);
        }
        // A name alone is the strategy with its defaults.
        assert_eq!(
            Strategy::NAMES,
            ["shift", "conveyor", "smart_mask", "naive"]
        );
        for (name, strategy) in Strategy::NAMES.iter().zip(Strategy::ALL) {
            assert_eq!(name.parse::<Strategy>(), Ok(strategy));
        }
    }

    #[test]
    fn unknown_spellings_say_what_is_expected() {
        let e = "rotate".parse::<Strategy>().unwrap_err();
        assert!(
            e.starts_with("unknown update strategy `rotate`; expected one of shift, conveyor"),
            "{e}"
        );
        for bad in [
            "shift-",
            "shift-2y",
            "shift-0.5x",
            "shift-staggered",
            "conveyor-2x",
            "",
        ] {
            assert!(bad.parse::<Strategy>().is_err(), "{bad}");
        }
        let e = "shift-2y".parse::<Strategy>().unwrap_err();
        assert!(e.contains("invalid reserve `2y`"), "{e}");
    }
}
