//! `htpkv generate --bundle DIR` and `--compiled FILE… --convention …`: context binaries made by
//! Qualcomm's tools (or any tool) run through a QNN backend library, with a Hugging Face tokenizer,
//! no checkpoint and no weights.

use super::{Checked, GenerateArgs, RunArgs};
use crate::interrupt;
use anyhow::Context;
use htpkv::backend::Backend;
use htpkv::bundle::Bundle;
use htpkv::engine::{BackendChoice, EngineOptions};
use htpkv::qnn::{QnnBackend, QnnOpenOptions};
use htpkv::session::{GenerateOptions, Session};
use htpkv::text::HfCodec;
use model::{HfTokenizer, RopeConfig, RopePairing};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Beginning-of-text tokens looked up in a tokenizer when no bundle names its BOS (`--compiled`).
const BOS_NAMES: [&str; 2] = ["<s>", "<|begin_of_text|>"];

/// End-of-text tokens looked up in a tokenizer when no bundle names its EOS (`--compiled`).
const EOS_NAMES: [&str; 5] = [
    "</s>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|im_end|>",
];

/// True when the options ask for binaries made by other tools (`--tokenizer` without
/// `--compiled` is a llama2.c model's tokenizer, for the engine).
pub fn wanted(run: &RunArgs) -> bool {
    run.bundle.is_some()
        || run.convention.is_some()
        || (run.tokenizer.is_some() && !run.compiled.is_empty())
        || run.compiled.len() > 1
}

/// What a run needs besides the QNN libraries.
struct Model {
    binaries: Vec<PathBuf>,
    tokenizer: PathBuf,
    rope: Option<RopeConfig>,
    bos: Option<u32>,
    stops: Vec<u32>,
    /// Context length and vocabulary the bundle declares, checked against the graphs.
    declared: Option<(usize, usize)>,
    /// Where the binaries were named, for messages about them as a set.
    origin: String,
    /// The bundle's `genie_config.json` and its `rope-dim`, checked against the heads' width.
    rope_dim: Option<(PathBuf, usize)>,
}

fn model_of(run: &RunArgs) -> anyhow::Result<Model> {
    if let Some(dir) = &run.bundle {
        let b = Bundle::open(dir)?;
        let origin = format!(
            "the context binaries listed in `dialog.engine.model.binary.ctx-bins` of {}",
            b.config_path().display()
        );
        return Ok(Model {
            origin,
            binaries: b.ctx_bins,
            tokenizer: b.tokenizer,
            rope: b.rope,
            bos: b.bos,
            stops: b.eos,
            declared: Some((b.context, b.vocab)),
            rope_dim: b.rope_dim.map(|d| (dir.join("genie_config.json"), d)),
        });
    }
    if run.compiled.is_empty() {
        anyhow::bail!(
            "--convention describes context binaries made by other tools: give them with \
             --compiled FILE… (a Genie bundle, --bundle DIR, brings its own tokenizer)"
        );
    }
    let tokenizer = run
        .tokenizer
        .clone()
        .context("context binaries made by other tools need --tokenizer tokenizer.json")?;
    Ok(Model {
        binaries: run.compiled.clone(),
        tokenizer,
        rope: run.rope_theta.map(|theta| RopeConfig {
            theta,
            scaling: None,
            pairing: RopePairing::HalfSplit,
            ..RopeConfig::default()
        }),
        bos: None,
        stops: Vec::new(),
        declared: None,
        origin: "the --compiled context binaries".into(),
        rope_dim: None,
    })
}

/// Context binaries made by other tools, opened on a QNN library as one session, with their
/// tokenizer (the model's BOS and stop tokens set).
pub struct Foreign {
    pub session: Session<Box<dyn Backend>>,
    pub codec: HfCodec,
    convention: String,
    binaries: usize,
}

/// Opens `--bundle DIR` or `--compiled FILE… [--convention …] --tokenizer …` on the QNN library
/// of `engine` (refused for another backend, naming what to add).
pub fn open(run: &RunArgs, engine: &EngineOptions) -> anyhow::Result<Foreign> {
    let m = model_of(run)?;
    let BackendChoice::Qnn {
        backend_lib,
        system_lib,
        memory,
        max_handles,
    } = &engine.backend
    else {
        let what = match &run.bundle {
            Some(dir) => format!("--bundle {}", dir.display()),
            None => format!("{} context binaries", m.binaries.len()),
        };
        anyhow::bail!(
            "{what} run through a QNN library: add --backend qnn --qnn-backend libQnnHtp.so (on \
             a desktop, the reference library libhtpkv_ref_qnn.so)"
        );
    };
    let convention = (run.convention.as_deref())
        .map(htpkv::convention::named_or_file)
        .transpose()?;
    let codec = codec_of(run, &m)?;
    let paths: Vec<&Path> = m.binaries.iter().map(PathBuf::as_path).collect();
    let options = QnnOpenOptions {
        memory: *memory,
        max_handles: *max_handles,
        convention,
    };
    let qnn = QnnBackend::open_binaries(backend_lib, system_lib.as_deref(), &paths, &options)
        .with_context(|| format!("cannot open {}", m.origin))?;
    let allocator = qnn.region_allocator();
    let convention = qnn.convention().name.clone();
    let backend: Box<dyn Backend> = Box::new(qnn);
    let mut session = Session::with_contexts(backend, engine.strategy, allocator, m.rope.clone())
        .map_err(htpkv::engine::EngineError::from)
        .with_context(|| format!("{} do not form one model", m.origin))?;
    check_declared(&m, &session)?;
    crate::saturation::count_in(&mut session);
    Ok(Foreign {
        session,
        codec,
        convention,
        binaries: m.binaries.len(),
    })
}

/// The tokenizer with the model's BOS (the bundle's, else looked up by name) and stop tokens.
fn codec_of(run: &RunArgs, m: &Model) -> anyhow::Result<HfCodec> {
    // Read under the tokenizer cap (a regular file only).
    let tok = HfTokenizer::from_file(&m.tokenizer, None)?;
    let mut stops = m.stops.clone();
    let mut bos = m.bos;
    if run.bundle.is_none() {
        stops.extend(EOS_NAMES.iter().filter_map(|n| tok.token_to_id(n)));
        bos = BOS_NAMES.iter().find_map(|n| tok.token_to_id(n));
    }
    Ok(HfCodec::new(tok.with_bos(bos), stops))
}

/// The bundle's rope-dim, context and vocabulary against the graphs.
fn check_declared(m: &Model, session: &Session<Box<dyn Backend>>) -> anyhow::Result<()> {
    if let Some((config, rope_dim)) = &m.rope_dim {
        // rope-dim is the width of the cos/sin tables: half the rotated dimensions of a head.
        let head_dim = session.cache().spec().geometry.head_dim;
        model::full_rope_only(2 * rope_dim, head_dim).map_err(|why| {
            anyhow::anyhow!(
                "{}: dialog.engine.model.positional-encoding.rope-dim = {rope_dim} (the cos/sin \
                 table width, half the rotated dimensions): {why}",
                config.display()
            )
        })?;
    }
    let largest = *session.context_lengths().last().expect("a context");
    if let Some((context, vocab)) = m.declared
        && (largest != context || session.vocab_size() != vocab)
    {
        anyhow::bail!(
            "{} have context {largest} and {} logits, but it declares context {context} and \
             {vocab} tokens",
            m.origin,
            session.vocab_size()
        );
    }
    Ok(())
}

pub(super) fn run(args: &GenerateArgs, checked: &Checked) -> anyhow::Result<()> {
    let Foreign {
        mut session,
        codec,
        convention,
        binaries,
    } = open(&args.run, &checked.run.engine)?;
    // A prompt that cannot fit is refused before it is printed.
    session
        .encode_fitting(&codec, &args.prompt)
        .map_err(htpkv::engine::EngineError::from)?;
    let options = GenerateOptions {
        cancel: Some(interrupt::cancel_on_ctrl_c()),
        ..checked.generate.clone()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failed = None;
    if !args.json {
        super::stream(&mut out, &args.prompt, &mut failed);
    }
    let generating = interrupt::Generating::start();
    let generation = session
        .generate(&codec, &args.prompt, &options, &mut |piece| {
            args.json || super::stream(&mut out, piece, &mut failed)
        })
        .map_err(htpkv::engine::EngineError::from)?;
    drop(generating);
    if let Some(e) = failed.filter(|e| e.kind() != std::io::ErrorKind::BrokenPipe) {
        return Err(e).context("writing to stdout");
    }
    let stats = session.stats();
    if args.json {
        let doc = super::generation_json(
            &args.prompt,
            &generation,
            serde_json::json!({
                "convention": convention,
                "binaries": binaries,
                "context": session.context(),
                "contexts": session.context_lengths(),
                "relayouts": stats.kv.relayouts,
                "rows_moved_by_relayouts": stats.kv.rows_moved_by_relayouts,
                "ar": session.cache().spec().geometry.ar_variants,
                "kv_dtype": session.cache().spec().geometry.dtype.to_string(),
                "prefill_tokens_per_second": stats.prefill_tokens_per_second(),
                "decode_tokens_per_second": stats.decode_tokens_per_second(),
                "kv_saturation": crate::saturation::json(session.cache()),
            }),
        );
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        writeln!(out)?;
    }
    if let Some(w) = crate::saturation::warning(session.cache()) {
        eprintln!("{w}");
    }
    if args.stats {
        eprintln!(
            "convention {convention}, {binaries} binaries: prefill {}, decode {}",
            super::rate(stats.prefill_tokens_per_second()),
            super::rate(stats.decode_tokens_per_second())
        );
    }
    Ok(())
}
