//! `htpkv generate --bundle DIR` and `--compiled FILE… --convention …`: context binaries made by
//! Qualcomm's tools (or any tool) run through a QNN backend library, with a Hugging Face tokenizer,
//! no checkpoint and no weights.

use super::{Checked, GenerateArgs};
use anyhow::Context;
use htpkv::bundle::Bundle;
use htpkv::engine::BackendChoice;
use htpkv::qnn::{QnnBackend, QnnOpenOptions};
use htpkv::sampler::Sampler;
use htpkv::session::Session;
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

/// True when the options ask for binaries made by other tools.
pub(super) fn wanted(args: &GenerateArgs) -> bool {
    args.run.bundle.is_some()
        || args.run.convention.is_some()
        || args.run.tokenizer.is_some()
        || args.run.compiled.len() > 1
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

fn model_of(args: &GenerateArgs) -> anyhow::Result<Model> {
    if let Some(dir) = &args.run.bundle {
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
    if args.run.compiled.is_empty() {
        let given: Vec<&str> = [
            (args.run.tokenizer.is_some(), "--tokenizer"),
            (args.run.convention.is_some(), "--convention"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        let verb = if given.len() == 1 {
            "describes"
        } else {
            "describe"
        };
        anyhow::bail!(
            "{} {verb} context binaries made by other tools: give them with --compiled FILE… \
             (a Genie bundle, --bundle DIR, brings its own tokenizer)",
            given.join(" and ")
        );
    }
    let tokenizer = args
        .run
        .tokenizer
        .clone()
        .context("context binaries made by other tools need --tokenizer tokenizer.json")?;
    Ok(Model {
        binaries: args.run.compiled.clone(),
        tokenizer,
        rope: args.run.rope_theta.map(|theta| RopeConfig {
            theta,
            scaling: None,
            pairing: RopePairing::HalfSplit,
        }),
        bos: None,
        stops: Vec::new(),
        declared: None,
        origin: "the --compiled context binaries".into(),
        rope_dim: None,
    })
}

pub(super) fn run(args: &GenerateArgs, checked: &Checked) -> anyhow::Result<()> {
    let BackendChoice::Qnn {
        backend_lib,
        system_lib,
        memory,
        max_handles,
    } = &checked.run.engine.backend
    else {
        let m = model_of(args)?;
        let what = match &args.run.bundle {
            Some(dir) => format!("--bundle {}", dir.display()),
            None => format!("{} context binaries", m.binaries.len()),
        };
        anyhow::bail!(
            "{what} run through a QNN library: add --backend qnn --qnn-backend libQnnHtp.so (on \
             a desktop, the reference library libhtpkv_ref_qnn.so)"
        );
    };
    let m = model_of(args)?;
    let convention = args
        .run
        .convention
        .as_deref()
        .map(htpkv::convention::named_or_file)
        .transpose()?;
    // Read under the tokenizer cap (a regular file only).
    let tok = HfTokenizer::from_file(&m.tokenizer, None)?;
    let mut stops = m.stops.clone();
    let mut bos = m.bos;
    if args.run.bundle.is_none() {
        stops.extend(EOS_NAMES.iter().filter_map(|n| tok.token_to_id(n)));
        bos = BOS_NAMES.iter().find_map(|n| tok.token_to_id(n));
    }
    let paths: Vec<&Path> = m.binaries.iter().map(PathBuf::as_path).collect();
    let options = QnnOpenOptions {
        memory: *memory,
        max_handles: *max_handles,
        convention,
    };
    let qnn = QnnBackend::open_binaries(backend_lib, system_lib.as_deref(), &paths, &options)
        .with_context(|| format!("cannot open {}", m.origin))?;
    let allocator = qnn.region_allocator();
    let convention_name = qnn.convention().name.clone();
    let mut session = Session::with_contexts(qnn, checked.run.engine.strategy, allocator, m.rope)
        .map_err(htpkv::engine::EngineError::from)
        .with_context(|| format!("{} do not form one model", m.origin))?;
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
    let room = session.capacity();
    let codec = htpkv::text::HfCodec::new(tok, Vec::new());
    htpkv::session::check_text_fits(&codec, &args.prompt, room, bos.is_some())
        .map_err(htpkv::engine::EngineError::from)?;
    let tok = codec.tokenizer();
    let mut prompt: Vec<u32> = bos.into_iter().collect();
    prompt.extend(tok.encode(&args.prompt, false)?);
    if prompt.is_empty() || prompt.len() > room {
        anyhow::bail!(
            "the prompt has {} tokens; the context holds 1 to {room}",
            prompt.len()
        );
    }
    let mut sampler = Sampler::new(checked.generate.sampler)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !args.json {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    session
        .prefill(&prompt)
        .map_err(htpkv::engine::EngineError::from)?;
    let mut stream = tok.stream(true);
    let (mut tokens, mut text, mut stop) = (Vec::new(), String::new(), "MaxTokens");
    while tokens.len() < args.steps {
        let next = session.sample(&mut sampler)?;
        if stops.contains(&next) {
            stop = "EndOfText";
            break;
        }
        tokens.push(next);
        if let Some(piece) = stream.step(next)? {
            text.push_str(&piece);
            if !args.json {
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
        }
        if tokens.len() == args.steps {
            break;
        }
        if session.len() + 1 > session.capacity() {
            stop = "ContextFull";
            break;
        }
        session
            .decode(next)
            .map_err(htpkv::engine::EngineError::from)?;
    }
    let stats = session.stats();
    if args.json {
        let doc = serde_json::json!({
            "prompt": args.prompt,
            "text": text,
            "prompt_tokens": prompt.len(),
            "prompt_token_ids": prompt,
            "generated_tokens": tokens.len(),
            "tokens": tokens,
            "stop": stop,
            "convention": convention_name,
            "binaries": m.binaries.len(),
            "context": session.context(),
            "contexts": session.context_lengths(),
            "relayouts": stats.kv.relayouts,
            "rows_moved_by_relayouts": stats.kv.rows_moved_by_relayouts,
            "ar": session.cache().spec().geometry.ar_variants,
            "kv_dtype": session.cache().spec().geometry.dtype.to_string(),
            "prefill_tokens_per_second": stats.prefill_tokens_per_second(),
            "decode_tokens_per_second": stats.decode_tokens_per_second(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        writeln!(out)?;
    }
    if args.stats {
        eprintln!(
            "convention {convention_name}, {} binaries: prefill {}, decode {}",
            m.binaries.len(),
            super::rate(stats.prefill_tokens_per_second()),
            super::rate(stats.decode_tokens_per_second())
        );
    }
    Ok(())
}
