//! Splices: the one mutation of the inbox lists, shared by live mutations, replay and folds.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ptr::NonNull;
use std::sync::Arc;

use serde_json::Value;

use crate::message::{Message, MessageKind};

/// Which inbox list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Ordinary prompts, one per turn.
    NextTurn,
    /// Input for the nearest step boundary: steering, injected context, tool contexts.
    NextStep,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::NextTurn => "next-turn",
            Target::NextStep => "next-step",
        }
    }

    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "next-turn" => Some(Target::NextTurn),
            "next-step" => Some(Target::NextStep),
            _ => None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a splice's removal was, as its payload's `outcome` says: the one reader of that field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpliceOutcome {
    /// No `outcome`: a turn's claim (or an insertion, which removes nothing).
    Claimed,
    /// `"canceled"`: an ordinary removal, not a claim.
    Canceled,
}

impl SpliceOutcome {
    /// The outcome of the `agent/inbox/spliced` payload `data`.
    pub fn of(data: &Value) -> SpliceOutcome {
        match data.get("outcome").and_then(Value::as_str) {
            Some("canceled") => SpliceOutcome::Canceled,
            _ => SpliceOutcome::Claimed,
        }
    }
}

/// Why a splice cannot apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpliceError {
    /// Coordinates outside the list, or a payload of the wrong shape (replay only).
    Invalid(String),
    /// An inserted id that is already pending (or inserted twice).
    Duplicate(String),
}

impl fmt::Display for SpliceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpliceError::Invalid(detail) if detail.is_empty() => write!(f, "invalid inbox splice"),
            SpliceError::Invalid(detail) => write!(f, "invalid inbox splice: {detail}"),
            SpliceError::Duplicate(id) => write!(f, "message \"{id}\" is already pending"),
        }
    }
}

impl std::error::Error for SpliceError {}

/// A normalised splice: remove `removed` items at `start` of `target`, insert `inserted` there.
#[derive(Clone, Debug)]
pub struct Splice {
    pub target: Target,
    pub start: usize,
    pub removed: usize,
    pub inserted: Vec<Arc<Message>>,
    /// An ordinary removal (`outcome: "canceled"`), as opposed to a claim.
    pub canceled: bool,
    /// Who claimed (a claim by a loop other than Kerman's, such as a framework's under
    /// `KermanDurability`): a JSON object's compact text, logged as `by`, so the claim and the
    /// record of what it was for are one append. `None` for Kerman's own claims and every other
    /// splice.
    pub by: Option<Arc<str>>,
}

impl Splice {
    /// The `agent/inbox/spliced` payload, keys in the reference's order.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(64 + self.inserted.iter().map(|m| m.json().len()).sum::<usize>());
        self.write_json(&mut out);
        out
    }

    /// Appends [`to_json`](Self::to_json)'s text to `out`.
    pub fn write_json(&self, out: &mut String) {
        out.push_str("{\"target\":\"");
        out.push_str(self.target.as_str());
        out.push_str("\",\"start\":");
        crate::json::push_u64(out, self.start as u64);
        if self.removed > 0 {
            out.push_str(",\"removedCount\":");
            crate::json::push_u64(out, self.removed as u64);
        }
        out.push_str(",\"inserted\":[");
        for (i, m) in self.inserted.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(m.json());
        }
        out.push(']');
        if self.canceled && self.removed > 0 {
            out.push_str(",\"outcome\":\"canceled\"");
        }
        if let Some(by) = &self.by {
            out.push_str(",\"by\":");
            out.push_str(by);
        }
        out.push('}');
    }

    /// Parses a logged payload. Unknown extra fields are ignored; `outcome` does not change
    /// the effect on the lists.
    pub fn from_value(data: &Value) -> Result<Splice, SpliceError> {
        let invalid = |d: &str| SpliceError::Invalid(d.to_string());
        let obj = data.as_object().ok_or_else(|| invalid("payload is not an object"))?;
        let target = obj
            .get("target")
            .and_then(Value::as_str)
            .and_then(Target::parse)
            .ok_or_else(|| invalid("target must be \"next-turn\" or \"next-step\""))?;
        let start = obj.get("start").and_then(safe_index).ok_or_else(|| invalid("start must be a non-negative integer"))?;
        let removed = match obj.get("removedCount") {
            None => 0,
            Some(v) => safe_index(v).ok_or_else(|| invalid("removedCount must be a non-negative integer"))?,
        };
        let items = obj.get("inserted").and_then(Value::as_array).ok_or_else(|| invalid("inserted must be a list"))?;
        let mut inserted = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let m = Message::from_value(item).map_err(|e| SpliceError::Invalid(format!("inserted[{i}]: {e}")))?;
            if m.kind() != MessageKind::User {
                return Err(SpliceError::Invalid(format!("inserted[{i}] is not a user message")));
            }
            inserted.push(Arc::new(m));
        }
        let canceled = SpliceOutcome::of(data) == SpliceOutcome::Canceled;
        let by = obj.get("by").filter(|by| by.is_object()).map(|by| Arc::from(crate::json::compact(by)));
        Ok(Splice { target, start, removed, inserted, canceled, by })
    }
}

/// A JSON number that is a safe, non-negative integer (JavaScript's `Number.isSafeInteger`).
fn safe_index(v: &Value) -> Option<usize> {
    const MAX_SAFE: u64 = (1 << 53) - 1;
    let u = match v.as_u64() {
        Some(u) => u,
        None => {
            let f = v.as_f64()?;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "f is a whole number in 0..2^53, checked first")]
            (f >= 0.0 && f.fract() == 0.0 && f <= MAX_SAFE as f64).then_some(f as u64)?
        }
    };
    // Beyond `usize` (a 32-bit target) is not an index, rather than one that wraps.
    (u <= MAX_SAFE).then(|| usize::try_from(u).ok()).flatten()
}

/// Python slice semantics for live coordinates (SPEC 4.1): negative `start` counts from the
/// end and clamps at 0, `start > len` clamps to `len`, negative `delete` is 0, and deletion
/// clamps to what is there.
pub fn normalize(len: usize, start: i64, delete: i64) -> (usize, usize) {
    let len_i = len as i64;
    let start = if start < 0 { (len_i + start).max(0) } else { start.min(len_i) };
    let start = usize::try_from(start).expect("clamped to 0..=len");
    let delete = if delete <= 0 { 0 } else { usize::try_from(delete).unwrap_or(usize::MAX).min(len - start) };
    (start, delete)
}

/// A pending message in the id index: hashed and compared by id, looked up by `&str`.
///
/// It points at a message without holding a reference count: the index is only changed
/// together with the lists, and every key points at a message one of the two lists holds (an
/// `Arc` never moves its contents). Counting the index's references cost two atomic operations
/// per queued message (the clone, then the drop when it leaves), ~10 ns each on the VMs
/// measured here: as much as the rest of a claim's bookkeeping per message.
#[derive(Clone, Copy, Debug)]
struct Pending(NonNull<Message>);

// SAFETY: a `Pending` is only dereferenced as `&Message` (which is `Sync`) while the `Lists`
// holding it is borrowed, and the lists keep the message alive (see `Lists`); so sending one
// to another thread hands over no more than a `&Message` would.
unsafe impl Send for Pending {}
// SAFETY: as for `Send`: sharing a `Pending` shares only a `&Message`, and `Message` is `Sync`.
unsafe impl Sync for Pending {}

impl Pending {
    fn of(message: &Arc<Message>) -> Pending {
        Pending(NonNull::from(&**message))
    }

    fn id(&self) -> &str {
        // SAFETY: the message is held by the lists that hold this key (the `Lists` invariant).
        unsafe { self.0.as_ref() }.id()
    }
}

impl Hash for Pending {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Pending {}

impl Borrow<str> for Pending {
    fn borrow(&self) -> &str {
        self.id()
    }
}

/// The two pending lists plus an index of pending ids.
///
/// Invariant: `ids` holds exactly one key per message in `next_turn` and `next_step`, pointing
/// at that message. The lists are private so that only [`Lists::apply`] changes them, and it
/// changes the index with them. A clone copies the `Arc`s, so its keys point at messages its
/// own lists hold too.
#[derive(Clone, Debug, Default)]
pub struct Lists {
    next_turn: Vec<Arc<Message>>,
    next_step: Vec<Arc<Message>>,
    ids: HashSet<Pending, foldhash::fast::RandomState>,
}

impl Lists {
    pub fn next_turn(&self) -> &[Arc<Message>] {
        &self.next_turn
    }

    pub fn next_step(&self) -> &[Arc<Message>] {
        &self.next_step
    }

    pub fn list(&self, target: Target) -> &[Arc<Message>] {
        match target {
            Target::NextTurn => &self.next_turn,
            Target::NextStep => &self.next_step,
        }
    }

    fn list_mut(&mut self, target: Target) -> &mut Vec<Arc<Message>> {
        match target {
            Target::NextTurn => &mut self.next_turn,
            Target::NextStep => &mut self.next_step,
        }
    }

    pub fn len(&self) -> usize {
        self.next_turn.len() + self.next_step.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// Finds a pending message: `next-turn` first, then `next-step`.
    pub fn locate(&self, id: &str) -> Option<(Target, usize)> {
        if !self.ids.contains(id) {
            return None;
        }
        for target in [Target::NextTurn, Target::NextStep] {
            if let Some(i) = self.list(target).iter().position(|m| m.id() == id) {
                return Some((target, i));
            }
        }
        None
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Message>> {
        self.locate(id).map(|(t, i)| &self.list(t)[i])
    }

    /// Checks a splice against the current lists (reference 3.4): coordinates in range, and
    /// no id pending twice afterwards.
    pub fn validate(&self, s: &Splice) -> Result<(), SpliceError> {
        let list = self.list(s.target);
        if s.start > list.len() || s.start + s.removed > list.len() {
            return Err(SpliceError::Invalid(String::new()));
        }
        let removed = &list[s.start..s.start + s.removed];
        // Most splices insert one message; only several need a set to catch repeats among them.
        let mut seen: Option<HashSet<&str>> = (s.inserted.len() > 1).then(HashSet::new);
        for m in &s.inserted {
            let id = m.id();
            let repeated = seen.as_mut().is_some_and(|seen| !seen.insert(id));
            if repeated || (self.ids.contains(id) && !removed.iter().any(|r| r.id() == id)) {
                return Err(SpliceError::Duplicate(self.first_repeat(s).unwrap_or(id).to_string()));
            }
        }
        Ok(())
    }

    /// The id the reference names for a duplicate: the first one seen twice walking the
    /// candidate lists — for a next-turn splice the new next-turn then next-step, for a
    /// next-step splice next-turn then the new next-step. Only run once a duplicate is known.
    fn first_repeat<'a>(&'a self, s: &'a Splice) -> Option<&'a str> {
        let list = self.list(s.target);
        let candidate = list[..s.start].iter().chain(&s.inserted).chain(&list[s.start + s.removed..]);
        let walk: Vec<&Arc<Message>> = match s.target {
            Target::NextTurn => candidate.chain(&self.next_step).collect(),
            Target::NextStep => self.next_turn.iter().chain(candidate).collect(),
        };
        let mut seen = HashSet::with_capacity(walk.len());
        walk.into_iter().map(|m| m.id()).find(|id| !seen.insert(*id))
    }

    /// Applies a validated splice; returns the removed messages.
    pub fn apply(&mut self, s: &Splice) -> Vec<Arc<Message>> {
        let list = self.list_mut(s.target);
        let removed: Vec<Arc<Message>> = if s.removed > 0 && s.removed == list.len() && s.inserted.is_empty() {
            // The whole list goes (a claim of next-step, a clear): hand its buffer over rather
            // than copying the items out, and leave an empty one of the same capacity.
            let capacity = list.capacity();
            std::mem::replace(list, Vec::with_capacity(capacity))
        } else {
            list.splice(s.start..s.start + s.removed, s.inserted.iter().cloned()).collect()
        };
        // The removed messages are still alive here (returned to the caller), so their keys
        // can be looked at while they go.
        if removed.len() == self.ids.len() {
            // Everything pending was removed (a claim of the whole next-step list, a clear).
            self.ids.clear();
        } else {
            for m in &removed {
                self.ids.remove(m.id());
            }
        }
        for m in &s.inserted {
            self.ids.insert(Pending::of(m));
        }
        removed
    }

    /// Validates then applies.
    pub fn splice(&mut self, s: &Splice) -> Result<Vec<Arc<Message>>, SpliceError> {
        self.validate(s)?;
        Ok(self.apply(s))
    }
}

/// The placement of a pending message, as a queue UI shows it.
pub fn placement(target: Target, message: &Message) -> &'static str {
    match target {
        Target::NextTurn => "queued",
        Target::NextStep if message.source_kind() == "user" => "steering",
        Target::NextStep => "context",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str) -> Arc<Message> {
        Arc::new(Message::user(vec![], None, Some(id.into())).unwrap())
    }

    #[test]
    fn normalize_follows_python_slices() {
        assert_eq!(normalize(2, -1, 1), (1, 1));
        assert_eq!(normalize(2, -5, 1), (0, 1));
        assert_eq!(normalize(2, 9, 1), (2, 0));
        assert_eq!(normalize(3, 1, -4), (1, 0));
        assert_eq!(normalize(3, 1, 99), (1, 2));
        assert_eq!(normalize(0, i64::MIN, i64::MAX), (0, 0));
        assert_eq!(normalize(3, i64::MIN, i64::MAX), (0, 3));
        assert_eq!(normalize(3, i64::MAX, i64::MAX), (3, 0));
        assert_eq!(normalize(3, -1, i64::MIN), (2, 0));
    }

    #[test]
    fn safe_index_takes_whole_numbers_up_to_2_pow_53_only() {
        use serde_json::json;
        assert_eq!(safe_index(&json!(0)), Some(0));
        assert_eq!(safe_index(&json!(7.0)), Some(7));
        assert_eq!(safe_index(&json!(9_007_199_254_740_991_u64)), usize::try_from(9_007_199_254_740_991_u64).ok());
        assert_eq!(safe_index(&json!(9_007_199_254_740_992_u64)), None);
        assert_eq!(safe_index(&json!(9_007_199_254_740_992.0)), None);
        assert_eq!(safe_index(&json!(u64::MAX)), None);
        assert_eq!(safe_index(&json!(-1)), None);
        assert_eq!(safe_index(&json!(-1.0)), None);
        assert_eq!(safe_index(&json!(1.5)), None);
        assert_eq!(safe_index(&json!("1")), None);
    }

    #[test]
    fn payload_key_order() {
        let s = Splice { target: Target::NextStep, start: 0, removed: 1, inserted: vec![], canceled: true, by: None };
        assert_eq!(s.to_json(), r#"{"target":"next-step","start":0,"removedCount":1,"inserted":[],"outcome":"canceled"}"#);
        let s = Splice { target: Target::NextTurn, start: 0, removed: 1, inserted: vec![], canceled: false, by: None };
        assert_eq!(s.to_json(), r#"{"target":"next-turn","start":0,"removedCount":1,"inserted":[]}"#);
    }

    #[test]
    fn duplicates_are_refused_across_lists() {
        let mut lists = Lists::default();
        let a = msg("a");
        lists
            .splice(&Splice { target: Target::NextTurn, start: 0, removed: 0, inserted: vec![a.clone()], canceled: false, by: None })
            .unwrap();
        let dup = Splice { target: Target::NextStep, start: 0, removed: 0, inserted: vec![a.clone()], canceled: false, by: None };
        assert_eq!(lists.validate(&dup), Err(SpliceError::Duplicate("a".into())));
        let same_id_replace = Splice { target: Target::NextTurn, start: 0, removed: 1, inserted: vec![a], canceled: true, by: None };
        assert!(lists.validate(&same_id_replace).is_ok());
        let twice =
            Splice { target: Target::NextStep, start: 0, removed: 0, inserted: vec![msg("b"), msg("b")], canceled: false, by: None };
        assert_eq!(lists.validate(&twice), Err(SpliceError::Duplicate("b".into())));
        // Reference walk: the new next-turn list [b', a', a] repeats `a` first.
        let both =
            Splice { target: Target::NextTurn, start: 0, removed: 0, inserted: vec![msg("b2"), msg("a")], canceled: false, by: None };
        assert_eq!(lists.validate(&both), Err(SpliceError::Duplicate("a".into())));
    }

    #[test]
    fn out_of_range_is_invalid() {
        let lists = Lists::default();
        let s = Splice { target: Target::NextTurn, start: 1, removed: 0, inserted: vec![], canceled: false, by: None };
        assert!(matches!(lists.validate(&s), Err(SpliceError::Invalid(_))));
    }

    #[test]
    fn a_splice_outcome_is_read_from_its_payload_once() {
        let canceled = Splice { target: Target::NextStep, start: 0, removed: 1, inserted: vec![], canceled: true, by: None };
        let claimed = Splice { canceled: false, ..canceled.clone() };
        for (splice, outcome) in [(canceled, SpliceOutcome::Canceled), (claimed, SpliceOutcome::Claimed)] {
            let data: Value = serde_json::from_str(&splice.to_json()).unwrap();
            assert_eq!(SpliceOutcome::of(&data), outcome);
            assert_eq!(Splice::from_value(&data).unwrap().canceled, outcome == SpliceOutcome::Canceled);
        }
        assert_eq!(SpliceOutcome::of(&serde_json::json!({"outcome": "Canceled"})), SpliceOutcome::Claimed);
    }

    #[test]
    fn a_claimant_is_written_last_and_read_back() {
        let s = Splice {
            target: Target::NextStep,
            start: 0,
            removed: 1,
            inserted: vec![],
            canceled: false,
            by: Some(Arc::from(r#"{"run":1}"#)),
        };
        assert_eq!(s.to_json(), r#"{"target":"next-step","start":0,"removedCount":1,"inserted":[],"by":{"run":1}}"#);
        let data: Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(Splice::from_value(&data).unwrap().by.as_deref(), Some(r#"{"run":1}"#));
        let odd: Value = serde_json::json!({"target": "next-step", "start": 0, "inserted": [], "by": "x"});
        assert_eq!(Splice::from_value(&odd).unwrap().by, None);
    }
}
