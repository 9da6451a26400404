//! The OpenAI-shaped request and response bodies, and their checks.
//!
//! Requests are parsed leniently the way OpenAI's clients send them (unknown fields are ignored,
//! `stop` is a string or a list, `content` a string or a list of text parts) and then checked
//! field by field, each refusal naming its field.

use crate::error::ApiError;
use htpkv::sampler::SamplerOptions;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A message's content: a string, or a list of parts of which only `text` parts are taken.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's earlier tool calls, kept for the tool-call seam.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// The fields of `/v1/chat/completions` the server reads.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: CommonFields,
    /// OpenAI's `tools` (parsed by `htpkv_structured::parse_tools`).
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
}

/// The fields of `/v1/completions` the server reads.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: OneOrMany,
    #[serde(flatten)]
    pub common: CommonFields,
}

/// Fields both endpoints share: streaming, the token budget, stop strings and the sampler.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

impl CommonFields {
    /// The sampler: greedy unless `temperature` is above 0; the rest as given or the defaults.
    pub fn sampler(&self) -> Result<SamplerOptions, ApiError> {
        let d = SamplerOptions::default();
        let s = SamplerOptions {
            temperature: self.temperature.unwrap_or(0.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            penalty_last_n: d.penalty_last_n,
            seed: self.seed.unwrap_or(d.seed),
        };
        let ranges = [
            ("temperature", s.temperature, 0.0, 2.0),
            ("top_p", s.top_p, 0.0, 1.0),
            ("min_p", s.min_p, 0.0, 1.0),
            ("repeat_penalty", s.repeat_penalty, 0.0, 10.0),
            ("presence_penalty", s.presence_penalty, -2.0, 2.0),
            ("frequency_penalty", s.frequency_penalty, -2.0, 2.0),
        ];
        for (name, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} must be between {lo} and {hi}, got {v}"),
                ));
            }
        }
        if s.top_p <= 0.0 {
            return Err(ApiError::bad_param("top_p", "top_p must be above 0"));
        }
        Ok(s)
    }

    /// The stop strings, checked against the engine's limits.
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = self
            .stop
            .clone()
            .map(OneOrMany::into_vec)
            .unwrap_or_default();
        let (most, longest) = (htpkv::session::MAX_STOPS, htpkv::session::MAX_STOP_BYTES);
        if stops.len() > most {
            return Err(ApiError::bad_param(
                "stop",
                format!("{} stop strings; at most {most} are accepted", stops.len()),
            ));
        }
        if let Some(s) = stops.iter().find(|s| s.is_empty() || s.len() > longest) {
            return Err(ApiError::bad_param(
                "stop",
                format!(
                    "a stop string must have 1 to {longest} bytes, got {}",
                    s.len()
                ),
            ));
        }
        Ok(stops)
    }

    /// Refuses `n` other than 1 (one choice per request).
    pub fn check_n(&self) -> Result<(), ApiError> {
        match self.n {
            None | Some(1) => Ok(()),
            Some(n) => Err(ApiError::bad_param(
                "n",
                format!("n = {n}: this server answers one choice per request"),
            )),
        }
    }
}

impl ChatMessage {
    /// The message's text: its content string, or its text parts joined.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(s)) => Ok(s.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::bad_param(
                        "messages",
                        format!("content parts of type `{kind}` are not supported (text only)"),
                    )),
                })
                .collect(),
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// The finish reason as OpenAI names it: the engine's `context` (the context filled up) is
/// OpenAI's `length`; a cancel (a client gone, a shutdown) is reported as `cancelled`.
pub fn finish_reason(stop: htpkv::session::StopReason) -> &'static str {
    match stop.finish_reason() {
        "context" => "length",
        other => other,
    }
}
