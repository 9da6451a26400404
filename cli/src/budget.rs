//! `htpkv budget` (memory budget and predicted update costs per strategy) and `htpkv plan` (a
//! simulated generation on a real `KvCache`, checked against the budget's predictions).

use crate::output;
use anyhow::{Context as _, bail};
use htpkv::budget::{
    BudgetReport, Prediction, Run, fit_context, human_bytes, min_context, parse_byte_size, predict,
    region_at, report,
};
use htpkv::config::{Config, ReserveConfig, parse_kv_dtype};
use htpkv::kv_manager::{
    Counters, Geometry, Granularity, HostAllocator, KLayout, KvCache, MAX_CONTEXT, Size, Strategy,
    workload,
};
use htpkv_planning::svg::{Chart, LegendItem, Marker, Series};
use model::fsio::{check_output, write_atomic_verified};
use serde_json::json;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Command-line overrides of config fields, shared by `budget` and `plan`.
#[derive(Debug, Clone, clap::Args)]
pub struct Overrides {
    /// Override graph.context (S).
    #[arg(long, value_name = "S")]
    context: Option<usize>,
    /// Override kv.reserve (`2x`, `1.5x`, a row count, or `+K`).
    #[arg(long, value_name = "R")]
    reserve: Option<ReserveConfig>,
    /// Override kv.dtype (u8, u16, i8, i16, f16, f32).
    #[arg(long, value_name = "T", value_parser = parse_kv_dtype)]
    dtype: Option<quant::DataType>,
    /// Only this update strategy (shift, conveyor, smart_mask, naive); budget shows all by default.
    #[arg(long, value_name = "U")]
    update: Option<Strategy>,
    /// Stagger the layers' rebases (shift).
    #[arg(long)]
    stagger: bool,
    /// Override graph.ar, the AR variants (tokens per step). For a model file the default follows
    /// the context as `generate` does: 1,32, or 1 below a context of 33.
    #[arg(long, value_delimiter = ',', value_name = "N,..")]
    ar: Option<Vec<usize>>,
}

impl Overrides {
    /// Loads a config and applies the overrides, then validates again.
    fn load(&self, path: &PathBuf) -> anyhow::Result<Config> {
        let mut config = Config::load_any(path)?;
        if let Some(s) = self.context {
            config.graph.context = s;
            if config.from_model() {
                config.graph.ar = htpkv::config::default_ar(s);
            }
        }
        if let Some(ar) = &self.ar {
            config.graph.ar.clone_from(ar);
        }
        if let Some(r) = self.reserve {
            config.kv.reserve = r;
        }
        if let Some(t) = self.dtype {
            config.kv.dtype = t;
        }
        if let Some(u) = self.update {
            config.kv.update = u;
        }
        if self.stagger {
            config.kv.stagger = true;
        }
        config
            .validate()
            .context("the config is invalid with the command-line overrides")?;
        Ok(config)
    }
}

/// Arguments of `htpkv budget`.
#[derive(Debug, clap::Args)]
pub struct BudgetArgs {
    /// Model configs (YAML, see configs/), GGUF files or Hugging Face folders (geometry from the
    /// model; context: --context or the model's context length; AR 1,128; KV u16 shift 2x).
    #[arg(required = true, value_name = "CONFIG")]
    configs: Vec<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
    /// Prefill this many tokens (in max-AR chunks) before the decode steps of the predicted run.
    #[arg(long, default_value_t = 0, value_name = "P")]
    prefill: usize,
    /// Print one JSON document (an array, one object per config and strategy).
    #[arg(long)]
    json: bool,
    /// Answer the largest context whose region fits in BYTES (e.g. 512MiB, 2GB, 1073741824).
    #[arg(long, value_name = "BYTES")]
    fit: Option<String>,
    /// Draw region bytes against context length for each strategy into an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also report what N concurrent sessions of one loaded model cost: each has its own region and
    /// graph IO buffers; the weights and compiled graphs (--shared-bytes) are loaded once.
    #[arg(long, value_name = "N")]
    sessions: Option<usize>,
    /// Bytes all sessions share (weights and compiled graphs, e.g. the context binary's size; the
    /// config does not say) [default: 0, not counted].
    #[arg(long, value_name = "BYTES", requires = "sessions")]
    shared_bytes: Option<String>,
    /// Also report what B beams (or samples) cost on one cache, the prompt (--prefill) held once and
    /// each beam's rows after it, against B full caches.
    #[arg(long, value_name = "B")]
    beams: Option<usize>,
}

/// What N concurrent sessions cost with one strategy: N x (region + graph IO) + shared.
#[derive(Debug, Clone, Copy)]
struct SessionsCost {
    sessions: usize,
    per_session: usize,
    shared: usize,
    total: usize,
}

impl SessionsCost {
    fn of(report: &BudgetReport, sessions: usize, shared: usize) -> anyhow::Result<SessionsCost> {
        let total = report
            .total_bytes
            .checked_mul(sessions)
            .and_then(|t| t.checked_add(shared))
            .context("the sessions' bytes overflow the size type")?;
        Ok(SessionsCost {
            sessions,
            per_session: report.total_bytes,
            shared,
            total,
        })
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "sessions": self.sessions,
            "per_session_bytes": self.per_session,
            "shared_bytes": self.shared,
            "total_bytes": self.total,
        })
    }
}

/// Arguments of `htpkv plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Model config (YAML), GGUF file or Hugging Face folder (defaults as for `budget`).
    #[arg(value_name = "CONFIG")]
    config: PathBuf,
    /// Decode steps (on the smallest AR variant, one token each).
    #[arg(long, value_name = "N")]
    steps: usize,
    /// Prompt tokens prefilled first, in chunks of the largest AR variant.
    #[arg(long, default_value_t = 0, value_name = "P")]
    prefill: usize,
    #[command(flatten)]
    overrides: Overrides,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

fn strategies(config: &Config, only: Option<Strategy>) -> Vec<Strategy> {
    match only {
        Some(u) => vec![u],
        None => Strategy::ALL.to_vec(),
    }
    .into_iter()
    .filter(|&u| only.is_some() || skip_reason(config, u).is_none())
    .collect()
}

/// Why the budget leaves `update` out for `config` when no update is asked for.
fn skip_reason(config: &Config, update: Strategy) -> Option<&'static str> {
    // shift and conveyor write outputs in place: they need per_head tensors and K rows.
    let in_place = config.kv.tensors == Granularity::PerHead && config.kv.k_layout == KLayout::Rows;
    if matches!(update, Strategy::Shift { .. } | Strategy::Conveyor) && !in_place {
        return Some("it needs tensors: per_head and k_layout: rows");
    }
    // Sliding layers bind the last W - 1 rows of a left-padded window (kv_manager refuses
    // smart_mask with the reason).
    if update == Strategy::SmartMask && config.geometry().has_windows() {
        return Some("sliding-window layers need left-padded windows");
    }
    None
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rows-per-token figure: an integer with separators when whole, else two decimals.
fn per_token(v: f64) -> String {
    if v.fract() == 0.0 && (0.0..1e18).contains(&v) {
        thousands(v as usize)
    } else {
        format!("{v:.2}")
    }
}

pub fn run_budget(args: BudgetArgs) -> anyhow::Result<()> {
    let inputs: Vec<&Path> = args.configs.iter().map(PathBuf::as_path).collect();
    if let Some(plot) = &args.plot {
        // Refused before anything is read: a device, FIFO, symlink, directory or one of the
        // configs (any of them, same device and inode).
        check_output(plot, &inputs).context("--plot")?;
    }
    let mut configs = Vec::new();
    for path in &args.configs {
        configs.push(args.overrides.load(path)?);
    }
    if let Some(fit) = &args.fit {
        let budget = parse_byte_size(fit)?;
        return run_fit(&configs, args.overrides.update, budget, args.json);
    }
    let mut reports: Vec<BudgetReport> = Vec::new();
    let mut skipped = Vec::new();
    for config in &configs {
        for update in Strategy::ALL {
            if args.overrides.update.is_some_and(|u| u != update) {
                continue;
            }
            if !strategies(config, args.overrides.update).contains(&update) {
                skipped.push(format!(
                    "{}: {} skipped: {}",
                    config.origin.display(),
                    update.name(),
                    skip_reason(config, update).unwrap_or("not applicable")
                ));
                continue;
            }
            let r = report(config, update, args.prefill).with_context(|| {
                format!("{}: update {}", config.origin.display(), update.name())
            })?;
            reports.push(r);
        }
    }
    for s in &skipped {
        eprintln!("note: {s}");
    }
    if let Some(plot) = &args.plot {
        plot_regions(&configs, args.overrides.update, plot, &inputs)?;
        eprintln!("wrote {}", plot.display());
    }
    let sessions = match args.sessions {
        None => None,
        Some(0) => bail!("--sessions must be at least 1"),
        Some(n) => {
            let shared = args
                .shared_bytes
                .as_deref()
                .map(parse_byte_size)
                .transpose()?
                .unwrap_or(0);
            let costs = reports
                .iter()
                .map(|r| SessionsCost::of(r, n, shared))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Some(costs)
        }
    };
    let beams = match args.beams {
        None => None,
        Some(b) => Some(
            reports
                .iter()
                .map(|r| htpkv::budget::beam_budget(r, b))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    if args.json {
        let mut values = serde_json::to_value(&reports)?;
        if let (Some(costs), Some(list)) = (&sessions, values.as_array_mut()) {
            for (v, cost) in list.iter_mut().zip(costs) {
                v["sessions"] = cost.json();
            }
        }
        if let (Some(beams), Some(list)) = (&beams, values.as_array_mut()) {
            for (v, b) in list.iter_mut().zip(beams) {
                v["beams"] = serde_json::to_value(b)?;
            }
        }
        let text = serde_json::to_string_pretty(&values)?;
        return output::to_stdout(|out| writeln!(out, "{text}"));
    }
    output::to_stdout(|out| {
        configs.iter().try_for_each(|config| {
            print_config(out, config, &reports)?;
            if let Some(beams) = &beams {
                print_beams(out, config, &reports, beams)?;
            }
            match &sessions {
                Some(costs) => print_sessions(out, config, &reports, costs),
                None => Ok(()),
            }
        })
    })
}

/// The --beams lines of one config.
fn print_beams(
    out: &mut dyn Write,
    config: &Config,
    reports: &[BudgetReport],
    beams: &[htpkv::budget::BeamBudget],
) -> io::Result<()> {
    let origin = config.origin.display().to_string();
    for (r, b) in reports
        .iter()
        .zip(beams)
        .filter(|(r, _)| r.config == origin)
    {
        writeln!(
            out,
            "  {} beams ({}): prompt {} tokens once + {} x {} tokens = {} rows, {} of K/V; \
             {} full caches: {} rows, {} (regions: 1 x {} vs {} x {} = {})",
            b.beams,
            r.update,
            b.prompt_tokens,
            b.beams,
            b.tokens_per_beam,
            thousands(b.shared_rows),
            human_bytes(b.shared_kv_bytes),
            b.beams,
            thousands(b.independent_rows),
            human_bytes(b.independent_kv_bytes),
            human_bytes(b.shared_region_bytes),
            b.beams,
            human_bytes(b.shared_region_bytes),
            human_bytes(b.independent_region_bytes),
        )?;
    }
    writeln!(out)
}

/// The N-session lines of one config.
fn print_sessions(
    out: &mut dyn Write,
    config: &Config,
    reports: &[BudgetReport],
    costs: &[SessionsCost],
) -> io::Result<()> {
    let origin = config.origin.display().to_string();
    for (r, c) in reports
        .iter()
        .zip(costs)
        .filter(|(r, _)| r.config == origin)
    {
        writeln!(
            out,
            "  {} sessions ({}): {} x {} (region {} + graph IO {}) + shared {} = {}",
            c.sessions,
            r.update,
            c.sessions,
            human_bytes(c.per_session),
            human_bytes(r.region_bytes),
            human_bytes(r.graph_io_bytes),
            human_bytes(c.shared),
            human_bytes(c.total)
        )?;
    }
    writeln!(out)
}

fn print_config(out: &mut dyn Write, config: &Config, reports: &[BudgetReport]) -> io::Result<()> {
    let origin = config.origin.display().to_string();
    let rows: Vec<&BudgetReport> = reports.iter().filter(|r| r.config == origin).collect();
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let g = config.geometry();
    writeln!(
        out,
        "{} ({origin}): {} layers x {} kv heads x head_dim {} ({} heads), {}, S = {}, AR {:?}, {}, K {}",
        config.model.name,
        g.layers,
        g.kv_heads,
        g.head_dim,
        config.model.heads,
        g.dtype,
        g.context,
        g.ar_variants,
        if g.granularity == Granularity::PerHead {
            "per_head"
        } else {
            "per_layer"
        },
        config.kv.k_layout.name()
    )?;
    writeln!(
        out,
        "  KV bytes per token: {} ({} buffers x {} B rows); the cache holds {} tokens",
        thousands(first.kv_bytes_per_token),
        thousands(first.buffers),
        first.row_bytes,
        thousands(first.capacity_tokens)
    )?;
    if first.sliding_layers > 0 {
        let less =
            |part: usize, all: usize| 100.0 * all.saturating_sub(part) as f64 / all.max(1) as f64;
        let (w, g0) = (
            first.past_bytes_per_decode_step,
            first.past_bytes_per_decode_step_all_global,
        );
        writeln!(
            out,
            "  sliding layers: {} of {} (windows {:?}): a decode step binds {} of past K/V instead of {} \
             all-global ({:.1}% less)",
            first.sliding_layers,
            g.layers,
            g.distinct_windows(),
            human_bytes(w),
            human_bytes(g0),
            less(w, g0)
        )?;
        for r in &rows {
            writeln!(
                out,
                "    {}: region {} instead of {} all-global ({:.1}% less)",
                r.update,
                human_bytes(r.region_bytes),
                human_bytes(r.region_bytes_all_global),
                less(r.region_bytes, r.region_bytes_all_global)
            )?;
        }
    }
    for io in &first.graph_io {
        let last_row = io.last_row_logits_bytes.map_or(String::new(), |b| {
            format!(" (last-row prefill graph: logits {} B)", thousands(b))
        });
        writeln!(
            out,
            "  graph IO AR-{}: input_ids {} + positions {} + mask {} + logits {} = {} B{last_row}",
            io.ar,
            thousands(io.input_ids_bytes),
            thousands(io.positions_bytes),
            thousands(io.mask_bytes),
            thousands(io.logits_bytes),
            thousands(io.total_bytes)
        )?;
    }
    if let Some(cross) = &config.kv.cross {
        writeln!(
            out,
            "  static cross K/V: {} buffers x {} rows x {} B rows ({}) = {} B ({}), in every region below",
            thousands(first.buffers),
            thousands(cross.rows),
            g.head_dim * cross.dtype.size_bytes(),
            cross.dtype,
            thousands(first.cross_bytes),
            human_bytes(first.cross_bytes)
        )?;
    }
    writeln!(
        out,
        "  run: prefill {} + {} decode steps on AR-{} (fills the context)",
        first.run.prefill,
        thousands(first.run.decode_steps),
        g.min_ar()
    )?;
    let header = [
        "update",
        "reserve",
        "rows/buffer",
        "bytes/buffer",
        "region bytes",
        "region",
        "with graph IO",
        "rows copied/token",
        "worst step rows",
        "rebases",
        "handles",
    ];
    let table: Vec<[String; 11]> = rows
        .iter()
        .map(|r| {
            [
                r.update.clone(),
                r.reserve.clone().map_or("-".into(), |res| {
                    if r.stagger {
                        format!("{res} staggered")
                    } else {
                        res
                    }
                }),
                thousands(r.reserve_rows),
                thousands(r.buffer_bytes),
                thousands(r.region_bytes),
                human_bytes(r.region_bytes),
                human_bytes(r.total_bytes),
                per_token(r.rows_copied_per_token),
                thousands(r.worst_step_rows_copied),
                thousands(r.rebases_per_context),
                thousands(r.handles),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            table
                .iter()
                .map(|row| row[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < 2 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        writeln!(out, "  {}", parts.join("  "))
    };
    line(header.to_vec())?;
    for row in &table {
        line(row.iter().map(String::as_str).collect())?;
    }
    writeln!(out)
}

/// The largest context of every strategy of each config for `budget` bytes.
type Fits<'a> = Vec<(&'a Config, Vec<(Strategy, Option<(usize, usize)>)>)>;

fn run_fit(
    configs: &[Config],
    only: Option<Strategy>,
    budget: usize,
    json: bool,
) -> anyhow::Result<()> {
    let fits: Fits<'_> = configs
        .iter()
        .map(|config| {
            let per = strategies(config, only)
                .into_iter()
                .map(|update| (update, fit_context(config, update, budget)))
                .collect();
            (config, per)
        })
        .collect();
    if json {
        let doc: Vec<_> = fits
            .iter()
            .map(|(c, per)| fit_json(c, per, budget))
            .collect();
        let text = serde_json::to_string_pretty(&doc)?;
        return output::to_stdout(|out| writeln!(out, "{text}"));
    }
    output::to_stdout(|out| {
        fits.iter()
            .try_for_each(|(config, per)| print_fit(out, config, per, budget))
    })
}

/// The best context of `per` and the strategies that reach it.
fn best_fit(per: &[(Strategy, Option<(usize, usize)>)]) -> (Option<usize>, Vec<&'static str>) {
    let best = per.iter().filter_map(|(_, f)| f.map(|f| f.0)).max();
    let winners = per
        .iter()
        .filter(|(_, f)| f.map(|f| f.0) == best && best.is_some())
        .map(|(u, _)| u.name())
        .collect();
    (best, winners)
}

fn fit_json(
    config: &Config,
    per: &[(Strategy, Option<(usize, usize)>)],
    budget: usize,
) -> serde_json::Value {
    let (best, winners) = best_fit(per);
    json!({
        "config": config.origin.display().to_string(),
        "model": config.model.name,
        "budget_bytes": budget,
        "largest_context": best,
        "best_updates": winners,
        "strategies": per.iter().map(|(u, f)| json!({
            "update": u.name(),
            "reserve": (matches!(u, Strategy::Shift { .. })).then(|| config.kv.reserve.to_string()),
            "context": f.map(|f| f.0),
            "region_bytes": f.map(|f| f.1),
            "at_context_limit": f.is_some_and(|f| f.0 == MAX_CONTEXT),
        })).collect::<Vec<_>>(),
    })
}

/// A note for a context equal to [`MAX_CONTEXT`]: the budget alone would allow more.
fn limit_note(s: usize) -> &'static str {
    if s == MAX_CONTEXT {
        " (htpkv's context limit)"
    } else {
        ""
    }
}

fn print_fit(
    out: &mut dyn Write,
    config: &Config,
    per: &[(Strategy, Option<(usize, usize)>)],
    budget: usize,
) -> io::Result<()> {
    let (best, winners) = best_fit(per);
    writeln!(
        out,
        "{} ({}), AR {:?}, {}: budget {} bytes ({})",
        config.model.name,
        config.origin.display(),
        config.graph.ar,
        config.kv.dtype,
        thousands(budget),
        human_bytes(budget)
    )?;
    match best {
        Some(s) => writeln!(
            out,
            "  largest context that fits: S = {}{} with {}",
            thousands(s),
            limit_note(s),
            winners.join(", ")
        )?,
        None => writeln!(
            out,
            "  nothing fits: even the smallest context ({}) needs more",
            min_context(config)
        )?,
    }
    for (u, f) in per {
        let name = if matches!(u, Strategy::Shift { .. }) {
            format!("shift {}", config.kv.reserve)
        } else {
            u.name().to_string()
        };
        match f {
            Some((s, bytes)) => writeln!(
                out,
                "  {name:<14} S = {:>9}  region {:>17} bytes ({}){}",
                thousands(*s),
                thousands(*bytes),
                human_bytes(*bytes),
                limit_note(*s)
            )?,
            None => writeln!(out, "  {name:<14} does not fit")?,
        }
    }
    writeln!(out)
}

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

/// Line style of a strategy in a multi-model plot (colour = model) and stroke width in a single-model
/// plot (colour = strategy; coinciding lines stay visible because wider ones are drawn first).
fn strategy_style(update: Strategy) -> (Option<String>, f64) {
    match update {
        Strategy::Shift { .. } => (None, 2.2),
        Strategy::Conveyor => (Some("10 5".into()), 6.0),
        Strategy::SmartMask => (Some("2 4".into()), 3.5),
        Strategy::Naive => (Some("10 4 2 4".into()), 1.8),
    }
}

fn shift_name(config: &Config) -> String {
    format!(
        "shift {}{}",
        config.kv.reserve,
        if config.kv.stagger { " staggered" } else { "" }
    )
}

fn plot_regions(
    configs: &[Config],
    only: Option<Strategy>,
    path: &Path,
    inputs: &[&Path],
) -> anyhow::Result<()> {
    let lo = configs.iter().map(min_context).min().unwrap_or(2);
    let hi = configs
        .iter()
        .map(|c| c.graph.context * 2)
        .max()
        .unwrap_or(4)
        .max(lo + 1);
    const SAMPLES: usize = 120;
    let xs: Vec<usize> = (0..=SAMPLES)
        .map(|i| lo + (hi - lo) * i / SAMPLES)
        .collect();
    let single = configs.len() == 1;
    let mut series = Vec::new();
    let mut legend = Vec::new();
    let mut contexts: Vec<usize> = configs.iter().map(|c| c.graph.context).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let markers = contexts
        .iter()
        .map(|&s| Marker {
            x: s as f64,
            label: format!("S = {s}"),
        })
        .collect();
    legend.push(LegendItem::Heading(if single {
        "update strategy".into()
    } else {
        "model (colour)".into()
    }));
    for (ci, config) in configs.iter().enumerate() {
        let updates = strategies(config, only);
        if !single {
            legend.push(LegendItem::Line {
                label: config.model.name.clone(),
                color: COLORS[ci % COLORS.len()].into(),
                dash: None,
                width: 3.0,
            });
        }
        for (ui, update) in updates.into_iter().enumerate() {
            let name = if matches!(update, Strategy::Shift { .. }) {
                shift_name(config)
            } else {
                update.name().to_string()
            };
            let (dash, width) = strategy_style(update);
            let s = Series {
                label: name,
                color: COLORS[if single { ui } else { ci } % COLORS.len()].to_string(),
                dash: if single { None } else { dash },
                width: if single { width } else { 2.0 },
                points: xs
                    .iter()
                    .map(|&s| (s as f64, region_at(config, update, s).map(|b| b as f64)))
                    .collect(),
            };
            if single {
                legend.push(LegendItem::of(&s));
            }
            series.push(s);
        }
    }
    if !single {
        legend.push(LegendItem::Heading("update (line style)".into()));
        for update in Strategy::ALL {
            if only.is_some_and(|u| u != update) {
                continue;
            }
            let (dash, _) = strategy_style(update);
            let label = if matches!(update, Strategy::Shift { .. }) {
                shift_name(&configs[0])
            } else {
                update.name().to_string()
            };
            legend.push(LegendItem::Line {
                label,
                color: "#333333".into(),
                dash,
                width: 2.0,
            });
        }
    }
    let title = if single {
        let c = &configs[0];
        format!(
            "KV region vs context: {} ({}, AR {:?})",
            c.model.name, c.kv.dtype, c.graph.ar
        )
    } else {
        format!("KV region vs context: {} models", configs.len())
    };
    let chart = Chart {
        title,
        x_label: "context length S (tokens)".into(),
        series,
        markers,
        legend,
    };
    // The writer's errors name the file.
    let svg = chart.render();
    write_atomic_verified(path, svg.as_bytes(), inputs, &mut |_| Ok(())).context("--plot")
}

/// One simulated step, as printed.
#[derive(Debug)]
struct StepRecord {
    step: usize,
    phase: &'static str,
    ar: usize,
    len_before: usize,
    committed: usize,
    /// Per layer: the past binding offset of the layer's first tensor, in bytes.
    window_start_bytes: Vec<usize>,
    rows_copied: usize,
    bytes_copied: usize,
    rebases: usize,
    new_handles: usize,
}

impl StepRecord {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "step": self.step,
            "phase": self.phase,
            "ar": self.ar,
            "len_before": self.len_before,
            "committed": self.committed,
            "window_start_bytes": self.window_start_bytes,
            "rows_copied": self.rows_copied,
            "bytes_copied": self.bytes_copied,
            "rebases": self.rebases,
            "new_handles": self.new_handles,
        })
    }
}

/// Most tensor bindings (steps x K/V buffers) `htpkv plan` simulates.
const MAX_PLAN_BINDINGS: usize = 1 << 25;
/// Most bytes `htpkv plan` moves: rows the graphs write plus rows the strategy copies.
const MAX_PLAN_BYTES: usize = 1 << 34;

/// Refuses a simulation that would take more than a few seconds (the budget's closed form answers any
/// run at once): more than [`MAX_PLAN_BINDINGS`] bindings or [`MAX_PLAN_BYTES`] bytes moved.
fn check_plan_work(g: &Geometry, run: &Run, p: &Prediction) -> anyhow::Result<()> {
    let bindings = Size::new("plan bindings", p.steps)
        .times(g.buffers())
        .get()?;
    // --prefill and --steps are the user's numbers: checked, so a huge one is an error.
    let prefill_rows =
        Size::new("prefill rows (--prefill)", run.prefill.div_ceil(g.max_ar())).times(g.max_ar());
    let decode_rows = Size::new("decode rows (--steps)", run.decode_steps).times(g.min_ar());
    let written_rows = prefill_rows.plus_size(decode_rows).get()?;
    let moved = Size::new("plan bytes moved", written_rows)
        .times(g.kv_bytes_per_token())
        .plus(p.bytes_copied)
        .get()?;
    if bindings > MAX_PLAN_BINDINGS || moved > MAX_PLAN_BYTES {
        bail!(
            "this run is too long to simulate: {} steps x {} K/V buffers = {} bindings and {} moved; \
             `htpkv plan` simulates at most {} bindings and {} (`htpkv budget --prefill {}` predicts \
             the full-context run in closed form)",
            thousands(p.steps),
            thousands(g.buffers()),
            thousands(bindings),
            human_bytes(moved),
            thousands(MAX_PLAN_BINDINGS),
            human_bytes(MAX_PLAN_BYTES),
            run.prefill
        );
    }
    Ok(())
}

pub fn run_plan(args: PlanArgs) -> anyhow::Result<()> {
    let config = args.overrides.load(&args.config)?;
    let spec = config.cache_spec();
    let g = spec.geometry.clone();
    let run = Run {
        prefill: args.prefill,
        decode_steps: args.steps,
    };
    run.check(&g)?;
    let prediction: Prediction = predict(&spec, &run)?;
    check_plan_work(&g, &run, &prediction)?;
    // Not prefaulted: the region is mapped lazily and the simulation touches only the rows it writes
    // or copies (a few MB for a short run of a 2 GB cache).
    let mut cache = KvCache::new(spec, &HostAllocator { prefault: false })?;
    let tensors_per_layer = match g.granularity {
        Granularity::PerHead => 2 * g.kv_heads,
        Granularity::PerLayer => 2,
    };
    let rb = g.row_bytes();
    let mut records = Vec::new();
    for (i, step) in run.schedule(&g).into_iter().enumerate() {
        let len_before = cache.len();
        let plan = cache.plan(step.ar)?;
        let window_start_bytes: Vec<usize> = (0..g.layers)
            .map(|l| plan.past_offsets[l * tensors_per_layer])
            .collect();
        let (plan, region) = cache
            .pending_io()
            .context("the cache lost the step it just planned")?;
        workload::graph_write(plan, region, (i % 251) as u8 + 1);
        cache.commit(step.commit)?;
        let s = *cache.last_step();
        records.push(StepRecord {
            step: i,
            phase: if step.decode { "decode" } else { "prefill" },
            ar: step.ar,
            len_before,
            committed: step.commit,
            window_start_bytes,
            rows_copied: s.bytes_copied / rb,
            bytes_copied: s.bytes_copied,
            rebases: s.rebases,
            new_handles: s.new_handles,
        });
    }
    let c = *cache.counters();
    let mismatches = prediction.mismatches(&c);
    let strategy = config.strategy();
    let totals = json!({
        "steps": c.steps,
        "tokens_committed": c.tokens_committed,
        "bytes_copied": c.bytes_copied,
        "rows_copied": c.bytes_copied / rb,
        "worst_step_bytes_copied": c.worst_step_bytes_copied,
        "worst_step_rows_copied": c.worst_step_bytes_copied / rb,
        "rebases": c.rebases,
        "handles": c.handles,
        "max_window_offsets_per_buffer": c.max_window_offsets_per_buffer,
        "peak_bytes_in_use": c.peak_bytes_in_use,
        "region_bytes": c.region_bytes,
    });
    if args.json {
        let doc = json!({
            "config": config.origin.display().to_string(),
            "model": config.model.name,
            "update": strategy.name(),
            "reserve": (matches!(config.kv.update, Strategy::Shift { .. })).then(|| config.kv.reserve.to_string()),
            "stagger": matches!(config.kv.update, Strategy::Shift { .. }) && config.kv.stagger,
            "context": g.context,
            "ar": g.ar_variants,
            "row_bytes": rb,
            "run": run,
            "steps": records.iter().map(StepRecord::to_json).collect::<Vec<_>>(),
            "totals": totals,
            "prediction": prediction,
            "prediction_matches": mismatches.is_empty(),
        });
        let text = serde_json::to_string_pretty(&doc)?;
        output::to_stdout(|out| writeln!(out, "{text}"))?;
    } else {
        output::to_stdout(|out| {
            print_plan(out, &config, &run, &records, &c, mismatches.is_empty())
        })?;
    }
    if !mismatches.is_empty() {
        bail!(
            "the simulation differs from the budget prediction: {}",
            mismatches.join("; ")
        );
    }
    Ok(())
}

/// The text report of `htpkv plan`.
fn print_plan(
    out: &mut dyn Write,
    config: &Config,
    run: &Run,
    records: &[StepRecord],
    c: &Counters,
    matches: bool,
) -> io::Result<()> {
    let (g, strategy) = (config.geometry(), config.strategy());
    let rb = g.row_bytes();
    {
        writeln!(
            out,
            "{} ({}): {} update{}, S = {}, AR {:?}, region {} bytes ({}); prefill {} + {} decode steps",
            config.model.name,
            config.origin.display(),
            strategy.name(),
            if matches!(config.kv.update, Strategy::Shift { .. }) {
                format!(
                    " (reserve {}{})",
                    config.kv.reserve,
                    if config.kv.stagger { ", staggered" } else { "" }
                )
            } else {
                String::new()
            },
            g.context,
            g.ar_variants,
            thousands(c.region_bytes),
            human_bytes(c.region_bytes),
            run.prefill,
            run.decode_steps
        )?;
        writeln!(
            out,
            "  window start = row of the layer's first past binding (offset / {rb} B); one column per layer"
        )?;
        writeln!(
            out,
            "  {:>6} {:<7} {:>4} {:>6} {:>4} {:>10} {:>7} {:>7}  window start per layer",
            "step", "phase", "ar", "len", "keep", "rows copied", "rebases", "handles"
        )?;
        for r in records {
            let starts: Vec<String> = r
                .window_start_bytes
                .iter()
                .map(|o| (o / rb).to_string())
                .collect();
            writeln!(
                out,
                "  {:>6} {:<7} {:>4} {:>6} {:>4} {:>10} {:>7} {:>7}  {}",
                r.step,
                r.phase,
                r.ar,
                r.len_before,
                r.committed,
                r.rows_copied,
                r.rebases,
                r.new_handles,
                starts.join(" ")
            )?;
        }
        writeln!(
            out,
            "  totals: {} steps, {} tokens, {} rows ({} bytes) copied, worst step {} rows, {} rebases, {} handles",
            c.steps,
            c.tokens_committed,
            thousands(c.bytes_copied / rb),
            thousands(c.bytes_copied),
            thousands(c.worst_step_bytes_copied / rb),
            c.rebases,
            thousands(c.handles)
        )?;
        if matches {
            writeln!(out, "  budget prediction for this run: equal")?;
        }
    }
    Ok(())
}
