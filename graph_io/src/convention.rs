//! IO conventions: how the tensors and graphs of a set of context binaries map to [`IoRole`]s, and
//! how graph names carry the phase, AR, context length and part of a split model.
//!
//! A convention decides roles and names only; shapes, data types and encodings always come from
//! the binary's own description. Its name patterns work both ways: [`Convention::assign`] and
//! [`Convention::graph_name`] read names (the runtime), [`Convention::tensor_name`] and
//! [`Convention::name_graph`] write them (the compiler, and the presentation of the reference QNN
//! library). The built-in conventions are in [`crate::conventions`]; any other can be described in
//! YAML ([`crate::conventions::yaml`]).

use serde::Deserialize;

use crate::kv::parse_mask_name;
use crate::pattern::{Captures, Field, GRAPH_FIELDS, KV_FIELDS, Pattern};
use crate::role::IoRole;
use crate::tensor::{MaskEncoding, PartOf};

/// Errors of conventions: a file that does not parse, names that no convention fits, graphs whose
/// tensors a convention cannot place.
#[derive(Debug, thiserror::Error)]
pub enum ConventionError {
    /// The convention file could not be read (the cause names the file).
    #[error("reading convention file")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
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

/// Tensor names per role; each a list of patterns with `{layer}` and `{head}` fields (digits).
/// Reading tries every pattern; writing uses the first whose fields fit (`{head}` or not).
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

/// Tensor roles by position in the graph's input and output lists. A K/V role stands for one
/// entry per layer, layers 0..L−1 in order (L is what the tensor count leaves). In YAML the
/// entries are named as in [`INDEX_ENTRIES`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexOrder {
    #[serde(deserialize_with = "input_entries")]
    pub inputs: Vec<IoRole>,
    #[serde(deserialize_with = "output_entries")]
    pub outputs: Vec<IoRole>,
}

/// The YAML names of index-order entries and their roles as an input and as an output (`hidden`
/// is the hidden state from the previous part or for the next; the plural K/V names are the
/// per-layer groups).
pub const INDEX_ENTRIES: [(&str, IoRole, IoRole); 12] = [
    ("tokens", IoRole::InputIds, IoRole::InputIds),
    ("embeddings", IoRole::Embeddings, IoRole::Embeddings),
    ("mask", IoRole::Mask, IoRole::Mask),
    ("positions", IoRole::Positions, IoRole::Positions),
    ("rope_cos", IoRole::RopeCos, IoRole::RopeCos),
    ("rope_sin", IoRole::RopeSin, IoRole::RopeSin),
    ("logits", IoRole::Logits, IoRole::Logits),
    ("hidden", IoRole::HiddenIn, IoRole::HiddenOut),
    ("past_keys", IoRole::PastKey, IoRole::PastKey),
    ("past_values", IoRole::PastValue, IoRole::PastValue),
    ("new_keys", IoRole::NewKey, IoRole::NewKey),
    ("new_values", IoRole::NewValue, IoRole::NewValue),
];

fn input_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IoRole>, D::Error> {
    index_entries(d, true)
}

fn output_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IoRole>, D::Error> {
    index_entries(d, false)
}

fn index_entries<'de, D: serde::Deserializer<'de>>(
    d: D,
    input: bool,
) -> Result<Vec<IoRole>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    names
        .iter()
        .map(|name| {
            let entry = INDEX_ENTRIES.iter().find(|(n, ..)| n == name);
            entry
                .map(|&(_, i, o)| if input { i } else { o })
                .ok_or_else(|| {
                    let known: Vec<&str> = INDEX_ENTRIES.iter().map(|(n, ..)| *n).collect();
                    serde::de::Error::custom(format!(
                        "unknown IO entry `{name}`, expected one of {}",
                        known.join(", ")
                    ))
                })
        })
        .collect()
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

/// How the compiler names graphs (not part of a YAML file: a YAML convention writes graph names
/// with its first graph pattern and the phases `prompt` / `token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNaming {
    /// The pattern graph names are written with; `None`: the first of [`Convention::graphs`].
    pub pattern: Option<String>,
    /// `{phase}` of an AR-n graph with n > 1.
    pub prompt: String,
    /// `{phase}` of the AR-1 graph.
    pub token: String,
}

impl Default for GraphNaming {
    fn default() -> Self {
        GraphNaming {
            pattern: None,
            prompt: "prompt".into(),
            token: "token".into(),
        }
    }
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
    /// How graph names are written.
    #[serde(skip)]
    pub graph_naming: GraphNaming,
    /// How the graphs hold K/V and take positions (what the compilers build); htpkv's by
    /// default.
    #[serde(default)]
    pub layout: crate::GraphLayout,
    /// Whether the graphs must have exactly [`Convention::layout`] (a foreign runtime expects it:
    /// ExecuTorch's), or `layout` is what a compiler builds unless asked for another (htpkv's
    /// runtime reads the layout from the shapes). Not part of a YAML file.
    #[serde(skip)]
    pub layout_fixed: bool,
    /// Whether a compiler may add, beside each AR-n graph (n > 1), a prefill graph returning
    /// only the last row's logits ([`crate::LogitRows::Last`]; htpkv's runtime reads the rows a
    /// graph returns from its logits shape), or the convention's graphs are exactly the ones it
    /// declares, each returning every row (a foreign runtime's: AI Hub's, Genie's,
    /// ExecuTorch's). Not part of a YAML file: a YAML convention keeps what it declares.
    #[serde(skip)]
    pub last_row_graphs: bool,
    /// How a compiled model is packaged (not part of a YAML file).
    #[serde(skip)]
    pub packaging: crate::Packaging,
    /// How a model is cut into parts when it is (not part of a YAML file).
    #[serde(skip)]
    pub split: crate::Split,
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

/// The names of one graph and its tensors, for detection.
#[derive(Debug, Clone)]
pub struct GraphNames<'a> {
    pub name: &'a str,
    pub inputs: Vec<&'a str>,
    pub outputs: Vec<&'a str>,
}

/// `v` as owned strings (for building conventions).
pub(crate) fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Convention {
    pub(crate) fn pattern(
        &self,
        text: &str,
        allowed: &[Field],
    ) -> Result<Pattern, ConventionError> {
        Pattern::parse(text, allowed).map_err(|reason| ConventionError::Pattern {
            convention: self.name.clone(),
            pattern: text.to_string(),
            reason,
        })
    }

    /// Checks every pattern of the convention.
    pub(crate) fn check_patterns(&self) -> Result<(), ConventionError> {
        let graph_patterns = self.graphs.iter().chain(&self.graph_naming.pattern);
        for g in graph_patterns {
            self.pattern(g, GRAPH_FIELDS)?;
        }
        if let IoRules::ByName(table) = &self.io {
            for (role, list) in table.entries() {
                for p in list {
                    self.pattern(p, fields_of(role))?;
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

    /// The name of the AR-`n` graph of context `context` for `part` ([`GraphName`]'s inverse);
    /// `None` when the convention has no graph pattern.
    pub fn name_graph(
        &self,
        n: usize,
        context: usize,
        part: PartOf,
    ) -> Result<Option<String>, ConventionError> {
        let naming = &self.graph_naming;
        let Some(text) = naming.pattern.as_ref().or(self.graphs.first()) else {
            return Ok(None);
        };
        let phase = if n > 1 { &naming.prompt } else { &naming.token };
        let values = Captures {
            phase: Some(phase),
            ar: Some(n),
            context: Some(context),
            part: Some(part.index + 1),
            parts: Some(part.count),
            ..Captures::default()
        };
        Ok(self.pattern(text, GRAPH_FIELDS)?.render(&values))
    }

    /// The name of the tensor of `role` (of `layer` and `head` for K/V) from the first pattern of
    /// the role whose fields are exactly the given ones; `None` when no pattern fits (or the
    /// convention finds tensors by position).
    pub fn tensor_name(
        &self,
        role: IoRole,
        layer: Option<usize>,
        head: Option<usize>,
    ) -> Result<Option<String>, ConventionError> {
        let IoRules::ByName(table) = &self.io else {
            return Ok(None);
        };
        let Some((_, list)) = table.entries().into_iter().find(|(r, _)| *r == role) else {
            return Ok(None);
        };
        let values = Captures {
            layer,
            head,
            ..Captures::default()
        };
        for text in list {
            let p = self.pattern(text, fields_of(role))?;
            let fits =
                p.has(Field::Layer) == layer.is_some() && p.has(Field::Head) == head.is_some();
            if fits {
                return Ok(p.render(&values));
            }
        }
        Ok(None)
    }

    /// The role a tensor name has on one side (inputs or outputs), `None` when no pattern of the
    /// convention matches it (or the convention finds tensors by position).
    pub fn parse_tensor(
        &self,
        name: &str,
        input: bool,
    ) -> Result<Option<Assigned>, ConventionError> {
        match &self.io {
            IoRules::ByName(table) => self.name_role(table, name, input),
            IoRules::ByIndex(_) => Ok(None),
        }
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
            // A sliding window's mask (`attention_mask_w{W}`, the one mask-naming rule) is a mask
            // in every convention; the session binds it by name.
            if input && parse_mask_name(name).is_some_and(|w| w.is_some()) {
                out.push(plain(IoRole::Mask));
                continue;
            }
            match self.name_role(table, name, input)? {
                Some(a) => out.push(a),
                None => {
                    unclaimed.push(i);
                    out.push(plain(if input {
                        IoRole::HiddenIn
                    } else {
                        IoRole::HiddenOut
                    }));
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
            if role.is_input() != input {
                continue;
            }
            for p in list {
                if let Some(c) = self.pattern(p, fields_of(role))?.matches(name) {
                    if role.is_kv() && c.layer.is_none() {
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
        order: &[IoRole],
        count: usize,
        input: bool,
    ) -> Result<Vec<Assigned>, ConventionError> {
        let groups = order.iter().filter(|r| r.is_kv()).count();
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
        for &role in order {
            if role.is_input() != input {
                return Err(self.graph_err(graph, format!("{role:?} cannot be one of the {side}")));
            }
            if role.is_kv() {
                out.extend((0..layers).map(|l| Assigned {
                    role,
                    layer: Some(l),
                    head: None,
                }));
            } else {
                out.push(plain(role));
            }
        }
        Ok(out)
    }

    /// Whether this convention fits every graph (names and tensors).
    pub(crate) fn fits(&self, graphs: &[GraphNames<'_>]) -> bool {
        graphs.iter().all(|g| {
            self.graph_name(g.name).is_ok() && self.assign(g.name, &g.inputs, &g.outputs).is_ok()
        })
    }
}

fn plain(role: IoRole) -> Assigned {
    Assigned {
        role,
        layer: None,
        head: None,
    }
}

/// The fields a tensor pattern of `role` may have.
fn fields_of(role: IoRole) -> &'static [Field] {
    if role.is_kv() { KV_FIELDS } else { &[] }
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

/// A short label for a role, for `htpkv inspect`.
pub fn role_label(a: &Assigned) -> String {
    let layer = a.layer.map_or(String::new(), |l| format!(" layer {l}"));
    let head = a.head.map_or(String::new(), |h| format!(" head {h}"));
    format!("{}{layer}{head}", a.role.label())
}
