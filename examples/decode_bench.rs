//! Decode speed of the runtime on stories260K, in one run:
//! - `kv_cache`: 256 greedy tokens with the KV cache (one AR-1 step per token);
//! - `no_cache`: the same 256 tokens recomputing the whole sequence every step (reset, then prefill
//!   every token so far through the AR-32 and AR-1 graphs) — the classic KV cache speedup;
//! - `float_reference`: llama2c's plain f32 implementation with its own cache.
//!
//! `cargo run --release --example decode_bench -- [--json] [--tokens N] [--kv-dtype T] [--weights T]`
//!
//! With `--model <gguf file | safetensors folder>` it measures a real model instead: compile
//! (with calibration) at context `--context` (2048), then prefill a `--prompt`-token prompt
//! (128) through one AR-`prompt` step (its last-row graph, as the engine compiles it; the
//! all-row graph with `--all-row-prefill`) and decode `--tokens` (128) greedy tokens one AR-1 step
//! each; it reports prefill and decode tokens/s, the medians of `--runs` (3) repetitions from an
//! empty cache (each run's figures are in `prefill_runs` / `decode_runs`). Threads: rayon's pool, one per core
//! (`RAYON_NUM_THREADS` overrides).

use anyhow::{Context, bail};
use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::{HostAllocator, Strategy};
use model::llama2c::{Checkpoint, FloatModel, ModelFiles, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

/// The `--model` run's settings.
struct ModelRun {
    path: std::path::PathBuf,
    context: usize,
    prompt: usize,
    tokens: usize,
    /// Prefill + decode repetitions (the session reset between them); the median is reported.
    runs: usize,
    /// Prefill through the all-row AR graph (`--all-row-prefill`) instead of the last-row one
    /// the engine compiles by default.
    all_row_prefill: bool,
}

fn main() -> anyhow::Result<()> {
    // A refused HTPKV_ISA stops the benchmark before it measures anything.
    ref_backend::kernels::isa()?;
    let (mut json, mut tokens, mut kv, mut weights) =
        (false, None, "u16".to_string(), "i8".to_string());
    let (mut model, mut context, mut prompt, mut runs) = (None, 2048usize, 128usize, 3usize);
    let mut all_row_prefill = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().with_context(|| format!("{a} {what}"));
        match a.as_str() {
            "--json" => json = true,
            "--tokens" => tokens = Some(value("N")?.parse()?),
            "--kv-dtype" => kv = value("T")?,
            "--weights" => weights = value("T")?,
            "--model" => model = Some(std::path::PathBuf::from(value("PATH")?)),
            "--context" => context = value("S")?.parse()?,
            "--prompt" => prompt = value("N")?.parse()?,
            "--runs" => runs = value("N")?.parse()?,
            "--all-row-prefill" => all_row_prefill = true,
            other => bail!("unknown argument `{other}`"),
        }
    }
    let doc = match model {
        Some(path) => {
            let run = ModelRun {
                path,
                context,
                prompt,
                tokens: tokens.unwrap_or(128),
                runs: runs.max(1),
                all_row_prefill,
            };
            model_bench(&run, &kv, &weights)?
        }
        None => stories_bench(tokens.unwrap_or(256), &kv, &weights)?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for (k, v) in doc.as_object().into_iter().flatten() {
            println!("{k:>36}: {v}");
        }
    }
    Ok(())
}

/// Threads of rayon's pool (the matmuls' threads): `RAYON_NUM_THREADS`, else one per core.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Prefill and decode speed of a real model at a long context.
fn model_bench(run: &ModelRun, kv: &str, weights: &str) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        run.prompt > 0 && run.prompt + run.tokens <= run.context,
        "--prompt {} + --tokens {} must fit --context {}",
        run.prompt,
        run.tokens,
        run.context
    );
    let m = model::load(&run.path)?;
    // The compiled model is never written, so the fingerprint only labels it: the file's
    // SHA-256, or zeros for a safetensors folder.
    let fingerprint = if run.path.is_file() {
        model::llama2c::sha256(&std::fs::read(&run.path)?)
    } else {
        [0; 32]
    };
    let mut opts = ref_backend::CompileOptions::new(run.context, vec![1, run.prompt]);
    // As the engine compiles: plain prefill runs a graph returning only the last row's logits.
    opts.last_row = !run.all_row_prefill;
    opts.kv_dtype = kv.parse().map_err(|e| anyhow::anyhow!("--kv-dtype: {e}"))?;
    opts.weights = weights
        .parse()
        .map_err(|e| anyhow::anyhow!("--weights: {e}"))?;
    let calibration = ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|p| m.tokenizer.encode(p, true))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    // Seconds spent in each compile stage (from the progress reports).
    let mut stages: Vec<(ref_backend::Stage, f64)> = Vec::new();
    let compiled = Arc::new(ref_backend::compile(
        &m.config,
        &*m.weights,
        &calibration,
        &opts,
        fingerprint,
        &mut |p| {
            let now = start.elapsed().as_secs_f64();
            match stages.last_mut() {
                Some((stage, end)) if *stage == p.stage => *end = now,
                _ => stages.push((p.stage, now)),
            }
        },
    )?);
    let compile_s = start.elapsed().as_secs_f64();
    let mut stage_seconds = serde_json::Map::new();
    let mut from = 0.0;
    for (stage, end) in &stages {
        stage_seconds.insert(stage.name().into(), (end - from).into());
        from = *end;
    }

    // The prompt: a fixed text, repeated until it has `prompt` tokens.
    let text = "Once upon a time, in a small village by the sea, there lived an old fisherman \
                who told stories to the children every evening. ";
    let unit = m.tokenizer.encode(text, false)?;
    anyhow::ensure!(
        !unit.is_empty(),
        "the tokenizer encodes the prompt text to nothing"
    );
    let prompt: Vec<u32> = unit.iter().copied().cycle().take(run.prompt).collect();

    let mut session = Session::new(
        ReferenceBackend::new(compiled),
        Strategy::SHIFT_2X,
        &HostAllocator::default(),
    )?;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..run.runs {
        session.reset();
        let start = Instant::now();
        let mut next = model::ops::argmax(session.prefill(&prompt)?) as u32;
        prefill.push(run.prompt as f64 / start.elapsed().as_secs_f64());
        let start = Instant::now();
        for _ in 0..run.tokens {
            next = model::ops::argmax(session.decode(next)?) as u32;
        }
        decode.push(run.tokens as f64 / start.elapsed().as_secs_f64());
    }
    Ok(serde_json::json!({
        "model": run.path.display().to_string(),
        "context": run.context,
        "prompt_tokens": run.prompt,
        "decode_tokens": run.tokens,
        "kv_dtype": kv,
        "weights": weights,
        "threads": threads(),
        "prefill_graph": if run.all_row_prefill { "all rows" } else { "last row" },
        "isa": ref_backend::kernels::isa()?.name(),
        "compile_seconds": compile_s,
        "compile_stage_seconds": stage_seconds,
        "runs": run.runs,
        "prefill_tokens_per_second": median(&prefill),
        "decode_tokens_per_second": median(&decode),
        "prefill_runs": prefill,
        "decode_runs": decode,
    }))
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// stories260K: KV cache vs recomputation vs llama2c's float reference.
fn stories_bench(tokens: usize, kv: &str, weights: &str) -> anyhow::Result<serde_json::Value> {
    let (kv, weights) = (kv.to_string(), weights.to_string());
    let files = ModelFiles::discover(None)?;
    let ckpt = Arc::new(Checkpoint::load(&files.checkpoint)?);
    let tok = Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size)?;
    let options = htpkv::engine::EngineOptions {
        kv_dtype: kv.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        weights: weights.clone(),
        ..Default::default()
    };
    let config = model::llama2c::llama_config(&ckpt.config);
    let opts = htpkv::engine::compile_options(&options, &config)?;
    let calibration =
        htpkv::engine::calibration_sequences(&tok, &htpkv::text::ChatFormat::new(None))?;
    let compiled = Arc::new(ref_backend::compile(
        &config,
        &*ckpt,
        &calibration,
        &opts,
        ckpt.sha256(),
        &mut |_| {},
    )?);
    let tokens = tokens.min(ckpt.config.seq_len - 1);

    // The greedy sequence, from the float reference (also its timing).
    let mut float = FloatModel::new(ckpt.clone());
    let mut sequence = vec![1u32];
    let start = Instant::now();
    for pos in 0..tokens {
        let logits = float.forward(sequence[pos], pos)?;
        let next = model::ops::argmax(logits) as u32;
        sequence.push(if next == 1 || next == 2 { 300 } else { next });
    }
    let float_s = start.elapsed().as_secs_f64();

    let new_session = || {
        Session::new(
            ReferenceBackend::new(compiled.clone()),
            Strategy::SHIFT_2X,
            &HostAllocator::default(),
        )
    };
    let mut cached = new_session()?;
    let start = Instant::now();
    for &t in &sequence[..tokens] {
        cached.decode(t)?;
    }
    let cached_s = start.elapsed().as_secs_f64();

    let mut uncached = new_session()?;
    let start = Instant::now();
    for step in 1..=tokens {
        uncached.reset();
        uncached.prefill(&sequence[..step])?;
    }
    let uncached_s = start.elapsed().as_secs_f64();

    let rate = |s: f64| tokens as f64 / s;
    Ok(serde_json::json!({
        "model": "stories260K",
        "tokens": tokens,
        "kv_dtype": kv,
        "weights": weights,
        "threads": threads(),
        "kv_cache_tokens_per_second": rate(cached_s),
        "no_cache_tokens_per_second": rate(uncached_s),
        "float_reference_tokens_per_second": rate(float_s),
        "kv_cache_speedup": uncached_s / cached_s,
        "ratio_to_float_reference": float_s / cached_s,
    }))
}
