//! Rolled-back turns: a turn cancelled with the cause `{"kind": "rollback"}` (a followup sent
//! with `on_busy="rollback"`) ends `turn/end {kind: "aborted", reason: {kind: "rollback"}}`,
//! and from then on the history leaves out every message from its `turn/start` on. The marker
//! is the turn's own end, written in the same append as any ending, so no crash can leave a
//! turn half rolled back; the turn's events stay in the log for readers to show.

use serde_json::Value;

use super::ending::EndKind;
use super::events;

/// The abort cause kind that rolls the turn back.
pub const ROLLBACK: &str = "rollback";

/// Whether a `turn/end` payload (its JSON text) ends its turn rolled back.
pub fn rolls_back(data_json: &str) -> bool {
    // Most turn ends are not rollbacks: skip the parse unless the word is there at all.
    if !data_json.contains(ROLLBACK) {
        return false;
    }
    let Ok(data) = serde_json::from_str::<Value>(data_json) else { return false };
    events::end_kind(&data) == Some(EndKind::Aborted) && data.pointer("/reason/reason/kind").and_then(Value::as_str) == Some(ROLLBACK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_loop::failure::{AbortCause, AbortKind};
    use crate::agent_loop::Ending;

    #[test]
    fn only_an_abort_caused_by_rollback_rolls_back() {
        let end = |ending: &Ending| events::turn_end(3, ending).data.as_str().to_string();
        assert!(rolls_back(&end(&Ending::Aborted(AbortCause::new(AbortKind::Other(ROLLBACK))))));
        assert!(!rolls_back(&end(&Ending::Aborted(AbortCause::new(AbortKind::User)))));
        assert!(!rolls_back(&end(&Ending::Blocked(Some("rollback".into())))));
        assert!(!rolls_back(&end(&Ending::Completed)));
    }
}
