//! Tool calls in chat, shaped like OpenAI's API so that a server maps a request straight in.
//!
//! - [`Tool`] is one entry of a request's `tools` (`{"type":"function","function":{name,
//!   description, parameters}}`), [`parse_tools`] reads and checks the array;
//! - [`ToolChoice`] is `tool_choice`: `auto`, `none`, `required`, or one named function;
//! - [`ToolCall`] is one call the model made, `arguments` a JSON text as in OpenAI's answers.
//!
//! **The call format.** A model whose chat template refers to `tools` gets them there (the server
//! or CLI passes them with `Engine::set_template_tools`). A template without tool support (such
//! as SmolLM2's) gets the fallback: [`tool_system_prompt`] describes the tools and the format in a
//! system message ([`with_tool_prompt`] adds it). Either way a call is written
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! (the Hermes/Qwen format; several calls are several blocks, one per line).
//!
//! **Choices.** `none`: the tools are not shown and the output is plain text. `auto`: the model
//! decides; [`parse_tool_calls`] extracts the calls it wrote (checking each names a tool and has
//! object arguments; malformed ones are reported and their text left in the content).
//! `required` and a named function: [`tool_call_format`] is a grammar the output must follow, so
//! it is one or more calls (or exactly one with `parallel` off) to the allowed functions whose
//! arguments validate against the function's `parameters` schema.

use crate::StructuredError;
use crate::format::OutputFormat;
use model::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The tag that opens a call.
pub const CALL_OPEN: &str = "<tool_call>";
/// The tag that closes a call.
pub const CALL_CLOSE: &str = "</tool_call>";

/// One tool of a request: `{"type":"function","function":{...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Function {
    /// Its name: 1 to 64 of `a-z A-Z 0-9 _ -` (OpenAI's rule).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object schema); absent: no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

impl Tool {
    /// A function tool.
    pub fn function(name: &str, description: Option<&str>, parameters: Option<Value>) -> Tool {
        Tool {
            kind: "function".into(),
            function: Function {
                name: name.into(),
                description: description.map(str::to_owned),
                parameters,
            },
        }
    }

    /// The schema of the arguments: `parameters`, or an empty object when there are none.
    pub fn arguments_schema(&self) -> Value {
        self.function.parameters.clone().unwrap_or_else(
            || json!({"type": "object", "properties": {}, "additionalProperties": false}),
        )
    }
}

/// Reads a request's `tools` array and checks it: each entry a function with a valid, unique
/// name and an object `parameters` schema. Errors name the entry (`tools[1].function.name`).
pub fn parse_tools(value: &Value) -> Result<Vec<Tool>, StructuredError> {
    let items = value
        .as_array()
        .ok_or_else(|| StructuredError::invalid("tools", "expected an array"))?;
    let mut tools: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let what = format!("tools[{i}]");
        let tool: Tool = serde_json::from_value(item.clone())
            .map_err(|e| StructuredError::invalid_from(&what, "not a tool", e))?;
        check_tool(&tool, &what)?;
        if tools.iter().any(|t| t.function.name == tool.function.name) {
            return Err(StructuredError::invalid(
                format!("{what}.function.name"),
                format!("`{}` is named twice", tool.function.name),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn check_tool(tool: &Tool, what: &str) -> Result<(), StructuredError> {
    if tool.kind != "function" {
        return Err(StructuredError::invalid(
            format!("{what}.type"),
            format!("only `function` tools exist, got `{}`", tool.kind),
        ));
    }
    let name = &tool.function.name;
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        return Err(StructuredError::invalid(
            format!("{what}.function.name"),
            format!("`{name}` is not 1 to 64 of a-z, A-Z, 0-9, _ and -"),
        ));
    }
    match &tool.function.parameters {
        None => Ok(()),
        Some(schema @ Value::Object(_)) => {
            crate::guard::check_schema(schema, &format!("{what}.function.parameters"))
        }
        Some(other) => Err(StructuredError::invalid(
            format!("{what}.function.parameters"),
            format!("a JSON schema object is expected, got {other}"),
        )),
    }
}

/// A request's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (the default when tools are given).
    #[default]
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// One or more calls to any of the tools.
    Required,
    /// A call to this function.
    Function(String),
}

impl ToolChoice {
    /// Reads `"auto"`, `"none"`, `"required"` or `{"type":"function","function":{"name":...}}`.
    pub fn from_json(value: &Value) -> Result<ToolChoice, StructuredError> {
        let named = || {
            let f = value.get("function")?.get("name")?.as_str()?;
            (value.get("type")?.as_str()? == "function").then(|| f.to_owned())
        };
        match value.as_str() {
            Some(s) => s.parse(),
            None => named().map(ToolChoice::Function).ok_or_else(|| {
                StructuredError::invalid(
                    "tool_choice",
                    format!(
                        "expected auto, none, required or {{\"type\":\"function\",\"function\":{{\"name\":...}}}}, got {value}"
                    ),
                )
            }),
        }
    }

    /// Checks a named function is one of `tools`, and that a choice other than `none` has tools.
    pub fn check(&self, tools: &[Tool]) -> Result<(), StructuredError> {
        match self {
            ToolChoice::None => Ok(()),
            _ if tools.is_empty() => Err(StructuredError::invalid(
                "tool_choice",
                "tools are needed for a choice other than none",
            )),
            ToolChoice::Function(name) if !tools.iter().any(|t| &t.function.name == name) => {
                Err(StructuredError::invalid(
                    "tool_choice.function.name",
                    format!("`{name}` is not one of the tools"),
                ))
            }
            _ => Ok(()),
        }
    }
}

impl std::str::FromStr for ToolChoice {
    type Err = StructuredError;

    /// `auto`, `none`, `required`, or any other word as a function's name (the CLI's form).
    fn from_str(s: &str) -> Result<ToolChoice, StructuredError> {
        Ok(match s {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            "" => return Err(StructuredError::invalid("tool_choice", "empty")),
            name => ToolChoice::Function(name.to_owned()),
        })
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_` and 16 hex digits, derived from the output and the call's place in it (the same
    /// output gives the same ids).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object as text (as OpenAI returns them).
    pub arguments: String,
}

impl ToolCall {
    /// The call as OpenAI's API writes it in a message's `tool_calls`.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }

    /// The call as the model writes it: a `<tool_call>` block (to put an earlier answer's calls
    /// back in an assistant message of the conversation).
    pub fn to_text(&self) -> String {
        format!(
            "{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{CALL_CLOSE}",
            Value::String(self.name.clone()),
            self.arguments
        )
    }
}

/// The system message that describes `tools` and the call format to a model whose template does
/// not (see the module docs); `None` for [`ToolChoice::None`] or no tools.
pub fn tool_system_prompt(tools: &[Tool], choice: &ToolChoice) -> Option<String> {
    if tools.is_empty() || *choice == ToolChoice::None {
        return None;
    }
    let listed: Vec<Value> = tools.iter().map(|t| json!(t)).collect();
    let rule = match choice {
        ToolChoice::Auto | ToolChoice::None => {
            "Call a function when it helps; otherwise answer in plain text.".to_owned()
        }
        ToolChoice::Required => "You must call a function.".to_owned(),
        ToolChoice::Function(name) => format!("You must call the function `{name}`."),
    };
    Some(format!(
        "You can call these functions:\n{}\nTo call one, write its name and its arguments (a JSON \
         object following its parameters) like this, one block per call:\n\
         {CALL_OPEN}\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments>}}}}\n{CALL_CLOSE}\n{rule}",
        Value::Array(listed)
    ))
}

/// `messages` with the tool prompt of `tools` and `choice` ([`tool_system_prompt`]) added: to the
/// first system message (after its text), or as a new first system message. Unchanged when there
/// is no prompt.
pub fn with_tool_prompt(messages: &[Message], tools: &[Tool], choice: &ToolChoice) -> Vec<Message> {
    let mut out = messages.to_vec();
    let Some(prompt) = tool_system_prompt(tools, choice) else {
        return out;
    };
    match out.first_mut().filter(|m| m.role == "system") {
        Some(system) => system.content = format!("{}\n\n{prompt}", system.content),
        None => out.insert(0, Message::new("system", &prompt)),
    }
    out
}

/// The output format that `choice` imposes: for `required`, one or more calls to any of `tools`
/// (exactly one unless `parallel`); for a named function, calls to it; `None` for `auto` and
/// `none` (the model writes what it wants). Each call's arguments follow the function's
/// `parameters` schema.
pub fn tool_call_format(
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<OutputFormat>, StructuredError> {
    choice.check(tools)?;
    let allowed: Vec<&Tool> = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Function(name) => tools.iter().filter(|t| &t.function.name == name).collect(),
    };
    let mut lark = String::new();
    let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
    lark.push_str(&format!("start: call{repeat}\n"));
    let bodies: Vec<String> = (0..allowed.len()).map(|i| format!("fn{i}")).collect();
    lark.push_str(&format!(
        "call: {} \"\\n\" ({}) \"\\n\" {}\n",
        lark_string(CALL_OPEN),
        bodies.join(" | "),
        lark_string(CALL_CLOSE)
    ));
    for (i, tool) in allowed.iter().enumerate() {
        let schema = call_schema(tool);
        lark.push_str(&format!("fn{i}: %json {schema}\n"));
    }
    Ok(Some(OutputFormat::Lark(lark)))
}

/// A Lark string literal.
fn lark_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The schema of one call to `tool`: `{"name": <its name>, "arguments": <its parameters>}`, in
/// that order, nothing else, spaced like every generated JSON.
fn call_schema(tool: &Tool) -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.arguments_schema(),
        },
        "required": ["name", "arguments"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    })
}

/// A call the parser could not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedCall {
    /// The call's text, as the model wrote it.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The model's answer split into text and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// The text outside the calls (trimmed), malformed calls left in it; empty when the answer
    /// was only calls.
    pub content: String,
    /// The calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The blocks that looked like calls but were not valid ones.
    pub malformed: Vec<MalformedCall>,
}

/// Extracts the calls from a model's answer: `<tool_call>` blocks (the closing tag may be missing
/// at the end of the text), or a whole answer that is one call object. A call must be a JSON
/// object with a string `name` that is one of `tools` and `arguments` that are an object (or a
/// JSON text of one; `parameters` is accepted for `arguments`, as some models write it).
pub fn parse_tool_calls(text: &str, tools: &[Tool]) -> ParsedOutput {
    let mut out = ParsedOutput::default();
    let mut content = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(CALL_OPEN) {
        content.push_str(&rest[..at]);
        let after = &rest[at + CALL_OPEN.len()..];
        let (body, next) = match after.find(CALL_CLOSE) {
            Some(end) => (&after[..end], &after[end + CALL_CLOSE.len()..]),
            None => (after, ""),
        };
        let block = &rest[at..rest.len() - next.len()];
        match read_call(body, tools) {
            Ok((name, arguments)) => out.tool_calls.push(new_call(text, &out, name, arguments)),
            Err(reason) => {
                content.push_str(block);
                out.malformed.push(MalformedCall {
                    text: block.to_owned(),
                    reason,
                });
            }
        }
        rest = next;
    }
    content.push_str(rest);
    let bare = content.trim();
    let only_text = out.tool_calls.is_empty() && out.malformed.is_empty();
    if only_text
        && bare.starts_with('{')
        && let Ok((name, arguments)) = read_call(bare, tools)
    {
        out.tool_calls.push(new_call(text, &out, name, arguments));
        content.clear();
    }
    out.content = content.trim().to_owned();
    out
}

fn new_call(text: &str, out: &ParsedOutput, name: String, arguments: String) -> ToolCall {
    ToolCall {
        id: call_id(text, out.tool_calls.len()),
        name,
        arguments,
    }
}

/// The name and the arguments (JSON text) of one call's JSON, or why it is not a call.
fn read_call(body: &str, tools: &[Tool]) -> Result<(String, String), String> {
    let value: Value = serde_json::from_str(body.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .ok_or("no string `name`")?;
    if !tools.iter().any(|t| t.function.name == name) {
        return Err(format!("`{name}` is not one of the tools"));
    }
    let args = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .ok_or("no `arguments`")?;
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(s)
            .map_err(|e| format!("`arguments` is a string but not JSON: {e}"))?,
        other => other.clone(),
    };
    if !args.is_object() {
        return Err(format!("`arguments` is not an object: {args}"));
    }
    Ok((name.to_owned(), args.to_string()))
}

/// `call_` and 16 hex digits of an FNV-1a hash of the output and the call's index.
fn call_id(text: &str, index: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes().chain(index.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("call_{h:016x}")
}
