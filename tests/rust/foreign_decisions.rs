//! Decisions asked for a loop other than Kerman's (pydantic-ai's deferred tool approvals under
//! `KermanDurability`): requested outside any turn with `for`, pending until decided, decided
//! by the core's `decide` like any approval, and refused when decided twice.

use kerman::agent_loop::decisions::{self, Decide, DecideError};
use kerman::agent_loop::foreign_decisions::{self, ForeignCall};
use kerman::event_log::{MemoryStore, Store};
use serde_json::json;

fn call(id: &str, name: &str, arguments: &str) -> ForeignCall {
    ForeignCall { call_id: id.into(), name: name.into(), arguments: arguments.into() }
}

#[test]
fn a_foreign_request_is_pending_until_decided_and_decided_once() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let requester = json!({"kind": "pydantic-ai", "run": 1});
    let calls = [call("c1", "refund", r#"{"amount":5}"#), call("c2", "refund", r#"{"amount":900}"#)];
    let requested = foreign_decisions::request(&log, &requester, &calls).unwrap();
    assert_eq!(requested.len(), 2);
    let logged: Vec<_> = log.range(0, None).iter().map(kerman::Event::data).collect();
    assert_eq!(logged[0]["for"], requester);
    assert_eq!((logged[0]["turn"].clone(), logged[0]["kind"].clone(), logged[0].get("last")), (json!(0), json!("approval"), None));
    assert_eq!(logged[1]["last"], json!(true));
    assert_eq!(logged[1]["digest"], json!(decisions::digest(r#"{"amount":900}"#)));
    let pending: Vec<_> = decisions::pending(&log).into_iter().map(|r| r.call_id).collect();
    assert_eq!(pending, ["c1", "c2"]);

    let first = decisions::decide(&log, &requested[0].decision_id, Decide::Approve, Some("ops"), Some("k1"), 0).unwrap();
    assert!(!first.duplicate && !first.ready);
    let again = decisions::decide(&log, &requested[0].decision_id, Decide::Approve, Some("ops"), Some("k1"), 0).unwrap();
    assert!(again.duplicate);
    let twice = decisions::decide(&log, &requested[0].decision_id, Decide::Deny(None), None, None, 0).unwrap_err();
    assert!(matches!(twice, DecideError::Resolved(..)), "{twice}");
    let answer = decisions::decide(&log, &requested[1].decision_id, Decide::Answer(json!(1)), None, None, 0).unwrap_err();
    assert!(matches!(answer, DecideError::Invalid(_)), "{answer}");
    let last = decisions::decide(&log, &requested[1].decision_id, Decide::Deny(Some("too much".into())), None, None, 0).unwrap();
    assert!(last.ready);
    assert!(decisions::pending(&log).is_empty());
    let found = log.with_events(foreign_decisions::requests);
    let outcomes: Vec<_> = found.iter().map(|f| f.resolution.as_ref().map(|r| (r.outcome.as_str(), r.reason.clone()))).collect();
    assert_eq!(outcomes, [Some(("approved", None)), Some(("denied", Some("too much".to_string())))]);
    assert!(matches!(decisions::decide(&log, "nope", Decide::Approve, None, None, 0), Err(DecideError::Unknown(_))));
}

#[test]
fn a_requester_must_be_an_object() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let err = foreign_decisions::request(&log, &json!("run 1"), &[call("c1", "t", "{}")]).unwrap_err();
    assert!(err.to_string().contains("requester must be a JSON object"), "{err}");
    assert_eq!(log.len(), 0);
}
