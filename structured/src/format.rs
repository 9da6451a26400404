//! What the output must be ([`OutputFormat`]) and how it becomes llguidance's grammar: read by
//! the guard ([`crate::guard`]) before compiling and by the compiler ([`crate::grammar`]).

use crate::StructuredError;
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// A JSON value that validates against this JSON schema (draft 2020-12 as llguidance reads
    /// it: `$ref`/`$defs`, `enum`, `const`, `minLength`/`maxLength`, `pattern`, `anyOf`, ...).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A text matching this regular expression whole (Rust `regex` syntax).
    Regex(String),
    /// A text of this Lark grammar (llguidance's dialect: `start: ...`, `%json {...}` inside).
    Lark(String),
}

/// How generated JSON is spaced: one space after `,` and `:`, no other whitespace. The issue does
/// not say; free whitespace lets a small model emit newlines for ever, and this is the spacing
/// of Python's `json.dumps`, which models have seen most.
fn json_spacing() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl OutputFormat {
    /// The format of an OpenAI `response_format`: `{"type":"json_schema","json_schema":{"schema":
    /// {...}}}`, `{"type":"json_object"}`, or `{"type":"text"}` (`None`: no constraint).
    pub fn from_response_format(value: &Value) -> Result<Option<OutputFormat>, StructuredError> {
        let kind = value.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(OutputFormat::JsonObject)),
            Some("json_schema") => {
                let schema = value
                    .get("json_schema")
                    .and_then(|s| s.get("schema"))
                    .ok_or_else(|| {
                        StructuredError::invalid(
                            "response_format.json_schema.schema",
                            "missing (a JSON schema object is expected)",
                        )
                    })?;
                Ok(Some(OutputFormat::JsonSchema(schema.clone())))
            }
            _ => Err(StructuredError::invalid(
                "response_format.type",
                format!("expected text, json_object or json_schema, got {value}"),
            )),
        }
    }

    /// The schema with the JSON spacing ([`json_spacing`]) unless it sets its own `x-guidance`.
    fn spaced_schema(schema: &Value, what: &str) -> Result<Value, StructuredError> {
        let mut schema = schema.clone();
        match &mut schema {
            Value::Object(map) => {
                map.entry("x-guidance").or_insert_with(json_spacing);
            }
            Value::Bool(true) => schema = json!({"x-guidance": json_spacing()}),
            other => {
                return Err(StructuredError::invalid(
                    what,
                    format!("a JSON schema is an object (or true), got {other}"),
                ));
            }
        }
        Ok(schema)
    }

    pub(crate) fn to_llguidance(&self, what: &str) -> Result<TopLevelGrammar, StructuredError> {
        Ok(match self {
            OutputFormat::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(OutputFormat::spaced_schema(s, what)?)
            }
            OutputFormat::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_spacing()}),
            ),
            OutputFormat::Regex(r) => TopLevelGrammar::from_regex(r),
            OutputFormat::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}
