//! Side effects and calls in doubt (`docs/durability.md`, "Calls in doubt").
//!
//! A tool declares its [`SideEffect`] class and what happens to a call of it that is *in doubt*
//! ([`InDoubt`]): its `tool/call` write-ahead record is in the log and its `tool/result` is not
//! (the process died, the lease was lost). Both are written into the `tool/call` record, so the
//! code that handles a crashed turn (the closers a store runs when it opens a log, the resume of
//! a loop) reads the policy from the log and needs no registered tool.

/// What running a tool does to the outside world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SideEffect {
    /// Reads only: running it again changes nothing.
    Read,
    /// Writes, but running it again with the same idempotency key has the effect of once.
    Idempotent,
    /// Writes; running it again may do it twice (the default).
    #[default]
    Write,
}

impl SideEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::Read => "read",
            SideEffect::Idempotent => "idempotent",
            SideEffect::Write => "write",
        }
    }

    pub fn parse(text: &str) -> Option<SideEffect> {
        match text {
            "read" => Some(SideEffect::Read),
            "idempotent" => Some(SideEffect::Idempotent),
            "write" => Some(SideEffect::Write),
            _ => None,
        }
    }
}

/// What becomes of a call in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InDoubt {
    /// It gets a `TOOL_OUTCOME_UNKNOWN` error result (the default; the crash closers write it).
    #[default]
    Fail,
    /// It runs again with the same idempotency key (`read` and `idempotent` tools only).
    Retry,
    /// The tool's reconcile function looks at the outside world and gives the result (or
    /// nothing: then it fails).
    Reconcile,
    /// A person decides (run again, record a result, record a failure).
    Ask,
}

impl InDoubt {
    pub fn as_str(self) -> &'static str {
        match self {
            InDoubt::Fail => "fail",
            InDoubt::Retry => "retry",
            InDoubt::Reconcile => "reconcile",
            InDoubt::Ask => "ask",
        }
    }

    pub fn parse(text: &str) -> Option<InDoubt> {
        match text {
            "fail" => Some(InDoubt::Fail),
            "retry" => Some(InDoubt::Retry),
            "reconcile" => Some(InDoubt::Reconcile),
            "ask" => Some(InDoubt::Ask),
            _ => None,
        }
    }
}

/// What the loop knows of a registered tool when it plans a call of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolInfo {
    /// It runs alone (`parallel=False`).
    pub exclusive: bool,
    pub effect: SideEffect,
    pub in_doubt: InDoubt,
}

impl ToolInfo {
    /// A tool with the defaults (`write`, `fail`) that runs alone or not.
    pub fn exclusive(exclusive: bool) -> ToolInfo {
        ToolInfo { exclusive, ..ToolInfo::default() }
    }
}

/// The idempotency key of the call whose `tool/call` is at `call_seq` in session `session`:
/// the same for every execution of that call, in any process, and different for every other
/// call (a log position is never reused).
pub fn idempotency_key(session: &str, call_seq: u64) -> String {
    format!("kerman:{session}:{call_seq}")
}
