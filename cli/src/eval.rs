//! `htpkv eval --text FILE`: how close a compiled model runs to the f32 model on a user's text.
//!
//! The text's first `--tokens` tokens (BOS first) are fed one by one (AR-1, teacher-forced)
//! through the session `generate` would open (any source and backend: `--model`, `--compiled`,
//! `--backend reference|qnn`), and through the f32 forward of the same model (`model`'s
//! `FloatModel`, the oracle); at each position the two next-token distributions are compared:
//! top-1 agreement, mean and largest KL(f32 ‖ run), and both runs' perplexity of the text.

use crate::generate::{RunArgs, check_run, foreign, open_run};
use anyhow::Context;
use htpkv::backend::Backend;
use htpkv::engine::{Engine, OpenedModel};
use htpkv::session::Session;
use htpkv::session::TextCodec;
use kv_manager::KvCache;
use model::FloatModel;
use model::fsio::{FileKind, read_capped};
use model::ops::{argmax, kl_logits, log_sum_exp};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `htpkv eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// The text to score (UTF-8); its first --tokens tokens are scored.
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Positions to score (at most the context; fewer when the text is shorter).
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Feed the first N positions without scoring them (llama-perplexity scores only the second
    /// half of each chunk: `--tokens 512 --skip 256` scores what it scores in its first chunk).
    #[arg(long, value_name = "N", default_value_t = 0)]
    skip: usize,
    /// One JSON document on stdout instead of a line.
    #[arg(long)]
    json: bool,
    /// Which model runs, and where.
    #[command(flatten)]
    run: RunArgs,
}

/// What the comparison found.
#[derive(Debug, Default)]
struct Score {
    positions: usize,
    agree: usize,
    kl_sum: f64,
    kl_max: f64,
    /// Negative log-likelihoods of the text's next tokens, summed (run, f32), and how many.
    nll: (f64, f64),
    predicted: usize,
}

impl Score {
    fn add(&mut self, float: &[f32], run: &[f32], next: Option<u32>) {
        self.positions += 1;
        self.agree += usize::from(argmax(float) == argmax(run));
        let kl = kl_logits(float, run);
        self.kl_sum += kl;
        self.kl_max = self.kl_max.max(kl);
        if let Some(t) = next {
            let nll = |l: &[f32]| log_sum_exp(l) - f64::from(l[t as usize]);
            self.nll.0 += nll(run);
            self.nll.1 += nll(float);
            self.predicted += 1;
        }
    }

    fn perplexity(&self, nll: f64) -> f64 {
        (nll / self.predicted.max(1) as f64).exp()
    }
}

/// The text's first `n` tokens, BOS first: only a prefix long enough for them reaches the
/// tokenizer when it bounds the bytes of a token.
fn tokens_of(codec: &dyn TextCodec, text: &str, n: usize) -> Vec<u32> {
    let text = match codec.bytes_per_token() {
        Some(b) => {
            let mut end = text.len().min(n.saturating_mul(b));
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        }
        None => text,
    };
    let mut ids = codec.encode(text, true);
    ids.truncate(n);
    ids
}

/// The session `eval` scores: the engine `generate` would open, or binaries made by other tools.
enum Opened {
    Engine(Box<Engine>),
    Foreign(Box<foreign::Foreign>),
}

impl Opened {
    fn open(args: &EvalArgs) -> anyhow::Result<Opened> {
        let checked = check_run(&args.run, None, None)?;
        if !foreign::wanted(&args.run) {
            let mut engine = open_run(&args.run, &checked, args.json)?.0;
            crate::saturation::count_in(engine.session_mut());
            return Ok(Opened::Engine(Box::new(engine)));
        }
        anyhow::ensure!(
            args.run.model_dir.is_some(),
            "eval of context binaries made by other tools (--bundle, --convention, several \
             --compiled) needs --model PATH: the same model's weights for the f32 oracle (a \
             binary carries none)"
        );
        Ok(Opened::Foreign(Box::new(foreign::open(
            &args.run,
            &checked.engine,
        )?)))
    }

    fn codec(&self) -> &dyn TextCodec {
        match self {
            Opened::Engine(e) => e.tokenizer(),
            Opened::Foreign(f) => &f.codec,
        }
    }

    fn session(&mut self) -> &mut Session<Box<dyn Backend>> {
        match self {
            Opened::Engine(e) => e.session_mut(),
            Opened::Foreign(f) => &mut f.session,
        }
    }
}

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let bytes = read_capped(&args.text, FileKind::TEXT)?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("--text {} is not UTF-8", args.text.display()))?;
    anyhow::ensure!(
        args.tokens >= 1,
        "--tokens 0: at least one position must be scored"
    );
    let mut opened = Opened::open(&args)?;
    let n = args.tokens.min(opened.session().capacity());
    let tokens = tokens_of(opened.codec(), &text, n.saturating_add(1));
    anyhow::ensure!(
        tokens.len() >= 2,
        "--text {} gives {} token(s): at least 2 are needed to score one prediction",
        args.text.display(),
        tokens.len()
    );
    // Positions skip..fed are scored; one of them must have a next token to predict.
    let fed = tokens.len().min(n);
    let predictable = fed.min(tokens.len() - 1);
    anyhow::ensure!(
        args.skip < predictable,
        "--skip {} leaves no position to score: {fed} position(s) are fed (--tokens {}, the \
         text's tokens and the context) and the last one with a next token is {}",
        args.skip,
        args.tokens,
        predictable - 1
    );
    let oracle = OpenedModel::open(args.run.model_dir.as_deref(), args.run.tokenizer.as_deref())?;
    anyhow::ensure!(
        oracle.config.vocab_size == opened.session().vocab_size(),
        "the f32 model ({} tokens) and the run ({} logits) are not the same model",
        oracle.config.vocab_size,
        opened.session().vocab_size()
    );
    let started = Instant::now();
    let score = oracle.with_weights(|w| -> anyhow::Result<Score> {
        let context = tokens.len().min(oracle.config.context_length);
        let mut float = FloatModel::new(oracle.config.clone(), Arc::new(w), context)?;
        let mut score = Score::default();
        let scored = tokens.len().min(n);
        for (pos, &t) in tokens[..scored].iter().enumerate() {
            let run = (opened.session().decode(t)).map_err(htpkv::engine::EngineError::from)?;
            let f = float.forward(t, pos)?;
            if pos >= args.skip {
                score.add(f, run, tokens.get(pos + 1).copied());
            }
        }
        Ok(score)
    })??;
    let cache = opened.session().cache();
    if let Some(w) = crate::saturation::warning(cache) {
        eprintln!("{w}");
    }
    report(&args, cache, &score, started.elapsed().as_secs_f64())
}

fn report(args: &EvalArgs, cache: &KvCache, s: &Score, seconds: f64) -> anyhow::Result<()> {
    let n = s.positions as f64;
    let saturation = crate::saturation::stats_line(cache);
    let doc = serde_json::json!({
        "text": args.text,
        "positions": s.positions,
        "skipped": args.skip,
        "top1_agreement": s.agree as f64 / n,
        "mean_kl": s.kl_sum / n,
        "max_kl": s.kl_max,
        "perplexity": s.perplexity(s.nll.0),
        "f32_perplexity": s.perplexity(s.nll.1),
        "seconds_per_position": seconds / n,
        "kv_saturation": crate::saturation::json(cache),
    });
    crate::output::to_stdout(|out| {
        if args.json {
            return writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&doc).unwrap_or_default()
            );
        }
        writeln!(
            out,
            "{} positions of {}: top-1 agreement {:.2}% with the f32 model, mean KL {:.3e} (max {:.3e}), perplexity {:.3} (f32 {:.3})",
            s.positions,
            args.text.display(),
            100.0 * s.agree as f64 / n,
            s.kl_sum / n,
            s.kl_max,
            s.perplexity(s.nll.0),
            s.perplexity(s.nll.1),
        )?;
        match &saturation {
            Some(line) => writeln!(out, "{line}"),
            None => Ok(()),
        }
    })
}
