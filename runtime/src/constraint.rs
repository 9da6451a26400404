//! Constrained decoding: a logit mask applied before sampling, on every backend.
//!
//! A [`ConstraintFactory`] is what a request carries (a compiled JSON schema, regex or grammar; it
//! is shared and immutable); each generation asks it for a fresh [`Constraint`], the parser state
//! that follows the generated tokens. The generation loop masks the logits with
//! [`Constraint::mask`], samples, then reports the chosen token with [`Constraint::commit`]. A
//! constraint that is complete allows only the model's end-of-text token, so generation ends the
//! usual way. The implementation over `llguidance` is in the `htpkv_structured` crate; the runtime
//! knows only this seam.

use std::fmt::Debug;

/// Why a constraint could not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("output constraint: {0}")]
pub struct ConstraintError(pub String);

/// The parser state of one constrained generation.
pub trait Constraint: Send + Debug {
    /// Sets the logit of every token that may not come next to negative infinity. An error when no
    /// token may come next (the grammar cannot be completed).
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError>;
    /// Advances past `token`, which the sampler chose from the masked logits.
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError>;
}

/// A compiled constraint, shared by the generations that use it.
pub trait ConstraintFactory: Send + Sync + Debug {
    /// A fresh parser state at the start of the output.
    fn start(&self) -> Result<Box<dyn Constraint>, ConstraintError>;
}
