//! `MemoryStore`: sessions that live as long as the process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value};

use super::log::{Backend, FlushCallback, SessionLog, WeakSessionLog};
use super::store::{check_id, fork_header, fork_prefix, new_header, resolve_id, run_open_hook, OpenHook, Store, FORKED_FROM};
use super::{Event, LogError};

struct Entry {
    header: Map<String, Value>,
    /// The events as of the last close; `None` while a log owns the session.
    events: Option<Vec<Event>>,
    /// The owning log while there is one (a fork reads its committed events).
    live: Option<WeakSessionLog>,
}

type Sessions = Arc<Mutex<BTreeMap<String, Entry>>>;

/// An ephemeral store. A closed session can be reopened in the same process.
#[derive(Clone, Default)]
pub struct MemoryStore {
    sessions: Sessions,
    on_open: Option<OpenHook>,
}

fn lock(s: &Sessions) -> MutexGuard<'_, BTreeMap<String, Entry>> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

struct MemoryBackend {
    id: String,
    sessions: Sessions,
}

impl Backend for MemoryBackend {
    fn enqueue(&self, _event: &Event) -> Result<(), LogError> {
        Ok(())
    }

    fn flush(&self, done: FlushCallback) {
        done(Ok(()));
    }

    fn close(&self, events: Vec<Event>) -> Result<(), LogError> {
        if let Some(entry) = lock(&self.sessions).get_mut(&self.id) {
            entry.events = Some(events);
            entry.live = None;
        }
        Ok(())
    }

    fn keeps_events(&self) -> bool {
        true
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `hook` on every log `open` hands out from now on (see [`OpenHook`]).
    #[must_use]
    pub fn with_open_hook(mut self, hook: OpenHook) -> Self {
        self.on_open = Some(hook);
        self
    }

    fn set_live(&self, id: &str, log: &SessionLog) {
        if let Some(entry) = lock(&self.sessions).get_mut(id) {
            if entry.events.is_none() {
                entry.live = Some(log.downgrade());
            }
        }
    }

    fn backend(&self, id: &str) -> Box<dyn Backend> {
        Box::new(MemoryBackend { id: id.to_string(), sessions: Arc::clone(&self.sessions) })
    }
}

/// At most the events `0..=at_seq` of `events` (`fork_prefix` then checks the cut).
fn prefix(events: &[Event], at_seq: u64) -> Vec<Event> {
    let end = usize::try_from(at_seq).map_or(events.len(), |at| at.saturating_add(1).min(events.len()));
    events[..end].to_vec()
}

impl Store for MemoryStore {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError> {
        let id = resolve_id(id)?;
        let header = new_header(&id);
        {
            let mut sessions = lock(&self.sessions);
            if sessions.contains_key(&id) {
                return Err(LogError::Exists { id });
            }
            sessions.insert(id.clone(), Entry { header: header.clone(), events: None, live: None });
        }
        let log = SessionLog::from_parts(id.clone(), header, Vec::new(), self.backend(&id));
        self.set_live(&id, &log);
        Ok(log)
    }

    fn open(&self, id: &str) -> Result<SessionLog, LogError> {
        check_id(id)?;
        let (header, events) = {
            let mut sessions = lock(&self.sessions);
            let entry = sessions.get_mut(id).ok_or_else(|| LogError::NotFound { id: id.into() })?;
            let events = entry.events.take().ok_or_else(|| LogError::LockedHere { id: id.into() })?;
            (entry.header.clone(), events)
        };
        let log = SessionLog::from_parts(id.to_string(), header, events, self.backend(id));
        self.set_live(id, &log);
        run_open_hook(self.on_open.as_ref(), &log)?;
        Ok(log)
    }

    fn list(&self) -> Result<Vec<String>, LogError> {
        Ok(lock(&self.sessions).keys().cloned().collect())
    }

    fn exists(&self, id: &str) -> Result<bool, LogError> {
        check_id(id)?;
        Ok(lock(&self.sessions).contains_key(id))
    }

    /// Refuses a session with forks, as the stores that share records must (one contract for
    /// every store, though this one copies).
    fn delete(&self, id: &str) -> Result<(), LogError> {
        check_id(id)?;
        let mut sessions = lock(&self.sessions);
        let forks: Vec<String> = sessions
            .iter()
            .filter(|(_, e)| e.header.get(FORKED_FROM).and_then(|f| f.get("id")).and_then(Value::as_str) == Some(id))
            .map(|(child, _)| child.clone())
            .collect();
        match sessions.get(id) {
            None => Err(LogError::NotFound { id: id.into() }),
            Some(entry) if entry.events.is_none() => Err(LogError::LockedHere { id: id.into() }),
            Some(_) if !forks.is_empty() => Err(LogError::HasForks { id: id.into(), forks }),
            Some(_) => {
                sessions.remove(id);
                Ok(())
            }
        }
    }

    fn fork(&self, id: &str, at_seq: u64, new_id: Option<&str>) -> Result<String, LogError> {
        check_id(id)?;
        let child = resolve_id(new_id)?;
        // The live log is read outside the store's lock (its close takes that lock).
        let (stored, live) = match lock(&self.sessions).get(id) {
            None => return Err(LogError::NotFound { id: id.into() }),
            // Only the inherited prefix is cloned (events share their texts).
            Some(entry) => (entry.events.as_ref().map(|events| prefix(events, at_seq)), entry.live.clone()),
        };
        let events = match (stored, live.and_then(|l| l.upgrade())) {
            (Some(events), _) => events,
            (None, Some(log)) => log.range(0, at_seq.checked_add(1)),
            // Closed between the two looks (its events are stored by now): fork again.
            (None, None) => match lock(&self.sessions).get(id).and_then(|e| e.events.clone()) {
                Some(events) => prefix(&events, at_seq),
                None => return Err(LogError::LockedHere { id: id.into() }),
            },
        };
        let events = fork_prefix(id, &events, at_seq)?;
        let header = fork_header(&child, id, at_seq);
        let mut sessions = lock(&self.sessions);
        if sessions.contains_key(&child) {
            return Err(LogError::Exists { id: child });
        }
        sessions.insert(child.clone(), Entry { header, events: Some(events), live: None });
        Ok(child)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_copies_the_prefix_of_an_open_or_closed_parent_and_leaves_it_alone() {
        let store = MemoryStore::new();
        let log = store.create(Some("p")).unwrap();
        for n in 0..3 {
            log.append("x/n", &serde_json::json!({ "n": n })).unwrap();
        }
        assert_eq!(store.fork("p", 1, Some("open")).unwrap(), "open");
        log.close().unwrap();
        assert_eq!(store.fork("p", 2, Some("closed")).unwrap(), "closed");
        let e = store.fork("p", 3, None).unwrap_err().to_string();
        assert_eq!(e, "cannot fork: at_seq 3 is past the end of session \"p\", which ends at seq 2");
        assert!(matches!(store.fork("p", 0, Some("open")), Err(LogError::Exists { .. })));
        let parent = store.open("p").unwrap();
        for (id, len) in [("open", 2), ("closed", 3)] {
            let child = store.open(id).unwrap();
            assert_eq!(child.range(0, None), parent.range(0, Some(len)));
            assert_eq!(child.header()["forkedFrom"], serde_json::json!({ "id": "p", "seq": len - 1 }));
        }
        assert_eq!(parent.len(), 3);
    }
}
