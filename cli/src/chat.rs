//! `htpkv chat`: an interactive conversation on stdin/stdout.
//!
//! Each stdin line is one user turn; the answer streams to stdout as it is sampled, followed by
//! a newline. `/reset` starts a new conversation (empty cache), `/quit` or end of input ends.
//! Empty lines are skipped. The KV cache is kept across turns: each turn feeds only the tokens
//! the cache does not hold yet (see `Engine::chat`).

use crate::generate::{GenerateArgs, open_engine, print_stats, stream};
use anyhow::Context;
use model::Message;
use std::io::{BufRead, Write};

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !args.prompt.is_empty() {
        anyhow::bail!("`htpkv chat` reads its turns from stdin; it takes no prompt argument");
    }
    let (mut engine, checked, _) = open_engine(&args)?;
    let system: Vec<Message> = args
        .system
        .as_deref()
        .map(|s| Message::new("system", s))
        .into_iter()
        .collect();
    let mut messages = system.clone();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        match line.trim() {
            "" => continue,
            "/quit" => break,
            "/reset" => {
                engine.reset();
                messages.clone_from(&system);
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", &line));
        let mut failed = None;
        let generation = engine.chat(&messages, &checked.generate, &mut |piece| {
            stream(&mut out, piece, &mut failed)
        })?;
        if let Some(e) = failed {
            return Err(e).context("writing to stdout");
        }
        writeln!(out).and_then(|()| out.flush())?;
        messages.push(Message::new("assistant", &generation.text));
    }
    if args.stats {
        print_stats(&engine, checked.engine.strategy);
    }
    Ok(())
}
