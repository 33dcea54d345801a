//! Taking up a crashed step with calls in doubt (`docs/durability.md#calls-in-doubt`).
//!
//! The crash closers leave a turn open when its open step has a call in doubt whose policy a
//! resume settles ([`in_doubt::crashed`]). [`Machine::resume_in_doubt`] takes that step up
//! again from the log alone: its plan ([`ToolPlan::resumed`]) gives each call exactly one
//! result, and the turn goes on as after any tool step (another model request over the
//! history as logged, then the turn ends normally).

use super::{Ctx, Effect, Machine, Wait};
use crate::agent_loop::in_doubt::{self, Logged};
use crate::agent_loop::tools::{Call, ToolPlan};

impl Machine {
    /// Takes up the crashed step of `ctx`'s log: `None` when there is none.
    pub fn resume_in_doubt(ctx: &Ctx<'_>) -> Option<(Machine, Effect)> {
        let crashed = in_doubt::crashed_step(ctx.log)?;
        let mut machine = Machine::blank();
        machine.turn = crashed.turn;
        machine.step = crashed.step;
        machine.step_open = true;
        {
            let mut state = ctx.shared.state();
            state.turn = crashed.turn;
            state.step = crashed.step;
        }
        let calls = crashed
            .calls
            .into_iter()
            .map(|(id, name, logged)| {
                let tool = (ctx.tools)(&name);
                let arguments = match &logged {
                    Logged::InDoubt { arguments, .. } => arguments.clone(),
                    _ => String::new(),
                };
                (Call { id, name, arguments, known: tool.is_some(), info: tool.unwrap_or_default() }, logged)
            })
            .collect();
        let mut plan = ToolPlan::resumed(crashed.turn, crashed.step, calls, ctx.max_parallel);
        super::call_decision::apply(ctx, &mut plan);
        machine.plan = Some(plan);
        machine.wait = Wait::Tools;
        Some((machine, Effect::RunTools))
    }
}
