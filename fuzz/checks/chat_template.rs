//! Fuzz check of the chat-template path: the bytes up to the first NUL are a template's text, the
//! rest, split at NULs, the contents of alternating user/assistant messages. A template that
//! compiles renders (or fails with a typed error) within its fuel, never writes more than the cap
//! it is given, renders the same text twice, and a limit error names the template's source.

use model::chat::{ChatTemplate, MAX_RENDERED_BYTES, Message};

/// The output cap used here: small, so that the cap is reached often.
const CAP: usize = 64 << 10;

pub fn check(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0);
    let source = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let messages: Vec<Message> = parts
        .take(16)
        .enumerate()
        .map(|(i, text)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            Message::new(role, &String::from_utf8_lossy(text))
        })
        .collect();
    let Ok(template) = ChatTemplate::new(&source, "<s>", "</s>") else {
        return;
    };
    let template = template.named("fuzz.gguf: tokenizer.chat_template");
    for generation_prompt in [true, false] {
        let first = template.render_capped(&messages, generation_prompt, CAP);
        match &first {
            Ok(text) => assert!(text.len() <= CAP, "{} bytes over the cap", text.len()),
            Err(model::Error::TemplateLimit { origin, .. }) => {
                assert_eq!(origin, "fuzz.gguf: tokenizer.chat_template");
            }
            Err(_) => {}
        }
        if let Ok(text) = &first {
            let again = template.render_capped(&messages, generation_prompt, CAP);
            assert_eq!(
                Some(text),
                again.as_ref().ok(),
                "rendering is not deterministic"
            );
        }
    }
    const { assert!(CAP < MAX_RENDERED_BYTES) };
}
