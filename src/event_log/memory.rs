//! `MemoryStore`: sessions that live as long as the process.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value};

use super::closers;
use super::log::{Backend, FlushCallback, SessionLog};
use super::store::{check_id, new_header, resolve_id, Store};
use super::{Event, LogError};

struct Entry {
    header: Map<String, Value>,
    /// The events as of the last close; `None` while a log owns the session.
    events: Option<Vec<Event>>,
    /// Set by the first append; `list` shows only sessions holding events.
    nonempty: Arc<AtomicBool>,
}

type Sessions = Arc<Mutex<BTreeMap<String, Entry>>>;

/// An ephemeral store. A closed session can be reopened in the same process.
#[derive(Clone, Default)]
pub struct MemoryStore {
    sessions: Sessions,
}

fn lock(s: &Sessions) -> MutexGuard<'_, BTreeMap<String, Entry>> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

struct MemoryBackend {
    id: String,
    sessions: Sessions,
    nonempty: Arc<AtomicBool>,
}

impl Backend for MemoryBackend {
    fn enqueue(&self, _event: &Event) -> Result<(), LogError> {
        if !self.nonempty.load(Ordering::Relaxed) {
            self.nonempty.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn flush(&self, done: FlushCallback) {
        done(Ok(()));
    }

    fn close(&self, events: &[Event]) -> Result<(), LogError> {
        if let Some(entry) = lock(&self.sessions).get_mut(&self.id) {
            entry.events = Some(events.to_vec());
        }
        Ok(())
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn backend(&self, id: &str, nonempty: &Arc<AtomicBool>) -> Box<dyn Backend> {
        Box::new(MemoryBackend { id: id.to_string(), sessions: Arc::clone(&self.sessions), nonempty: Arc::clone(nonempty) })
    }
}

impl Store for MemoryStore {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError> {
        let id = resolve_id(id)?;
        let header = new_header(&id);
        let nonempty = Arc::new(AtomicBool::new(false));
        {
            let mut sessions = lock(&self.sessions);
            if sessions.contains_key(&id) {
                return Err(LogError::Exists { id });
            }
            sessions.insert(id.clone(), Entry { header: header.clone(), events: None, nonempty: Arc::clone(&nonempty) });
        }
        Ok(SessionLog::from_parts(id.clone(), header, Vec::new(), self.backend(&id, &nonempty)))
    }

    fn open(&self, id: &str) -> Result<SessionLog, LogError> {
        check_id(id)?;
        let (header, events, nonempty) = {
            let mut sessions = lock(&self.sessions);
            let entry = sessions.get_mut(id).ok_or_else(|| LogError::NotFound { id: id.into() })?;
            let events = entry.events.take().ok_or_else(|| LogError::Locked { id: id.into() })?;
            (entry.header.clone(), events, Arc::clone(&entry.nonempty))
        };
        let log = SessionLog::from_parts(id.to_string(), header, events, self.backend(id, &nonempty));
        closers::close_open_turn(&log)?;
        Ok(log)
    }

    fn list(&self) -> Result<Vec<String>, LogError> {
        Ok(lock(&self.sessions).iter().filter(|(_, e)| e.nonempty.load(Ordering::Relaxed)).map(|(id, _)| id.clone()).collect())
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
            Some(entry) if entry.events.is_none() => Err(LogError::Locked { id: id.into() }),
            Some(_) => {
                sessions.remove(id);
                Ok(())
            }
        }
    }
}
