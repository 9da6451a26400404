//! `htpkv generate`: stream a story from the model, compiled on first use.

use anyhow::Context;
use htpkv::engine::{BackendChoice, Engine, EngineOptions};
use htpkv::sampler::SamplerOptions;
use htpkv::session::{GenerateOptions, StopReason};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `htpkv generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Text to continue (empty: a story from the beginning). It is printed first, then the
    /// generated text.
    #[arg(default_value = "")]
    prompt: String,
    /// Model directory (else $HTPKV_MODEL_DIR, ./models/stories260K, ../shared/models/stories260K).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// A compiled model file to run instead of compiling.
    #[arg(long)]
    compiled: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    steps: usize,
    /// 0 = greedy (the default: reproducible); higher = more random.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold (with temperature > 0).
    #[arg(long, default_value_t = 0.9)]
    top_p: f32,
    /// Random seed (with temperature > 0).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// KV cache element type: u8, u16, f16, f32.
    #[arg(long, default_value = "u16")]
    kv_dtype: String,
    /// Weight type: i8, f16, f32.
    #[arg(long, default_value = "i8")]
    weights: String,
    /// KV update strategy: shift, conveyor, smart_mask, naive (default: shift on the reference
    /// backend, smart_mask with --backend qnn, where sliding windows cost a memory handle per step).
    #[arg(long)]
    update: Option<String>,
    /// Context length S (default: the model's).
    #[arg(long)]
    context: Option<usize>,
    /// AR variants of the compiled graphs, e.g. 1,32.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    ar: Vec<usize>,
    /// Backend: reference (in process) or qnn (a QNN backend library).
    #[arg(long, default_value = "reference")]
    backend: String,
    /// QNN backend library (e.g. libQnnHtp.so, or the reference backend's libhtpkv_ref_qnn.so);
    /// else $HTPKV_QNN_BACKEND.
    #[arg(long)]
    qnn_backend: Option<PathBuf>,
    /// QNN system library; else $HTPKV_QNN_SYSTEM, else the backend library.
    #[arg(long)]
    qnn_system: Option<PathBuf>,
    /// How K/V memory reaches the QNN library: auto, shared-buffer, client, host.
    #[arg(long, default_value = "auto")]
    qnn_memory: String,
    /// Most QNN memory handles alive at once; least recently used ones are deregistered.
    #[arg(long, default_value_t = htpkv::qnn_memory::DEFAULT_MAX_HANDLES)]
    qnn_max_handles: usize,
    /// Print speed and KV counters to stderr.
    #[arg(long)]
    stats: bool,
    /// Print one JSON document (text and stats) to stdout instead of streaming text.
    #[arg(long)]
    json: bool,
    /// After generating, save the session (tokens, K/V rows, last logits) to FILE, atomically.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Before generating, restore a session saved with --save (same model, any --update); the
    /// prompt is appended after its text, and an empty prompt continues it.
    #[arg(long, value_name = "FILE")]
    resume: Option<PathBuf>,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let backend = match args.backend.as_str() {
        "reference" => BackendChoice::Reference,
        "qnn" => {
            let env = |k: &str| {
                std::env::var_os(k)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            };
            let backend_lib = args
                .qnn_backend
                .clone()
                .or_else(|| env("HTPKV_QNN_BACKEND"))
                .context("--backend qnn needs --qnn-backend PATH or $HTPKV_QNN_BACKEND")?;
            BackendChoice::Qnn {
                backend_lib,
                system_lib: args.qnn_system.clone().or_else(|| env("HTPKV_QNN_SYSTEM")),
                memory: args
                    .qnn_memory
                    .parse()
                    .map_err(|e: String| anyhow::anyhow!("--qnn-memory: {e}"))?,
                max_handles: args.qnn_max_handles,
            }
        }
        other => anyhow::bail!("unknown backend `{other}` (expected reference or qnn)"),
    };
    let strategy = match &args.update {
        Some(name) => EngineOptions::parse_strategy(name)?,
        None => EngineOptions::default_strategy(&backend),
    };
    let options = EngineOptions {
        model_dir: args.model_dir.clone(),
        compiled: args.compiled.clone(),
        backend,
        strategy,
        kv_dtype: args
            .kv_dtype
            .parse()
            .map_err(|e| anyhow::anyhow!("--kv-dtype: {e}"))?,
        weights: args.weights.clone(),
        context: args.context,
        ar: args.ar.clone(),
        cache_dir: None,
    };
    let quiet = args.json;
    let mut engine = Engine::open(&options, &mut |line| {
        if !quiet {
            eprintln!("{line}");
        }
    })?;
    if let Some(path) = &args.resume {
        engine.session_mut().restore(path).context("--resume")?;
    }
    let generate = GenerateOptions {
        max_tokens: args.steps,
        sampler: SamplerOptions {
            temperature: args.temperature,
            top_p: args.top_p,
            seed: args.seed,
        },
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Like llama2.c, the story starts with the prompt itself.
    if !args.json && !args.prompt.is_empty() {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    let mut write_failed = None;
    let generation = engine.generate(&args.prompt, &generate, &mut |piece| {
        if args.json {
            return true;
        }
        match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_failed = Some(e);
                false
            }
        }
    })?;
    if let Some(path) = &args.save {
        let session = engine.session_mut();
        session.feed_last(&generation)?;
        session.save(path).context("--save")?;
    }
    if let Some(e) = write_failed {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        return Err(e).context("writing to stdout");
    }
    let stats = engine.stats();
    let kv = stats.kv;
    if args.json {
        let doc = serde_json::json!({
            "prompt": args.prompt,
            "text": generation.text,
            "prompt_tokens": generation.prompt_tokens.len(),
            "generated_tokens": generation.tokens.len(),
            "tokens": generation.tokens,
            "stop": format!("{:?}", generation.stop),
            "backend": engine.session().backend().name(),
            "update": strategy.name(),
            "qnn_memory": engine.memory_report().map(|m| serde_json::json!({
                "memory": m.memory,
                "registrations": m.registrations,
                "deregistrations": m.deregistrations,
                "live_handles": m.live_handles,
                "peak_handles": m.peak_handles,
                "max_handles": m.max_handles,
            })),
            "kv_dtype": args.kv_dtype,
            "weights": args.weights,
            "prefill_tokens_per_second": stats.prefill_tokens_per_second(),
            "decode_tokens_per_second": stats.decode_tokens_per_second(),
            "kv": {
                "region_bytes": kv.region_bytes,
                "bytes_copied": kv.bytes_copied,
                "rebases": kv.rebases,
                "handles": kv.handles,
                "peak_bytes_in_use": kv.peak_bytes_in_use,
            },
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(out)?;
    match generation.stop {
        StopReason::ContextFull => eprintln!(
            "stopped: the context of {} tokens is full (use --context to compile a longer one, up to the model's)",
            engine.capacity() + 1
        ),
        StopReason::EndOfText | StopReason::MaxTokens | StopReason::Callback => {}
    }
    if args.stats {
        eprintln!(
            "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s",
            stats.prefill_tokens,
            stats.prefill_tokens_per_second(),
            stats.decode_tokens,
            stats.decode_tokens_per_second()
        );
        eprintln!(
            "kv ({}): region {} bytes, copied {} bytes, {} rebases, {} memory handles, peak {} bytes in use",
            strategy.name(),
            kv.region_bytes,
            kv.bytes_copied,
            kv.rebases,
            kv.handles,
            kv.peak_bytes_in_use
        );
        if let Some(m) = engine.memory_report() {
            eprintln!(
                "qnn memory: {}, {} registrations, {} deregistrations, {} live handles (peak {}, cap {})",
                m.memory,
                m.registrations,
                m.deregistrations,
                m.live_handles,
                m.peak_handles,
                m.max_handles
            );
        }
    }
    Ok(())
}
