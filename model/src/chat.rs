//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, or the
//! `chat_template` of a `tokenizer_config.json`) rendered with minijinja.
//!
//! Rendering follows Hugging Face's conventions: `trim_blocks` and `lstrip_blocks` on, the
//! variables `messages`, `add_generation_prompt`, `bos_token` and `eos_token`, a
//! `raise_exception(message)` function, and Python string/dict methods (`.strip()`,
//! `.items()`, ...) through minijinja-contrib's pycompat.

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, context};
use serde_json::Value as Json;

use crate::Error;
use crate::gguf::{GgufFile, Value};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// A model's chat template with the token strings it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

fn template_err(source: minijinja::Error) -> Error {
    Error::Template { source }
}

impl ChatTemplate {
    /// Compiles `source` (checked now, so a broken template fails here rather than at the
    /// first render).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build();
        env.set_syntax(syntax.map_err(template_err)?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.template_from_str(source).map_err(template_err)?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The template of a GGUF file; BOS/EOS strings from its vocabulary.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, Error> {
        let missing = || Error::Metadata {
            origin: "GGUF".to_owned(),
            key: "tokenizer.chat_template".to_owned(),
            reason: "missing or not a string".to_owned(),
        };
        let source = file
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .ok_or_else(missing)?;
        let token = |key: &str| -> String {
            let id = file.get(key).and_then(Value::as_u64);
            match (
                id,
                file.get("tokenizer.ggml.tokens").and_then(Value::as_array),
            ) {
                (Some(id), Some(crate::gguf::Array::String(t))) => {
                    t.get(id as usize).cloned().unwrap_or_default()
                }
                _ => String::new(),
            }
        };
        ChatTemplate::new(
            source,
            &token("tokenizer.ggml.bos_token_id"),
            &token("tokenizer.ggml.eos_token_id"),
        )
    }

    /// The template of a `tokenizer_config.json` (`chat_template` as a string, or a list of
    /// `{name, template}` from which `default` is taken).
    pub fn from_tokenizer_config(path: &Path) -> Result<Self, Error> {
        let bad = |reason: String| Error::HfConfig {
            origin: path.display().to_string(),
            reason,
        };
        let text = crate::fsio::read_text_capped(path, crate::fsio::FileKind::HF_JSON)?;
        let json: Json = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let source = match &json["chat_template"] {
            Json::String(s) => s.clone(),
            Json::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .ok_or_else(|| bad("chat_template has no \"default\" entry".to_owned()))?
                .to_owned(),
            _ => return Err(bad("chat_template is missing".to_owned())),
        };
        let token = |key: &str| match &json[key] {
            Json::String(s) => s.clone(),
            other => other["content"].as_str().unwrap_or_default().to_owned(),
        };
        ChatTemplate::new(&source, &token("bos_token"), &token("eos_token"))
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// answer begins.
    pub fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let ctx = context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        self.env.render_str(&self.source, ctx).map_err(template_err)
    }
}

#[cfg(test)]
mod tests;
