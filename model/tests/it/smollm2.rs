//! SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to f32) end to end: tokenizer, chat template
//! and the float forward's greedy answer.
//!
//! The model comes from `scripts/fetch-smollm2.sh`. When it is absent these tests fail if the
//! environment variable `CI` is set, and otherwise print how to fetch it and pass.

use std::sync::OnceLock;
use std::time::Instant;

use model::gguf::GgufModel;
use model::{ChatTemplate, FloatModel, HfTokenizer, Message};

/// The loaded model, once per test binary; `None` (after saying why) when the file is absent
/// outside CI.
fn smollm2(test: &str) -> Option<&'static GgufModel> {
    static MODEL: OnceLock<Option<GgufModel>> = OnceLock::new();
    let path = test_support::fetched::smollm2_gguf(test)?;
    let m = MODEL.get_or_init(|| {
        let t0 = Instant::now();
        let m = GgufModel::load(&path).expect("SmolLM2 loads");
        eprintln!(
            "loaded and dequantized in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        Some(m)
    });
    m.as_ref()
}

fn tokenizer(m: &GgufModel) -> HfTokenizer {
    HfTokenizer::from_gguf(&m.file).expect("tokenizer from GGUF metadata")
}

const QUESTION: &str = "What is the capital of France?";

#[test]
fn description_matches_the_published_geometry() {
    let Some(m) = smollm2("description_matches_the_published_geometry") else {
        return;
    };
    let c = &m.config;
    let geometry = (
        c.n_layers,
        c.dim,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.hidden_dim,
    );
    assert_eq!(geometry, (30, 576, 9, 3, 64, 1536));
    assert_eq!(
        (c.vocab_size, c.context_length, c.rope.theta),
        (49152, 8192, 1e5)
    );
    assert!(c.tied_output && !c.block.qkv_bias);
    assert_eq!(c.rope.pairing, model::RopePairing::Adjacent);
    assert_eq!((c.special.bos, c.special.eos), (Some(1), Some(2)));
    // The header alone gives the same description.
    assert_eq!(
        &model::describe(&test_support::fetched::smollm2_gguf_path()).unwrap(),
        c
    );
}

#[test]
fn tokenizer_encodes_chatml_specials_words_and_digits() {
    let Some(m) = smollm2("tokenizer_encodes_chatml_specials_words_and_digits") else {
        return;
    };
    let tok = tokenizer(m);
    assert_eq!(tok.vocab_size(), 49152);
    let id = |s: &str| {
        tok.token_to_id(s)
            .unwrap_or_else(|| panic!("{s} is in the vocabulary"))
    };
    assert_eq!((id("<|im_start|>"), id("<|im_end|>")), (1, 2));
    let chat = tok.encode("<|im_start|>user\nHi<|im_end|>", true).unwrap();
    assert_eq!(chat.first(), Some(&1), "{chat:?}");
    assert_eq!(chat.last(), Some(&2), "{chat:?}");
    // Common words are single byte-level BPE tokens (Ġ marks a leading space).
    let words = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "ĠParis", "."];
    let want: Vec<u32> = words.iter().map(|w| id(w)).collect();
    assert_eq!(
        tok.encode("The capital of France is Paris.", false)
            .unwrap(),
        want
    );
    // smollm's pre-tokenizer splits numbers into single digits.
    let digits: Vec<u32> = "2024".chars().map(|c| id(&c.to_string())).collect();
    assert_eq!(tok.encode("2024", false).unwrap(), digits);
    // add_bos_token is false for SmolLM2: nothing is prepended.
    assert_eq!(
        tok.encode("Hi", true).unwrap(),
        tok.encode("Hi", false).unwrap()
    );
    for s in [
        "Hello, world!",
        "  two spaces\nand a newline\t",
        "Ünïcödé — 東京 🙂",
        "x = 3.14159;",
    ] {
        let ids = tok.encode(s, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), s);
    }
    // Streaming: the emoji and CJK characters span several byte-level tokens.
    let s = "Ünïcödé — 東京 🙂 done";
    let ids = tok.encode(s, false).unwrap();
    let mut stream = tok.stream(false);
    let mut text = String::new();
    for &id in &ids {
        text.extend(stream.step(id).unwrap());
    }
    assert_eq!(text, s);
    assert!(ids.len() > s.split(' ').count() + 4, "{ids:?}");
}

#[test]
fn chat_template_renders_chatml_with_default_system_prompt() {
    let Some(m) = smollm2("chat_template_renders_chatml_with_default_system_prompt") else {
        return;
    };
    let t = ChatTemplate::from_gguf(&m.file).unwrap();
    let text = t
        .render_chat(&[Message::new("user", QUESTION)], true)
        .unwrap();
    let want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
                Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
                <|im_start|>assistant\n";
    assert_eq!(text, want);
    let own_system = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
    ];
    let text = t.render_chat(&own_system, false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn float_forward_answers_paris() {
    let Some(m) = smollm2("float_forward_answers_paris") else {
        return;
    };
    let tok = tokenizer(m);
    let t = ChatTemplate::from_gguf(&m.file).unwrap();
    let prompt = t
        .render_chat(&[Message::new("user", QUESTION)], true)
        .unwrap();
    let ids = tok.encode(&prompt, true).unwrap();
    let mut fm = FloatModel::new(m.config.clone(), m.weights.clone(), 256).unwrap();
    let t0 = Instant::now();
    let answer = fm
        .generate_greedy(&ids, 32, &m.config.special.stop_tokens())
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let text = tok.decode(&answer, true).unwrap();
    let n = ids.len() + answer.len();
    eprintln!(
        "{n} forwards in {secs:.2} s ({:.1} tokens/s): {text:?}",
        n as f64 / secs
    );
    assert_eq!(text, "The capital of France is Paris.");
}
