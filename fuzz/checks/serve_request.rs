//! Fuzz check of the server's request path (issue 36) up to the constraint: a body is parsed as a
//! chat request, its `tools`, `tool_choice` and `response_format` checked, and its constraint
//! compiled against a byte vocabulary, as `routes::chat_job` does inside admission. Nothing
//! panics; every refusal is an OpenAI error of status 400.

use htpkv_serve::api::ChatRequest;
use htpkv_serve::constraint::Structured;
use htpkv_structured::Vocabulary;
use model::Message;
use std::sync::Arc;

// Its byte vocabulary (its own check is the `structured` target's).
#[allow(dead_code)]
#[path = "structured.rs"]
mod structured;

pub fn check(data: &[u8]) {
    let Ok(request) = serde_json::from_slice::<ChatRequest>(data) else {
        return;
    };
    let vocab = Arc::new(Vocabulary::new(&structured::Bytes).expect("a byte vocabulary"));
    let prepared = Structured::of(&request).and_then(|s| {
        let messages = vec![Message::new("user", "x")];
        s.prepare(Some(&vocab), messages, false).map(|_| ())
    });
    if let Err(e) = prepared {
        assert_eq!(e.kind.status().as_u16(), 400, "{e}");
    }
}
