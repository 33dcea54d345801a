//! A resumed step's calls that a person decided about after they started
//! (`call_decisions`): each runs again, or gets the result the decision gives it.

use super::Ctx;
use crate::agent_loop::call_decisions;
use crate::agent_loop::decisions::{self, RequestKind};
use crate::agent_loop::tools::ToolPlan;

/// Applies the latest resolved request about each call of `plan` (a resumed step) to it. A
/// call runs again only under the `tool/call` the request names, with the arguments it names
/// (digest checked): anything else gets its closing result as the plan gave it.
pub(super) fn apply(ctx: &Ctx<'_>, plan: &mut ToolPlan) {
    let requests = ctx.log.with_events(call_decisions::requests);
    for index in 0..plan.calls().len() {
        let seq = plan.call_seq(index);
        let Some((ask, Some(resolution))) = requests.iter().rev().find(|(r, _)| r.call_seq == seq && seq != 0) else { continue };
        let call = plan.call(index);
        if ask.request.call_id != call.id || ask.request.digest != decisions::digest(&call.arguments) {
            continue;
        }
        let name = call.name.clone();
        match decisions::started_outcome(ask.request.kind, resolution, &name) {
            Some(outcome) => plan.preset(index, outcome),
            None => {
                let input = (ask.request.kind == RequestKind::Input).then(|| {
                    let payload = ask.payload.as_deref().and_then(|p| serde_json::from_str(p).ok()).unwrap_or(serde_json::Value::Null);
                    let answer = resolution.value.as_deref().and_then(|v| serde_json::from_str(v).ok()).unwrap_or(serde_json::Value::Null);
                    serde_json::json!({"payload": payload, "answer": answer, "decisionId": ask.request.decision_id}).to_string()
                });
                plan.run_again(index, input);
            }
        }
    }
}
