//! `--json-schema`, `--regex`, `--grammar` and `--tools` on the embedded stories260K model (its
//! llama2.c tokenizer of 512 pieces): the output follows the constraint, checked here by hand.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::{htpkv, htpkv_with_stdin, ok_json};
use serde_json::Value;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

fn failure(o: &Output) -> String {
    assert!(!o.status.success(), "unexpected success");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The text is ` w w w.`: 3 to 6 lowercase words, each after one space, and a full stop.
fn is_short_sentence(text: &str) -> bool {
    let Some(body) = text.strip_suffix('.') else {
        return false;
    };
    let words: Vec<&str> = body.split(' ').collect();
    words[0].is_empty()
        && (3..=6).contains(&(words.len() - 1))
        && words[1..]
            .iter()
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
}

#[test]
fn a_regex_constrains_the_story_model() {
    let cache = ScratchDir::new("structured_cli-regex");
    let dir = stories260k_dir();
    let re = r" [a-z]+( [a-z]+){2,5}\.";
    let o = htpkv(
        &[
            "generate",
            "Once upon a time",
            "--model",
            dir.to_str().unwrap(),
            "--regex",
            re,
            "--steps",
            "40",
            "--json",
        ],
        &cache,
    );
    let doc = ok_json(&o);
    let text = doc["text"].as_str().unwrap();
    assert!(is_short_sentence(text), "{text:?}");
    assert_eq!(doc["finish_reason"], "stop", "{doc}");
    let masks = doc["constraint"]["masks"].as_u64().unwrap();
    assert_eq!(masks as usize, doc["tokens"].as_array().unwrap().len() + 1);
    // Without the constraint the same greedy run is not such a sentence.
    let free = htpkv(
        &[
            "generate",
            "Once upon a time",
            "--model",
            dir.to_str().unwrap(),
            "--steps",
            "40",
            "--json",
        ],
        &cache,
    );
    assert!(!is_short_sentence(ok_json(&free)["text"].as_str().unwrap()));
}

/// Issue 36: with an empty prompt the first token follows BOS, after which the tokenizer drops a
/// leading space; the reported text is still the one the grammar accepted, leading space included.
#[test]
fn a_regex_after_bos_alone_reports_the_text_the_grammar_accepted() {
    let cache = ScratchDir::new("structured_cli-regex-empty");
    let dir = stories260k_dir();
    let re = r" [a-z]+( [a-z]+){2,5}\.";
    let args = [
        "generate",
        "",
        "--model",
        dir.to_str().unwrap(),
        "--regex",
        re,
    ];
    let o = htpkv(&[&args[..], &["--steps", "40", "--json"]].concat(), &cache);
    let doc = ok_json(&o);
    let text = doc["text"].as_str().unwrap();
    assert!(is_short_sentence(text), "{text:?}");
    assert_eq!(doc["finish_reason"], "stop", "{doc}");
}

/// Short, so that the tool prompt fits the story model's context of 512 tokens.
const TOOLS: &str = r#"[
  {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                  "unit": {"enum": ["C", "F"]}},
   "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "time"}}
]"#;

#[test]
fn required_tools_give_a_valid_call_in_generate_and_chat() {
    let cache = ScratchDir::new("structured_cli-tools");
    let tools = write(&cache, "tools.json", TOOLS);
    let dir = stories260k_dir();
    let common = [
        "--model",
        dir.to_str().unwrap(),
        "--tools",
        tools.to_str().unwrap(),
        "--steps",
        "60",
    ];
    let o = htpkv(
        &[
            &["generate", "--chat", "Is it raining in Oslo?", "--json"],
            &common[..],
            &["--tool-choice", "required", "--single-call"],
        ]
        .concat(),
        &cache,
    );
    let doc = ok_json(&o);
    let calls = doc["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{doc}");
    assert_eq!(calls[0]["type"], "function");
    let f = &calls[0]["function"];
    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
    match f["name"].as_str().unwrap() {
        "weather" => {
            let city = args["city"].as_str().unwrap();
            assert!((1..=12).contains(&city.chars().count()), "{args}");
            assert!(matches!(args["unit"].as_str(), Some("C" | "F")), "{args}");
            assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
        }
        "time" => assert_eq!(args, serde_json::json!({})),
        other => panic!("unknown function {other}"),
    }
    assert_eq!(doc["content"], "", "{doc}");
    assert_eq!(doc["malformed_tool_calls"], serde_json::json!([]));

    // `htpkv chat` with a named function: the call is printed after the answer.
    let o = htpkv_with_stdin(
        &[&["chat"], &common[..], &["--tool-choice", "time"]].concat(),
        &cache,
        "What time is it?\n",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = out
        .lines()
        .find(|l| l.starts_with("tool call "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.ends_with(": time {}"), "{line}");
}

#[test]
fn constraint_options_are_refused_where_they_would_not_apply() {
    let cache = ScratchDir::new("structured_cli-refused");
    let dir = stories260k_dir();
    let model = ["--model", dir.to_str().unwrap()];
    let run = |extra: &[&str]| htpkv(&[&["generate"], &model[..], extra].concat(), &cache);
    let schema = write(&cache, "bad.json", r#"{"type": "no-such-type"}"#);
    let tools = write(&cache, "tools.json", TOOLS);
    let err = failure(&run(&[
        "--json-schema",
        schema.to_str().unwrap(),
        "--regex",
        "a",
    ]));
    assert!(err.contains("cannot be used with"), "{err}");
    let err = failure(&run(&["--regex", "a+", "--beams", "2"]));
    assert!(err.contains("--beams cannot be combined"), "{err}");
    let err = failure(&run(&["--regex", "a+", "--speculate", "prompt-lookup"]));
    assert!(err.contains("--speculate cannot be combined"), "{err}");
    let err = failure(&run(&["--tools", tools.to_str().unwrap()]));
    assert!(err.contains("--tools needs --chat"), "{err}");
    let err = failure(&run(&["--json-schema", schema.to_str().unwrap()]));
    assert!(err.contains("--json-schema: "), "{err}");
    let err = failure(&run(&["--regex", "(open"]));
    assert!(err.contains("--regex: "), "{err}");
    let t = tools.to_str().unwrap();
    let err = failure(&run(&[
        "--chat",
        "Hi",
        "--tools",
        t,
        "--tool-choice",
        "rain",
    ]));
    assert!(err.contains("`rain` is not one of the tools"), "{err}");
}
