//! `htpkv chat`: an interactive conversation on stdin/stdout.
//!
//! Each stdin line is one user turn; the answer streams to stdout as it is sampled, followed by
//! a newline. `/reset` starts a new conversation (empty cache), `/quit` or end of input ends.
//! Empty lines are skipped. The KV cache is kept across turns: each turn feeds only the text the
//! conversation adds (see `Engine::append_turn`), so with `--overflow slide` (or `restart`) a chat
//! longer than the context goes on, the policy dropping the oldest turns' tokens.

use crate::generate::{
    GenerateArgs, open_engine, print_stats, set_overflow, speculate, stream, structured,
};
use crate::interrupt;
use anyhow::Context;
use htpkv::session::GenerateOptions;
use std::io::{BufRead, Write};

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !args.prompt.is_empty() {
        anyhow::bail!("`htpkv chat` reads its turns from stdin; it takes no prompt argument");
    }
    structured::check(&args, true)?;
    let (mut engine, mut checked, _) = open_engine(&args)?;
    set_overflow(&args, &mut engine)?;
    speculate::attach(&args, &checked.run.engine, &mut engine)?;
    let plan = structured::Plan::new(&args, &mut engine)?;
    plan.constrain(&mut checked.generate);
    let system = plan.system(args.system.as_deref());
    let start = |engine: &mut htpkv::engine::Engine| -> anyhow::Result<()> {
        if let Some(system) = &system {
            engine.append_turn("system", system)?;
        }
        Ok(())
    };
    start(&mut engine)?;
    let options = GenerateOptions {
        cancel: Some(interrupt::cancel_on_ctrl_c()),
        ..checked.generate.clone()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        match line.trim() {
            "" => continue,
            "/quit" => break,
            "/reset" => {
                engine.reset();
                start(&mut engine)?;
                continue;
            }
            _ => {}
        }
        engine.append_turn("user", &line)?;
        let mut failed = None;
        let generating = interrupt::Generating::start();
        let answer = engine.generate("", &options, &mut |piece| {
            stream(&mut out, piece, &mut failed)
        })?;
        drop(generating);
        if let Some(e) = failed {
            return Err(e).context("writing to stdout");
        }
        writeln!(out)?;
        plan.print_calls(&answer.text, &mut out)?;
        out.flush()?;
    }
    if let Some(w) = crate::saturation::warning(engine.session().cache()) {
        eprintln!("{w}");
    }
    if args.stats {
        print_stats(&engine, checked.run.engine.strategy);
        plan.stats_line().into_iter().for_each(|l| eprintln!("{l}"));
    }
    Ok(())
}
