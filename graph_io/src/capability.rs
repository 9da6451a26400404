//! What a convention declares beyond its names, read by the compiler and the presentation of the
//! reference QNN library instead of deciding by the convention's name: its layout and whether it
//! is fixed ([`crate::GraphLayout`]), its mask encoding ([`crate::MaskEncoding`]), IO by name or
//! by position ([`Convention::io_by_index`], [`Convention::io_order`]), its packaging and split
//! ([`crate::Packaging`], [`crate::Split`]). What its graph names can carry (parts, AR, context
//! length) follows from its patterns ([`Convention::names_parts`]); what it cannot express is
//! refused here ([`Convention::refusal`], [`Convention::layout_refusal`]).

use crate::convention::{Convention, IoRules};
use crate::layout::{Granularity, KLayout, PositionInput};
use crate::packaging::Packaging;
use crate::pattern::{Field, GRAPH_FIELDS};
use crate::role::IoRole;

impl Convention {
    /// Whether the pattern graph names are written with has field `f` (`false` when the
    /// convention writes no graph names; a malformed pattern is refused where it is read).
    fn writes_field(&self, f: Field) -> bool {
        let naming = &self.graph_naming;
        let text = naming.pattern.as_ref().or(self.graphs.first());
        text.and_then(|t| self.pattern(t, GRAPH_FIELDS).ok())
            .is_some_and(|p| p.has(f))
    }

    /// Whether its graph names carry a part number: a model cut into parts can be named by it.
    pub fn names_parts(&self) -> bool {
        self.writes_field(Field::Part) && self.writes_field(Field::Parts)
    }

    /// Whether its graph names carry the AR (else only the phase tells AR-1 from one AR-n).
    pub fn names_ar(&self) -> bool {
        self.writes_field(Field::Ar)
    }

    /// Whether its graph names carry the context length (else one file holds one).
    pub fn names_context(&self) -> bool {
        self.writes_field(Field::Context)
    }

    /// Whether its IO is found by position ([`IoRules::ByIndex`]) rather than by name.
    pub fn io_by_index(&self) -> bool {
        matches!(self.io, IoRules::ByIndex(_))
    }

    /// The order a graph's tensors are listed in under this convention, given each tensor's role,
    /// layer and head in the order a compiler holds them (all inputs or all outputs): by position,
    /// the index order's (K/V by layer, then head; a role the order does not list after those it
    /// does); by name, as given.
    pub fn io_order(&self, tensors: &[(IoRole, Option<usize>, Option<usize>)]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        if let IoRules::ByIndex(index) = &self.io {
            let rank = |r: IoRole| {
                let side = if r.is_input() {
                    &index.inputs
                } else {
                    &index.outputs
                };
                side.iter().position(|&x| x == r).unwrap_or(side.len())
            };
            order.sort_by_key(|&i| {
                let (role, layer, head) = tensors[i];
                (rank(role), layer, head)
            });
        }
        order
    }

    /// The convention a model cut into parts under this one is written under: itself when its
    /// graph names carry a part number; for a [`Packaging::File`] convention, the first of
    /// `bundles` packaged as a Genie bundle whose names do; `None` otherwise (one file only).
    pub fn parts_convention<'a>(&'a self, bundles: &'a [Convention]) -> Option<&'a Convention> {
        if self.names_parts() {
            return Some(self);
        }
        if self.packaging != Packaging::File {
            return None;
        }
        bundles
            .iter()
            .find(|c| c.packaging == Packaging::GenieBundle && c.names_parts())
    }

    /// Its graph names for an AR-n and the AR-1 graph, for messages.
    fn example_names(&self) -> String {
        let whole = crate::PartOf::default();
        let names: Vec<String> = [8, 1]
            .into_iter()
            .filter_map(|n| self.name_graph(n, 4096, whole).ok().flatten())
            .collect();
        names.join(", ")
    }

    /// Why graphs under this convention cannot be `count` parts, take RoPE tables
    /// (`rope_tables`) or have these AR variants (`None`: they can).
    pub fn refusal(&self, count: usize, rope_tables: bool, ar: &[usize]) -> Option<String> {
        let name = &self.name;
        if count > 1 && !self.names_parts() {
            return Some(format!(
                "the {name} convention cannot be cut into {count} parts: its graph names ({}) \
                 carry no part number to order them by",
                self.example_names()
            ));
        }
        let tables = self.layout.positions == PositionInput::RopeTables;
        if self.layout_fixed && rope_tables != tables {
            let [has, not] = ["position ids", "RoPE tables"];
            let (takes, refused) = if tables { (not, has) } else { (has, not) };
            return Some(format!(
                "the {name} convention takes {takes}, not {refused}"
            ));
        }
        let prefill = ar.iter().filter(|&&n| n > 1).count();
        if prefill > 1 && !self.names_ar() {
            return Some(format!(
                "the {name} convention has one AR-n graph besides AR-1 ({}): {prefill} AR \
                 variants above 1 cannot be told apart",
                self.example_names()
            ));
        }
        None
    }

    /// Why graphs under this convention cannot include prefill graphs that return only the
    /// last row's logits (`None`: they can, [`Convention::last_row_graphs`]).
    pub fn last_row_refusal(&self) -> Option<String> {
        (!self.last_row_graphs).then(|| {
            format!(
                "the {} convention's graphs are the ones it declares, each returning every row's \
                 logits: compile without last-row prefill graphs",
                self.name
            )
        })
    }

    /// Why K/V tensors `kv` with keys `keys` cannot be written under this convention (`None`:
    /// they can; only a convention whose layout is fixed refuses).
    pub fn layout_refusal(&self, kv: Granularity, keys: KLayout) -> Option<String> {
        let own = self.layout;
        if !self.layout_fixed || (kv, keys) == (own.kv, own.keys) {
            return None;
        }
        Some(format!(
            "the {} convention's K/V are {} with K {}: compile with --k-layout {} --granularity {}",
            self.name,
            own.kv.name(),
            own.keys.name(),
            own.keys.name(),
            own.kv.name()
        ))
    }
}
