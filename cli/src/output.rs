//! Writing a subcommand's output to stdout, shared by every subcommand.
//!
//! A closed pipe is a normal end (`htpkv budget configs/*.yaml | head -1`): the command stops writing
//! and exits with success, without a message. Any other write error (e.g. stdout redirected to a full
//! disk or `/dev/full`) is an error naming stdout, exit status 1. Never use `print!`/`println!` for
//! a command's output: they panic on both.

use anyhow::Context as _;
use std::io::{self, Write};

/// Runs `write` on a buffered, locked stdout and flushes it. Errors carry the context "writing to
/// stdout"; [`is_broken_pipe`] recognises a closed pipe among them.
pub fn to_stdout(write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> anyhow::Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    write(&mut out)
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

/// True when `err` (anywhere in its chain) is a write to a closed pipe: the reader went away, which
/// ends the command quietly with success. `main` applies this to every subcommand's result.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_pipes_are_found_through_context() {
        let pipe = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing to stdout")
            .context("htpkv budget");
        assert!(is_broken_pipe(&pipe));
        let full =
            anyhow::Error::new(io::Error::from_raw_os_error(28)).context("writing to stdout");
        assert!(!is_broken_pipe(&full));
        assert!(!is_broken_pipe(&anyhow::anyhow!("broken pipe")));
    }
}
