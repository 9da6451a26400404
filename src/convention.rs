//! IO conventions: how the tensors and graphs of a set of context binaries map to the roles the
//! runtime binds (tokens, mask, positions or RoPE tables, K/V per layer or per head, hidden state,
//! logits), and how graph names carry the phase, AR, context length and part of a split model.
//!
//! A convention decides roles only. Shapes, data types and encodings always come from the binary's
//! own description. Three presets are built in — `htpkv` (this runtime's own binaries), `aihub`
//! (Qualcomm AI Hub LLM exports and Genie bundles) and `executorch` (ExecuTorch's Qualcomm llama
//! export, whose IO is found by index) — and any other convention can be described in a YAML file
//! ([`Convention::from_yaml`]; the fields are documented in the README, "Qualcomm models").

use crate::backend::IoRole;
use serde::Deserialize;
use std::path::Path;

/// Errors of conventions: a file that does not parse, names that no convention fits, graphs whose
/// tensors a convention cannot place.
#[derive(Debug, thiserror::Error)]
pub enum ConventionError {
    /// The convention file could not be read.
    #[error("reading convention file")]
    Read(#[source] model::fsio::FileError),
    /// The convention file is not a valid convention.
    #[error("convention file `{path}`")]
    Parse {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A name pattern of the convention is malformed.
    #[error("convention `{convention}`: pattern `{pattern}`: {reason}")]
    Pattern {
        convention: String,
        pattern: String,
        reason: String,
    },
    /// No preset has the given name.
    #[error("unknown convention `{0}` (presets: htpkv, aihub, executorch; or a YAML file path)")]
    UnknownPreset(String),
    /// Auto-detection found no fitting preset, or several.
    #[error("{0}")]
    Detect(String),
    /// A graph's tensors do not fit the convention.
    #[error("graph `{graph}` under convention `{convention}`: {reason}")]
    Graph {
        convention: String,
        graph: String,
        reason: String,
    },
}

/// How the attention mask's values are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskEncoding {
    /// Added to the attention scores: 0 where a token is visible, a large negative value where it is
    /// masked (the encoding's zero point and its lowest integer for fixed-point tensors; htpkv and
    /// AI Hub, whose float mask is 0 / −50 before quantization).
    #[default]
    Additive,
    /// A multiplicative 0/1 mask stored as the type's extremes: the highest integer (65535 for u16)
    /// where visible, 0 where masked (ExecuTorch's Qualcomm llama).
    AttendMax,
}

/// The role of one entry of an index-ordered IO list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexedRole {
    Tokens,
    Embeddings,
    Mask,
    Positions,
    RopeCos,
    RopeSin,
    Logits,
    Hidden,
    /// One entry per layer, layers 0..L−1 in order (L is what the tensor count leaves).
    PastKeys,
    PastValues,
    NewKeys,
    NewValues,
}

/// Tensor names per role; each a list of patterns with `{layer}` and `{head}` fields (digits).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameTable {
    #[serde(default)]
    pub tokens: Vec<String>,
    #[serde(default)]
    pub embeddings: Vec<String>,
    #[serde(default)]
    pub mask: Vec<String>,
    #[serde(default)]
    pub positions: Vec<String>,
    #[serde(default)]
    pub rope_cos: Vec<String>,
    #[serde(default)]
    pub rope_sin: Vec<String>,
    #[serde(default)]
    pub logits: Vec<String>,
    #[serde(default)]
    pub past_key: Vec<String>,
    #[serde(default)]
    pub past_value: Vec<String>,
    #[serde(default)]
    pub new_key: Vec<String>,
    #[serde(default)]
    pub new_value: Vec<String>,
}

/// Tensor roles by position in the graph's input and output lists.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexOrder {
    pub inputs: Vec<IndexedRole>,
    pub outputs: Vec<IndexedRole>,
}

/// How tensors are recognised: by name or by position.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum IoRules {
    /// By name; a graph's one unnamed input and one unnamed output are the hidden state.
    ByName(Box<NameTable>),
    /// By position.
    ByIndex(IndexOrder),
}

/// An IO convention (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Convention {
    /// Name for messages.
    pub name: String,
    /// Graph-name patterns with optional fields `{phase}` (letters), `{ar}`, `{context}`, `{part}`
    /// (1-based) and `{parts}` (digits). Empty: any graph name, one part.
    #[serde(default)]
    pub graphs: Vec<String>,
    /// How tensors are recognised.
    pub io: IoRules,
    /// The mask's encoding.
    #[serde(default)]
    pub mask: MaskEncoding,
}

/// What a convention reads from one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    pub role: IoRole,
    pub layer: Option<usize>,
    pub head: Option<usize>,
}

/// What a convention reads from a graph name: part `index` (0-based) of `count`, plus the AR and
/// context length when the name carries them (checked against the shapes by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphName {
    pub part: usize,
    pub parts: usize,
    pub ar: Option<usize>,
    pub context: Option<usize>,
}

/// Names of the built-in presets.
pub const PRESETS: [&str; 3] = ["htpkv", "aihub", "executorch"];

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Convention {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Result<Convention, ConventionError> {
        let c = match name {
            "htpkv" => Convention {
                name: "htpkv".into(),
                graphs: Vec::new(),
                io: IoRules::ByName(Box::new(NameTable {
                    tokens: names(&["input_ids"]),
                    mask: names(&["attention_mask", "mask"]),
                    positions: names(&["positions"]),
                    logits: names(&["logits"]),
                    past_key: names(&["past_key_{layer}", "past_key_{layer}_{head}"]),
                    past_value: names(&["past_value_{layer}", "past_value_{layer}_{head}"]),
                    new_key: names(&["new_key_{layer}", "new_key_{layer}_{head}"]),
                    new_value: names(&["new_value_{layer}", "new_value_{layer}_{head}"]),
                    ..NameTable::default()
                })),
                mask: MaskEncoding::Additive,
            },
            "aihub" => Convention {
                name: "aihub".into(),
                graphs: names(&["{phase}_ar{ar}_cl{context}_{part}_of_{parts}"]),
                io: IoRules::ByName(Box::new(NameTable {
                    tokens: names(&["input_ids"]),
                    embeddings: names(&["input_embeds", "inputs_embeds"]),
                    mask: names(&["attention_mask"]),
                    positions: names(&["position_ids"]),
                    rope_cos: names(&["position_ids_cos"]),
                    rope_sin: names(&["position_ids_sin"]),
                    logits: names(&["logits"]),
                    past_key: names(&["past_key_{layer}_in", "past_key_{layer}_h{head}_in"]),
                    past_value: names(&["past_value_{layer}_in", "past_value_{layer}_h{head}_in"]),
                    new_key: names(&["past_key_{layer}_out", "past_key_{layer}_h{head}_out"]),
                    new_value: names(&["past_value_{layer}_out", "past_value_{layer}_h{head}_out"]),
                })),
                mask: MaskEncoding::Additive,
            },
            "executorch" => Convention {
                name: "executorch".into(),
                graphs: names(&["{phase}_forward"]),
                io: IoRules::ByIndex(IndexOrder {
                    inputs: vec![
                        IndexedRole::Tokens,
                        IndexedRole::Mask,
                        IndexedRole::Positions,
                        IndexedRole::PastKeys,
                        IndexedRole::PastValues,
                    ],
                    outputs: vec![
                        IndexedRole::Logits,
                        IndexedRole::NewKeys,
                        IndexedRole::NewValues,
                    ],
                }),
                mask: MaskEncoding::AttendMax,
            },
            other => return Err(ConventionError::UnknownPreset(other.to_string())),
        };
        Ok(c)
    }

    /// A preset name, or else the path of a YAML convention file.
    pub fn named_or_file(spec: &str) -> Result<Convention, ConventionError> {
        if PRESETS.contains(&spec) {
            return Convention::preset(spec);
        }
        let path = Path::new(spec);
        if !path.exists() {
            return Err(ConventionError::UnknownPreset(spec.to_string()));
        }
        let text = model::fsio::read_capped(path, model::fsio::FileKind::CONFIG)
            .map_err(ConventionError::Read)?;
        Convention::from_yaml(&String::from_utf8_lossy(&text), &path.display().to_string())
    }

    /// Parses a YAML convention (unknown fields rejected) and checks its patterns; `origin` names
    /// the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Convention, ConventionError> {
        let c: Convention =
            serde_saphyr::from_str(text).map_err(|source| ConventionError::Parse {
                path: origin.to_string(),
                source: Box::new(source),
            })?;
        c.check_patterns()?;
        Ok(c)
    }

    fn pattern(&self, text: &str, allowed: &[Field]) -> Result<Pattern, ConventionError> {
        Pattern::parse(text, allowed).map_err(|reason| ConventionError::Pattern {
            convention: self.name.clone(),
            pattern: text.to_string(),
            reason,
        })
    }

    fn check_patterns(&self) -> Result<(), ConventionError> {
        for g in &self.graphs {
            self.pattern(g, GRAPH_FIELDS)?;
        }
        if let IoRules::ByName(table) = &self.io {
            for (role, list) in table.entries() {
                for p in list {
                    let allowed = if role_is_kv(role) { KV_FIELDS } else { &[] };
                    self.pattern(p, allowed)?;
                }
            }
        }
        Ok(())
    }

    fn graph_err(&self, graph: &str, reason: String) -> ConventionError {
        ConventionError::Graph {
            convention: self.name.clone(),
            graph: graph.to_string(),
            reason,
        }
    }

    /// Part, part count, AR and context length from a graph name. A convention without graph
    /// patterns takes any name as its only part.
    pub fn graph_name(&self, graph: &str) -> Result<GraphName, ConventionError> {
        if self.graphs.is_empty() {
            return Ok(GraphName {
                part: 0,
                parts: 1,
                ar: None,
                context: None,
            });
        }
        for p in &self.graphs {
            let Some(c) = self.pattern(p, GRAPH_FIELDS)?.matches(graph) else {
                continue;
            };
            let parts = c.parts.unwrap_or(1);
            let part = c.part.unwrap_or(1);
            if parts == 0 || part == 0 || part > parts {
                return Err(self.graph_err(graph, format!("part {part} of {parts} is not a part")));
            }
            return Ok(GraphName {
                part: part - 1,
                parts,
                ar: c.ar,
                context: c.context,
            });
        }
        Err(self.graph_err(graph, format!("the name matches none of {:?}", self.graphs)))
    }

    /// Roles of a graph's inputs and outputs, given their names in description order.
    pub fn assign(
        &self,
        graph: &str,
        inputs: &[&str],
        outputs: &[&str],
    ) -> Result<(Vec<Assigned>, Vec<Assigned>), ConventionError> {
        match &self.io {
            IoRules::ByName(table) => Ok((
                self.assign_names(graph, table, inputs, true)?,
                self.assign_names(graph, table, outputs, false)?,
            )),
            IoRules::ByIndex(order) => Ok((
                self.assign_index(graph, &order.inputs, inputs.len(), true)?,
                self.assign_index(graph, &order.outputs, outputs.len(), false)?,
            )),
        }
    }

    fn assign_names(
        &self,
        graph: &str,
        table: &NameTable,
        names: &[&str],
        input: bool,
    ) -> Result<Vec<Assigned>, ConventionError> {
        let mut out = Vec::with_capacity(names.len());
        let mut unclaimed = Vec::new();
        for (i, name) in names.iter().enumerate() {
            // A sliding window's mask (`attention_mask_w{W}`, kv_manager's one naming rule) is a
            // mask in every convention; the session binds it by name.
            if input && kv_manager::parse_mask_name(name).is_some_and(|w| w.is_some()) {
                out.push(Assigned {
                    role: IoRole::Mask,
                    layer: None,
                    head: None,
                });
                continue;
            }
            match self.name_role(table, name, input)? {
                Some(a) => out.push(a),
                None => {
                    unclaimed.push(i);
                    out.push(Assigned {
                        role: if input {
                            IoRole::HiddenIn
                        } else {
                            IoRole::HiddenOut
                        },
                        layer: None,
                        head: None,
                    });
                }
            }
        }
        if unclaimed.len() > 1 {
            let list: Vec<&str> = unclaimed.iter().map(|&i| names[i]).collect();
            let side = if input { "inputs" } else { "outputs" };
            return Err(self.graph_err(
                graph,
                format!(
                    "{} {side} match no role ({}); only one may be the hidden state",
                    list.len(),
                    list.join(", ")
                ),
            ));
        }
        Ok(out)
    }

    /// The role a name matches on one side (inputs or outputs), if any.
    fn name_role(
        &self,
        table: &NameTable,
        name: &str,
        input: bool,
    ) -> Result<Option<Assigned>, ConventionError> {
        for (role, list) in table.entries() {
            if role_is_input(role) != input {
                continue;
            }
            let allowed = if role_is_kv(role) { KV_FIELDS } else { &[] };
            for p in list {
                if let Some(c) = self.pattern(p, allowed)?.matches(name) {
                    if role_is_kv(role) && c.layer.is_none() {
                        return Err(ConventionError::Pattern {
                            convention: self.name.clone(),
                            pattern: p.clone(),
                            reason: "a K/V pattern needs a {layer} field".into(),
                        });
                    }
                    return Ok(Some(Assigned {
                        role,
                        layer: c.layer,
                        head: c.head,
                    }));
                }
            }
        }
        Ok(None)
    }

    fn assign_index(
        &self,
        graph: &str,
        order: &[IndexedRole],
        count: usize,
        input: bool,
    ) -> Result<Vec<Assigned>, ConventionError> {
        let groups = order.iter().filter(|r| r.per_layer()).count();
        let singles = order.len() - groups;
        let side = if input { "inputs" } else { "outputs" };
        let layers = match (count.checked_sub(singles), groups) {
            (Some(0), 0) => 0,
            (Some(rest), g) if g > 0 && rest.is_multiple_of(g) => rest / g,
            _ => {
                return Err(self.graph_err(
                    graph,
                    format!(
                        "{count} {side} do not fit the order {order:?} ({singles} single tensors \
                         and {groups} per-layer groups of equal length)"
                    ),
                ));
            }
        };
        let mut out = Vec::with_capacity(count);
        for r in order {
            let role = r.role(input).ok_or_else(|| {
                self.graph_err(graph, format!("{r:?} cannot be one of the {side}"))
            })?;
            if r.per_layer() {
                out.extend((0..layers).map(|l| Assigned {
                    role,
                    layer: Some(l),
                    head: None,
                }));
            } else {
                out.push(Assigned {
                    role,
                    layer: None,
                    head: None,
                });
            }
        }
        Ok(out)
    }

    /// Whether this convention fits every graph (names and tensors).
    fn fits(&self, graphs: &[GraphNames<'_>]) -> bool {
        graphs.iter().all(|g| {
            self.graph_name(g.name).is_ok() && self.assign(g.name, &g.inputs, &g.outputs).is_ok()
        })
    }
}

/// The names of one graph and its tensors, for detection.
#[derive(Debug, Clone)]
pub struct GraphNames<'a> {
    pub name: &'a str,
    pub inputs: Vec<&'a str>,
    pub outputs: Vec<&'a str>,
}

/// The one preset that fits every graph; an error naming the candidates when none or several do.
pub fn detect(graphs: &[GraphNames<'_>]) -> Result<Convention, ConventionError> {
    let mut fitting = Vec::new();
    for name in PRESETS {
        let c = Convention::preset(name)?;
        if c.fits(graphs) {
            fitting.push(c);
        }
    }
    match fitting.len() {
        1 => Ok(fitting.remove(0)),
        0 => Err(ConventionError::Detect(format!(
            "no preset convention ({}) fits the graphs {:?}; name one or give a YAML file with \
             --convention",
            PRESETS.join(", "),
            graphs.iter().map(|g| g.name).collect::<Vec<_>>()
        ))),
        _ => Err(ConventionError::Detect(format!(
            "the graphs fit several conventions ({}); choose one with --convention",
            fitting
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

impl IndexedRole {
    fn per_layer(self) -> bool {
        matches!(
            self,
            IndexedRole::PastKeys
                | IndexedRole::PastValues
                | IndexedRole::NewKeys
                | IndexedRole::NewValues
        )
    }

    /// The runtime role on the given side, `None` when the role belongs to the other side.
    fn role(self, input: bool) -> Option<IoRole> {
        let (role, is_input) = match self {
            IndexedRole::Tokens => (IoRole::InputIds, true),
            IndexedRole::Embeddings => (IoRole::Embeddings, true),
            IndexedRole::Mask => (IoRole::Mask, true),
            IndexedRole::Positions => (IoRole::Positions, true),
            IndexedRole::RopeCos => (IoRole::RopeCos, true),
            IndexedRole::RopeSin => (IoRole::RopeSin, true),
            IndexedRole::PastKeys => (IoRole::PastKey, true),
            IndexedRole::PastValues => (IoRole::PastValue, true),
            IndexedRole::Logits => (IoRole::Logits, false),
            IndexedRole::NewKeys => (IoRole::NewKey, false),
            IndexedRole::NewValues => (IoRole::NewValue, false),
            IndexedRole::Hidden => {
                return Some(if input {
                    IoRole::HiddenIn
                } else {
                    IoRole::HiddenOut
                });
            }
        };
        (is_input == input).then_some(role)
    }
}

impl NameTable {
    fn entries(&self) -> [(IoRole, &[String]); 11] {
        [
            (IoRole::InputIds, &self.tokens),
            (IoRole::Embeddings, &self.embeddings),
            (IoRole::Mask, &self.mask),
            (IoRole::Positions, &self.positions),
            (IoRole::RopeCos, &self.rope_cos),
            (IoRole::RopeSin, &self.rope_sin),
            (IoRole::Logits, &self.logits),
            (IoRole::PastKey, &self.past_key),
            (IoRole::PastValue, &self.past_value),
            (IoRole::NewKey, &self.new_key),
            (IoRole::NewValue, &self.new_value),
        ]
    }
}

fn role_is_kv(role: IoRole) -> bool {
    matches!(
        role,
        IoRole::PastKey | IoRole::PastValue | IoRole::NewKey | IoRole::NewValue
    )
}

fn role_is_input(role: IoRole) -> bool {
    !matches!(
        role,
        IoRole::Logits | IoRole::NewKey | IoRole::NewValue | IoRole::HiddenOut
    )
}

/// A short label for a role, for `htpkv inspect`.
pub fn role_label(a: &Assigned) -> String {
    let what = match a.role {
        IoRole::InputIds => "token ids",
        IoRole::Embeddings => "embeddings",
        IoRole::Positions => "position ids",
        IoRole::RopeCos => "RoPE cos",
        IoRole::RopeSin => "RoPE sin",
        IoRole::Mask => "attention mask",
        IoRole::Logits => "logits",
        IoRole::PastKey => "past K",
        IoRole::PastValue => "past V",
        IoRole::NewKey => "new K",
        IoRole::NewValue => "new V",
        IoRole::HiddenIn => "hidden state in",
        IoRole::HiddenOut => "hidden state out",
        IoRole::SourceIds => "source ids",
        IoRole::CrossKey => "cross K",
        IoRole::CrossValue => "cross V",
    };
    let layer = a.layer.map_or(String::new(), |l| format!(" layer {l}"));
    let head = a.head.map_or(String::new(), |h| format!(" head {h}"));
    format!("{what}{layer}{head}")
}

/// Encodes a step's mask (`values`: 0.0 where visible, anything else masked) for a graph whose
/// convention uses [`MaskEncoding::AttendMax`]: the type's highest integer where visible and its
/// lowest where masked (1.0 / 0.0 for float types). `out` holds `values.len()` elements.
pub fn attend_max_mask(
    values: &[f32],
    dtype: quant::DataType,
    out: &mut [u8],
) -> Result<(), quant::QuantError> {
    let (visible, masked) = match dtype.integer_range() {
        Some((lo, hi)) => (hi as f32, lo as f32),
        None => (1.0, 0.0),
    };
    let flags: Vec<f32> = values
        .iter()
        .map(|&v| if v == 0.0 { visible } else { masked })
        .collect();
    // The identity encoding stores each integer as itself.
    let spec = match dtype.integer_range() {
        Some(_) => quant::QuantSpec::per_tensor(dtype, quant::ScaleOffset::new(1.0, 0)?)?,
        None => quant::QuantSpec::float(dtype)?,
    };
    quant::encode_f32_to_bytes(&flags, &spec, out)
}

/// Writes the RoPE cos (or sin) table of a step into `out`, encoded with `spec`: row `i` holds
/// `cos(positions[i] · f_k)` for the `rope.frequencies()` `f_k` (the table's width is the number of
/// frequencies, half the rotated head width), exactly as [`model::ops::Rope::cos_sin`] makes them
/// for the shared forward (one RoPE definition). Negative positions (never planned) count as 0.
pub fn rope_table(
    rope: &model::ops::Rope,
    positions: &[i32],
    want_sin: bool,
    spec: &quant::QuantSpec,
    out: &mut Vec<u8>,
) -> Result<(), quant::QuantError> {
    let width = rope.frequencies().len();
    let (mut cos, mut sin) = (vec![0.0; width], vec![0.0; width]);
    let mut values = Vec::with_capacity(positions.len() * width);
    for &p in positions {
        rope.cos_sin(p.max(0) as usize, &mut cos, &mut sin);
        values.extend_from_slice(if want_sin { &sin } else { &cos });
    }
    out.resize(values.len() * spec.dtype.size_bytes(), 0);
    quant::encode_f32_to_bytes(&values, spec, out)
}

/// A field of a name pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Layer,
    Head,
    Phase,
    Ar,
    Context,
    Part,
    Parts,
}

const KV_FIELDS: &[Field] = &[Field::Layer, Field::Head];
const GRAPH_FIELDS: &[Field] = &[
    Field::Phase,
    Field::Ar,
    Field::Context,
    Field::Part,
    Field::Parts,
];

impl Field {
    fn parse(s: &str) -> Option<Field> {
        Some(match s {
            "layer" => Field::Layer,
            "head" => Field::Head,
            "phase" => Field::Phase,
            "ar" => Field::Ar,
            "context" => Field::Context,
            "part" => Field::Part,
            "parts" => Field::Parts,
            _ => return None,
        })
    }

    fn accepts(self, c: u8) -> bool {
        match self {
            Field::Phase => c.is_ascii_alphabetic(),
            _ => c.is_ascii_digit(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(Field),
}

/// A parsed name pattern: literals and `{field}`s, no two fields adjacent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern(Vec<Segment>);

/// Values a pattern match captured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Captures {
    layer: Option<usize>,
    head: Option<usize>,
    ar: Option<usize>,
    context: Option<usize>,
    part: Option<usize>,
    parts: Option<usize>,
}

impl Captures {
    /// Where a numeric field's value goes (`None` for `{phase}`, which is not kept).
    fn slot(&mut self, f: Field) -> Option<&mut Option<usize>> {
        Some(match f {
            Field::Layer => &mut self.layer,
            Field::Head => &mut self.head,
            Field::Ar => &mut self.ar,
            Field::Context => &mut self.context,
            Field::Part => &mut self.part,
            Field::Parts => &mut self.parts,
            Field::Phase => return None,
        })
    }
}

/// Longest digit run a numeric field accepts (keeps every capture far below `usize::MAX`).
const MAX_DIGITS: usize = 9;

impl Pattern {
    fn parse(text: &str, allowed: &[Field]) -> Result<Pattern, String> {
        let mut segs = Vec::new();
        let mut rest = text;
        let mut seen = Vec::new();
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or("a `{` is not closed")?;
                    let name = &rest[1..end];
                    let field = Field::parse(name)
                        .filter(|f| allowed.contains(f))
                        .ok_or_else(|| format!("`{{{name}}}` is not a field here"))?;
                    if seen.contains(&field) {
                        return Err(format!("`{{{name}}}` appears twice"));
                    }
                    if matches!(segs.last(), Some(Segment::Field(_))) {
                        return Err("two fields must be separated by text".into());
                    }
                    seen.push(field);
                    segs.push(Segment::Field(field));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    if rest[..end].contains('}') {
                        return Err("a `}` has no `{`".into());
                    }
                    segs.push(Segment::Literal(rest[..end].to_string()));
                    rest = &rest[end..];
                }
            }
        }
        if segs.is_empty() {
            return Err("the pattern is empty".into());
        }
        Ok(Pattern(segs))
    }

    fn matches(&self, name: &str) -> Option<Captures> {
        let mut c = Captures::default();
        match_from(&self.0, name.as_bytes(), &mut c).then_some(c)
    }
}

/// Backtracking match of `segs` against all of `s`.
fn match_from(segs: &[Segment], s: &[u8], c: &mut Captures) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return s.is_empty();
    };
    match first {
        Segment::Literal(lit) => {
            s.starts_with(lit.as_bytes()) && match_from(rest, &s[lit.len()..], c)
        }
        Segment::Field(f) => {
            let run = s.iter().take_while(|&&b| f.accepts(b)).count();
            let limit = if *f == Field::Phase {
                run
            } else {
                run.min(MAX_DIGITS)
            };
            (1..=limit).rev().any(|len| {
                let saved = *c;
                if let Some(slot) = c.slot(*f) {
                    let value = std::str::from_utf8(&s[..len])
                        .ok()
                        .and_then(|t| t.parse::<usize>().ok());
                    let Some(v) = value else { return false };
                    *slot = Some(v);
                }
                if match_from(rest, &s[len..], c) {
                    return true;
                }
                *c = saved;
                false
            })
        }
    }
}

#[cfg(test)]
mod tests;
