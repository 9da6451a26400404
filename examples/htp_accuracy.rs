//! How close Qualcomm's real HTP (QNN 2.51 `libQnnHtp.so`, fp16 in emulation on x86) runs a graph
//! htpkv compiled (`htpkv compile --target htp`) to the f32 model, teacher-forced: the f32 model's
//! own greedy continuation of a prompt is fed token by token (AR-1) through htpkv's KV manager and
//! the real backend, and every position's logits are compared with the f32 forward's (`model`'s
//! `FloatModel`, an independent implementation of the same description): top-1 agreement and mean
//! KL(f32 ‖ HTP). Also reports the time per execute.
//!
//! `cargo run --release --example htp_accuracy -- --compiled FILE [--tokens 256] [--update NAME]
//! [--qnn-backend PATH] [--qnn-system PATH] [--json]` (libraries default as for `htpkv generate`:
//! `$HTPKV_QNN_BACKEND`/`$HTPKV_QNN_SYSTEM`, else the ones `scripts/fetch-qnn.sh` fetched). The
//! binary must hold an AR-1 graph with a context longer than `--tokens`; stories260K (the embedded
//! model) is the model.

use anyhow::{Context, bail};
use htpkv::engine::EngineOptions;
use htpkv::qnn::QnnBackend;
use htpkv::qnn_libs;
use htpkv::qnn_memory::QnnMemory;
use htpkv::session::Session;
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    compiled: PathBuf,
    tokens: usize,
    update: String,
    backend: PathBuf,
    system: PathBuf,
    json: bool,
}

fn parse() -> anyhow::Result<Args> {
    let (mut compiled, mut tokens, mut update, mut json) = (None, 256, "smart_mask".into(), false);
    let (mut backend, mut system) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--compiled" => compiled = Some(PathBuf::from(value()?)),
            "--tokens" => tokens = value()?.parse()?,
            "--update" => update = value()?,
            "--qnn-backend" => backend = Some(PathBuf::from(value()?)),
            "--qnn-system" => system = Some(PathBuf::from(value()?)),
            "--json" => json = true,
            other => bail!("unknown argument `{other}`"),
        }
    }
    let fetch = "run scripts/fetch-qnn.sh or pass --qnn-backend/--qnn-system";
    let backend = qnn_libs::backend_library(backend.as_deref()).context(fetch)?;
    let system = qnn_libs::system_library(system.as_deref(), &backend).context(fetch)?;
    Ok(Args {
        compiled: compiled.context("--compiled FILE is required")?,
        tokens,
        update,
        backend,
        system,
        json,
    })
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - z).collect()
}

/// KL(p ‖ q) of two logit rows.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn argmax(x: &[f32]) -> usize {
    model::ops::argmax(x)
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let files = model::llama2c::ModelFiles::discover(None)?;
    let ckpt = std::sync::Arc::new(model::llama2c::Checkpoint::load(&files.checkpoint)?);
    let tokenizer = model::llama2c::Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size)?;
    let prompt = tokenizer.encode("Once upon a time", true, false);
    let config = model::llama2c::llama_config(&ckpt.config);
    let mut f = model::FloatModel::new(config.clone(), ckpt, config.context_length)?;
    let (mut float_logits, mut tokens) = (Vec::new(), prompt.clone());
    for pos in 0..a.tokens {
        let l = f.forward(tokens[pos], pos)?.to_vec();
        if pos + 1 >= tokens.len() {
            tokens.push(argmax(&l) as u32);
        }
        float_logits.push(l);
    }
    let memory = QnnMemory::Client;
    let qnn = QnnBackend::open(&a.backend, Some(&a.system), &a.compiled, memory, 4096)?;
    let allocator = qnn.region_allocator();
    let strategy = EngineOptions::parse_strategy(&a.update)?;
    let mut session = Session::new(qnn, strategy, allocator.as_ref())?;
    let (mut agree, mut kl_sum, mut max_kl) = (0usize, 0.0f64, 0.0f64);
    let started = Instant::now();
    for (pos, reference) in float_logits.iter().enumerate() {
        let htp = session.decode(tokens[pos])?;
        agree += usize::from(argmax(htp) == argmax(reference));
        let d = kl(reference, htp);
        kl_sum += d;
        max_kl = max_kl.max(d);
    }
    let per_step = started.elapsed().as_secs_f64() / a.tokens as f64;
    let n = a.tokens as f64;
    let doc = serde_json::json!({
        "model": files.checkpoint,
        "compiled": a.compiled,
        "backend": a.backend,
        "tokens": a.tokens,
        "update": a.update,
        "top1_agreement": agree as f64 / n,
        "mean_kl": kl_sum / n,
        "max_kl": max_kl,
        "seconds_per_step": per_step,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{} positions teacher-forced on {}: top-1 agreement {:.2}% with the f32 model, mean KL {:.3e} (max {:.3e}), {:.1} ms per AR-1 execute",
            a.tokens,
            a.backend.display(),
            100.0 * agree as f64 / n,
            kl_sum / n,
            max_kl,
            per_step * 1e3
        );
    }
    Ok(())
}
