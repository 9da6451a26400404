use super::*;
use test_support::files::ScratchDir;

fn msgs() -> Vec<Message> {
    vec![
        Message::new("user", "  hi \n"),
        Message::new("assistant", "yo"),
    ]
}

#[test]
fn hf_whitespace_rules_and_python_methods() {
    let src = "{% for m in messages %}\n    {{ m.role }}: {{ m.content.strip() }}\n{% endfor %}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one.
    assert_eq!(
        t.render_chat(&msgs(), false).unwrap(),
        "    user: hi\n    assistant: yo\n"
    );
    let src = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{% endfor %}\
               {% if add_generation_prompt %}>{% endif %}{{ eos_token }}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    assert_eq!(
        t.render_chat(&msgs(), true).unwrap(),
        "<s>[user][assistant]></s>"
    );
    assert_eq!(
        t.render_chat(&msgs(), false).unwrap(),
        "<s>[user][assistant]</s>"
    );
}

#[test]
fn raise_exception_and_syntax_errors_are_template_errors() {
    let src =
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let err = t.render_chat(&msgs(), true).unwrap_err();
    let Error::Template { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(source.to_string().contains("system first"), "{source}");
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(Error::Template { .. })
    ));
}

fn config_file(dir: &Path, name: &str, json: serde_json::Value) -> std::path::PathBuf {
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, json.to_string()).unwrap();
    p
}

#[test]
fn tokenizer_config_json_string_and_list_forms() {
    let dir = ScratchDir::new("chat-config-forms");
    let p = config_file(
        &dir,
        "string",
        serde_json::json!({"chat_template": "{{ bos_token }}{{ messages[0].content }}",
                           "bos_token": {"content": "<s>"}, "eos_token": "</s>"}),
    );
    let t = ChatTemplate::from_tokenizer_config(&p).unwrap();
    assert_eq!(t.render_chat(&msgs()[1..], false).unwrap(), "<s>yo");
    let p2 = config_file(
        &dir,
        "list",
        serde_json::json!({"chat_template": [{"name": "tool_use", "template": "T"},
                                             {"name": "default", "template": "D{{ eos_token }}"}],
                           "eos_token": "</s>"}),
    );
    let t = ChatTemplate::from_tokenizer_config(&p2).unwrap();
    assert_eq!(t.render_chat(&msgs(), false).unwrap(), "D</s>");
    let p3 = config_file(&dir, "none", serde_json::json!({"eos_token": "</s>"}));
    assert!(matches!(
        ChatTemplate::from_tokenizer_config(&p3),
        Err(Error::HfConfig { .. })
    ));
}

const NESTED_LOOP: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

#[test]
fn a_template_that_loops_for_ever_runs_out_of_fuel_naming_its_source() {
    let dir = ScratchDir::new("chat-config-loop");
    let p = config_file(
        &dir,
        "loop",
        serde_json::json!({"chat_template": NESTED_LOOP}),
    );
    let t = ChatTemplate::from_tokenizer_config(&p).unwrap();
    let started = std::time::Instant::now();
    let err = t.render_chat(&msgs(), true).unwrap_err();
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    let msg = err.to_string();
    assert!(matches!(err, Error::TemplateLimit { .. }), "{err:?}");
    assert!(msg.contains(&p.display().to_string()), "{msg}");
    assert!(
        msg.contains("chat_template") && msg.contains("steps"),
        "{msg}"
    );
}

#[test]
fn rendering_stops_at_the_output_cap() {
    let src = "{% for i in range(1000) %}{{ messages[0].content }}{% endfor %}";
    let t = ChatTemplate::new(src, "", "")
        .unwrap()
        .named("x.gguf: tokenizer.chat_template");
    let long = [Message::new("user", &"y".repeat(1000))];
    assert_eq!(
        t.render_capped(&long, true, 1_000_000).unwrap().len(),
        1_000_000
    );
    let err = t.render_capped(&long, true, 999_999).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("x.gguf: tokenizer.chat_template: "),
        "{msg}"
    );
    assert!(msg.contains("exceeds 999999 bytes"), "{msg}");
    // The cap is never above MAX_RENDERED_BYTES.
    let many = [Message::new("user", &"y".repeat(MAX_RENDERED_BYTES / 999))];
    assert!(matches!(
        t.render_capped(&many, true, usize::MAX),
        Err(Error::TemplateLimit { .. })
    ));
}

#[test]
fn tools_reach_a_template_that_refers_to_them() {
    let source = "{% if tools %}[{{ tools[0].function.name }}]{% endif %}\
                  {% for m in messages %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    assert!(t.mentions_tools());
    let m = [Message::new("user", "hi")];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "now"}}]);
    let with = t
        .render_with_tools(&m, Some(&tools), true, 1 << 10)
        .unwrap();
    assert_eq!(with, "[now]hi");
    assert_eq!(
        t.render_chat(&m, true).unwrap(),
        "hi",
        "no tools: `tools` is undefined"
    );
    let plain = ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}", "", "");
    assert!(!plain.unwrap().mentions_tools());
}
