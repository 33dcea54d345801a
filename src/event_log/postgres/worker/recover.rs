//! Settling a request whose connection dropped under it: its effect may or may not have been
//! committed, so it is never simply repeated when repeating could apply it twice.

use super::super::sql;
use super::super::{Lease, Row};
use super::{stopped, Conn, Request, Response, Worker};
use crate::event_log::LogError;

impl Worker {
    /// A retry after the connection dropped during an earlier try, whose effect may or may
    /// not have been committed.
    pub(super) async fn after_loss(&mut self, request: &Request, resent: &mut bool) -> Result<Response, LogError> {
        match request {
            Request::Append { lease, rows } => self.settle_append(lease, rows, &[], resent).await,
            Request::AppendStaged { lease, rows, claims } => self.settle_append(lease, rows, claims, resent).await,
            // The earlier try may have staged it: the retry then finds the id taken. Message ids
            // are minted per message, so after a lost reply that is our own earlier try.
            Request::Enqueue { .. } => match self.attempt(request).await {
                Ok(Response::Bool(false)) => Ok(Response::Bool(true)),
                other => other,
            },
            // An earlier try may have taken the lease (open) or inserted the row (create): the
            // retry then finds it held by this very owner under an epoch no log of ours has.
            Request::Open { id } => match self.attempt(request).await {
                Err(LogError::Locked { .. }) => match self.adopt(id, None).await? {
                    Some((lease, header)) => {
                        let Some(conn) = self.conn.as_mut() else { return Err(stopped()) };
                        let records = sql::read(&mut conn.client, id).await?;
                        Ok(Response::Opened(lease, header, records))
                    }
                    None => Err(LogError::Locked { id: id.clone() }),
                },
                other => other,
            },
            Request::Create { id, header } => match self.attempt(request).await {
                Err(LogError::Exists { .. }) => match self.adopt(id, Some(header)).await? {
                    Some((lease, _)) => Ok(Response::Lease(lease)),
                    None => Err(LogError::Exists { id: id.clone() }),
                },
                other => other,
            },
            // An earlier try may have committed: the child then exists with our very header.
            Request::Fork { id, header, .. } => match self.attempt(request).await {
                Err(LogError::Exists { .. }) => {
                    let Some(conn) = self.conn.as_mut() else { return Err(stopped()) };
                    match sql::lease_of(&mut conn.client, id).await? {
                        Some((None, 0, stored)) if stored == *header => Ok(Response::Done),
                        _ => Err(LogError::Exists { id: id.clone() }),
                    }
                }
                other => other,
            },
            Request::Take { limit, name, expiry, ids } => self.settle_take(*limit, name, *expiry, ids.as_deref()).await,
            // The earlier try deleted it.
            Request::Delete { .. } => match self.attempt(request).await {
                Err(LogError::NotFound { .. }) => Ok(Response::Done),
                other => other,
            },
            // Reads, and writes that are idempotent (release, unstage).
            _ => self.attempt(request).await,
        }
    }

    /// Takes over a lease an interrupted open/create of ours acquired: held by this owner,
    /// under an epoch none of our logs holds (and, for create, at epoch 1 with our header).
    async fn adopt(&mut self, id: &str, header: Option<&String>) -> Result<Option<(Lease, String)>, LogError> {
        if super::lock(&self.shared.held).contains(id) {
            return Ok(None);
        }
        let Some(conn) = self.conn.as_mut() else { return Err(stopped()) };
        let Some((owner, epoch, stored)) = sql::lease_of(&mut conn.client, id).await? else { return Ok(None) };
        let ours = owner.as_deref() == Some(self.owner.as_str()) && header.is_none_or(|h| epoch == 1 && *h == stored);
        if !ours {
            return Ok(None);
        }
        // Extended by the interrupted request, at a time not known: renewed next round.
        super::lock(&self.shared.held).adopt(id, epoch);
        Ok(Some((Lease { session_id: id.to_string(), owner: self.owner.clone(), epoch }, stored)))
    }

    /// A take whose reply never came: it may have committed, and then the sessions it took are
    /// held by this store (renewed by nobody, known to no caller) until their leases lapse.
    /// They are adopted first (ours under this worker's name, not among the leases we hold),
    /// then the take runs for the rest of `limit`. The leases become ours (renewed) only as the
    /// answer is returned: if this try is cut off too, the next one adopts them all again.
    async fn settle_take(&mut self, limit: i64, name: &str, expiry: bool, ids: Option<&[String]>) -> Result<Response, LogError> {
        // The pool's other connections run no take meanwhile: a worker has one in flight.
        let held = super::lock(&self.shared.held).ids();
        let sent = tokio::time::Instant::now();
        let Some(Conn { client: c, prepared, .. }) = self.conn.as_mut() else { return Err(stopped()) };
        let mut taken = sql::adopt_taken(c, &self.owner, name, &held, self.ttl_ms).await?;
        let rest = limit - taken.len() as i64;
        if rest > 0 {
            taken.extend(sql::take(c, prepared, rest, &self.owner, name, self.ttl_ms, ids).await?);
        }
        let expiry = match expiry {
            true => sql::next_expiry(c, &self.owner).await?,
            false => None,
        };
        {
            let mut held = super::lock(&self.shared.held);
            for (lease, _, _) in &taken {
                held.hold(&lease.session_id, lease.epoch, sent);
            }
        }
        Ok(Response::Taken(taken, expiry))
    }

    /// An append whose reply never came: it committed or it did not. The session's `last_seq`
    /// says which; never append blindly, or the batch could land twice.
    async fn settle_append(&mut self, lease: &Lease, rows: &[Row], claims: &[String], resent: &mut bool) -> Result<Response, LogError> {
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Ok(Response::Done) };
        let id = lease.session_id.as_str();
        let Some(Conn { client: c, .. }) = self.conn.as_mut() else { return Err(stopped()) };
        let (epoch, last_seq) = sql::session_state(c, id).await?.ok_or_else(|| LogError::NotFound { id: id.into() })?;
        let unknown = |what: String| unknown_outcome(id, rows, &what);
        if last_seq >= last.seq {
            // It landed, unless somebody else's rows did: compare what is stored with what was sent.
            let stored = sql::read_seqs(c, id, first.seq, last.seq).await?;
            let same =
                stored.len() == rows.len() && stored.iter().zip(rows).all(|((seq, record), row)| *seq == row.seq && *record == row.record);
            return match same {
                true => Ok(Response::Done),
                false => Err(unknown("the stored records for those seqs differ from the ones sent".into())),
            };
        }
        if last_seq != first.seq - 1 {
            return Err(unknown(format!("the stored last seq is {last_seq}")));
        }
        if epoch != lease.epoch {
            super::lock(&self.shared.held).remove(id);
            return Err(LogError::LeaseLost { id: id.into(), epoch: lease.epoch, current: epoch });
        }
        if *resent {
            return Err(unknown("it did not land after being sent twice".into()));
        }
        // It did not land: send it once more, under the same epoch and seq conditions.
        *resent = true;
        let Some(Conn { client: c, prepared, .. }) = self.conn.as_mut() else { return Err(stopped()) };
        let result = sql::append(c, prepared, lease, rows, self.ttl_ms, claims).await;
        if let Err(LogError::LeaseLost { .. }) = result {
            super::lock(&self.shared.held).remove(id);
        }
        result.map(|()| Response::Done)
    }
}

/// An append that may or may not have landed: the flush fails saying so, naming its seqs.
pub(super) fn unknown_outcome(session: &str, rows: &[Row], why: &str) -> LogError {
    let seqs = match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => format!("seqs {}..={}", first.seq, last.seq),
        _ => "nothing".into(),
    };
    LogError::Write { detail: format!("session \"{session}\": the outcome of appending {seqs} is unknown: {why}") }
}
