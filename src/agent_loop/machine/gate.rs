//! The `before_tool` gate and the wait for decisions (`docs/decisions.md`).
//!
//! When a gate is registered, every call of a step is gated in call order before any of them
//! runs (`Effect::BeforeTool`). A gate runs the call, runs it with edited arguments, denies it
//! (the model gets the reason as the call's error result), or asks a person: the machine
//! appends `decision/requested` and, once every call is gated, the step stops there (the run
//! ends, the turn stays open) when any call asked. Nothing of such a step runs before its
//! decisions are in, so a crash while waiting leaves no call in doubt.
//!
//! The gate's verdicts on the round's other calls (run, edit, deny, failed) are logged with the
//! round's requests (the `gated` list of the `last` one), so [`Machine::resume_held`] takes the
//! step up again from the log alone once every request is resolved: decided calls get what was
//! decided, the others what their gate said before the wait. The model is not asked again and
//! no gate runs again for a call it gated, whichever process resumes and whatever its gate
//! would say now. Only a call with no logged verdict at all (a log written before verdicts were
//! logged) is gated again.

use super::{Ctx, Effect, Fault, Machine, Raised, RaisedKind, Wait};
use crate::agent_loop::decisions::{self, Gated, GatedKind, Request, RequestKind, Resolved};
use crate::agent_loop::events;
use crate::agent_loop::failure::{AbortCause, AbortKind};
use crate::agent_loop::tools::{Outcome, ToolPlan};
use crate::agent_loop::CoreError;

/// What a `before_tool` gate decided for a call, as the host read it.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Run the call as the model gave it.
    Run,
    /// Do not run it; the reason goes to the model.
    Deny(Option<String>),
    /// Run it with these arguments (JSON text).
    Edit(String),
    /// Ask a person.
    Ask(Ask),
    /// Neither: the host's `repr` of what the gate returned (fails closed).
    Invalid(String),
    /// The gate raised: its message (fails closed).
    Failed(String),
}

impl Gate {
    /// The default gate's verdict for a tool whose `needs_approval` is a bool: ask a person
    /// (no note, schema or expiry), or run. A predicate is the host's to call.
    pub fn by_default(needs_approval: bool) -> Gate {
        if needs_approval {
            Gate::Ask(Ask::default())
        } else {
            Gate::Run
        }
    }
}

/// A gate's question: `schema` (JSON text) makes it ask for an answer rather than an approval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ask {
    pub note: Option<String>,
    pub schema: Option<String>,
    /// Epoch milliseconds.
    pub expires_at: Option<i64>,
}

/// What became of one call before the plan runs.
#[derive(Debug)]
pub(super) enum Verdict {
    Undecided,
    /// Run, with edited arguments, and with the digest a decision approved.
    Run {
        arguments: Option<String>,
        digest: Option<String>,
    },
    /// Do not run: this is the result.
    Preset(Outcome),
    /// A person was asked.
    Asked,
}

impl Verdict {
    pub(super) fn apply(self, plan: &mut ToolPlan, index: usize) {
        match self {
            Verdict::Run { arguments, digest } => plan.decided(index, arguments, digest),
            Verdict::Preset(outcome) => plan.preset(index, outcome),
            Verdict::Undecided | Verdict::Asked => {}
        }
    }
}

#[derive(Debug)]
pub(super) struct Gating {
    calls: Vec<(String, String, String)>,
    verdicts: Vec<Verdict>,
    /// The next call to gate.
    next: usize,
    /// The requests of this round, written together when every call is gated, so that the
    /// last one can say the step stops there (and nothing is logged for a round cut short).
    asked: Vec<Request>,
    /// The gate's other verdicts of this round, logged with its last request.
    verdicts_given: Vec<Gated>,
}

impl Machine {
    /// Gates the calls that have no verdict yet, in call order.
    pub(super) fn gate_calls(&mut self, ctx: &Ctx<'_>, calls: Vec<(String, String, String)>, mut verdicts: Vec<Verdict>) -> Effect {
        verdicts.resize_with(calls.len(), || Verdict::Undecided);
        self.gating = Some(Gating { calls, verdicts, next: 0, asked: Vec::new(), verdicts_given: Vec::new() });
        self.next_gate(ctx)
    }

    fn next_gate(&mut self, ctx: &Ctx<'_>) -> Effect {
        let Some(mut gating) = self.gating.take() else { unreachable!("gating without calls") };
        if ctx.aborted() {
            // Nothing runs after an abort: the plan gives every call its aborted result, and
            // what this round asked was never written.
            return self.run_plan(ctx, gating.calls, Vec::new());
        }
        while gating.next < gating.calls.len() {
            let index = gating.next;
            gating.next += 1;
            if !matches!(gating.verdicts[index], Verdict::Undecided) {
                continue;
            }
            if !ctx.gated {
                gating.verdicts[index] = Verdict::Run { arguments: None, digest: None };
                continue;
            }
            let (call_id, name, arguments) = gating.calls[index].clone();
            self.gating = Some(gating);
            self.wait = Wait::Gate;
            return Effect::BeforeTool { index, call_id, name, arguments };
        }
        let count = gating.asked.len();
        if count > 0 {
            for given in &mut gating.verdicts_given {
                given.digest = match given.kind {
                    GatedKind::Run => Some(decisions::digest(&gating.calls[given.index].2)),
                    GatedKind::Edit => given.arguments.as_deref().map(decisions::digest),
                    GatedKind::Deny | GatedKind::Failed => None,
                };
            }
        }
        for (n, request) in gating.asked.drain(..).enumerate() {
            let last = n + 1 == count;
            let given: &[Gated] = if last { &gating.verdicts_given } else { &[] };
            if let Err(e) = ctx.append(events::decision_round(&request, last, given)) {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
        }
        if gating.verdicts.iter().any(|v| matches!(v, Verdict::Asked)) {
            // The step stops at its decisions; the turn stays open.
            self.step_open = false;
            self.stop_driver = true;
            self.wait = Wait::Done;
            return Effect::AwaitDecisions;
        }
        self.run_plan(ctx, gating.calls, gating.verdicts)
    }

    /// The gate of the call `BeforeTool` named decided `gate`.
    pub(super) fn gated(&mut self, ctx: &Ctx<'_>, gate: Gate) -> Effect {
        let Some(gating) = self.gating.as_ref() else { unreachable!("a gate's verdict without calls") };
        let index = gating.next - 1;
        let (call_id, name, arguments) = gating.calls[index].clone();
        // The digest of what runs is taken when the round is written: only a round that asks is.
        let given = |kind: GatedKind, arguments: Option<&String>, reason: Option<&String>| Gated {
            index,
            call_id: call_id.clone(),
            kind,
            arguments: arguments.cloned(),
            digest: None,
            reason: reason.cloned(),
        };
        let (verdict, logged) = match gate {
            Gate::Run => (Verdict::Run { arguments: None, digest: None }, Some(given(GatedKind::Run, None, None))),
            Gate::Deny(reason) => {
                let logged = given(GatedKind::Deny, None, reason.as_ref());
                (Verdict::Preset(Outcome::denied(&name, reason.as_deref())), Some(logged))
            }
            Gate::Edit(edited) => {
                let logged = given(GatedKind::Edit, Some(&edited), None);
                (Verdict::Run { arguments: Some(edited), digest: None }, Some(logged))
            }
            Gate::Invalid(repr) => {
                let detail = format!("it returned {repr}; expected Approve, Deny, Edit or Ask (or await next())");
                let logged = given(GatedKind::Failed, None, Some(&detail));
                (Verdict::Preset(Outcome::gate_failed(&name, &detail)), Some(logged))
            }
            Gate::Failed(message) => {
                let logged = given(GatedKind::Failed, None, Some(&message));
                (Verdict::Preset(Outcome::gate_failed(&name, &message)), Some(logged))
            }
            Gate::Ask(ask) => {
                let request = Request {
                    turn: self.turn,
                    step: self.step,
                    decision_id: crate::ids::new_id(),
                    call_id,
                    index,
                    name,
                    digest: decisions::digest(&arguments),
                    arguments,
                    kind: if ask.schema.is_some() { RequestKind::Answer } else { RequestKind::Approval },
                    note: ask.note,
                    schema: ask.schema,
                    expires_at: ask.expires_at,
                };
                if let Some(gating) = self.gating.as_mut() {
                    gating.asked.push(request);
                }
                (Verdict::Asked, None)
            }
        };
        if let Some(gating) = self.gating.as_mut() {
            gating.verdicts[index] = verdict;
            gating.verdicts_given.extend(logged);
        }
        self.next_gate(ctx)
    }

    /// The gate raised: an ordinary exception fails its call closed; anything else (a
    /// cancellation from outside, `KeyboardInterrupt`, a lost lease) fails the turn.
    pub(super) fn gate_raised(&mut self, ctx: &Ctx<'_>, raised: Raised) -> Effect {
        if ctx.aborted() {
            return self.next_gate(ctx);
        }
        if raised.kind == RaisedKind::Error {
            let message = raised.failure.as_ref().and_then(|f| f.message()).unwrap_or("the gate raised").to_owned();
            return self.gated(ctx, Gate::Failed(message));
        }
        self.gating = None;
        self.fail(ctx, Fault::Raised(raised))
    }

    /// Takes up the held step of `ctx`'s log once every request of it is resolved: `None`
    /// when there is none, or it still waits.
    pub fn resume_held(ctx: &Ctx<'_>) -> Option<(Machine, Effect)> {
        let held = decisions::held(ctx.log)?;
        if !held.ready() {
            return None;
        }
        let mut machine = Machine::blank();
        machine.turn = held.turn;
        machine.step = held.step;
        machine.step_open = true;
        // A step whose requests were cancelled resumes aborted, whoever resumes it: the process
        // that cancelled (its own cause, set first, wins) or one that reads the log later.
        let cancelled =
            (0..held.calls.len()).any(|index| matches!(held.decision_for(index), Some((_, Some(r))) if r.outcome == Resolved::Cancelled));
        {
            let mut state = ctx.shared.state();
            state.turn = held.turn;
            state.step = held.step;
            if cancelled {
                state.abort(AbortCause::new(AbortKind::User));
            }
        }
        let verdicts = held
            .calls
            .iter()
            .enumerate()
            .map(|(index, (id, name, arguments))| match held.decision_for(index) {
                None => held.gated_for(index).map_or(Verdict::Undecided, |gated| logged_verdict(gated, id, name)),
                // Bound by position, id and digest: anything else fails closed.
                Some((request, _)) if request.call_id != *id || request.digest != decisions::digest(arguments) => {
                    Verdict::Preset(Outcome::mismatch())
                }
                Some((_, None)) => unreachable!("a ready step has every request resolved"),
                // One mapping of outcomes with the crash closers: what does not run gets the
                // result `preset_outcome` gives it; a decision to run always carries its digest
                // (one without never matches).
                Some((_, Some(resolution))) => match decisions::preset_outcome(resolution, name) {
                    Some(outcome) => Verdict::Preset(outcome),
                    None => Verdict::Run {
                        arguments: (resolution.outcome == Resolved::Edited).then(|| resolution.arguments.clone().unwrap_or_default()),
                        digest: Some(resolution.digest.clone().unwrap_or_default()),
                    },
                },
            })
            .collect();
        let effect = machine.gate_calls(ctx, held.calls, verdicts);
        Some((machine, effect))
    }
}

/// A call's verdict from the gate's logged one: bound to the call by its position and id (a
/// mismatch fails closed); a call to run keeps the digest of what the gate let run, checked when
/// it starts.
fn logged_verdict(gated: &Gated, call_id: &str, name: &str) -> Verdict {
    if gated.call_id != call_id {
        return Verdict::Preset(Outcome::mismatch());
    }
    let digest = || Some(gated.digest.clone().unwrap_or_default());
    match gated.kind {
        GatedKind::Run => Verdict::Run { arguments: None, digest: digest() },
        GatedKind::Edit => Verdict::Run { arguments: Some(gated.arguments.clone().unwrap_or_default()), digest: digest() },
        GatedKind::Deny => Verdict::Preset(Outcome::denied(name, gated.reason.as_deref())),
        GatedKind::Failed => Verdict::Preset(Outcome::gate_failed(name, gated.reason.as_deref().unwrap_or("the gate failed"))),
    }
}
