//! Decode speed of the runtime on stories260K, in one run:
//! - `kv_cache`: 256 greedy tokens with the KV cache (one AR-1 step per token);
//! - `no_cache`: the same 256 tokens recomputing the whole sequence every step (reset, then prefill
//!   every token so far through the AR-32 and AR-1 graphs) — the classic KV cache speedup;
//! - `float_reference`: llama2c's plain f32 implementation with its own cache.
//!
//! `cargo run --release --example decode_bench -- [--json] [--tokens N] [--kv-dtype T] [--weights T]`

use anyhow::{Context, bail};
use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::{HostAllocator, Strategy};
use llama2c::{Checkpoint, FloatModel, ModelFiles, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let (mut json, mut tokens, mut kv, mut weights) =
        (false, 256usize, "u16".to_string(), "i8".to_string());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--tokens" => tokens = args.next().context("--tokens N")?.parse()?,
            "--kv-dtype" => kv = args.next().context("--kv-dtype T")?,
            "--weights" => weights = args.next().context("--weights T")?,
            other => bail!("unknown argument `{other}`"),
        }
    }
    let files = ModelFiles::discover(None)?;
    let ckpt = Arc::new(Checkpoint::load(&files.checkpoint)?);
    let tok = Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size)?;
    let options = htpkv::engine::EngineOptions {
        kv_dtype: kv.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        weights: weights.clone(),
        ..Default::default()
    };
    let opts = htpkv::engine::compile_options(&options, &ckpt)?;
    let calibration = htpkv::engine::calibration_sequences(&tok);
    let config = llama2c::llama_config(&ckpt.config);
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
        let next = llama2c::argmax(logits) as u32;
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
    let doc = serde_json::json!({
        "model": "stories260K",
        "tokens": tokens,
        "kv_dtype": kv,
        "weights": weights,
        "kv_cache_tokens_per_second": rate(cached_s),
        "no_cache_tokens_per_second": rate(uncached_s),
        "float_reference_tokens_per_second": rate(float_s),
        "kv_cache_speedup": uncached_s / cached_s,
        "ratio_to_float_reference": float_s / cached_s,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{tokens} tokens, KV {kv}, weights {weights}");
        println!("  with KV cache:      {:>10.1} tok/s", rate(cached_s));
        println!(
            "  recompute (no cache): {:>8.1} tok/s  (KV cache speedup {:.1}x)",
            rate(uncached_s),
            uncached_s / cached_s
        );
        println!(
            "  float reference:    {:>10.1} tok/s  (runtime at {:.2}x of it)",
            rate(float_s),
            float_s / cached_s
        );
    }
    Ok(())
}
