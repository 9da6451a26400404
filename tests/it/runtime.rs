//! The runtime against its oracles: the float reference model (llama2c), the four KV strategies
//! against each other, prefill against token-by-token decode.

use htpkv::backend::Backend;
use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::Strategy;
use model::llama2c::{Checkpoint, FloatModel, Tokenizer};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::sync::Arc;
use test_support::files::ScratchDir;
use test_support::runtime::{STRATEGIES, session};

fn model() -> (Arc<Checkpoint>, Tokenizer) {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    (Arc::new(ckpt), tok)
}

fn compile(
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    kv: DataType,
    weights: WeightType,
    ar: &[usize],
) -> Arc<CompiledModel> {
    let mut opts = CompileOptions::new(ckpt.config.seq_len, ar.to_vec());
    opts.kv_dtype = kv;
    opts.weights = weights;
    let prompts: Vec<Vec<u32>> = ref_backend::DEFAULT_CALIBRATION_PROMPTS
        .iter()
        .map(|t| tok.encode(t, true, false))
        .collect();
    Arc::new(compile_ckpt(ckpt, &prompts, &opts))
}

/// Compiles a llama2.c checkpoint (its description, weights and SHA-256).
fn compile_ckpt(ckpt: &Checkpoint, prompts: &[Vec<u32>], opts: &CompileOptions) -> CompiledModel {
    let c = model::llama2c::llama_config(&ckpt.config);
    ref_backend::compile(&c, ckpt, prompts, opts, ckpt.sha256(), &mut |_| {}).expect("compiles")
}

/// Greedy from BOS: the f32 path equals the float reference token for token for 256 tokens.
#[test]
fn f32_path_matches_the_float_reference_for_256_tokens() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, DataType::F32, WeightType::F32, &[1, 32]);
    let mut float = FloatModel::new(ckpt.clone());
    let mut s = session(&compiled, Strategy::SHIFT_2X);
    let mut token = 1u32;
    let mut text = Vec::new();
    let mut worst = 0.0f32;
    for pos in 0..256 {
        let reference = float.forward(token, pos).expect("float forward").to_vec();
        let logits = s.decode(token).expect("decode").to_vec();
        for (a, b) in reference.iter().zip(&logits) {
            worst = worst.max((a - b).abs());
        }
        let next = model::ops::argmax(&reference) as u32;
        assert_eq!(
            next,
            model::ops::argmax(&logits) as u32,
            "token {pos} differs"
        );
        if next == 1 || next == 2 {
            break;
        }
        text.extend(tok.decode_piece(token, next));
        token = next;
    }
    assert!(worst <= 1e-4, "max logit difference {worst}");
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside in the park."),
        "{text}"
    );
}

/// Prefill with AR-32 then decode equals AR-1 all the way.
#[test]
fn prefill_with_ar32_equals_ar1_all_the_way() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, DataType::F32, WeightType::F32, &[1, 32]);
    let prompt = tok.encode(
        "Once upon a time, there was a little dog named Max. Max liked to run in the big green park with his friend, a small cat.",
        true,
        false,
    );
    assert!(prompt.len() > 32, "the prompt should need two chunks");
    let mut chunked = session(&compiled, Strategy::Conveyor);
    chunked.prefill(&prompt).expect("prefill");
    let mut stepwise = session(&compiled, Strategy::Conveyor);
    for &t in &prompt {
        stepwise.decode(t).expect("decode");
    }
    let mut worst = 0.0f32;
    let mut token = model::ops::argmax(chunked.last_logits()) as u32;
    for _ in 0..64 {
        for (a, b) in chunked.last_logits().iter().zip(stepwise.last_logits()) {
            worst = worst.max((a - b).abs());
        }
        chunked.decode(token).unwrap();
        stepwise.decode(token).unwrap();
        token = model::ops::argmax(chunked.last_logits()) as u32;
    }
    assert!(worst <= 1e-4, "max logit difference {worst}");
}

/// For one compiled (quantized) model, every strategy yields bit-identical logits at every step.
#[test]
fn all_strategies_give_bit_identical_logits() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, DataType::U8, WeightType::I8, &[1, 32]);
    let prompt = tok.encode(
        "One day, a little girl named Lily found a needle in her room.",
        true,
        false,
    );
    let run = |strategy: Strategy| -> Vec<Vec<u32>> {
        let mut s = session(&compiled, strategy);
        let mut steps = vec![
            s.prefill(&prompt)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
        ];
        // Greedy decode, then a rollback and a different continuation, to exercise every path.
        for i in 0..300 {
            if i == 150 {
                let back = s.len() - 40;
                s.rollback(back).unwrap();
                s.decode(5).unwrap();
            }
            let t = model::ops::argmax(s.last_logits()) as u32;
            let t = if t == 1 || t == 2 { 300 } else { t };
            steps.push(s.decode(t).unwrap().iter().map(|x| x.to_bits()).collect());
        }
        steps
    };
    let reference = run(Strategy::SHIFT_2X);
    for strategy in &STRATEGIES[1..] {
        let other = run(*strategy);
        assert_eq!(reference.len(), other.len());
        for (i, (a, b)) in reference.iter().zip(&other).enumerate() {
            assert!(
                a == b,
                "{strategy:?}: logits of step {i} differ from shift's"
            );
        }
    }
    let staggered = run(Strategy::Shift {
        reserve: kv_manager::Reserve::Factor(1.5),
        stagger: true,
    });
    assert!(staggered == reference, "shift 1.5x staggered differs");
}

/// Generation stops at the context limit with the typed reason, and the session reports it.
#[test]
fn generation_stops_at_the_context_limit() {
    let (ckpt, tok) = model();
    let mut opts = CompileOptions::new(48, vec![1, 8]);
    opts.kv_dtype = DataType::F32;
    opts.weights = WeightType::F32;
    let compiled = Arc::new(compile_ckpt(&ckpt, &[], &opts));
    let mut s = session(&compiled, Strategy::SmartMask);
    let generation = s
        .generate(
            &tok,
            "Once upon a time",
            &htpkv::session::GenerateOptions {
                max_tokens: 1000,
                sampler: Default::default(),
                ..Default::default()
            },
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(
        generation.stop,
        htpkv::session::StopReason::ContextFull,
        "{generation:?}"
    );
    // S = 48: 47 tokens are processed and the 48th is sampled from the last logits.
    assert_eq!(generation.prompt_tokens.len() + generation.tokens.len(), 48);
    assert_eq!(s.len(), 47);
    assert!(s.backend().graphs().len() == 2);
}

/// Greedy decode of `steps` tokens after the session's last logits; the logits of every step as bits.
fn greedy_logits(s: &mut Session<ReferenceBackend>, steps: usize) -> Vec<Vec<u32>> {
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut out = vec![bits(s.last_logits())];
    for _ in 0..steps {
        let token = model::ops::argmax(s.last_logits()) as u32;
        out.push(bits(s.decode(token).expect("decode")));
    }
    out
}

/// Save after a prefill and some decode steps, restore into a fresh session of every strategy
/// (including `shift` -> `smart_mask`): the next logits are bit-identical to never having stopped.
#[test]
fn restoring_a_saved_session_continues_bit_identically_under_every_strategy() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, DataType::U8, WeightType::I8, &[1, 32]);
    let prompt = tok.encode(
        "Once upon a time, there was a big bear who lived in a cave near the river.",
        true,
        false,
    );
    let dir = ScratchDir::new("persist-strategies");
    for saved_under in STRATEGIES {
        let mut uninterrupted = session(&compiled, saved_under);
        uninterrupted.prefill(&prompt).unwrap();
        let head = greedy_logits(&mut uninterrupted, 10);
        let path = dir.join(format!("{}.session", saved_under.name()));
        uninterrupted.save(&path, &[]).unwrap();
        let tail = greedy_logits(&mut uninterrupted, 30);
        for restored_under in STRATEGIES {
            let mut resumed = session(&compiled, restored_under);
            // Some history of its own, which the restore replaces.
            resumed
                .prefill(&tok.encode("A cat sat.", true, false))
                .unwrap();
            resumed.restore(&path).unwrap();
            assert_eq!(resumed.len(), prompt.len() + 10);
            assert_eq!(resumed.tokens()[..prompt.len()], prompt[..]);
            assert_eq!(
                greedy_logits(&mut resumed, 30),
                tail,
                "saved under {}, restored under {}",
                saved_under.name(),
                restored_under.name()
            );
        }
        assert_eq!(head.len(), 11);
    }
}

/// Every bad file is a typed error and leaves the session exactly as it was.
#[test]
fn a_bad_session_file_is_refused_and_changes_nothing() {
    use htpkv::persist::PersistError;
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, DataType::U8, WeightType::I8, &[1, 32]);
    let dir = ScratchDir::new("persist-bad");
    let mut source = session(&compiled, Strategy::SHIFT_2X);
    source
        .prefill(&tok.encode("The sun was warm.", true, false))
        .unwrap();
    let good = dir.join("good.session");
    source.save(&good, &[]).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    // Nothing but the file is left in the directory (the temporary file was renamed).
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

    let mut target = session(&compiled, Strategy::SmartMask);
    target
        .prefill(&tok.encode("A dog ran home.", true, false))
        .unwrap();
    let state = |s: &Session<ReferenceBackend>| {
        (
            s.tokens().to_vec(),
            s.last_logits().to_vec(),
            s.cache().export_rows(),
        )
    };
    let before = state(&target);
    let with_crc = |mut b: Vec<u8>| {
        let crc = ref_backend::crc32(&b[32..]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    };
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("magic only", bytes[..8].to_vec()),
        ("header only", bytes[..32].to_vec()),
        ("truncated", bytes[..bytes.len() - 1].to_vec()),
        ("one byte more", [bytes.clone(), vec![0]].concat()),
        ("far too long", vec![0; bytes.len() * 100]),
    ];
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x10;
    cases.push(("corrupted", flipped));
    let mut magic = bytes.clone();
    magic[0] = b'X';
    cases.push(("magic", magic));
    let mut version = bytes.clone();
    version[8] = 9;
    cases.push(("version", version));
    let mut other_model = bytes.clone();
    other_model[28] ^= 1;
    cases.push(("fingerprint", other_model));
    // A checksummed payload announcing 2^32 - 1 tokens: refused without allocating them.
    let mut huge = bytes.clone();
    let len_at = 32 + 13 + source.cache().spec().encodings.len() * 10;
    huge[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("huge count", with_crc(huge)));
    // Layers and kv-heads swapped: well formed, same sizes, another geometry.
    let mut swapped = bytes.clone();
    assert_ne!(bytes[32..36], bytes[36..40], "layers == kv_heads");
    swapped[32..36].copy_from_slice(&bytes[36..40]);
    swapped[36..40].copy_from_slice(&bytes[32..36]);
    cases.push(("geometry", with_crc(swapped)));
    // Another scale for the first K buffer: same geometry, another calibration.
    let mut encoding = bytes.clone();
    let scale_at = 32 + 13 + 2;
    let scale = f32::from_le_bytes(bytes[scale_at..scale_at + 4].try_into().unwrap());
    encoding[scale_at..scale_at + 4].copy_from_slice(&(scale * 2.0).to_le_bytes());
    cases.push(("encoding", with_crc(encoding)));
    for (what, data) in cases {
        let path = dir.join(format!("{what}.session"));
        std::fs::write(&path, &data).unwrap();
        let err = target.restore(&path).expect_err(what);
        // Issue 21 finding 13: the file is named once, in words (no Rust `Debug` values, no
        // "does not fit" twice).
        let text = chain(&err);
        assert_eq!(
            text.matches(&path.display().to_string()).count(),
            1,
            "{what}: {text}"
        );
        assert!(text.matches("does not fit").count() <= 1, "{what}: {text}");
        assert!(
            !text.contains('{') && !text.contains("PerTensor") && !text.contains("QuantSpec"),
            "{what}: {text}"
        );
        let err = match what {
            "far too long" => {
                assert!(
                    matches!(
                        err,
                        PersistError::File(model::fsio::FileError::TooLarge { .. })
                    ),
                    "{text}"
                );
                continue;
            }
            _ => err.problem(),
        };
        let expected = match what {
            "empty" | "magic only" | "header only" | "truncated" => {
                matches!(err, PersistError::Truncated { .. })
            }
            "huge count" => matches!(
                err,
                PersistError::Truncated {
                    field: "token ids",
                    ..
                }
            ),
            "one byte more" => matches!(err, PersistError::Malformed(_)),
            "corrupted" => matches!(err, PersistError::Checksum { .. }),
            "magic" => matches!(err, PersistError::Magic { .. }),
            "version" => matches!(err, PersistError::Version { found: 9 }),
            "fingerprint" => matches!(err, PersistError::OtherModel { .. }),
            "geometry" | "encoding" => matches!(err, PersistError::Mismatch { .. }),
            _ => unreachable!(),
        };
        assert!(expected, "{what}: {err}");
        assert!(state(&target) == before, "{what} changed the session");
    }
    // Another model: a u16 cache (other geometry), and other AR variants (other graphs).
    for other in [
        compile(&ckpt, &tok, DataType::U16, WeightType::I8, &[1, 32]),
        compile(&ckpt, &tok, DataType::U8, WeightType::I8, &[1, 16]),
    ] {
        let mut s = session(&other, Strategy::Naive);
        let err = s.restore(&good).expect_err("another model");
        assert!(
            matches!(
                err.problem(),
                PersistError::Mismatch { .. } | PersistError::OtherModel { .. }
            ),
            "{err}"
        );
        assert!(s.is_empty());
    }
    // A missing directory: an I/O error naming the path, and no file.
    let missing = dir.join("no/such/dir/x.session");
    let err = source.save(&missing, &[]).expect_err("missing dir");
    assert!(matches!(err, PersistError::File(_)), "{err}");
    assert_eq!(
        err.to_string(),
        format!("cannot create a temporary file for {}", missing.display())
    );
}

/// `generate`, `feed_last`, save, restore, `generate("")` continues the text of one longer run; at a
/// full context `feed_last` drops the last logits, so continuing is refused instead of repeating.
#[test]
fn feed_last_lets_a_resumed_generation_continue_the_same_text() {
    use htpkv::session::{GenerateOptions, SessionError};
    let (ckpt, tok) = model();
    let mut opts = CompileOptions::new(48, vec![1, 8]);
    opts.kv_dtype = DataType::U16;
    let prompts = [tok.encode("Once upon a time", true, false)];
    let compiled = Arc::new(compile_ckpt(&ckpt, &prompts, &opts));
    let options = |max_tokens| GenerateOptions {
        max_tokens,
        sampler: Default::default(),
        ..GenerateOptions::default()
    };
    let dir = ScratchDir::new("persist-feed");
    let path = dir.join("s.session");
    let mut whole = session(&compiled, Strategy::Naive);
    let whole = whole
        .generate(&tok, "A frog", &options(24), &mut |_| true)
        .unwrap();
    let mut first = session(&compiled, Strategy::Conveyor);
    let head = first
        .generate(&tok, "A frog", &options(12), &mut |_| true)
        .unwrap();
    first.feed_last(&head).unwrap();
    first.save(&path, &[]).unwrap();
    let mut second = session(&compiled, Strategy::SHIFT_2X);
    second.restore(&path).unwrap();
    let tail = second
        .generate(&tok, "", &options(12), &mut |_| true)
        .unwrap();
    assert_eq!([head.tokens, tail.tokens].concat(), whole.tokens);
    assert_eq!(format!("{}{}", head.text, tail.text), whole.text);
    // Run to the end of the context, then save: nothing to continue from.
    let rest = second
        .generate(&tok, "", &options(1000), &mut |_| true)
        .unwrap();
    assert_eq!(rest.stop, htpkv::session::StopReason::ContextFull);
    second.feed_last(&rest).unwrap();
    second.save(&path, &[]).unwrap();
    first.restore(&path).unwrap();
    assert!(first.last_logits().is_empty());
    let err = first
        .generate(&tok, "", &options(1), &mut |_| true)
        .unwrap_err();
    assert!(matches!(err, SessionError::Input(_)), "{err}");
}

/// An error and its causes, as `{:#}` of anyhow prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
