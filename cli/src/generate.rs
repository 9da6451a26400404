//! `htpkv generate`: stream a story from the model, compiled on first use.

use crate::interrupt;
use anyhow::Context;
use htpkv::engine::{Engine, EngineOptions, EngineSpec, LayerWindows};
use htpkv::sampler::{Sampler, SamplerOptions};
use htpkv::session::{GenerateOptions, StopReason};
use model::Message;
use model::fsio::check_output;
use quant::DataType;
use ref_backend::WeightType;
use std::io::Write;
use std::path::{Path, PathBuf};

mod beams;
pub mod foreign;
pub mod speculate;
pub mod structured;

/// Which model runs, and where: the options `generate`, `chat` and `eval` share.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The model: a GGUF file, a Hugging Face folder (config.json, safetensors, tokenizer.json), a
    /// llama2.c checkpoint file or a llama2.c directory; else $HTPKV_MODEL_DIR,
    /// ./models/stories260K, ../shared/models/stories260K.
    #[arg(long = "model", visible_alias = "model-dir", value_name = "PATH")]
    pub model_dir: Option<PathBuf>,
    /// A compiled model file to run instead of compiling; with --backend qnn, one or more context
    /// binaries made by any tool (the parts of a split model: repeat the option or separate the
    /// files with commas), read under --convention.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Append)]
    pub compiled: Vec<PathBuf>,
    /// Run a Genie bundle (genie_config.json, the context binaries it lists, tokenizer.json) with
    /// --backend qnn; no checkpoint or weights are needed.
    #[arg(long, value_name = "DIR", conflicts_with = "compiled")]
    pub bundle: Option<PathBuf>,
    /// IO convention of the context binaries: htpkv, aihub, executorch, or a YAML file [default:
    /// detected from the graph and tensor names].
    #[arg(long, value_name = "NAME|FILE")]
    pub convention: Option<String>,
    /// The tokenizer of a model that does not carry one: a llama2.c checkpoint's (default: the
    /// `tok{N}.bin` or `tokenizer.bin` beside it), or with --compiled the tokenizer.json of
    /// context binaries made by other tools.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// RoPE base of binaries that take cos/sin tables (with --compiled; a bundle gives its own).
    #[arg(long)]
    pub rope_theta: Option<f32>,
    /// KV cache element type: u8, u16, f16, f32 [default: u16]. With --compiled: taken from the
    /// file; given, it must match the file.
    #[arg(long)]
    pub kv_dtype: Option<String>,
    /// Weight type: i8, i4 (4-bit LPBQ, W4A16), i8f16 (i8 with V and down in f16), f16, f32 [default: i8f16, chosen by measurement]. With --compiled: taken from the file; given, it
    /// must match the file.
    #[arg(long)]
    pub weights: Option<String>,
    /// KV update strategy: shift, conveyor, smart_mask, naive, or shift with its reservation and
    /// staggering (shift-1.5x, shift-+64, shift-1.5x-staggered) (default: conveyor on the reference
    /// backend, smart_mask with --backend qnn, where sliding windows cost a memory handle per step).
    #[arg(long)]
    pub update: Option<String>,
    /// Context length S (default: the model's). With --compiled: taken from the file; given, it
    /// must match the file.
    #[arg(long)]
    pub context: Option<usize>,
    /// AR variants of the compiled graphs, e.g. 1,32 [default: 1,32]. With --compiled: taken from
    /// the file; given, they must match the file.
    #[arg(long, value_delimiter = ',')]
    pub ar: Option<Vec<usize>>,
    /// Compile no last-row prefill graphs: prefill runs graphs that return every row's logits
    /// (by default each AR-n variant above 1 also gets one returning only the last row's).
    #[arg(long, conflicts_with = "compiled")]
    pub all_row_prefill: bool,
    /// Backend: reference (in process) or qnn (a QNN backend library).
    #[arg(long, default_value = "reference")]
    pub backend: String,
    /// QNN backend library (e.g. libQnnHtp.so, or the reference backend's libhtpkv_ref_qnn.so);
    /// else $HTPKV_QNN_BACKEND, else the libQnnHtp.so of scripts/fetch-qnn.sh when fetched.
    #[arg(long)]
    pub qnn_backend: Option<PathBuf>,
    /// QNN system library; else $HTPKV_QNN_SYSTEM, else the fetched libQnnSystem.so when the backend
    /// is the fetched libQnnHtp.so, else the backend library.
    #[arg(long)]
    pub qnn_system: Option<PathBuf>,
    /// How K/V memory reaches the QNN library: auto, shared-buffer, client, host [default: auto].
    #[arg(long)]
    pub qnn_memory: Option<String>,
    /// Most QNN memory handles alive at once; least recently used ones are deregistered [default:
    /// 4096].
    #[arg(long)]
    pub qnn_max_handles: Option<usize>,
    /// Sliding attention window W on the listed layers (e.g. `0,2,4:16`; repeat for other
    /// windows) of a model without its own, applied when the model is compiled (not with
    /// --compiled: the file has its own).
    #[arg(long, value_name = "LAYERS:W", conflicts_with = "compiled",
          value_parser = |s: &str| s.parse::<LayerWindows>())]
    pub layer_window: Vec<LayerWindows>,
    /// A chat template (Jinja, as in a Hugging Face tokenizer_config.json) used instead of the
    /// model's own: for a base model without one (Gemma 3 270M), whose chat turns are refused.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

/// Arguments of `htpkv generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Text to continue (empty: a story from the beginning). It is printed first, then the
    /// generated text.
    #[arg(default_value = "")]
    pub prompt: String,
    /// Which model runs, and where.
    #[command(flatten)]
    pub run: RunArgs,
    /// Answer one chat question: the model's chat template renders it (with --system) and the
    /// answer stops at the model's stop tokens. Without a template (llama2.c models) each turn is
    /// a `<role>: <text>` line (the plain fallback).
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt")]
    chat: Option<String>,
    /// System message of --chat and `htpkv chat`.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    steps: usize,
    /// 0 = greedy (the default: reproducible); higher = more random.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold (with temperature > 0).
    #[arg(long, default_value_t = 0.9)]
    top_p: f32,
    /// Keep only the K most likely tokens (with temperature > 0; 0: all). Applied before
    /// --min-p and --top-p.
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: usize,
    /// Keep only tokens at least P times as likely as the most likely one (with temperature > 0;
    /// 0: all). Applied after --top-k, before --top-p.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty over the last --penalty-last-n tokens (1: off): a seen token's positive
    /// logit is divided by it, a negative one multiplied. Applies to greedy decoding too.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the last --penalty-last-n tokens.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    presence_penalty: f32,
    /// Subtracted from a token's logit once per time it occurs in the last --penalty-last-n tokens.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    frequency_penalty: f32,
    /// How many of the latest tokens (prompt included) the penalties look at.
    #[arg(long, value_name = "N", default_value_t = 64)]
    penalty_last_n: usize,
    /// Random seed (with temperature > 0).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Stop when the text contains STR (repeatable; matched across tokens, never printed).
    #[arg(long, value_name = "STR")]
    stop: Vec<String>,
    /// Print speed, KV counters and peak memory to stderr.
    #[arg(long)]
    pub stats: bool,
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
    /// When the context fills: stop; slide (keep the first --keep tokens, drop the oldest of the
    /// rest, re-rotate the kept K rows: the default slide, see docs/guide/sessions.md);
    /// slide-rerotate; slide-keep-positions (rows keep their positions); restart (re-prefill the
    /// kept tokens).
    #[arg(long, default_value = "stop")]
    overflow: String,
    /// Tokens kept at the start when sliding (attention sinks, system prompt).
    #[arg(long, default_value_t = 4)]
    keep: usize,
    /// Tokens dropped per slide (at least; default: a quarter of the context after the kept tokens).
    #[arg(long)]
    slide_chunk: Option<usize>,
    /// Beam search with B beams sharing the prompt's KV rows: prints the best beam (--json: every
    /// beam with its score). Without --ar, an AR-B variant is compiled so the beams step together.
    #[arg(long, value_name = "B", conflicts_with_all = ["chat", "save", "resume", "n"],
          value_parser = beam_count)]
    beams: Option<usize>,
    /// Length penalty alpha of --beams: a beam scores sum(logprob) / len^alpha.
    #[arg(long, value_name = "ALPHA", default_value_t = 1.0, requires = "beams")]
    length_penalty: f32,
    /// N independent samples sharing one prompt prefill (sample i uses seed --seed + i).
    #[arg(long, value_name = "N", conflicts_with_all = ["chat", "save", "resume"],
          value_parser = beam_count)]
    n: Option<usize>,
    /// Speculative decoding: prompt-lookup[:K] (propose the K tokens that followed the last
    /// occurrence of the text's ending; K 4 by default), lookahead[:W,N,G] (Jacobi guesses over
    /// the verification rows and an n-gram pool; 4,3,8 by default) or draft:PATH[:K] (a second
    /// model sharing the tokenizer, compiled with i8 weights and u8 K/V, proposes K tokens). Greedy output is
    /// unchanged; proposals are verified in one AR-(K+1) step (compiled when --ar is not given).
    /// See docs/guide/speculation.md.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["beams", "n"])]
    pub speculate: Option<String>,
    /// Structured output and tool calls.
    #[command(flatten)]
    pub structured: structured::StructuredArgs,
}

/// A count of beams or samples on one cache (`--beams`, `--n`): 1 to
/// [`kv_manager::beam::MAX_BEAMS`], refused by clap with the option's name otherwise.
fn beam_count(s: &str) -> Result<usize, String> {
    let max = kv_manager::beam::MAX_BEAMS;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(_) => Err(format!("must be between 1 and {max}")),
        Err(e) => Err(e.to_string()),
    }
}

/// What a run actually uses, read back from the loaded model.
#[derive(Debug, PartialEq)]
pub struct Ran {
    context: usize,
    ar: Vec<usize>,
    kv_dtype: DataType,
    /// `None` when the backend does not say (QNN).
    weights: Option<WeightType>,
}

impl Ran {
    fn of(engine: &Engine) -> Ran {
        let g = &engine.session().cache().spec().geometry;
        Ran {
            context: g.context,
            ar: g.ar_variants.clone(),
            kv_dtype: g.dtype,
            weights: engine.compiled_options().map(|o| o.weights),
        }
    }
}

/// The options of [`RunArgs`], parsed and checked before any work.
pub struct RunChecked {
    pub engine: EngineOptions,
    kv_dtype: Option<DataType>,
    weights: Option<WeightType>,
}

/// Every option, parsed and checked before any work (loading, compiling).
pub struct Checked {
    pub run: RunChecked,
    pub generate: GenerateOptions,
}

/// The options of [`RunArgs`], parsed and checked by the engine's one reader of option spellings
/// ([`EngineSpec`]); `speculate` and `beams` add their variants to the default AR.
pub fn check_run(
    run: &RunArgs,
    speculate: Option<htpkv::speculate::SpecKind>,
    beams: Option<usize>,
) -> anyhow::Result<RunChecked> {
    let spec = EngineSpec {
        model: run.model_dir.clone(),
        compiled: run.compiled.first().cloned(),
        tokenizer: run.tokenizer.clone(),
        chat_template: run.chat_template.clone(),
        backend: Some(run.backend.clone()),
        qnn_backend: run.qnn_backend.clone(),
        qnn_system: run.qnn_system.clone(),
        qnn_memory: run.qnn_memory.clone(),
        qnn_max_handles: run.qnn_max_handles,
        update: run.update.clone(),
        kv_dtype: run.kv_dtype.clone(),
        weights: run.weights.clone(),
        context: run.context,
        ar: run.ar.clone(),
        speculate,
        beams,
        layer_windows: run.layer_window.clone(),
        all_row_prefill: run.all_row_prefill,
        cache_dir: None,
    };
    Ok(RunChecked {
        engine: spec.resolve()?,
        kv_dtype: spec.kv_dtype()?,
        weights: spec.weights()?,
    })
}

fn check_args(args: &GenerateArgs) -> anyhow::Result<Checked> {
    let spec = speculate::kind(args).ok().flatten();
    let run = check_run(&args.run, spec, args.beams.or(args.n))?;
    let generate = GenerateOptions {
        max_tokens: args.steps,
        sampler: SamplerOptions {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            penalty_last_n: args.penalty_last_n,
            seed: args.seed,
        },
        stop: args.stop.clone(),
        cancel: None,
        constraint: None,
    };
    Sampler::new(generate.sampler)?;
    generate.check()?;
    Ok(Checked { run, generate })
}

/// With --compiled, the file decides; an option given explicitly must agree with it.
fn check_against_file(run: &RunArgs, checked: &RunChecked, ran: &Ran) -> anyhow::Result<()> {
    let (kv_dtype, weights) = (checked.kv_dtype, checked.weights);
    let Some(file) = run.compiled.first() else {
        return Ok(());
    };
    let file = file.display();
    let mut conflicts = Vec::new();
    if let Some(s) = run.context.filter(|&s| s != ran.context) {
        conflicts.push(format!(
            "--context {s}, but the file's context is {}",
            ran.context
        ));
    }
    if let Some(ar) = run.ar.as_ref().filter(|&ar| *ar != ran.ar) {
        conflicts.push(format!(
            "--ar {}, but the file's AR variants are {}",
            join(ar),
            join(&ran.ar)
        ));
    }
    if let Some(kv) = kv_dtype.filter(|&kv| kv != ran.kv_dtype) {
        conflicts.push(format!(
            "--kv-dtype {kv}, but the file's KV dtype is {}",
            ran.kv_dtype
        ));
    }
    if let Some(w) = weights {
        match ran.weights {
            Some(f) if f != w => conflicts.push(format!(
                "--weights {}, but the file's weights are {}",
                w.name(),
                f.name()
            )),
            Some(_) => {}
            None => conflicts.push(format!(
                "--weights {}, but the {} backend does not tell the file's weight type",
                w.name(),
                run.backend
            )),
        }
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "--compiled {file} contradicts the options given: {}; drop these options (the file decides) or compile a new file",
        conflicts.join("; ")
    )
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// Opens the engine the arguments ask for (compile progress as bars on a terminal) and checks it
/// against them.
pub fn open_engine(args: &GenerateArgs) -> anyhow::Result<(Engine, Checked, Ran)> {
    let checked = check_args(args)?;
    let (mut engine, ran) = open_run(&args.run, &checked.run, args.json)?;
    crate::saturation::count_in(engine.session_mut());
    Ok((engine, checked, ran))
}

/// Opens the engine of checked [`RunArgs`] (progress lines unless `quiet`, compile progress as
/// bars on a terminal) and checks a `--compiled` file against the options given.
pub fn open_run(run: &RunArgs, checked: &RunChecked, quiet: bool) -> anyhow::Result<(Engine, Ran)> {
    let mut bars = crate::progress::StageBars::default();
    let engine = Engine::open_with(
        &checked.engine,
        &mut |line| {
            if !quiet {
                eprintln!("{line}");
            }
        },
        &mut |p| bars.update(p),
    );
    bars.finish();
    let engine = engine?;
    let ran = Ran::of(&engine);
    check_against_file(run, checked, &ran)?;
    Ok((engine, ran))
}

use htpkv::engine::peak_memory_bytes;

/// [`peak_memory_bytes`] for people: MiB, or `n/a`.
pub fn peak_memory_text() -> String {
    peak_memory_bytes().map_or("n/a".into(), |b| {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

/// Sets the session's policy for a full context from `--overflow`, `--keep` and `--slide-chunk`
/// (`generate` and `chat`).
pub fn set_overflow(args: &GenerateArgs, engine: &mut Engine) -> anyhow::Result<()> {
    let chunk = args
        .slide_chunk
        .unwrap_or_else(|| (engine.capacity().saturating_sub(args.keep) / 4).max(1));
    htpkv::session::Overflow::parse(&args.overflow, args.keep, chunk)
        .and_then(|o| engine.session_mut().set_overflow(o))
        .map_err(htpkv::engine::EngineError::from)
        .context("--overflow")
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    speculate::check(&args)?;
    structured::check(&args, false)?;
    if foreign::wanted(&args.run) {
        return foreign::run(&args, &check_args(&args)?);
    }
    if args.system.is_some() && args.chat.is_none() {
        anyhow::bail!("--system needs --chat (or `htpkv chat`)");
    }
    if let Some(path) = &args.save {
        // Refused before any work: a device, FIFO, symlink, directory or a named input.
        let named = [&args.run.model_dir, &args.run.tokenizer, &args.run.bundle];
        let inputs: Vec<&Path> = (named.into_iter().flatten())
            .chain(&args.run.compiled)
            .map(PathBuf::as_path)
            .collect();
        check_output(path, &inputs).context("--save")?;
    }
    let (mut engine, checked, ran) = open_engine(&args)?;
    if let Some(path) = &args.resume {
        engine.session_mut().restore(path).context("--resume")?;
    }
    set_overflow(&args, &mut engine)?;
    speculate::attach(&args, &checked.run.engine, &mut engine)?;
    if beams::wanted(&args) {
        return beams::run(&args, &checked, &mut engine);
    }
    let strategy = checked.run.engine.strategy;
    let plan = structured::Plan::new(&args, &mut engine)?;
    let mut generate = GenerateOptions {
        cancel: Some(interrupt::cancel_on_ctrl_c()),
        ..checked.generate
    };
    plan.constrain(&mut generate);
    let generating = interrupt::Generating::start();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_failed = None;
    let mut on_piece = |piece: &str| args.json || stream(&mut out, piece, &mut write_failed);
    let generation = match &args.chat {
        Some(question) => {
            let mut messages = Vec::new();
            messages.extend(args.system.as_deref().map(|s| Message::new("system", s)));
            messages.push(Message::new("user", question));
            engine.chat(&plan.messages(messages), &generate, &mut on_piece)?
        }
        None => {
            // A prompt that cannot fit is refused before it is printed.
            engine
                .session()
                .encode_fitting(engine.tokenizer(), &args.prompt)
                .map_err(htpkv::engine::EngineError::from)?;
            // Like llama2.c, the story starts with the prompt itself.
            if !args.json && !args.prompt.is_empty() {
                on_piece(&args.prompt);
            }
            engine.generate(&args.prompt, &generate, &mut on_piece)?
        }
    };
    drop(generating);
    finish(
        &args,
        (&mut engine, &plan),
        strategy,
        &ran,
        generation,
        write_failed,
        out,
    )
}

/// Writes one streamed piece; on failure records the error and asks generation to stop.
pub fn stream(out: &mut impl Write, piece: &str, failed: &mut Option<std::io::Error>) -> bool {
    match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => true,
        Err(e) => {
            *failed = Some(e);
            false
        }
    }
}

/// A generation's `--json` document: the fields every run has (prompt, text, tokens, stop and
/// finish reason), then `extra` (what the run says about itself).
pub fn generation_json(
    prompt: &str,
    g: &htpkv::session::Generation,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut doc = serde_json::json!({
        "prompt": prompt,
        "text": g.text,
        "prompt_tokens": g.prompt_tokens.len(),
        "prompt_token_ids": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "tokens": g.tokens,
        "stop": format!("{:?}", g.stop),
        "finish_reason": g.stop.finish_reason(),
    });
    if let (Some(d), serde_json::Value::Object(e)) = (doc.as_object_mut(), extra) {
        d.extend(e);
    }
    doc
}

/// Saves the session when asked, then prints the JSON document or the stats.
fn finish(
    args: &GenerateArgs,
    (engine, plan): (&mut Engine, &structured::Plan),
    strategy: kv_manager::Strategy,
    ran: &Ran,
    generation: htpkv::session::Generation,
    write_failed: Option<std::io::Error>,
    mut out: impl Write,
) -> anyhow::Result<()> {
    if let Some(path) = &args.save {
        engine.session_mut().feed_last(&generation)?;
        // The model's files and the compiled file; `--resume` may name the same file (it was
        // read whole before).
        engine.save(path).context("--save")?;
    }
    if let Some(e) = write_failed {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        return Err(e).context("writing to stdout");
    }
    if let Some(w) = crate::saturation::warning(engine.session().cache()) {
        eprintln!("{w}");
    }
    let stats = engine.stats();
    let kv = stats.kv;
    if args.json {
        let prompt = args.chat.as_deref().unwrap_or(&args.prompt);
        let mut doc = generation_json(
            prompt,
            &generation,
            serde_json::json!({
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
                "kv_dtype": ran.kv_dtype.to_string(),
                "weights": ran.weights.map(WeightType::name),
                "context": ran.context,
                "ar": ran.ar,
                "peak_memory_bytes": peak_memory_bytes(),
                "weight_bytes": engine.weight_bytes(),
                "scratch_bytes": engine.scratch_bytes(),
                "prefill_tokens_per_second": stats.prefill_tokens_per_second(),
                "decode_tokens_per_second": stats.decode_tokens_per_second(),
                "overflow": args.overflow,
                "slides": engine.session().slides().iter().map(slide_json).collect::<Vec<_>>(),
                "reused_tokens": stats.reused_tokens,
                "speculation": speculate::json(engine),
                "kv_saturation": crate::saturation::json(engine.session().cache()),
                "kv": {
                    "region_bytes": kv.region_bytes,
                    "bytes_copied": kv.bytes_copied,
                    "rebases": kv.rebases,
                    "handles": kv.handles,
                    "peak_bytes_in_use": kv.peak_bytes_in_use,
                },
            }),
        );
        plan.json(&generation.text, &mut doc);
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(out)?;
    plan.print_calls(&generation.text, &mut out)?;
    match generation.stop {
        StopReason::ContextFull => eprintln!(
            "stopped: the context of {} tokens is full (use --context to compile a longer one, up to the model's, or --overflow slide to go on)",
            engine.capacity() + 1
        ),
        StopReason::Cancelled => eprintln!("stopped: cancelled"),
        StopReason::EndOfText
        | StopReason::StopString
        | StopReason::MaxTokens
        | StopReason::Callback => {}
    }
    if args.stats {
        print_stats(engine, strategy);
        plan.stats_line().into_iter().for_each(|l| eprintln!("{l}"));
    }
    Ok(())
}

/// A speed for people: `12.3 tok/s`, or `4.56 s/token` below one token per second (an emulated
/// HTP step of a real model takes seconds).
pub fn rate(tokens_per_second: f64) -> String {
    if tokens_per_second >= 1.0 || tokens_per_second <= 0.0 {
        format!("{tokens_per_second:.1} tok/s")
    } else {
        format!("{:.2} s/token", 1.0 / tokens_per_second)
    }
}

/// The `--stats` lines on stderr.
pub fn print_stats(engine: &Engine, strategy: kv_manager::Strategy) {
    let stats = engine.stats();
    let kv = stats.kv;
    {
        eprintln!(
            "prefill: {} tokens, {} | decode: {} tokens, {}",
            stats.prefill_tokens,
            rate(stats.prefill_tokens_per_second()),
            stats.decode_tokens,
            rate(stats.decode_tokens_per_second())
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
        for e in engine.session().slides() {
            eprintln!("{}", slide_line(e));
        }
        if let Some(line) = speculate::stats_line(engine) {
            eprintln!("{line}");
        }
        if let Some(line) = crate::saturation::stats_line(engine.session().cache()) {
            eprintln!("{line}");
        }
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
        eprintln!(
            "{}",
            peak_memory_line(
                engine.weight_bytes(),
                kv.region_bytes,
                engine.scratch_bytes()
            )
        );
    }
}

/// `peak memory: …` for `--stats`, with what it is made of: the weights (reference executor;
/// the compiled file's bytes, which its i8 matrices read in place, plus scales and norms), the
/// K/V region, the executor's scratch (every graph's intermediate activations), and the rest:
/// graph inputs and outputs, the tokenizer, the program itself, and while a model is compiled
/// on first use, the model it is compiled from.
fn peak_memory_line(weights: Option<u64>, kv_region: usize, scratch: Option<u64>) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let peak = peak_memory_bytes();
    let mut line = format!("peak memory: {}", peak_memory_text());
    if let (Some(peak), Some(w), Some(scratch)) = (peak, weights, scratch) {
        let kv_region = kv_region as u64;
        let rest = peak.saturating_sub(w + kv_region + scratch);
        line += &format!(
            " = weights {:.1} MiB + K/V region {:.1} MiB + scratch {:.1} MiB + {:.1} MiB of the rest (graph IO, tokenizer, code; the source model while compiling)",
            w as f64 / MIB,
            kv_region as f64 / MIB,
            scratch as f64 / MIB,
            rest as f64 / MIB
        );
    }
    line
}

/// One slide for `--stats`.
fn slide_line(e: &htpkv::session::SlideEvent) -> String {
    let mut line = format!(
        "slide at {} tokens: dropped {}, moved {} rows ({} bytes)",
        e.len_before, e.dropped, e.rows_moved, e.bytes_copied
    );
    if e.reprefilled > 0 {
        line += &format!(", re-prefilled {} tokens", e.reprefilled);
    }
    if let Some(r) = e.requant {
        line += &format!(
            ", re-rotated {} K values (requantization error max {:.2e}, rms {:.2e}, {} clamped)",
            r.elements,
            r.max_abs,
            r.rms(),
            r.clamped
        );
    }
    line + &format!(", {:.3} ms", e.seconds * 1e3)
}

/// One slide for `--json`.
fn slide_json(e: &htpkv::session::SlideEvent) -> serde_json::Value {
    serde_json::json!({
        "len_before": e.len_before,
        "dropped": e.dropped,
        "rows_moved": e.rows_moved,
        "bytes_copied": e.bytes_copied,
        "reprefilled": e.reprefilled,
        "seconds": e.seconds,
        "requant": e.requant.map(|r| serde_json::json!({
            "elements": r.elements,
            "clamped": r.clamped,
            "max_abs": r.max_abs,
            "rms": r.rms(),
        })),
    })
}
