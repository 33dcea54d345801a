//! The store's statements. Each function is one unit of work on the runtime thread; those that
//! write more than one row do it in one transaction.
//!
//! Every statement here is sent unnamed with its parameter types (`query_typed`: parse, bind
//! and execute in one round trip, nothing left on the server connection), except the hot ones
//! of [`Prepared`], which are named prepared statements unless the store was made with
//! `prepared_statements=false` (for PgBouncer's transaction pooling, where a named statement
//! parsed on one server connection is missing on the next).

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Statement};

use super::{db_err, Lease};
use crate::event_log::LogError;
use crate::event_log::{StagedInput, StagedOp};

/// One event as stored: the envelope fields that are columns, and the whole record as text.
pub struct Row {
    pub seq: i64,
    pub time: i64,
    pub kind: String,
    pub record: String,
}

/// Creates a session owned by `owner` at epoch 1. An existing id is `Exists`.
pub async fn create(c: &mut Client, id: &str, header: &str, owner: &str, ttl_ms: f64) -> Result<Lease, LogError> {
    let row = c
        .query_typed_opt(
            "INSERT INTO kerman_sessions (id, header, owner, epoch, expires_at, owned_since)
             VALUES ($1, $2, $3, 1, now() + $4::float8 * interval '1 millisecond', now())
             ON CONFLICT (id) DO NOTHING RETURNING epoch",
            &[(&id, Type::TEXT), (&header, Type::TEXT), (&owner, Type::TEXT), (&ttl_ms, Type::FLOAT8)],
        )
        .await
        .map_err(db_err("create session"))?;
    match row {
        Some(row) => Ok(Lease { session_id: id.into(), owner: owner.into(), epoch: row.get(0) }),
        None => Err(LogError::Exists { id: id.into() }),
    }
}

/// Takes the lease of a session nobody holds (or whose holder let it expire) and bumps the
/// epoch: the new epoch is the fencing token, so every append of an older holder is refused
/// from now on. Returns the lease and the header text.
pub async fn acquire(c: &mut Client, id: &str, owner: &str, ttl_ms: f64) -> Result<(Lease, String), LogError> {
    let row = c
        .query_typed_opt(
            "UPDATE kerman_sessions
             SET owner = $2, epoch = epoch + 1, expires_at = now() + $3::float8 * interval '1 millisecond',
                 owned_since = now(), owner_name = NULL
             WHERE id = $1 AND (owner IS NULL OR expires_at < now())
             RETURNING epoch, header",
            &[(&id, Type::TEXT), (&owner, Type::TEXT), (&ttl_ms, Type::FLOAT8)],
        )
        .await
        .map_err(db_err("acquire lease"))?;
    if let Some(row) = row {
        let lease = Lease { session_id: id.into(), owner: owner.into(), epoch: row.get(0) };
        return Ok((lease, row.get(1)));
    }
    match exists(c, id).await? {
        true => Err(LogError::Locked { id: id.into() }),
        false => Err(LogError::NotFound { id: id.into() }),
    }
}

/// The append statement: one round trip, one implicit transaction. The session row is updated
/// only if `lease` is still the current epoch, `last_seq` is the seq just before the batch and
/// every staged message the batch claims ($10) is still staged (the row lock it takes makes a
/// concurrent `acquire` wait for this commit, or makes this update re-check the epoch `acquire`
/// committed); the events are inserted and the claimed rows deleted only from the row that
/// update returned, so a refused append writes nothing. Renews the lease on success, and
/// notifies the session's append channel with the new last seq (delivered at commit, so a
/// follower never hears of rows it cannot read yet).
const APPEND: &str = "WITH s AS (
        UPDATE kerman_sessions SET last_seq = $8, expires_at = now() + $9::float8 * interval '1 millisecond'
        WHERE id = $1 AND epoch = $6 AND last_seq = $7
          AND (SELECT count(*) FROM kerman_inbox_staged
               WHERE session_id = $1 AND message_id = ANY($10::text[])) = cardinality($10::text[])
        RETURNING id, pg_notify('kerman_a_' || md5(id), last_seq::text)
    ), claimed AS (
        DELETE FROM kerman_inbox_staged
        WHERE session_id IN (SELECT id FROM s) AND message_id = ANY($10::text[])
        RETURNING 1
    ), ins AS (
        INSERT INTO kerman_events (session_id, seq, time, type, record)
        SELECT s.id, u.* FROM s, unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[]) AS u
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM claimed)";

/// The hot statements, prepared once per connection (named: the server keeps the parse and
/// the plan) or, with `named` false, sent unnamed each time (one round trip either way).
pub struct Prepared {
    append: Stmt,
    /// A worker's takes (a sweep's, and of the sessions a notification named): every worker
    /// runs one on each `kerman_takeable` notification.
    take: Stmt,
    take_ids: Stmt,
    /// An owner's read of staged input (on every notification) and the three statements of
    /// `enqueue`: a web handler's store runs them all the time.
    staged: Stmt,
    enqueue_lock: Stmt,
    enqueue_check: Stmt,
    enqueue_insert: Stmt,
}

const TEXT_ARRAY: Type = Type::TEXT_ARRAY;
const INT8_ARRAY: Type = Type::INT8_ARRAY;

impl Prepared {
    pub async fn new(c: &Client, named: bool) -> Result<Prepared, LogError> {
        use Type as T;
        let append_types = [T::TEXT, INT8_ARRAY, INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, T::INT8, T::INT8, T::INT8, T::FLOAT8, TEXT_ARRAY];
        Ok(Prepared {
            append: Stmt::new(c, named, APPEND, &append_types, "prepare append").await?,
            take: Stmt::new(c, named, TAKE, &[T::INT8, T::TEXT, T::TEXT, T::FLOAT8], "prepare take").await?,
            take_ids: Stmt::new(c, named, TAKE_IDS, &[T::INT8, T::TEXT, T::TEXT, T::FLOAT8, TEXT_ARRAY], "prepare take").await?,
            staged: Stmt::new(c, named, STAGED, &[T::TEXT], "prepare staged read").await?,
            enqueue_lock: Stmt::new(c, named, ENQUEUE_LOCK, &[T::TEXT], "prepare enqueue").await?,
            enqueue_check: Stmt::new(c, named, ENQUEUE_CHECK, &[T::TEXT, T::TEXT], "prepare enqueue").await?,
            enqueue_insert: Stmt::new(c, named, ENQUEUE_INSERT, &[T::TEXT, T::TEXT, T::TEXT, T::TEXT, T::BOOL, T::BOOL], "prepare enqueue")
                .await?,
        })
    }
}

/// One statement of [`Prepared`]: its text and parameter types, and the named statement when
/// the connection prepared one.
struct Stmt {
    sql: &'static str,
    types: Vec<Type>,
    named: Option<Statement>,
}

impl Stmt {
    async fn new(c: &Client, named: bool, sql: &'static str, types: &[Type], what: &str) -> Result<Stmt, LogError> {
        let named = match named {
            true => Some(c.prepare_typed(sql, types).await.map_err(db_err(what))?),
            false => None,
        };
        Ok(Stmt { sql, types: types.to_vec(), named })
    }

    /// `params` paired with this statement's types, for an unnamed statement.
    fn typed<'a>(&self, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        params.iter().zip(&self.types).map(|(p, t)| (*p, t.clone())).collect()
    }

    /// Runs it on `c` (a client, or a transaction of one) with `params`, in the types given.
    async fn query<C: GenericClient>(&self, c: &C, params: &[&(dyn ToSql + Sync)]) -> PgResult<Vec<PgRow>> {
        match &self.named {
            Some(statement) => c.query(statement, params).await,
            None => c.query_typed(self.sql, &self.typed(params)).await,
        }
    }

    /// The one row it returns (an error if there is none).
    async fn query_one<C: GenericClient>(&self, c: &C, params: &[&(dyn ToSql + Sync)]) -> PgResult<PgRow> {
        match &self.named {
            Some(statement) => c.query_one(statement, params).await,
            None => c.query_typed_one(self.sql, &self.typed(params)).await,
        }
    }

    /// The row it returns, if any.
    async fn query_opt<C: GenericClient>(&self, c: &C, params: &[&(dyn ToSql + Sync)]) -> PgResult<Option<PgRow>> {
        match &self.named {
            Some(statement) => c.query_opt(statement, params).await,
            None => c.query_typed_opt(self.sql, &self.typed(params)).await,
        }
    }
}

type PgRow = tokio_postgres::Row;
type PgResult<T> = Result<T, tokio_postgres::Error>;

/// Appends `rows` (consecutive seqs) in one statement, only if `lease` is still the current
/// epoch and the first seq follows the stored last one; renews the lease on success. `claims`
/// are staged messages (`enqueue`) whose splices are among `rows`: deleted in the same
/// statement, and if any of them is gone (claimed already) nothing is written. Why a refused
/// append was refused is read only when it happens (a second round trip).
pub async fn append(c: &mut Client, p: &Prepared, lease: &Lease, rows: &[Row], ttl_ms: f64, claims: &[String]) -> Result<(), LogError> {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Ok(()) };
    let id = lease.session_id.as_str();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let times: Vec<i64> = rows.iter().map(|r| r.time).collect();
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    let records: Vec<&str> = rows.iter().map(|r| r.record.as_str()).collect();
    let row = p
        .append
        .query_one(&*c, &[&id, &seqs, &times, &kinds, &records, &lease.epoch, &(first.seq - 1), &last.seq, &ttl_ms, &claims])
        .await
        .map_err(db_err("append events"))?;
    let inserted: i64 = row.get(0);
    if inserted == rows.len() as i64 {
        return Ok(());
    }
    // Nothing was written (the statement is atomic): say why.
    let (epoch, last_seq) = session_state(c, id).await?.ok_or_else(|| LogError::NotFound { id: id.into() })?;
    if epoch != lease.epoch {
        return Err(LogError::LeaseLost { id: id.into(), epoch: lease.epoch, current: epoch });
    }
    if last_seq != first.seq - 1 {
        return Err(LogError::Write {
            detail: format!("session \"{id}\": append of seq {} does not follow the stored last seq {last_seq}", first.seq),
        });
    }
    Err(LogError::Write { detail: format!("session \"{id}\": a staged message was already claimed; nothing was appended") })
}

/// A session's current epoch and last seq, or `None` if it does not exist.
pub async fn session_state(c: &mut Client, id: &str) -> Result<Option<(i64, i64)>, LogError> {
    let row = c
        .query_typed_opt("SELECT epoch, last_seq FROM kerman_sessions WHERE id = $1", &[(&id, Type::TEXT)])
        .await
        .map_err(db_err("read session state"))?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}

/// Extends the leases in `leases` (session id, epoch) that are still ours, in one statement;
/// returns the ones it extended.
pub async fn renew(c: &mut Client, leases: &[(String, i64)], owner: &str, ttl_ms: f64) -> Result<Vec<(String, i64)>, LogError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, epochs): (Vec<&str>, Vec<i64>) = leases.iter().map(|(id, epoch)| (id.as_str(), *epoch)).unzip();
    // A row another transaction holds locked is skipped, and renewed next round (renewals
    // run every third of the TTL): waiting for it would stall every request queued behind the
    // renewal on this connection.
    let rows = c
        .query_typed(
            "UPDATE kerman_sessions s SET expires_at = now() + $3::float8 * interval '1 millisecond'
             FROM (SELECT f.id FROM kerman_sessions f
                   JOIN unnest($1::text[], $2::bigint[]) AS h(id, epoch) ON f.id = h.id AND f.epoch = h.epoch
                   WHERE f.owner = $4
                   FOR UPDATE OF f SKIP LOCKED) AS free
             WHERE s.id = free.id
             RETURNING s.id, s.epoch",
            &[(&ids, TEXT_ARRAY), (&epochs, INT8_ARRAY), (&ttl_ms, Type::FLOAT8), (&owner, Type::TEXT)],
        )
        .await
        .map_err(db_err("renew leases"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Every record of a session, in seq order (a fork's first ones its parents').
pub async fn read(c: &mut Client, id: &str) -> Result<Vec<String>, LogError> {
    let rows = c
        .query_typed("SELECT record FROM kerman_session_events($1) ORDER BY seq", &[(&id, Type::TEXT)])
        .await
        .map_err(db_err("read events"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The channel workers listen on: notified with a session id when that session becomes
/// takeable (input staged while nobody owns it, a release leaving input behind, an unpark).
/// One channel for all sessions, unlike the per-session ones: only workers listen, and only
/// unowned sessions notify it. Payloads are hints; the take query decides.
pub const TAKEABLE: &str = "kerman_takeable";

/// Gives the lease up (only if it is still ours), so the next `open` needs no expiry wait.
/// Input still staged (or marked `runnable`) is announced on [`TAKEABLE`], so a worker takes
/// the session at once rather than at its next sweep.
pub async fn release(c: &mut Client, lease: &Lease) -> Result<(), LogError> {
    c.query_typed(
        "UPDATE kerman_sessions SET owner = NULL, expires_at = NULL, owned_since = NULL, owner_name = NULL
         WHERE id = $1 AND epoch = $2
         RETURNING (SELECT pg_notify('kerman_takeable', $1)
                    WHERE runnable OR EXISTS (SELECT 1 FROM kerman_inbox_staged WHERE session_id = $1))",
        &[(&lease.session_id, Type::TEXT), (&lease.epoch, Type::INT8)],
    )
    .await
    .map_err(db_err("release lease"))?;
    Ok(())
}

pub async fn exists(c: &mut Client, id: &str) -> Result<bool, LogError> {
    let row =
        c.query_typed_opt("SELECT 1 FROM kerman_sessions WHERE id = $1", &[(&id, Type::TEXT)]).await.map_err(db_err("check session"))?;
    Ok(row.is_some())
}

/// Every created session, by id (the ids `exists` answers true for).
pub async fn list(c: &mut Client) -> Result<Vec<String>, LogError> {
    let rows = c.query_typed("SELECT id FROM kerman_sessions ORDER BY id", &[]).await.map_err(db_err("list sessions"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Deletes a session nobody holds (an expired lease counts as nobody) and no fork reads
/// (`HasForks`, naming them).
pub async fn delete(c: &mut Client, id: &str) -> Result<(), LogError> {
    let forks = forks_of(c, id).await?;
    if !forks.is_empty() {
        return Err(LogError::HasForks { id: id.into(), forks });
    }
    // Notifies the append channel like a commit does: a follower reads, finds the session
    // gone, and ends.
    let deleted = c
        .query_typed(
            "DELETE FROM kerman_sessions WHERE id = $1 AND (owner IS NULL OR expires_at < now()) \
             RETURNING pg_notify('kerman_a_' || md5(id), '-1')",
            &[(&id, Type::TEXT)],
        )
        .await;
    let n = match deleted {
        // A fork committed since the look above: the reference refused the delete.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
            return Err(LogError::HasForks { id: id.into(), forks: forks_of(c, id).await? });
        }
        other => other.map_err(db_err("delete session"))?.len(),
    };
    if n == 1 {
        return Ok(());
    }
    match exists(c, id).await? {
        true => Err(LogError::Locked { id: id.into() }),
        false => Err(LogError::NotFound { id: id.into() }),
    }
}

/// Creates session `child` (unowned, with `header`) as a fork of session `parent` at `at`
/// that shares its rows: the child's row names the parent and the cut, and no event row is
/// written (readers read the parent's rows up to the cut through `kerman_session_events`), so
/// the cost does not depend on the parent's length. The parent's row is locked `FOR SHARE`
/// meanwhile, so no append, lease change or delete of the parent interleaves.
pub async fn fork(c: &mut Client, parent: &str, at: i64, child: &str, header: &str) -> Result<(), LogError> {
    let tx = c.transaction().await.map_err(db_err("fork session: begin"))?;
    let row = tx
        .query_typed_opt("SELECT last_seq FROM kerman_sessions WHERE id = $1 FOR SHARE", &[(&parent, Type::TEXT)])
        .await
        .map_err(db_err("fork session: lock the parent"))?;
    let Some(row) = row else { return Err(LogError::NotFound { id: parent.into() }) };
    let last_seq: i64 = row.get(0);
    if at > last_seq {
        return Err(crate::event_log::fork_beyond(parent, u64::try_from(at).unwrap_or(u64::MAX), u64::try_from(last_seq + 1).unwrap_or(0)));
    }
    let created = tx
        .query_typed_opt(
            "INSERT INTO kerman_sessions (id, header, last_seq, parent_id, parent_seq) VALUES ($1, $2, $3, $4, $3)
             ON CONFLICT (id) DO NOTHING RETURNING 1",
            &[(&child, Type::TEXT), (&header, Type::TEXT), (&at, Type::INT8), (&parent, Type::TEXT)],
        )
        .await
        .map_err(db_err("fork session: create the child"))?;
    if created.is_none() {
        return Err(LogError::Exists { id: child.into() });
    }
    tx.commit().await.map_err(db_err("fork session: commit"))?;
    Ok(())
}

/// The forks that read session `id`'s rows, sorted.
pub async fn forks_of(c: &mut Client, id: &str) -> Result<Vec<String>, LogError> {
    let rows = c
        .query_typed("SELECT id FROM kerman_sessions WHERE parent_id = $1 ORDER BY id", &[(&id, Type::TEXT)])
        .await
        .map_err(db_err("list forks"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// A session's lease holder, epoch and header text, or `None` if it does not exist.
pub async fn lease_of(c: &mut Client, id: &str) -> Result<Option<(Option<String>, i64, String)>, LogError> {
    let row = c
        .query_typed_opt("SELECT owner, epoch, header FROM kerman_sessions WHERE id = $1", &[(&id, Type::TEXT)])
        .await
        .map_err(db_err("read lease"))?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// The stored (seq, record) pairs of `from..=to`, in seq order.
pub async fn read_seqs(c: &mut Client, id: &str, from: i64, to: i64) -> Result<Vec<(i64, String)>, LogError> {
    let rows = c
        .query_typed(
            "SELECT seq, record FROM kerman_events WHERE session_id = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
            &[(&id, Type::TEXT), (&from, Type::INT8), (&to, Type::INT8)],
        )
        .await
        .map_err(db_err("read back appended events"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Records of a session with seq > `after`, in seq order (a follower's catch-up read). Its
/// own rows only: a follower starts from [`peek`], so `after` is past any fork's cut.
/// The records after `after` of the session's `incarnation`, in one statement (one snapshot);
/// `None` once the session is gone or is another incarnation (deleted and created again).
pub async fn read_after(c: &mut Client, id: &str, after: i64, incarnation: i64) -> Result<Option<Vec<String>>, LogError> {
    let rows = c
        .query_typed(
            "SELECT s.incarnation, e.record FROM kerman_sessions s \
             LEFT JOIN kerman_events e ON e.session_id = s.id AND e.seq > $2 \
             WHERE s.id = $1 ORDER BY e.seq",
            &[(&id, Type::TEXT), (&after, Type::INT8)],
        )
        .await
        .map_err(db_err("read new events"))?;
    if rows.first().is_none_or(|r| r.get::<_, i64>(0) != incarnation) {
        return Ok(None);
    }
    Ok(Some(rows.iter().filter_map(|r| r.get::<_, Option<String>>(1)).collect()))
}

/// The header and incarnation of a session, and its records, in one snapshot.
pub async fn peek(c: &mut Client, id: &str) -> Result<Option<(String, i64, Vec<String>)>, LogError> {
    let rows = c
        .query_typed(
            "SELECT s.header, s.incarnation, e.record FROM kerman_sessions s \
             LEFT JOIN LATERAL kerman_session_events(s.id) e ON true WHERE s.id = $1 ORDER BY e.seq",
            &[(&id, Type::TEXT)],
        )
        .await
        .map_err(db_err("read session"))?;
    let Some(first) = rows.first() else { return Ok(None) };
    let (header, incarnation) = (first.get(0), first.get(1));
    Ok(Some((header, incarnation, rows.iter().filter_map(|r| r.get::<_, Option<String>>(2)).collect())))
}

/// Why `enqueue` inserted nothing.
pub enum Refused {
    NoSession,
    /// The id is staged already, or an `agent/inbox/spliced` of the session inserted it.
    Duplicate,
}

/// Stages `message` for the owner of session `id` and notifies its enqueue channel, in one
/// transaction committed on its own. Takes no lease and touches no event.
///
/// The session row is locked first (`FOR SHARE`, in its own statement), which waits for an
/// owner's append in flight (its update of that row) and holds the next one off until this
/// commits. The log check that follows runs on a snapshot taken after that wait, so a splice
/// claiming this id either committed before it (seen: a duplicate) or commits after this
/// transaction (and then found the staged row this one left, or this one's insert conflicted
/// with it). Without the lock, a retry racing a claim read its snapshot before the claim
/// committed while `ON CONFLICT` waited for it: accepted, then dropped by the owner.
pub async fn enqueue(c: &mut Client, p: &Prepared, staged: &StagedInput, id: &str) -> Result<Result<(), Refused>, LogError> {
    let tx = c.transaction().await.map_err(db_err("enqueue message: begin"))?;
    let session = p.enqueue_lock.query_opt(&tx, &[&id]).await.map_err(db_err("enqueue message: lock the session"))?;
    let Some(session) = session else { return Ok(Err(Refused::NoSession)) };
    // Nobody owns it: tell the workers (the row lock orders this against a release, which
    // announces staged input itself).
    let unowned: bool = session.get(0);
    // Ids are compared as values, in Rust: only the splices whose text may hold the id are
    // read (`strpos` of the id as this crate writes it as a JSON string, so ids that JSON
    // escapes are found and short ids are not matched inside other text), then parsed. Records
    // are never cast to `jsonb`, which refuses the `\u0000` escape a NUL in a text is stored as.
    let mut literal = String::new();
    crate::json::push_str_literal(&mut literal, &staged.id);
    let candidates = p.enqueue_check.query(&tx, &[&id, &literal]).await.map_err(db_err("enqueue message: check the log"))?;
    if candidates.iter().any(|row| record_inserts(row.get(0), &staged.id)) {
        return Ok(Err(Refused::Duplicate));
    }
    let row = p
        .enqueue_insert
        .query_one(&tx, &[&id, &staged.id, &staged.message, &staged.target, &staged.wakeup, &unowned])
        .await
        .map_err(db_err("enqueue message"))?;
    let inserted: i64 = row.get(0);
    if inserted == 0 {
        return Ok(Err(Refused::Duplicate));
    }
    tx.commit().await.map_err(db_err("enqueue message: commit"))?;
    Ok(Ok(()))
}

/// `enqueue`'s lock of the session row, also reading whether anybody owns it.
const ENQUEUE_LOCK: &str = "SELECT owner IS NULL OR expires_at < now() FROM kerman_sessions WHERE id = $1 FOR SHARE";

/// `enqueue`'s log check: the splices whose text may hold the id (a fork's inherited too).
const ENQUEUE_CHECK: &str = "SELECT record FROM kerman_session_events($1)
     WHERE type = 'agent/inbox/spliced'
       AND (strpos(record, $2) > 0 OR strpos(record, '\\u') > 0)";

/// `enqueue`'s insert. A data-modifying CTE always runs; the notify CTEs run because the final
/// SELECT reads them: the owner's channel, and `kerman_takeable` when nobody owns the session.
/// The owner's notification carries the staged row itself ([`staged_from_payload`]) when it
/// fits in a payload (8000 bytes), so the owner need not read it back; else only its id.
const ENQUEUE_INSERT: &str = "WITH ins AS (
         INSERT INTO kerman_inbox_staged (session_id, message_id, message, target, wakeup)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING RETURNING 1
     ),
     note AS (SELECT json_build_object('id', $2::text, 'message', $3::text, 'target', $4::text,
                                       'wakeup', $5::bool)::text AS row),
     woke AS (SELECT pg_notify('kerman_e_' || md5($1),
                               CASE WHEN octet_length(note.row) < 7900 THEN note.row ELSE $2 END)
              FROM ins, note),
     free AS (SELECT pg_notify('kerman_takeable', $1) FROM ins WHERE $6)
     SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM woke), (SELECT count(*) FROM free)";

/// Whether the stored splice record `record` inserts a message with id `message_id`.
fn record_inserts(record: &str, message_id: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Record<'a> {
        #[serde(borrow)]
        data: &'a serde_json::value::RawValue,
    }
    serde_json::from_str::<Record<'_>>(record).is_ok_and(|r| crate::event_log::inserted_ids(r.data.get()).iter().any(|id| id == message_id))
}

/// The staged row an enqueue notification carries (see [`ENQUEUE_INSERT`]), or `None` if it
/// carries only the message id (too large for a payload): then the owner reads the rows.
pub fn staged_from_payload(payload: &str) -> Option<StagedInput> {
    #[derive(serde::Deserialize)]
    struct Payload {
        id: String,
        message: String,
        target: String,
        wakeup: bool,
        /// Absent from a message's payload; an operation's names it ([`STAGE_OP`]).
        #[serde(default)]
        op: Option<String>,
    }
    if !payload.starts_with('{') {
        return None;
    }
    let p: Payload = serde_json::from_str(payload).ok()?;
    let op = match p.op {
        None => StagedOp::Insert,
        Some(name) => StagedOp::parse(&name)?,
    };
    Some(StagedInput { id: p.id, message: p.message, target: p.target, wakeup: p.wakeup, op })
}

/// The messages staged for session `id`, in enqueue order.
pub async fn staged(c: &mut Client, p: &Prepared, id: &str) -> Result<Vec<StagedInput>, LogError> {
    let rows = p.staged.query(&*c, &[&id]).await.map_err(db_err("read staged messages"))?;
    Ok(rows
        .iter()
        .map(|r| StagedInput {
            id: r.get(0),
            message: r.get(1),
            target: r.get(2),
            wakeup: r.get(3),
            // The column's CHECK allows only the names `parse` knows.
            op: StagedOp::parse(r.get(4)).unwrap_or_default(),
        })
        .collect())
}

const STAGED: &str = "SELECT message_id, message, target, wakeup, op FROM kerman_inbox_staged WHERE session_id = $1 ORDER BY n";

/// Stages operation `op_id` (`op`, its arguments `args` as a JSON object's text) for the owner
/// of session `id`, in the same ordered stream as `enqueue`'s messages, and notifies the
/// owner's channel (with the row, as `enqueue` does) and, when nobody owns the session,
/// `kerman_takeable` (a worker takes it to apply the operation). One statement, its own
/// transaction. `false`: no such session. Op ids are minted per operation, so a conflict on
/// the primary key is an earlier try of this very call (its reply lost): staged already.
pub async fn stage_op(c: &mut Client, id: &str, op_id: &str, op: StagedOp, args: &str) -> Result<bool, LogError> {
    let row = c
        .query_typed_one(STAGE_OP, &[(&id, Type::TEXT), (&op_id, Type::TEXT), (&args, Type::TEXT), (&op.as_str(), Type::TEXT)])
        .await
        .map_err(db_err(format!("stage {} for session \"{id}\"", op.as_str())))?;
    Ok(row.get::<_, i64>(0) == 1)
}

/// The session row is read `FOR SHARE`, as `enqueue` does, which orders this against a
/// release (that announces staged rows itself).
const STAGE_OP: &str = "WITH s AS (
         SELECT owner IS NULL OR expires_at < now() AS unowned FROM kerman_sessions WHERE id = $1 FOR SHARE
     ),
     ins AS (
         INSERT INTO kerman_inbox_staged (session_id, message_id, message, target, wakeup, op)
         SELECT $1, $2, $3, 'next-turn', false, $4 FROM s
         ON CONFLICT DO NOTHING RETURNING 1
     ),
     note AS (SELECT json_build_object('id', $2::text, 'message', $3::text, 'target', 'next-turn',
                                       'wakeup', false, 'op', $4::text)::text AS row),
     woke AS (SELECT pg_notify('kerman_e_' || md5($1),
                               CASE WHEN octet_length(note.row) < 7900 THEN note.row ELSE $2 END)
              FROM ins, note),
     free AS (SELECT pg_notify('kerman_takeable', $1) FROM ins, s WHERE s.unowned)
     SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM woke), (SELECT count(*) FROM free)";

/// The owner's answers to staged operations, each `(op id, outcome text)`: deletes their
/// staged rows and records the outcomes, only while `lease` is current (a fenced-out owner's
/// answers are not recorded, and the next owner applies the operations again), and notifies
/// the requesters' channel with each op id. Answers older than a day that nobody read are
/// dropped on the way.
pub async fn settle(c: &mut Client, lease: &Lease, outcomes: &[(String, String)]) -> Result<(), LogError> {
    let ids: Vec<&str> = outcomes.iter().map(|(id, _)| id.as_str()).collect();
    let texts: Vec<&str> = outcomes.iter().map(|(_, text)| text.as_str()).collect();
    c.query_typed(
        "WITH d AS (
             DELETE FROM kerman_inbox_staged WHERE session_id = $1 AND message_id = ANY($2) AND op <> 'insert'
               AND EXISTS (SELECT 1 FROM kerman_sessions WHERE id = $1 AND epoch = $4)
             RETURNING message_id
         ),
         o AS (
             INSERT INTO kerman_inbox_outcomes (session_id, op_id, outcome)
             SELECT $1, u.id, u.outcome FROM unnest($2::text[], $3::text[]) AS u (id, outcome)
             JOIN d ON d.message_id = u.id
             ON CONFLICT DO NOTHING RETURNING op_id
         ),
         old AS (DELETE FROM kerman_inbox_outcomes WHERE session_id = $1 AND done_at < now() - interval '1 day')
         SELECT pg_notify('kerman_o_' || md5($1), op_id) FROM o",
        &[(&lease.session_id, Type::TEXT), (&ids, TEXT_ARRAY), (&texts, TEXT_ARRAY), (&lease.epoch, Type::INT8)],
    )
    .await
    .map_err(db_err("record the outcomes of staged operations"))?;
    Ok(())
}

/// The outcome of operation `op_id` on session `id` (`None`: not yet), or with `forget`, deletes
/// it (once read: two statements, so a reply lost after the delete cannot lose the outcome).
pub async fn outcome(c: &mut Client, id: &str, op_id: &str, forget: bool) -> Result<Option<String>, LogError> {
    let sql = match forget {
        false => "SELECT outcome FROM kerman_inbox_outcomes WHERE session_id = $1 AND op_id = $2",
        true => "DELETE FROM kerman_inbox_outcomes WHERE session_id = $1 AND op_id = $2 RETURNING outcome",
    };
    let row = c
        .query_typed_opt(sql, &[(&id, Type::TEXT), (&op_id, Type::TEXT)])
        .await
        .map_err(db_err("read the outcome of a staged operation"))?;
    Ok(row.map(|r| r.get(0)))
}

/// Withdraws staged operation `op_id` if no owner answered it yet: true if its row was still
/// staged (now deleted: it will never be applied).
pub async fn withdraw(c: &mut Client, id: &str, op_id: &str) -> Result<bool, LogError> {
    let rows = c
        .query_typed(
            "DELETE FROM kerman_inbox_staged WHERE session_id = $1 AND message_id = $2 AND op <> 'insert' RETURNING 1",
            &[(&id, Type::TEXT), (&op_id, Type::TEXT)],
        )
        .await
        .map_err(db_err("withdraw a staged operation"))?;
    Ok(!rows.is_empty())
}

/// Deletes staged rows the owner dropped (their ids were already in the log), only while
/// `lease` is current.
pub async fn unstage(c: &mut Client, lease: &Lease, ids: &[String]) -> Result<(), LogError> {
    c.query_typed(
        "DELETE FROM kerman_inbox_staged WHERE session_id = $1 AND message_id = ANY($2)
           AND EXISTS (SELECT 1 FROM kerman_sessions WHERE id = $1 AND epoch = $3)",
        &[(&lease.session_id, Type::TEXT), (&ids, TEXT_ARRAY), (&lease.epoch, Type::INT8)],
    )
    .await
    .map_err(db_err("drop staged messages"))?;
    Ok(())
}

/// A session [`take`] acquired: its lease, header text and records.
pub type Taken = (Lease, String, Vec<String>);

/// Seconds until the earliest lease held by another owner expires (server clock), if any: when
/// a worker should look again, since a dead owner's lease lapses without a notification.
pub async fn next_expiry(c: &mut Client, owner: &str) -> Result<Option<f64>, LogError> {
    let row = c
        .query_typed_one(
            "SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM kerman_sessions
             WHERE owner IS NOT NULL AND owner <> $1 AND expires_at >= now()",
            &[(&owner, Type::TEXT)],
        )
        .await
        .map_err(db_err("read the next lease expiry"))?;
    Ok(row.get(0))
}

/// Acquires up to `limit` sessions a worker should run, in one statement that skips rows other
/// workers are taking (`FOR UPDATE SKIP LOCKED`) and returns their records with them.
/// Takeable: nobody holds a live lease, and it has input waiting (staged rows, or `runnable`),
/// or its owner died holding it (the lease expired unreleased: crash closers are due); a parked
/// session only for input staged after the park. Taking clears the park and `runnable`.
/// With `ids`, only those sessions are looked at (by primary key: the ids a `kerman_takeable`
/// notification named); without, every candidate is (a sweep).
pub async fn take(
    c: &mut Client,
    p: &Prepared,
    limit: i64,
    owner: &str,
    name: &str,
    ttl_ms: f64,
    ids: Option<&[String]>,
) -> Result<Vec<Taken>, LogError> {
    let rows = match ids {
        None => p.take.query(&*c, &[&limit, &owner, &name, &ttl_ms]).await,
        Some([]) => return Ok(Vec::new()),
        Some(ids) => p.take_ids.query(&*c, &[&limit, &owner, &name, &ttl_ms, &ids]).await,
    }
    .map_err(db_err("take sessions"))?;
    taken_rows(c, owner, rows).await
}

/// After a take whose reply was lost: the sessions that take acquired are held by `owner`
/// under worker `name` with a live lease, but none of them is in `held` (this store's leases):
/// adopted (lease extended) and returned with their records, as the lost reply would have.
/// Sessions `open` or `create` acquired are never adopted here (`open` clears `owner_name`).
pub async fn adopt_taken(c: &mut Client, owner: &str, name: &str, held: &[String], ttl_ms: f64) -> Result<Vec<Taken>, LogError> {
    let rows = c
        .query_typed(ADOPT_TAKEN, &[(&owner, Type::TEXT), (&name, Type::TEXT), (&held, TEXT_ARRAY), (&ttl_ms, Type::FLOAT8)])
        .await
        .map_err(db_err("adopt taken sessions"))?;
    taken_rows(c, owner, rows).await
}

/// Leases and records from the rows of [`TAKE`], [`TAKE_IDS`] or [`ADOPT_TAKEN`]: id, epoch,
/// header, `last_seq`, records. The records come from the statement's snapshot, taken before
/// its row locks: if an append committed in between (its lease expired as it ran), they miss
/// its rows, which `last_seq` (the locked row's) shows; such a session is read again.
async fn taken_rows(c: &mut Client, owner: &str, rows: Vec<tokio_postgres::Row>) -> Result<Vec<Taken>, LogError> {
    let mut taken = Vec::with_capacity(rows.len());
    for r in rows {
        let id: String = r.get(0);
        let last_seq: i64 = r.get(3);
        let mut records: Vec<String> = r.get(4);
        if records.len() as i64 != last_seq + 1 {
            records = read(c, &id).await?;
        }
        taken.push((Lease { session_id: id, owner: owner.into(), epoch: r.get(1) }, r.get(2), records));
    }
    Ok(taken)
}

/// The take of a sweep: every candidate. Its rows are [`taken_rows`]'.
const TAKE: &str = "WITH candidate AS (
                 SELECT DISTINCT session_id AS id FROM kerman_inbox_staged
                 UNION SELECT id FROM kerman_sessions WHERE runnable
                 UNION SELECT id FROM kerman_sessions WHERE owner IS NOT NULL AND expires_at < now()
             ), picked AS (
                 SELECT s.id FROM kerman_sessions s
                 WHERE s.id IN (SELECT id FROM candidate)
                   AND (s.owner IS NULL OR s.expires_at < now())
                   AND (s.status = 'active'
                        OR EXISTS (SELECT 1 FROM kerman_inbox_staged i WHERE i.session_id = s.id AND i.n > s.parked_n))
                 LIMIT $1
                 FOR UPDATE OF s SKIP LOCKED
             ), taken AS (
                 UPDATE kerman_sessions s
                 SET owner = $2, owner_name = $3, epoch = s.epoch + 1,
                     expires_at = now() + $4::float8 * interval '1 millisecond', owned_since = now(),
                     status = 'active', status_detail = NULL, parked_n = NULL, runnable = false
                 FROM picked WHERE s.id = picked.id
                 RETURNING s.id, s.epoch, s.header, s.last_seq
             )
             SELECT t.id, t.epoch, t.header, t.last_seq,
                    ARRAY(SELECT e.record FROM kerman_session_events(t.id) e ORDER BY e.seq)
             FROM taken t";

/// The take of the sessions a notification named ($5), by primary key: the same conditions
/// as [`TAKE`]'s candidates and picks, without scanning for candidates.
const TAKE_IDS: &str = "WITH picked AS (
                 SELECT s.id FROM kerman_sessions s
                 WHERE s.id = ANY($5::text[])
                   AND (s.owner IS NULL OR s.expires_at < now())
                   AND (s.runnable OR s.owner IS NOT NULL
                        OR EXISTS (SELECT 1 FROM kerman_inbox_staged i WHERE i.session_id = s.id))
                   AND (s.status = 'active'
                        OR EXISTS (SELECT 1 FROM kerman_inbox_staged i WHERE i.session_id = s.id AND i.n > s.parked_n))
                 LIMIT $1
                 FOR UPDATE OF s SKIP LOCKED
             ), taken AS (
                 UPDATE kerman_sessions s
                 SET owner = $2, owner_name = $3, epoch = s.epoch + 1,
                     expires_at = now() + $4::float8 * interval '1 millisecond', owned_since = now(),
                     status = 'active', status_detail = NULL, parked_n = NULL, runnable = false
                 FROM picked WHERE s.id = picked.id
                 RETURNING s.id, s.epoch, s.header, s.last_seq
             )
             SELECT t.id, t.epoch, t.header, t.last_seq,
                    ARRAY(SELECT e.record FROM kerman_session_events(t.id) e ORDER BY e.seq)
             FROM taken t";

/// [`adopt_taken`]'s statement: our live leases from a take ($2 the worker name) not in $3.
const ADOPT_TAKEN: &str = "WITH taken AS (
                 UPDATE kerman_sessions s SET expires_at = now() + $4::float8 * interval '1 millisecond'
                 WHERE s.owner = $1 AND s.owner_name = $2 AND s.expires_at >= now() AND NOT (s.id = ANY($3::text[]))
                 RETURNING s.id, s.epoch, s.header, s.last_seq
             )
             SELECT t.id, t.epoch, t.header, t.last_seq,
                    ARRAY(SELECT e.record FROM kerman_session_events(t.id) e ORDER BY e.seq)
             FROM taken t";

/// Parks a session under `lease` (releasing it): `detail` says why. Input staged from now on
/// makes it takeable again; `runnable` keeps input already in its log for the unpark. False
/// if the lease moved on (another owner decides).
pub async fn park(c: &mut Client, lease: &Lease, detail: &str, runnable: bool) -> Result<bool, LogError> {
    let n = c
        .query_typed(
            "UPDATE kerman_sessions SET status = 'parked', status_detail = $3, runnable = $4,
                 parked_n = (SELECT coalesce(max(n), 0) FROM kerman_inbox_staged WHERE session_id = $1),
                 owner = NULL, expires_at = NULL, owned_since = NULL, owner_name = NULL
             WHERE id = $1 AND epoch = $2 RETURNING 1",
            &[(&lease.session_id, Type::TEXT), (&lease.epoch, Type::INT8), (&detail, Type::TEXT), (&runnable, Type::BOOL)],
        )
        .await
        .map_err(db_err("park session"))?
        .len();
    Ok(n == 1)
}

/// Makes a parked session active again (and announces it, so staged input runs at once).
/// False if it was not parked; an unknown session is `NotFound`.
pub async fn unpark(c: &mut Client, id: &str) -> Result<bool, LogError> {
    let n = c
        .query_typed(
            "UPDATE kerman_sessions SET status = 'active', status_detail = NULL, parked_n = NULL
             WHERE id = $1 AND status = 'parked' RETURNING pg_notify('kerman_takeable', id)",
            &[(&id, Type::TEXT)],
        )
        .await
        .map_err(db_err("unpark session"))?
        .len();
    if n == 1 {
        return Ok(true);
    }
    match exists(c, id).await? {
        true => Ok(false),
        false => Err(LogError::NotFound { id: id.into() }),
    }
}

/// Marks session `id` as having unclaimed input in its log (a worker let it go just as input
/// arrived), and announces it if nobody owns it. A hint: the taker finds out what is pending.
pub async fn mark_runnable(c: &mut Client, id: &str) -> Result<(), LogError> {
    c.query_typed(
        "UPDATE kerman_sessions SET runnable = true WHERE id = $1
         RETURNING (SELECT pg_notify('kerman_takeable', $1) WHERE owner IS NULL OR expires_at < now())",
        &[(&id, Type::TEXT)],
    )
    .await
    .map_err(db_err("mark session runnable"))?;
    Ok(())
}

/// What an operator sees of one session (`kerman sessions`). Times are seconds since the epoch,
/// by the server's clock (`now` too, so expiry can be shown relative to it).
#[derive(Clone, Debug)]
pub struct SessionInfo {
    pub id: String,
    pub owner: Option<String>,
    pub owner_name: Option<String>,
    pub epoch: i64,
    pub owned_since: Option<f64>,
    pub expires_at: Option<f64>,
    pub status: String,
    pub status_detail: Option<String>,
    pub last_seq: i64,
    pub staged: i64,
    pub runnable: bool,
    pub now: f64,
    /// The last record whose type is one of the `last_of` types [`sessions`] was given: its
    /// type and its JSON text (the store knows no event types; its caller names them).
    pub last_of: Option<(String, String)>,
}

/// Every session (or only `id`), by id, with its owner, lease and staged input count, and the
/// last record of one of the types `last_of` (read backwards along the primary key: a short
/// walk when such records are frequent, as turn boundaries are; a fork with none of its own
/// reads its parents' up to the cut).
pub async fn sessions(c: &mut Client, id: Option<&str>, last_of: &[String]) -> Result<Vec<SessionInfo>, LogError> {
    let rows = c
        .query_typed(
            "SELECT s.id, s.owner, s.owner_name, s.epoch, extract(epoch FROM s.owned_since)::float8,
                    extract(epoch FROM s.expires_at)::float8, s.status, s.status_detail, s.last_seq,
                    coalesce(st.n, 0), s.runnable, extract(epoch FROM now())::float8, l.type, l.record
             FROM kerman_sessions s
             LEFT JOIN (SELECT session_id, count(*) AS n FROM kerman_inbox_staged GROUP BY session_id) st
               ON st.session_id = s.id
             LEFT JOIN LATERAL ((SELECT e.type, e.record FROM kerman_events e
                                 WHERE e.session_id = s.id AND e.type = ANY($2::text[])
                                 ORDER BY e.seq DESC LIMIT 1)
                                UNION ALL
                                (SELECT e.type, e.record FROM kerman_session_events(s.id) e
                                 WHERE s.parent_id IS NOT NULL AND e.type = ANY($2::text[])
                                 ORDER BY e.seq DESC LIMIT 1)
                                LIMIT 1) l ON true
             WHERE $1::text IS NULL OR s.id = $1
             ORDER BY s.id",
            &[(&id, Type::TEXT), (&last_of, Type::TEXT_ARRAY)],
        )
        .await
        .map_err(db_err("list sessions"))?;
    Ok(rows
        .iter()
        .map(|r| SessionInfo {
            id: r.get(0),
            owner: r.get(1),
            owner_name: r.get(2),
            epoch: r.get(3),
            owned_since: r.get(4),
            expires_at: r.get(5),
            status: r.get(6),
            status_detail: r.get(7),
            last_seq: r.get(8),
            staged: r.get(9),
            runnable: r.get(10),
            now: r.get(11),
            last_of: r.get::<_, Option<String>>(12).zip(r.get::<_, Option<String>>(13)),
        })
        .collect())
}
