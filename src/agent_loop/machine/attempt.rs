//! Every model request is in the log, failed and cancelled ones included
//! (`docs/usage.md#what-is-counted`).
//!
//! A request that gets an `assistant/message` is that message; one that fails is its chunks,
//! and the usage ledger and the budget count each failed attempt by the chunk that ends it (a
//! `finish` with a failed reason, or usage the provider marked `partial`). A request that failed
//! before its first chunk (a refused connection, an HTTP 429), or whose stream stopped without
//! such a chunk, would leave nothing, or nothing that ends it: the machine appends the failed
//! `finish` itself (`assistant/chunk {chunk: {type: "finish", reason: "error", error}}`), so each
//! attempt is counted once.
//!
//! A stream may go on after a chunk that ended an attempt (a `Fallback` that tries its next
//! model): the chunks after it are another attempt of the same request, and the message holds
//! and cites only the last attempt's.
//!
//! A model that makes several requests for one call and answers with one outcome (a
//! non-streaming `Fallback`) hands the failed `finish` chunks of the ones that failed with it
//! (`Input::AfterFailed`): they are logged before the outcome, as a stream's would be, so each is
//! one request, and a failure that listed its own attempt gets no failed `finish` from the
//! machine.
//!
//! A request cut by a cancellation (the turn's abort, or the driver's task cancelled from
//! outside) once the model was called is not a failure of the model, but it was made: it is the
//! `assistant/message` marked `interrupted` with what was visible, or, when nothing visible was
//! logged (before its first chunk, a non-streamed reply never returned), a `finish` chunk with
//! reason `cancelled` written by the machine (no message: reference CAN-22). A fatal exception
//! or a lost lease appends nothing.

use serde_json::{Map, Value};

use super::{Ctx, Fault, Input, Machine, Raised, RaisedKind};
use crate::agent_loop::events;
use crate::agent_loop::failure::{Failure, FailureCode};
use crate::agent_loop::CoreError;
use crate::event_log::LogError;
use crate::message::Message;

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

    /// The stream's last chunk ended an attempt: the next chunk is another attempt's.
    pub(super) fn ended(&self) -> bool {
        self.open && self.ended
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

    /// The failed attempts a model's `outcome` came after, each a failed `finish` chunk
    /// (`{"type": "finish", "reason": "error", ...}`), logged in order; the outcome is then the
    /// next attempt. None is logged when one is not a failed `finish` (the reply is refused:
    /// `INVALID_REPLY`), nor when a fatal exception or a lost lease ended the call, which appends
    /// nothing.
    pub(super) fn log_failed_attempts(&mut self, ctx: &Ctx<'_>, failed: Vec<Value>, outcome: &Input) -> Result<(), Fault> {
        if matches!(outcome, Input::Raised(Raised { kind: RaisedKind::Fatal | RaisedKind::LeaseLost, .. })) {
            return Ok(());
        }
        let mut chunks = Vec::with_capacity(failed.len());
        for (index, chunk) in failed.into_iter().enumerate() {
            match chunk {
                Value::Object(chunk)
                    if chunk.get("type").and_then(Value::as_str) == Some("finish")
                        && chunk.get("reason").and_then(Value::as_str) == Some("error") =>
                {
                    chunks.push(chunk);
                }
                other => {
                    let message = format!(
                        "model's failed_attempts[{index}] is {}; expected a failed finish chunk {{\"type\": \"finish\", \"reason\": \"error\", ...}}",
                        crate::json::compact(&other)
                    );
                    return Err(Fault::rule(FailureCode::InvalidReply, message));
                }
            }
        }
        for chunk in chunks {
            let text = crate::json::compact(&Value::Object(chunk));
            ctx.append(events::assistant_chunk(self.turn, self.step, &text)).map_err(|e| Fault::Core(CoreError::Log(e)))?;
            self.attempt.ended = true;
        }
        Ok(())
    }

    /// Whether `fault` is a cancellation cutting the turn (its signal aborted, or the driver's
    /// task cancelled from outside), which ends the request in flight `interrupted`. A fatal
    /// exception, a lost lease or a core error does not (nothing more is appended for them).
    pub(super) fn cut_by(ctx: &Ctx<'_>, fault: &Fault) -> bool {
        match fault {
            Fault::Raised(Raised { kind: RaisedKind::Cancelled, .. }) => true,
            Fault::Raised(Raised { kind: RaisedKind::Fatal | RaisedKind::LeaseLost, .. }) | Fault::Core(_) => false,
            _ => ctx.aborted(),
        }
    }

    /// A cancellation cut the request in flight: it is logged once, as an `interrupted` message
    /// of `visible` (what its stream had shown, with its `usage`, citing its chunks), or, with
    /// nothing visible, as a `cancelled` finish ending its chunks. When its last chunk had ended
    /// an attempt, the stream was awaited for another one, which showed nothing yet: the ended
    /// attempt stays a failed request, and the cancelled finish is the next one's.
    pub(super) fn close_cut_attempt(&mut self, ctx: &Ctx<'_>, visible: Vec<Value>, usage: Option<&str>) -> Result<(), Fault> {
        let attempt = std::mem::take(&mut self.attempt);
        let chunks = std::mem::take(&mut self.chunks);
        if !attempt.open {
            return Ok(());
        }
        if attempt.ended || visible.is_empty() {
            ctx.append(events::cancelled_finish(self.turn, self.step)).map_err(|e| Fault::Core(CoreError::Log(e)))?;
            return Ok(());
        }
        let message = Message::assistant(visible, None, None).map_err(|e| Fault::Core(CoreError::Message(e)))?;
        self.append_assistant(ctx, message, false, usage, chunks, true)
    }

    /// The turn body unwinds with `fault` while a request is in flight: a failure of the model
    /// (an error it reported, an exception it raised, a reply the loop refused) closes the
    /// attempt; a cancellation logs it interrupted; a fatal exception or a lost lease leaves
    /// it. (A core error comes here described, as `Raised`; one of the log's own was not asked
    /// again, [`Machine::log_failed`].)
    pub(super) fn close_failed_attempt(&mut self, ctx: &Ctx<'_>, fault: &Fault) -> Result<(), Fault> {
        if Self::cut_by(ctx, fault) {
            return self.close_cut_attempt(ctx, Vec::new(), None);
        }
        let (Fault::Failure { failure, .. } | Fault::Raised(Raised { kind: RaisedKind::Error, failure: Some(failure) })) = fault else {
            self.attempt = Attempt::default();
            return Ok(());
        };
        let failure = failure.clone();
        self.close_attempt(ctx, &failure).map_err(|e| Fault::Core(CoreError::Log(e)))
    }

    /// A core error is about to be described: when the log failed, nothing more is appended
    /// for the request in flight (the append would fail again, replacing the error).
    pub(super) fn log_failed(&mut self, e: &CoreError) {
        if matches!(e, CoreError::Log(_)) {
            self.attempt = Attempt::default();
        }
    }
}
