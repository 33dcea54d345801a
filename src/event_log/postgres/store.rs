//! `PostgresStore`: the `Store` contract over [`PgCore`] and [`PgBackend`].

use super::backend::PgBackend;
use super::follow::Follower;
use super::{PgCore, PgOptions, Request, Response};
use crate::event_log::{check_id, close_open_turn, LogError, SessionLog, StagedInput, Store};

/// Sessions in one PostgreSQL database. Each store is one lease owner with one connection.
#[derive(Clone)]
pub struct PostgresStore {
    core: PgCore,
}

impl PostgresStore {
    pub fn connect(dsn: &str, options: PgOptions) -> Result<Self, LogError> {
        Ok(PostgresStore { core: PgCore::connect(dsn, options)? })
    }

    pub fn core(&self) -> &PgCore {
        &self.core
    }

    /// A read-only follower of session `id`: every committed event now, then each commit of
    /// its writer (in any process) as NOTIFY-driven catch-up reads bring it. Takes no lease;
    /// appends fail with `LogError::ReadOnly`; `close` stops following.
    pub fn follow(&self, id: &str) -> Result<SessionLog, LogError> {
        let (header, incarnation, events) = self.core.read_session(id)?;
        Ok(Follower::open(&self.core, id, incarnation, header, events))
    }

    /// Stages a user message for session `id`'s owner (see [`PgCore::enqueue`]).
    pub fn enqueue(&self, id: &str, staged: StagedInput) -> Result<bool, LogError> {
        self.core.enqueue(id, staged)
    }
}

fn unexpected<T>(response: Response) -> Result<T, LogError> {
    Err(super::worker::unexpected(response))
}

impl Store for PostgresStore {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError> {
        let (lease, header) = self.core.create(id)?;
        let id = lease.session_id.clone();
        let backend = PgBackend::new(self.core.clone(), lease, 0);
        Ok(SessionLog::from_parts(id, header, Vec::new(), Box::new(backend)))
    }

    fn open(&self, id: &str) -> Result<SessionLog, LogError> {
        let opened = self.core.open(id)?;
        let backend = PgBackend::new(self.core.clone(), opened.lease, opened.events.len() as u64);
        let log = SessionLog::from_parts(id.to_string(), opened.header, opened.events, Box::new(backend));
        close_open_turn(&log)?;
        Ok(log)
    }

    fn list(&self) -> Result<Vec<String>, LogError> {
        match self.core.call(Request::List)? {
            Response::Ids(ids) => Ok(ids),
            other => unexpected(other),
        }
    }

    fn exists(&self, id: &str) -> Result<bool, LogError> {
        check_id(id)?;
        match self.core.call(Request::Exists { id: id.into() })? {
            Response::Bool(b) => Ok(b),
            other => unexpected(other),
        }
    }

    fn delete(&self, id: &str) -> Result<(), LogError> {
        check_id(id)?;
        match self.core.call(Request::Delete { id: id.into() })? {
            Response::Done => Ok(()),
            other => unexpected(other),
        }
    }
}
