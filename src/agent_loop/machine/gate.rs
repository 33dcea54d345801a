//! The `before_tool` gate and the wait for decisions (`docs/decisions.md`).
//!
//! When a gate is registered, every call of a step is gated in call order before any of them
//! runs (`Effect::BeforeTool`). A gate runs the call, runs it with edited arguments, denies it
//! (the model gets the reason as the call's error result), or asks a person: the machine
//! appends `decision/requested`, once every call is gated, for each call that asked.
//!
//! The gate's verdicts on the round's other calls (run, edit, deny, failed) are logged with the
//! round's requests (the `gated` list of the `last` one), before any call runs. Then the calls
//! that need no decision run at once, the asked ones held ([`ToolPlan::hold`]): each result is
//! committed as soon as it is known (in call order among the calls that run), so a crash while
//! the step waits leaves nothing that ran without its result but a call that was running.
//! Once they have their results the step waits (the run ends, the turn stays open).
//!
//! Everything the step needs is in the log, so [`Machine::resume_held`] takes it up from the log
//! alone ([`Machine::take_up`]), in this run or in any process: calls with a result keep it, a
//! call in doubt follows its policy, the calls that need no decision and have not run run with
//! their logged verdict, and once every request is resolved the decided calls get what was
//! decided. The model is asked for the next step only once every call has its result; it is
//! not asked again, and no gate runs again for a call it gated, whatever it would say now.
//! Only a call with no logged verdict at all (a round a crash cut short, a log written before
//! verdicts were logged) is gated again.

use super::{Ctx, Effect, Fault, Machine, Raised, RaisedKind, Wait};
use crate::agent_loop::call_decisions;
use crate::agent_loop::decisions::{self, Gated, GatedKind, Request, RequestKind, Resolved};
use crate::agent_loop::events;
use crate::agent_loop::failure::{AbortCause, AbortKind};
use crate::agent_loop::in_doubt::Logged;
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
    /// A person was asked, and has not decided (or the step's other requests wait): held.
    Asked,
    /// A step taken up again: the log holds its result, or its `tool/call` without one (and
    /// the result it gets without running again, when it was decided not to run).
    Logged(Logged, Option<Outcome>),
}

impl Verdict {
    pub(super) fn apply(self, plan: &mut ToolPlan, index: usize) {
        match self {
            Verdict::Run { arguments, digest } => plan.decided(index, arguments, digest),
            Verdict::Preset(outcome) => plan.preset(index, outcome),
            Verdict::Asked => plan.hold(index),
            Verdict::Logged(logged, outcome) => {
                plan.logged(index, logged);
                if let Some(outcome) = outcome {
                    plan.preset(index, outcome);
                }
            }
            Verdict::Undecided => {}
        }
    }

    /// Whether the call has something to do in a plan now (it neither waits nor has its result).
    fn acts(&self) -> bool {
        !matches!(self, Verdict::Asked | Verdict::Logged(Logged::Done, _))
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
            // Nothing runs after an abort: the plan gives every call without a result its
            // aborted result, and what this round asked was never written.
            let verdicts = gating.verdicts.into_iter().map(|v| if matches!(v, Verdict::Asked) { Verdict::Undecided } else { v }).collect();
            return self.run_plan(ctx, gating.calls, verdicts);
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
        if !gating.verdicts.iter().any(Verdict::acts) {
            return self.await_decisions();
        }
        // The calls that need no decision run now, the asked ones held.
        self.run_plan(ctx, gating.calls, gating.verdicts)
    }

    /// The step stops at its decisions; the turn stays open.
    pub(super) fn await_decisions(&mut self) -> Effect {
        self.step_open = false;
        self.stop_driver = true;
        self.wait = Wait::Done;
        Effect::AwaitDecisions
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
                    requester: None,
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

    /// Takes up the held step of `ctx`'s log when a resume has something to do
    /// ([`HeldStep::actionable`](decisions::HeldStep::actionable)): `None` when there is none, or
    /// it only waits.
    pub fn resume_held(ctx: &Ctx<'_>) -> Option<(Machine, Effect)> {
        let held = decisions::held(ctx.log)?;
        if !held.actionable(&ctx.log.with_events(call_decisions::requests)) {
            return None;
        }
        let mut machine = Machine::blank();
        machine.turn = held.turn;
        machine.step = held.step;
        {
            let mut state = ctx.shared.state();
            state.turn = held.turn;
            state.step = held.step;
        }
        let effect = machine.take_up(ctx, held);
        Some((machine, effect))
    }

    /// Goes on with the held step as the log has it: what can run runs (held calls wait), and
    /// once every call has its result the step ends; with nothing to do, it waits.
    pub(super) fn take_up(&mut self, ctx: &Ctx<'_>, held: decisions::HeldStep) -> Effect {
        self.step_open = true;
        // A step whose requests were cancelled resumes aborted, whoever resumes it: the process
        // that cancelled (its own cause, set first, wins) or one that reads the log later.
        let cancelled =
            (0..held.calls.len()).any(|index| matches!(held.decision_for(index), Some((_, Some(r))) if r.outcome == Resolved::Cancelled));
        if cancelled {
            ctx.shared.state().abort(AbortCause::new(AbortKind::User));
        }
        let ready = held.ready();
        let asked = ctx.log.with_events(call_decisions::requests);
        let verdicts: Vec<Verdict> = held
            .calls
            .iter()
            .enumerate()
            .map(|(index, (id, name, arguments))| match &held.logged[index] {
                Logged::Done => Verdict::Logged(Logged::Done, None),
                // Started: its in-doubt policy, or what a person decided about it since (applied
                // to the plan by `run_plan`); held while such a request waits. A call decided not
                // to run never ran, whatever its `tool/call` says: it gets what was decided.
                Logged::InDoubt { seq, .. } if asked.iter().any(|(r, s)| r.call_seq == *seq && s.is_none()) => Verdict::Asked,
                logged @ Logged::InDoubt { .. } => {
                    let not_run = match held.decision_for(index) {
                        Some((_, Some(resolution))) => decisions::preset_outcome(resolution, name),
                        Some((_, None)) => None,
                        None => held.gated_for(index).and_then(|gated| match logged_verdict(gated, id, name) {
                            Verdict::Preset(outcome) => Some(outcome),
                            _ => None,
                        }),
                    };
                    Verdict::Logged(logged.clone(), not_run)
                }
                Logged::NotStarted => match held.decision_for(index) {
                    None => held.gated_for(index).map_or(Verdict::Undecided, |gated| logged_verdict(gated, id, name)),
                    // Decided calls run once every request of the step is resolved.
                    Some(_) if !ready => Verdict::Asked,
                    // Bound by position, id and digest: anything else fails closed.
                    Some((request, _)) if request.call_id != *id || request.digest != decisions::digest(arguments) => {
                        Verdict::Preset(Outcome::mismatch())
                    }
                    Some((_, None)) => unreachable!("a ready step has every request resolved"),
                    // One mapping of outcomes with the crash closers: what does not run gets the
                    // result `preset_outcome` gives it; a decision to run always carries its
                    // digest (one without never matches).
                    Some((_, Some(resolution))) => match decisions::preset_outcome(resolution, name) {
                        Some(outcome) => Verdict::Preset(outcome),
                        None => Verdict::Run {
                            arguments: (resolution.outcome == Resolved::Edited).then(|| resolution.arguments.clone().unwrap_or_default()),
                            digest: Some(resolution.digest.clone().unwrap_or_default()),
                        },
                    },
                },
            })
            .collect();
        // Calls not gated yet are gated only once the step's requests are resolved (a round a
        // crash cut short asks the rest in a new round then).
        let verdicts = if ready {
            verdicts
        } else {
            verdicts.into_iter().map(|v| if matches!(v, Verdict::Undecided) { Verdict::Asked } else { v }).collect()
        };
        if !verdicts.iter().any(Verdict::acts) {
            if verdicts.iter().any(|v| matches!(v, Verdict::Asked)) {
                return self.await_decisions();
            }
            // Every call has its result.
            let concludes = std::mem::take(&mut self.concludes);
            return self.step_done(ctx, if concludes { super::StepEnd::Completed } else { super::StepEnd::Again });
        }
        self.gate_calls(ctx, held.calls, verdicts)
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
