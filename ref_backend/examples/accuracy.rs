//! Accuracy of the reference executor against the f32 float model on a Llama-family model.
//!
//! `cargo run --release -p ref_backend --example accuracy -- --model <gguf or HF folder> [--json]
//! [--kv u16,u8,f16] [--weights f32,i8,f16]`
//!
//! `--kv` / `--weights` choose (and order) the grid; by default all nine pairs, the goal rows
//! (f32 weights) first. Each result is also printed to stderr as soon as it is measured.
//!
//! 1. Teacher-forced over the first [`TEXT_TOKENS`] tokens of a fixed public-domain text (the
//!    opening of the US Declaration of Independence, `examples/data/declaration.txt`): for KV
//!    u8/u16/f16 × weights i8/f16/f32, the share of positions whose top-1 token equals the
//!    float model's and the mean KL(float || executor) of the next-token distributions. The
//!    text is fed through the AR-64 graph (a prefill gives every position's logits).
//! 2. Five chat questions through the model's chat template, greedy: with the default
//!    quantized configuration (u8 KV, i8 weights), how many generated tokens agree with the
//!    float model's before the first divergence, and the float model's top-1/top-2 logit margin
//!    at that token (a margin under ~0.1 logit flips under any 8-bit noise).
//!
//! 3. `--ablate` (instead of 1 and 2): where the error of i8 weights and the first `--kv` type
//!    comes from — the f32 forward with the executor's quantization at one site at a time
//!    (each weight kind, each matrix product's input, K, V), each site's mean KL and top-1 over
//!    the text, and every site at once beside the executor's own figure ([`ablation`]), and
//!    every site but V, down, the classifier and combinations ([`ablation::kept_in_float`]); then
//!    every weight at once under each of `--weight-rules` (default `channel,channel-mse,block:32,
//!    lpbq:64`: per-channel absmax, per-channel least-squares clipping, a scale per block, a
//!    channel scale times a 4-bit block multiplier; `sym4:N` and `asym4:N` are 4-bit grids with a
//!    float scale, and a minimum, per block, llama.cpp's Q4_0 and Q4_1). `--rules-only` skips the
//!    per-site rows except the down projection's input.
//!
//! `--rounding LIST` (integer weights only): compile each integer row once per entry, `nearest`
//! or `gptq` ([`ref_backend::Rounding`]; default `gptq`, the compile's own); with `--ablate` the
//! first entry is used.
//!
//! `--ffn-smoothing LIST` (i8 weights only): compile each i8 row once per entry, `off` (no
//! fold) or `ALPHA:MARGIN` ([`ref_backend::FfnSmoothing`]); by default the compile's own
//! [`ref_backend::FFN_SMOOTHING`]. With `--ablate` the first entry is used. This is how the
//! default was chosen (README, "Where the i8 error comes from").
//!
//! Calibration (`--calibration chats`, the default): the conversations of
//! [`ref_backend::DEFAULT_CALIBRATION_CHATS`] rendered with the model's chat template, then
//! [`ref_backend::DEFAULT_CALIBRATION_PROMPTS`], each cut or continued to
//! `--calibration-tokens` ([`CALIBRATION_TOKENS`]) tokens; `--calibration stories` uses the
//! story prompts alone. Each result reports how many of the text's K/V values fall outside the
//! calibrated KV ranges (`kv_clipping`).

#[path = "accuracy/ablation.rs"]
mod ablation;

use std::path::PathBuf;
use std::sync::Arc;

use model::ops::{argmax, kl_logits};
use model::{FloatModel, LoadedModel, Message, Site, Tap, WeightSource};
use quant::DataType;
use ref_backend::{
    CompileOptions, CompiledModel, FFN_SMOOTHING, FfnSmoothing, Recipe, Rounding, WeightType,
    compile_with,
};
use test_support::harness::Harness;

/// Tokens of the text that are scored (teacher-forced).
const TEXT_TOKENS: usize = 512;
/// Context of the compiled graphs.
const CONTEXT: usize = 1024;
/// Rows of the prefill graph.
const PREFILL: usize = 64;
/// Longest greedy answer compared.
const MAX_ANSWER: usize = 32;
/// Length of each calibration sequence (the engine's default).
const CALIBRATION_TOKENS: usize = ref_backend::DEFAULT_CALIBRATION_TOKENS;

const QUESTIONS: [&str; 5] = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is the boiling point of water in degrees Celsius?",
    "Who wrote Romeo and Juliet?",
    "Name three primary colors.",
];

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (mut path, mut json, mut ablate, mut rules_only) = (None, false, false, false);
    let mut smoothings = vec![Some(FFN_SMOOTHING)];
    let mut roundings = vec![Rounding::Gptq];
    let mut rules: Vec<ablation::WeightRule> = ["channel", "channel-mse", "block:32", "lpbq:64"]
        .iter()
        .map(|r| r.parse())
        .collect::<Result<_, _>>()?;
    let (mut chats_cal, mut cal_tokens) = (true, CALIBRATION_TOKENS);
    let mut kvs = vec![DataType::U16, DataType::U8, DataType::F16];
    let mut wts = vec![WeightType::F32, WeightType::I8, WeightType::F16];
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => path = args.next().map(PathBuf::from),
            "--json" => json = true,
            "--ablate" => ablate = true,
            "--rules-only" => (ablate, rules_only) = (true, true),
            "--ffn-smoothing" => smoothings = parse_smoothings(args.next())?,
            "--rounding" => roundings = parse_roundings(args.next())?,
            "--weight-rules" => rules = list(args.next())?,
            "--kv" => kvs = list(args.next())?,
            "--weights" => wts = list(args.next())?,
            "--calibration" => chats_cal = parse_calibration(args.next())?,
            "--calibration-tokens" => {
                cal_tokens = args
                    .next()
                    .ok_or("--calibration-tokens needs a value")?
                    .parse()?
            }
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let path = path.ok_or("usage: accuracy --model <gguf file or HF folder> [--json]")?;
    let m = model::load(&path)?;
    let fingerprint = fingerprint(&path)?;
    let text = include_str!("data/declaration.txt");
    let tokens = m.tokenizer.encode(text, true)?;
    if tokens.len() < TEXT_TOKENS + 1 {
        return Err(format!("the text has only {} tokens", tokens.len()).into());
    }
    let tokens = &tokens[..TEXT_TOKENS + 1];
    if ablate {
        let calibration = calibration(&m, chats_cal)?;
        let kv = *kvs.first().ok_or("--kv is empty")?;
        let recipe = Recipe {
            ffn_smoothing: *smoothings.first().ok_or("--ffn-smoothing is empty")?,
            rounding: *roundings.first().ok_or("--rounding is empty")?,
        };
        let setup = (kv, cal_tokens, fingerprint, rules_only, recipe);
        return ablate_sites(&m, tokens, &calibration, setup, &rules, json);
    }
    let mut text_kv = KvValues::new(&m.config);
    let float = float_logits(&m, tokens, &mut text_kv)?;
    eprintln!("float reference: {} positions", float.len());
    let chats = chat_prompts(&m)?;
    let float_answers: Vec<Answer> = chats
        .iter()
        .map(|p| float_greedy(&m, p))
        .collect::<Result<_, _>>()?;
    let calibration = calibration(&m, chats_cal)?;

    let mut grid = Vec::new();
    let mut chat_rows = Vec::new();
    for &weights in &wts {
        let recipes = recipes(weights, &smoothings, &roundings);
        for (&kv, &recipe) in kvs.iter().flat_map(|k| recipes.iter().map(move |r| (k, r))) {
            let mut o = CompileOptions::new(CONTEXT, vec![1, PREFILL]);
            o.kv_dtype = kv;
            o.weights = weights;
            o.calibration_tokens = cal_tokens;
            let t = std::time::Instant::now();
            let weights_src: &dyn WeightSource = &*m.weights;
            let q = compile_with(
                &m.config,
                weights_src,
                &calibration,
                (&o, recipe),
                fingerprint,
                &mut |_| {},
            )?;
            let compile_s = t.elapsed().as_secs_f64();
            let (top1, kl) = teacher_forced(&q, tokens, &float);
            let clip = text_kv.clipping(&q);
            let smooth = smoothing_label(weights, recipe.ffn_smoothing);
            let rounding = rounding_label(weights, recipe.rounding);
            eprintln!(
                "KV {kv} weights {} (FFN smoothing {smooth}, rounding {rounding}): top-1 {:.2}% mean KL {kl:.5} (compiled in {compile_s:.1} s); clipped K/V {}",
                weights.name(),
                top1 * 100.0,
                clip
            );
            grid.push(serde_json::json!({
                "kv": kv.to_string(), "weights": weights.name(), "ffn_smoothing": smooth,
                "rounding": rounding,
                "top1_agreement": top1, "mean_kl": kl, "compile_seconds": compile_s,
                "kv_clipping": clip,
            }));
            // The chats once, with the first smoothing.
            if (kv, weights) == (DataType::U8, WeightType::I8) && chat_rows.len() < QUESTIONS.len()
            {
                for ((question, prompt), want) in QUESTIONS.iter().zip(&chats).zip(&float_answers) {
                    let row = compare_chat(&m, &q, prompt, want)?;
                    chat_rows.push((question.to_string(), row));
                }
            }
        }
    }
    report(&m, json, &grid, &chat_rows)
}

/// The ablation (`--ablate`): i8 weights and `kv` K/V compiled once, then the f32 forward with
/// one site at a time quantized as the executor quantizes it.
fn ablate_sites(
    m: &LoadedModel,
    tokens: &[u32],
    calibration: &[Vec<u32>],
    (kv, cal_tokens, fingerprint, rules_only, recipe): (DataType, usize, [u8; 32], bool, Recipe),
    rules: &[ablation::WeightRule],
    json: bool,
) -> Result<(), Error> {
    let mut o = CompileOptions::new(CONTEXT, vec![1, PREFILL]);
    o.kv_dtype = kv;
    o.weights = WeightType::I8;
    o.calibration_tokens = cal_tokens;
    let q = compile_with(
        &m.config,
        &*m.weights,
        calibration,
        (&o, recipe),
        fingerprint,
        &mut |_| {},
    )?;
    // The f32 weights `q` was quantized from (its FFN smoothing folded in), so that a site
    // quantized alone sees the values its encoding was calibrated on.
    let smoothed = ref_backend::smoothed_weights(&q, &*m.weights);
    let weights: &dyn WeightSource = &smoothed;
    let text = &tokens[..tokens.len() - 1];
    let run_widened = |sites: &[ablation::Site], widen: f32| {
        ablation::logits(&m.config, weights, &q, (sites, widen), text)
    };
    let run = |sites: &[ablation::Site]| run_widened(sites, 1.0);
    let float = ablation::logits(&m.config, &*m.weights, &q, (&[], 1.0), text)?;
    let mut rows = Vec::new();
    let mut row = |label: String, (top1, kl): (f64, f64)| {
        eprintln!("{label:<40} top-1 {:6.2}%  mean KL {kl:.5}", top1 * 100.0);
        rows.push(serde_json::json!({"site": label, "top1_agreement": top1, "mean_kl": kl}));
    };
    let all = ablation::Site::all(&m.config);
    let down = ablation::Site::Input(model::LayerTensor::Down);
    for &site in all.iter().filter(|&&s| !rules_only || s == down) {
        row(site.label(), ablation::score(&float, &run(&[site])?));
    }
    row("every site".into(), ablation::score(&float, &run(&all)?));
    for (label, kept) in ablation::kept_in_float() {
        let sites: Vec<ablation::Site> =
            all.iter().copied().filter(|s| !kept.contains(s)).collect();
        row(
            format!("every site but {label}"),
            ablation::score(&float, &run(&sites)?),
        );
    }
    for widen in [2.0, 4.0] {
        let label = format!("input of down, i16 ranges {widen}x wider");
        row(
            label,
            ablation::score(&float, &run_widened(&[down], widen)?),
        );
    }
    let exec = teacher_forced(&q, tokens, &float);
    row("the executor itself".into(), exec);
    for &rule in rules {
        let got = ablation::rule_logits(&m.config, weights, &q, rule, text)?;
        row(
            format!("every weight, {rule:?}"),
            ablation::score(&float, &got),
        );
    }
    let report = serde_json::json!({
        "kv": kv.to_string(), "weights": "i8",
        "positions": text.len(), "sites": rows,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// `--ffn-smoothing`'s list: `off` or `ALPHA:MARGIN` each.
fn parse_smoothings(arg: Option<String>) -> Result<Vec<Option<FfnSmoothing>>, Error> {
    let arg = arg.ok_or("--ffn-smoothing needs a list (off or ALPHA:MARGIN, comma-separated)")?;
    arg.split(',')
        .map(|v| match v.split_once(':') {
            None if v == "off" => Ok(None),
            Some((a, m)) => Ok(Some(FfnSmoothing {
                alpha: a.parse()?,
                margin: m.parse()?,
            })),
            None => Err(format!("--ffn-smoothing: `{v}` is neither off nor ALPHA:MARGIN").into()),
        })
        .collect()
}

/// The recipes a row of `weights` is compiled with: the smoothings (i8 only) times the
/// roundings (integer weights only); float weights once.
fn recipes(
    weights: WeightType,
    smoothings: &[Option<FfnSmoothing>],
    roundings: &[Rounding],
) -> Vec<Recipe> {
    let smoothings = if weights == WeightType::I8 {
        smoothings
    } else {
        &smoothings[..1]
    };
    let roundings = if weights.is_integer() {
        roundings
    } else {
        &roundings[..1]
    };
    smoothings
        .iter()
        .flat_map(|&s| {
            roundings.iter().map(move |&r| Recipe {
                ffn_smoothing: s,
                rounding: r,
            })
        })
        .collect()
}

/// `--rounding`'s list: `nearest` or `gptq` each.
fn parse_roundings(arg: Option<String>) -> Result<Vec<Rounding>, Error> {
    let arg = arg.ok_or("--rounding needs a list (nearest, gptq; comma-separated)")?;
    arg.split(',')
        .map(|v| match v {
            "nearest" => Ok(Rounding::Nearest),
            "gptq" => Ok(Rounding::Gptq),
            _ => Err(format!("--rounding: `{v}` is neither nearest nor gptq").into()),
        })
        .collect()
}

/// How a row's integer weights were rounded: `-` (float weights), `nearest` or `gptq`.
fn rounding_label(weights: WeightType, r: Rounding) -> &'static str {
    match r {
        _ if !weights.is_integer() => "-",
        Rounding::Nearest => "nearest",
        Rounding::Gptq => "gptq",
    }
}

/// How a row's FFN was smoothed: `-` (not i8), `off` or `ALPHA:MARGIN`.
fn smoothing_label(weights: WeightType, s: Option<FfnSmoothing>) -> String {
    match s {
        _ if weights != WeightType::I8 => "-".into(),
        None => "off".into(),
        Some(s) => format!("{}:{}", s.alpha, s.margin),
    }
}

/// `chats` (the default) or `stories`.
fn parse_calibration(arg: Option<String>) -> Result<bool, Error> {
    match arg.as_deref() {
        Some("chats") => Ok(true),
        Some("stories") => Ok(false),
        other => Err(format!("--calibration: expected chats or stories, got {other:?}").into()),
    }
}

/// The calibration sequences: the story prompts, preceded (`chats`) by the default
/// conversations rendered with the model's chat template.
fn calibration(m: &LoadedModel, chats: bool) -> Result<Vec<Vec<u32>>, Error> {
    let mut out = Vec::new();
    if chats {
        let chat = m.chat.as_ref().ok_or("the model has no chat template")?;
        for (q, a) in ref_backend::DEFAULT_CALIBRATION_CHATS {
            let turns = [Message::new("user", q), Message::new("assistant", a)];
            let text = chat.render_chat(&turns, false)?;
            out.push(m.tokenizer.encode(&text, true)?);
        }
    }
    for p in ref_backend::DEFAULT_CALIBRATION_PROMPTS {
        out.push(m.tokenizer.encode(p, true)?);
    }
    Ok(out)
}

/// A comma-separated list of values.
fn list<T: std::str::FromStr>(arg: Option<String>) -> Result<Vec<T>, Error>
where
    T::Err: std::fmt::Display,
{
    let arg = arg.ok_or("a list of values is missing")?;
    arg.split(',')
        .map(|v| v.parse::<T>().map_err(|e| format!("`{v}`: {e}").into()))
        .collect()
}

/// SHA-256 of the model file (or of every file of a folder, in name order).
fn fingerprint(path: &std::path::Path) -> Result<[u8; 32], Error> {
    let mut bytes = Vec::new();
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.sort();
        for f in files.iter().filter(|f| f.is_file()) {
            bytes.extend(model::llama2c::sha256(&std::fs::read(f)?));
        }
    } else {
        bytes = std::fs::read(path)?;
    }
    Ok(model::llama2c::sha256(&bytes))
}

/// The float model's logits after each of `tokens[..len - 1]`; `tap` sees the pass.
fn float_logits(
    m: &LoadedModel,
    tokens: &[u32],
    tap: &mut dyn Tap,
) -> Result<Vec<Vec<f32>>, Error> {
    let mut f = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), CONTEXT)?;
    let mut out = Vec::new();
    for (pos, &t) in tokens[..tokens.len() - 1].iter().enumerate() {
        out.push(f.forward_tapped(t, pos, tap)?.to_vec());
    }
    Ok(out)
}

/// The float model's keys (after RoPE) and values over the scored text, per (layer, KV head,
/// K|V): what the KV encodings have to represent.
struct KvValues {
    n_kv_heads: usize,
    head_dim: usize,
    /// `(layer * n_kv_heads + head) * 2 + (0 K | 1 V)`.
    values: Vec<Vec<f32>>,
}

impl Tap for KvValues {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        let v = match site {
            Site::Key => 0,
            Site::Value => 1,
            _ => return,
        };
        for (h, head) in values.chunks_exact(self.head_dim).enumerate() {
            self.values[(layer * self.n_kv_heads + h) * 2 + v].extend_from_slice(head);
        }
    }
}

impl KvValues {
    fn new(c: &model::LlamaConfig) -> KvValues {
        KvValues {
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            values: vec![Vec::new(); c.n_layers * c.n_kv_heads * 2],
        }
    }

    /// How many of the text's K/V values fall outside the range `q`'s fixed-point KV encodings
    /// represent (they are clipped when written): in total, and the worst (layer, head, K|V)
    /// tensors with how far outside they reach (`reach`: the largest distance outside the
    /// range, in range widths).
    fn clipping(&self, q: &CompiledModel) -> serde_json::Value {
        let mut total = (0usize, 0usize);
        let mut heads = Vec::new();
        for (i, vals) in self.values.iter().enumerate() {
            let (layer, head, value) =
                (i / 2 / self.n_kv_heads, i / 2 % self.n_kv_heads, i % 2 == 1);
            let Some(spec) = q.kv_spec(layer, head, value) else {
                continue;
            };
            let (quant::Encoding::PerTensor(so), Some(_)) =
                (&spec.encoding, spec.dtype.integer_range())
            else {
                return serde_json::Value::Null;
            };
            let Some((lo, hi)) = so.representable_range(spec.dtype) else {
                continue;
            };
            let out = vals.iter().filter(|&&x| x < lo || x > hi).count();
            let reach = vals
                .iter()
                .map(|&x| (lo - x).max(x - hi).max(0.0) / (hi - lo))
                .fold(0.0f32, f32::max);
            total.0 += out;
            total.1 += vals.len();
            heads.push((out, layer, head, value, lo, hi, reach));
        }
        heads.sort_by_key(|h| std::cmp::Reverse(h.0));
        let worst: Vec<_> = heads
            .iter()
            .take(6)
            .filter(|h| h.0 > 0)
            .map(|&(out, layer, head, value, lo, hi, reach)| {
                serde_json::json!({
                    "layer": layer, "kv_head": head, "tensor": if value { "V" } else { "K" },
                    "clipped": out, "range": [lo, hi], "reach": reach,
                })
            })
            .collect();
        serde_json::json!({
            "clipped": total.0, "values": total.1,
            "share": total.0 as f64 / total.1.max(1) as f64, "worst": worst,
        })
    }
}

/// Top-1 agreement and mean KL of the executor's prefill logits against `float`.
fn teacher_forced(q: &CompiledModel, tokens: &[u32], float: &[Vec<f32>]) -> (f64, f64) {
    let logits = prefill(q, &tokens[..tokens.len() - 1]);
    let v = float[0].len();
    let (mut agree, mut kl) = (0usize, 0.0f64);
    for (p, want) in float.iter().enumerate() {
        let got = &logits[p * v..(p + 1) * v];
        agree += usize::from(argmax(got) == argmax(want));
        kl += kl_logits(want, got);
    }
    let n = float.len() as f64;
    (agree as f64 / n, kl / n)
}

/// Every position's logits of `tokens` run through the AR-64 graph.
fn prefill(q: &CompiledModel, tokens: &[u32]) -> Vec<f32> {
    let g = q.graph_for_ar(PREFILL).expect("the prefill graph");
    let mut h = Harness::for_model(q);
    tokens.chunks(PREFILL).flat_map(|c| h.step(g, c)).collect()
}

fn chat_prompts(m: &LoadedModel) -> Result<Vec<Vec<u32>>, Error> {
    let chat = m.chat.as_ref().ok_or("the model has no chat template")?;
    QUESTIONS
        .iter()
        .map(|q| {
            let text = chat.render_chat(&[Message::new("user", q)], true)?;
            Ok(m.tokenizer.encode(&text, true)?)
        })
        .collect()
}

/// A greedy answer and, per answer token, the float top-1/top-2 margin where it was chosen.
struct Answer {
    tokens: Vec<u32>,
    margins: Vec<f32>,
}

fn margin(logits: &[f32]) -> f32 {
    let top = argmax(logits);
    let second = logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != top)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    logits[top] - second
}

fn float_greedy(m: &LoadedModel, prompt: &[u32]) -> Result<Answer, Error> {
    let mut f = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), CONTEXT)?;
    let stop = m.config.special.stop_tokens();
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits = f.forward(t, pos)?.to_vec();
    }
    let mut a = Answer {
        tokens: Vec::new(),
        margins: Vec::new(),
    };
    while a.tokens.len() < MAX_ANSWER {
        let next = argmax(&logits) as u32;
        a.margins.push(margin(&logits));
        if stop.contains(&next) {
            break;
        }
        a.tokens.push(next);
        logits = f.forward(next, prompt.len() + a.tokens.len() - 1)?.to_vec();
    }
    Ok(a)
}

/// The quantized model's greedy answer compared with the float one.
fn compare_chat(
    m: &LoadedModel,
    q: &CompiledModel,
    prompt: &[u32],
    want: &Answer,
) -> Result<serde_json::Value, Error> {
    let g1 = q.graph_for_ar(1).expect("the AR-1 graph");
    let gp = q.graph_for_ar(PREFILL).expect("the prefill graph");
    let v = m.config.vocab_size;
    let stop = m.config.special.stop_tokens();
    let mut h = Harness::for_model(q);
    let mut logits = Vec::new();
    for c in prompt.chunks(PREFILL) {
        let l = h.step(gp, c);
        logits = l[l.len() - v..].to_vec();
    }
    let mut got = Vec::new();
    while got.len() < MAX_ANSWER {
        let next = argmax(&logits) as u32;
        if stop.contains(&next) {
            break;
        }
        got.push(next);
        logits = h.step(g1, &[next]);
    }
    // Tokens equal before the first divergence (the stop token counts as the end of both).
    let agree = want
        .tokens
        .iter()
        .zip(&got)
        .take_while(|(a, b)| a == b)
        .count();
    let diverged = agree < want.tokens.len().max(got.len());
    let decode = |t: &[u32]| m.tokenizer.decode(t, true);
    Ok(serde_json::json!({
        "float_answer": decode(&want.tokens)?,
        "quantized_answer": decode(&got)?,
        "float_tokens": want.tokens.len(),
        "agreeing_tokens": agree,
        "diverged": diverged,
        "float_margin_at_divergence": if diverged { want.margins.get(agree).copied() } else { None },
        "smallest_float_margin": want.margins.iter().copied().fold(f32::INFINITY, f32::min),
    }))
}

fn report(
    m: &LoadedModel,
    json: bool,
    grid: &[serde_json::Value],
    chat: &[(String, serde_json::Value)],
) -> Result<(), Error> {
    let chat_json: Vec<serde_json::Value> = chat
        .iter()
        .map(|(q, r)| {
            let mut r = r.clone();
            r["question"] = q.clone().into();
            r
        })
        .collect();
    if json {
        let out = serde_json::json!({
            "layers": m.config.n_layers, "dim": m.config.dim,
            "text_tokens": TEXT_TOKENS, "teacher_forced": grid, "chat_u8_kv_i8_weights": chat_json,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("| KV | weights | top-1 agreement | mean KL |\n|---|---|---|---|");
    for c in grid {
        println!(
            "| {} | {} | {:.2}% | {:.2e} |",
            c["kv"].as_str().unwrap_or("?"),
            c["weights"].as_str().unwrap_or("?"),
            c["top1_agreement"].as_f64().unwrap_or(0.0) * 100.0,
            c["mean_kl"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "\n| question | agreeing / float tokens | float margin at divergence |\n|---|---|---|"
    );
    for r in &chat_json {
        println!(
            "| {} | {} / {} | {} |",
            r["question"].as_str().unwrap_or(""),
            r["agreeing_tokens"],
            r["float_tokens"],
            r["float_margin_at_divergence"]
        );
    }
    Ok(())
}
