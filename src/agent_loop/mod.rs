//! The agent loop: a sans-IO turn machine over one session log (SPEC 4, reference 5.5–5.8).
//!
//! The turn algorithm in one screen (`docs/loop.md` has the picture and the state diagram):
//!
//! ```text
//! begin:   turn/start; claim next-step and the head of next-turn
//! step:    pre_step(batch) ── Reject ─► turn/end {blocked}
//!                          ── Enter([]) on the first step ─► turn/end {completed}
//!          step/start; user/message × batch
//!          before_request(request); request/header when the options changed
//!          (checkpoint: flush) model(request) ── failure ─► request_error ── Retry ─► request again
//!          assistant/chunk × n; assistant/message
//!          tool plan: tool/call, tool/result × calls (results in model order; a call the
//!          gate asked about is held: the others run, the step waits, decided it runs later)
//!          step/end
//!          tool results owed, or next-step input pending? ─► claim next-step, next step
//!          turn_stopping (a hook may steer: another step)
//! end:     turn/end {completed | max-tokens}; next-turn input pending? ─► the next turn
//! budget:  spent at a claim or before a request ─► (step/end) turn/end {budget}
//! faults:  the open step gets step/end, the turn turn/end {error | aborted}; a lost lease
//!          ends the run with nothing more appended (the new owner closed the turn)
//! ```
//!
//! [`Machine`] decides and writes; the host (the Python binding) awaits what an [`Effect`]
//! asks for and answers with an [`Input`]. [`Shared`] is the state that outlives a run and
//! that the host reads between them: the turn counter, the last entered step, the request
//! count and last options, the abort cause and the wake latch.

mod assemble;
pub mod budget;
pub mod budget_decisions;
pub mod call_decisions;
mod closers;
pub mod compaction;
pub mod continuation;
pub mod decisions;
mod ending;
pub mod events;
mod failure;
pub mod foreign_decisions;
mod fork;
mod history;
pub mod in_doubt;
mod machine;
pub mod progress;
mod recovery;
pub mod rollback;
mod tools;
mod transcript;
pub mod waterfall;

use std::sync::{Mutex, MutexGuard};

pub use assemble::{Assembler, Finish};
pub use closers::{close_open_turn, crash_closers};
pub use continuation::Continuation;
pub use ending::{EndKind, Ending};
pub use failure::{AbortCause, AbortKind, Code, Failure, FailureCode};
pub use fork::{fork_session, ForkInbox};
pub use history::History;
pub use in_doubt::{idempotency_key, Crashed, InDoubt, Logged, SideEffect, ToolInfo};
pub use machine::{Ask, Ctx, Decision, Effect, Gate, Input, Machine, Raised, RaisedKind, Reply, ReplyContent, Requested};
pub use recovery::{claimed_unentered, consumed_work, requeue_claimed, unentered_claims, ConsumedWork, RequeueError, Unentered};
pub use tools::{py_repr, Call, Content, InputAsk, Next, Outcome, Raised as ToolRaised, Sink, ToolPlan};
pub use transcript::{Entry as TranscriptEntry, Transcript, TurnEnding};

use crate::event_log::{LogError, SessionLog};
use crate::inbox::InboxError;
use crate::message::MessageError;

/// A core operation the loop made failed.
#[derive(Debug)]
pub enum CoreError {
    Log(LogError),
    Inbox(InboxError),
    Message(MessageError),
}

impl PartialEq for CoreError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl std::fmt::Display for CoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoreError::Log(e) => e.fmt(f),
            CoreError::Inbox(e) => e.fmt(f),
            CoreError::Message(e) => e.fmt(f),
        }
    }
}

impl From<LogError> for CoreError {
    fn from(e: LogError) -> Self {
        CoreError::Log(e)
    }
}

/// The loop's state between and across runs.
#[derive(Debug, Default)]
pub struct LoopState {
    /// The last turn started (0 before the first).
    pub turn: u64,
    /// The last step entered in the running turn (0 before its first).
    pub step: u64,
    /// Requests made by this loop (the first always logs `request/header`).
    pub requests: u64,
    /// The canonical text of the last logged request options.
    pub last_options: Option<String>,
    /// The instructions the last logged `request/header` carried.
    pub last_instructions: Option<String>,
    /// The loop's configured instructions (what each request starts with), and the ones the
    /// log last recorded (`agent/instructions`): the next request logs the configured ones
    /// first when the two differ.
    pub instructions: Option<String>,
    pub logged_instructions: Option<String>,
    /// The running turn's abort cause; the first cause wins.
    pub abort: Option<AbortCause>,
    /// A waking input arrived while the turn was being cancelled: run again once it ends.
    pub wake_latched: bool,
    /// A run begins with a continuation of an interrupted turn whose input is unanswered while
    /// its chain holds fewer crashed turns than this (0: never; `continuation.rs`).
    pub continue_crashes: u32,
}

impl LoopState {
    /// Aborts the running turn with `cause`; false when it had aborted already.
    pub fn abort(&mut self, cause: AbortCause) -> bool {
        if self.abort.is_some() {
            return false;
        }
        self.abort = Some(cause);
        true
    }

    /// A waking input while a turn runs: latched when the turn is being cancelled (not
    /// disposed) and the input was redirected to next-turn because of that.
    pub fn latch_wake(&mut self, after_abort: bool) {
        let cancelling = self.abort.as_ref().is_some_and(|c| c.kind() != AbortKind::Disposed);
        if cancelling && after_abort {
            self.wake_latched = true;
        }
    }

    /// Whether a request with these canonical options and instructions logs a
    /// `request/header`: the loop's first request, or either differs from the last logged.
    pub fn header_due(&self, canonical: &str, instructions: Option<&str>) -> bool {
        self.requests == 0 || self.last_options.as_deref() != Some(canonical) || self.last_instructions.as_deref() != instructions
    }

    /// A run is starting: a fresh signal, no step, no latch.
    pub fn reset_run(&mut self) {
        self.step = 0;
        self.abort = None;
        self.wake_latched = false;
    }
}

/// What the loop shares between its machine, its tool runs and its host.
#[derive(Default)]
pub struct Shared {
    state: Mutex<LoopState>,
    pub history: History,
    /// The loop's budget and the usage fold it is checked against.
    pub budget: budget::Keeper,
    /// Another framework's requests waiting in the loop's log, folded as it grows.
    pub foreign: foreign_decisions::Index,
}

impl Shared {
    /// The state of a loop over `log`: the turn counter restored from its `turn/start`s.
    pub fn resume(log: &SessionLog) -> Shared {
        let (turn, step, instructions) = log.with_events(|all| {
            let turn =
                all.iter().filter(|e| e.kind() == events::TURN_START).filter_map(|e| events::turn_of(&e.data())).next_back().unwrap_or(0);
            // The last step entered in that turn (after its `turn/start`), as the loop that ran
            // it reported.
            let step = all
                .iter()
                .rev()
                .take_while(|e| e.kind() != events::TURN_START)
                .find(|e| e.kind() == events::STEP_START)
                .and_then(|e| events::step_of(&e.data()))
                .unwrap_or(0);
            let instructions = all.iter().rev().find(|e| e.kind() == events::INSTRUCTIONS).and_then(|e| events::instructions_of(&e.data()));
            (turn, step, instructions)
        });
        let shared = Shared::default();
        {
            let mut state = shared.state();
            state.turn = turn;
            state.step = step;
            // A resumed loop goes on with the instructions the session last recorded.
            state.instructions.clone_from(&instructions);
            state.logged_instructions = instructions;
        }
        shared
    }

    /// Locked only for field access, never across a call out: an append runs log observers,
    /// which may run Python, and a thread waiting for this lock while holding the GIL would
    /// deadlock with it. Copy what you need out in its own statement (not in the scrutinee of
    /// an `if let` or `match`, whose temporaries live to the end of the block).
    pub fn state(&self) -> MutexGuard<'_, LoopState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
