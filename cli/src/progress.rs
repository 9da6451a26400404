//! Compile progress on stderr: one bar per stage (calibration, weight conversion, ...), each left
//! finished on screen when the next starts. Hidden when stderr is not a terminal (indicatif's
//! stderr target draws nothing then), so logs and tests see no bar.

use indicatif::{ProgressBar, ProgressStyle};
use ref_backend::{Progress, Stage};

/// Bars for one compile.
#[derive(Debug, Default)]
pub struct StageBars {
    current: Option<(Stage, ProgressBar)>,
}

impl StageBars {
    /// Shows `p`, starting a new bar when the stage changes.
    pub fn update(&mut self, p: Progress) {
        if self.current.as_ref().map(|(s, _)| *s) != Some(p.stage) {
            self.finish();
            let bar = ProgressBar::new(p.total).with_prefix(p.stage.name());
            if let Ok(style) =
                ProgressStyle::with_template("{prefix:>10} [{bar:40}] {pos}/{len} {elapsed}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            self.current = Some((p.stage, bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
    }

    /// Leaves the last bar finished.
    pub fn finish(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.finish();
        }
    }
}
