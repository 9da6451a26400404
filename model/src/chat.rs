//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, or the
//! `chat_template` of a `tokenizer_config.json`) rendered with minijinja.
//!
//! Rendering follows Hugging Face's conventions: `trim_blocks` and `lstrip_blocks` on, the
//! variables `messages`, `add_generation_prompt`, `bos_token` and `eos_token`, a
//! `raise_exception(message)` function, and Python string/dict methods (`.strip()`,
//! `.items()`, ...) through minijinja-contrib's pycompat.
//!
//! A template comes with the model, so it is untrusted input: rendering is bounded by
//! [`TEMPLATE_FUEL`] steps of minijinja's VM (a loop that never ends fails instead of hanging)
//! and by an output cap in bytes (the caller's, at most [`MAX_RENDERED_BYTES`]); either error
//! names the template's source (the GGUF file or the `tokenizer_config.json`).

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, context};
use serde_json::Value as Json;

use crate::Error;
use crate::gguf_file::{GgufFile, Value};

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

/// Steps of minijinja's VM one rendering may take (its "fuel"). A real chat template renders a
/// turn in a few hundred steps, so this allows conversations of thousands of turns while a
/// template that loops for ever (or for 10^10 steps) fails within a tenth of a second (release).
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// The most a rendering may write, in bytes, whatever cap the caller asks for.
pub const MAX_RENDERED_BYTES: usize = 4 << 20;

/// A model's chat template with the token strings it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: String,
    bos_token: String,
    eos_token: String,
}

fn template_err(origin: &str) -> impl Fn(minijinja::Error) -> Error + '_ {
    move |source| Error::Template {
        origin: origin.to_owned(),
        source,
    }
}

/// An `io::Write` into a string that fails once more than `cap` bytes are written.
struct CappedOutput {
    out: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.cap {
            self.over = true;
            return Err(std::io::Error::other("output cap"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source` (checked now, so a broken template fails here rather than at the
    /// first render).
    /// Errors say `chat template` until [`ChatTemplate::named`] names its source.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        Self::with_origin(source, bos_token, eos_token, "chat template")
    }

    /// Names the template's source in its errors (e.g. `model.gguf: tokenizer.chat_template`).
    pub fn named(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }

    /// Where the template comes from, as its errors name it.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn with_origin(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        origin: &str,
    ) -> Result<Self, Error> {
        let template_err = template_err(origin);
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build();
        env.set_syntax(syntax.map_err(&template_err)?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.template_from_str(source).map_err(&template_err)?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            origin: origin.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The template of a GGUF file; BOS/EOS strings from its vocabulary. Its errors say
    /// `GGUF tokenizer.chat_template` until [`ChatTemplate::named`] names the file.
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
                (Some(id), Some(crate::gguf_file::Array::String(t))) => {
                    t.get(id as usize).cloned().unwrap_or_default()
                }
                _ => String::new(),
            }
        };
        ChatTemplate::with_origin(
            source,
            &token("tokenizer.ggml.bos_token_id"),
            &token("tokenizer.ggml.eos_token_id"),
            "GGUF tokenizer.chat_template",
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
        let origin = format!("{}: chat_template", path.display());
        ChatTemplate::with_origin(&source, &token("bos_token"), &token("eos_token"), &origin)
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// answer begins. At most [`MAX_RENDERED_BYTES`] bytes.
    pub fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.render_capped(messages, add_generation_prompt, MAX_RENDERED_BYTES)
    }

    /// [`ChatTemplate::render_chat`] writing at most `max_bytes` (and [`MAX_RENDERED_BYTES`])
    /// bytes: a longer rendering stops there with [`Error::TemplateLimit`], as does one that takes
    /// more than [`TEMPLATE_FUEL`] steps.
    pub fn render_capped(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<String, Error> {
        self.render_with_tools(messages, None, add_generation_prompt, max_bytes)
    }

    /// True when the template refers to a `tools` variable: it describes tools to the model
    /// itself when [`ChatTemplate::render_with_tools`] passes them.
    pub fn mentions_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// [`ChatTemplate::render_capped`] with the variable `tools` set to `tools` (the JSON array
    /// of an OpenAI request's `tools`, as Hugging Face templates expect it); `None` leaves
    /// `tools` undefined.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&Json>,
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<String, Error> {
        let tools = match tools {
            Some(t) => context! { tools => minijinja::value::Serde(t) },
            None => context! {},
        };
        let ctx = context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..tools
        };
        let cap = max_bytes.min(MAX_RENDERED_BYTES);
        let mut out = CappedOutput {
            out: Vec::new(),
            cap,
            over: false,
        };
        let limit = |reason: String| Error::TemplateLimit {
            origin: self.origin.clone(),
            reason,
        };
        let rendered = self
            .env
            .template_from_str(&self.source)
            .and_then(|t| t.render_captured_to(ctx, &mut out).map(drop));
        match rendered {
            Err(_) if out.over => Err(limit(format!(
                "the rendered conversation exceeds {cap} bytes (the most this conversation may \
                 take; see the README's input safety)"
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(limit(format!(
                "rendering took more than {TEMPLATE_FUEL} steps (the template's work limit)"
            ))),
            Err(e) => Err(template_err(&self.origin)(e)),
            Ok(()) => String::from_utf8(out.out)
                .map_err(|e| limit(format!("the rendering is not UTF-8: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests;
