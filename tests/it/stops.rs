//! Stop strings, finish reasons and cancellation from another thread, in plain and speculative
//! decoding: the streamed text is the whole text cut where a stop string starts, and a cancelled
//! session holds exactly its committed tokens and goes on as if it had not stopped.

use htpkv::reference::ReferenceBackend;
use htpkv::session::{Cancel, GenerateOptions, Generation, Session, StopReason};
use htpkv::speculate::{PromptLookup, Speculation};
use kv_manager::Strategy;
use model::llama2c::{Checkpoint, Tokenizer};
use ref_backend::{CompileOptions, CompiledModel};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PROMPT: &str = "Once upon a time";

fn setup() -> (Checkpoint, Tokenizer, Arc<CompiledModel>) {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let config = model::llama2c::llama_config(&ckpt.config);
    let opts = CompileOptions::new(128, vec![1, 5]);
    let compiled = test_support::compile::compile(&ckpt, &tok, &config, &opts);
    (ckpt, tok, compiled)
}

fn session(
    model: &Arc<CompiledModel>,
    ckpt: &Checkpoint,
    s: Strategy,
) -> Session<ReferenceBackend> {
    let mut session = test_support::runtime::session(model, s);
    session
        .set_rope(&model::llama2c::llama_config(&ckpt.config))
        .expect("the description fits the cache");
    session
}

fn options(max_tokens: usize, stop: &[&str], cancel: Option<Cancel>) -> GenerateOptions {
    GenerateOptions {
        stop: stop.iter().map(|s| s.to_string()).collect(),
        cancel,
        ..GenerateOptions::new(max_tokens, Default::default())
    }
}

/// Runs plainly (`spec: false`) or with prompt lookup; returns the generation and the streamed
/// pieces.
fn run(
    s: &mut Session<ReferenceBackend>,
    tok: &Tokenizer,
    prompt: &str,
    o: &GenerateOptions,
    spec: bool,
    mut each: impl FnMut(&str),
) -> (Generation, Vec<String>) {
    let mut pieces = Vec::new();
    let mut on_text = |p: &str| {
        pieces.push(p.to_string());
        each(p);
        true
    };
    let g = if spec {
        let mut sp = Speculation::new(Box::new(PromptLookup::new(4))).verifying_all();
        sp.generate(s, tok, prompt, o, &mut on_text)
            .expect("generates")
    } else {
        s.generate(tok, prompt, o, &mut on_text).expect("generates")
    };
    (g, pieces)
}

/// A stop string made of the end of one token's text and the start of the next one's: it spans a
/// token boundary, so only matching across tokens finds it.
fn stop_across_tokens(tok: &Tokenizer, g: &Generation) -> String {
    let mut prev = *g.prompt_tokens.last().unwrap();
    let pieces: Vec<String> = g
        .tokens
        .iter()
        .map(|&t| {
            let p = String::from_utf8(tok.decode_piece(prev, t)).unwrap();
            prev = t;
            p
        })
        .collect();
    let i = (10..pieces.len() - 1)
        .find(|&i| pieces[i].trim().len() >= 2 && pieces[i + 1].trim().len() >= 2)
        .expect("two word tokens in a row");
    let (a, b) = (&pieces[i], &pieces[i + 1]);
    format!("{}{}", &a[a.len() - 2..], &b[..2])
}

#[test]
fn a_stop_string_across_tokens_ends_the_text_and_is_never_streamed() {
    let (ckpt, tok, compiled) = setup();
    let whole = session(&compiled, &ckpt, Strategy::Naive)
        .generate(&tok, PROMPT, &options(60, &[], None), &mut |_| true)
        .unwrap();
    let stop = stop_across_tokens(&tok, &whole);
    let cut = whole
        .text
        .find(&stop)
        .expect("the stop string is in the text");
    for (strategy, spec) in [
        (Strategy::SHIFT_2X, false),
        (Strategy::Conveyor, true),
        (Strategy::SmartMask, false),
    ] {
        let mut s = session(&compiled, &ckpt, strategy);
        let o = options(60, &["never in a story: zq", &stop], None);
        let (g, pieces) = run(&mut s, &tok, PROMPT, &o, spec, |_| {});
        let streamed = pieces.concat();
        assert_eq!(g.stop, StopReason::StopString, "{strategy:?} spec {spec}");
        assert_eq!(g.stop.finish_reason(), "stop");
        assert_eq!(
            g.text,
            whole.text[..cut],
            "{strategy:?} spec {spec} stop {stop:?}"
        );
        assert_eq!(streamed, g.text);
        assert_eq!(g.tokens, whole.tokens[..g.tokens.len()]);
        // The token that completed the stop string is the last one, and it is not cached.
        assert!(whole.text.len() >= cut + stop.len());
        assert_eq!(s.len(), g.prompt_tokens.len() + g.tokens.len() - 1);
    }
}

/// A stop string that never completes changes nothing: the same text, the same stream once the
/// held-back text is flushed, `length` as the finish reason.
#[test]
fn a_stop_string_that_never_completes_holds_back_and_then_flushes() {
    let (ckpt, tok, compiled) = setup();
    let mut s = session(&compiled, &ckpt, Strategy::SHIFT_2X);
    let (whole, _) = run(&mut s, &tok, PROMPT, &options(40, &[], None), false, |_| {});
    // The text's last character followed by one it never has: the ending is held back until the end.
    let last = whole.text.chars().last().unwrap();
    let stop = format!("{last}\u{2603}");
    let mut s = session(&compiled, &ckpt, Strategy::SHIFT_2X);
    let (g, pieces) = run(
        &mut s,
        &tok,
        PROMPT,
        &options(40, &[&stop], None),
        false,
        |_| {},
    );
    assert_eq!(g.stop, StopReason::MaxTokens);
    assert_eq!(g.stop.finish_reason(), "length");
    assert_eq!(g.text, whole.text);
    assert_eq!(pieces.concat(), whole.text);
}

/// Cancelled from another thread after five pieces, generation stops at the next step boundary;
/// the cache holds every token but the last (as after any stop), and going on (`feed_last`, then an
/// empty prompt) gives exactly the tokens of one uncancelled run.
#[test]
fn cancel_from_another_thread_stops_at_a_step_boundary_and_the_session_goes_on() {
    let (ckpt, tok, compiled) = setup();
    let whole = session(&compiled, &ckpt, Strategy::Naive)
        .generate(&tok, PROMPT, &options(48, &[], None), &mut |_| true)
        .unwrap();
    for (strategy, spec) in [(Strategy::SHIFT_2X, false), (Strategy::Conveyor, true)] {
        let cancel = Cancel::new();
        let (tx, rx) = mpsc::channel::<()>();
        let canceller = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                rx.recv().unwrap();
                cancel.cancel();
            })
        };
        let mut s = session(&compiled, &ckpt, strategy);
        let o = options(48, &[], Some(cancel.clone()));
        let mut count = 0;
        let (head, _) = run(&mut s, &tok, PROMPT, &o, spec, |_| {
            count += 1;
            if count == 5 {
                tx.send(()).unwrap();
                let started = Instant::now();
                while !cancel.is_cancelled() && started.elapsed() < Duration::from_secs(10) {
                    std::thread::yield_now();
                }
            }
        });
        canceller.join().unwrap();
        assert_eq!(head.stop, StopReason::Cancelled, "{strategy:?} spec {spec}");
        assert_eq!(head.stop.finish_reason(), "cancelled");
        assert!(head.tokens.len() < 48, "{strategy:?}: stopped early");
        assert_eq!(s.len(), head.prompt_tokens.len() + head.tokens.len() - 1);
        s.feed_last(&head).unwrap();
        let rest = 48 - head.tokens.len();
        let tail = s
            .generate(&tok, "", &options(rest, &[], None), &mut |_| true)
            .unwrap();
        assert_eq!(
            [head.tokens, tail.tokens].concat(),
            whole.tokens,
            "{strategy:?}"
        );
    }
}

/// A handle cancelled before generation starts: the prompt is cached, nothing is generated.
#[test]
fn a_cancel_before_the_first_token_generates_nothing() {
    let (ckpt, tok, compiled) = setup();
    let cancel = Cancel::new();
    cancel.cancel();
    for spec in [false, true] {
        let mut s = session(&compiled, &ckpt, Strategy::SHIFT_2X);
        let (g, pieces) = run(
            &mut s,
            &tok,
            PROMPT,
            &options(8, &[], Some(cancel.clone())),
            spec,
            |_| {},
        );
        assert_eq!(g.stop, StopReason::Cancelled);
        assert!(g.tokens.is_empty() && pieces.is_empty() && g.text.is_empty());
        assert_eq!(s.len(), g.prompt_tokens.len());
    }
}

#[test]
fn bad_stop_strings_are_refused_before_anything_runs() {
    let (ckpt, tok, compiled) = setup();
    let mut s = session(&compiled, &ckpt, Strategy::SHIFT_2X);
    let long = "x".repeat(htpkv::session::MAX_STOP_BYTES + 1);
    let many: Vec<&str> = vec!["a"; htpkv::session::MAX_STOPS + 1];
    for stop in [vec![""], vec![long.as_str()], many] {
        let err = s
            .generate(&tok, PROMPT, &options(4, &stop, None), &mut |_| true)
            .unwrap_err();
        assert_eq!(err.kind(), "bad_option", "{err}");
        assert!(err.to_string().contains("stop string"), "{err}");
        assert!(s.is_empty(), "nothing ran");
    }
}
