//! The inbox: two lists of pending user messages, a projection of the log's splices.
//!
//! Every mutation follows one protocol (reference 3.5): normalise; skip a no-op; validate;
//! append one `agent/inbox/spliced` event; run the log's observers (they still see the lists
//! as they were, so they can rebuild removed messages from the coordinates); apply the splice
//! to the lists; then, with no lock held, notify the listener (discarded before inserted).
//! The log's publish token is held from validation to application, so mutations from several
//! threads serialise and an observer that mutates the inbox is refused as reentrant.

mod hook;
pub mod projection;
mod remote;
mod splice;

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use serde_json::Value;

pub use hook::{InsertHook, Refusal, Spliced};
pub use splice::{normalize, placement, Lists, Splice, SpliceError, SpliceOutcome, Target};

use crate::event_log::{inserted_ids, Intake, LogError, SessionLog, StagedInput, StagedOp, Taken, SPLICED};
use crate::message::{Message, MessageKind};

/// Live notifications of an inbox: called after each mutation, on the mutating thread.
pub trait InboxListener: Send + Sync {
    fn inserted(&self, _message: &Arc<Message>) {}
    fn discarded(&self, _message: &Arc<Message>) {}
    fn claimed(&self, _message: &Arc<Message>, _turn: u64) {}
    /// Messages another process enqueued were inserted (after their `inserted` calls);
    /// `wake`: at least one asked to wake the loop. Runs on the store's reply thread.
    fn arrived(&self, _wake: bool) {}
    /// Another process asked to cancel the running turn (`PostgresStore.cancel`), in order
    /// with the staged input around it: the loop applies it (`cause`, `keep_inbox` as for
    /// `loop.cancel`) and answers with the outcome, a JSON object; `None`: no loop here.
    /// Runs on the store's reply thread.
    fn cancel(&self, _cause: &Value, _keep_inbox: bool) -> Option<Value> {
        None
    }
    /// Another process asked to send again what ended turn `turn` claimed and never read
    /// (`PostgresStore.requeue`), in order with the staged input around it: the loop applies it
    /// (as `loop.requeue_claimed(turn)`, then wakes) and answers with the outcome, a JSON
    /// object; `None`: no loop here. Runs on the store's reply thread.
    fn requeue(&self, _turn: u64) -> Option<Value> {
        None
    }
    /// Another process decided a pending decision request (`PostgresStore.decide`; `args` is
    /// `{"decision_id", "outcome": {"kind", …}, "by", "key"}`), in order with the staged input
    /// around it: the loop applies it as its `loop.decide` would (then resumes the step when it
    /// was the last pending request) and answers with the outcome; `None`: no loop here. Runs
    /// on the store's reply thread.
    fn decide(&self, _args: &Value) -> Option<Value> {
        None
    }
    /// Another process recorded the result of a call in doubt (`PostgresStore.resolve`; `args`
    /// is `{"call_id", "text", "is_error"}`), in order with the staged input around it: the
    /// loop records it as its `loop.resolve` would (refused, with the reason, for a call not in
    /// doubt or one a resumed step is running) and answers with the outcome; `None`: no loop
    /// here. Runs on the store's reply thread.
    fn resolve(&self, _args: &Value) -> Option<Value> {
        None
    }
}

/// Errors of live inbox mutations.
#[derive(Debug)]
#[non_exhaustive]
pub enum InboxError {
    /// The inserted message's id is already pending.
    Duplicate(String),
    /// Only user messages can be queued.
    NotUserMessage(String),
    /// The durable append failed (closed, poisoned, reentrant...); nothing changed.
    Log(LogError),
    /// The log already has an inbox (the session's id): a log has at most one.
    Attached(String),
    /// This inbox was closed (the session's id): it no longer projects its log.
    Closed(String),
    /// The log's splices cannot be replayed.
    Projection(ProjectionError),
    /// The inbox's insertion hook refused a message; nothing changed.
    Refused(Refusal),
}

impl fmt::Display for InboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboxError::Duplicate(id) => write!(f, "message \"{id}\" is already pending"),
            InboxError::NotUserMessage(id) => write!(f, "message \"{id}\" is not a user message; only user messages can be queued"),
            InboxError::Log(e) => e.fmt(f),
            InboxError::Attached(id) => write!(
                f,
                "session \"{id}\" already has an inbox (an Inbox or AgentLoop over this log is open); a log has at most one: close or drop it first"
            ),
            InboxError::Closed(id) => write!(f, "this inbox of session \"{id}\" was closed; create a new Inbox (or AgentLoop) over the log"),
            InboxError::Projection(e) => e.fmt(f),
            InboxError::Refused(r) => r.fmt(f),
        }
    }
}

impl std::error::Error for InboxError {}

impl From<LogError> for InboxError {
    fn from(e: LogError) -> Self {
        InboxError::Log(e)
    }
}

/// A persisted splice that cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionError {
    pub seq: u64,
    pub cause: SpliceError,
}

impl fmt::Display for ProjectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid persisted inbox splice at session seq {}: {}", self.seq, self.cause)
    }
}

impl std::error::Error for ProjectionError {}

/// What one applied splice did.
struct Applied {
    removed: Vec<Arc<Message>>,
    inserted: Vec<Arc<Message>>,
    canceled: bool,
}

struct Shared {
    log: SessionLog,
    lists: Mutex<Lists>,
    listener: Option<Box<dyn InboxListener>>,
    /// What every new message passes before an insertion is planned (see [`InsertHook`]).
    hook: Option<Box<dyn InsertHook>>,
    /// What the log's backend hands staged input to; the backend holds it weakly.
    feed: Arc<Feed>,
    /// Set by [`Inbox::close`]: mutations are refused and the log may have another inbox.
    closed: AtomicBool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.log.release_inbox();
        }
    }
}

/// The inbox as an [`Intake`], without keeping it alive.
struct Feed(Weak<Shared>);

impl Intake for Feed {
    fn take(&self, staged: Vec<StagedInput>) -> Taken {
        match self.0.upgrade() {
            Some(shared) if !shared.closed.load(Ordering::Acquire) => Inbox { shared }.take_staged(staged),
            _ => Taken::default(),
        }
    }
}

/// The user message a staged row carries, if it is one and has the row's id.
fn staged_message(staged: &StagedInput) -> Option<(Target, Arc<Message>)> {
    let target = Target::parse(&staged.target)?;
    let value: Value = serde_json::from_str(&staged.message).ok()?;
    let message = Message::from_value(&value).ok()?;
    (message.kind() == MessageKind::User && message.id() == staged.id).then(|| (target, Arc::new(message)))
}

/// The inbox of one session. Clones share it. All methods are thread-safe.
#[derive(Clone)]
pub struct Inbox {
    shared: Arc<Shared>,
}

fn lock(m: &Mutex<Lists>) -> MutexGuard<'_, Lists> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// Where a thread writes splice payloads before they are copied into their event: reused,
    /// so a mutation allocates the event's text only, not a temporary string as well.
    static PAYLOAD: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Buffers past this size are not kept for the next payload.
const PAYLOAD_KEEP: usize = 4096;

/// The logged text of `splice`.
/// A splice that removes nothing and inserts nothing (or none planned).
fn is_noop(planned: Option<&(Target, usize, usize)>, inserted: &[Arc<Message>]) -> bool {
    planned.is_none_or(|&(_, _, removed)| removed == 0 && inserted.is_empty())
}

fn splice_error(e: SpliceError) -> InboxError {
    match e {
        SpliceError::Duplicate(id) => InboxError::Duplicate(id),
        SpliceError::Invalid(d) => InboxError::Log(LogError::InvalidEvent(format!("invalid inbox splice {d}"))),
    }
}

fn payload(splice: &Splice) -> Arc<str> {
    PAYLOAD.with(|buf| {
        // Not reentrant: nothing in here calls out.
        let mut buf = buf.borrow_mut();
        buf.clear();
        splice.write_json(&mut buf);
        let text = Arc::from(buf.as_str());
        if buf.capacity() > PAYLOAD_KEEP {
            *buf = String::new();
        }
        text
    })
}

/// Folds the splices of `events` (from `seed_length` on) into lists, validating each.
pub fn replay<'a>(events: impl IntoIterator<Item = &'a crate::event_log::Event>, seed_length: u64) -> Result<Lists, ProjectionError> {
    let mut lists = Lists::default();
    for event in events {
        if event.kind() != SPLICED || event.seq < seed_length {
            continue;
        }
        let fail = |cause| ProjectionError { seq: event.seq, cause };
        let splice = Splice::from_value(&event.data()).map_err(fail)?;
        lists.splice(&splice).map_err(fail)?;
    }
    Ok(lists)
}

impl Inbox {
    /// An inbox over `log`, replaying its splices (those at or after `header.seedLength`).
    /// A log has at most one inbox: while another is open (not closed or dropped) this is
    /// [`InboxError::Attached`].
    pub fn new(log: SessionLog, listener: Option<Box<dyn InboxListener>>) -> Result<Inbox, InboxError> {
        Inbox::with_hook(log, listener, None)
    }

    /// [`new`](Self::new), with an insertion hook every new message passes first.
    pub fn with_hook(
        log: SessionLog,
        listener: Option<Box<dyn InboxListener>>,
        hook: Option<Box<dyn InsertHook>>,
    ) -> Result<Inbox, InboxError> {
        if !log.claim_inbox() {
            return Err(InboxError::Attached(log.id().to_string()));
        }
        let seed_length = log.header().get("seedLength").and_then(Value::as_u64).unwrap_or(0);
        let lists = match log.with_events(|events| replay(events, seed_length)) {
            Ok(lists) => lists,
            Err(e) => {
                log.release_inbox();
                return Err(InboxError::Projection(e));
            }
        };
        let shared = Arc::new_cyclic(|weak| Shared {
            log,
            lists: Mutex::new(lists),
            listener,
            hook,
            feed: Arc::new(Feed(weak.clone())),
            closed: AtomicBool::new(false),
        });
        let feed: Arc<dyn Intake> = shared.feed.clone();
        shared.log.attach_intake(Arc::downgrade(&feed));
        Ok(Inbox { shared })
    }

    /// Inserts messages other processes staged for this session (`PostgresStore.enqueue`),
    /// each with an ordinary append splice, and applies the operations staged among them
    /// (`remote.rs`), in the given order. A message whose id is already
    /// in the log (inserted by an earlier splice) or pending is dropped, never inserted twice;
    /// a log failure stops, leaving the rest staged. Then tells the listener they arrived.
    pub fn take_staged(&self, staged: Vec<StagedInput>) -> Taken {
        let mut out = Taken::default();
        // Only splices whose text may hold one of the ids are parsed; ids are then compared
        // as values (an id JSON escapes is not in the text as it is).
        let mentions = |data: &str| staged.iter().any(|row| crate::json::may_hold_string(data, &row.id));
        let logged: HashSet<String> = self.shared.log.with_events(|events| {
            events.iter().filter(|e| e.kind() == SPLICED && mentions(e.data_json())).flat_map(|e| inserted_ids(e.data_json())).collect()
        });
        let mut wake = false;
        for row in staged {
            if row.op != StagedOp::Insert {
                match self.apply_staged_op(&row) {
                    remote::Applied::Outcome(outcome) => out.settled.push((row.id, outcome.to_string())),
                    // The log failed, or the inbox was closed: the rest stays staged.
                    remote::Applied::Stop => break,
                }
                continue;
            }
            let Some((target, message)) = staged_message(&row) else {
                out.dropped.push(row.id);
                continue;
            };
            if logged.contains(&row.id) || self.contains(&row.id) {
                out.dropped.push(row.id);
                continue;
            }
            match self.append(target, Arc::clone(&message)) {
                Ok(()) => {
                    wake |= row.wakeup;
                    out.taken.push(row.id);
                }
                Err(InboxError::Duplicate(_) | InboxError::NotUserMessage(_)) => out.dropped.push(row.id),
                // Nobody waits for this insertion: the hook is told, the row dropped (taking
                // it again would be refused again).
                Err(InboxError::Refused(refusal)) => {
                    if let Some(hook) = &self.shared.hook {
                        hook.dropped(&message, refusal);
                    }
                    out.dropped.push(row.id);
                }
                // The log failed, or the inbox was closed: the rest stays staged.
                Err(_) => break,
            }
        }
        if let (false, Some(listener)) = (out.taken.is_empty(), &self.shared.listener) {
            listener.arrived(wake);
        }
        out
    }

    /// Stops projecting the log: later mutations are refused ([`InboxError::Closed`]), staged
    /// input stays staged, and another inbox may be created over the log. Idempotent; the
    /// lists stay readable.
    pub fn close(&self) {
        if !self.shared.closed.swap(true, Ordering::AcqRel) {
            self.shared.log.release_inbox();
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    pub fn log(&self) -> &SessionLog {
        &self.shared.log
    }

    /// A copy of both lists.
    pub fn snapshot(&self) -> Lists {
        lock(&self.shared.lists).clone()
    }

    pub fn list(&self, target: Target) -> Vec<Arc<Message>> {
        lock(&self.shared.lists).list(target).to_vec()
    }

    pub fn len(&self) -> usize {
        lock(&self.shared.lists).len()
    }

    /// How many messages `target` holds.
    pub fn count(&self, target: Target) -> usize {
        lock(&self.shared.lists).list(target).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn has_pending(&self) -> bool {
        !self.is_empty()
    }

    pub fn contains(&self, id: &str) -> bool {
        lock(&self.shared.lists).contains(id)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Message>> {
        lock(&self.shared.lists).get(id).cloned()
    }

    /// Runs one mutation: `plan` sees the current lists and proposes where to splice
    /// (`target`, normalised `start`, `removed` count), or `None` for a no-op; `inserted` goes
    /// in there.
    ///
    /// The log's observers see the lists before the splice (reference INB-09), and run with no
    /// lock held; so with observers the lists are locked twice (plan and commit, then apply),
    /// without, once. A no-op never counts as a reentrant append (clearing an empty inbox
    /// from a log observer is harmless).
    fn mutate(
        &self,
        plan: impl Fn(&Lists) -> Option<(Target, usize, usize)>,
        inserted: Vec<Arc<Message>>,
        canceled: bool,
        by: Option<&Arc<str>>,
    ) -> Result<Option<Applied>, InboxError> {
        // With nothing to notify the log commits without its publish token (see
        // `SessionLog::commit_quiet`), under the lists lock; otherwise, or if the token is
        // held, the mutation runs the long way below, planned again.
        let inserted = {
            let mut lists = lock(&self.shared.lists);
            let Some(splice) = self.checked_splice(&lists, &plan, inserted, canceled, by)? else { return Ok(None) };
            match self.shared.log.commit_quiet(SPLICED, || (payload(&splice), None)) {
                Ok(committed) => {
                    committed?;
                    let removed = lists.apply(&splice);
                    return Ok(Some(Applied { removed, inserted: splice.inserted, canceled }));
                }
                Err(_) => splice.inserted,
            }
        };
        let publishing = match self.shared.log.publishing() {
            Ok(publishing) => publishing,
            Err(LogError::Reentrant) if is_noop(plan(&lock(&self.shared.lists)).as_ref(), &inserted) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (removed, splice, committed) = {
            let mut lists = lock(&self.shared.lists);
            let Some(splice) = self.checked_splice(&lists, &plan, inserted, canceled, by)? else { return Ok(None) };
            let committed = publishing.commit(SPLICED, payload(&splice), None, None, false)?;
            let removed = (!committed.has_observers()).then(|| lists.apply(&splice));
            (removed, splice, committed)
        };
        drop(committed.notify());
        let removed = removed.unwrap_or_else(|| lock(&self.shared.lists).apply(&splice));
        drop(publishing);
        Ok(Some(Applied { removed, inserted: splice.inserted, canceled: splice.canceled }))
    }

    /// The splice `plan` proposes over `lists`, checked against them; `None` for a no-op.
    /// A closed inbox no longer projects the log (another may): it writes nothing, though a
    /// no-op (clearing it when empty) is still harmless.
    fn checked_splice(
        &self,
        lists: &Lists,
        plan: &impl Fn(&Lists) -> Option<(Target, usize, usize)>,
        inserted: Vec<Arc<Message>>,
        canceled: bool,
        by: Option<&Arc<str>>,
    ) -> Result<Option<Splice>, InboxError> {
        let planned = plan(lists);
        if is_noop(planned.as_ref(), &inserted) {
            return Ok(None);
        }
        if self.is_closed() {
            return Err(InboxError::Closed(self.shared.log.id().to_string()));
        }
        let Some((target, start, removed)) = planned else { return Ok(None) };
        let splice = Splice { target, start, removed, inserted, canceled, by: by.cloned() };
        lists.validate(&splice).map_err(splice_error)?;
        Ok(Some(splice))
    }

    fn announce(&self, applied: &Applied) {
        let Some(listener) = &self.shared.listener else { return };
        if applied.canceled {
            for m in &applied.removed {
                listener.discarded(m);
            }
        }
        for m in &applied.inserted {
            listener.inserted(m);
        }
    }

    fn check_user(message: &Message) -> Result<(), InboxError> {
        match message.kind() {
            MessageKind::User => Ok(()),
            _ => Err(InboxError::NotUserMessage(message.id().to_string())),
        }
    }

    /// The messages to insert, as the hook leaves them: each checked to be a user message,
    /// then passed to the hook in order, before any lock is taken. A closed inbox refuses
    /// first, so the hook is not asked about an insertion that cannot happen.
    fn admit(&self, target: Target, inserted: Vec<Arc<Message>>) -> Result<Vec<Arc<Message>>, InboxError> {
        for m in &inserted {
            Self::check_user(m)?;
        }
        let Some(hook) = self.shared.hook.as_ref().filter(|hook| hook.active()) else { return Ok(inserted) };
        if inserted.is_empty() {
            return Ok(inserted);
        }
        if self.is_closed() {
            return Err(InboxError::Closed(self.shared.log.id().to_string()));
        }
        let mut admitted = Vec::with_capacity(inserted.len());
        for m in inserted {
            let given = Arc::clone(&m);
            let m = hook.admit(target, m).map_err(InboxError::Refused)?;
            if !Arc::ptr_eq(&m, &given) {
                Self::check_user(&m)?;
                if m.id() != given.id() {
                    let detail =
                        format!("the insertion hook changed message \"{}\"'s id to \"{}\"; a rewrite keeps the id", given.id(), m.id());
                    return Err(InboxError::Refused(Refusal::new(detail)));
                }
            }
            admitted.push(m);
        }
        Ok(admitted)
    }

    /// The general mutation, with Python slice semantics for `start` and `delete_count`.
    /// Returns the removed messages.
    pub fn splice(
        &self,
        target: Target,
        start: i64,
        delete_count: i64,
        inserted: Vec<Arc<Message>>,
    ) -> Result<Vec<Arc<Message>>, InboxError> {
        self.insert(target, start, delete_count, inserted).map(|s| s.removed)
    }

    /// [`splice`](Self::splice), returning what was inserted too (the hook's rewrites).
    pub fn insert(&self, target: Target, start: i64, delete_count: i64, inserted: Vec<Arc<Message>>) -> Result<Spliced, InboxError> {
        let inserted = self.admit(target, inserted)?;
        self.splice_admitted(target, start, delete_count, inserted)
    }

    /// [`splice`](Self::splice) of messages the log already holds (a requeue): they passed
    /// the hook when first inserted, and are not passed again.
    pub fn reinsert(&self, target: Target, start: i64, delete_count: i64, inserted: Vec<Arc<Message>>) -> Result<Spliced, InboxError> {
        for m in &inserted {
            Self::check_user(m)?;
        }
        self.splice_admitted(target, start, delete_count, inserted)
    }

    fn splice_admitted(&self, target: Target, start: i64, delete_count: i64, inserted: Vec<Arc<Message>>) -> Result<Spliced, InboxError> {
        let applied = self.mutate(
            |lists| {
                let (start, removed) = normalize(lists.list(target).len(), start, delete_count);
                Some((target, start, removed))
            },
            inserted,
            true,
            None,
        )?;
        Ok(match applied {
            Some(applied) => {
                self.announce(&applied);
                Spliced { removed: applied.removed, inserted: applied.inserted }
            }
            None => Spliced::default(),
        })
    }

    pub fn append(&self, target: Target, message: Arc<Message>) -> Result<(), InboxError> {
        self.splice(target, i64::MAX, 0, vec![message]).map(|_| ())
    }

    pub fn prepend(&self, target: Target, message: Arc<Message>) -> Result<(), InboxError> {
        self.splice(target, 0, 0, vec![message]).map(|_| ())
    }

    /// Replaces the pending message `id` (wherever it is) by `message`; false if not pending.
    pub fn replace(&self, id: &str, message: Arc<Message>) -> Result<bool, InboxError> {
        self.replace_message(id, message).map(|old| old.is_some())
    }

    /// [`replace`](Self::replace), returning the message it replaced.
    pub fn replace_message(&self, id: &str, message: Arc<Message>) -> Result<Option<Arc<Message>>, InboxError> {
        self.replace_admitted(id, message).map(|r| r.map(|(old, _)| old))
    }

    /// [`replace`](Self::replace), returning the replaced message and its replacement (as the
    /// hook left it). A message that is not pending is not passed to the hook.
    pub fn replace_admitted(&self, id: &str, message: Arc<Message>) -> Result<Option<(Arc<Message>, Arc<Message>)>, InboxError> {
        Self::check_user(&message)?;
        // Looked up first, so the hook is not asked about a replacement that cannot happen;
        // the splice locates it again under the lock (it may have gone meanwhile).
        let Some((target, _)) = lock(&self.shared.lists).locate(id) else { return Ok(None) };
        let inserted = self.admit(target, vec![message])?;
        let applied = self.mutate(
            |lists| {
                let (target, start) = lists.locate(id)?;
                Some((target, start, 1))
            },
            inserted,
            true,
            None,
        )?;
        Ok(applied.and_then(|a| {
            self.announce(&a);
            Some((a.removed.into_iter().next()?, a.inserted.into_iter().next()?))
        }))
    }

    /// Removes the pending message `id`; false if not pending.
    pub fn remove(&self, id: &str) -> Result<bool, InboxError> {
        self.remove_message(id).map(|old| old.is_some())
    }

    /// [`remove`](Self::remove), returning the removed message.
    pub fn remove_message(&self, id: &str) -> Result<Option<Arc<Message>>, InboxError> {
        let applied = self.mutate(
            |lists| {
                let (target, start) = lists.locate(id)?;
                Some((target, start, 1))
            },
            Vec::new(),
            true,
            None,
        )?;
        Ok(applied.and_then(|a| {
            self.announce(&a);
            a.removed.into_iter().next()
        }))
    }

    /// Cancels everything: `next-step` first, then `next-turn`. Returns what was removed, in
    /// that order.
    pub fn clear(&self) -> Result<Vec<Arc<Message>>, InboxError> {
        let mut out = Vec::new();
        for target in [Target::NextStep, Target::NextTurn] {
            let applied = self.mutate(|lists| Some((target, 0, lists.list(target).len())), Vec::new(), true, None)?;
            if let Some(applied) = applied {
                self.announce(&applied);
                out.extend(applied.removed);
            }
        }
        Ok(out)
    }

    /// The loop's step-boundary operation: pure deletion of all of `next-step`, then (at a turn
    /// boundary) the head of `next-turn`; then `claimed` per message, in batch order.
    pub fn claim(&self, target: Target, turn: u64) -> Result<Vec<Arc<Message>>, InboxError> {
        self.claim_as(target, turn, None)
    }

    /// [`claim`](Self::claim) by a loop other than Kerman's (a framework's, at its own step
    /// boundaries): each claiming splice carries `by`, the claimant (a JSON object, such as
    /// `{"run": 2, "n": 0}`), so the claim and the record of what it was claimed for are one
    /// durable append. A crash leaves either both or neither: what was claimed is found again
    /// by its claimant, and what was not is still pending. `by` must be an object
    /// ([`LogError::InvalidEvent`] otherwise, before anything is claimed).
    pub fn claim_by(&self, target: Target, turn: u64, by: Option<&Value>) -> Result<Vec<Arc<Message>>, InboxError> {
        let by = match by {
            None => None,
            Some(by) if by.is_object() => Some(Arc::from(crate::json::compact(by))),
            Some(by) => {
                let detail = format!("a claimant must be a JSON object, got {}", crate::json::compact(by));
                return Err(InboxError::Log(LogError::InvalidEvent(detail)));
            }
        };
        self.claim_as(target, turn, by.as_ref())
    }

    fn claim_as(&self, target: Target, turn: u64, by: Option<&Arc<str>>) -> Result<Vec<Arc<Message>>, InboxError> {
        let step = self.mutate(|lists| Some((Target::NextStep, 0, lists.next_step().len())), Vec::new(), false, by)?;
        let mut batch = step.map_or_else(Vec::new, |step| step.removed);
        if target == Target::NextTurn {
            let head = self.mutate(|lists| Some((Target::NextTurn, 0, lists.next_turn().len().min(1))), Vec::new(), false, by)?;
            if let Some(head) = head {
                batch.extend(head.removed);
            }
        }
        if let Some(listener) = &self.shared.listener {
            for m in &batch {
                listener.claimed(m, turn);
            }
        }
        Ok(batch)
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lists = lock(&self.shared.lists);
        write!(f, "Inbox(next_turn={}, next_step={})", lists.next_turn().len(), lists.next_step().len())
    }
}
