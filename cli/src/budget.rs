//! `htpkv budget` and `htpkv plan` (owned by the budget work; placeholder until it lands).

/// Arguments of `htpkv budget`.
#[derive(Debug, clap::Args)]
pub struct BudgetArgs {}

/// Arguments of `htpkv plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {}

pub fn run_budget(_args: BudgetArgs) -> anyhow::Result<()> {
    anyhow::bail!("`htpkv budget` is not available in this build yet")
}

pub fn run_plan(_args: PlanArgs) -> anyhow::Result<()> {
    anyhow::bail!("`htpkv plan` is not available in this build yet")
}
