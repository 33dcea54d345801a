//! Decisions asked for a loop other than Kerman's (pydantic-ai's deferred tool approvals under
//! `KermanDurability`): requested outside any turn with `for`, pending until decided, decided
//! by the core's `decide` like any approval, and refused when decided twice.

use kerman::agent_loop::decisions::{self, Decide, DecideError};
use kerman::agent_loop::foreign_decisions::{self, ForeignCall};
use kerman::event_log::{MemoryStore, Store};
use serde_json::json;

fn call(id: &str, name: &str, arguments: &str) -> ForeignCall {
    ForeignCall { call_id: id.into(), name: name.into(), arguments: arguments.into(), expires_at: None }
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

#[test]
fn a_foreign_request_past_its_deadline_is_expired_by_a_decision_or_by_expire() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let requester = json!({"kind": "pydantic-ai", "run": 1});
    let calls = [
        ForeignCall { expires_at: Some(1_000), ..call("c1", "refund", "{}") },
        ForeignCall { expires_at: Some(5_000), ..call("c2", "refund", "{}") },
        call("c3", "refund", "{}"),
    ];
    let asked = foreign_decisions::request(&log, &requester, &calls).unwrap();
    assert_eq!(log.range(0, None)[0].data()["expiresAt"], json!(1_000));
    assert_eq!(decisions::next_expiry(&log), Some(1_000));
    // A decision past the deadline is refused and logs the expiry; once more, still `Expired`.
    let late = decisions::decide(&log, &asked[0].decision_id, Decide::Approve, None, Some("k"), 2_000).unwrap_err();
    assert!(matches!(late, DecideError::Expired(_)), "{late}");
    let again = decisions::decide(&log, &asked[0].decision_id, Decide::Approve, None, Some("k"), 2_000).unwrap_err();
    assert!(matches!(again, DecideError::Expired(_)), "{again}");
    // `expire` resolves what is due at `now` and nothing else; a Kerman loop's cancel leaves them.
    assert_eq!(decisions::expire(&log, 4_999).unwrap(), 0);
    assert_eq!(decisions::cancel_pending(&log).unwrap(), 0);
    assert_eq!(decisions::expire(&log, 5_000).unwrap(), 1);
    let outcomes: Vec<_> =
        log.with_events(foreign_decisions::requests).iter().map(|f| f.resolution.as_ref().map(|r| r.outcome.as_str())).collect();
    assert_eq!(outcomes, [Some("expired"), Some("expired"), None]);
    assert_eq!(decisions::next_expiry(&log), None);
}

#[test]
fn cancel_resolves_one_requester_s_pending_requests_or_all() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let (one, two) = (json!({"kind": "pydantic-ai", "run": 1}), json!({"run": 2, "kind": "pydantic-ai"}));
    let first = foreign_decisions::request(&log, &one, &[call("a", "t", "{}"), call("b", "t", "{}")]).unwrap();
    foreign_decisions::request(&log, &two, &[call("c", "t", "{}")]).unwrap();
    decisions::decide(&log, &first[0].decision_id, Decide::Approve, None, None, 0).unwrap();
    assert!(foreign_decisions::cancel(&log, Some(&json!("run 1"))).unwrap_err().to_string().contains("JSON object"));
    // Keys in another order name the same requester.
    assert_eq!(foreign_decisions::cancel(&log, Some(&json!({"run": 1, "kind": "pydantic-ai"}))).unwrap(), 1);
    let pending: Vec<_> = decisions::pending(&log).into_iter().map(|r| r.call_id).collect();
    assert_eq!(pending, ["c"]);
    assert_eq!(foreign_decisions::cancel(&log, None).unwrap(), 1);
    assert!(decisions::pending(&log).is_empty());
    let refused = decisions::decide(&log, &first[1].decision_id, Decide::Approve, None, None, 0).unwrap_err();
    assert!(matches!(refused, DecideError::Resolved(_, decisions::Resolved::Cancelled)), "{refused}");
}

/// `find` reads a request's batch and the resolutions that name it; what it says must be what
/// the whole fold says, for every request of a log of runs between plugin events, some decided.
#[test]
fn find_agrees_with_the_whole_fold() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let mut ids = Vec::new();
    for run in 1..=6u64 {
        let requester = json!({"kind": "pydantic-ai", "run": run});
        log.append("pydantic-ai/run", &json!({"run": run})).unwrap();
        let calls: Vec<_> = (0..=run % 3).map(|n| call(&format!("c{run}.{n}"), "t", &format!("{{\"n\":{n}}}"))).collect();
        let asked = foreign_decisions::request(&log, &requester, &calls).unwrap();
        ids.extend(asked.iter().map(|r| r.decision_id.clone()));
        log.append("pydantic-ai/run-end", &json!({"run": run})).unwrap();
        if run % 2 == 0 {
            decisions::decide(&log, &asked[0].decision_id, Decide::Approve, None, None, 0).unwrap();
        }
    }
    // A batch of one request (marked `last`), after the others.
    let torn = foreign_decisions::request(&log, &json!({"kind": "pydantic-ai", "run": 7}), &[call("t0", "t", "{}")]).unwrap();
    ids.push(torn[0].decision_id.clone());
    let events = log.range(0, None);
    let all = foreign_decisions::requests(&events);
    for id in &ids {
        let located = foreign_decisions::find(&events, id).unwrap();
        let expected = all.iter().find(|f| &f.request.decision_id == id).unwrap();
        assert_eq!(located.request, expected.request);
        assert_eq!(located.resolution, expected.resolution);
        let others = all.iter().any(|f| f.requester == expected.requester && f.resolution.is_none() && &f.request.decision_id != id);
        assert_eq!(located.others_pending, others, "{id}");
    }
    assert!(foreign_decisions::find(&events, "nope").is_none());
}

/// A loop's index of the waiting foreign requests, read after every change of a generated
/// session (requests in batches between other events, decisions, expiries, cancels, a loop's own
/// request and a resolution naming no request), says what the whole-log fold says.
#[test]
fn the_index_agrees_with_the_whole_fold_as_the_log_grows() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let index = foreign_decisions::Index::default();
    // xorshift64: the same session every run.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut asked = Vec::new();
    let mut checked = 0;
    for round in 0..400u64 {
        match next(8) {
            0 | 1 => {
                let requester = json!({"kind": "pydantic-ai", "run": next(4)});
                let calls: Vec<_> = (0..=next(3))
                    .map(|n| ForeignCall {
                        expires_at: (next(2) == 0).then(|| 1_000 * (1 + next(50)) as i64),
                        ..call(&format!("c{round}.{n}"), "t", "{}")
                    })
                    .collect();
                asked.extend(foreign_decisions::request(&log, &requester, &calls).unwrap().into_iter().map(|r| r.decision_id));
            }
            2 | 3 if !asked.is_empty() => {
                let id = asked[usize::try_from(next(asked.len() as u64)).unwrap()].clone();
                let decision = if next(2) == 0 { Decide::Approve } else { Decide::Deny(None) };
                // Refused when it was resolved already: the log is unchanged then.
                let _ = decisions::decide(&log, &id, decision, None, None, 0);
            }
            4 => {
                let now = 1_000 * next(60) as i64;
                let by_index = decisions::expire_with(&log, &index, now).unwrap();
                assert_eq!(decisions::expire(&log, now).unwrap(), 0, "the index's expiry left nothing due");
                checked += by_index;
            }
            5 if next(4) == 0 => {
                foreign_decisions::cancel(&log, Some(&json!({"kind": "pydantic-ai", "run": next(4)}))).unwrap();
            }
            6 => {
                // The loop's own approval (no `for`) and a resolution that names no request.
                let own = json!({
                    "turn": 1, "step": 1, "decisionId": format!("own{round}"), "callId": "x", "index": 0, "name": "t",
                    "arguments": "{}", "digest": "d", "kind": "approval"
                });
                log.append_loop_event("decision/requested", &own, None).unwrap();
                log.append_loop_event(
                    "decision/resolved",
                    &json!({"turn": 0, "step": 0, "decisionId": "nobody", "outcome": "approved"}),
                    None,
                )
                .unwrap();
            }
            _ => {
                log.append("pydantic-ai/run", &json!({"round": round})).unwrap();
            }
        }
        let whole: Vec<_> =
            log.with_events(foreign_decisions::requests).into_iter().filter(|f| f.resolution.is_none()).map(|f| f.request).collect();
        assert_eq!(index.pending(&log), whole, "round {round}");
        assert_eq!(log.with_events(foreign_decisions::pending), whole, "round {round}");
        assert_eq!(decisions::next_expiry_with(&log, &index), decisions::next_expiry(&log), "round {round}");
    }
    assert!(checked > 0 && !index.pending(&log).is_empty(), "the session expired some requests and left some waiting");
    // An index read against another log (a log only grows) starts again.
    let other = MemoryStore::new().create(Some("t")).unwrap();
    assert!(index.pending(&other).is_empty());
}

#[test]
fn a_foreign_request_is_listed_but_is_not_the_loop_s_to_wait_for() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    foreign_decisions::request(&log, &json!({"kind": "pydantic-ai", "run": 1}), &[call("c1", "refund", "{}")]).unwrap();
    let listed: Vec<_> = decisions::pending(&log).into_iter().map(|r| r.call_id).collect();
    assert_eq!(listed, ["c1"]);
    assert!(decisions::own_pending(&log).is_empty());
}
