//! Speculative decoding against plain decoding, in one run, on a fixed prompt set.
//!
//! For every prompt, plain greedy decoding and each speculator run one after the other on the
//! same engine (the cache reset between runs), so the machine's load is shared alike; each
//! speculative text is checked to be the plain text. Reported per run and per prompt kind: tokens
//! per target call, acceptance, decode tokens/s (the session's decode time: proposals, verification
//! and plain steps) and the speedup over plain decoding of the same prompts.
//!
//! `cargo run --release --example spec_bench -- [--json] [--model GGUF] [--tokens N]
//!  [--speculate prompt-lookup:4,prompt-lookup:8@all] [--repeat R] [--update STRATEGY]`
//!
//! A speculator spelled with `@all` verifies every proposed token
//! ([`Speculation::verifying_all`]); without it the planner picks how many (on a CPU, where an
//! AR-n step costs several AR-1 steps, it verifies only proposals likely to be accepted).
//!
//! Without `--model` it runs the embedded stories260K on story prompts. With a chat model
//! (SmolLM2-135M-Instruct) the prompts are chat questions of four kinds: rewrite (a paragraph to
//! copy with edits), summarise, code, open question. Threads: rayon's pool (one per core;
//! `RAYON_NUM_THREADS` overrides).

use anyhow::{Context, bail, ensure};
use htpkv::engine::{Engine, EngineOptions, speculator};
use htpkv::sampler::SamplerOptions;
use htpkv::session::{GenerateOptions, Generation};
use htpkv::speculate::{SpecKind, SpecStats, Speculation};
use model::Message;
use std::path::PathBuf;

/// The chat prompts: (kind, text).
const CHAT_PROMPTS: [(&str, &str); 10] = [
    (
        "rewrite",
        "Fix the spelling mistakes in this paragraph and write it out again: The comittee met on \
         tuesday to discus the new libary budget. Most members agred that the reading room needs \
         new chairs, beter lights and a quiet corner for children. The decision on the opening \
         hours was postponed untill the next meeting.",
    ),
    (
        "rewrite",
        "Rewrite this paragraph, replacing every 'car' with 'bicycle': My car is old but \
         reliable. Every morning I take the car to work, and on weekends the car carries us to \
         the lake. When the car needs repairs, I fix the car myself in the garage.",
    ),
    (
        "rewrite",
        "Write this paragraph out again with the name Tom changed to Anna: Tom opened the small \
         bakery on Main Street in 1998. Every morning Tom baked bread, rolls and apple pies, and \
         by seven o'clock the line of customers reached the corner. Tom still uses his \
         grandmother's recipe for the pies.",
    ),
    (
        "rewrite",
        "Edit this paragraph so that it is in the past tense: The train leaves the station at \
         noon. Maria sits by the window and watches the fields go by. She reads a book about \
         old castles and drinks a cup of tea. At four o'clock the train arrives in the city.",
    ),
    (
        "summarise",
        "Summarise this paragraph in two sentences: The city council approved a plan to plant \
         ten thousand trees over the next five years. The trees will be planted along major \
         roads, in school yards and in new parks. Officials say the trees will cool the streets \
         in summer, clean the air and make neighbourhoods more pleasant. The plan will cost about \
         two million dollars, paid partly by a state grant.",
    ),
    (
        "summarise",
        "Summarise: Honey bees live in colonies of up to sixty thousand bees. A colony has one \
         queen, who lays the eggs, thousands of female worker bees, who gather nectar and pollen, \
         and a few hundred male drones. Workers communicate the location of flowers with a dance.",
    ),
    (
        "code",
        "Add a docstring to this Python function and return the whole function:\n\
         def average(numbers):\n    total = 0\n    for number in numbers:\n        total = total \
         + number\n    return total / len(numbers)",
    ),
    (
        "code",
        "Write a Python function that returns the factorial of a number n.",
    ),
    ("open", "What are the benefits of regular exercise?"),
    ("open", "Why is the sky blue?"),
];

/// The story prompts of stories260K (kind `story`).
const STORY_PROMPTS: [&str; 3] = [
    "Once upon a time, there was a little girl named Lily. Lily liked to play with her ball.",
    "Tom and his mom went to the park. Tom saw a big dog.",
    "One day, a cat found a red box.",
];

struct Args {
    json: bool,
    model: Option<PathBuf>,
    tokens: usize,
    /// Each speculator and whether it verifies every proposed token.
    speculators: Vec<(SpecKind, bool)>,
    repeat: usize,
    update: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        json: false,
        model: None,
        tokens: 128,
        speculators: vec![],
        repeat: 1,
        update: None,
    };
    let mut specs = "prompt-lookup:4,prompt-lookup:4@all".to_string();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().with_context(|| format!("{arg} {what}"));
        match arg.as_str() {
            "--json" => a.json = true,
            "--model" => a.model = Some(PathBuf::from(value("PATH")?)),
            "--tokens" => a.tokens = value("N")?.parse()?,
            "--speculate" => specs = value("LIST")?,
            "--repeat" => a.repeat = value("R")?.parse()?,
            "--update" => a.update = Some(value("STRATEGY")?),
            other => bail!("unknown argument `{other}`"),
        }
    }
    for s in specs.split(',') {
        let (spec, all) = s.strip_suffix("@all").map_or((s, false), |s| (s, true));
        a.speculators.push((SpecKind::parse(spec)?, all));
    }
    ensure!(
        a.repeat > 0 && a.tokens > 0,
        "--repeat and --tokens must be positive"
    );
    Ok(a)
}

/// One generation's measurements.
struct Run {
    generation: Generation,
    decode_tokens: usize,
    decode_seconds: f64,
    spec: Option<SpecStats>,
}

/// Generates for `prompt` on a fresh cache, with `spec` or plainly.
fn run(
    engine: &mut Engine,
    prompt: &str,
    chat: bool,
    tokens: usize,
    spec: Option<(&(SpecKind, bool), &EngineOptions)>,
) -> anyhow::Result<Run> {
    engine.reset();
    let context = engine.session().cache().spec().geometry.context;
    let speculation = match spec {
        Some(((k, all), options)) => {
            let s = Speculation::new(speculator::open(k, options, context)?);
            Some(if *all { s.verifying_all() } else { s })
        }
        None => None,
    };
    engine.set_speculation(speculation);
    let options = GenerateOptions {
        max_tokens: tokens,
        sampler: SamplerOptions::default(),
        ..GenerateOptions::default()
    };
    let before = engine.stats();
    let generation = if chat {
        engine.chat(&[Message::new("user", prompt)], &options, &mut |_| true)?
    } else {
        engine.generate(prompt, &options, &mut |_| true)?
    };
    let after = engine.stats();
    Ok(Run {
        generation,
        decode_tokens: after.decode_tokens - before.decode_tokens,
        decode_seconds: after.decode_seconds - before.decode_seconds,
        spec: engine.speculation().map(|s| s.stats().clone()),
    })
}

/// Totals of one speculator (or plain decoding) over some prompts.
#[derive(Default, Clone)]
struct Totals {
    decode_tokens: usize,
    decode_seconds: f64,
    calls: usize,
    committed: usize,
    proposed: usize,
    accepted: usize,
    commit_bytes: usize,
    /// Tokens committed by verification steps.
    verified_tokens: usize,
}

impl Totals {
    fn add(&mut self, r: &Run) {
        self.decode_tokens += r.decode_tokens;
        self.decode_seconds += r.decode_seconds;
        if let Some(s) = &r.spec {
            self.calls += s.calls;
            self.committed += s.tokens;
            self.proposed += s.proposed;
            self.accepted += s.accepted;
            self.commit_bytes += s.commit_bytes_copied;
            self.verified_tokens += s.tokens - s.plain_calls;
        } else {
            self.calls += r.decode_tokens;
            self.committed += r.decode_tokens;
        }
    }

    fn rate(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_seconds.max(1e-12)
    }

    fn json(&self, plain: &Totals) -> serde_json::Value {
        serde_json::json!({
            "tokens_per_call": self.committed as f64 / self.calls.max(1) as f64,
            "acceptance_rate": self.accepted as f64 / self.proposed.max(1) as f64,
            "decode_tokens": self.decode_tokens,
            "decode_seconds": self.decode_seconds,
            "decode_tokens_per_second": self.rate(),
            "speedup": self.rate() / plain.rate(),
            "commit_bytes_copied_per_accepted_token": self.commit_bytes as f64
                / (self.verified_tokens.max(1)) as f64,
        })
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let chat = args.model.is_some();
    let mut ar: Vec<usize> = vec![1, 32];
    ar.extend(args.speculators.iter().map(|(k, _)| k.verify_ar()));
    ar.sort_unstable();
    ar.dedup();
    let mut options = EngineOptions {
        model_dir: args.model.clone(),
        ar: ar.clone(),
        ..EngineOptions::default()
    };
    if let Some(name) = &args.update {
        options.strategy = EngineOptions::parse_strategy(name)?;
    }
    let mut engine = Engine::open(&options, &mut |line| eprintln!("{line}"))?;
    let prompts: Vec<(&str, &str)> = if chat {
        CHAT_PROMPTS.to_vec()
    } else {
        STORY_PROMPTS.iter().map(|p| ("story", *p)).collect()
    };
    let names: Vec<String> = std::iter::once("plain".to_string())
        .chain((args.speculators.iter()).map(|(k, all)| {
            let name = match k {
                SpecKind::PromptLookup { k } => format!("prompt-lookup:{k}"),
                SpecKind::Draft { k, .. } => format!("draft:{k}"),
                SpecKind::Lookahead { window, ngram, cap } => {
                    format!("lookahead:{window},{ngram},{cap}")
                }
            };
            name + if *all { "@all" } else { "" }
        }))
        .collect();
    // totals[kind][speculator]
    let mut kinds: Vec<(&str, Vec<Totals>)> = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..args.repeat {
        for &(kind, prompt) in &prompts {
            let plain = run(&mut engine, prompt, chat, args.tokens, None)?;
            let mut row = vec![plain];
            for (k, name) in args.speculators.iter().zip(&names[1..]) {
                let r = run(&mut engine, prompt, chat, args.tokens, Some((k, &options)))?;
                ensure!(
                    r.generation.tokens == row[0].generation.tokens,
                    "{name}: the text differs from plain decoding on `{prompt}`"
                );
                row.push(r);
            }
            let slot = match kinds.iter().position(|(k, _)| *k == kind) {
                Some(i) => i,
                None => {
                    kinds.push((kind, vec![Totals::default(); names.len()]));
                    kinds.len() - 1
                }
            };
            for (t, r) in kinds[slot].1.iter_mut().zip(&row) {
                t.add(r);
            }
            runs.push(run_json(kind, prompt, &names, &row));
            if !args.json {
                print_row(kind, prompt, &names, &row);
            }
        }
    }
    let summary: serde_json::Map<String, serde_json::Value> = (kinds.iter())
        .map(|(kind, totals)| {
            let per: serde_json::Map<_, _> = (names.iter().zip(totals))
                .map(|(n, t)| (n.clone(), t.json(&totals[0])))
                .collect();
            (kind.to_string(), per.into())
        })
        .collect();
    let doc = serde_json::json!({
        "model": args.model.as_ref().map_or("stories260K (embedded)".into(), |p| p.display().to_string()),
        "ar": ar,
        "tokens": args.tokens,
        "threads": rayon_threads(),
        "update": options.strategy.name(),
        "by_kind": summary,
        "runs": runs,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_summary(&kinds, &names);
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn run_json(kind: &str, prompt: &str, names: &[String], row: &[Run]) -> serde_json::Value {
    let plain_rate = row[0].decode_tokens as f64 / row[0].decode_seconds.max(1e-12);
    let results: Vec<serde_json::Value> = (names.iter().zip(row))
        .map(|(n, r)| {
            let rate = r.decode_tokens as f64 / r.decode_seconds.max(1e-12);
            serde_json::json!({
                "speculator": n,
                "generated_tokens": r.generation.tokens.len(),
                "decode_tokens_per_second": rate,
                "speedup": rate / plain_rate,
                "tokens_per_call": r.spec.as_ref().map_or(1.0, SpecStats::tokens_per_call),
                "acceptance_rate": r.spec.as_ref().map(SpecStats::acceptance_rate),
                "plain_step_seconds": r.spec.as_ref().and_then(SpecStats::plain_step_seconds),
                "verify_steps": r.spec.as_ref().map(|s| s.variants.iter().map(|(ar, n, secs)| {
                    serde_json::json!({"ar": ar, "calls": n, "mean_seconds": secs / *n as f64})
                }).collect::<Vec<_>>()),
            })
        })
        .collect();
    serde_json::json!({"kind": kind, "prompt": prompt, "results": results})
}

fn print_row(kind: &str, prompt: &str, names: &[String], row: &[Run]) {
    let short: String = prompt.chars().take(50).collect();
    println!("[{kind}] {short}...");
    let plain_rate = row[0].decode_tokens as f64 / row[0].decode_seconds.max(1e-12);
    for (n, r) in names.iter().zip(row) {
        let rate = r.decode_tokens as f64 / r.decode_seconds.max(1e-12);
        let tpc = r.spec.as_ref().map_or(1.0, SpecStats::tokens_per_call);
        println!(
            "  {n:>16}: {:>3} tokens, {tpc:.2} tokens/call, {rate:6.1} tok/s, {:.2}x",
            r.generation.tokens.len(),
            rate / plain_rate
        );
    }
}

fn print_summary(kinds: &[(&str, Vec<Totals>)], names: &[String]) {
    println!("\nby kind (all prompts of the kind):");
    for (kind, totals) in kinds {
        for (n, t) in names.iter().zip(totals) {
            println!(
                "  {kind:>10} {n:>16}: {:.2} tokens/call, {:5.1}% accepted, {:6.1} tok/s, {:.2}x",
                t.committed as f64 / t.calls.max(1) as f64,
                100.0 * t.accepted as f64 / t.proposed.max(1) as f64,
                t.rate(),
                t.rate() / totals[0].rate()
            );
        }
    }
}
