//! How close Qualcomm's real HTP (QNN 2.51 `libQnnHtp.so`, fp16 in emulation on x86) runs a graph
//! htpkv compiled (`htpkv compile --target htp`) to the f32 model, teacher-forced: the f32 model's
//! own greedy continuation of a prompt is fed token by token (AR-1) through htpkv's KV manager and
//! the real backend, and every position's logits are compared with the f32 forward's (`model`'s
//! `FloatModel`, an independent implementation of the same description): top-1 agreement and mean
//! KL(f32 ‖ HTP). Also reports the time per execute. With `--reference WEIGHTS,KV` (e.g. `i8,u8`)
//! the reference executor, compiled with those weights and K/V type at `--context` (512) with
//! htpkv's calibration, is scored on the same tokens in the same run (`"reference"` in the JSON).
//!
//! `cargo run --release --example htp_accuracy -- --compiled FILE [--tokens 256] [--update NAME]
//! [--reference WEIGHTS,KV] [--context 512] [--qnn-backend PATH] [--qnn-system PATH] [--json]`
//! (libraries default as for `htpkv generate`:
//! `$HTPKV_QNN_BACKEND`/`$HTPKV_QNN_SYSTEM`, else the ones `scripts/fetch-qnn.sh` fetched). The
//! binary must hold an AR-1 graph with a context longer than `--tokens`; stories260K (the embedded
//! model) is the model.

use anyhow::{Context, bail};
use htpkv::backend::Backend;
use htpkv::engine::EngineOptions;
use htpkv::qnn::QnnBackend;
use htpkv::qnn_libs;
use htpkv::qnn_memory::QnnMemory;
use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::HostAllocator;
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    compiled: PathBuf,
    tokens: usize,
    update: String,
    backend: PathBuf,
    system: PathBuf,
    json: bool,
    reference: Option<(String, String)>,
    context: usize,
}

fn parse() -> anyhow::Result<Args> {
    let (mut compiled, mut tokens, mut update, mut json) = (None, 256, "smart_mask".into(), false);
    let (mut backend, mut system) = (None, None);
    let (mut reference, mut context) = (None, 512);
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
            "--context" => context = value()?.parse()?,
            "--reference" => {
                let v = value()?;
                let (w, kv) = v
                    .split_once(',')
                    .context("--reference WEIGHTS,KV (e.g. i8,u8)")?;
                reference = Some((w.to_string(), kv.to_string()));
            }
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
        reference,
        context,
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

/// How close a runtime's logits are to the f32 model's, teacher-forced.
struct Score {
    top1: f64,
    mean_kl: f64,
    max_kl: f64,
    seconds_per_step: f64,
}

/// Feeds `tokens` (AR-1) through `session` and compares each position's logits with `float`'s.
fn score<B: Backend>(
    mut session: Session<B>,
    tokens: &[u32],
    float: &[Vec<f32>],
) -> anyhow::Result<Score> {
    let (mut agree, mut kl_sum, mut max_kl) = (0usize, 0.0f64, 0.0f64);
    let started = Instant::now();
    for (pos, reference) in float.iter().enumerate() {
        let got = session.decode(tokens[pos])?;
        agree += usize::from(argmax(got) == argmax(reference));
        let d = kl(reference, got);
        kl_sum += d;
        max_kl = max_kl.max(d);
    }
    let n = float.len() as f64;
    Ok(Score {
        top1: agree as f64 / n,
        mean_kl: kl_sum / n,
        max_kl,
        seconds_per_step: started.elapsed().as_secs_f64() / n,
    })
}

/// The reference executor compiled with `weights` and `kv` at `context`, calibrated as `compile`
/// does.
fn reference(
    ckpt: &std::sync::Arc<llama2c::Checkpoint>,
    tokenizer: &llama2c::Tokenizer,
    weights: &str,
    kv: &str,
    context: usize,
) -> anyhow::Result<std::sync::Arc<ref_backend::CompiledModel>> {
    let options = EngineOptions {
        kv_dtype: kv.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        weights: weights.to_string(),
        context: Some(context),
        ar: vec![1],
        ..Default::default()
    };
    let config = llama2c::llama_config(&ckpt.config);
    let opts = htpkv::engine::compile_options(&options, &config)?;
    let calibration =
        htpkv::engine::calibration_sequences(tokenizer, &htpkv::text::ChatFormat::new(None))?;
    let compiled = ref_backend::compile(
        &config,
        &**ckpt,
        &calibration,
        &opts,
        ckpt.sha256(),
        &mut |_| {},
    )?;
    Ok(std::sync::Arc::new(compiled))
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let files = llama2c::ModelFiles::discover(None)?;
    let ckpt = std::sync::Arc::new(llama2c::Checkpoint::load(&files.checkpoint)?);
    let tokenizer = llama2c::Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size)?;
    let prompt = tokenizer.encode("Once upon a time", true, false);
    let config = llama2c::llama_config(&ckpt.config);
    let mut f = model::FloatModel::new(config.clone(), ckpt.clone(), config.context_length)?;
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
    let session = Session::new(qnn, strategy, allocator.as_ref())?;
    let htp = score(session, &tokens, &float_logits)?;
    let mut doc = serde_json::json!({
        "model": files.checkpoint,
        "compiled": a.compiled,
        "backend": a.backend,
        "tokens": a.tokens,
        "update": a.update,
        "top1_agreement": htp.top1,
        "mean_kl": htp.mean_kl,
        "max_kl": htp.max_kl,
        "seconds_per_step": htp.seconds_per_step,
    });
    if let Some((weights, kv)) = &a.reference {
        let compiled = reference(&ckpt, &tokenizer, weights, kv, a.context)?;
        let session = Session::new(
            ReferenceBackend::new(compiled),
            strategy,
            &HostAllocator::default(),
        )?;
        let r = score(session, &tokens, &float_logits)?;
        doc["reference"] = serde_json::json!({
            "weights": weights, "kv": kv, "context": a.context,
            "top1_agreement": r.top1, "mean_kl": r.mean_kl, "max_kl": r.max_kl,
        });
        if !a.json {
            println!(
                "reference executor ({weights} weights, {kv} K/V): top-1 {:.2}%, mean KL {:.3e} (max {:.3e})",
                100.0 * r.top1,
                r.mean_kl,
                r.max_kl
            );
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{} positions teacher-forced on {}: top-1 agreement {:.2}% with the f32 model, mean KL {:.3e} (max {:.3e}), {:.1} ms per AR-1 execute",
            a.tokens,
            a.backend.display(),
            100.0 * htp.top1,
            htp.mean_kl,
            htp.max_kl,
            htp.seconds_per_step * 1e3
        );
    }
    Ok(())
}
