//! Memory budgets of a config: the exact region, graph IO and what a full-context run costs.
//!
//! The run's counters (bytes copied, the worst step, rebases and memory handles) are the closed-form
//! predictions of [`kv_manager::predict`], each strategy's beside its rule in `kv_manager`'s
//! `strategy` modules, so a prediction cannot drift from the code it predicts; `htpkv plan` runs
//! the real cache over the same schedule ([`Run::schedule`]) and the tests check that both agree.
//!
//! # Hostile input
//! Geometries are bounded by `kv_manager`'s limits (see [`kv_manager::size`]), a run's prefill and
//! decode steps are compared with the cache's capacity before any arithmetic ([`Run::check`]), and run
//! totals (rows and bytes copied, handles) use [`kv_manager::Size`]: a total beyond `usize` is a
//! [`KvError::SizeOverflow`] naming it, never a wrapped number. Byte sizes (`--fit`) are at most [`MAX_BYTE_SIZE`].

use crate::config::Config;
pub use kv_manager::predict::{Prediction, Run, Step, predict};
use kv_manager::{CacheSpec, Geometry, KvError, Size, Strategy};
use serde::Serialize;

/// What a budget or a prediction can fail on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The KV manager refuses the spec.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A byte size above [`MAX_BYTE_SIZE`].
    #[error("byte size `{text}` is above the limit of 1 PiB ({maximum} bytes)")]
    ByteSizeTooLarge { text: String, maximum: usize },
    /// A beam count `htpkv budget --beams` cannot cost.
    #[error("--beams {beams}: {reason}")]
    Beams { beams: usize, reason: String },
    /// A byte size that could not be parsed.
    #[error(
        "invalid byte size `{text}`: expected a number with an optional suffix B, KB, MB, GB, TB, PB \
         (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. 512MiB or 2GB"
    )]
    ByteSize { text: String },
}

/// Graph IO buffers of one AR-n variant (besides the K/V tensors, which live in the region).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GraphIo {
    pub ar: usize,
    /// `input_ids [1, n]` i32: n x 4 bytes.
    pub input_ids_bytes: usize,
    /// `positions [1, n]` i32: n x 4 bytes.
    pub positions_bytes: usize,
    /// `attention_mask [1, 1, n, S]`, plus `attention_mask_w{W} [1, 1, n, W - 1 + n]` per distinct
    /// sliding window: u16 (2 bytes) for a fixed-point cache, f32 (4 bytes) for f16/f32 caches.
    pub mask_bytes: usize,
    /// `logits [1, n, vocab]` f32 of the graph returning every row: n x vocab x 4 bytes.
    pub logits_bytes: usize,
    /// `logits [1, 1, vocab]` f32 of the variant's last-row prefill graph, what plain prefill
    /// writes (`graph_io::graph_set`: variants n > 1): vocab x 4 bytes; `None` for AR-1.
    pub last_row_logits_bytes: Option<usize>,
    pub total_bytes: usize,
}

/// The IO buffers of every AR variant of `geometry` for a vocabulary of `vocab` tokens.
pub fn graph_io(geometry: &Geometry, vocab: usize) -> Result<Vec<GraphIo>, KvError> {
    let mask_elem = if geometry.dtype.is_fixed_point() {
        2
    } else {
        4
    };
    let last_row = graph_io::graph_set(&geometry.ar_variants, true);
    geometry
        .ar_variants
        .iter()
        .map(|&n| {
            let prefill = last_row.contains(&(n, graph_io::LogitRows::Last));
            let last_row_logits = Size::new("logits bytes", vocab).times(4).get()?;
            let ids = Size::new("input_ids bytes", n).times(4).get()?;
            // The global mask [n, S] and one [n, W - 1 + n] per distinct sliding window.
            let mask = geometry
                .distinct_windows()
                .into_iter()
                .fold(Size::new("mask bytes", geometry.context), |sum, w| {
                    sum.plus(w - 1 + n)
                })
                .times(n)
                .times(mask_elem)
                .get()?;
            let logits = Size::new("logits bytes", n).times(vocab).times(4).get()?;
            Ok(GraphIo {
                ar: n,
                input_ids_bytes: ids,
                positions_bytes: ids,
                mask_bytes: mask,
                logits_bytes: logits,
                last_row_logits_bytes: prefill.then_some(last_row_logits),
                total_bytes: Size::new("graph IO bytes", ids)
                    .times(2)
                    .plus(mask)
                    .plus(logits)
                    .get()?,
            })
        })
        .collect()
}

/// One line of `htpkv budget`: a config with one strategy. Field names are the JSON field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetReport {
    /// The config file.
    pub config: String,
    pub model: String,
    /// `shift`, `conveyor`, `smart_mask` or `naive`.
    pub update: String,
    /// `shift` only: the reservation as written (`2x`, `1.5x`, `3070`, `+64`).
    pub reserve: Option<String>,
    /// `shift` only: layers staggered.
    pub stagger: bool,
    pub context: usize,
    pub ar: Vec<usize>,
    pub dtype: String,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// B = layers x kv_heads x 2.
    pub buffers: usize,
    /// Bytes of one token in one buffer: head_dim x element size.
    pub row_bytes: usize,
    /// B x row_bytes.
    pub kv_bytes_per_token: usize,
    /// Tokens the cache holds: S - min(ar).
    pub capacity_tokens: usize,
    /// Rows per buffer of a global layer: `shift` R, `conveyor` S (the stride between buffers),
    /// `smart_mask`/`naive` W_max = S - min(ar) (the window slots; their output staging rows are in
    /// `region_rows`). A sliding layer's buffers are smaller (`region_bytes_all_global`).
    pub reserve_rows: usize,
    /// reserve_rows x row_bytes.
    pub buffer_bytes: usize,
    pub region_rows: usize,
    /// Exactly what the KV manager allocates (static cross K/V included).
    pub region_bytes: usize,
    /// The same region with every layer global: a sliding layer's buffers keep only its last
    /// W - 1 + max(ar) rows plus the strategy's slack, so the saving is the difference.
    pub region_bytes_all_global: usize,
    /// Static cross-attention K/V (`kv.cross`): E rows per buffer, in the region; 0 without.
    pub cross_bytes: usize,
    pub graph_io: Vec<GraphIo>,
    /// Sum of graph_io totals.
    pub graph_io_bytes: usize,
    /// region_bytes + graph_io_bytes.
    pub total_bytes: usize,
    /// The run the copy/rebase/handle figures are for.
    pub run: Run,
    /// Decode-step rows copied / decode steps.
    pub rows_copied_per_token: f64,
    /// The most rows copied by one step of the run.
    pub worst_step_rows_copied: usize,
    pub rows_copied: usize,
    pub bytes_copied: usize,
    pub worst_step_bytes_copied: usize,
    /// Rebases over the run (per layer for `shift`; relayouts for strided slot layouts).
    pub rebases_per_context: usize,
    /// Distinct memory handles a QNN HTP backend registers over the run.
    pub handles: usize,
    /// Distinct (window offset, variant) bindings of the busiest buffer.
    pub max_window_offsets_per_buffer: usize,
    /// Layers with a sliding attention window (`model.sliding_window`, `model.global_every`).
    pub sliding_layers: usize,
    /// K/V bytes one decode step (AR-min(ar)) binds as past inputs: S - n rows per buffer of a
    /// global layer, W - 1 of a sliding one. What the graph reads from the region every step.
    pub past_bytes_per_decode_step: usize,
    /// The same with every layer global: the saving of the sliding layers is the difference.
    pub past_bytes_per_decode_step_all_global: usize,
}

/// K/V bytes of the past inputs of one AR-`ar` step of `g` ([`BudgetReport::past_bytes_per_decode_step`]).
pub fn past_bytes_per_step(g: &Geometry, ar: usize) -> Result<usize, KvError> {
    (0..g.layers)
        .try_fold(Size::new("past bytes per step", 0), |sum, l| {
            let layer = Size::new("past bytes per step", g.past_rows(l, ar))
                .times(2 * g.kv_heads)
                .times(g.row_bytes());
            Ok(sum.plus_size(layer))
        })?
        .get()
}

/// The budget of `config` with the strategy `update` names (with the config's `kv.reserve` and
/// `kv.stagger` for `shift`, see [`Config::strategy_for`]), for the full-context run after a prefill of
/// `prefill` tokens.
pub fn report(
    config: &Config,
    update: Strategy,
    prefill: usize,
) -> Result<BudgetReport, BudgetError> {
    let spec = config.cache_spec_for(update);
    let g = &spec.geometry;
    let region_bytes = spec.region_bytes()?;
    let cross_bytes = match &spec.cross {
        Some(c) => c.region_bytes(g)?,
        None => 0,
    };
    let self_bytes = CacheSpec {
        cross: None,
        ..spec.clone()
    }
    .region_bytes()?;
    let all_global = Geometry {
        windows: Vec::new(),
        ..g.clone()
    };
    let region_bytes_all_global = CacheSpec {
        geometry: all_global.clone(),
        ..spec.clone()
    }
    .region_bytes()?;
    let run = Run::full_context(g, prefill)?;
    let p = predict(&spec, &run)?;
    let reserve_rows = match spec.strategy {
        Strategy::Shift { reserve, .. } => reserve.rows(g)?,
        Strategy::Conveyor => g.context,
        Strategy::SmartMask | Strategy::Naive => g.max_window(),
    };
    let io = graph_io(g, config.model.vocab)?;
    let io_bytes = io
        .iter()
        .fold(Size::new("graph IO bytes", 0), |sum, i| {
            sum.plus(i.total_bytes)
        })
        .get()?;
    let total_bytes = Size::new("region and graph IO bytes", region_bytes)
        .plus(io_bytes)
        .get()?;
    Ok(BudgetReport {
        config: config.origin.display().to_string(),
        model: config.model.name.clone(),
        update: update.name().into(),
        reserve: matches!(update, Strategy::Shift { .. }).then(|| config.kv.reserve.to_string()),
        stagger: matches!(update, Strategy::Shift { .. }) && config.kv.stagger,
        context: g.context,
        ar: g.ar_variants.clone(),
        dtype: g.dtype.name().into(),
        layers: g.layers,
        kv_heads: g.kv_heads,
        head_dim: g.head_dim,
        buffers: g.buffers(),
        row_bytes: g.row_bytes(),
        kv_bytes_per_token: g.kv_bytes_per_token(),
        capacity_tokens: g.capacity(),
        reserve_rows,
        buffer_bytes: Size::new("bytes per buffer", reserve_rows)
            .times(g.row_bytes())
            .get()?,
        region_rows: self_bytes / g.row_bytes(),
        region_bytes,
        region_bytes_all_global,
        cross_bytes,
        graph_io: io,
        graph_io_bytes: io_bytes,
        total_bytes,
        run,
        rows_copied_per_token: p.rows_copied_per_token(),
        worst_step_rows_copied: p.worst_step_rows_copied,
        rows_copied: p.rows_copied,
        bytes_copied: p.bytes_copied,
        worst_step_bytes_copied: p.worst_step_bytes_copied,
        rebases_per_context: p.rebases,
        handles: p.handles,
        max_window_offsets_per_buffer: p.max_window_offsets_per_buffer,
        sliding_layers: g.windows.iter().flatten().count(),
        past_bytes_per_decode_step: past_bytes_per_step(g, g.min_ar())?,
        past_bytes_per_decode_step_all_global: past_bytes_per_step(&all_global, g.min_ar())?,
    })
}

/// The region of `config` with strategy `update` at context `context` (None when the KV manager
/// refuses that context, e.g. a fixed `shift` row count too small for it).
pub fn region_at(config: &Config, update: Strategy, context: usize) -> Option<usize> {
    let mut spec = config.cache_spec_for(update);
    spec.geometry.context = context;
    spec.region_bytes().ok()
}

/// The smallest context the config's AR variants allow: min(ar) + max(ar) (and more than max(ar)).
pub fn min_context(config: &Config) -> usize {
    let g = config.geometry();
    (g.min_ar() + g.max_ar()).max(g.max_ar() + 1).max(2)
}

/// The largest context whose exact region fits in `budget` bytes with strategy `update`, and that
/// region's size; None when even the smallest context does not fit. Binary search on
/// [`region_at`], which grows with the context.
pub fn fit_context(config: &Config, update: Strategy, budget: usize) -> Option<(usize, usize)> {
    let ok = |s: usize| region_at(config, update, s).filter(|&b| b <= budget);
    let lo = min_context(config);
    let mut best = (lo, ok(lo)?);
    // Grow until the region no longer fits, then bisect (good, bad).
    let mut bad = lo;
    loop {
        bad = bad.saturating_mul(2);
        match ok(bad) {
            Some(bytes) if bad < usize::MAX / 4 => best = (bad, bytes),
            _ => break,
        }
    }
    let mut good = best.0;
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        match ok(mid) {
            Some(bytes) => {
                good = mid;
                best = (mid, bytes);
            }
            None => bad = mid,
        }
    }
    Some(best)
}

/// What B beams cost on one cache (`htpkv budget --beams B`): the prompt (the run's prefill) held once
/// and each beam's own rows after it, against B full caches each holding the prompt and its beam.
/// The length is the most each beam can generate when every step appends (the pointer-shift
/// strategies; `smart_mask` and `naive` also reuse rows freed by reorders, so they go further):
/// `tokens_per_beam = (capacity - prompt) / beams`. Field names are the JSON field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BeamBudget {
    pub beams: usize,
    pub prompt_tokens: usize,
    pub tokens_per_beam: usize,
    /// prompt + beams x tokens_per_beam, and x kv_bytes_per_token.
    pub shared_rows: usize,
    pub shared_kv_bytes: usize,
    /// beams x (prompt + tokens_per_beam), and x kv_bytes_per_token.
    pub independent_rows: usize,
    pub independent_kv_bytes: usize,
    /// One region (the config's) against beams x region.
    pub shared_region_bytes: usize,
    pub independent_region_bytes: usize,
}

/// The [`BeamBudget`] of `beams` beams on the cache `report` describes.
pub fn beam_budget(report: &BudgetReport, beams: usize) -> Result<BeamBudget, BudgetError> {
    let max = kv_manager::beam::MAX_BEAMS;
    let refuse = |reason: String| BudgetError::Beams { beams, reason };
    if beams == 0 || beams > max {
        return Err(refuse(format!("must be between 1 and {max}")));
    }
    let prompt = report.run.prefill;
    let tokens_per_beam = report.capacity_tokens.saturating_sub(prompt) / beams;
    if tokens_per_beam == 0 {
        return Err(refuse(format!(
            "the cache holds {} tokens: after a prompt of {prompt} there is no room for one token per beam",
            report.capacity_tokens
        )));
    }
    let rows = |what: &'static str, n: usize| Size::new(what, n);
    let shared_rows = prompt + beams * tokens_per_beam;
    let independent_rows = rows("beam rows", prompt + tokens_per_beam)
        .times(beams)
        .get()?;
    let per_token = report.kv_bytes_per_token;
    Ok(BeamBudget {
        beams,
        prompt_tokens: prompt,
        tokens_per_beam,
        shared_rows,
        shared_kv_bytes: rows("beam bytes", shared_rows).times(per_token).get()?,
        independent_rows,
        independent_kv_bytes: rows("beam bytes", independent_rows)
            .times(per_token)
            .get()?,
        shared_region_bytes: report.region_bytes,
        independent_region_bytes: rows("beam regions", report.region_bytes)
            .times(beams)
            .get()?,
    })
}

/// The largest byte size [`parse_byte_size`] accepts: 1 PiB, more memory than any device has (and
/// more than the largest region a valid geometry of a real model needs).
pub const MAX_BYTE_SIZE: usize = 1 << 50;

/// Parses a byte size (at most [`MAX_BYTE_SIZE`]): a number (fractions allowed) and an optional suffix `B`, `KB`/`K`, `MB`/`M`,
/// `GB`/`G`, `TB`/`T`, `PB`/`P` (powers of 1000) or `KiB`, `MiB`, `GiB`, `TiB`, `PiB` (powers of
/// 1024), case-insensitive.
pub fn parse_byte_size(text: &str) -> Result<usize, BudgetError> {
    let bad = || BudgetError::ByteSize {
        text: text.to_string(),
    };
    let t = text.trim().replace('_', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let unit: u128 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "p" | "pb" => 1_000_000_000_000_000,
        "pib" => 1 << 50,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
    let bytes = if let Ok(n) = number.parse::<u128>() {
        n.checked_mul(unit).ok_or_else(bad)?
    } else {
        let f: f64 = number.parse().map_err(|_| bad())?;
        (f * unit as f64).floor() as u128
    };
    if bytes > MAX_BYTE_SIZE as u128 {
        return Err(BudgetError::ByteSizeTooLarge {
            text: text.to_string(),
            maximum: MAX_BYTE_SIZE,
        });
    }
    usize::try_from(bytes).map_err(|_| bad())
}

/// A human-readable size in binary units, e.g. `2.00 GiB`.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_manager::{HostAllocator, KvCache};

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_byte_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_byte_size("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_byte_size("4096").unwrap(), 4096);
        assert_eq!(parse_byte_size("2gib").unwrap(), 2 << 30);
        for bad in ["", "MiB", "12 parsecs", "1.2.3GB", "-1"] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_sizes_have_a_limit() {
        assert_eq!(parse_byte_size("1PiB").unwrap(), MAX_BYTE_SIZE);
        for text in [
            "1.5PiB",
            "18446744073709551615",
            "1e300",
            "99999999999999999999999999999TB",
        ] {
            let e = parse_byte_size(text).unwrap_err();
            assert!(
                matches!(
                    e,
                    BudgetError::ByteSizeTooLarge { .. } | BudgetError::ByteSize { .. }
                ),
                "{text}: {e}"
            );
        }
        assert_eq!(
            parse_byte_size("2PB").unwrap_err().to_string(),
            "byte size `2PB` is above the limit of 1 PiB (1125899906842624 bytes)"
        );
    }

    /// The closed form against the real beam tracker: B beams that never reorder, each stepping
    /// `tokens_per_beam` times after the prompt, hold exactly `shared_rows` rows in one cache.
    #[test]
    fn beam_budget_matches_the_beam_tracker() {
        let text = "model: { name: t, layers: 2, heads: 4, kv_heads: 2, head_dim: 4, vocab: 32, dim: 16 }\n\
                    graph: { context: 64, ar: [1, 4] }\n\
                    kv: { dtype: u8, k_layout: rows, tensors: per_head, update: conveyor }\n";
        let config = Config::from_yaml(text, std::path::Path::new("t.yaml")).unwrap();
        let r = report(&config, Strategy::Conveyor, 7).unwrap();
        let b = beam_budget(&r, 4).unwrap();
        assert_eq!(b.tokens_per_beam, (63 - 7) / 4);
        let mut cache = KvCache::new(
            config.cache_spec_for(Strategy::Conveyor),
            &HostAllocator::default(),
        )
        .unwrap();
        for _ in 0..7 {
            cache.plan(1).unwrap();
            cache.commit(1).unwrap();
        }
        let mut kv = kv_manager::BeamKv::new(&cache, 4).unwrap();
        for _ in 0..b.tokens_per_beam {
            kv.plan(&mut cache, 4, &[0, 1, 2, 3]).unwrap();
            kv.commit(&mut cache).unwrap();
        }
        assert_eq!(
            (kv.rows_held(), cache.len()),
            (b.shared_rows, b.shared_rows)
        );
        assert_eq!(kv.rows_independent(), b.independent_rows);
        assert_eq!(b.shared_kv_bytes, b.shared_rows * r.kv_bytes_per_token);
        assert_eq!(b.independent_region_bytes, 4 * r.region_bytes);
        assert!(beam_budget(&r, 0).is_err());
        let e = beam_budget(&r, 57).unwrap_err().to_string();
        assert!(e.contains("no room for one token per beam"), "{e}");
    }
}
