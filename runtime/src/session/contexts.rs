//! Several context lengths in one model (AI Hub bundles may hold graphs `_cl512` … `_cl4096`): the
//! session starts on the smallest graphs that hold the prompt and, when the cache fills, moves it to
//! the next larger context length — a relayout of every K/V buffer into the larger geometry
//! ([`kv_manager::KvCache::relayout_into`], counted in the KV counters) — before any overflow policy
//! applies. A smaller context length runs faster (a shorter attention window, fewer bytes per step);
//! the rows, positions and encodings are the same in each, so the text is the same.
//!
//! Every context length must offer the same AR variants and the same K/V rows and encodings (checked
//! when the session is built); the strategy is the session's in each. The session never moves back
//! to a smaller context length (a reset keeps the current one).

use super::{Session, SessionError, Slots, cache_spec_for_context};
use crate::backend::{Backend, GraphDesc};
use kv_manager::{RegionAllocator, Strategy};
use model::RopeConfig;

/// The context lengths a session may move to, and what moving needs.
#[derive(Debug)]
pub(super) struct Tiers {
    /// The context lengths of the graphs, ascending (one when the session does not move).
    contexts: Vec<usize>,
    /// Where a larger context's region comes from (`None`: the session does not move).
    allocator: Option<Box<dyn RegionAllocator + Send>>,
    /// RoPE for the cos/sin tables of the graphs that take them.
    pub(super) rope: Option<RopeConfig>,
    /// The capacity of the largest context length, when the session may move to it.
    pub(super) capacity: Option<usize>,
}

impl Tiers {
    /// One context length, never left.
    pub(super) fn fixed(context: usize, rope: Option<RopeConfig>) -> Tiers {
        Tiers {
            contexts: vec![context],
            allocator: None,
            rope,
            capacity: None,
        }
    }
}

/// The context lengths of the graphs (their masks' last dimension), ascending and distinct.
pub(super) fn lengths(graphs: &[GraphDesc]) -> Result<Vec<usize>, SessionError> {
    let mut all: Vec<usize> = graphs.iter().filter_map(GraphDesc::context).collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return Err(SessionError::Graphs(
            "no graph has an attention mask input".into(),
        ));
    }
    Ok(all)
}

/// The largest context length of the graphs.
pub(super) fn largest(graphs: &[GraphDesc]) -> Result<usize, SessionError> {
    Ok(*lengths(graphs)?.last().expect("at least one"))
}

impl<B: Backend> Session<B> {
    /// As [`Session::with_rope`], for graphs of several context lengths: the session starts on the
    /// smallest, and moves its cache to the smallest larger one that holds what a step needs when
    /// it fills (a prompt moves it before its first step), until the largest; only then does the
    /// overflow policy apply. [`Session::capacity`] is the largest context length's. Every context
    /// length must have the same AR variants and the same K/V rows and encodings (else an error
    /// naming them); each region comes from `allocator`.
    pub fn with_contexts(
        backend: B,
        strategy: Strategy,
        allocator: Box<dyn RegionAllocator + Send>,
        rope: Option<RopeConfig>,
    ) -> Result<Self, SessionError> {
        let graphs = backend.graphs();
        let contexts = lengths(graphs)?;
        let specs = contexts
            .iter()
            .map(|&c| cache_spec_for_context(graphs, strategy, c))
            .collect::<Result<Vec<_>, _>>()?;
        let (first, last) = (&specs[0], &specs[specs.len() - 1]);
        for (c, spec) in contexts.iter().zip(&specs) {
            // The strategy must serve every context length (e.g. a `shift` reservation of fixed
            // rows), refused now rather than when the cache fills.
            spec.region_bytes()?;
            let (g, l) = (&spec.geometry, &last.geometry);
            let same_rows = (g.layers, g.kv_heads, g.head_dim, g.dtype)
                == (l.layers, l.kv_heads, l.head_dim, l.dtype)
                && spec.encodings == last.encodings;
            if g.ar_variants != l.ar_variants || !same_rows {
                return Err(SessionError::Graphs(format!(
                    "the graphs of context {c} (AR {:?}) and of context {} (AR {:?}) differ in \
                     their AR variants or their K/V rows and encodings; a session moves between \
                     context lengths only when they agree",
                    g.ar_variants, l.context, l.ar_variants
                )));
            }
        }
        let capacity = Some(last.geometry.capacity());
        let start = first.geometry.context;
        let tiers = Tiers {
            contexts,
            allocator: None,
            rope,
            capacity,
        };
        let mut session = Session::build(backend, strategy, allocator.as_ref(), start, tiers)?;
        session.tiers.allocator = Some(allocator);
        Ok(session)
    }

    /// The context lengths the session may run, ascending (one unless built with
    /// [`Session::with_contexts`]).
    pub fn context_lengths(&self) -> &[usize] {
        &self.tiers.contexts
    }

    /// The context length of the graphs the session runs now.
    pub fn context(&self) -> usize {
        self.cache.spec().geometry.context
    }

    /// Moves the cache to a larger context length when `want` more tokens do not fit the current
    /// one: to the smallest that holds them, else the largest. Does nothing when the session has
    /// one context length.
    pub(crate) fn grow_for(&mut self, want: usize) -> Result<(), SessionError> {
        let need = self.cache.len() + want;
        let (spec, strategy) = (&self.cache.spec().geometry, self.cache.spec().strategy);
        if need <= spec.capacity() || self.tiers.allocator.is_none() {
            return Ok(());
        }
        let context = spec.context;
        let larger: Vec<usize> = self
            .tiers
            .contexts
            .iter()
            .copied()
            .filter(|&c| c > context)
            .collect();
        let mut target = None;
        for c in larger {
            let spec = cache_spec_for_context(self.backend.graphs(), strategy, c)?;
            let fits = need <= spec.geometry.capacity();
            target = Some(spec);
            if fits {
                break;
            }
        }
        match target {
            Some(spec) => self.relayout(spec),
            None => Ok(()),
        }
    }

    /// Moves the cache into `spec`'s geometry and binds the graphs of its context length.
    fn relayout(&mut self, spec: kv_manager::CacheSpec) -> Result<(), SessionError> {
        let allocator = self
            .tiers
            .allocator
            .as_deref()
            .expect("only sessions with an allocator move");
        let cache = self.cache.relayout_into(spec, allocator)?;
        let Slots {
            slots,
            vocab,
            hidden,
        } = Self::slots_for(self.backend.graphs(), &cache, self.tiers.rope.as_ref())?;
        if vocab != self.vocab {
            return Err(SessionError::Graphs(format!(
                "the graphs of context {} give {vocab} logits, those of context {} {}",
                cache.spec().geometry.context,
                self.context(),
                self.vocab
            )));
        }
        let region = cache.region();
        if let Err(e) = self
            .backend
            .attach_region(region.as_ptr(), region.len(), region.fd())
        {
            // The session stays on its current cache, so the backend goes back to its region.
            let old = self.cache.region();
            self.backend
                .attach_region(old.as_ptr(), old.len(), old.fd())?;
            return Err(e.into());
        }
        self.cache = cache;
        self.slots = slots;
        for (buffer, bytes) in self.hidden.iter_mut().zip(&hidden) {
            buffer.resize((*bytes).max(buffer.len()), 0);
        }
        self.hidden
            .extend(hidden.iter().skip(self.hidden.len()).map(|&n| vec![0; n]));
        Ok(())
    }
}
