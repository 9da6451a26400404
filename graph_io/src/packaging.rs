//! How a convention packages a compiled model ([`Packaging`]) and cuts it into parts ([`Split`]),
//! two of the capabilities a [`crate::Convention`] declares.

/// How a compiled model of a convention is packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Packaging {
    /// One context binary holding every graph. A model cut into parts is written as a Genie
    /// bundle under the convention packaged as one (htpkv's runtime reads both).
    #[default]
    File,
    /// One context binary, never cut into parts: its runtime loads one file (ExecuTorch's).
    FileOnly,
    /// A Genie bundle: one context binary per part, `genie_config.json` and `tokenizer.json`
    /// (AI Hub's).
    GenieBundle,
}

/// How a model is cut into parts of consecutive layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Split {
    /// htpkv's own: consecutive layers, sizes differing by at most one, earlier parts larger;
    /// part 1 embeds and runs the first layers.
    #[default]
    Balanced,
    /// AI Hub's: part 1 only the embedding, then `ceil(n_layers / (N - 1))` layers per part;
    /// the hidden state named after AI Hub's ONNX tensors.
    AiHub,
}

impl Split {
    /// Every split.
    pub const ALL: [Split; 2] = [Split::Balanced, Split::AiHub];

    /// The option name (`balanced`, `aihub`).
    pub const fn name(self) -> &'static str {
        match self {
            Split::Balanced => "balanced",
            Split::AiHub => "aihub",
        }
    }

    /// The split of an option name.
    pub fn from_name(name: &str) -> Option<Split> {
        Split::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::str::FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Split, String> {
        Split::from_name(s).ok_or_else(|| {
            let names: Vec<&str> = Split::ALL.iter().map(|s| s.name()).collect();
            format!("unknown split `{s}` (expected {})", names.join(" or "))
        })
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
