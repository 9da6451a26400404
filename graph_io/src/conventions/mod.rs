//! The built-in IO conventions, one file each, and the [`Preset`] enum that names them.
//!
//! # Adding a convention
//! 1. Write `conventions/{name}.rs` with `pub(crate) fn convention() -> Convention`: its graph
//!    patterns, its tensor-name table (or index order), its mask encoding, its
//!    [`GraphLayout`](crate::GraphLayout) (what the compilers build, the axis of the K/V heads
//!    clients see) and whether it is fixed, its [`Packaging`](crate::Packaging), its
//!    [`Split`](crate::Split) and, if its graph names are not written with the first graph
//!    pattern and the phases `prompt` / `token`, its [`GraphNaming`](crate::GraphNaming). The
//!    same patterns read names (the runtime) and write them (the compiler and the reference QNN
//!    library); what the names carry (parts, AR, context length) follows from them.
//! 2. Add `mod {name};`, the enum arm and its entry in [`Preset::ALL`] and [`Preset::convention`]
//!    below.
//!
//! Nothing else changes: the runtime detects and parses the new convention; `htpkv compile
//! --convention {name}` builds its layout, packages and cuts it as it declares, and refuses what
//! its names cannot carry ([`Convention::refusal`]); the reference library names and presents
//! graphs with it (order, K/V dims, mask). No code outside this crate names a [`Preset`] variant
//! (a CI check). The test `a_new_convention_is_one_file_and_one_arm` shows one.

use crate::convention::{Convention, ConventionError, GraphNames};
use crate::kv::KvTensor;
use crate::packaging::Split;
use crate::role::IoRole;
use crate::tensor::PartOf;

pub(crate) mod aihub;
pub(crate) mod executorch;
pub(crate) mod htpkv;
pub mod yaml;

/// A built-in IO convention: its identity, parsed once from the command line or a file. What it
/// does is its [`Preset::convention`]'s declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Preset {
    /// htpkv's own (the default): graphs `ar{n}_cl{c}`, K/V `past_key_{l}[_{h}]`, `new_key_…`.
    #[default]
    Htpkv,
    /// Qualcomm AI Hub's: graphs `{prompt|token}_ar{n}_cl{c}_{i}_of_{N}`, K/V
    /// `past_key_{l}_in`, `past_key_{l}_out`, … (`…_{l}_h{h}_…` per head).
    AiHub,
    /// ExecuTorch's Qualcomm llama: methods `kv_forward` (AR-1) and `prefill_forward` (the one
    /// AR-n variant), IO found by index order.
    ExecuTorch,
}

impl Preset {
    /// Every preset, in declaration order (the order detection tries them; a compiled file records
    /// its naming as the position here, so new presets are appended).
    pub const ALL: [Preset; 3] = [Preset::Htpkv, Preset::AiHub, Preset::ExecuTorch];

    /// The preset's convention. Built on each call, never kept in a static: the reference QNN
    /// library links this crate, and heap memory a static of an unloaded library holds is lost.
    pub fn convention(self) -> Convention {
        match self {
            Preset::Htpkv => htpkv::convention(),
            Preset::AiHub => aihub::convention(),
            Preset::ExecuTorch => executorch::convention(),
        }
    }

    /// The preset a model cut into parts is written under ([`Convention::parts_convention`] among
    /// the presets): this one when its graph names carry a part number, else (htpkv's, a
    /// [`Packaging::File`] convention) the preset packaged as a Genie bundle whose names do;
    /// `None` for a convention that is one file only.
    pub fn parts_naming(self) -> Option<Preset> {
        let all = Preset::ALL.map(Preset::convention);
        let own = self.convention();
        let name = &own.parts_convention(&all)?.name;
        Preset::ALL.into_iter().find(|p| &p.name() == name)
    }

    /// The preset whose own way to cut a model `split` is ([`Convention::split`]); `None` for a
    /// split no preset declares.
    pub fn owning(split: Split) -> Option<Preset> {
        Preset::ALL
            .into_iter()
            .find(|p| p.convention().split == split)
    }

    /// The convention name (`htpkv`, `aihub`, `executorch`).
    pub fn name(self) -> String {
        self.convention().name
    }

    /// The convention whose names a compiled file of this preset carries inside: ExecuTorch finds
    /// its IO by position, so its files keep htpkv's tensor names.
    pub fn tensor_names(self) -> Convention {
        let c = self.convention();
        match c.io {
            crate::IoRules::ByName(_) => c,
            crate::IoRules::ByIndex(_) => Preset::Htpkv.convention(),
        }
    }

    /// The name of the AR-`n` graph of context `context` for `part`, written by the preset's graph
    /// pattern ([`Convention::name_graph`]).
    pub fn graph_name(self, n: usize, context: usize, part: PartOf) -> String {
        let name = self.convention().name_graph(n, context, part);
        // Every preset has a well-formed graph pattern of graph fields only (tested).
        name.expect("preset patterns are well-formed")
            .expect("every preset has a graph pattern")
    }

    /// The name of K/V tensor `t` in a compiled file of this preset ([`Preset::tensor_names`]);
    /// a tensor its convention has no pattern for (cross K/V) keeps htpkv's name.
    pub fn kv_name(self, t: &KvTensor) -> String {
        let role = IoRole::kv(t.io, t.kind);
        let name = self.tensor_names().tensor_name(role, Some(t.layer), t.head);
        name.expect("preset patterns are well-formed")
            .unwrap_or_else(|| t.name())
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Preset {
    type Err = ConventionError;
    fn from_str(s: &str) -> Result<Preset, ConventionError> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ConventionError::UnknownPreset(s.to_string()))
    }
}

impl Convention {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Result<Convention, ConventionError> {
        Ok(name.parse::<Preset>()?.convention())
    }
}

/// The one preset that fits every graph; an error naming the candidates when none or several do.
pub fn detect(graphs: &[GraphNames<'_>]) -> Result<Convention, ConventionError> {
    let mut fitting: Vec<Convention> = Preset::ALL
        .into_iter()
        .map(Preset::convention)
        .filter(|c| c.fits(graphs))
        .collect();
    let presets = || Preset::ALL.map(Preset::name).join(", ");
    match fitting.len() {
        1 => Ok(fitting.remove(0)),
        0 => Err(ConventionError::Detect(format!(
            "no preset convention ({}) fits the graphs {:?}; name one or give a YAML file with \
             --convention",
            presets(),
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

#[cfg(test)]
mod tests;
