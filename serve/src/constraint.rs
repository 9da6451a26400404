//! Constrained output: `tools`, `tool_choice` and `response_format`, through `htpkv_structured`
//! (llguidance).
//!
//! [`Structured::of`] parses and checks the request fields (with the structured crate's parsers,
//! so the CLI and the server read OpenAI's shapes the same way); [`Structured::prepare`] is the one
//! place that turns them into the conversation to render (tools in the template, or the tool
//! system message) and the decoding constraint; [`Structured::tool_calls_in`] turns the answer
//! back into OpenAI's `tool_calls`.

use crate::api::ChatRequest;
use crate::error::{ApiError, ErrorKind};
use htpkv_runtime::constraint::ConstraintFactory;
use htpkv_structured::{
    OutputFormat, StructuredError, Tool, ToolChoice, Vocabulary, parse_tool_calls, parse_tools,
    tool_chat_constraint, tool_chat_messages,
};
use model::Message;
use serde_json::Value;
use std::sync::Arc;

/// The checked `tools`, `tool_choice` and `response_format` of a chat request.
#[derive(Debug, Clone)]
pub struct Structured {
    pub tools: Vec<Tool>,
    /// As given, else `auto` with tools and `none` without (OpenAI's defaults).
    pub tool_choice: ToolChoice,
    /// `json_object` or `json_schema` (`None`: free text).
    pub format: Option<OutputFormat>,
    /// `parallel_tool_calls` (OpenAI's default: true).
    pub parallel: bool,
}

/// What a request renders and how its answer is constrained.
#[derive(Debug)]
pub struct Prepared {
    pub messages: Vec<Message>,
    /// `tools` for a chat template that takes them.
    pub template_tools: Option<Value>,
    pub constraint: Option<Arc<dyn ConstraintFactory>>,
}

impl From<StructuredError> for ApiError {
    fn from(e: StructuredError) -> ApiError {
        let kind = match e.kind() {
            htpkv_structured::ErrorKind::Unsupported => ErrorKind::Unsupported,
            _ => ErrorKind::BadRequest,
        };
        let param = e
            .what()
            .split(['.', '[', ' '])
            .next()
            .unwrap_or("messages")
            .to_owned();
        ApiError::new(kind, e.to_string())
            .with_param(&param)
            .with_source(e)
    }
}

impl Structured {
    /// Parses and checks the fields: tools are functions with unique, well-formed names and
    /// object schemas; a named or `required` choice needs tools, and a named one must be among
    /// them; a response format is a valid JSON schema (compiled in [`Structured::prepare`]).
    pub fn of(request: &ChatRequest) -> Result<Structured, ApiError> {
        let tools = match &request.tools {
            Some(v) => parse_tools(v)?,
            None => Vec::new(),
        };
        let tool_choice = match &request.tool_choice {
            Some(v) => ToolChoice::from_json(v)?,
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
        };
        tool_choice.check(&tools)?;
        let format = match &request.response_format {
            Some(v) => OutputFormat::from_response_format(v)?,
            None => None,
        };
        let s = Structured {
            tools,
            tool_choice,
            format,
            parallel: request.parallel_tool_calls.unwrap_or(true),
        };
        if s.may_call_tools() && s.format.is_some() {
            return Err(ApiError::bad_param(
                "response_format",
                "response_format json_object/json_schema and tool calls exclude each other: send \
                 one, or tool_choice \"none\"",
            ));
        }
        Ok(s)
    }

    /// True when the answer may be a tool call.
    pub fn may_call_tools(&self) -> bool {
        !self.tools.is_empty() && self.tool_choice != ToolChoice::None
    }

    /// True when the request needs the model's vocabulary (a constraint, or a tool call to parse).
    pub fn needs_vocabulary(&self) -> bool {
        self.may_call_tools() || self.format.is_some()
    }

    /// The conversation to render and the constraint ([`Structured::conversation`] and
    /// [`Structured::constraint`] together).
    pub fn prepare(
        &self,
        vocab: Option<&Arc<Vocabulary>>,
        messages: Vec<Message>,
        template_takes_tools: bool,
    ) -> Result<Prepared, ApiError> {
        let constraint = self.constraint(vocab)?;
        let (messages, template_tools) = self.conversation(messages, template_takes_tools);
        Ok(Prepared {
            messages,
            template_tools,
            constraint,
        })
    }

    /// The conversation to render: with the tools in a system message, or the tools for a
    /// template that takes them, when the answer may be a tool call.
    pub fn conversation(
        &self,
        messages: Vec<Message>,
        template_takes_tools: bool,
    ) -> (Vec<Message>, Option<Value>) {
        if !self.may_call_tools() {
            return (messages, None);
        }
        tool_chat_messages(
            &messages,
            &self.tools,
            &self.tool_choice,
            template_takes_tools,
        )
    }

    /// The constraint: a response format's grammar, or the tool call grammar of `required` or a
    /// named function (`auto` is parsed afterwards, unconstrained). Compiling is the costly part
    /// of a request's preparation: the server does it once the prompt is known to fit.
    pub fn constraint(
        &self,
        vocab: Option<&Arc<Vocabulary>>,
    ) -> Result<Option<Arc<dyn ConstraintFactory>>, ApiError> {
        let Some(vocab) = vocab.filter(|_| self.needs_vocabulary()) else {
            return Ok(None);
        };
        let grammar = match &self.format {
            Some(format) => Some(vocab.compile(format, "response_format")?),
            None => tool_chat_constraint(vocab, &self.tools, &self.tool_choice, self.parallel)?,
        };
        Ok(grammar.map(|g| g.factory()))
    }

    /// The tool calls of a finished answer in OpenAI's shape, `None` when it holds none (plain
    /// content, or a request without tools).
    pub fn tool_calls_in(&self, text: &str) -> Option<Vec<Value>> {
        if !self.may_call_tools() {
            return None;
        }
        let parsed = parse_tool_calls(text, &self.tools);
        let calls: Vec<Value> = parsed.tool_calls.iter().map(|c| c.to_openai()).collect();
        (!calls.is_empty()).then_some(calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(extra: Value) -> ChatRequest {
        let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
    }

    #[test]
    fn free_text_needs_no_constraint() {
        for extra in [
            json!({}),
            json!({"response_format": {"type": "text"}}),
            json!({"tools": tools(), "tool_choice": "none"}),
        ] {
            let s = Structured::of(&request(extra.clone())).unwrap();
            assert!(!s.needs_vocabulary(), "{extra}");
            let p = s.prepare(None, vec![], false).unwrap();
            assert!(p.constraint.is_none());
            assert_eq!(s.tool_calls_in("<tool_call>{}</tool_call>"), None);
        }
    }

    #[test]
    fn constrained_requests_need_the_vocabulary() {
        let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}});
        for extra in [
            json!({"response_format": schema}),
            json!({"response_format": {"type": "json_object"}}),
            json!({"tools": tools()}),
            json!({"tools": tools(), "tool_choice": "required"}),
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ] {
            let s = Structured::of(&request(extra.clone())).unwrap();
            assert!(s.needs_vocabulary(), "{extra}");
        }
    }

    #[test]
    fn malformed_tool_fields_are_bad_requests_naming_the_field() {
        for (extra, param) in [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": tools(), "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format",
            ),
            (
                json!({"tools": tools(), "response_format": {"type": "json_object"}}),
                "response_format",
            ),
        ] {
            let e = Structured::of(&request(extra.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
            assert!(
                matches!(e.kind, ErrorKind::BadRequest | ErrorKind::Unsupported),
                "{extra}"
            );
        }
    }
}
