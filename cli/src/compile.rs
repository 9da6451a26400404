//! `htpkv compile` (placeholder until the reference backend lands).

/// Arguments of `htpkv compile`.
#[derive(Debug, clap::Args)]
pub struct CompileArgs {}

pub fn run(_args: CompileArgs) -> anyhow::Result<()> {
    anyhow::bail!("`htpkv compile` is not available in this build yet")
}
