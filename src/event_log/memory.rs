//! `MemoryStore`: sessions that live as long as the process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value};

use super::log::{Backend, FlushCallback, SessionLog};
use super::store::{check_id, new_header, resolve_id, run_open_hook, OpenHook, Store};
use super::{Event, LogError};

struct Entry {
    header: Map<String, Value>,
    /// The events as of the last close; `None` while a log owns the session.
    events: Option<Vec<Event>>,
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

    fn backend(&self, id: &str) -> Box<dyn Backend> {
        Box::new(MemoryBackend { id: id.to_string(), sessions: Arc::clone(&self.sessions) })
    }
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
            sessions.insert(id.clone(), Entry { header: header.clone(), events: None });
        }
        Ok(SessionLog::from_parts(id.clone(), header, Vec::new(), self.backend(&id)))
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

    fn delete(&self, id: &str) -> Result<(), LogError> {
        check_id(id)?;
        let mut sessions = lock(&self.sessions);
        match sessions.get(id) {
            None => Err(LogError::NotFound { id: id.into() }),
            Some(entry) if entry.events.is_none() => Err(LogError::LockedHere { id: id.into() }),
            Some(_) => {
                sessions.remove(id);
                Ok(())
            }
        }
    }
}
