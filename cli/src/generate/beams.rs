//! `htpkv generate --beams B` (beam search) and `--n N` (N samples sharing one prefill), both on one
//! cache holding the prompt once (see `htpkv::session::beam`).

use super::{Checked, GenerateArgs};
use htpkv::engine::Engine;
use htpkv::session::{BeamMemory, BeamOptions, decode_text};
use std::io::Write;

/// True when the run is a beam search or parallel sampling.
pub fn wanted(args: &GenerateArgs) -> bool {
    args.beams.is_some() || args.n.is_some()
}

pub fn run(args: &GenerateArgs, checked: &Checked, engine: &mut Engine) -> anyhow::Result<()> {
    let prompt = engine
        .session()
        .encode_fitting(engine.tokenizer(), &args.prompt)
        .map_err(htpkv::engine::EngineError::from)?;
    let prev = *prompt.last().unwrap_or(&htpkv::session::BOS);
    let model = engine.model().clone();
    let codec = model.tokenizer();
    let is_stop = |t: u32| codec.is_stop(t);
    let session = engine.session_mut();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (doc, memory) = if let Some(n) = args.n {
        let s = session.sample_n(&prompt, n, args.steps, checked.generate.sampler, &is_stop)?;
        let samples: Vec<serde_json::Value> = s
            .samples
            .iter()
            .enumerate()
            .map(|(i, (tokens, stop))| {
                let text = decode_text(codec, prev, tokens);
                if !args.json {
                    let _ = writeln!(
                        out,
                        "--- sample {i} (seed {})",
                        checked.generate.sampler.seed.wrapping_add(i as u64)
                    );
                    let _ = writeln!(out, "{}{text}", args.prompt);
                }
                serde_json::json!({"text": text, "tokens": tokens, "stop": format!("{stop:?}")})
            })
            .collect();
        (serde_json::json!({ "samples": samples }), s.memory)
    } else {
        let options = BeamOptions {
            beams: args.beams.unwrap_or(1),
            length_penalty: args.length_penalty,
            max_tokens: args.steps,
        };
        let search = session.beam_search(&prompt, &options, &is_stop)?;
        let beams: Vec<serde_json::Value> = search
            .beams
            .iter()
            .map(|b| {
                serde_json::json!({
                    "text": decode_text(codec, prev, &b.tokens),
                    "tokens": b.tokens,
                    "score": b.score,
                    "logprob": b.logprob,
                    "finished": b.finished,
                })
            })
            .collect();
        if !args.json {
            let best = search
                .beams
                .first()
                .map_or(String::new(), |b| decode_text(codec, prev, &b.tokens));
            writeln!(out, "{}{best}", args.prompt)?;
        }
        let doc = serde_json::json!({
            "beams": beams,
            "length_penalty": args.length_penalty,
            "stop": format!("{:?}", search.stop),
        });
        (doc, search.memory)
    };
    if args.json {
        let mut doc = doc;
        doc["prompt"] = args.prompt.clone().into();
        doc["prompt_tokens"] = prompt.len().into();
        doc["update"] = checked.run.engine.strategy.name().into();
        doc["kv_beams"] = memory_json(&memory);
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else if args.stats {
        eprintln!("{}", memory_line(&memory));
    }
    Ok(())
}

fn memory_json(m: &BeamMemory) -> serde_json::Value {
    serde_json::json!({
        "prompt_rows": m.prompt_rows,
        "peak_rows_held": m.peak_rows_held,
        "peak_rows_independent": m.peak_rows_independent,
        "peak_cache_len": m.peak_cache_len,
        "graph_runs": m.steps,
        "one_at_a_time": m.one_at_a_time,
        "rows_written": m.counters.rows_written,
        "rows_freed": m.counters.rows_freed,
        "rows_reused": m.counters.rows_reused,
        "rows_copied_by_reorders": m.counters.rows_copied_by_reorders,
        "reorders": m.counters.reorders,
    })
}

fn memory_line(m: &BeamMemory) -> String {
    format!(
        "beams: prompt {} rows held once; peak {} rows held (cache length {}) vs {} in independent caches; \
         {} graph runs{}; rows freed {}, reused {}, copied by reorders {}",
        m.prompt_rows,
        m.peak_rows_held,
        m.peak_cache_len,
        m.peak_rows_independent,
        m.steps,
        if m.one_at_a_time {
            " (one beam at a time)"
        } else {
            ""
        },
        m.counters.rows_freed,
        m.counters.rows_reused,
        m.counters.rows_copied_by_reorders,
    )
}
