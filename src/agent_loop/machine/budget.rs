//! The budget rule of the turn: checked when input is claimed and before every model request
//! (`docs/usage.md#budgets`). A spent budget ends the turn `budget` with the numbers that
//! stopped it; at the claim that `turn/end` is the next append, so it commits with the claim
//! (as a `pre_step` `Reject` does) and the claimed input is not entered.

use super::{CoreError, Ctx, Effect, Ending, Fault, Machine};
use crate::agent_loop::budget::At;
use crate::agent_loop::events;

impl Machine {
    /// `Some(effect)` when the loop's budget is spent: the open step (before a request) is
    /// closed and the turn ends `budget`; the run stops (input waiting stays for a later wake).
    pub(super) fn budget_stop(&mut self, ctx: &Ctx<'_>, at: At) -> Option<Effect> {
        let stop = ctx.shared.budget.check(ctx.log, at)?;
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
}
