//! `Engine::chat` keeps the KV cache across turns: each turn feeds only what the cache does not
//! hold, and the answers equal those of a fresh engine that prefills the whole conversation.

use htpkv::engine::{Engine, EngineOptions};
use htpkv::sampler::SamplerOptions;
use htpkv::session::GenerateOptions;
use model::Message;
use std::path::PathBuf;

/// stories260K, compiled once into a cache the tests of this binary share.
fn options() -> EngineOptions {
    let cache = test_support::files::shared_dir("chat-cache");
    EngineOptions {
        model_dir: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/stories260K")),
        cache_dir: Some(cache),
        ..EngineOptions::default()
    }
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: SamplerOptions {
            temperature: 0.0,
            top_p: 0.9,
            seed: 1,
            ..SamplerOptions::default()
        },
        ..GenerateOptions::default()
    }
}

fn fresh_answer(messages: &[Message]) -> Vec<u32> {
    let mut engine = Engine::open(&options(), &mut |_| {}).unwrap();
    engine
        .chat(messages, &greedy(12), &mut |_| true)
        .unwrap()
        .tokens
}

#[test]
fn each_turn_feeds_only_new_tokens_and_answers_as_a_fresh_prefill() {
    let mut engine = Engine::open(&options(), &mut |_| {}).unwrap();
    assert!(!engine.has_chat_template());
    let mut messages = vec![Message::new("user", "Once upon a time")];
    let first = engine.chat(&messages, &greedy(12), &mut |_| true).unwrap();
    assert_eq!(engine.stats().prefill_tokens, first.prompt_tokens.len());
    messages.push(Message::new("assistant", &first.text));
    messages.push(Message::new("user", "The cat sat"));

    let cached = engine.session().tokens().to_vec();
    let second = engine.chat(&messages, &greedy(12), &mut |_| true).unwrap();
    // The history is not prefilled again: the turn fed the conversation minus what was cached.
    let text = htpkv::text::ChatFormat::new(None)
        .render(&messages, true)
        .unwrap();
    let full = engine.tokenizer().encode(&text, true);
    let common = cached.iter().zip(&full).take_while(|(a, b)| a == b).count();
    assert!(common > first.prompt_tokens.len(), "history re-fed");
    assert_eq!(second.prompt_tokens, full[common..]);
    assert_eq!(
        engine.stats().prefill_tokens,
        first.prompt_tokens.len() + second.prompt_tokens.len()
    );
    assert_eq!(second.tokens, fresh_answer(&messages));

    // An edited history rolls back to the common prefix, and still answers as a fresh prefill.
    messages[1] = Message::new("assistant", "They played.");
    let third = engine.chat(&messages, &greedy(12), &mut |_| true).unwrap();
    assert_eq!(third.tokens, fresh_answer(&messages));
    assert!(third.prompt_tokens.len() < full.len());
}

/// SmolLM2's GGUF tokenizer through `HfCodec`: the streamed pieces of a text's tokens spell the
/// text again, multi-byte characters included; its stop tokens end generation.
#[test]
fn hf_codec_pieces_spell_the_text_and_stop_at_the_models_stop_tokens() {
    let Some(path) = test_support::fetched::smollm2_gguf("hf_codec_pieces_spell_the_text") else {
        return;
    };
    let model = htpkv::engine::OpenedModel::open(Some(&path), None).unwrap();
    let text = "Paris — café, 東京!\n  Done.";
    let ids = model.codec.encode(text, false);
    let mut bytes = Vec::new();
    let mut prev = 0;
    for &id in &ids {
        bytes.extend(model.codec.decode_piece(prev, id));
        prev = id;
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    for stop in model.config.special.stop_tokens() {
        assert!(model.codec.is_stop(stop));
        assert!(model.codec.decode_piece(prev, stop).is_empty());
    }
    assert!(!model.codec.is_stop(ids[0]));
    assert!(model.chat.has_template());
}

/// A model with a chat template is calibrated on the default conversations rendered with it, then
/// on the story prompts; a model without one on the story prompts alone.
#[test]
fn a_chat_model_is_calibrated_on_conversations_rendered_with_its_template() {
    use htpkv::engine::calibration_sequences;
    use htpkv::session::TextCodec;
    use htpkv::text::ChatFormat;
    use ref_backend::{DEFAULT_CALIBRATION_CHATS, DEFAULT_CALIBRATION_PROMPTS};

    /// One token per byte, BOS = 1.
    struct Bytes;
    impl TextCodec for Bytes {
        fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
            let bos = bos.then_some(1);
            bos.into_iter().chain(text.bytes().map(u32::from)).collect()
        }
        fn decode_piece(&self, _prev: u32, token: u32) -> Vec<u8> {
            vec![token as u8]
        }
    }
    let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
    let template = model::ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let chat = calibration_sequences(&Bytes, &ChatFormat::new(Some(template))).unwrap();
    let plain = calibration_sequences(&Bytes, &ChatFormat::new(None)).unwrap();
    assert_eq!(plain.len(), DEFAULT_CALIBRATION_PROMPTS.len());
    assert_eq!(chat.len(), DEFAULT_CALIBRATION_CHATS.len() + plain.len());
    assert_eq!(chat[DEFAULT_CALIBRATION_CHATS.len()..], plain[..]);
    let (question, answer) = DEFAULT_CALIBRATION_CHATS[0];
    let first: Vec<u8> = chat[0][1..].iter().map(|&t| t as u8).collect();
    let expected = format!("<|user|>{question}<|assistant|>{answer}");
    assert_eq!(String::from_utf8(first).unwrap(), expected);
}

/// A template that writes megabytes (or loops for ever) fails calibration with a limit error
/// instead of handing the tokenizer 100 MB (issue 21, finding 4).
#[test]
fn calibration_stops_a_template_at_its_output_cap_and_fuel() {
    use htpkv::engine::{EngineError, calibration_sequences};
    use htpkv::text::ChatFormat;
    let huge = "{% for i in range(100000) %}{% for m in messages %}{{ m.content }}{% endfor %}\
                {% endfor %}";
    let never = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let tok = model::llama2c::Tokenizer::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/stories260K/tok512.bin"),
        512,
    )
    .unwrap();
    for (source, says) in [(huge, "exceeds"), (never, "steps")] {
        let template = model::ChatTemplate::new(source, "", "")
            .unwrap()
            .named("m.gguf: tokenizer.chat_template");
        let err = calibration_sequences(&tok, &ChatFormat::new(Some(template))).unwrap_err();
        assert!(matches!(err, EngineError::ModelFile(_)), "{err:?}");
        let msg = format!("{:#}", anyhow::Error::from(err));
        assert!(
            msg.contains("m.gguf: tokenizer.chat_template: ") && msg.contains(says),
            "{msg}"
        );
    }
}
