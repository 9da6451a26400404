//! The seam for constrained output: `tools`, `tool_choice` and `response_format`.
//!
//! The request fields are parsed and checked here ([`Structured::of`]); [`constraint_for`] is the
//! ONE place that turns them into a decoding constraint, and [`tool_calls_in`] the one place that
//! turns a constrained answer back into tool calls. Until the `htpkv_structured` crate
//! (llguidance: JSON schema, regex, grammar; OpenAI's tool-call shapes) is wired in, every request
//! that needs a constraint is refused with a 400 `unsupported` error naming the field; a request
//! with `tool_choice: "none"` or `response_format: {"type":"text"}` needs none and is served.

use crate::api::{
    ChatRequest, ResponseFormat, Tool, ToolChoice, parse_response_format, parse_tool_choice,
};
use crate::error::{ApiError, ErrorKind};
use htpkv_runtime::constraint::ConstraintFactory;
use std::collections::HashSet;
use std::sync::Arc;

/// The checked `tools`, `tool_choice` and `response_format` of a chat request.
#[derive(Debug, Clone)]
pub struct Structured {
    pub tools: Vec<Tool>,
    /// As given, else `auto` with tools and `none` without (OpenAI's defaults).
    pub tool_choice: ToolChoice,
    pub response_format: ResponseFormat,
}

impl Structured {
    /// Parses and checks the fields: tools are functions with unique, well-formed names and
    /// object schemas; a named or `required` choice needs tools, and a named one must be among them.
    pub fn of(request: &ChatRequest) -> Result<Structured, ApiError> {
        let tools = request.tools.clone().unwrap_or_default();
        check_tools(&tools)?;
        let tool_choice = match &request.tool_choice {
            Some(v) => parse_tool_choice(v)?,
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
        };
        match &tool_choice {
            ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice requires a tool call but `tools` is empty",
                ));
            }
            ToolChoice::Function(name) if !tools.iter().any(|t| &t.function.name == name) => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("tool_choice names `{name}`, which is not among `tools`"),
                ));
            }
            _ => {}
        }
        let response_format = match &request.response_format {
            Some(v) => parse_response_format(v)?,
            None => ResponseFormat::Text,
        };
        Ok(Structured {
            tools,
            tool_choice,
            response_format,
        })
    }

    /// True when the answer may be a tool call.
    pub fn may_call_tools(&self) -> bool {
        !self.tools.is_empty() && self.tool_choice != ToolChoice::None
    }
}

fn check_tools(tools: &[Tool]) -> Result<(), ApiError> {
    let mut names = HashSet::new();
    for tool in tools {
        let name = &tool.function.name;
        if tool.kind != "function" {
            return Err(ApiError::bad_param(
                "tools",
                format!("tool type `{}`: only `function` tools exist", tool.kind),
            ));
        }
        let well_formed = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_formed {
            return Err(ApiError::bad_param(
                "tools",
                format!("function name `{name}`: 1 to 64 of a-z, A-Z, 0-9, _ and -"),
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(ApiError::bad_param(
                "tools",
                format!("function `{name}` is listed twice"),
            ));
        }
        if let Some(p) = &tool.function.parameters
            && !p.is_object()
        {
            return Err(ApiError::bad_param(
                "tools",
                format!("function `{name}`: `parameters` must be a JSON schema object"),
            ));
        }
    }
    Ok(())
}

/// The decoding constraint of a request: `None` for free text. THE place where `htpkv_structured`
/// is to be wired in: a JSON schema (`response_format`), any JSON object (`json_object`), and
/// tool calls (`tools` with `tool_choice` `auto`, `required` or a named function, which must
/// constrain the output to a valid call). Until then those are refused with 400 `unsupported`.
pub fn constraint_for(
    structured: &Structured,
) -> Result<Option<Arc<dyn ConstraintFactory>>, ApiError> {
    if structured.may_call_tools() {
        return Err(unsupported(
            "tools",
            "tool calls (tools with tool_choice auto, required or a named function) need \
             constrained decoding, which this server does not have yet; send tool_choice \"none\" \
             or no tools",
        ));
    }
    match &structured.response_format {
        ResponseFormat::Text => Ok(None),
        ResponseFormat::JsonObject | ResponseFormat::JsonSchema { .. } => Err(unsupported(
            "response_format",
            "response_format json_object and json_schema need constrained decoding, which this \
             server does not have yet; send {\"type\":\"text\"} or leave it out",
        )),
    }
}

/// The tool calls in a finished answer, `None` when it is plain content. THE place where the
/// answer of a tool-calling request is to be parsed (with `htpkv_structured`'s tool-call parser)
/// into OpenAI's `tool_calls` (and `finish_reason: "tool_calls"`). [`constraint_for`] refuses
/// every tool-calling request for now, so no answer reaching here can hold a call.
pub fn tool_calls_in(
    _text: &str,
    structured: &Structured,
) -> Result<Option<Vec<serde_json::Value>>, ApiError> {
    debug_assert!(!structured.may_call_tools(), "refused by constraint_for");
    Ok(None)
}

fn unsupported(param: &str, message: &str) -> ApiError {
    ApiError::new(ErrorKind::Unsupported, message).with_param(param)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(extra: serde_json::Value) -> ChatRequest {
        let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    fn tools() -> serde_json::Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
    }

    fn code_of(r: Result<Option<Arc<dyn ConstraintFactory>>, ApiError>) -> &'static str {
        r.expect_err("refused").kind.code()
    }

    #[test]
    fn free_text_needs_no_constraint() {
        for extra in [
            json!({}),
            json!({"response_format": {"type": "text"}}),
            json!({"tools": tools(), "tool_choice": "none"}),
        ] {
            let s = Structured::of(&request(extra.clone())).unwrap();
            assert!(constraint_for(&s).unwrap().is_none(), "{extra}");
            assert_eq!(tool_calls_in("text", &s).unwrap(), None);
        }
    }

    #[test]
    fn constrained_requests_are_refused_as_unsupported_until_wired() {
        let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}});
        for extra in [
            json!({"response_format": schema}),
            json!({"response_format": {"type": "json_object"}}),
            json!({"tools": tools()}),
            json!({"tools": tools(), "tool_choice": "required"}),
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ] {
            let s = Structured::of(&request(extra.clone())).unwrap();
            assert_eq!(code_of(constraint_for(&s)), "unsupported", "{extra}");
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
                json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools",
            ),
            (
                json!({"tools": [tools()[0].clone(), tools()[0].clone()]}),
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
        ] {
            let e = Structured::of(&request(extra.clone())).unwrap_err();
            assert_eq!(
                (e.kind, e.param.as_deref()),
                (ErrorKind::BadRequest, Some(param)),
                "{extra}"
            );
        }
    }
}
