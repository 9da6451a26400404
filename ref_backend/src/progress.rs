//! Progress reports of [`crate::compile`].

/// A stage of [`crate::compile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Running the float model over the calibration sequences (`done`/`total` in tokens, where
    /// a sequence that stops early counts as its full length once it is done).
    Calibrate,
    /// Quantizing or converting the weight matrices (`done`/`total` in matrices).
    QuantizeWeights,
    /// Building the graphs (`done`/`total` in graphs).
    BuildGraphs,
}

impl Stage {
    /// Short human-readable name.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Calibrate => "calibrate",
            Stage::QuantizeWeights => "weights",
            Stage::BuildGraphs => "graphs",
        }
    }
}

/// A progress report of [`crate::compile`]: `done` of `total` units of `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub stage: Stage,
    pub done: u64,
    pub total: u64,
}
