//! Operations on a session's queue and loop from a process that does not own it
//! (`PostgresStore.cancel`, `.replace`, `.remove`): staged for the owner in the same ordered
//! stream as `enqueue`'s messages, applied by the owner's inbox (and loop), answered through
//! `kerman_inbox_outcomes` and a NOTIFY on the session's outcome channel.
//!
//! The requester listens on that channel before staging, so the answer's notification cannot
//! be missed; a (re-)LISTEN, or a notification naming this operation, reads the answer. With
//! no answer within the timeout the operation is withdrawn (its staged row deleted, so no
//! owner applies it later) and refused as `timeout`; if it can no longer be withdrawn an owner
//! has it, and its answer is awaited a little longer.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::listen::{self, Channel, Note};
use super::{worker, PgCore, Request, Response};
use crate::event_log::{check_id, LogError, StagedOp};

/// How long an owner that took the operation (it could not be withdrawn) gets to answer.
const AFTER_WITHDRAW: Duration = Duration::from_secs(5);

impl PgCore {
    /// Stages `op` (arguments `args`, a JSON object) for session `id`'s owner and waits up to
    /// `timeout` for its answer: the outcome as a JSON object's text, `{"applied": true, …}` or
    /// `{"applied": false, "reason": …, "detail": …}`. An unknown session is `NotFound`.
    pub fn apply_op(&self, id: &str, op: StagedOp, args: &serde_json::Value, timeout: Duration) -> Result<String, LogError> {
        check_id(id)?;
        if op == StagedOp::Insert {
            return Err(LogError::InvalidEvent("apply_op: an insertion is staged with enqueue".into()));
        }
        let op_id = crate::message::new_id();
        let (tx, rx) = mpsc::channel::<()>();
        let wanted = op_id.clone();
        // Runs on the runtime thread: it only signals the waiting caller.
        let subscriber: listen::Subscriber = std::sync::Arc::new(move |note: Note| {
            let relevant = match note {
                Note::Listening => true,
                Note::Notified(payload) => payload == wanted,
            };
            if relevant {
                let _ = tx.send(());
            }
        });
        let sub = listen::next_id();
        let channel = listen::channel_name(Channel::Outcomes, id);
        self.submit(Request::Listen { id: sub, channel, subscriber }, Box::new(|_| ()));
        let result = self.stage_and_wait(id, &op_id, op, args, timeout, &rx);
        self.submit(Request::Unlisten { id: sub }, Box::new(|_| ()));
        result
    }

    fn stage_and_wait(
        &self,
        id: &str,
        op_id: &str,
        op: StagedOp,
        args: &serde_json::Value,
        timeout: Duration,
        rx: &mpsc::Receiver<()>,
    ) -> Result<String, LogError> {
        let deadline = Instant::now() + timeout;
        let wait = |until: Instant| -> bool {
            let left = until.saturating_duration_since(Instant::now());
            crate::blocking::wait(|| rx.recv_timeout(left)).is_ok()
        };
        // The first note is the LISTEN being in place: staging before it could miss the answer.
        if !wait(deadline) {
            return Err(LogError::Database {
                context: format!("session \"{id}\": {}", op.as_str()),
                detail: "the store's LISTEN connection was not ready in time".into(),
            });
        }
        let staged = self.call(Request::StageOp { id: id.into(), op_id: op_id.into(), op, args: args.to_string() })?;
        match staged {
            Response::Bool(true) => {}
            Response::Bool(false) => return Err(LogError::NotFound { id: id.into() }),
            other => return Err(worker::unexpected(&other)),
        }
        loop {
            if let Some(outcome) = self.read_outcome(id, op_id)? {
                return Ok(outcome);
            }
            if wait(deadline) {
                continue;
            }
            // No answer in time: withdraw it, unless an owner has it already.
            match self.call(Request::Withdraw { id: id.into(), op_id: op_id.into() })? {
                Response::Bool(true) => return Ok(timed_out(op, timeout)),
                Response::Bool(false) => {}
                other => return Err(worker::unexpected(&other)),
            }
            let until = Instant::now() + AFTER_WITHDRAW;
            loop {
                if let Some(outcome) = self.read_outcome(id, op_id)? {
                    return Ok(outcome);
                }
                if !wait(until) {
                    return Err(LogError::Database {
                        context: format!("session \"{id}\": {}", op.as_str()),
                        detail: format!(
                            "the owner took operation {op_id} but did not answer within {timeout:?} and {AFTER_WITHDRAW:?} more"
                        ),
                    });
                }
            }
        }
    }

    /// The answer to `op_id`, if there is one (then deleted, in a request of its own).
    fn read_outcome(&self, id: &str, op_id: &str) -> Result<Option<String>, LogError> {
        match self.call(Request::Outcome { id: id.into(), op_id: op_id.into(), forget: false })? {
            Response::Outcome(Some(text)) => {
                self.submit(Request::Outcome { id: id.into(), op_id: op_id.into(), forget: true }, Box::new(|_| ()));
                Ok(Some(text))
            }
            Response::Outcome(None) => Ok(None),
            other => Err(worker::unexpected(&other)),
        }
    }
}

fn timed_out(op: StagedOp, timeout: Duration) -> String {
    json!({
        "applied": false,
        "reason": "timeout",
        "detail": format!("no process owning the session applied the {} within {:.1} s (nothing was applied: it was withdrawn)",
                          op.as_str(), timeout.as_secs_f64()),
    })
    .to_string()
}
