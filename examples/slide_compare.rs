//! Compares the two ways of sliding a full context against the re-prefill oracle.
//!
//! For each prompt: greedy generation until `--warmup` tokens have been produced past the first
//! slide point, then `--measure` more tokens. The oracle session uses `restart` (every slide
//! re-prefills the kept tokens at their new positions: exactly a cold run on the kept text); the
//! candidates `slide-rerotate` and `slide-keep-positions` are fed the oracle's tokens (teacher
//! forcing) and we count how often their top-1 token equals the oracle's over the measured tokens.
//!
//! ```text
//! cargo run --release --example slide_compare -- [--context 64] [--keep 4] [--chunk 16]
//!     [--kv-dtype u16] [--warmup 0] [--measure 128] [--model-dir DIR] [--json]
//! ```

use htpkv::engine::{Engine, EngineOptions};
use htpkv::session::{Overflow, SlidePositions};
use std::path::PathBuf;

const PROMPTS: [&str; 8] = [
    "Once upon a time, there was a little girl named Lily.",
    "Tom and his dog went to the park to play with a red ball.",
    "One day, a big bear found a jar of honey in the forest.",
    "The sun was shining and the birds were singing in the tree.",
    "Sam wanted to build a tall tower with his blocks.",
    "Mia had a pretty doll. She loved to dress it up.",
    "There was a small boat on the lake. It was blue and white.",
    "Ben saw a cat on the roof. The cat was scared.",
];

struct Args {
    context: usize,
    keep: usize,
    chunk: usize,
    kv_dtype: String,
    warmup: usize,
    measure: usize,
    model_dir: Option<PathBuf>,
    json: bool,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        context: 64,
        keep: 4,
        chunk: 16,
        kv_dtype: "u16".into(),
        warmup: 0,
        measure: 128,
        model_dir: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--context" => a.context = value()?.parse()?,
            "--keep" => a.keep = value()?.parse()?,
            "--chunk" => a.chunk = value()?.parse()?,
            "--kv-dtype" => a.kv_dtype = value()?,
            "--warmup" => a.warmup = value()?.parse()?,
            "--measure" => a.measure = value()?.parse()?,
            "--model-dir" => a.model_dir = Some(value()?.into()),
            "--json" => a.json = true,
            other => anyhow::bail!("unknown option {other}"),
        }
    }
    Ok(a)
}

/// What one candidate policy scored.
#[derive(Default)]
struct Score {
    agree: usize,
    total: usize,
    max_position: usize,
    requant_max: f32,
    requant_sq: f64,
    requant_elements: usize,
    requant_clamped: usize,
    rows_moved: usize,
    slides: usize,
    seconds: f64,
}

fn open(args: &Args, overflow: Overflow) -> anyhow::Result<Engine> {
    let options = EngineOptions {
        model_dir: args.model_dir.clone(),
        context: Some(args.context),
        ar: vec![1, 8],
        kv_dtype: args.kv_dtype.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        ..EngineOptions::default()
    };
    let mut engine = Engine::open(&options, &mut |_| {})?;
    engine.set_overflow(overflow)?;
    Ok(engine)
}

fn argmax(logits: &[f32]) -> u32 {
    model::ops::argmax(logits) as u32
}

fn main() -> anyhow::Result<()> {
    let args = parse()?;
    let slide = |positions| Overflow::Slide {
        n_keep: args.keep,
        chunk: args.chunk,
        positions,
    };
    let names = ["slide-rerotate", "slide-keep-positions"];
    let policies = [slide(SlidePositions::Rerotate), slide(SlidePositions::Keep)];
    let mut scores: Vec<Score> = names.iter().map(|_| Score::default()).collect();
    let restart = Overflow::Restart {
        n_keep: args.keep,
        chunk: args.chunk,
    };
    for prompt in PROMPTS {
        let mut oracle = open(&args, restart)?;
        let mut candidates = policies
            .iter()
            .map(|&p| open(&args, p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let tokens = oracle.tokenizer().encode(prompt, true);
        let capacity = oracle.capacity();
        let mut next = argmax(oracle.session_mut().prefill(&tokens)?);
        for c in &mut candidates {
            c.session_mut().prefill(&tokens)?;
        }
        let start = capacity - tokens.len() + args.warmup;
        for step in 0..start + args.measure {
            // EOS/BOS would end the story: the text goes on with a space-like token instead.
            let fed = if next <= 2 { 300 } else { next };
            next = argmax(oracle.session_mut().decode(fed)?);
            for (c, score) in candidates.iter_mut().zip(&mut scores) {
                let offset = c.session().cache().position_offset();
                let got = argmax(c.session_mut().decode(fed)?);
                if step >= start {
                    score.total += 1;
                    score.agree += usize::from(got == next);
                }
                score.max_position = score.max_position.max(c.len() + offset);
            }
        }
        for (c, score) in candidates.iter().zip(&mut scores) {
            for e in c.session().slides() {
                score.slides += 1;
                score.rows_moved += e.rows_moved;
                score.seconds += e.seconds;
                if let Some(r) = e.requant {
                    score.requant_max = score.requant_max.max(r.max_abs);
                    score.requant_sq += r.sum_sq;
                    score.requant_elements += r.elements;
                    score.requant_clamped += r.clamped;
                }
            }
        }
    }
    report(&args, &names, &scores)
}

fn report(args: &Args, names: &[&str], scores: &[Score]) -> anyhow::Result<()> {
    let rows: Vec<serde_json::Value> = names
        .iter()
        .zip(scores)
        .map(|(name, s)| {
            serde_json::json!({
                "policy": name,
                "top1_agreement": s.agree as f64 / s.total.max(1) as f64,
                "tokens_compared": s.total,
                "slides": s.slides,
                "rows_moved_per_slide": s.rows_moved / s.slides.max(1),
                "ms_per_slide": s.seconds * 1e3 / s.slides.max(1) as f64,
                "max_position": s.max_position,
                "requant_max_abs": s.requant_max,
                "requant_clamped": s.requant_clamped,
                "requant_elements": s.requant_elements,
                "requant_rms": if s.requant_elements > 0 {
                    (s.requant_sq / s.requant_elements as f64).sqrt()
                } else { 0.0 },
            })
        })
        .collect();
    if args.json {
        let doc = serde_json::json!({
            "model": args.model_dir.as_ref().map_or("stories260K (embedded)".into(), |p| p.display().to_string()),
            "context": args.context,
            "keep": args.keep,
            "chunk": args.chunk,
            "kv_dtype": args.kv_dtype,
            "warmup": args.warmup,
            "measure": args.measure,
            "prompts": PROMPTS.len(),
            "results": rows,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "context {} keep {} chunk {} kv {} warmup {}: top-1 agreement with the re-prefill oracle over {} x {} tokens",
        args.context,
        args.keep,
        args.chunk,
        args.kv_dtype,
        args.warmup,
        PROMPTS.len(),
        args.measure
    );
    println!(
        "| policy | top-1 agreement | slides | rows moved/slide | ms/slide | max position | requant max / rms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.1}% | {} | {} | {:.3} | {} | {:.2e} / {:.2e} ({} of {}) |",
            r["policy"].as_str().unwrap_or(""),
            100.0 * r["top1_agreement"].as_f64().unwrap_or(0.0),
            r["slides"],
            r["rows_moved_per_slide"],
            r["ms_per_slide"].as_f64().unwrap_or(0.0),
            r["max_position"],
            r["requant_max_abs"].as_f64().unwrap_or(0.0),
            r["requant_rms"].as_f64().unwrap_or(0.0),
            r["requant_clamped"],
            r["requant_elements"],
        );
    }
    Ok(())
}
