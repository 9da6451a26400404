//! `htpkv generate` (placeholder until the runtime lands).

/// Arguments of `htpkv generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {}

pub fn run(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`htpkv generate` is not available in this build yet")
}
