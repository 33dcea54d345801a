//! `Inbox`: the two pending lists of a session, thread-safe.

pub(super) mod projection;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::errors::{inbox_err, report_contained};
use super::event_log::PySessionLog;
use super::exit::attach_unless_exiting;
use super::gc::Held;
use super::message::{user_message_arg, wrap, PyMessage};
use crate::inbox::{Inbox, InboxError, InboxListener, Target};
use crate::message::Message;

/// `"next-turn"` or `"next-step"`; anything else is a `ValueError` naming it.
pub fn target_arg(obj: &Bound<'_, PyAny>) -> PyResult<Target> {
    if let Ok(s) = obj.cast::<PyString>() {
        if let Some(t) = s.to_str().ok().and_then(Target::parse) {
            return Ok(t);
        }
    }
    Err(PyValueError::new_err(format!("target must be \"next-turn\" or \"next-step\", got {}", obj.repr()?)))
}

/// A splice coordinate: a Python `int` (not `bool`, not `float`), saturated to 64 bits.
fn coord_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!("{name} must be an int, got {}", obj.get_type().name()?)));
    }
    match obj.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) if obj.lt(0)? => Ok(i64::MIN),
        Err(_) => Ok(i64::MAX),
    }
}

/// Hashes a message's address (the only thing written) with murmur3's 64-bit finaliser.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_usize(&mut self, i: usize) {
        self.0 ^= i as u64;
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

type ByAddress = HashMap<usize, Py<PyAny>, BuildHasherDefault<AddressHasher>>;

fn address(message: &Arc<Message>) -> usize {
    Arc::as_ptr(message) as usize
}

/// The Python object of each pending message, so `claim`, `get` and the list getters return
/// the objects that were queued instead of fresh wrappers. Keyed by the address of the core
/// message; the entry's object is a (frozen) `Message` wrapping that very message, so it keeps
/// the message alive and an address names one message while cached. A miss just wraps anew. The lock is never held while Python code can run: wrappers are made
/// and released outside it.
#[derive(Default)]
struct Wrappers {
    map: Mutex<ByAddress>,
}

/// The largest batch [`Wrappers::taken`] matches against a whole map by linear search.
const WHOLE_MAP_MAX: usize = 32;

/// Entries past which a `remember` checks for stale ones (messages that left the lists by a
/// path that did not `take` them).
const PRUNE_FLOOR: usize = 64;

impl Wrappers {
    fn lock(&self) -> MutexGuard<'_, ByAddress> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached object of `message`.
    fn lookup<'py>(&self, py: Python<'py>, message: &Arc<Message>) -> Option<Bound<'py, PyAny>> {
        self.lock().get(&address(message)).map(|obj| obj.bind(py).clone())
    }

    /// Records `obj` as the Python object of the pending `message`.
    fn remember(&self, inbox: &Inbox, message: &Arc<Message>, obj: &Bound<'_, PyAny>) {
        drop(self.precache(message, obj));
        self.prune_if_large(inbox);
    }

    /// Caches `obj` for `message` before it is inserted: another thread may claim it as soon
    /// as it is pending (while `on_inserted` runs, say), and must get this object back.
    /// Returns the entry it displaced, for [`restore`](Self::restore) if the insertion fails.
    fn precache(&self, message: &Arc<Message>, obj: &Bound<'_, PyAny>) -> Option<Py<PyAny>> {
        debug_assert!(obj.cast::<PyMessage>().is_ok_and(|o| Arc::ptr_eq(&o.get().inner, message)));
        self.lock().insert(address(message), obj.clone().unbind())
    }

    /// Undoes a [`precache`](Self::precache) whose insertion failed.
    fn restore(&self, message: &Arc<Message>, previous: Option<Py<PyAny>>) {
        let displaced = {
            let mut map = self.lock();
            match previous {
                Some(entry) => map.insert(address(message), entry),
                None => map.remove(&address(message)),
            }
        };
        drop(displaced);
    }

    fn prune_if_large(&self, inbox: &Inbox) {
        let len = self.lock().len();
        if len > PRUNE_FLOOR && len > 2 * inbox.len() {
            self.prune(inbox);
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(map) = self.map.try_lock() else { return Ok(()) };
        for obj in map.values() {
            visit.call(obj)?;
        }
        Ok(())
    }

    /// Forgets every cached object (a miss just wraps anew).
    fn clear(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }

    /// Drops entries whose message is no longer pending.
    fn prune(&self, inbox: &Inbox) {
        let lists = inbox.snapshot();
        let pending: HashSet<usize> = lists.next_turn().iter().chain(lists.next_step()).map(address).collect();
        let mut stale = Vec::new();
        {
            let mut map = self.lock();
            let gone: Vec<usize> = map.keys().filter(|k| !pending.contains(k)).copied().collect();
            for k in gone {
                stale.extend(map.remove(&k));
            }
        }
        drop(stale);
    }

    /// The object of a pending message: the cached one, or a new wrapper that is then cached.
    fn pending<'py>(&self, py: Python<'py>, inbox: &Inbox, message: &Arc<Message>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(obj) = self.lookup(py, message) {
            return Ok(obj);
        }
        let obj = wrap(py, Arc::clone(message))?;
        self.remember(inbox, message, &obj);
        Ok(obj)
    }

    /// Forgets a message that left the lists.
    fn forget(&self, message: &Arc<Message>) {
        let old = self.lock().remove(&address(message));
        drop(old);
    }

    /// The objects of messages that have left the lists (cached ones are forgotten), under
    /// one lock, as a new list. The cached objects go straight into the list's slots: no
    /// intermediate vectors (a claim hands back its whole batch this way).
    fn taken<'py>(&self, py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
        let len = messages.len();
        // SAFETY: `PyList_New` returns a new reference (or null with an exception set) to a
        // list of `len` null slots. No Python code runs until every slot holds an object (a
        // cached one, or `None` until its wrapper is made), so no Python code can see a null
        // slot (through `gc.get_objects()`, say); freeing the list if a wrap fails is safe.
        let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len as ffi::Py_ssize_t))?.cast_into_unchecked::<PyList>() };
        // SAFETY: every caller passes `i < len` and an empty slot (addresses in `messages` are
        // distinct, so each slot is offered one object), and the reference is handed to it.
        let put = |i: usize, obj: Py<PyAny>| unsafe { ffi::PyList_SET_ITEM(list.as_ptr(), i as ffi::Py_ssize_t, obj.into_ptr()) };
        let mut filled = 0;
        {
            let mut map = self.lock();
            if len <= WHOLE_MAP_MAX && map.len() == len {
                // Most likely the batch is everything cached (a claim that empties the inbox):
                // emptying the map in one pass and placing each object by a linear search of
                // the batch costs less than one hash-table removal per message.
                let mut strays = Vec::new();
                for (key, obj) in map.drain() {
                    match messages.iter().position(|m| address(m) == key) {
                        Some(i) => {
                            put(i, obj);
                            filled += 1;
                        }
                        None => strays.push((key, obj)),
                    }
                }
                map.extend(strays);
            } else {
                for (i, m) in messages.iter().enumerate() {
                    if let Some(obj) = map.remove(&address(m)) {
                        put(i, obj);
                        filled += 1;
                    }
                }
            }
        }
        if filled < len {
            // Wrapped outside the lock, and only once no slot is null: making an object can
            // run Python code.
            let mut empty = Vec::with_capacity(len - filled);
            for i in 0..len {
                // SAFETY: `i < len`, the length of `list`; the item is only compared with null.
                if unsafe { ffi::PyList_GET_ITEM(list.as_ptr(), i as ffi::Py_ssize_t) }.is_null() {
                    put(i, py.None());
                    empty.push(i);
                }
            }
            for i in empty {
                list.set_item(i, wrap(py, Arc::clone(&messages[i]))?)?;
            }
        }
        Ok(list)
    }

    fn tuple<'py>(&self, py: Python<'py>, inbox: &Inbox, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, messages.iter().map(|m| self.pending(py, inbox, m)).collect::<PyResult<Vec<_>>>()?)
    }
}

pub fn messages_to_tuple<'py>(py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, messages.iter().map(|m| wrap(py, Arc::clone(m))).collect::<PyResult<Vec<_>>>()?)
}

/// The stored message as Python: the caller's own object when it passed a `UserMessage`.
fn returned<'py>(given: &Bound<'py, PyAny>, stored: &Arc<Message>) -> PyResult<Bound<'py, PyAny>> {
    if given.is_instance_of::<super::message::PyMessage>() {
        return Ok(given.clone());
    }
    wrap(given.py(), Arc::clone(stored))
}

/// Calls the Python notification callbacks; their failures are logged, never raised. The
/// callbacks are [`Held`] so the inbox that owns them can show them to the collector and drop
/// them in `__clear__` (the core keeps this listener as an opaque box).
struct Callbacks {
    on_inserted: Option<Held>,
    on_discarded: Option<Held>,
    on_claimed: Option<Held>,
    /// Private to the AgentLoop: `on_remote(wake)` after messages another process enqueued
    /// (`PostgresStore.enqueue`) were inserted, on the store's reply thread.
    on_remote: Option<Held>,
    /// Private to the AgentLoop: per callback, a list that must be non-empty for the callback
    /// to be called (the loop's live listeners of that event), so an inbox with nobody
    /// listening makes no Python call per message.
    gates: Option<[Held<PyList>; 3]>,
    wrappers: Arc<Wrappers>,
}

impl Callbacks {
    fn held(&self) -> impl Iterator<Item = &Held> {
        [&self.on_inserted, &self.on_discarded, &self.on_claimed, &self.on_remote].into_iter().flatten()
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in self.held() {
            held.visit(visit)?;
        }
        for gate in self.gates.iter().flatten() {
            gate.visit(visit)?;
        }
        Ok(())
    }

    /// Drops every callback and gate (a cleared gate stays closed).
    fn clear(&self) {
        let callbacks: Vec<_> = self.held().filter_map(Held::take).collect();
        let gates: Vec<_> = self.gates.iter().flatten().filter_map(Held::take).collect();
        drop((callbacks, gates));
    }

    fn open(&self, py: Python<'_>, which: usize) -> bool {
        match &self.gates {
            None => true,
            Some(gates) => gates[which].get(py).is_some_and(|gate| !gate.bind(py).is_empty()),
        }
    }

    /// Calls `callback` with the message's object (and `turn`) if it is set and its gate is
    /// open, with one attach for both.
    fn call(&self, which: usize, callback: &Option<Held>, what: &str, message: &Arc<Message>, turn: Option<u64>) {
        let Some(callback) = callback else { return };
        attach_unless_exiting(|py| {
            if !self.open(py, which) {
                return;
            }
            let Some(callback) = callback.get(py) else { return };
            let obj = match self.wrappers.lookup(py, message) {
                Some(obj) => Ok(obj),
                None => wrap(py, Arc::clone(message)),
            };
            let result = obj.and_then(|m| match turn {
                Some(turn) => callback.call1(py, (m, turn)),
                None => callback.call1(py, (m,)),
            });
            if let Err(err) = result {
                report_contained(py, what, err);
            }
        });
    }
}

/// The core holds the listener; the Python inbox holds it too, to visit and clear it.
struct Listener(Arc<Callbacks>);

impl InboxListener for Listener {
    fn inserted(&self, message: &Arc<Message>) {
        self.0.call(0, &self.0.on_inserted, "inbox on_inserted callback", message, None);
    }

    fn discarded(&self, message: &Arc<Message>) {
        self.0.call(1, &self.0.on_discarded, "inbox on_discarded callback", message, None);
    }

    fn claimed(&self, message: &Arc<Message>, turn: u64) {
        self.0.call(2, &self.0.on_claimed, "inbox on_claimed callback", message, Some(turn));
    }

    fn arrived(&self, wake: bool) {
        let Some(callback) = &self.0.on_remote else { return };
        attach_unless_exiting(|py| {
            let Some(callback) = callback.get(py) else { return };
            if let Err(err) = callback.call1(py, (wake,)) {
                report_contained(py, "inbox on_remote callback", err);
            }
        });
    }
}

/// Queued user input: `next_turn` prompts and `next_step` steering/context, a projection of
/// the log's `agent/inbox/spliced` events. Every mutation logs one splice before the lists
/// change. Thread-safe.
#[pyclass(name = "Inbox", module = "kerman", frozen, weakref)]
pub struct PyInbox {
    pub inner: Inbox,
    log: Py<PySessionLog>,
    wrappers: Arc<Wrappers>,
    callbacks: Option<Arc<Callbacks>>,
}

fn callable(obj: Option<Py<PyAny>>, name: &str, py: Python<'_>) -> PyResult<Option<Held>> {
    match obj {
        Some(o) if o.is_none(py) => Ok(None),
        Some(o) if !o.bind(py).is_callable() => {
            Err(PyTypeError::new_err(format!("{name} must be callable, got {}", o.bind(py).get_type().name()?)))
        }
        other => Ok(other.map(Held::new)),
    }
}

impl PyInbox {
    /// Inserts one message with `insert`, its Python object cached first (see
    /// [`Wrappers::precache`]); returns that object.
    fn insert_one<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
        stored: Arc<Message>,
        insert: impl FnOnce(&Inbox, Arc<Message>) -> Result<(), crate::inbox::InboxError>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let obj = returned(message, &stored)?;
        let previous = self.wrappers.precache(&stored, &obj);
        if let Err(e) = insert(&self.inner, Arc::clone(&stored)) {
            self.wrappers.restore(&stored, previous);
            return Err(inbox_err(py, e));
        }
        drop(previous);
        self.wrappers.prune_if_large(&self.inner);
        Ok(obj)
    }
}

impl PyInbox {
    /// The Python objects of a batch the loop claimed (the ones that were inserted, where
    /// cached), as a new list; the cache forgets them.
    pub(crate) fn claimed_objects<'py>(&self, py: Python<'py>, batch: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
        self.wrappers.taken(py, batch)
    }

    /// The objects of messages just inserted by the core (a requeue), cached as theirs.
    pub(crate) fn pending_objects<'py>(&self, py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for message in messages {
            out.append(self.wrappers.pending(py, &self.inner, message)?)?;
        }
        Ok(out)
    }
}

#[pymethods]
impl PyInbox {
    #[new]
    #[pyo3(signature = (log, on_inserted=None, on_discarded=None, on_claimed=None, *, _gates=None, _on_remote=None))]
    fn new(
        py: Python<'_>,
        log: Py<PySessionLog>,
        on_inserted: Option<Py<PyAny>>,
        on_discarded: Option<Py<PyAny>>,
        on_claimed: Option<Py<PyAny>>,
        _gates: Option<(Py<PyList>, Py<PyList>, Py<PyList>)>,
        _on_remote: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let wrappers = Arc::new(Wrappers::default());
        let callbacks = Callbacks {
            on_inserted: callable(on_inserted, "on_inserted", py)?,
            on_discarded: callable(on_discarded, "on_discarded", py)?,
            on_claimed: callable(on_claimed, "on_claimed", py)?,
            on_remote: callable(_on_remote, "_on_remote", py)?,
            gates: _gates.map(|(a, b, c)| [Held::new(a), Held::new(b), Held::new(c)]),
            wrappers: Arc::clone(&wrappers),
        };
        let any = callbacks.held().next().is_some();
        let callbacks = any.then(|| Arc::new(callbacks));
        let listener = || callbacks.as_ref().map(|c| Box::new(Listener(Arc::clone(c))) as Box<dyn InboxListener>);
        let core = log.get().inner.clone();
        let inner = match Inbox::new(core.clone(), listener()) {
            // The open inbox may be garbage the collector has not reached yet (a notebook
            // re-creating its AgentLoop, whose callbacks make a cycle): collect once, retry.
            Err(InboxError::Attached(_)) => {
                py.import("gc")?.call_method0("collect")?;
                Inbox::new(core, listener())
            }
            other => other,
        };
        let inner = inner.map_err(|e| inbox_err(py, e))?;
        Ok(PyInbox { inner, log, wrappers, callbacks })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.log)?;
        if let Some(callbacks) = &self.callbacks {
            callbacks.visit(&visit)?;
        }
        self.wrappers.visit(&visit)
    }

    /// Drops the callbacks and the cached message objects: the collector found the inbox
    /// only reachable from them. The pending messages themselves stay.
    fn __clear__(&self) {
        if let Some(callbacks) = &self.callbacks {
            callbacks.clear();
        }
        self.wrappers.clear();
    }

    /// Stops projecting the log: later mutations raise `InboxError`, and another `Inbox` (or
    /// `AgentLoop`) may be created over the log. Idempotent; the lists stay readable.
    fn close(&self) {
        self.inner.close();
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The session log this inbox projects.
    #[getter]
    fn log(&self, py: Python<'_>) -> Py<PySessionLog> {
        self.log.clone_ref(py)
    }

    /// Pending prompts, oldest first (a tuple of `UserMessage`).
    #[getter]
    fn next_turn<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.wrappers.tuple(py, &self.inner, &self.inner.list(Target::NextTurn))
    }

    /// Pending steering and context for the next step (a tuple of `UserMessage`).
    #[getter]
    fn next_step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.wrappers.tuple(py, &self.inner, &self.inner.list(Target::NextStep))
    }

    /// Whether either list holds anything.
    #[getter]
    fn has_pending(&self) -> bool {
        self.inner.has_pending()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, id: &Bound<'_, PyAny>) -> bool {
        id.extract::<String>().is_ok_and(|id| self.inner.contains(&id))
    }

    /// The pending message with this id, or `None`.
    fn get<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner.get(id).map(|m| self.wrappers.pending(py, &self.inner, &m)).transpose()
    }

    /// Inserts at the end of `target`; returns the stored message.
    fn append<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.insert_one(py, message, stored, |inbox, m| inbox.append(target, m))
    }

    /// Inserts at the start of `target`; returns the stored message.
    fn prepend<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.insert_one(py, message, stored, |inbox, m| inbox.prepend(target, m))
    }

    /// Removes `delete_count` messages at `start` of `target` and inserts `inserted` there,
    /// with Python slice semantics for negative and out-of-range values. Returns the removed.
    #[pyo3(signature = (target, start, delete_count, inserted=None))]
    fn splice<'py>(
        &self,
        py: Python<'py>,
        target: &Bound<'py, PyAny>,
        start: &Bound<'py, PyAny>,
        delete_count: &Bound<'py, PyAny>,
        inserted: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let target = target_arg(target)?;
        let start = coord_arg(start, "start")?;
        let delete_count = coord_arg(delete_count, "delete_count")?;
        let mut messages = Vec::new();
        let mut objects = Vec::new();
        if let Some(inserted) = inserted.filter(|i| !i.is_none()) {
            if inserted.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err("inserted must be a sequence of messages, not a str"));
            }
            for item in inserted.try_iter()? {
                let item = item?;
                messages.push(user_message_arg(&item)?);
                objects.push(item);
            }
        }
        let is_message = |o: &&Bound<'py, PyAny>| o.is_instance_of::<super::message::PyMessage>();
        let given: Vec<_> = messages.iter().zip(&objects).filter(|(_, o)| is_message(o)).collect();
        let previous: Vec<_> = given.iter().map(|(stored, obj)| self.wrappers.precache(stored, obj)).collect();
        let removed = match self.inner.splice(target, start, delete_count, messages.clone()) {
            Ok(removed) => removed,
            Err(e) => {
                // Undone in reverse, so a message given twice gets its first displaced entry back.
                for ((stored, _), prev) in given.iter().zip(previous).rev() {
                    self.wrappers.restore(stored, prev);
                }
                return Err(inbox_err(py, e));
            }
        };
        drop(previous);
        let out = self.wrappers.taken(py, &removed)?;
        // A message both removed and inserted again by this splice keeps its object.
        for (stored, obj) in given.iter().filter(|(stored, _)| removed.iter().any(|r| Arc::ptr_eq(r, stored))) {
            drop(self.wrappers.precache(stored, obj));
        }
        self.wrappers.prune_if_large(&self.inner);
        Ok(out)
    }

    /// Replaces the pending message `message_id` (in whichever list holds it) by
    /// `new_message`, which may keep or change the id. False if `message_id` is not pending.
    fn replace(&self, py: Python<'_>, message_id: &str, new_message: &Bound<'_, PyAny>) -> PyResult<bool> {
        let message = user_message_arg(new_message)?;
        let given = new_message.is_instance_of::<super::message::PyMessage>();
        let previous = given.then(|| self.wrappers.precache(&message, new_message));
        let replaced = match self.inner.replace_message(message_id, Arc::clone(&message)) {
            Ok(Some(replaced)) => replaced,
            outcome => {
                if let Some(previous) = previous {
                    self.wrappers.restore(&message, previous);
                }
                return outcome.map(|_| false).map_err(|e| inbox_err(py, e));
            }
        };
        drop(previous);
        if !Arc::ptr_eq(&replaced, &message) {
            self.wrappers.forget(&replaced);
        }
        self.wrappers.prune_if_large(&self.inner);
        Ok(true)
    }

    /// Removes the pending message `message_id`; false if it is not pending.
    fn remove(&self, py: Python<'_>, message_id: &str) -> PyResult<bool> {
        let removed = self.inner.remove_message(message_id).map_err(|e| inbox_err(py, e))?;
        let Some(removed) = removed else { return Ok(false) };
        self.wrappers.forget(&removed);
        Ok(true)
    }

    /// Cancels everything pending: next-step first, then next-turn; returns them in that order.
    fn clear<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let removed = self.inner.clear().map_err(|e| inbox_err(py, e))?;
        self.wrappers.taken(py, &removed)
    }

    /// The loop's step-boundary operation: removes all of next-step and, when `target` is
    /// `"next-turn"`, the first prompt; returns that batch (next-step items first).
    pub(crate) fn claim<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, turn: u64) -> PyResult<Bound<'py, PyList>> {
        let target = target_arg(target)?;
        let batch = self.inner.claim(target, turn).map_err(|e| inbox_err(py, e))?;
        self.wrappers.taken(py, &batch)
    }

    fn __repr__(&self) -> String {
        let lists = self.inner.snapshot();
        format!("<Inbox next_turn={} next_step={}>", lists.next_turn().len(), lists.next_step().len())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInbox>()?;
    m.add("NEXT_TURN", Target::NextTurn.as_str())?;
    m.add("NEXT_STEP", Target::NextStep.as_str())?;
    Ok(())
}
