//! The one role enum: what a graph input or output is for.

use crate::kv::{KvIo, TensorKind};

/// The role of a graph input or output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoRole {
    /// Token ids `[1, n]` i32.
    InputIds,
    /// Token embeddings instead of ids (a model whose embedding lookup runs outside the graph).
    Embeddings,
    /// The RoPE position of each new token, `[1, n]` i32.
    Positions,
    /// RoPE cosine table for the step's positions, `[.., n, width]`.
    RopeCos,
    /// RoPE sine table for the step's positions, `[.., n, width]`.
    RopeSin,
    /// An attention mask (the global one or a sliding window's, told apart by name).
    Mask,
    /// A past-key window (input).
    PastKey,
    /// A past-value window (input).
    PastValue,
    /// The new keys of this step (output).
    NewKey,
    /// The new values of this step (output).
    NewValue,
    /// `[1, n, V]` (output).
    Logits,
    /// The hidden state from the previous part of a split model.
    HiddenIn,
    /// The hidden state for the next part of a split model.
    HiddenOut,
    /// An encoder-decoder's source token ids (the encoder graph's input).
    SourceIds,
    /// A static cross-attention key tensor: an output of the encoder graph, a read-only input of
    /// every decoder graph (`cross_key_*`).
    CrossKey,
    /// A static cross-attention value tensor.
    CrossValue,
}

impl IoRole {
    /// The role of a K/V tensor. A cross tensor keeps its cross role on both sides.
    pub const fn kv(io: KvIo, kind: TensorKind) -> IoRole {
        match (io, kind) {
            (KvIo::Past, TensorKind::Key) => IoRole::PastKey,
            (KvIo::Past, TensorKind::Value) => IoRole::PastValue,
            (KvIo::New, TensorKind::Key) => IoRole::NewKey,
            (KvIo::New, TensorKind::Value) => IoRole::NewValue,
            (KvIo::Cross, TensorKind::Key) => IoRole::CrossKey,
            (KvIo::Cross, TensorKind::Value) => IoRole::CrossValue,
        }
    }

    /// The side and kind of a K/V role ([`IoRole::kv`]'s inverse), `None` for other roles.
    pub const fn kv_parts(self) -> Option<(KvIo, TensorKind)> {
        Some(match self {
            IoRole::PastKey => (KvIo::Past, TensorKind::Key),
            IoRole::PastValue => (KvIo::Past, TensorKind::Value),
            IoRole::NewKey => (KvIo::New, TensorKind::Key),
            IoRole::NewValue => (KvIo::New, TensorKind::Value),
            IoRole::CrossKey => (KvIo::Cross, TensorKind::Key),
            IoRole::CrossValue => (KvIo::Cross, TensorKind::Value),
            _ => return None,
        })
    }

    /// True for the past and new K/V roles (named per layer, optionally per head).
    pub const fn is_kv(self) -> bool {
        matches!(
            self,
            IoRole::PastKey | IoRole::PastValue | IoRole::NewKey | IoRole::NewValue
        )
    }

    /// True for roles that are graph inputs (a cross tensor is a decoder input).
    pub const fn is_input(self) -> bool {
        !matches!(
            self,
            IoRole::Logits | IoRole::NewKey | IoRole::NewValue | IoRole::HiddenOut
        )
    }

    /// A short description (`past K`, `hidden state in`, ...).
    pub const fn label(self) -> &'static str {
        match self {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_roles_round_trip_through_side_and_kind() {
        for io in [KvIo::Past, KvIo::New, KvIo::Cross] {
            for kind in [TensorKind::Key, TensorKind::Value] {
                assert_eq!(IoRole::kv(io, kind).kv_parts(), Some((io, kind)));
            }
        }
        assert_eq!(IoRole::Logits.kv_parts(), None);
        assert!(!IoRole::NewKey.is_input() && IoRole::CrossKey.is_input());
    }
}
