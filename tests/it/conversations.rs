//! Long conversations on the embedded stories260K: prefix reuse against cold runs, and the overflow
//! policies (slides with re-rotated or kept positions, restarts) under every strategy.

use htpkv::reference::ReferenceBackend;
use htpkv::session::{Overflow, Session, SlidePositions};
use kv_manager::{HostAllocator, Strategy};
use model::llama2c::{Checkpoint, Tokenizer};
use ref_backend::CompiledModel;
use std::sync::Arc;
use test_support::files::ScratchDir;

const STRATEGIES: [Strategy; 5] = [
    Strategy::SHIFT_2X,
    Strategy::Shift {
        reserve: kv_manager::Reserve::Factor(1.5),
        stagger: true,
    },
    Strategy::Conveyor,
    Strategy::SmartMask,
    Strategy::Naive,
];

fn model() -> (Checkpoint, Tokenizer) {
    let files = test_support::stories::stories260k();
    let ckpt = Checkpoint::load(&files.checkpoint).expect("checkpoint loads");
    let tok = Tokenizer::load(&files.tokenizer, ckpt.config.vocab_size).expect("tokenizer loads");
    (ckpt, tok)
}

/// stories260K compiled with W8A8 (u8 K/V, so re-rotation requantizes) for `context` and AR [1, 8].
fn compile(ckpt: &Checkpoint, tok: &Tokenizer, context: usize) -> Arc<CompiledModel> {
    test_support::compile::compile_u8(ckpt, tok, context, &[1, 8])
}

fn session(
    model: &Arc<CompiledModel>,
    ckpt: &Checkpoint,
    strategy: Strategy,
) -> Session<ReferenceBackend> {
    let mut s = Session::new(
        ReferenceBackend::new(model.clone()),
        strategy,
        &HostAllocator::default(),
    )
    .expect("session");
    s.set_rope(&model::llama2c::llama_config(&ckpt.config))
        .expect("the description fits the cache");
    s
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// A cache hit (rollback to the common prefix, prefill the rest) gives the same logits, bit for bit,
/// as a cold prefill of the whole prompt, under every strategy; the counters show the reuse.
#[test]
fn a_cache_hit_gives_bit_identical_logits_to_a_cold_run() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, 128);
    let first = tok.encode(
        "Once upon a time, there was a little dog named Max. He liked to run.",
        true,
        false,
    );
    let second = tok.encode(
        "Once upon a time, there was a little dog named Max. He was very sad.",
        true,
        false,
    );
    let common = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common > 8 && common < second.len(), "{common}");
    for strategy in STRATEGIES {
        let mut cold = session(&compiled, &ckpt, strategy);
        let want = bits(cold.prefill(&second).unwrap());
        let mut warm = session(&compiled, &ckpt, strategy);
        warm.prefill(&first).unwrap();
        for _ in 0..5 {
            let t = model::ops::argmax(warm.last_logits()) as u32;
            warm.decode(t).unwrap();
        }
        let prefilled = warm.stats().prefill_tokens;
        assert_eq!(
            bits(warm.prefill_reusing(&second).unwrap()),
            want,
            "{strategy:?}"
        );
        assert_eq!(warm.stats().reused_tokens, common);
        assert_eq!(
            warm.stats().prefill_tokens - prefilled,
            second.len() - common
        );
        assert_eq!(warm.tokens(), &second[..]);
        // The same prompt again: nothing is run; a prefix of it: only its last token is.
        assert_eq!(bits(warm.prefill_reusing(&second).unwrap()), want);
        assert_eq!(warm.stats().reused_tokens, common + second.len());
        let short = &second[..common];
        let mut cold_short = session(&compiled, &ckpt, strategy);
        let want_short = bits(cold_short.prefill(short).unwrap());
        assert_eq!(bits(warm.prefill_reusing(short).unwrap()), want_short);
        // Both sessions continue identically.
        let t = model::ops::argmax(warm.last_logits()) as u32;
        assert_eq!(
            bits(warm.decode(t).unwrap()),
            bits(cold_short.decode(t).unwrap())
        );
    }
}

/// Greedy decode of `steps` tokens (EOS/BOS replaced so the text goes on); every step's logits.
fn run_long(s: &mut Session<ReferenceBackend>, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut out = vec![bits(s.prefill(prompt).unwrap())];
    for _ in 0..steps {
        let t = model::ops::argmax(s.last_logits()) as u32;
        let t = if t == 1 || t == 2 { 300 } else { t };
        out.push(bits(s.decode(t).unwrap()));
        assert!(s.len() <= s.capacity());
    }
    out
}

/// More than 3x the context with each policy: every strategy gives the same logits at every step
/// across the slides, and the slides are recorded with their moves.
#[test]
fn long_runs_slide_and_every_strategy_stays_bit_identical() {
    let (ckpt, tok) = model();
    let context = 48;
    let compiled = compile(&ckpt, &tok, context);
    let prompt = tok.encode("Lily and Tom went to the park.", true, false);
    let policies = [
        Overflow::Slide {
            n_keep: 4,
            chunk: 12,
            positions: SlidePositions::Rerotate,
        },
        Overflow::Slide {
            n_keep: 4,
            chunk: 12,
            positions: SlidePositions::Keep,
        },
        Overflow::Restart {
            n_keep: 4,
            chunk: 12,
        },
    ];
    for policy in policies {
        let mut reference = None;
        for strategy in STRATEGIES {
            let mut s = session(&compiled, &ckpt, strategy);
            s.set_overflow(policy).unwrap();
            let logits = run_long(&mut s, &prompt, 3 * context + 20);
            let slides = s.slides().to_vec();
            assert!(slides.len() >= 3, "{policy:?} {strategy:?}: {slides:?}");
            assert!(slides.iter().all(|e| e.dropped >= 12 && e.len_before == 47));
            match policy {
                Overflow::Restart { .. } => assert!(slides.iter().all(|e| e.reprefilled == 35)),
                Overflow::Slide { positions, .. } => {
                    assert!(slides.iter().all(|e| e.rows_moved > 0));
                    assert_eq!(
                        slides.iter().all(|e| e.requant.is_some()),
                        positions == SlidePositions::Rerotate
                    );
                    let offset = s.cache().position_offset();
                    if positions == SlidePositions::Keep {
                        assert_eq!(offset, slides.iter().map(|e| e.dropped).sum::<usize>());
                    } else {
                        assert_eq!(offset, 0);
                    }
                }
                Overflow::Stop => unreachable!(),
            }
            match &reference {
                None => reference = Some((logits, slides)),
                Some((want, want_slides)) => {
                    assert!(
                        &logits == want,
                        "{policy:?}: {strategy:?} differs from shift"
                    );
                    let dropped = |v: &[htpkv::session::SlideEvent]| {
                        v.iter().map(|e| e.dropped).collect::<Vec<_>>()
                    };
                    assert_eq!(dropped(&slides), dropped(want_slides));
                }
            }
        }
    }
}

/// `stop` keeps today's behaviour; a policy that cannot leave room is refused; a saved slid session
/// resumes bit-identically (positions included).
#[test]
fn stop_refuses_bad_policies_and_a_slid_session_resumes() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, 48);
    let mut s = session(&compiled, &ckpt, Strategy::SmartMask);
    let prompt = tok.encode("Once upon a time", true, false);
    s.prefill(&prompt).unwrap();
    while s.len() < s.capacity() {
        s.decode(300).unwrap();
    }
    assert!(matches!(
        s.decode(300),
        Err(htpkv::session::SessionError::Kv(
            kv_manager::KvError::ContextFull { .. }
        ))
    ));
    for bad in [
        Overflow::Slide {
            n_keep: 47,
            chunk: 4,
            positions: SlidePositions::Keep,
        },
        Overflow::Restart {
            n_keep: 2,
            chunk: 0,
        },
    ] {
        assert!(s.set_overflow(bad).is_err(), "{bad:?}");
    }
    let mut bare = Session::new(
        ReferenceBackend::new(compiled.clone()),
        Strategy::Conveyor,
        &HostAllocator::default(),
    )
    .unwrap();
    assert!(
        bare.set_overflow(Overflow::Slide {
            n_keep: 2,
            chunk: 4,
            positions: SlidePositions::Rerotate
        })
        .is_err(),
        "re-rotation without a RoPE configuration"
    );
    let dir = ScratchDir::new("conv-slide");
    for positions in [SlidePositions::Keep, SlidePositions::Rerotate] {
        let policy = Overflow::Slide {
            n_keep: 3,
            chunk: 10,
            positions,
        };
        let mut a = session(&compiled, &ckpt, Strategy::SHIFT_2X);
        a.set_overflow(policy).unwrap();
        run_long(&mut a, &prompt, 60);
        assert!(!a.slides().is_empty());
        let path = dir.join("slid.session");
        a.save(&path, &[]).unwrap();
        let mut b = session(&compiled, &ckpt, Strategy::Naive);
        b.set_overflow(policy).unwrap();
        b.restore(&path).unwrap();
        assert_eq!(b.cache().position_offset(), a.cache().position_offset());
        for _ in 0..40 {
            let t = model::ops::argmax(a.last_logits()) as u32;
            assert_eq!(bits(a.decode(t).unwrap()), bits(b.decode(t).unwrap()));
        }
    }
}

/// One loaded model serves sessions on several threads at once (each with its own KV region); every
/// text equals the one a lone sequential session gives, slides included.
#[test]
fn sessions_on_one_model_from_threads_give_the_sequential_texts() {
    use htpkv::engine::EngineOptions;
    use htpkv::session::GenerateOptions;
    let cache_dir = ScratchDir::new("conv-model");
    let options = EngineOptions {
        context: Some(64),
        ar: vec![1, 8],
        cache_dir: Some(cache_dir.to_path_buf()),
        ..EngineOptions::default()
    };
    let model = htpkv::Model::open(&options, &mut |_| {}).expect("model");
    let prompts = [
        "Once upon a time",
        "Tom had a red ball",
        "The cat sat on the mat",
        "Lily went to the park",
    ];
    let run = |prompt: &str| -> String {
        let mut s = model.new_session().expect("session");
        s.set_overflow(Overflow::Slide {
            n_keep: 4,
            chunk: 16,
            positions: SlidePositions::Rerotate,
        })
        .unwrap();
        let options = GenerateOptions {
            max_tokens: 150,
            sampler: Default::default(),
            ..GenerateOptions::default()
        };
        s.generate(model.tokenizer(), prompt, &options, &mut |_| true)
            .expect("generate")
            .text
    };
    let sequential: Vec<String> = prompts.iter().map(|p| run(p)).collect();
    let threaded: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let run = &run;
                scope.spawn(move || run(p))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(threaded, sequential);
    assert!(sequential.windows(2).all(|w| w[0] != w[1]));
    assert!(model.shared_bytes() > 0);
}
