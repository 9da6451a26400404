//! Structured output and tool calls on the command line: `--json-schema FILE`, `--regex RE`,
//! `--grammar FILE` (one of them), and `--tools FILE` with `--tool-choice` in `generate --chat`
//! and `htpkv chat` (see `htpkv_structured`).

use super::GenerateArgs;
use anyhow::Context;
use htpkv::engine::Engine;
use htpkv::session::GenerateOptions;
use htpkv::structured::tools::{self, ParsedOutput};
use htpkv::structured::{Grammar, OutputFormat, Tool, ToolChoice, Vocabulary};
use model::Message;
use model::fsio::{FileKind, read_text_capped};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The options of structured output and tool calls.
#[derive(Debug, clap::Args)]
pub struct StructuredArgs {
    /// The output must be JSON valid against the JSON schema in FILE.
    #[arg(long, value_name = "FILE", group = "format")]
    json_schema: Option<PathBuf>,
    /// The output must match the regular expression RE (Rust syntax), whole.
    #[arg(long, value_name = "RE", group = "format")]
    regex: Option<String>,
    /// The output must follow the Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE", group = "format")]
    grammar: Option<PathBuf>,
    /// Tools the model may call in a chat: FILE holds OpenAI's `tools` JSON array. The calls the
    /// answer makes are printed after it (and given in --json's `tool_calls`).
    #[arg(long, value_name = "FILE", conflicts_with = "format")]
    tools: Option<PathBuf>,
    /// auto (the model decides), none, required (one or more calls, enforced by a grammar), or a
    /// function's name (a call to it, enforced).
    #[arg(long, value_name = "CHOICE", requires = "tools")]
    tool_choice: Option<String>,
    /// With --tool-choice required or a name: exactly one call instead of one or more.
    #[arg(long, requires = "tool_choice")]
    single_call: bool,
}

impl StructuredArgs {
    fn wanted(&self) -> bool {
        self.json_schema.is_some()
            || self.regex.is_some()
            || self.grammar.is_some()
            || self.tools.is_some()
    }
}

/// Refuses the combinations that would ignore a constraint, before any work: beams and samples
/// (they sample outside the constrained loop), speculation (the runtime refuses a constraint),
/// binaries of other tools (their own loop), and tools without a chat.
pub fn check(args: &GenerateArgs, chat_command: bool) -> anyhow::Result<()> {
    let s = &args.structured;
    if !s.wanted() {
        return Ok(());
    }
    let ignored = [
        (args.beams.is_some(), "--beams"),
        (args.n.is_some(), "--n"),
        (args.speculate.is_some(), "--speculate"),
        (
            super::foreign::wanted(&args.run),
            "--bundle/--convention/--tokenizer",
        ),
    ];
    if let Some((_, flag)) = ignored.iter().find(|(on, _)| *on) {
        anyhow::bail!(
            "{flag} cannot be combined with --json-schema, --regex, --grammar or --tools: it \
             would not apply the constraint"
        );
    }
    if s.tools.is_some() && !chat_command && args.chat.is_none() {
        anyhow::bail!("--tools needs --chat (or `htpkv chat`)");
    }
    Ok(())
}

/// What the options ask for, compiled against the model's tokenizer.
#[derive(Debug, Default)]
pub struct Plan {
    grammar: Option<Arc<Grammar>>,
    tools: Vec<Tool>,
    choice: ToolChoice,
    /// The tools described in a system message (the template does not take them).
    prompt_tools: bool,
}

/// The cap of a `--json-schema`, `--grammar` or `--tools` file: what the server takes as a whole
/// request body (1 MiB).
const STRUCTURED_FILE: FileKind = FileKind::new("structured-output file", 1 << 20);

/// The text of `path` through the capped reader (a regular file of at most 1 MiB).
fn read_text(path: &Path, what: &str) -> anyhow::Result<String> {
    read_text_capped(path, STRUCTURED_FILE).with_context(|| format!("{what}: reading it"))
}

fn read(path: &Path, what: &str) -> anyhow::Result<serde_json::Value> {
    let text = read_text(path, what)?;
    serde_json::from_str(&text).with_context(|| format!("{what}: {} is not JSON", path.display()))
}

impl Plan {
    /// Reads the files, compiles the constraint and, for tools, tells the engine's template.
    pub fn new(args: &GenerateArgs, engine: &mut Engine) -> anyhow::Result<Plan> {
        let s = &args.structured;
        if !s.wanted() {
            return Ok(Plan::default());
        }
        let (format, what) = match (&s.json_schema, &s.regex, &s.grammar) {
            (Some(p), _, _) => (
                OutputFormat::JsonSchema(read(p, "--json-schema")?),
                "--json-schema",
            ),
            (_, Some(r), _) => (OutputFormat::Regex(r.clone()), "--regex"),
            (_, _, Some(p)) => (OutputFormat::Lark(read_text(p, "--grammar")?), "--grammar"),
            _ => return Plan::with_tools(s, engine),
        };
        let vocab = Arc::new(Vocabulary::new(engine.tokenizer())?);
        Ok(Plan {
            grammar: Some(vocab.compile(&format, what)?),
            ..Plan::default()
        })
    }

    fn with_tools(s: &StructuredArgs, engine: &mut Engine) -> anyhow::Result<Plan> {
        let path = s.tools.as_ref().expect("tools are wanted");
        let tools = tools::parse_tools(&read(path, "--tools")?).context("--tools")?;
        let choice: ToolChoice = s.tool_choice.as_deref().unwrap_or("auto").parse()?;
        let format =
            tools::tool_call_format(&tools, &choice, !s.single_call).context("--tool-choice")?;
        let grammar = match format {
            Some(f) => {
                let vocab = Arc::new(Vocabulary::new(engine.tokenizer())?);
                Some(vocab.compile(&f, "--tools")?)
            }
            None => None,
        };
        let shown = choice != ToolChoice::None;
        let takes = engine.template_takes_tools();
        if shown && takes {
            engine.set_template_tools(Some(serde_json::json!(tools)));
        }
        Ok(Plan {
            grammar,
            prompt_tools: shown && !takes,
            tools,
            choice,
        })
    }

    /// Puts the constraint in `options`.
    pub fn constrain(&self, options: &mut GenerateOptions) {
        if let Some(g) = &self.grammar {
            options.constraint = Some(g.factory());
        }
    }

    /// The conversation with the tools' system message when the template does not take tools.
    pub fn messages(&self, messages: Vec<Message>) -> Vec<Message> {
        if !self.prompt_tools {
            return messages;
        }
        tools::with_tool_prompt(&messages, &self.tools, &self.choice)
    }

    /// The system message of `htpkv chat` (the tools' prompt added when needed).
    pub fn system(&self, system: Option<&str>) -> Option<String> {
        let m: Vec<Message> = system
            .map(|s| Message::new("system", s))
            .into_iter()
            .collect();
        self.messages(m).pop().map(|m| m.content)
    }

    /// The calls of an answer, when tools are in use (not with `--tool-choice none`).
    pub fn calls(&self, text: &str) -> Option<ParsedOutput> {
        (!self.tools.is_empty() && self.choice != ToolChoice::None)
            .then(|| tools::parse_tool_calls(text, &self.tools))
    }

    /// `--json`'s `tool_calls` (OpenAI's shape) and `malformed_tool_calls`.
    pub fn json(&self, text: &str, doc: &mut serde_json::Value) {
        if let Some(p) = self.calls(text) {
            let calls: Vec<_> = p.tool_calls.iter().map(|c| c.to_openai()).collect();
            let bad: Vec<_> = (p.malformed.iter())
                .map(|m| serde_json::json!({"text": m.text, "reason": m.reason}))
                .collect();
            doc["tool_calls"] = calls.into();
            doc["malformed_tool_calls"] = bad.into();
            doc["content"] = p.content.into();
        }
        if let Some(g) = &self.grammar {
            let s = g.stats();
            doc["constraint"] = serde_json::json!({"masks": s.masks, "mask_seconds": s.seconds});
        }
    }

    /// Prints the calls of an answer, one line each: `tool call <id>: <name> <arguments>`, and the
    /// malformed ones to stderr.
    pub fn print_calls(&self, text: &str, out: &mut impl Write) -> std::io::Result<()> {
        let Some(p) = self.calls(text) else {
            return Ok(());
        };
        for c in &p.tool_calls {
            writeln!(out, "tool call {}: {} {}", c.id, c.name, c.arguments)?;
        }
        for m in &p.malformed {
            eprintln!("malformed tool call ({}): {}", m.reason, m.text);
        }
        Ok(())
    }

    /// The `--stats` line of the constraint's mask cost.
    pub fn stats_line(&self) -> Option<String> {
        let s = self.grammar.as_ref()?.stats();
        Some(format!(
            "constraint: {} masks, {:.3} ms/token",
            s.masks,
            s.ms_per_token()
        ))
    }
}
