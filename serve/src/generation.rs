//! One generation on a blocking thread, streamed to the async side through a bounded channel.
//!
//! The blocking thread owns the session ([`Lease`]) for the whole generation and gives it back
//! when it ends, whatever the end. The async side owns a [`CancelOnDrop`]: when the client goes
//! away, the response (or its stream) is dropped, the guard cancels, and the generation stops at
//! its next step; a text piece that finds the channel closed stops it too.

use crate::api::Usage;
use crate::error::ApiError;
use crate::pool::{Lease, common_prefix};
use htpkv::session::{Cancel, GenerateOptions, StopReason};
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;

/// What the generation thread sends.
#[derive(Debug)]
pub enum Piece {
    Text(String),
    Done(Outcome),
    Failed(ApiError),
}

/// How a generation ended.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub stop: StopReason,
    pub usage: Usage,
    /// Prompt tokens the session's cache already held.
    pub reused: usize,
}

/// Cancels the generation when dropped (the client went away, or the answer is complete).
#[derive(Debug)]
pub struct CancelOnDrop(pub Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Text pieces buffered between the generation and the client.
const CHANNEL: usize = 64;

/// Starts generating after `prompt` (BOS first) on a blocking thread; returns the pieces'
/// receiver and the guard that cancels it. `options.cancel` is set here.
pub fn start(
    lease: Lease,
    prompt: Vec<u32>,
    mut options: GenerateOptions,
) -> (mpsc::Receiver<Piece>, CancelOnDrop) {
    let cancel = Cancel::new();
    options.cancel = Some(cancel.clone());
    let (tx, rx) = mpsc::channel(CHANNEL);
    let registration = lease.pool().register(cancel.clone());
    tokio::task::spawn_blocking(move || {
        let _registration = registration;
        let last = run(lease, &prompt, &options, &tx);
        // The receiver may be gone (a client that left): nothing to tell then.
        let _ = tx.blocking_send(last);
    });
    (rx, CancelOnDrop(cancel))
}

/// Prefills what the session does not hold of `prompt`, then generates; every text piece goes to
/// `tx` (a closed channel stops the generation). Returns the last message.
fn run(
    mut lease: Lease,
    prompt: &[u32],
    options: &GenerateOptions,
    tx: &mpsc::Sender<Piece>,
) -> Piece {
    let pool = lease.pool().clone();
    let engine = lease.engine();
    let reused = common_prefix(engine.session().tokens(), prompt).min(prompt.len() - 1);
    let prefilled = engine
        .session_mut()
        .prefill_reusing(prompt)
        .map(|_| ())
        .map_err(htpkv::engine::EngineError::from);
    let result = prefilled.and_then(|()| {
        engine.generate("", options, &mut |piece| {
            tx.blocking_send(Piece::Text(piece.to_owned())).is_ok()
        })
    });
    let c = &pool.counters;
    match result {
        Ok(generation) => {
            let usage = Usage::new(prompt.len(), generation.tokens.len());
            let counter = match generation.stop {
                StopReason::Cancelled | StopReason::Callback => &c.cancelled,
                _ => &c.completed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            c.reused_tokens.fetch_add(reused as u64, Ordering::Relaxed);
            c.prompt_tokens
                .fetch_add(prompt.len() as u64, Ordering::Relaxed);
            c.completion_tokens
                .fetch_add(usage.completion_tokens as u64, Ordering::Relaxed);
            Piece::Done(Outcome {
                stop: generation.stop,
                usage,
                reused,
            })
        }
        Err(error) => {
            // The cache may hold part of a step: start the session afresh.
            engine.reset();
            c.failed.fetch_add(1, Ordering::Relaxed);
            Piece::Failed(ApiError::from_engine(error))
        }
    }
}
