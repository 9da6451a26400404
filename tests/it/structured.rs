//! Structured output and tool calls on SmolLM2-135M-Instruct (49k-token byte-level BPE vocabulary)
//! through the API a server uses: `htpkv::structured` compiles the constraint, `Engine::chat`
//! applies it. The output is checked by hand-written field and type checks, independent of
//! llguidance.
//!
//! The model comes from `scripts/fetch-smollm2.sh`; when it is absent these tests fail if `CI` is
//! set and otherwise print how to fetch it and pass. One compiled model (f32 weights and KV,
//! context 384) is shared by the tests of this file.

use htpkv::engine::{Engine, EngineOptions, Model};
use htpkv::session::{GenerateOptions, StopReason};
use htpkv::structured::{
    OutputFormat, ToolChoice, Vocabulary, parse_tool_calls, parse_tools, prepare_tool_chat,
};
use model::Message;
use quant::DataType;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The shared model and its vocabulary; `None` when SmolLM2 is not fetched (outside CI).
fn smollm2(test: &str) -> Option<(Arc<Model>, Arc<Vocabulary>)> {
    static MODEL: OnceLock<(Arc<Model>, Arc<Vocabulary>)> = OnceLock::new();
    let path = test_support::fetched::smollm2_gguf(test)?;
    Some(
        MODEL
            .get_or_init(|| {
                let options = EngineOptions {
                    model_dir: Some(path),
                    kv_dtype: DataType::F32,
                    weights: "f32".into(),
                    context: Some(384),
                    ar: vec![1, 32],
                    cache_dir: Some(test_support::files::shared_dir("structured-smollm2")),
                    ..EngineOptions::default()
                };
                let model = Arc::new(Model::open(&options, &mut |_| {}).expect("SmolLM2 opens"));
                let started = Instant::now();
                let vocab = Vocabulary::new(model.tokenizer()).expect("vocabulary");
                eprintln!(
                    "vocabulary of {} tokens: {:?}",
                    vocab.size(),
                    started.elapsed()
                );
                (model, Arc::new(vocab))
            })
            .clone(),
    )
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions::new(max_tokens, Default::default())
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "minLength": 1, "maxLength": 20},
            "likes_pets": {"type": "boolean"},
        },
        "required": ["name", "age", "city", "likes_pets"],
        "additionalProperties": false,
    })
}

/// The checks of `person_schema`, by hand.
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "city", "likes_pets", "name"], "{text}");
    for key in ["name", "city"] {
        let s = o[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} not a string: {text}"));
        assert!((1..=20).contains(&s.chars().count()), "{key}: {text}");
    }
    let age = o["age"]
        .as_i64()
        .unwrap_or_else(|| panic!("age not an integer: {text}"));
    assert!((0..=120).contains(&age), "{text}");
    assert!(o["likes_pets"].is_boolean(), "{text}");
}

#[test]
fn smollm2_json_schema_output_parses_and_validates_for_every_prompt() {
    let Some((model, vocab)) = smollm2("smollm2_json_schema") else {
        return;
    };
    let grammar = vocab
        .compile(
            &OutputFormat::JsonSchema(person_schema()),
            "response_format.json_schema",
        )
        .unwrap();
    let mut options = greedy(64);
    options.constraint = Some(grammar.factory());
    let prompts = [
        "Describe Alice, a 30 year old teacher from Paris who has a cat, as JSON.",
        "Give me a JSON record for Bob from Berlin.",
        "Invent a person and answer with JSON.",
        "My grandmother Maria is 87 and lives in Rome. Write her record.",
        "Tell me a joke.",
    ];
    let mut engine = Engine::on(Arc::clone(&model)).unwrap();
    let started = Instant::now();
    let mut tokens = 0;
    // No reset between prompts: the chat reuses the cached system prompt (prefix reuse).
    for prompt in prompts {
        let g = engine
            .chat(&[Message::new("user", prompt)], &options, &mut |_| true)
            .unwrap();
        eprintln!("{prompt} -> {}", g.text);
        assert_eq!(g.stop, StopReason::EndOfText, "{}", g.text);
        check_person(&g.text);
        tokens += g.tokens.len();
    }
    let stats = grammar.stats();
    eprintln!(
        "{tokens} tokens in {:?}; masks: {} at {:.3} ms/token",
        started.elapsed(),
        stats.masks,
        stats.ms_per_token()
    );
    assert_eq!(
        stats.masks as usize,
        tokens + prompts.len(),
        "one mask per sampled token"
    );
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 24},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": false,
            }}},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                           "required": ["city"], "additionalProperties": false}}}
    ])
}

#[test]
fn smollm2_required_tool_choice_makes_calls_whose_arguments_validate() {
    let Some((model, vocab)) = smollm2("smollm2_tool_calls") else {
        return;
    };
    let tools = parse_tools(&weather_tools()).unwrap();
    let mut engine = Engine::on(Arc::clone(&model)).unwrap();
    assert!(
        !engine.template_takes_tools(),
        "SmolLM2's template has no tools"
    );
    let cases = [
        (ToolChoice::Required, "What is the weather like in Paris?"),
        (
            ToolChoice::Function("get_time".into()),
            "What time is it in Tokyo?",
        ),
    ];
    for (choice, question) in cases {
        let messages = [Message::new("user", question)];
        let chat = prepare_tool_chat(&vocab, &messages, &tools, &choice, false, false).unwrap();
        assert_eq!(
            chat.messages[0].role, "system",
            "the fallback prompt describes the tools"
        );
        let mut options = greedy(64);
        options.constraint = chat.constraint.as_ref().map(|g| g.factory());
        let g = engine
            .chat(&chat.messages, &options, &mut |_| true)
            .unwrap();
        eprintln!("{question} -> {}", g.text);
        assert_eq!(g.stop, StopReason::EndOfText, "{}", g.text);
        let parsed = parse_tool_calls(&g.text, &tools);
        assert!(
            parsed.malformed.is_empty() && parsed.content.is_empty(),
            "{parsed:?}"
        );
        let [call] = &parsed.tool_calls[..] else {
            panic!("one call expected: {parsed:?}");
        };
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        let city = args["city"].as_str().expect("city is a string");
        assert!(!city.is_empty() && city.chars().count() <= 24, "{args}");
        match call.name.as_str() {
            "get_weather" => {
                assert!(
                    matches!(args["unit"].as_str(), Some("celsius" | "fahrenheit")),
                    "{args}"
                );
                assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
            }
            "get_time" => assert_eq!(args.as_object().unwrap().len(), 1, "{args}"),
            other => panic!("unknown function {other}"),
        }
        if let ToolChoice::Function(name) = &choice {
            assert_eq!(&call.name, name);
        }
    }
}
