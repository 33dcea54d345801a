//! Starting a continuation (`docs/durability.md#crashed-turns-are-answered`): a new turn that
//! answers the input of the interrupted one ([`continuation::next`]).

use super::{Ctx, Effect, Machine, Unwind, Wait};
use crate::agent_loop::continuation;
use crate::agent_loop::events;
use crate::agent_loop::CoreError;

impl Machine {
    /// Starts the continuation the log calls for (within the loop's limit): `turn/start
    /// {turn, continues}`, claiming nothing, then a step that enters nothing and asks the model
    /// over the history as logged. `None` when none is due.
    pub fn continue_interrupted(ctx: &Ctx<'_>) -> Option<(Machine, Effect)> {
        let limit = ctx.shared.state().continue_crashes;
        let due = continuation::next_of(ctx.log, limit)?;
        let mut machine = Machine::blank();
        if ctx.aborted() {
            return None;
        }
        let last = ctx.shared.state().turn;
        if let Err(e) = ctx.append(events::turn_start_continuing(last + 1, due.turn)) {
            machine.turn = last;
            machine.wait = Wait::Describe(Unwind::Begin);
            return Some((machine, Effect::Describe(CoreError::Log(e))));
        }
        machine.turn = last + 1;
        let step = {
            let mut state = ctx.shared.state();
            state.turn = machine.turn;
            state.step + 1
        };
        machine.step = step;
        if let Err(e) = ctx.append(events::step_start(machine.turn, step)) {
            let effect = machine.fail(ctx, super::Fault::Core(CoreError::Log(e)));
            return Some((machine, effect));
        }
        ctx.shared.state().step = step;
        machine.step_open = true;
        let effect = machine.request_begin(ctx);
        Some((machine, effect))
    }
}
