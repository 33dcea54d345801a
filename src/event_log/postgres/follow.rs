//! A read-only follower of a session in another process (`PostgresStore::follow`): takes no
//! lease, refuses appends, and grows from catch-up reads (`seq > known`) that NOTIFYs on the
//! session's append channel trigger. Payloads are only hints: every notification, and every
//! (re-)LISTEN, which covers notifications lost while the LISTEN connection was down, leads to
//! a read of whatever is newer than what the log holds, so events arrive in order, without a
//! gap or a duplicate, whether or not a notification was missed. Every read names the
//! session's incarnation: once the session is deleted (or deleted and created again under its
//! id) the follower ends, closing its log, instead of splicing another session onto it.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::listen::{self, Channel, Note};
use super::{parse_records_from, OneInFlight, PgCore, Request, Response};
use crate::event_log::{Backend, Event, FlushCallback, LogError, SessionLog, WeakSessionLog};

#[derive(Default)]
struct State {
    /// The catch-up reads.
    reads: OneInFlight,
    closed: bool,
}

struct Shared {
    core: PgCore,
    id: String,
    /// Which session of that id is followed (`kerman_sessions.incarnation`).
    incarnation: i64,
    subscription: u64,
    /// Set once the log exists (the backend is built first).
    log: OnceLock<WeakSessionLog>,
    state: Mutex<State>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads what is newer than the log holds, unless a read is in flight (then one follows it).
fn catch_up(shared: &Arc<Shared>) {
    let Some(log) = shared.log.get().and_then(WeakSessionLog::upgrade) else { return };
    {
        let mut st = lock(shared);
        if st.closed {
            return;
        }
        if !st.reads.start() {
            return;
        }
    }
    let after = log.len() as i64 - 1;
    drop(log);
    let next = Arc::clone(shared);
    let request = Request::ReadAfter { id: shared.id.clone(), after, incarnation: shared.incarnation };
    shared.core.submit(request, Box::new(move |result| read(&next, after, result)));
}

/// On the reply thread: adds the new events (observers and tails run here), then reads again
/// if a notification came meanwhile.
fn read(shared: &Arc<Shared>, after: i64, result: Result<Response, LogError>) {
    // A failed read is not reported: the next notification or re-LISTEN reads again.
    match result {
        Ok(Response::Records(records)) => {
            let log = shared.log.get().and_then(WeakSessionLog::upgrade);
            if let (Some(log), Ok(events)) = (log, parse_records_from(&shared.id, &records, u64::try_from(after + 1).unwrap_or(0))) {
                let _ = log.adopt(events);
            }
        }
        Ok(Response::Replaced) => {
            // Ends the tails; `close` finds the publish token free (this thread holds none).
            if let Some(log) = shared.log.get().and_then(WeakSessionLog::upgrade) {
                let _ = log.close();
            }
            return;
        }
        _ => {}
    }
    let again = lock(shared).reads.finish();
    if again {
        catch_up(shared);
    }
}

/// The backend of a follower's `SessionLog`.
pub struct Follower {
    shared: Arc<Shared>,
}

impl Follower {
    /// Reads the session and starts following it: the log holds every committed event, and
    /// grows as the writer commits.
    pub fn open(
        core: &PgCore,
        id: &str,
        incarnation: i64,
        header: serde_json::Map<String, serde_json::Value>,
        events: Vec<Event>,
    ) -> SessionLog {
        let shared = Arc::new(Shared {
            core: core.clone(),
            id: id.to_string(),
            incarnation,
            subscription: listen::next_id(),
            log: OnceLock::new(),
            state: Mutex::new(State::default()),
        });
        let log = SessionLog::from_parts(id.to_string(), header, events, Box::new(Follower { shared: Arc::clone(&shared) }));
        let _ = shared.log.set(log.downgrade());
        let weak = Arc::downgrade(&shared);
        let subscriber: listen::Subscriber = Arc::new(move |_note: Note| {
            if let Some(shared) = weak.upgrade() {
                catch_up(&shared);
            }
        });
        let channel = listen::channel_name(Channel::Appends, id);
        // The LISTEN is confirmed with `Note::Listening`, which reads again: anything
        // committed between the caller's read and the LISTEN is picked up then.
        core.submit(Request::Listen { id: shared.subscription, channel, subscriber }, Box::new(|_| ()));
        log
    }
}

impl Backend for Follower {
    fn enqueue(&self, _event: &Event) -> Result<(), LogError> {
        Err(LogError::ReadOnly { id: self.shared.id.clone() })
    }

    /// Nothing is ever written here, so everything "appended" is as durable as it gets.
    fn flush(&self, done: FlushCallback) {
        done(Ok(()));
    }

    /// Stops following; the session itself is untouched (there is no lease to release).
    fn close(&self, _events: Vec<Event>) -> Result<(), LogError> {
        lock(&self.shared).closed = true;
        // Waits out a catch-up being published on the reply thread (its observers and tail
        // wake-ups call into Python): after `close` returns this follower calls nothing more,
        // so the process may exit at once. A thread already holding the token (an observer
        // closing its own log) has nothing to wait for. Not reached from the log's drop: the
        // weak handle no longer upgrades by then.
        if let Some(log) = self.shared.log.get().and_then(WeakSessionLog::upgrade) {
            drop(log.publishing());
        }
        self.shared.core.submit(Request::Unlisten { id: self.shared.subscription }, Box::new(|_| ()));
        Ok(())
    }
}
