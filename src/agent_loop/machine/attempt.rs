//! Every model request is in the log, failed ones included (`docs/usage.md#what-is-counted`).
//!
//! A request that gets an `assistant/message` is that message; one that fails is its chunks,
//! and the usage ledger and the budget count each failed attempt by the chunk that ends it (a
//! `finish` with a failed reason, or usage the provider marked `partial`). A request that failed
//! before its first chunk (a refused connection, an HTTP 429), or whose stream stopped without
//! such a chunk, would leave nothing, or nothing that ends it: the machine appends the failed
//! `finish` itself (`assistant/chunk {chunk: {type: "finish", reason: "error", error}}`), so each
//! attempt is counted once. A request cut by the turn's own abort, a cancellation from outside,
//! a fatal exception or a lost lease is not a failure of the model: nothing is appended for it.

use serde_json::{Map, Value};

use super::{Ctx, Fault, Machine, Raised, RaisedKind};
use crate::agent_loop::events;
use crate::agent_loop::failure::Failure;
use crate::agent_loop::CoreError;
use crate::event_log::LogError;

/// The model request in flight, from the call to its message or its failure.
#[derive(Debug, Default)]
pub(super) struct Attempt {
    /// A request was made and has neither a message nor a failure in the log yet.
    open: bool,
    /// Its last logged chunk ends it already (a failed `finish`, or usage marked `partial`).
    ended: bool,
}

impl Attempt {
    /// A request is about to be made.
    pub(super) fn begin(&mut self) {
        *self = Attempt { open: true, ended: false };
    }

    /// A chunk of it was logged.
    pub(super) fn chunk(&mut self, chunk: &Map<String, Value>) {
        let kind = chunk.get("type").and_then(Value::as_str);
        let failed = kind == Some("finish") && !matches!(chunk.get("reason").and_then(Value::as_str), Some("stop" | "max-tokens"));
        let partial = kind == Some("usage") && chunk.get("partial") == Some(&Value::Bool(true));
        self.ended = failed || partial;
    }

    /// Its message was logged.
    pub(super) fn answered(&mut self) {
        self.open = false;
    }
}

impl Machine {
    /// The request in flight failed with `failure`: unless its chunks already end it, a failed
    /// `finish` carrying the failure is logged, once.
    pub(super) fn close_attempt(&mut self, ctx: &Ctx<'_>, failure: &Failure) -> Result<(), LogError> {
        let Attempt { open, ended } = std::mem::take(&mut self.attempt);
        if !open || ended {
            return Ok(());
        }
        ctx.append(events::failed_finish(self.turn, self.step, failure))?;
        Ok(())
    }

    /// The turn body unwinds with `fault` while a request is in flight: a failure of the model
    /// (an error it reported, an exception it raised, a reply the loop refused) closes the
    /// attempt; an abort, a cancellation, a fatal exception or a lost lease does not. (A core
    /// error comes here described, as `Raised`; one of the log's own was not asked again,
    /// [`Machine::log_failed`].)
    pub(super) fn close_failed_attempt(&mut self, ctx: &Ctx<'_>, fault: &Fault) -> Result<(), LogError> {
        let (Fault::Failure { failure, .. } | Fault::Raised(Raised { kind: RaisedKind::Error, failure: Some(failure) })) = fault else {
            self.attempt = Attempt::default();
            return Ok(());
        };
        if ctx.aborted() {
            self.attempt = Attempt::default();
            return Ok(());
        }
        let failure = failure.clone();
        self.close_attempt(ctx, &failure)
    }

    /// A core error is about to be described: when the log failed, nothing more is appended
    /// for the request in flight (the append would fail again, replacing the error).
    pub(super) fn log_failed(&mut self, e: &CoreError) {
        if matches!(e, CoreError::Log(_)) {
            self.attempt = Attempt::default();
        }
    }
}
