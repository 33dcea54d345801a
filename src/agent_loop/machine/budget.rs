//! The budget rule of the turn: checked when input is claimed and before every model request
//! (`docs/usage.md#budgets`). A spent budget ends the turn `budget` with the numbers that
//! stopped it; at the claim that `turn/end` is the next append, so it commits with the claim
//! (as a `pre_step` `Reject` does) and the claimed input is not entered. Before a request, a
//! budget that asks (`Budget(ask=True)`) appends a budget decision request instead and the run
//! ends waiting (`budget_decisions`); [`Machine::resume_budget`] takes the turn up once decided.

use super::{CoreError, Ctx, Effect, Ending, Fault, Machine, Wait};
use crate::agent_loop::budget::At;
use crate::agent_loop::budget_decisions;
use crate::agent_loop::decisions::Resolved;
use crate::agent_loop::events;
use crate::agent_loop::failure::{AbortCause, AbortKind};

impl Machine {
    /// `Some(effect)` when the loop's budget is spent: the open step (before a request) is
    /// closed and the turn ends `budget`; the run stops (input waiting stays for a later wake).
    /// Before a request, a budget that asks waits for a decision instead (an approval already
    /// logged for this request lets it through).
    pub(super) fn budget_stop(&mut self, ctx: &Ctx<'_>, at: At) -> Option<Effect> {
        let stop = ctx.shared.budget.check(ctx.log, at)?;
        if at == At::Request && self.step_open && ctx.shared.budget.asks() {
            match ctx.log.with_events(budget_decisions::latest) {
                Some((_, Some(r))) if r.outcome == Resolved::Approved => return None,
                Some((_, Some(_))) => {}
                _ => {
                    if let Err(e) = budget_decisions::request(ctx.log, self.turn, self.step, &stop) {
                        return Some(self.fail(ctx, Fault::Core(CoreError::Log(e))));
                    }
                    self.step_open = false;
                    self.stop_driver = true;
                    self.wait = Wait::Done;
                    return Some(Effect::AwaitDecisions);
                }
            }
        }
        if self.step_open {
            self.step_open = false;
            if let Err(e) = ctx.append(events::step_end(self.turn, self.step)) {
                return Some(self.fail(ctx, Fault::Core(CoreError::Log(e))));
            }
        }
        self.ending = Some(Ending::Budget(stop));
        self.stop_driver = true;
        Some(self.end_turn(ctx))
    }

    /// Takes up a turn whose budget request is resolved: approved, the request is made;
    /// denied or expired, the turn ends `budget`; cancelled, it ends aborted.
    pub fn resume_budget(ctx: &Ctx<'_>) -> Option<(Machine, Effect)> {
        let (request, resolution) = budget_decisions::resolved(ctx.log)?;
        let mut machine = Machine::blank();
        machine.turn = request.turn;
        machine.step = request.step;
        machine.step_open = true;
        {
            let mut state = ctx.shared.state();
            state.turn = request.turn;
            state.step = request.step;
            if resolution.outcome == Resolved::Cancelled {
                state.abort(AbortCause::new(AbortKind::User));
            }
        }
        let effect = if resolution.outcome == Resolved::Cancelled { machine.fail(ctx, Fault::Aborted) } else { machine.request_begin(ctx) };
        Some((machine, effect))
    }
}
