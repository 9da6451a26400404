//! What a session does when its context fills: the overflow policies ([`Overflow`]).
//!
//! - `stop`: generation ends with [`super::StopReason::ContextFull`]; a prompt that does not fit is
//!   refused.
//! - `slide { n_keep, chunk, positions }`: keep the first `n_keep` tokens (attention sinks, the system
//!   prompt), drop the oldest of the rest — at least `chunk` tokens, more when a prompt chunk needs
//!   the room — and continue. The cache moves rows ([`kv_manager::KvCache::evict`]); the kept K rows
//!   after the dropped run were rotated for their old positions, so either
//!   - [`SlidePositions::Rerotate`]: they are re-rotated by `-dropped` positions (dequantized, rotated
//!     with the model's RoPE, requantized to the same encoding; the error this adds is recorded in each
//!     [`SlideEvent`]) and positions stay `0..len`, below the context the model was compiled for; or
//!   - [`SlidePositions::Keep`]: rows stay as they are and new tokens continue at the old positions;
//!     positions then grow without bound (by one per generated token): past the model's training
//!     context the model sees positions it never saw, and the graphs' i32 positions end the session at
//!     2^31 - 1 ([`kv_manager::KvError::PositionsExhausted`]).
//! - `restart { n_keep, chunk }`: drop the same tokens, then re-prefill every kept token at its new
//!   position (exact, like a cold run on the kept text, at the cost of a prefill per slide). This is
//!   the oracle the two slide variants are measured against.

use super::{Session, SessionError};
use crate::backend::Backend;
use kv_manager::{PositionMode, RequantError};
use model::{LlamaConfig, RopePairing};
use std::time::Instant;

/// How the K rows kept after a slide get their positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidePositions {
    /// Re-rotate the moved K rows by `-dropped` positions (positions stay below the context).
    Rerotate,
    /// Keep every row's position; new tokens continue after the last one.
    Keep,
}

/// The policy when the context is full (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    #[default]
    Stop,
    Slide {
        n_keep: usize,
        chunk: usize,
        positions: SlidePositions,
    },
    Restart {
        n_keep: usize,
        chunk: usize,
    },
}

impl Overflow {
    /// The default policy for chats that outgrow the context, chosen from the measured comparison in
    /// docs/measurements/slides.md: slide with re-rotated K rows.
    pub const DEFAULT_SLIDE: SlidePositions = SlidePositions::Rerotate;

    /// Parses a policy name (`stop`, `slide`, `slide-rerotate`, `slide-keep-positions`, `restart`)
    /// with the tokens to keep and the chunk to drop.
    pub fn parse(name: &str, n_keep: usize, chunk: usize) -> Result<Overflow, SessionError> {
        Ok(match name {
            "stop" => Overflow::Stop,
            "slide" => Overflow::Slide {
                n_keep,
                chunk,
                positions: Overflow::DEFAULT_SLIDE,
            },
            "slide-rerotate" => Overflow::Slide {
                n_keep,
                chunk,
                positions: SlidePositions::Rerotate,
            },
            "slide-keep-positions" => Overflow::Slide {
                n_keep,
                chunk,
                positions: SlidePositions::Keep,
            },
            "restart" => Overflow::Restart { n_keep, chunk },
            other => {
                return Err(SessionError::Input(format!(
                    "unknown overflow policy `{other}` (expected stop, slide, slide-rerotate, \
                     slide-keep-positions or restart)"
                )));
            }
        })
    }

    /// Tokens kept and the chunk dropped, for the policies that drop tokens.
    pub fn keep_and_chunk(&self) -> Option<(usize, usize)> {
        match *self {
            Overflow::Stop => None,
            Overflow::Slide { n_keep, chunk, .. } | Overflow::Restart { n_keep, chunk } => {
                Some((n_keep, chunk))
            }
        }
    }
}

/// One slide (or restart) of a session.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlideEvent {
    /// Tokens cached before it.
    pub len_before: usize,
    /// Tokens dropped.
    pub dropped: usize,
    /// K/V rows the cache moved (all buffers).
    pub rows_moved: usize,
    /// Bytes the cache copied.
    pub bytes_copied: usize,
    /// Tokens prefilled again (`restart`).
    pub reprefilled: usize,
    /// Wall time of the slide (moves, re-rotation, re-prefill).
    pub seconds: f64,
    /// The error the K re-rotation's requantization added (`slide` with re-rotation).
    pub requant: Option<RequantError>,
}

/// The model's RoPE, to re-rotate K rows: per layer, the frequencies of its rotated pairs (a
/// sliding-window layer with a base of its own has its own, as the forward rotates it), the head
/// width and the pair layout.
#[derive(Debug, Clone)]
pub(crate) struct RopeShift {
    layers: Vec<Vec<f32>>,
    head_dim: usize,
    pairing: RopePairing,
}

impl RopeShift {
    /// The rotations of the layers `config` describes (base, scaling, partial rotary, frequency
    /// factors, and each layer's window choosing its base).
    pub(crate) fn new(config: &LlamaConfig) -> RopeShift {
        let rope = model::ops::Rope::new(config.head_dim, &config.rope);
        let layers = (0..config.n_layers)
            .map(|l| {
                let windowed = config.layer_window(l).is_some();
                rope.layer_frequencies(windowed).to_vec()
            })
            .collect();
        RopeShift {
            layers,
            head_dim: config.head_dim,
            pairing: config.rope.pairing,
        }
    }

    /// Per layer, the cos/sin tables of a rotation by `delta` positions (negative: back).
    fn tables(&self, delta: f32) -> Vec<(Vec<f32>, Vec<f32>)> {
        let one = |freqs: &[f32]| {
            freqs
                .iter()
                .map(|&f| (delta * f).sin_cos())
                .map(|(s, c)| (c, s))
                .unzip()
        };
        self.layers.iter().map(|f| one(f)).collect()
    }

    /// Rotates one head's row by the rotation of `tables`.
    fn apply(&self, row: &mut [f32], (cos, sin): &(Vec<f32>, Vec<f32>)) {
        model::ops::rope_apply_heads(row, self.head_dim, cos, sin, self.pairing);
    }
}

impl<B: Backend> Session<B> {
    /// Sets the overflow policy. `n_keep` must leave room for a step after a slide and `chunk` must
    /// be at least 1; re-rotation needs the model's RoPE ([`Session::set_rope`]).
    pub fn set_overflow(&mut self, overflow: Overflow) -> Result<(), SessionError> {
        if let Some((n_keep, chunk)) = overflow.keep_and_chunk() {
            let geometry = &self.cache.spec().geometry;
            let most = self.capacity().saturating_sub(geometry.min_ar());
            if n_keep > most || chunk == 0 {
                return Err(SessionError::Input(format!(
                    "overflow policy keeps {n_keep} tokens and drops chunks of {chunk}: keep at most \
                     {most} (the capacity {} less one step) and drop at least 1",
                    self.capacity()
                )));
            }
        }
        if matches!(
            overflow,
            Overflow::Slide {
                positions: SlidePositions::Rerotate,
                ..
            }
        ) && self.rope.is_none()
        {
            return Err(SessionError::Input(
                "re-rotating slid K rows needs the model's RoPE configuration (Session::set_rope)"
                    .into(),
            ));
        }
        self.overflow = overflow;
        Ok(())
    }

    /// The overflow policy.
    pub fn overflow(&self) -> Overflow {
        self.overflow
    }

    /// Tells the session the model's description, whose RoPE (bases, scaling, partial rotary,
    /// frequency factors, pairing) and layer windows re-rotate K rows after a slide. Refused when
    /// it does not describe the cache's layers and heads.
    pub fn set_rope(&mut self, config: &LlamaConfig) -> Result<(), SessionError> {
        let g = &self.cache.spec().geometry;
        if (config.n_layers, config.head_dim) != (g.layers, g.head_dim) {
            return Err(SessionError::Input(format!(
                "the model's description has {} layers of heads {} wide but the graphs' K/V cache \
                 {} layers of heads {} wide",
                config.n_layers, config.head_dim, g.layers, g.head_dim
            )));
        }
        self.rope = Some(RopeShift::new(config));
        Ok(())
    }

    /// Every slide so far, in order.
    pub fn slides(&self) -> &[SlideEvent] {
        &self.slides
    }

    /// Tokens a prompt may have now: what is left of the context, or, when the policy drops tokens,
    /// the capacity less the kept tokens.
    pub(crate) fn prompt_room(&self) -> usize {
        let len = self.cache.len();
        let kept = match self.overflow.keep_and_chunk() {
            None => len,
            Some((n_keep, _)) => len.min(n_keep),
        };
        self.capacity().saturating_sub(kept)
    }

    /// Makes room for `want` more tokens when the policy allows: drops at least `chunk` tokens after
    /// the first `n_keep`. With `stop`, or when nothing can be dropped, does nothing (the next step
    /// then reports the full context).
    pub(crate) fn make_room(&mut self, want: usize) -> Result<(), SessionError> {
        // A larger context length comes before any policy.
        self.grow_for(want)?;
        let (len, capacity) = (self.cache.len(), self.capacity());
        if len + want <= capacity {
            return Ok(());
        }
        let Some((n_keep, chunk)) = self.overflow.keep_and_chunk() else {
            return Ok(());
        };
        let need = len + want - capacity;
        let drop = need.max(chunk).min(len.saturating_sub(n_keep));
        if drop == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let mut event = SlideEvent {
            len_before: len,
            dropped: drop,
            rows_moved: 0,
            bytes_copied: 0,
            reprefilled: 0,
            seconds: 0.0,
            requant: None,
        };
        match self.overflow {
            Overflow::Stop => unreachable!("stop drops nothing"),
            Overflow::Slide { positions, .. } => {
                let mode = match positions {
                    SlidePositions::Rerotate => PositionMode::Renumber,
                    SlidePositions::Keep => PositionMode::Keep,
                };
                let eviction = self.cache.evict(n_keep, drop, mode)?;
                (event.rows_moved, event.bytes_copied) =
                    (eviction.rows_moved, eviction.bytes_copied);
                self.tokens.drain(n_keep..n_keep + drop);
                if positions == SlidePositions::Rerotate {
                    event.requant = Some(self.rerotate(n_keep, drop)?);
                } else {
                    self.keep_floor = Some(self.keep_floor.map_or(n_keep, |k| k.min(n_keep)));
                }
            }
            Overflow::Restart { .. } => {
                let mut kept = self.tokens[..n_keep].to_vec();
                kept.extend_from_slice(&self.tokens[n_keep + drop..]);
                self.reset();
                self.prefill(&kept)?;
                event.reprefilled = kept.len();
            }
        }
        event.seconds = started.elapsed().as_secs_f64();
        self.slides.push(event);
        Ok(())
    }

    /// Re-rotates the K rows of tokens `from..len` by `-drop` positions, each layer with its own
    /// frequencies.
    fn rerotate(&mut self, from: usize, drop: usize) -> Result<RequantError, SessionError> {
        let rope = self.rope.clone().ok_or_else(|| {
            SessionError::Input("re-rotation needs the model's RoPE configuration".into())
        })?;
        let len = self.cache.len();
        let tables = rope.tables(-(drop as f32));
        Ok(self.cache.map_key_rows(from..len, |layer, _, _, row| {
            rope.apply(row, &tables[layer])
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::RopeConfig;

    /// Two layers of heads 8 wide, layer 0 sliding (window 4) with base `window_theta`.
    fn config(rope: RopeConfig) -> LlamaConfig {
        let c = model::llama2c::Config {
            dim: 16,
            hidden_dim: 32,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 2,
            vocab_size: 32,
            seq_len: 512,
            shared_classifier: true,
        };
        let mut c = model::llama2c::llama_config(&c).with_layer_windows(&[0], 4);
        c.rope = rope;
        c
    }

    /// `raw` rotated to `pos` as layer `layer` of `c` rotates it in the forward.
    fn rotated(c: &LlamaConfig, layer: usize, raw: &[f32], pos: usize) -> Vec<f32> {
        let rope = model::ops::Rope::new(c.head_dim, &c.rope);
        let half = c.rope.rotated_dims(c.head_dim) / 2;
        let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
        let windowed = c.layer_window(layer).is_some();
        rope.cos_sin_of(windowed, pos, &mut cos, &mut sin);
        let mut out = raw.to_vec();
        model::ops::rope_apply_heads(&mut out, c.head_dim, &cos, &sin, c.rope.pairing);
        out
    }

    #[test]
    fn shifting_a_rotated_row_back_equals_rotating_it_to_the_earlier_position_per_layer() {
        let ropes = [
            RopeConfig::default(),
            RopeConfig {
                pairing: RopePairing::HalfSplit,
                theta: 1e6,
                window_theta: Some(100.0),
                ..RopeConfig::default()
            },
            RopeConfig {
                rotated: Some(4),
                freq_factors: Some(vec![1.0, 8.0]),
                window_theta: Some(50.0),
                ..RopeConfig::default()
            },
        ];
        for rope in ropes {
            let c = config(rope);
            let shift = RopeShift::new(&c);
            let tables = shift.tables(-120.0);
            let raw: Vec<f32> = (0..8).map(|i| (i as f32 * 0.7).sin()).collect();
            for (layer, table) in tables.iter().enumerate() {
                let mut shifted = rotated(&c, layer, &raw, 300);
                shift.apply(&mut shifted, table);
                let direct = rotated(&c, layer, &raw, 180);
                for (a, b) in shifted.iter().zip(&direct) {
                    assert!((a - b).abs() < 1e-3, "{:?} layer {layer}", c.rope);
                }
                assert!(shifted.iter().zip(&raw).any(|(a, b)| (a - b).abs() > 0.1));
            }
            // A window base of its own rotates the window layer differently.
            let differs = rotated(&c, 0, &raw, 180) != rotated(&c, 1, &raw, 180);
            assert_eq!(differs, c.rope.window_theta.is_some(), "{:?}", c.rope);
        }
    }
}
