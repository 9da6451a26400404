//! How a convention's graphs hold the K/V cache and the positions: the layout a compiler builds
//! and the runtime binds ([`GraphLayout`]).

/// Layout of the K tensors (V is always `rows`; `rows` by default). In files it is its lowercase
/// name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KLayout {
    /// `past_key [.., S-n, D]`: one row of D elements per token.
    #[default]
    Rows,
    /// `past_key [.., D, S-n]`: one row per channel, a token is a column.
    Transposed,
}

/// How K/V tensors are grouped into graph inputs/outputs (`per_head` by default). In files it is its
/// lowercase name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// One tensor per (layer, kv-head, K|V): `past_key_{l}_{h}` `[1, 1, S-n, D]`.
    #[default]
    PerHead,
    /// One tensor per (layer, K|V) holding every kv-head: `past_key_{l}` `[n_kv, 1, S-n, D]`,
    /// with a per-axis encoding along axis 0 (one scale/offset per head).
    PerLayer,
}

impl KLayout {
    /// Lowercase name (`rows`, `transposed`).
    pub const fn name(self) -> &'static str {
        match self {
            KLayout::Rows => "rows",
            KLayout::Transposed => "transposed",
        }
    }
}

impl std::str::FromStr for KLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rows" => Ok(KLayout::Rows),
            "transposed" => Ok(KLayout::Transposed),
            _ => Err(format!(
                "unknown K layout `{s}` (expected rows or transposed)"
            )),
        }
    }
}

impl Granularity {
    /// Lowercase name (`per_head`, `per_layer`).
    pub const fn name(self) -> &'static str {
        match self {
            Granularity::PerHead => "per_head",
            Granularity::PerLayer => "per_layer",
        }
    }
}

impl std::str::FromStr for Granularity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "per_head" => Ok(Granularity::PerHead),
            "per_layer" => Ok(Granularity::PerLayer),
            _ => Err(format!(
                "unknown tensor granularity `{s}` (expected per_head or per_layer)"
            )),
        }
    }
}

/// How a step's positions reach the graph.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PositionInput {
    /// `positions [1, n]` i32: the graph gathers its RoPE rows from a static table.
    #[default]
    Ids,
    /// `cos`/`sin` tables `[1, 1, n, D/2]` of the step's positions, computed by the runtime.
    RopeTables,
}

impl PositionInput {
    /// Lowercase name (`ids`, `rope_tables`).
    pub const fn name(self) -> &'static str {
        match self {
            PositionInput::Ids => "ids",
            PositionInput::RopeTables => "rope_tables",
        }
    }
}

/// Where a per-layer K/V tensor puts its heads: `[heads, 1, rows, D]` (htpkv's and AI Hub's) or
/// `[1, heads, rows, D]` (ExecuTorch's). In files it is its lowercase name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum HeadAxis {
    /// The heads on the first axis: `[heads, 1, rows, D]`.
    #[default]
    First,
    /// The heads on the second axis: `[1, heads, rows, D]`.
    Second,
}

impl HeadAxis {
    /// `shape` (a K/V tensor's dims as htpkv's executor holds them, heads first) in this order.
    pub fn arrange(self, shape: &[usize]) -> Vec<usize> {
        let mut out = shape.to_vec();
        if self == HeadAxis::Second && out.len() == 4 {
            out.swap(0, 1);
        }
        out
    }
}

/// The layout of a convention's graphs: K/V grouping and K layout, the axis of the heads, and how
/// positions enter. The HTP lowering (`qnn_compile`) builds the graphs from it, so a new
/// convention with a known layout needs nothing there.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(default, deny_unknown_fields)]
pub struct GraphLayout {
    /// K/V tensors per head or per layer (the heads stacked along axis 0).
    pub kv: Granularity,
    /// K as rows (`[.., rows, D]`) or transposed (`[.., D, rows]`).
    pub keys: KLayout,
    pub positions: PositionInput,
    /// Where per-layer K/V tensors put their heads (the dims a client sees).
    pub heads: HeadAxis,
}

impl GraphLayout {
    /// htpkv's own: per-head K/V rows, position ids.
    pub const HTPKV: GraphLayout = GraphLayout {
        kv: Granularity::PerHead,
        keys: KLayout::Rows,
        positions: PositionInput::Ids,
        heads: HeadAxis::First,
    };
    /// Qualcomm AI Hub's: per-layer K/V with the keys transposed, RoPE tables as inputs.
    pub const AIHUB: GraphLayout = GraphLayout {
        kv: Granularity::PerLayer,
        keys: KLayout::Transposed,
        positions: PositionInput::RopeTables,
        heads: HeadAxis::First,
    };
    /// ExecuTorch's Qualcomm llama: per-layer K/V with the keys transposed and the heads second
    /// (`k [1, kv_heads, D, rows]`, `v [1, kv_heads, rows, D]`), position ids (`input_pos`).
    pub const EXECUTORCH: GraphLayout = GraphLayout {
        kv: Granularity::PerLayer,
        keys: KLayout::Transposed,
        positions: PositionInput::Ids,
        heads: HeadAxis::Second,
    };
}
