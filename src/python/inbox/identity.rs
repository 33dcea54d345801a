//! The wrapper cache: the Python object of each pending message, so the `Inbox` hands back
//! the objects that were queued instead of fresh wrappers.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::super::message::{wrap, PyMessage};
use crate::inbox::Inbox;
use crate::message::Message;

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
pub(super) struct Wrappers {
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
    pub(super) fn lookup<'py>(&self, py: Python<'py>, message: &Arc<Message>) -> Option<Bound<'py, PyAny>> {
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
    pub(super) fn precache(&self, message: &Arc<Message>, obj: &Bound<'_, PyAny>) -> Option<Py<PyAny>> {
        debug_assert!(obj.cast::<PyMessage>().is_ok_and(|o| Arc::ptr_eq(&o.get().inner, message)));
        self.lock().insert(address(message), obj.clone().unbind())
    }

    /// Undoes a [`precache`](Self::precache) whose insertion failed.
    pub(super) fn restore(&self, message: &Arc<Message>, previous: Option<Py<PyAny>>) {
        let displaced = {
            let mut map = self.lock();
            match previous {
                Some(entry) => map.insert(address(message), entry),
                None => map.remove(&address(message)),
            }
        };
        drop(displaced);
    }

    pub(super) fn prune_if_large(&self, inbox: &Inbox) {
        let len = self.lock().len();
        if len > PRUNE_FLOOR && len > 2 * inbox.len() {
            self.prune(inbox);
        }
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(map) = self.map.try_lock() else { return Ok(()) };
        for obj in map.values() {
            visit.call(obj)?;
        }
        Ok(())
    }

    /// Forgets every cached object (a miss just wraps anew).
    pub(super) fn clear(&self) {
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
    pub(super) fn pending<'py>(&self, py: Python<'py>, inbox: &Inbox, message: &Arc<Message>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(obj) = self.lookup(py, message) {
            return Ok(obj);
        }
        let obj = wrap(py, Arc::clone(message))?;
        self.remember(inbox, message, &obj);
        Ok(obj)
    }

    /// Forgets a message that left the lists.
    pub(super) fn forget(&self, message: &Arc<Message>) {
        let old = self.lock().remove(&address(message));
        drop(old);
    }

    /// The objects of messages that have left the lists (cached ones are forgotten), under
    /// one lock, as a new list. The cached objects go straight into the list's slots: no
    /// intermediate vectors (a claim hands back its whole batch this way).
    pub(super) fn taken<'py>(&self, py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
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

    pub(super) fn tuple<'py>(&self, py: Python<'py>, inbox: &Inbox, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, messages.iter().map(|m| self.pending(py, inbox, m)).collect::<PyResult<Vec<_>>>()?)
    }
}
