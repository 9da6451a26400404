//! Structured output for htpkv: JSON schema, regex and grammar constraints, and tool calls.
//!
//! The runtime knows constrained decoding only as a seam
//! ([`htpkv_runtime::constraint`]): before each sample the logits are masked, after it the token
//! is committed. This crate fills the seam with llguidance, which computes the mask of a whole
//! vocabulary from a grammar's state:
//!
//! 1. [`Vocabulary::new`] reads a tokenizer's token bytes once per model
//!    ([`htpkv_runtime::session::TextCodec::token_bytes`]);
//! 2. [`Vocabulary::compile`] turns an [`OutputFormat`] (a JSON schema, OpenAI's `json_object`, a
//!    regex, a Lark grammar) into a [`Grammar`], checked at once (a bad schema is an error of the
//!    request, not of the generation);
//! 3. the grammar goes into `GenerateOptions::constraint` ([`Grammar::factory`]); every generation
//!    starts its own parser state. A finished grammar allows only the model's stop tokens, so the
//!    generation ends normally. [`Grammar::stats`] says what masking cost.
//!
//! [`tools`] is tool calling in chat: OpenAI's `tools` and `tool_choice` in, [`ToolCall`]s out;
//! [`prepare_tool_chat`] is the whole request side for a server.
//!
//! Generated JSON is spaced like Python's `json.dumps` (`", "` and `": "`, no other whitespace)
//! unless a schema sets llguidance's own `x-guidance` options.

#![forbid(unsafe_code)]

mod error;
mod format;
mod grammar;
pub mod guard;
pub mod tools;

pub use error::{ErrorKind, StructuredError};
pub use format::OutputFormat;
pub use grammar::{Grammar, MaskStats, Vocabulary};
pub use tools::{Tool, ToolCall, ToolChoice, parse_tool_calls, parse_tools};

use model::Message;
use std::sync::Arc;

/// What a chat request with tools turns into ([`prepare_tool_chat`]).
#[derive(Debug)]
pub struct ToolChat {
    /// The conversation to render: with the tool system message when the template does not take
    /// tools (and the choice is not `none`).
    pub messages: Vec<Message>,
    /// The `tools` to pass to a template that takes them (`Engine::set_template_tools`).
    pub template_tools: Option<serde_json::Value>,
    /// The constraint of `required` or a named function (`GenerateOptions::constraint`).
    pub constraint: Option<Arc<Grammar>>,
}

/// The request side of a chat with `tools` and `choice`: where the tools are described (the
/// template when `template_takes_tools`, else a system message) and the constraint that
/// `required` or a named function imposes (one call unless `parallel`). Parse the answer with
/// [`parse_tool_calls`]. With [`ToolChoice::None`] or no tools, nothing changes.
pub fn prepare_tool_chat(
    vocab: &Arc<Vocabulary>,
    messages: &[Message],
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    template_takes_tools: bool,
) -> Result<ToolChat, StructuredError> {
    let constraint = tool_chat_constraint(vocab, tools, choice, parallel)?;
    let (messages, template_tools) =
        tool_chat_messages(messages, tools, choice, template_takes_tools);
    Ok(ToolChat {
        messages,
        template_tools,
        constraint,
    })
}

/// The constraint half of [`prepare_tool_chat`]: the grammar of `required` or a named function
/// (`None` for `auto` and `none`). A server compiles it once the prompt is known to fit.
pub fn tool_chat_constraint(
    vocab: &Arc<Vocabulary>,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<Arc<Grammar>>, StructuredError> {
    let format = tools::tool_call_format(tools, choice, parallel)?;
    format.map(|f| vocab.compile(&f, "tools")).transpose()
}

/// The conversation half of [`prepare_tool_chat`]: the messages to render and the `tools` for a
/// template that takes them.
pub fn tool_chat_messages(
    messages: &[Message],
    tools: &[Tool],
    choice: &ToolChoice,
    template_takes_tools: bool,
) -> (Vec<Message>, Option<serde_json::Value>) {
    let shown = !tools.is_empty() && *choice != ToolChoice::None;
    if !shown {
        (messages.to_vec(), None)
    } else if template_takes_tools {
        (messages.to_vec(), Some(serde_json::json!(tools)))
    } else {
        (tools::with_tool_prompt(messages, tools, choice), None)
    }
}
