//! The crate on a tiny vocabulary: one token per byte, a few longer tokens, and an end token.

use htpkv_runtime::constraint::{Constraint, ConstraintFactory};
use htpkv_runtime::session::{TextCodec, special_bytes};
use htpkv_structured::tools::{self, ToolChoice};
use htpkv_structured::{ErrorKind, OutputFormat, Tool, Vocabulary, parse_tool_calls};
use serde_json::{Value, json};
use std::sync::Arc;

/// Tokens 0..=255 are the bytes, then the longer pieces of `MULTI`, then END.
const MULTI: [&str; 4] = ["ab", "\"a\"", "true", "<tool_call>"];
const END: u32 = 256 + MULTI.len() as u32;

#[derive(Debug)]
struct Tiny;

impl TextCodec for Tiny {
    fn encode(&self, text: &str, _bos: bool) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode_piece(&self, _prev: u32, token: u32) -> Vec<u8> {
        match token {
            0..=255 => vec![token as u8],
            t if t < END => MULTI[(t - 256) as usize].as_bytes().to_vec(),
            _ => Vec::new(),
        }
    }
    fn is_stop(&self, token: u32) -> bool {
        token == END
    }
    fn vocab_size(&self) -> Option<usize> {
        Some(END as usize + 1)
    }
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        if token == END {
            special_bytes("<end>")
        } else {
            self.decode_piece(0, token)
        }
    }
}

fn vocab() -> Arc<Vocabulary> {
    Arc::new(Vocabulary::new(&Tiny).unwrap())
}

fn start(format: &OutputFormat) -> Box<dyn Constraint> {
    vocab().compile(format, "test").unwrap().start().unwrap()
}

/// The tokens allowed next.
fn allowed(c: &mut Box<dyn Constraint>) -> Vec<u32> {
    let mut logits = vec![0.0; END as usize + 3];
    c.mask(&mut logits).unwrap();
    assert!(logits[END as usize + 1..].iter().all(|l| l.is_infinite()));
    (0..logits.len() as u32)
        .filter(|&t| logits[t as usize].is_finite())
        .collect()
}

/// Feeds `text` byte by byte: true when every byte is allowed and the text can end there.
fn accepts(format: &OutputFormat, text: &str) -> bool {
    let mut c = start(format);
    for b in text.bytes() {
        if !allowed(&mut c).contains(&u32::from(b)) {
            return false;
        }
        c.commit(u32::from(b)).unwrap();
    }
    allowed(&mut c).contains(&END)
}

/// Greedy generation where the logits prefer `order` (earlier is better) over other tokens.
fn generate(format: &OutputFormat, order: &[u32]) -> String {
    let mut c = start(format);
    let mut out = Vec::new();
    for _ in 0..200 {
        let ok = allowed(&mut c);
        let pick = order
            .iter()
            .find(|t| ok.contains(t))
            .copied()
            .unwrap_or(ok[0]);
        c.commit(pick).unwrap();
        if pick == END {
            return String::from_utf8(out).unwrap();
        }
        out.extend(Tiny.decode_piece(0, pick));
    }
    panic!("no end after 200 tokens: {}", String::from_utf8_lossy(&out));
}

#[test]
fn a_regex_masks_exactly_the_tokens_that_can_continue() {
    let re = OutputFormat::Regex("a+b".into());
    let mut c = start(&re);
    // At the start: `a` and the piece `ab`; not `b`, not the end.
    assert_eq!(allowed(&mut c), vec![u32::from(b'a'), 256]);
    c.commit(256).unwrap();
    // After `ab` the regex is complete: only the end token.
    assert_eq!(allowed(&mut c), vec![END]);
    assert!(accepts(&re, "aaab"));
    assert!(!accepts(&re, "aaa"));
    assert!(!accepts(&re, "ba"));
}

#[test]
fn a_committed_token_outside_the_mask_is_an_error() {
    let mut c = start(&OutputFormat::Regex("[0-9]+".into()));
    let err = c.commit(u32::from(b'x')).unwrap_err();
    assert!(err.0.contains("does not fit"), "{err}");
}

#[test]
fn a_json_schema_allows_only_valid_objects_spaced_like_json_dumps() {
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
        "required": ["a", "b"],
        "additionalProperties": false,
    });
    let f = OutputFormat::JsonSchema(schema);
    assert!(accepts(&f, r#"{"a": 12, "b": true}"#));
    assert!(
        !accepts(&f, r#"{"a":12,"b":true}"#),
        "compact spacing is not the format"
    );
    assert!(
        !accepts(&f, r#"{"a": "12", "b": true}"#),
        "a string is not an integer"
    );
    assert!(!accepts(&f, r#"{"a": 12}"#), "b is required");
    assert!(
        !accepts(&f, r#"{"a": 12, "b": true, "c": 1}"#),
        "no other property"
    );
    // Driven by a model that would rather write anything else: still valid JSON that validates.
    let order: Vec<u32> = [END]
        .into_iter()
        .chain([b'x', b'}', b',', b' ', b'9'].map(u32::from))
        .collect();
    let text = generate(&f, &order);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["a"].is_i64() && v["b"].is_boolean(), "{text}");
}

#[test]
fn json_object_allows_any_object_but_nothing_else() {
    assert!(accepts(&OutputFormat::JsonObject, r#"{"k": [1, "x"]}"#));
    assert!(!accepts(&OutputFormat::JsonObject, "[1]"));
}

#[test]
fn a_lark_grammar_constrains_too() {
    let g = OutputFormat::Lark("start: \"yes\" | \"no\"".into());
    assert!(accepts(&g, "yes"));
    assert!(!accepts(&g, "maybe"));
}

#[test]
fn bad_formats_are_errors_of_the_request_naming_the_field() {
    let v = vocab();
    let cases = [
        OutputFormat::JsonSchema(json!({"type": "no-such-type"})),
        OutputFormat::JsonSchema(json!(42)),
        OutputFormat::Regex("(unclosed".into()),
        OutputFormat::Lark("start: undefined_rule".into()),
    ];
    for f in &cases {
        let err = v.compile(f, "response_format.json_schema").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(
            err.to_string().starts_with("response_format.json_schema: "),
            "{err}"
        );
    }
    let err = v.compile(&cases[2], "regex").unwrap_err();
    assert!(
        std::error::Error::source(&err).is_some(),
        "llguidance's error is the source"
    );
}

#[test]
fn response_format_maps_from_openai_json() {
    let f = |v: Value| OutputFormat::from_response_format(&v);
    assert_eq!(f(json!({"type": "text"})).unwrap(), None);
    assert_eq!(
        f(json!({"type": "json_object"})).unwrap(),
        Some(OutputFormat::JsonObject)
    );
    let schema = json!({"type": "object"});
    assert_eq!(
        f(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})).unwrap(),
        Some(OutputFormat::JsonSchema(schema))
    );
    let err = f(json!({"type": "json_schema", "json_schema": {"name": "x"}})).unwrap_err();
    assert_eq!(err.what(), "response_format.json_schema.schema");
    assert_eq!(
        f(json!({"type": "xml"})).unwrap_err().what(),
        "response_format.type"
    );
}

#[test]
fn a_tokenizer_without_a_vocabulary_or_an_end_cannot_be_constrained() {
    #[derive(Debug)]
    struct NoVocab;
    impl TextCodec for NoVocab {
        fn encode(&self, _: &str, _: bool) -> Vec<u32> {
            Vec::new()
        }
        fn decode_piece(&self, _: u32, _: u32) -> Vec<u8> {
            Vec::new()
        }
    }
    let err = Vocabulary::new(&NoVocab).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}

fn weather() -> Vec<Tool> {
    tools::parse_tools(&json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer"}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now"}}
    ]))
    .unwrap()
}

#[test]
fn tools_and_choices_read_openai_json_and_refuse_what_is_wrong() {
    let t = weather();
    assert_eq!(t[1].function.parameters, None);
    let err = |v: Value| tools::parse_tools(&v).unwrap_err().what().to_owned();
    let f = |name: &str| json!({"type": "function", "function": {"name": name}});
    assert_eq!(err(json!({})), "tools");
    assert_eq!(err(json!([f("a"), f("a")])), "tools[1].function.name");
    assert_eq!(err(json!([f("a b")])), "tools[0].function.name");
    assert_eq!(
        err(json!([{"type": "retrieval", "function": {"name": "a"}}])),
        "tools[0].type"
    );
    assert_eq!(
        err(json!([{"type": "function", "function": {"name": "a", "parameters": 3}}])),
        "tools[0].function.parameters"
    );
    assert_eq!(err(json!([{"type": "function"}])), "tools[0]");
    let choice = |v: Value| ToolChoice::from_json(&v);
    assert_eq!(choice(json!("auto")).unwrap(), ToolChoice::Auto);
    assert_eq!(choice(json!("required")).unwrap(), ToolChoice::Required);
    let named = choice(json!({"type": "function", "function": {"name": "now"}})).unwrap();
    assert_eq!(named, ToolChoice::Function("now".into()));
    assert!(named.check(&t).is_ok());
    assert!(choice(json!(3)).is_err());
    let unknown = ToolChoice::Function("rain".into()).check(&t).unwrap_err();
    assert_eq!(unknown.what(), "tool_choice.function.name");
    assert!(ToolChoice::Required.check(&[]).is_err());
}

#[test]
fn required_tool_calls_are_constrained_to_valid_calls() {
    let t = weather();
    let f = tools::tool_call_format(&t, &ToolChoice::Required, true)
        .unwrap()
        .unwrap();
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    assert!(accepts(&f, call));
    assert!(accepts(&f, &format!("{call}\n{call}")), "parallel calls");
    assert!(!accepts(&f, "Sure!"));
    let bad_args = call.replace("2}", "\"2\"}");
    assert!(!accepts(&f, &bad_args), "days must be an integer");
    assert!(!accepts(&f, &call.replace("get_weather", "get_rain")));
    let long_city = call.replace("Paris", "Parisparisparis");
    assert!(!accepts(&f, &long_city), "maxLength 12");
    // One call only without `parallel`, and only the named function when one is named.
    let one = tools::tool_call_format(&t, &ToolChoice::Required, false)
        .unwrap()
        .unwrap();
    assert!(!accepts(&one, &format!("{call}\n{call}")));
    let now = tools::tool_call_format(&t, &ToolChoice::Function("now".into()), false)
        .unwrap()
        .unwrap();
    assert!(!accepts(&now, call));
    assert!(accepts(
        &now,
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
    ));
    // What a greedy run makes of it parses as a valid call.
    let text = generate(&one, &[END]);
    let parsed = parse_tool_calls(&text, &t);
    assert_eq!(parsed.tool_calls.len(), 1, "{text}");
    assert!(
        parsed.malformed.is_empty() && parsed.content.is_empty(),
        "{parsed:?}"
    );
    assert_eq!(
        tools::tool_call_format(&t, &ToolChoice::Auto, true).unwrap(),
        None
    );
}

#[test]
fn calls_are_parsed_from_the_answer_and_malformed_ones_reported() {
    let t = weather();
    let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": \"{}\"}</tool_call>";
    let p = parse_tool_calls(text, &t);
    assert_eq!(p.content, "Let me look.");
    assert_eq!(p.tool_calls.len(), 2);
    assert_eq!(p.tool_calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
    assert_eq!(args, json!({"city": "Oslo", "days": 1}));
    assert_eq!(
        p.tool_calls[1].arguments, "{}",
        "a JSON string of arguments is read"
    );
    assert_ne!(p.tool_calls[0].id, p.tool_calls[1].id);
    assert!(p.tool_calls[0].id.starts_with("call_"));
    assert_eq!(
        p.tool_calls[0].to_openai()["function"]["name"],
        "get_weather"
    );
    // The text form reads back as the same call.
    let again = parse_tool_calls(&p.tool_calls[0].to_text(), &t);
    assert_eq!(again.tool_calls[0].arguments, p.tool_calls[0].arguments);

    // Unclosed at the end of the text: still a call.
    let p = parse_tool_calls("<tool_call>{\"name\": \"now\", \"arguments\": {}}", &t);
    assert_eq!(p.tool_calls.len(), 1);
    // A bare call object, as some models answer.
    let p = parse_tool_calls(" {\"name\": \"now\", \"parameters\": {}} ", &t);
    assert_eq!((p.tool_calls.len(), p.content.as_str()), (1, ""));

    for (bad, why) in [
        (
            "<tool_call>{\"name\": \"now\", \"arguments\": {}</tool_call>",
            "not JSON",
        ),
        (
            "<tool_call>{\"name\": \"rain\", \"arguments\": {}}</tool_call>",
            "not one of the tools",
        ),
        (
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "no string `name`",
        ),
        (
            "<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>",
            "not an object",
        ),
        (
            "<tool_call>{\"name\": \"now\"}</tool_call>",
            "no `arguments`",
        ),
    ] {
        let p = parse_tool_calls(&format!("ok {bad}"), &t);
        assert!(p.tool_calls.is_empty(), "{bad}");
        assert_eq!(p.malformed.len(), 1, "{bad}");
        assert!(
            p.malformed[0].reason.contains(why),
            "{bad}: {}",
            p.malformed[0].reason
        );
        assert_eq!(
            p.content,
            format!("ok {bad}"),
            "a malformed call stays in the text"
        );
    }
    let plain = parse_tool_calls("Just text.", &t);
    assert_eq!(
        (plain.content.as_str(), plain.tool_calls.len()),
        ("Just text.", 0)
    );
}

#[test]
fn the_tool_prompt_goes_into_the_system_message_unless_the_choice_is_none() {
    use model::Message;
    let t = weather();
    let m = [
        Message::new("system", "Be brief."),
        Message::new("user", "Weather?"),
    ];
    let out = tools::with_tool_prompt(&m, &t, &ToolChoice::Required);
    assert_eq!(out.len(), 2);
    assert!(out[0].content.starts_with("Be brief.\n\n"));
    assert!(out[0].content.contains("\"get_weather\"") && out[0].content.contains("<tool_call>"));
    let bare = tools::with_tool_prompt(&m[1..], &t, &ToolChoice::Auto);
    assert_eq!((bare.len(), bare[0].role.as_str()), (2, "system"));
    assert_eq!(
        tools::with_tool_prompt(&m, &t, &ToolChoice::None),
        m.to_vec()
    );
    let v = vocab();
    let chat = htpkv_structured::prepare_tool_chat(&v, &m, &t, &ToolChoice::Required, false, true)
        .unwrap();
    assert_eq!(
        chat.messages,
        m.to_vec(),
        "a template that takes tools gets them itself"
    );
    assert_eq!(
        chat.template_tools.unwrap()[0]["function"]["name"],
        "get_weather"
    );
    assert!(chat.constraint.is_some());
    let auto =
        htpkv_structured::prepare_tool_chat(&v, &m, &t, &ToolChoice::Auto, true, false).unwrap();
    assert!(auto.constraint.is_none() && auto.template_tools.is_none());
    assert_ne!(auto.messages, m.to_vec());
}

#[path = "unit/guard.rs"]
mod guard;
