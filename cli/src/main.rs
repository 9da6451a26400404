//! The `htpkv` command line.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod budget;
mod chat;
mod compile;
mod eval;
mod generate;
mod inspect;
// The one FFI edge of the CLI: installing the SIGINT handler through libc.
#[allow(unsafe_code)]
mod interrupt;
mod output;
mod progress;
mod saturation;
mod serve;

/// htpkv: LLMs as static-shape graphs with an application-managed KV cache.
#[derive(Debug, Parser)]
#[command(name = "htpkv", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Memory budget of a model's KV cache for each update strategy.
    Budget(budget::BudgetArgs),
    /// Simulate a generation with the real kv_manager and print per-step counters.
    Plan(budget::PlanArgs),
    /// Compile a llama2.c checkpoint into a reference-backend context binary.
    Compile(compile::CompileArgs),
    /// Generate text with a compiled model (compiled and cached on first use).
    Generate(Box<generate::GenerateArgs>),
    /// Chat interactively: one user turn per stdin line (/reset, /quit), answers stream to
    /// stdout; the KV cache is kept across turns. Takes generate's options.
    Chat(Box<generate::GenerateArgs>),
    /// List the graphs and IO tensors of a context binary through a QNN system library.
    Inspect(inspect::InspectArgs),
    /// Score a text teacher-forced against the f32 model: top-1 agreement, KL, perplexity. Takes
    /// generate's model and backend options.
    Eval(Box<eval::EvalArgs>),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions,
    /// /v1/completions, /v1/models, /health). Takes generate's model and backend options.
    Serve(Box<serve::ServeArgs>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // A kernel forced through HTPKV_ISA that this CPU lacks is refused before any work.
    if let Err(e) = ref_backend::kernels::isa() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Budget(args) => budget::run_budget(args),
        Command::Plan(args) => budget::run_plan(args),
        Command::Compile(args) => compile::run(args),
        Command::Generate(args) => generate::run(*args),
        Command::Chat(args) => chat::run(*args),
        Command::Inspect(args) => inspect::run(args),
        Command::Eval(args) => eval::run(*args),
        Command::Serve(args) => serve::run(*args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of our output went away (`htpkv ... | head`): a normal, quiet end.
        Err(err) if output::is_broken_pipe(&err) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
