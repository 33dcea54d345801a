//! The schema, as numbered migrations applied on first use.
//!
//! `kerman_schema` records which versions were applied. Migrations run in one transaction
//! under an advisory lock, so two processes starting against a fresh database cannot both
//! apply version 1 (`CREATE TABLE IF NOT EXISTS` alone races on the catalog).

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::db_err;
use crate::event_log::LogError;

/// Taken with `pg_advisory_xact_lock` while migrating; an arbitrary constant ("KERMAN" in ASCII).
const MIGRATION_LOCK: i64 = 0x4B45_524D_414E;

/// Append-only: a released version is never edited, a change is a new entry.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        // Event records and headers are kept as the JSON text that was written (not jsonb),
        // so key order and number spelling come back byte for byte, as from the file store.
        // `last_seq` (-1 when empty) and `epoch` are the two conditions every append checks.
        // (The SQL text below is unchanged since release, indentation included.)
        "CREATE TABLE kerman_sessions (
         id text PRIMARY KEY,
         header text NOT NULL,
         last_seq bigint NOT NULL DEFAULT -1,
         owner text,
         epoch bigint NOT NULL DEFAULT 0,
         expires_at timestamptz
     );
     CREATE TABLE kerman_events (
         session_id text NOT NULL REFERENCES kerman_sessions (id) ON DELETE CASCADE,
         seq bigint NOT NULL,
         time bigint NOT NULL,
         type text NOT NULL,
         record text NOT NULL,
         PRIMARY KEY (session_id, seq)
     );",
    ),
    (
        2,
        // Messages `enqueue` staged for a session's owner (a web handler never appends to the
        // log itself: the owner assigns seqs in memory). The owner deletes a row in the same
        // transaction that appends the splice inserting its id, so exactly one splice per
        // staged message can ever commit. `n` keeps enqueue order.
        "CREATE TABLE kerman_inbox_staged (
             session_id text NOT NULL REFERENCES kerman_sessions (id) ON DELETE CASCADE,
             message_id text NOT NULL,
             message text NOT NULL,
             target text NOT NULL CHECK (target IN ('next-turn', 'next-step')),
             wakeup boolean NOT NULL,
             enqueued_at timestamptz NOT NULL DEFAULT now(),
             n bigserial NOT NULL,
             PRIMARY KEY (session_id, message_id)
         );",
    ),
    (
        3,
        // Which incarnation of a session id a row is: a session deleted and created again
        // under the same id is another session, and a follower must not splice the two
        // (`sql::read_after` compares it). Existing rows are numbered too.
        "ALTER TABLE kerman_sessions ADD COLUMN incarnation bigserial NOT NULL;",
    ),
    (
        4,
        // Workers (`kerman.Worker`): `status` is `parked` for a session whose turns kept
        // failing (`status_detail` says why), taken again only for input staged after the park
        // (`parked_n`: the last staged row's `n` then) or after `unpark`. `owned_since` and
        // `owner_name` (a worker's label) are for operators. `runnable`: released with input
        // in its log that no turn has claimed yet, so a worker should take it. The partial
        // indexes serve the take query's two scans that are not driven by staged rows.
        "ALTER TABLE kerman_sessions
             ADD COLUMN status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'parked')),
             ADD COLUMN status_detail text,
             ADD COLUMN parked_n bigint,
             ADD COLUMN owned_since timestamptz,
             ADD COLUMN owner_name text,
             ADD COLUMN runnable boolean NOT NULL DEFAULT false;
         CREATE INDEX kerman_sessions_leased ON kerman_sessions (expires_at) WHERE owner IS NOT NULL;
         CREATE INDEX kerman_sessions_runnable ON kerman_sessions (id) WHERE runnable;",
    ),
    (
        5,
        // Operations on a session's queue and loop from processes that do not own it
        // (`PostgresStore.cancel`, `.replace`, `.remove`): staged in the same table as
        // messages, so one ordered stream (`n`) carries both to the owner. For an operation
        // `message_id` is the operation's id and `message` its arguments. The owner answers in
        // `kerman_inbox_outcomes` (deleting the staged row in the same statement), which the
        // requester reads and deletes; answers nobody read are dropped after a day.
        "ALTER TABLE kerman_inbox_staged
             ADD COLUMN op text NOT NULL DEFAULT 'insert' CHECK (op IN ('insert', 'cancel', 'replace', 'remove'));
         CREATE TABLE kerman_inbox_outcomes (
             session_id text NOT NULL REFERENCES kerman_sessions (id) ON DELETE CASCADE,
             op_id text NOT NULL,
             outcome text NOT NULL,
             done_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (session_id, op_id)
         );",
    ),
    (
        6,
        // `PostgresStore.requeue`, a fifth operation: the column's CHECK names every operation
        // the owner knows, so it is replaced by one that also allows `requeue`.
        "ALTER TABLE kerman_inbox_staged
             DROP CONSTRAINT kerman_inbox_staged_op_check,
             ADD CONSTRAINT kerman_inbox_staged_op_check CHECK (op IN ('insert', 'cancel', 'replace', 'remove', 'requeue'));",
    ),
    (
        7,
        // `PostgresStore.decide`, a sixth operation: the CHECK is replaced again.
        "ALTER TABLE kerman_inbox_staged
             DROP CONSTRAINT kerman_inbox_staged_op_check,
             ADD CONSTRAINT kerman_inbox_staged_op_check CHECK (op IN ('insert', 'cancel', 'replace', 'remove', 'requeue', 'decide'));",
    ),
    (
        8,
        // `PostgresStore.resolve` of a session a live process owns, a seventh operation: the
        // owner records the call's result (docs/durability.md, "Settling a call in doubt").
        "ALTER TABLE kerman_inbox_staged
             DROP CONSTRAINT kerman_inbox_staged_op_check,
             ADD CONSTRAINT kerman_inbox_staged_op_check CHECK (op IN ('insert', 'cancel', 'replace', 'remove', 'requeue', 'decide', 'resolve'));",
    ),
    (
        9,
        // Forks that share their parent's rows (docs/context.md, "Forks"): a fork's row names
        // its parent and the cut, and holds only its own events; `kerman_session_events(id)`
        // reads a session's events as the union of its chain of parents' rows up to each cut
        // and its own: PL/pgSQL, one index range scan per session of the chain (a SQL function
        // is inlined into a join whose row estimates lead the planner to scan every session's
        // events). The reference (no cascade) refuses deleting a parent before its forks.
        // A kerman that knows only version 8 refuses this database (it would read forks
        // without their first events).
        "ALTER TABLE kerman_sessions
             ADD COLUMN parent_id text REFERENCES kerman_sessions (id),
             ADD COLUMN parent_seq bigint,
             ADD CONSTRAINT kerman_sessions_parent_check CHECK ((parent_id IS NULL) = (parent_seq IS NULL) AND parent_seq >= 0);
         CREATE INDEX kerman_sessions_forks ON kerman_sessions (parent_id) WHERE parent_id IS NOT NULL;
         CREATE FUNCTION kerman_session_events(sid text)
             RETURNS TABLE (seq bigint, \"time\" bigint, type text, record text)
             LANGUAGE plpgsql STABLE AS $$
             DECLARE
                 ids text[] := '{}';
                 los bigint[] := '{}';
                 his bigint[] := '{}';
                 cur text := sid;
                 hi bigint;
                 pid text;
                 pseq bigint;
             BEGIN
                 -- The chain, from the session up to its first ancestor: the seqs each holds.
                 LOOP
                     SELECT s.parent_id, s.parent_seq INTO pid, pseq FROM kerman_sessions s WHERE s.id = cur;
                     EXIT WHEN NOT FOUND;
                     ids := ids || cur;
                     los := los || coalesce(pseq + 1, 0);
                     his := his || coalesce(hi, 9223372036854775807);
                     EXIT WHEN pid IS NULL;
                     hi := least(pseq, hi);
                     cur := pid;
                 END LOOP;
                 IF cardinality(ids) = 0 THEN
                     RETURN;
                 END IF;
                 -- The first ancestor's first: each holds the seqs after the one before it.
                 FOR i IN REVERSE cardinality(ids) .. 1 LOOP
                     RETURN QUERY SELECT e.seq, e.\"time\", e.type, e.record FROM kerman_events e
                         WHERE e.session_id = ids[i] AND e.seq BETWEEN los[i] AND his[i] ORDER BY e.seq;
                 END LOOP;
             END
         $$;",
    ),
];

/// The newest schema version this build knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Brings the database up to [`latest`]; returns the versions it applied (empty if none).
/// A database migrated by a newer kerman is refused rather than written with old assumptions.
/// Unnamed statements only (`query_typed`), so it also runs behind transaction pooling.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, LogError> {
    let tx = client.transaction().await.map_err(db_err("begin migration"))?;
    tx.query_typed("SELECT pg_advisory_xact_lock($1)", &[(&MIGRATION_LOCK, Type::INT8)]).await.map_err(db_err("lock migration"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS kerman_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(db_err("create kerman_schema"))?;
    let row =
        tx.query_typed_one("SELECT coalesce(max(version), 0) FROM kerman_schema", &[]).await.map_err(db_err("read schema version"))?;
    let current: i32 = row.get(0);
    if current > latest() {
        return Err(LogError::Database {
            context: "schema version".into(),
            detail: format!("the database has kerman schema version {current}, this kerman knows up to {}: upgrade kerman", latest()),
        });
    }
    let mut applied = Vec::new();
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).await.map_err(db_err(format!("apply schema version {version}")))?;
        tx.query_typed("INSERT INTO kerman_schema (version) VALUES ($1)", &[(version, Type::INT4)])
            .await
            .map_err(db_err("record schema version"))?;
        applied.push(*version);
    }
    tx.commit().await.map_err(db_err("commit migration"))?;
    Ok(applied)
}
