//! Where a family's files store the description's tensors, whatever the format: each file
//! tensor with its shape and the model tensors it holds (several, by rows, for a fused one),
//! the check of a file's tensors against it, and the split of a fused tensor at load.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::weights::HeldTensor;
use crate::{Error, LlamaConfig, Tensor};

/// Where a tensor is stored: a file tensor's name and, for a fused one, the rows (outermost
/// dimension) that hold this tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The tensor's name in the file.
    pub name: String,
    /// The rows of a fused tensor; `None` for a tensor stored whole.
    pub rows: Option<Range<usize>>,
}

impl Stored {
    /// A tensor stored whole under `name`.
    pub fn whole(name: String) -> Stored {
        Stored { name, rows: None }
    }
}

/// A format's naming of a family's tensors.
pub type Naming = fn(Tensor, &LlamaConfig) -> Stored;

/// One file tensor as the description needs it: its shape and the model tensors it holds (with
/// their rows when it is fused).
#[derive(Debug)]
pub struct Entry {
    /// Its shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// The model tensors it holds.
    pub parts: Vec<(Tensor, Option<Range<usize>>)>,
}

impl Entry {
    /// The model tensors of this file tensor's `data`, a fused one split by rows.
    pub fn split(&self, data: Vec<f32>) -> Vec<(Tensor, Vec<f32>)> {
        let cols: usize = self.shape[1..].iter().product();
        match self.parts.as_slice() {
            [(t, None)] => vec![(*t, data)],
            parts => parts
                .iter()
                .map(|(t, rows)| {
                    let rows = rows.clone().unwrap_or(0..self.shape[0]);
                    (*t, data[rows.start * cols..rows.end * cols].to_vec())
                })
                .collect(),
        }
    }
}

/// The file tensors a model of `config` needs under `naming`, by name.
pub fn layout(naming: Naming, config: &LlamaConfig) -> BTreeMap<String, Entry> {
    let mut out: BTreeMap<String, Entry> = BTreeMap::new();
    for t in Tensor::required(config) {
        let stored = naming(t, config);
        let mut shape = t.shape(config);
        if let Some(rows) = &stored.rows {
            shape[0] = rows.end;
        }
        let e = out.entry(stored.name).or_insert(Entry {
            shape: shape.clone(),
            parts: Vec::new(),
        });
        e.shape[0] = e.shape[0].max(shape[0]);
        e.parts.push((t, stored.rows));
    }
    out
}

/// Checks that the `held` tensors (those of `skip` aside: tensors read into the description,
/// such as `rope_freqs`) are exactly those `config` needs under `naming`, with their shapes:
/// none missing, none of another shape, none left over (a tensor the description has no place
/// for means the metadata disagrees with the weights, e.g. a layer count below the file's).
/// `family` and `origin` (the description's file) name them in errors; a held tensor's error
/// names its own file.
pub fn check_held(
    config: &LlamaConfig,
    naming: Naming,
    held: &[HeldTensor<'_>],
    skip: &[&str],
    (family, origin): (&str, &str),
) -> Result<(), Error> {
    let bad = |file: &str, name: &str, reason: String| Error::BadTensor {
        origin: file.to_owned(),
        name: name.to_owned(),
        reason,
    };
    let mut wanted = layout(naming, config);
    for t in held.iter().filter(|t| !skip.contains(&t.name)) {
        let Some(e) = wanted.remove(t.name) else {
            let why = format!(
                "is not part of the model the metadata describes ({family}, {} layers{}{}): the \
                 description and the weights disagree",
                config.n_layers,
                if config.tied_output {
                    ", output tied to the embedding"
                } else {
                    ""
                },
                if config.block.qkv_bias {
                    ", Q/K/V biases"
                } else {
                    ""
                },
            );
            return Err(bad(t.file, t.name, why));
        };
        if t.shape != e.shape {
            let why = format!(
                "has shape {:?}, the description needs {:?}",
                t.shape, e.shape
            );
            return Err(bad(t.file, t.name, why));
        }
    }
    // The first missing tensor in the model's order (layer 2 before layer 10).
    let first_missing = Tensor::required(config)
        .into_iter()
        .map(|t| naming(t, config).name)
        .find(|name| wanted.contains_key(name));
    match first_missing {
        Some(name) => Err(bad(origin, &name, "is missing".to_owned())),
        None => Ok(()),
    }
}
