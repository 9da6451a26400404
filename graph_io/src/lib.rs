//! htpkv's IO vocabulary: the one place that says what a graph's inputs and outputs are.
//!
//! - [`IoRole`]: what a tensor is for (token ids, mask, positions or RoPE tables, past/new K/V per
//!   layer or head, cross K/V, hidden state, logits).
//! - [`IoTensor`], [`GraphDesc`], [`PartOf`], [`MaskEncoding`]: the description of one tensor and
//!   one static graph, as a backend reports it and the runtime binds it.
//! - [`KvTensor`], [`buffer_index`], [`mask_name`]: htpkv's K/V tensor names, the position of a K/V
//!   tensor among a graph's (the cache's buffer index) and the attention masks' names.
//! - [`GraphLayout`] ([`Granularity`], [`KLayout`], [`PositionInput`], [`HeadAxis`]): how a
//!   convention's graphs hold the K/V cache and take positions.
//! - [`Convention`] and [`conventions`]: IO conventions (htpkv's, Qualcomm AI Hub's, ExecuTorch's,
//!   or one described in YAML), each one set of name patterns read by the runtime
//!   ([`Convention::assign`]) and written by the compiler and the reference QNN library
//!   ([`Convention::tensor_name`], [`Convention::name_graph`]), and a set of capabilities every
//!   caller reads instead of deciding by the convention's name: its layout (and whether it is
//!   fixed), its mask encoding, IO by name or by position, what its graph names carry
//!   ([`Convention::names_parts`]), its [`Packaging`] and its [`Split`]. A [`Preset`] is a built-in
//!   convention's identity, parsed once from the command line or a file; outside this crate no
//!   code names one of its variants (a CI check holds that).
//!
//! It depends on `quant` alone (for element types and encodings), so every other crate can use it.
//! Where to add a convention: [`conventions`].

#![forbid(unsafe_code)]

mod capability;
mod convention;
pub mod conventions;
mod kv;
mod layout;
mod packaging;
mod pattern;
mod role;
mod tensor;

pub use convention::{
    Assigned, Convention, ConventionError, GraphName, GraphNames, GraphNaming, INDEX_ENTRIES,
    IndexOrder, IoRules, NameTable, role_label,
};
pub use conventions::{Preset, detect};
pub use kv::{
    KvIo, KvTensor, TensorKind, buffer_coords, buffer_index, layer_buffers, mask_name,
    parse_mask_name,
};
pub use layout::{Granularity, GraphLayout, HeadAxis, KLayout, PositionInput};
pub use packaging::{Packaging, Split};
pub use role::IoRole;
pub use tensor::{GraphDesc, IoTensor, LogitRows, MaskEncoding, PartOf, graph_set};
