//! `tool/progress`: a running tool call's progress (an MCP server's progress notifications),
//! logged so a UI and `kerman log show` see it. Which updates are worth logging (coalescing) is
//! the caller's choice; this checks the values and appends. A record may name the task the call
//! became on its server (`task`, an MCP task id): a resumed session polls that task for the
//! call's result instead of declaring the call in doubt.

use crate::event_log::{LogError, SessionLog};

use super::events;

/// Why a progress record was refused.
#[derive(Debug)]
pub enum ProgressError {
    /// A bad value, described (names the field and the value).
    Invalid(String),
    Log(LogError),
}

impl std::fmt::Display for ProgressError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgressError::Invalid(text) => f.write_str(text),
            ProgressError::Log(e) => write!(f, "{e}"),
        }
    }
}

/// One progress update of a running call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Update<'a> {
    /// The progress so far (finite).
    pub progress: f64,
    /// The total, when known (finite).
    pub total: Option<f64>,
    pub message: Option<&'a str>,
    /// The id of the server-side task the call became (MCP tasks), on the record that says so.
    pub task: Option<&'a str>,
}

/// Appends `tool/progress` for call `call_id` of step `step` of turn `turn`; its seq.
pub fn append(log: &SessionLog, turn: u64, step: u64, call_id: &str, update: &Update<'_>) -> Result<u64, ProgressError> {
    if call_id.is_empty() {
        return Err(ProgressError::Invalid("tool/progress needs a call id, got an empty string".into()));
    }
    let progress = update.progress;
    if !progress.is_finite() {
        return Err(ProgressError::Invalid(format!("tool/progress of call {call_id:?}: progress must be a finite number, got {progress}")));
    }
    if let Some(total) = update.total.filter(|t| !t.is_finite()) {
        return Err(ProgressError::Invalid(format!("tool/progress of call {call_id:?}: total must be a finite number, got {total}")));
    }
    if update.task == Some("") {
        return Err(ProgressError::Invalid(format!("tool/progress of call {call_id:?}: a task id must be a non-empty string")));
    }
    events::append(log, events::tool_progress(turn, step, call_id, update)).map_err(ProgressError::Log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_log::{MemoryStore, Store};

    fn update(progress: f64, total: Option<f64>, message: Option<&str>) -> Update<'_> {
        Update { progress, total, message, task: None }
    }

    #[test]
    fn writes_the_payload() {
        let event = events::tool_progress(2, 3, "c\"1", &update(1.0, Some(2.5), Some("half")));
        assert_eq!(event.kind, "tool/progress");
        assert_eq!(event.data.as_str(), r#"{"turn":2,"step":3,"callId":"c\"1","progress":1,"total":2.5,"message":"half"}"#);
        let bare = events::tool_progress(1, 1, "c", &update(0.25, None, None));
        assert_eq!(bare.data.as_str(), r#"{"turn":1,"step":1,"callId":"c","progress":0.25}"#);
        let task = events::tool_progress(1, 1, "c", &Update { task: Some("t-1"), ..update(0.0, None, Some("working")) });
        assert_eq!(task.data.as_str(), r#"{"turn":1,"step":1,"callId":"c","progress":0,"message":"working","task":"t-1"}"#);
    }

    #[test]
    fn refuses_non_finite_numbers_and_an_empty_task_id() {
        let log = MemoryStore::new().create(None).unwrap();
        let err = append(&log, 1, 1, "c", &update(f64::NAN, None, None)).unwrap_err();
        assert!(err.to_string().contains("progress must be a finite number, got NaN"), "{err}");
        let err = append(&log, 1, 1, "c", &update(1.0, Some(f64::INFINITY), None)).unwrap_err();
        assert!(err.to_string().contains("total must be a finite number, got inf"), "{err}");
        let err = append(&log, 1, 1, "c", &Update { task: Some(""), ..update(1.0, None, None) }).unwrap_err();
        assert!(err.to_string().contains("a task id must be a non-empty string"), "{err}");
        assert!(append(&log, 1, 1, "c", &update(1.0, None, None)).is_ok());
    }
}
