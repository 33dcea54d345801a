//! Budgets: the usage fold (tokens, requests, tool calls and USD, per turn and per session)
//! and the rule that stops a turn when its budget is spent.
//!
//! The fold reads the log only, from its first event, catching up on every check: a loop that
//! opens a session (another process, after a crash) spends from what the log already holds,
//! never from a count kept in memory. It counts a request as the ledger does
//! (`kerman.usage.ledger`, docs/usage.md): one per `assistant/message`, and one per failed
//! attempt (chunks that got no message; the loop ends each failed attempt in the log, one that
//! failed before its first chunk included); its tokens are the usage's `input` (the whole
//! prompt, cached tokens included) plus `output`; its USD the usage's `costUsd`, which the loop
//! logs with the usage when the budget has a USD limit (the host prices the request). A failed
//! attempt that streamed nothing (its one chunk is its failed `finish`: a refused connection, an
//! HTTP error) reported no usage and produced nothing: it counts as a request, not as one of
//! unknown price (which would spend a USD limit for good). A request a cancellation cut before
//! anything visible was logged ends with a `cancelled` finish the loop writes: like any finish
//! that is not `stop` or `max-tokens` it ends an attempt, counted the same way (a request, with
//! the usage its chunks reported, if any).
//!
//! The rule: a budget is spent when any limit is reached (`spent >= max`). It is checked when
//! input is claimed and before every model request; a request is never started on a spent
//! budget, so a limit is overshot by at most the request in flight (and, for tool calls, by the
//! calls of its reply).

use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::events;
use crate::event_log::SessionLog;

/// Over what the limits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// Each turn starts from nothing.
    Turn,
    /// The whole session, every turn before this one included.
    Session,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Turn => "turn",
            Per::Session => "session",
        }
    }
}

/// Where a budget was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// Input was claimed (the turn, or the step, would start from it).
    Claim,
    /// A model request was about to be made.
    Request,
}

impl At {
    pub fn as_str(self) -> &'static str {
        match self {
            At::Claim => "claim",
            At::Request => "request",
        }
    }
}

/// The limits of a budget (`None`: no limit of that kind).
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub tokens: Option<u64>,
    pub requests: Option<u64>,
    pub tool_calls: Option<u64>,
    pub usd: Option<f64>,
    pub per: Per,
}

/// What was spent, in one scope (a turn or the session).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spent {
    pub tokens: u64,
    pub requests: u64,
    pub tool_calls: u64,
    /// The sum of the requests' logged prices.
    pub usd: f64,
    /// Requests that logged no price (`costUsd`): a USD limit cannot tell what they cost.
    pub unpriced: u64,
}

impl Spent {
    fn add(&mut self, usage: Option<&Map<String, Value>>) {
        self.requests += 1;
        let count = |key: &str| usage.and_then(|u| u.get(key)).and_then(Value::as_u64).unwrap_or(0);
        self.tokens += count("input") + count("output");
        match usage.and_then(|u| u.get("costUsd")).and_then(price) {
            Some(usd) => self.usd += usd,
            None => self.unpriced += 1,
        }
    }

    /// As logged in a stop: `{tokens, requests, toolCalls, costUsd, unpriced}`.
    pub fn to_value(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "requests": self.requests,
            "toolCalls": self.tool_calls,
            "costUsd": self.usd,
            "unpriced": self.unpriced,
        })
    }
}

/// A price as logged: a number, or the exact decimal as a string.
fn price(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Why a budget stopped a turn: the limit reached, with the numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Stop {
    pub at: At,
    pub per: Per,
    /// `tokens`, `requests`, `toolCalls` or `usd`.
    pub limit: &'static str,
    pub max: Value,
    pub spent: Value,
    /// Everything spent in the budget's scope.
    pub used: Spent,
}

impl Stop {
    /// The fields `turn/end.reason` carries besides `kind`.
    pub fn fields(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("at".into(), self.at.as_str().into());
        out.insert("per".into(), self.per.as_str().into());
        out.insert("limit".into(), self.limit.into());
        out.insert("max".into(), self.max.clone());
        out.insert("spent".into(), self.spent.clone());
        out.insert("used".into(), self.used.to_value());
        out
    }
}

impl Budget {
    /// The first limit `spent` reaches, if any (`None`: there is budget left).
    pub fn spent(&self, spent: &Spent, at: At) -> Option<Stop> {
        let stop =
            |limit: &'static str, max: Value, value: Value| Stop { at, per: self.per, limit, max, spent: value, used: spent.clone() };
        if let Some(max) = self.tokens.filter(|max| spent.tokens >= *max) {
            return Some(stop("tokens", max.into(), spent.tokens.into()));
        }
        if let Some(max) = self.requests.filter(|max| spent.requests >= *max) {
            return Some(stop("requests", max.into(), spent.requests.into()));
        }
        if let Some(max) = self.tool_calls.filter(|max| spent.tool_calls >= *max) {
            return Some(stop("toolCalls", max.into(), spent.tool_calls.into()));
        }
        if let Some(max) = self.usd {
            // A request of unknown price may have cost anything: the budget cannot afford more.
            if spent.usd >= max || spent.unpriced > 0 {
                return Some(stop("usd", json!(max), json!(spent.usd)));
            }
        }
        None
    }
}

/// The usage fold over one log, fed event by event from the first.
#[derive(Debug, Default, Clone)]
pub struct UsageFold {
    /// The next seq to fold.
    seen: u64,
    /// The turn the last `turn/start` began.
    pub turn: u64,
    pub session: Spent,
    /// The spent of the last turn started.
    pub this_turn: Spent,
    /// A streamed request whose message has not come.
    pending: Option<Pending>,
}

/// The chunks of a request in flight: the usage they reported, if any.
#[derive(Debug, Default, Clone)]
struct Pending {
    usage: Option<Map<String, Value>>,
    /// A chunk other than a failed `finish` came: the request produced something.
    streamed: bool,
}

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct WithChunk {
    chunk: Map<String, Value>,
}

impl UsageFold {
    /// Folds what `log` appended since the last call.
    pub fn catch_up(&mut self, log: &SessionLog) {
        let len = log.len();
        if self.seen >= len {
            return;
        }
        for event in log.range(self.seen, None) {
            self.add(event.kind(), event.data_json());
        }
        self.seen = len;
    }

    /// Folds one event.
    pub fn add(&mut self, kind: &str, data: &str) {
        match kind {
            events::ASSISTANT_CHUNK => {
                let Ok(WithChunk { chunk }) = serde_json::from_str::<WithChunk>(data) else { return };
                let pending = self.pending.get_or_insert_with(Pending::default);
                let kind = chunk.get("type").and_then(Value::as_str);
                if kind == Some("usage") {
                    let merged = pending.usage.get_or_insert_with(Map::new);
                    merged.extend(chunk.iter().filter(|(k, _)| *k != "type").map(|(k, v)| (k.clone(), v.clone())));
                }
                // A failed finish, or usage marked partial, ends an attempt that gets no message.
                let failed = kind == Some("finish") && !matches!(chunk.get("reason").and_then(Value::as_str), Some("stop" | "max-tokens"));
                let partial = kind == Some("usage") && chunk.get("partial") == Some(&Value::Bool(true));
                pending.streamed |= !failed;
                if failed || partial {
                    self.settle();
                }
            }
            events::ASSISTANT_MESSAGE => {
                // The message is the request its chunks streamed: they are not another one.
                self.pending = None;
                let usage = serde_json::from_str::<WithUsage>(data).ok().and_then(|w| w.usage);
                self.count(usage.as_ref());
            }
            events::TOOL_CALL => {
                self.settle();
                self.session.tool_calls += 1;
                self.this_turn.tool_calls += 1;
            }
            events::TURN_START => {
                self.settle();
                self.turn = serde_json::from_str::<Value>(data).ok().as_ref().and_then(events::turn_of).unwrap_or(self.turn + 1);
                self.this_turn = Spent::default();
            }
            events::STEP_START | events::STEP_END | events::TURN_END | events::REQUEST_HEADER | events::USER_MESSAGE => self.settle(),
            _ => {}
        }
    }

    /// The chunks in flight got no message: a failed request, with what they reported.
    fn settle(&mut self) {
        let Some(pending) = self.pending.take() else { return };
        if pending.usage.is_none() && !pending.streamed {
            // Failed before it produced anything: a request, with no tokens and nothing billed.
            self.session.requests += 1;
            self.this_turn.requests += 1;
            return;
        }
        self.count(pending.usage.as_ref());
    }

    fn count(&mut self, usage: Option<&Map<String, Value>>) {
        self.session.add(usage);
        self.this_turn.add(usage);
    }

    /// What `per` counts.
    pub fn spent(&self, per: Per) -> &Spent {
        match per {
            Per::Turn => &self.this_turn,
            Per::Session => &self.session,
        }
    }
}

/// A loop's budget and its fold (`Shared::budget`).
#[derive(Debug, Default)]
pub struct Keeper {
    budget: Mutex<Option<Budget>>,
    /// A stop before a model request asks a person (`budget_decisions`) instead of ending the turn.
    ask: std::sync::atomic::AtomicBool,
    fold: Mutex<UsageFold>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Keeper {
    pub fn set(&self, budget: Option<Budget>) {
        *lock(&self.budget) = budget;
    }

    pub fn set_ask(&self, ask: bool) {
        self.ask.store(ask, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a stop before a model request asks a person.
    pub fn asks(&self) -> bool {
        self.ask.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn get(&self) -> Option<Budget> {
        lock(&self.budget).clone()
    }

    /// The fold caught up with `log`, as it stands.
    pub fn usage(&self, log: &SessionLog) -> UsageFold {
        let mut fold = lock(&self.fold);
        fold.catch_up(log);
        fold.clone()
    }

    /// Whether the budget is spent, as `log` shows it (`None` without a budget: nothing is read).
    pub fn check(&self, log: &SessionLog, at: At) -> Option<Stop> {
        let budget = self.get()?;
        let mut fold = lock(&self.fold);
        fold.catch_up(log);
        budget.spent(fold.spent(budget.per), at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_log::{MemoryStore, Store};
    use crate::message::{Message, MessageKind};

    /// A log as the loop writes it: `turn/start`s and replies with `usage`.
    enum Ev {
        Turn(u64),
        Reply(&'static str),
    }

    fn write(log: &SessionLog, events: &[Ev]) {
        for event in events {
            let appended = match event {
                Ev::Turn(n) => events::append(log, events::turn_start(*n)),
                Ev::Reply(usage) => {
                    let message = Message::of_text(MessageKind::Assistant, "ok", None);
                    events::append(log, events::assistant_message(1, 1, &message, false, Some(usage), Vec::new()))
                }
            };
            appended.unwrap();
        }
    }

    #[test]
    fn the_fold_counts_messages_failed_attempts_and_tool_calls_per_turn_and_session() {
        let mut fold = UsageFold::default();
        let events = [
            (events::TURN_START, json!({"turn": 1})),
            (events::ASSISTANT_MESSAGE, json!({"turn": 1, "step": 1, "usage": {"input": 100, "output": 20, "costUsd": "0.5"}})),
            (events::TOOL_CALL, json!({"turn": 1, "step": 1})),
            (events::TOOL_CALL, json!({"turn": 1, "step": 1})),
            // A streamed attempt that failed with partial usage, then its retry, completed.
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "text-delta", "text": "a"}})),
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "usage", "input": 50, "output": 5, "partial": true}})),
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "usage", "input": 60, "output": 6}})),
            (events::ASSISTANT_MESSAGE, json!({"usage": {"input": 60, "output": 6, "costUsd": 0.25}})),
            (events::TURN_START, json!({"turn": 2})),
            // Chunks cut by the end of a step: a failed request with no usage.
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "text-delta", "text": "b"}})),
            (events::STEP_END, json!({"turn": 2, "step": 1})),
            // Two attempts that failed before their first chunk (the loop logged their failed
            // finish): two requests, no tokens, and no unknown price.
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "finish", "reason": "error", "error": {"code": "RATE_LIMITED"}}})),
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "finish", "reason": "error", "error": {"code": "RATE_LIMITED"}}})),
            // A request cancelled before its first chunk (the loop's cancelled finish): one more,
            // no tokens, no unknown price; one cancelled after only usage: that usage.
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "finish", "reason": "cancelled"}})),
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "usage", "input": 9}})),
            (events::ASSISTANT_CHUNK, json!({"chunk": {"type": "finish", "reason": "cancelled"}})),
        ];
        for (kind, data) in &events {
            fold.add(kind, &data.to_string());
        }
        assert_eq!(fold.session, Spent { tokens: 250, requests: 8, tool_calls: 2, usd: 0.75, unpriced: 3 });
        assert_eq!(fold.this_turn, Spent { tokens: 9, requests: 5, tool_calls: 0, usd: 0.0, unpriced: 2 });
        assert_eq!(fold.turn, 2);
    }

    #[test]
    fn the_keeper_rebuilds_from_the_log_and_stops_at_the_first_limit_reached() {
        let log = MemoryStore::new().create(None).unwrap();
        write(&log, &[Ev::Turn(1), Ev::Reply(r#"{"input":700,"output":300}"#)]);
        let keeper = Keeper::default();
        assert_eq!(keeper.check(&log, At::Request), None, "no budget, no stop");
        keeper.set(Some(Budget { tokens: Some(1000), requests: Some(5), tool_calls: None, usd: None, per: Per::Session }));
        let stop = keeper.check(&log, At::Request).expect("1000 tokens of 1000 spent");
        assert_eq!((stop.limit, stop.max.clone(), stop.spent.clone()), ("tokens", json!(1000), json!(1000)));
        assert_eq!(Value::Object(stop.fields())["used"]["requests"], 1);
        // Per turn: the next turn starts from nothing; the requests limit counts in it.
        keeper.set(Some(Budget { tokens: None, requests: Some(1), tool_calls: None, usd: None, per: Per::Turn }));
        write(&log, &[Ev::Turn(2)]);
        assert_eq!(keeper.check(&log, At::Claim), None);
        write(&log, &[Ev::Reply(r#"{"input":1,"output":1}"#)]);
        assert_eq!(keeper.check(&log, At::Claim).map(|s| (s.limit, s.at)), Some(("requests", At::Claim)));
        // A fresh keeper over the same log (a reopened session) spends from what it holds.
        let reopened = Keeper::default();
        reopened.set(Some(Budget { tokens: Some(1002), requests: None, tool_calls: None, usd: None, per: Per::Session }));
        assert_eq!(reopened.check(&log, At::Request).map(|s| s.spent), Some(json!(1002)));
    }

    #[test]
    fn a_usd_limit_stops_on_a_request_of_unknown_price() {
        let budget = Budget { tokens: None, requests: None, tool_calls: None, usd: Some(1.0), per: Per::Session };
        let mut spent = Spent::default();
        spent.add(Some(&json!({"input": 1, "costUsd": "0.4"}).as_object().unwrap().clone()));
        assert_eq!(budget.spent(&spent, At::Request), None);
        spent.add(None);
        assert_eq!(budget.spent(&spent, At::Request).map(|s| s.limit), Some("usd"));
    }
}
