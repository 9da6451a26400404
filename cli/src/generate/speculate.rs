//! `--speculate` of `generate` and `chat`: speculative decoding with a speculator
//! (`htpkv::speculate`), its AR variant and its counters in `--stats` and `--json`.

use super::GenerateArgs;
use anyhow::Context;
use htpkv::engine::{Engine, OpenedModel};
use htpkv::speculate::{SpecKind, SpecStats};
use std::path::Path;

/// The speculator asked for, parsed before any work.
pub fn kind(args: &GenerateArgs) -> anyhow::Result<Option<SpecKind>> {
    (args.speculate.as_deref())
        .map(SpecKind::parse)
        .transpose()
        .map_err(anyhow::Error::from)
}

/// Sets the engine's speculation when --speculate is given (a draft model is opened with the
/// target's `options`).
pub fn attach(
    args: &GenerateArgs,
    options: &htpkv::engine::EngineOptions,
    engine: &mut Engine,
) -> anyhow::Result<()> {
    let Some(kind) = kind(args)? else {
        return Ok(());
    };
    engine
        .speculate(&kind, options)
        .with_context(|| format!("--speculate {}", args.speculate.as_deref().unwrap_or("")))?;
    Ok(())
}

/// The `--stats` line of speculative decoding.
pub fn stats_line(engine: &Engine) -> Option<String> {
    let spec = engine.speculation()?;
    let s = spec.stats();
    let variants: Vec<String> = (s.variants.iter())
        .map(|(ar, calls, _)| format!("{calls} AR-{ar}"))
        .collect();
    let speedup = s
        .estimated_speedup()
        .map_or("n/a (no plain step to time)".into(), |x| format!("{x:.2}x"));
    Some(format!(
        "speculation ({}): {:.2} tokens per target call ({} tokens in {} calls: {} verifications, \
         {} plain AR-1 steps), {}/{} proposed tokens accepted ({:.1}%), {} rows rolled back, \
         {:.1} KV bytes copied per accepted token ({} by commits, {} by plans), speedup {} \
         (estimated against this run's AR-1 steps)",
        spec.name(),
        s.tokens_per_call(),
        s.tokens,
        s.calls,
        variants.join(" + "),
        s.plain_calls,
        s.accepted,
        s.proposed,
        100.0 * s.acceptance_rate(),
        s.rolled_back_rows,
        s.bytes_copied_per_token(),
        s.commit_bytes_copied,
        s.plan_bytes_copied,
        speedup
    ))
}

/// The `--json` object of speculative decoding (`null` without it).
pub fn json(engine: &Engine) -> serde_json::Value {
    match engine.speculation() {
        Some(spec) => stats_json(&spec.name(), spec.stats()),
        None => serde_json::Value::Null,
    }
}

/// The counters as JSON.
pub fn stats_json(name: &str, s: &SpecStats) -> serde_json::Value {
    serde_json::json!({
        "speculator": name,
        "tokens_per_call": s.tokens_per_call(),
        "calls": s.calls,
        "verify_calls": s.verify_calls,
        "plain_calls": s.plain_calls,
        "tokens": s.tokens,
        "proposed": s.proposed,
        "accepted": s.accepted,
        "acceptance_rate": s.acceptance_rate(),
        "rolled_back_rows": s.rolled_back_rows,
        "padded_rows": s.padded_rows,
        "bytes_copied_per_accepted_token": s.bytes_copied_per_token(),
        "commit_bytes_copied": s.commit_bytes_copied,
        "plan_bytes_copied": s.plan_bytes_copied,
        "propose_seconds": s.propose_seconds,
        "verify_seconds": s.verify_seconds,
        "plain_seconds": s.plain_seconds,
        "estimated_speedup": s.estimated_speedup(),
        "variants": s.variants.iter().map(|(ar, calls, seconds)| serde_json::json!({
            "ar": ar, "calls": calls, "seconds": seconds,
        })).collect::<Vec<_>>(),
    })
}

/// Checks --speculate against the other options, and a draft model's vocabulary against the
/// model's, before anything is compiled or printed.
pub fn check(args: &GenerateArgs) -> anyhow::Result<()> {
    let kind = kind(args)?;
    if kind.is_some() && super::foreign::wanted(&args.run) {
        anyhow::bail!(
            "--speculate runs on htpkv's own compiled models; binaries of other tools \
             (--bundle, --convention, --tokenizer, several --compiled) are not supported yet"
        );
    }
    if let Some(SpecKind::Draft { path, .. }) = &kind {
        same_vocabulary(&args.run, path)
            .with_context(|| format!("--speculate {}", args.speculate.as_deref().unwrap_or("")))?;
    }
    Ok(())
}

/// A draft proposes token ids that the model verifies: both must have the same tokens, id by id
/// (their size, and each token's bytes). Read from the two tokenizers, without compiling.
fn same_vocabulary(run: &super::RunArgs, draft: &Path) -> anyhow::Result<()> {
    let (model, tokenizer) = (run.model_dir.as_deref(), run.tokenizer.as_deref());
    let target = OpenedModel::open(model, tokenizer)?;
    let proposer = OpenedModel::open(Some(draft), None)?;
    anyhow::ensure!(
        target.vocab == proposer.vocab,
        "the draft model {} has {} tokens and the model {} has {}: a draft must share the \
         model's tokenizer",
        draft.display(),
        proposer.vocab,
        target.path.display(),
        target.vocab
    );
    let ids = u32::try_from(target.vocab).context("the vocabulary is too large")?;
    if let Some(id) =
        (0..ids).find(|&t| target.codec.token_bytes(t) != proposer.codec.token_bytes(t))
    {
        anyhow::bail!(
            "token {id} is {:?} in the draft model {} and {:?} in the model {}: a draft must share \
             the model's tokenizer",
            String::from_utf8_lossy(&proposer.codec.token_bytes(id)),
            draft.display(),
            String::from_utf8_lossy(&target.codec.token_bytes(id)),
            target.path.display()
        );
    }
    Ok(())
}
