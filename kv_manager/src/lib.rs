//! kv_manager: an application-managed KV cache for static-shape LLM graphs (Qualcomm HTP and the
//! reference backend).
//!
//! A static AR-n graph takes, per layer and kv-head, a left-padded past window `[S - n, D]` of K and
//! of V and writes n new rows. This crate keeps every K/V buffer in **one contiguous region**, builds
//! the **IO binding plan** of each step (where each past/new tensor lives in the region, the attention
//! mask, the positions), and updates the cache after the step with one of four strategies (one
//! module each under [`strategy`], with their closed-form predictions, see [`predict`]):
//!
//! | strategy | region (B buffers) | per step |
//! |---|---|---|
//! | `shift` | B x R rows (R = 2(S-1) for `ar: [1]`) | pointer shift; a rebase (copy) when R is smaller |
//! | `conveyor` | (B - 1) x S + (S - min ar) + (S - 1) rows | pointer shift, never a copy |
//! | `smart_mask` | B x (S - min ar + max ar) rows | copy the new rows into slots |
//! | `naive` | same as `smart_mask` | slide the whole window left, append |
//!
//! ## Contracts shared by all strategies
//! - Capacity: the cache holds at most S - min(ar) tokens (S - 1 with an AR-1 graph); an AR-n step
//!   needs `len + n <= capacity`, else [`KvError::ContextFull`]. (With AR-1, a context of S tokens is
//!   S - 1 processed tokens plus the last one, sampled from the final logits.)
//! - The mask is `[n, S]`: column `j < S - n` is row j of every past window, column `S - n + i` is new
//!   token i; new tokens are causal, so padded tail tokens of a partial prefill chunk are never seen by
//!   real ones. Positions are `len + i`.
//! - Sliding-window layers ([`Geometry::windows`]): a layer of window W binds the last W - 1 rows of
//!   its window as its past tensors in every AR variant and takes the mask
//!   [`mask_name`]`(Some(W))`, `[n, W - 1 + n]`, under which new token i sees exactly the last W
//!   positions ([`WindowMask`]). `shift`, `conveyor` and `naive` (per_head, K rows) serve them;
//!   other combinations are refused with the reason. See [Sliding-window buffers](#sliding-window-buffers)
//!   for their sizes.
//! - Past and new tensors of a buffer share one encoding ([`encodings_from_graphs`] refuses graphs
//!   where they differ): updating is a byte copy or a pointer shift, never a requantization.
//! - Bytes outside visible rows (padding) are unspecified but always hold data the cache once held or
//!   zeros, so they are finite.
//!
//! ## The conveyor invariant
//! Let W_max = S - min(ar). Buffer b's token t lives at row `b*S + W_max + t` and never moves. At
//! length `len` an AR-n step binds buffer b's past window to rows `[b*S + len + n - min_ar,
//! b*S + W_max + len)` and its n outputs to `[b*S + W_max + len, b*S + W_max + len + n)`: together
//! exactly the S rows `[b*S + len + n - min_ar, (b+1)*S + len + n - min_ar)`, so the spans of
//! consecutive buffers tile without overlap. Besides b's own tokens, b's window covers only slots
//! `t >= len + n` of buffer b - 1, which hold no valid token (they are masked padding); b's outputs land
//! in its own slots `[len, len + n)`, which no window reads and no valid token occupies (`len + n <=
//! S - 1`). Hence no step overwrites a valid row or a row being read, with zero copies for any mix of AR
//! variants, partial commits, rollbacks and resets; the property tests check exactly this. The region
//! ends after the last buffer's last possible output: `(B - 1)*S + W_max + (S - 1)` rows.
//!
//! ## Sliding-window buffers
//! A sliding layer of window W keeps only its last `K = min(W - 1 + max(ar), S - min(ar))` tokens
//! ([`Geometry::kept_rows`]): the W - 1 its window shows plus one largest step, so that a rollback
//! of up to max(ar) tokens (a speculative step's rejected tokens) still finds its rows. Its buffers
//! are sized for that (per buffer, where a global layer's are as in the table):
//! - `shift`: `R = K + room` rows, room = floor((f - 1) x K) for a reservation `f x`, the global
//!   buffer's spare rows for `+N` and a row count, and at least max(ar) ([`Reserve::slide_room`]). The
//!   window end starts (and rebases) at K instead of W_max; a rebase moves `min(len, K)` rows.
//! - `conveyor`: token t of buffer b lives at `base[b] + t`; the gap before a sliding buffer is
//!   `min(K + max(ar), S)` instead of S (the previous buffer's outputs land at least K rows behind
//!   its newest token, so they only overwrite tokens it no longer keeps), and buffer 0 starts at
//!   W - 1 when it slides. The region ends `capacity` rows after the last buffer's base.
//! - `naive`: a slot window of K rows instead of W_max (the window slides left every commit, so it
//!   holds exactly the last K tokens), plus max(ar) output rows.
//!
//! Invariants (checked by `tests/it/windows.rs` against a row-list reference, with the region size):
//! - [`KvCache::first_held`]`(layer)` is the oldest token the layer still holds: it grows to
//!   `len - K` on commits, drops to the new length on a rollback below it, is 0 after a reset and
//!   `len - min(len, W - 1)` after an import or an eviction (they restore only the window). Every
//!   held token's row is exact; older rows are unspecified (data the cache once held).
//! - A rollback to a length whose window would show a token older than `first_held` is refused
//!   ([`KvError::RollbackPastWindow`]): a rollback of up to max(ar) tokens below the longest length
//!   since the last reset, import or eviction always works, and so does a rollback to 0.
//! - Snapshots of a sliding layer hold its last `min(len, W - 1)` rows; an import needs, per buffer,
//!   the rows the target layer shows (see [`snapshot`]). Relayouts need the same of the source
//!   ([`KvError::RelayoutMismatch`]); an eviction whose new window would show a token no longer
//!   held is refused ([`KvError::EvictionPastWindow`]), otherwise it rewrites the shown rows.
//!   [`BeamKv`] refuses sliding layers (a beam's rows are not the cache's last rows).
//!
//! ## Static cross-attention K/V
//! A [`CacheSpec`] may declare static buffers for an encoder-decoder's cross-attention
//! ([`CrossSpec`]): E rows per (layer, KV head, K|V) with their own encodings, in the same region,
//! bound read-only in every plan ([`Plan::cross`]), filled once per request
//! ([`KvCache::fill_cross`], [`KvCache::clear_cross`]) and never moved; see [`static_kv`].
//!
//! ## Snapshots
//! [`KvCache::export_rows`] reads the valid rows of every buffer in logical order (token 0..len) into
//! a [`KvSnapshot`], whatever the strategy and layout; [`KvCache::import_rows`] refills a cache of the
//! same row shape and encodings, with any strategy and layout, so that later steps see exactly those
//! rows (see [`snapshot`]). Sessions are saved and restored this way.
//!
//! ## Relayouts
//! [`KvCache::relayout_into`] moves a cache into a new one built from another spec with the same row
//! shape and encodings (typically the graphs of a larger context length): every valid row is copied
//! from where it lives now to where the new geometry and strategy keep it, positions continue, and
//! the totals carry over with the relayout counted (`relayouts`, `rows_moved_by_relayouts`,
//! `bytes_moved_by_relayouts`).

pub mod beam;
mod cache;
mod counters;
mod error;
pub mod evict;
mod geometry;
mod plan;
pub mod predict;
mod region;
mod relayout;
pub mod saturation;
pub mod size;
pub mod snapshot;
pub mod static_kv;
pub mod strategy;
pub mod workload;

pub use beam::{BeamCounters, BeamError, BeamKv};
pub use cache::KvCache;
pub use counters::{Counters, StepStats};
pub use error::KvError;
pub use evict::{Eviction, PositionMode, RequantError};
pub use geometry::{
    CacheSpec, Geometry, Granularity, KLayout, KvIo, KvTensor, TensorKind, encodings_from_graphs,
    mask_name, parse_mask_name,
};
pub use plan::{Plan, TensorBinding, TensorId, WindowMask};
pub use region::{HostAllocator, REGION_ALIGN, Region, RegionAllocator, RegionMemory};
pub use saturation::{BufferSaturation, Saturation};
pub use size::{
    MAX_AR_VARIANTS, MAX_BUFFERS, MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS,
    MAX_RESERVE_ROWS, Size,
};
pub use snapshot::{KvSnapshot, RowShape};
pub use static_kv::{CROSS_ALIGN, CrossSpec};
pub use strategy::{Reserve, Strategy};
