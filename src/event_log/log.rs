//! `SessionLog`: the append-only list of events every other part projects from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
#[cfg(not(unix))]
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::event::{is_reserved_type, is_surface_type, Event, Surface};
use super::publish::{PublishLock, PublishToken};
use super::{storable, LogError};
use crate::json;

/// Called once with the outcome of a flush barrier, possibly on another thread.
pub type FlushCallback = Box<dyn FnOnce(Result<(), LogError>) + Send>;

/// A post-commit observer. Runs on the appending thread, in seq order, while the log's publish
/// token is held: it must not append to the same log (that is refused as reentrant).
pub type Observer = Arc<dyn Fn(&Event) + Send + Sync>;

/// A one-shot callback for "the log grew or closed" (used by async tails).
pub type Waiter = Box<dyn FnOnce() + Send>;

/// Where committed events go. Contract:
/// * `enqueue` is called in seq order for every committed event, under the log's state lock; it
///   must not block on I/O. An error refuses the append (nothing is committed).
/// * `flush(done)` calls `done` once everything enqueued before the call is as durable as the
///   backend's mode promises, or with the write error. It may call `done` at once, on the
///   calling thread.
/// * `close(events)` makes everything durable and releases the session (its lock); it is called
///   once, and may block (through [`crate::blocking::wait`]). `events` holds the log's final
///   events only for a backend that [`keeps_events`](Backend::keeps_events) (it is empty
///   otherwise): a dropped log hands its own over rather than copying them.
pub trait Backend: Send + Sync {
    fn enqueue(&self, event: &Event) -> Result<(), LogError>;
    fn flush(&self, done: FlushCallback);
    fn close(&self, events: Vec<Event>) -> Result<(), LogError>;
    /// Whether `close` keeps the events (the memory store, for a reopen).
    fn keeps_events(&self) -> bool {
        false
    }
    /// Whether the agent loop should await a flush barrier before each model request and tool
    /// body (the `checkpoint` and `strict` durability modes).
    fn checkpoints(&self) -> bool {
        false
    }
    /// Registers where input staged by other processes goes (the log's inbox). Only backends
    /// that can receive such input (the PostgreSQL owner) keep it.
    fn attach_intake(&self, _intake: Weak<dyn Intake>) {}
    /// Turns write-through on or off: each append handed to the OS before `enqueue` returns,
    /// so a killed process loses none (file backends). `Ok(false)`: the backend has no such
    /// choice.
    fn set_write_through(&self, _on: bool) -> Result<bool, LogError> {
        Ok(false)
    }
    fn write_through(&self) -> bool {
        false
    }
}

/// Input another process staged for this session's owner, in one ordered stream: a message
/// (`PostgresStore.enqueue`: `op` is [`StagedOp::Insert`]; its id, the message as JSON text,
/// the target list name and whether it should wake the loop), or an operation on the inbox or
/// the loop (`PostgresStore.cancel`, `.replace`, `.remove`, `.requeue`, `.decide`: `id` is the operation's id,
/// `message` its arguments as a JSON object; `target` and `wakeup` are unused).
#[derive(Clone, Debug)]
pub struct StagedInput {
    pub id: String,
    pub message: String,
    pub target: String,
    pub wakeup: bool,
    pub op: StagedOp,
}

/// What a staged row asks the owner to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StagedOp {
    /// Insert the message (`enqueue`).
    #[default]
    Insert,
    /// Cancel the running turn (`{"cause": …, "keep_inbox": bool}`).
    Cancel,
    /// Replace a pending message (`{"message_id": …, "text": …}` or `{"message_id": …, "message": {…}}`).
    Replace,
    /// Remove a pending message (`{"message_id": …}`).
    Remove,
    /// Send again what an ended turn claimed and never read (`{"turn": N}`).
    Requeue,
    /// Decide a pending decision request (`{"decision_id": …, "outcome": {"kind": …}, "by": …,
    /// "key": …}`).
    Decide,
    /// Record the one result of a call in doubt (`{"call_id": …, "text": …, "is_error": bool}`).
    Resolve,
}

impl StagedOp {
    /// The name stored in `kerman_inbox_staged.op`.
    pub fn as_str(self) -> &'static str {
        match self {
            StagedOp::Insert => "insert",
            StagedOp::Cancel => "cancel",
            StagedOp::Replace => "replace",
            StagedOp::Remove => "remove",
            StagedOp::Requeue => "requeue",
            StagedOp::Decide => "decide",
            StagedOp::Resolve => "resolve",
        }
    }

    pub fn parse(name: &str) -> Option<StagedOp> {
        Some(match name {
            "insert" => StagedOp::Insert,
            "cancel" => StagedOp::Cancel,
            "replace" => StagedOp::Replace,
            "remove" => StagedOp::Remove,
            "requeue" => StagedOp::Requeue,
            "decide" => StagedOp::Decide,
            "resolve" => StagedOp::Resolve,
            _ => return None,
        })
    }
}

/// What an [`Intake`] did with staged input.
#[derive(Debug, Default)]
pub struct Taken {
    /// Inserted into the inbox (each through one splice appended to the log).
    pub taken: Vec<String>,
    /// Never to be inserted: the id is already in the log or pending, or the row is invalid.
    pub dropped: Vec<String>,
    /// Operations applied or refused, each with its outcome (a JSON object's text), for the
    /// requester: recorded once the effects they appended have committed.
    pub settled: Vec<(String, String)>,
}

/// Takes staged input into a session's inbox. The inbox registers itself on its log; staged
/// input stays staged while no inbox is attached.
pub trait Intake: Send + Sync {
    fn take(&self, staged: Vec<StagedInput>) -> Taken;
}

struct State {
    events: Vec<Event>,
    last_time: i64,
    closed: bool,
    observers: Arc<Vec<(u64, Observer)>>,
    next_observer: u64,
    /// Registered waits, each with the id [`SessionLog::forget_wait`] takes.
    waiters: Vec<(u64, Waiter)>,
    next_waiter: u64,
    types: TypeNames,
    /// The type of the last commit, an entry of `types`.
    last_kind: Option<Arc<str>>,
    /// Constant type names by address and length, each an entry of `types`.
    statics: Vec<((usize, usize), Arc<str>)>,
    /// Whether an inbox projects this log: a log has at most one (two would each append
    /// splices planned against their own lists, a log no replay accepts).
    inbox: bool,
}

struct Shared {
    id: String,
    header: Map<String, Value>,
    state: Mutex<State>,
    publish: PublishLock,
    backend: Box<dyn Backend>,
}

/// A handle on one session's log. Clones share the same log.
#[derive(Clone)]
pub struct SessionLog {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock epoch milliseconds (0 before the epoch).
#[cfg(unix)]
pub fn now_ms() -> i64 {
    // `clock_gettime` directly: `SystemTime::now().duration_since(..).as_millis()` adds a
    // checked subtraction and 128-bit arithmetic to every append for the same number.
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME is always supported.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts) } != 0 || ts.tv_sec < 0 {
        return 0;
    }
    // `time_t` and `c_long` are 32 bits on some targets.
    #[allow(clippy::unnecessary_cast)]
    let ms = ts.tv_sec as i64 * 1000 + ts.tv_nsec as i64 / 1_000_000;
    ms
}

/// Wall-clock epoch milliseconds (0 before the epoch).
#[cfg(not(unix))]
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A commit in progress: holds the publish token so observers of this commit run before any
/// other append of the log (and an observer's own append is refused).
pub struct Publishing<'a> {
    log: &'a SessionLog,
    _token: PublishToken<'a>,
}

impl Publishing<'_> {
    /// Commits one event, then runs the observers for it and wakes waiters. `data` must be
    /// valid JSON text. `time` overrides the clock (crash closers reuse the last event's time);
    /// it is still clamped to be non-decreasing.
    pub(crate) fn publish(&self, kind: &str, data: Arc<str>, surface: Option<Surface>, time: Option<i64>) -> Result<Event, LogError> {
        let committed = self.commit(kind, data, surface, time, true)?;
        Ok(committed.notify().expect("a kept event"))
    }

    /// [`publish`](Self::publish) for a caller that needs only the seq: the event is moved
    /// into the log, not copied out.
    pub(crate) fn publish_seq(&self, kind: &str, data: Arc<str>, surface: Option<Surface>) -> Result<u64, LogError> {
        let committed = self.commit(kind, data, surface, None, false)?;
        let seq = committed.seq;
        drop(committed.notify());
        Ok(seq)
    }

    /// Commits one event and returns what is left to do once the caller's own locks are
    /// released: the observers and waiters ([`Committed::notify`]).
    ///
    /// The observers and waiters are taken under the same lock as the commit (one lock per
    /// event, not two): those registered once the event is in the log see the next one. The
    /// event is copied out only if `keep` or an observer needs it: a copy is two atomic
    /// reference-count increments and, later, two decrements, ~10 ns each on the VMs measured
    /// here, which on the inbox's paths cost more than everything else the commit does.
    pub(crate) fn commit(
        &self,
        kind: &str,
        data: Arc<str>,
        surface: Option<Surface>,
        time: Option<i64>,
        keep: bool,
    ) -> Result<Committed, LogError> {
        let shared = &self.log.shared;
        let mut st = lock(&shared.state);
        let event = st.next_event(&shared.id, Kind::Any(kind), data, surface, time)?;
        shared.backend.enqueue(&event)?;
        Ok(st.push(event, keep))
    }
}

/// Surface metadata goes with the surface types and only with them.
fn check_surface(kind: &str, surface: Option<&Surface>) -> Result<(), LogError> {
    if is_surface_type(kind) != surface.is_some() {
        return Err(LogError::InvalidEvent(format!("surface metadata does not fit event type \"{kind}\"")));
    }
    Ok(())
}

/// A committed event whose observers and waiters have not run yet.
#[must_use = "the observers and waiters run only in notify()"]
pub(crate) struct Committed {
    pub seq: u64,
    event: Option<Event>,
    observers: Option<Arc<Vec<(u64, Observer)>>>,
    waiters: Vec<(u64, Waiter)>,
}

impl Committed {
    pub(crate) fn has_observers(&self) -> bool {
        self.observers.is_some()
    }

    /// Runs the observers of the event, then the waiters; returns the event if it was kept.
    /// Call it holding no lock: observers may be Python code.
    pub(crate) fn notify(self) -> Option<Event> {
        if let (Some(observers), Some(event)) = (&self.observers, &self.event) {
            for (_, observer) in observers.iter() {
                observer(event);
            }
        }
        for (_, waiter) in self.waiters {
            waiter();
        }
        self.event
    }
}

impl State {
    /// The event the next commit of `kind` adds (not added yet).
    fn next_event(
        &mut self,
        id: &str,
        kind: Kind<'_>,
        data: Arc<str>,
        surface: Option<Surface>,
        time: Option<i64>,
    ) -> Result<Event, LogError> {
        if self.closed {
            return Err(LogError::Closed { id: id.to_owned() });
        }
        let time = time.unwrap_or_else(now_ms).max(self.last_time);
        let kind = match kind {
            Kind::Static(kind) => self.intern_static(kind),
            Kind::Any(kind) => self.intern_kind(kind),
        };
        Ok(Event::new(self.events.len() as u64, time, kind, data, surface))
    }

    /// Adds the next event (its seq is the log's length), taking its observers and waiters
    /// under the same lock; copies it out only if `keep` or an observer needs it.
    fn push(&mut self, event: Event, keep: bool) -> Committed {
        let seq = event.seq;
        self.last_time = self.last_time.max(event.time);
        let observers = (!self.observers.is_empty()).then(|| Arc::clone(&self.observers));
        let copy = (keep || observers.is_some()).then(|| event.clone());
        self.events.push(event);
        Committed { seq, event: copy, observers, waiters: std::mem::take(&mut self.waiters) }
    }

    /// The log's shared copy of `kind`. Runs of one type (every inbox mutation is a splice)
    /// are answered by comparing with the previous commit's type, without hashing.
    fn intern_kind(&mut self, kind: &str) -> Arc<str> {
        if let Some(last) = &self.last_kind {
            if **last == *kind {
                return Arc::clone(last);
            }
        }
        let k = intern(&mut self.types, kind);
        self.last_kind = Some(Arc::clone(&k));
        k
    }

    /// [`intern_kind`](Self::intern_kind) for a type name the program holds as a constant
    /// (the loop's events): found by its address among the ones seen before, without hashing
    /// or comparing text. A constant's address never names other text; two copies of one
    /// name at two addresses are two entries here and one in `types`.
    fn intern_static(&mut self, kind: &'static str) -> Arc<str> {
        let key = (kind.as_ptr() as usize, kind.len());
        if let Some((_, k)) = self.statics.iter().find(|(at, _)| *at == key) {
            return Arc::clone(k);
        }
        let k = intern(&mut self.types, kind);
        self.statics.push((key, Arc::clone(&k)));
        k
    }
}

/// How a commit names its type: a constant of the program, or any text.
#[derive(Clone, Copy)]
enum Kind<'a> {
    Static(&'static str),
    Any(&'a str),
}

/// Event type names of one log, each held once.
pub(crate) type TypeNames = HashMap<Box<str>, Arc<str>, foldhash::fast::RandomState>;

/// The shared copy of `kind` in `types` (added if new).
pub(crate) fn intern(types: &mut TypeNames, kind: &str) -> Arc<str> {
    if let Some(k) = types.get(kind) {
        return Arc::clone(k);
    }
    let k: Arc<str> = Arc::from(kind);
    types.insert(kind.into(), Arc::clone(&k));
    k
}

impl SessionLog {
    /// A log over already-committed `events` (a new session has none), writing to `backend`.
    pub fn from_parts(id: String, header: Map<String, Value>, events: Vec<Event>, backend: Box<dyn Backend>) -> Self {
        let mut types = HashMap::default();
        let events: Vec<Event> = events
            .into_iter()
            .map(|e| {
                let kind = intern(&mut types, e.kind());
                e.with_kind(kind)
            })
            .collect();
        let last_time = events.last().map_or(i64::MIN, |e| e.time);
        SessionLog {
            shared: Arc::new(Shared {
                id,
                header,
                state: Mutex::new(State {
                    events,
                    last_time,
                    closed: false,
                    observers: Arc::new(Vec::new()),
                    next_observer: 0,
                    waiters: Vec::new(),
                    next_waiter: 0,
                    types,
                    last_kind: None,
                    statics: Vec::new(),
                    inbox: false,
                }),
                publish: PublishLock::default(),
                backend,
            }),
        }
    }

    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The session header: `version`, `id`, `createdAt`, and whatever else the store recorded.
    pub fn header(&self) -> &Map<String, Value> {
        &self.shared.header
    }

    /// The number of committed events, which is also the next seq.
    pub fn len(&self) -> u64 {
        lock(&self.shared.state).events.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, seq: u64) -> Option<Event> {
        // A seq beyond `usize` (a 32-bit target) is beyond the log, not an index that wraps.
        let st = lock(&self.shared.state);
        usize::try_from(seq).ok().and_then(|i| st.events.get(i)).cloned()
    }

    /// Committed events with `start <= seq < stop` (stop clamped to the length).
    pub fn range(&self, start: u64, stop: Option<u64>) -> Vec<Event> {
        self.range_where(start, stop, |_| true)
    }

    /// The events of [`range`](Self::range) that `keep` accepts; only those are copied out.
    pub fn range_where(&self, start: u64, stop: Option<u64>, keep: impl Fn(&Event) -> bool) -> Vec<Event> {
        let st = lock(&self.shared.state);
        let len = st.events.len();
        let stop = stop.map_or(len, |stop| usize::try_from(stop).unwrap_or(usize::MAX).min(len));
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        if start >= stop {
            return Vec::new();
        }
        st.events[start..stop].iter().filter(|e| keep(e)).cloned().collect()
    }

    /// Calls `f` with the committed events, under the state lock (keep it short; no appends).
    pub fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&lock(&self.shared.state).events)
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Appends a plugin event. Types owned by the Inbox and the AgentLoop are refused.
    pub fn append(&self, kind: &str, data: &Value) -> Result<Event, LogError> {
        self.append_public(kind, json::compact(data))
    }

    /// [`append`](Self::append) with the payload already as JSON text (the binding's fast path).
    pub(crate) fn append_public(&self, kind: &str, data: String) -> Result<Event, LogError> {
        if kind.is_empty() {
            return Err(LogError::InvalidType(kind.into()));
        }
        if is_reserved_type(kind) {
            return Err(LogError::ReservedType(kind.into()));
        }
        self.append_owned(kind, data, None)
    }

    /// Appends any type, including the reserved ones (for the Inbox, the loop and the closers).
    pub(crate) fn append_owned(&self, kind: &str, data: String, surface: Option<Surface>) -> Result<Event, LogError> {
        // Every store, before the seq is taken (the PostgreSQL one could not commit it).
        storable::check_type(kind)?;
        check_surface(kind, surface.as_ref())?;
        self.publishing()?.publish(kind, Arc::from(data), surface, None)
    }

    /// [`append_owned`](Self::append_owned) for a caller that needs only the seq.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn append_owned_seq(&self, kind: &'static str, data: Arc<str>, surface: Option<Surface>) -> Result<u64, LogError> {
        check_surface(kind, surface.as_ref())?;
        match self.commit_quiet(kind, move || (data, surface)) {
            Ok(committed) => committed,
            Err(event) => {
                let (data, surface) = event();
                self.publishing()?.publish_seq(kind, data, surface)
            }
        }
    }

    /// Commits the event `event` makes, of type `kind`, if it can go without the publish
    /// token; gives `event` back (not called) when it cannot.
    ///
    /// With no observer and no waiter there is nothing to notify, so nothing to order: the
    /// commit needs only the state lock, not the publish token too (two atomic operations
    /// fewer on every loop event). The token must be free, though: whoever holds it (an inbox
    /// mutation, the closers, an observer of this thread) expects no event between its own,
    /// and a holder on this thread must get `Reentrant` from `publishing` as before. A holder
    /// that took the token before this looks is seen (it took it before its own look at the
    /// state, under the same lock); one that takes it after commits after this.
    pub(crate) fn commit_quiet<F>(&self, kind: &'static str, event: F) -> Result<Result<u64, LogError>, F>
    where
        F: FnOnce() -> (Arc<str>, Option<Surface>),
    {
        let shared = &self.shared;
        let mut st = lock(&shared.state);
        if !(st.observers.is_empty() && st.waiters.is_empty() && shared.publish.is_free()) {
            return Err(event);
        }
        let (data, surface) = event();
        let committed = st.next_event(&shared.id, Kind::Static(kind), data, surface, None).and_then(|event| {
            shared.backend.enqueue(&event)?;
            Ok(st.push(event, false).seq)
        });
        Ok(committed)
    }

    /// Takes the publish token for a commit-then-notify sequence.
    pub fn publishing(&self) -> Result<Publishing<'_>, LogError> {
        let token = self.shared.publish.acquire().ok_or(LogError::Reentrant)?;
        Ok(Publishing { log: self, _token: token })
    }

    /// Registers a post-commit observer; returns its id for [`unsubscribe`](Self::unsubscribe).
    pub fn subscribe(&self, observer: Observer) -> u64 {
        let mut st = lock(&self.shared.state);
        let id = st.next_observer;
        st.next_observer += 1;
        let mut observers: Vec<(u64, Observer)> = st.observers.as_ref().clone();
        observers.push((id, observer));
        st.observers = Arc::new(observers);
        id
    }

    /// Removes an observer; false if it was not registered.
    pub fn unsubscribe(&self, id: u64) -> bool {
        let mut st = lock(&self.shared.state);
        let before = st.observers.len();
        let observers: Vec<(u64, Observer)> = st.observers.iter().filter(|(i, _)| *i != id).cloned().collect();
        let removed = observers.len() != before;
        st.observers = Arc::new(observers);
        removed
    }

    /// Calls `waiter` once the log holds more than `len` events or is closed (at once if so,
    /// returning `None`). Otherwise returns the wait's id: a wait nobody awaits any more (a
    /// cancelled `tail()`) is given up with [`forget_wait`](Self::forget_wait), not kept until
    /// the next append.
    pub fn wait_beyond(&self, len: u64, waiter: Waiter) -> Option<u64> {
        let mut st = lock(&self.shared.state);
        if st.closed || st.events.len() as u64 > len {
            drop(st);
            waiter();
            None
        } else {
            let id = st.next_waiter;
            st.next_waiter += 1;
            st.waiters.push((id, waiter));
            Some(id)
        }
    }

    /// Drops the wait `id` without calling it; `false` if it already ran (or was forgotten).
    /// The waiter is dropped after the lock is released (it may hold Python objects).
    pub fn forget_wait(&self, id: u64) -> bool {
        let forgotten = {
            let mut st = lock(&self.shared.state);
            let at = st.waiters.iter().position(|(i, _)| *i == id);
            at.map(|at| st.waiters.remove(at))
        };
        forgotten.is_some()
    }

    /// How many waits are registered (for leak tests).
    pub fn waiting(&self) -> usize {
        lock(&self.shared.state).waiters.len()
    }

    /// The durability barrier: `done` runs once everything appended so far is durable.
    pub fn flush(&self, done: FlushCallback) {
        self.shared.backend.flush(done);
    }

    /// Whether the loop should await [`flush`](Self::flush) at semantic checkpoints.
    pub fn checkpoints(&self) -> bool {
        self.shared.backend.checkpoints()
    }

    /// See [`Backend::set_write_through`].
    pub fn set_write_through(&self, on: bool) -> Result<bool, LogError> {
        self.shared.backend.set_write_through(on)
    }

    pub fn write_through(&self) -> bool {
        self.shared.backend.write_through()
    }

    /// Appends a loop-owned event (any type, surface metadata as the type requires), bypassing
    /// the loop: only for the crate's own tests and benchmarks (feature `test-support`).
    #[cfg(feature = "test-support")]
    pub fn append_loop_event(&self, kind: &str, data: &Value, surface: Option<Surface>) -> Result<Event, LogError> {
        self.append_owned(kind, json::compact(data), surface)
    }

    /// Blocks until everything appended so far is durable.
    pub fn flush_blocking(&self) -> Result<(), LogError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.flush(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        crate::blocking::wait(|| rx.recv().unwrap_or(Ok(())))
    }

    /// Marks the log as projected by an inbox; `false` (nothing changed) if one already is.
    pub(crate) fn claim_inbox(&self) -> bool {
        let mut st = lock(&self.shared.state);
        !std::mem::replace(&mut st.inbox, true)
    }

    /// The log's inbox was closed or dropped: another may be created.
    pub(crate) fn release_inbox(&self) {
        lock(&self.shared.state).inbox = false;
    }

    /// Sends input staged by other processes to `intake` (see [`Backend::attach_intake`]).
    pub fn attach_intake(&self, intake: Weak<dyn Intake>) {
        self.shared.backend.attach_intake(intake);
    }

    /// A handle that does not keep the log alive.
    pub fn downgrade(&self) -> WeakSessionLog {
        WeakSessionLog(Arc::downgrade(&self.shared))
    }

    /// Adds events another writer committed (a read-only follower's catch-up read), in seq
    /// order, running observers and waking waiters as an append does. Events already held are
    /// skipped and a gap stops it (the caller reads again); returns how many were added.
    pub fn adopt(&self, events: Vec<Event>) -> Result<usize, LogError> {
        let _publishing = self.publishing()?;
        let mut added = 0;
        for event in events {
            let committed = {
                let mut st = lock(&self.shared.state);
                let len = st.events.len() as u64;
                if st.closed || event.seq > len {
                    break;
                }
                if event.seq < len {
                    continue;
                }
                let kind = st.intern_kind(event.kind());
                st.push(event.with_kind(kind), false)
            };
            drop(committed.notify());
            added += 1;
        }
        Ok(added)
    }

    /// Closes the log: flushes, releases the session, wakes waiters. Idempotent.
    pub fn close(&self) -> Result<(), LogError> {
        let (events, waiters) = {
            let mut st = lock(&self.shared.state);
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            // The log stays readable after close: the backend gets a copy.
            let events = if self.shared.backend.keeps_events() { st.events.clone() } else { Vec::new() };
            (events, std::mem::take(&mut st.waiters))
        };
        let result = self.shared.backend.close(events);
        for (_, waiter) in waiters {
            waiter();
        }
        result
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !st.closed {
            st.closed = true;
            let events = if self.backend.keeps_events() { std::mem::take(&mut st.events) } else { Vec::new() };
            let _ = self.backend.close(events);
        }
    }
}

/// A [`SessionLog`] handle that does not keep it alive (for callbacks the log itself owns).
#[derive(Clone)]
pub struct WeakSessionLog(Weak<Shared>);

impl WeakSessionLog {
    pub fn upgrade(&self) -> Option<SessionLog> {
        self.0.upgrade().map(|shared| SessionLog { shared })
    }
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionLog({:?}, len={})", self.shared.id, self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_log::{MemoryStore, Store};

    fn log() -> SessionLog {
        MemoryStore::new().create(None).unwrap()
    }

    #[test]
    fn a_quiet_append_is_refused_while_this_thread_holds_the_token() {
        let log = log();
        let publishing = log.publishing().unwrap();
        assert!(matches!(log.append_owned_seq("turn/start", "{}".into(), None), Err(LogError::Reentrant)));
        drop(publishing);
        assert_eq!(log.append_owned_seq("turn/start", "{}".into(), None).unwrap(), 0);
    }

    #[test]
    fn a_quiet_append_waits_for_a_holder_on_another_thread() {
        let log = log();
        let publishing = log.publishing().unwrap();
        let other = log.clone();
        let appender = std::thread::spawn(move || other.append_owned_seq("step/start", "{}".into(), None).unwrap());
        // The appender must block on the held token, not commit past it.
        while log.shared.publish.waiting() == 0 {
            assert!(!appender.is_finished(), "an append went past a held publish token");
            std::thread::yield_now();
        }
        assert_eq!(publishing.publish_seq("turn/start", Arc::from("{}"), None).unwrap(), 0);
        drop(publishing);
        assert_eq!(appender.join().unwrap(), 1);
        let kinds: Vec<String> = log.range(0, None).iter().map(|e| e.kind().to_owned()).collect();
        assert_eq!(kinds, ["turn/start", "step/start"]);
    }

    #[test]
    fn constant_type_names_are_interned_once_with_the_others() {
        let log = log();
        log.append_owned_seq("turn/start", "{}".into(), None).unwrap();
        log.append_owned("turn/start", "{}".into(), None).unwrap();
        log.append_owned_seq("turn/start", "{}".into(), None).unwrap();
        let events = log.range(0, None);
        assert!(events.windows(2).all(|w| std::ptr::eq(w[0].kind(), w[1].kind())), "one shared copy of the name");
    }
}
