//! PostgresStore forks that share their parent's rows (schema version 9): a fork writes its
//! session row alone, reads the union of its chain's rows up to each cut and its own, and a
//! parent is deleted only after its forks. Needs `KERMAN_PG_DSN` (skips without it).

use std::fmt::Write as _;

use kerman::event_log::postgres::{PgCore, PgOptions, MIGRATIONS};
use kerman::event_log::{LogError, SessionLog, Store};
use serde_json::json;

use super::postgres_ops::{query, store};
use super::postgres_store::{dsn, fresh_schema};

fn fill(log: &SessionLog, from: usize, n: usize) {
    for i in from..from + n {
        log.append("x/n", &json!({"n": i})).unwrap();
    }
    log.flush_blocking().unwrap();
}

fn jsons(log: &SessionLog) -> Vec<String> {
    log.range(0, None).iter().map(kerman::Event::to_json).collect()
}

fn rows(dsn: &str, id: &str) -> String {
    query(dsn, &format!("SELECT coalesce(string_agg(seq || ' ' || time || ' ' || type || ' ' || record, E'\\n' ORDER BY seq), '') FROM kerman_events WHERE session_id = '{id}'"))
}

#[test]
fn a_fork_writes_no_event_row_and_reads_its_chain() {
    let Some(dsn) = dsn() else { return };
    let (dsn, _schema) = fresh_schema(&dsn);
    let store = store(&dsn);
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 8);
    let parent = jsons(&p);
    let before = rows(&dsn, "p");
    // Forked while the parent is open (its committed rows are what the fork reads).
    assert_eq!(store.fork("p", 4, Some("c")).unwrap(), "c");
    assert_eq!(rows(&dsn, "c"), "", "no row is copied");
    assert_eq!(query(&dsn, "SELECT parent_id || ' ' || parent_seq FROM kerman_sessions WHERE id = 'c'"), "p 4");
    fill(&p, 8, 2); // the parent goes on
    let c = store.open("c").unwrap();
    assert_eq!(jsons(&c), parent[..5]);
    assert_eq!(c.header()["forkedFrom"], json!({"id": "p", "seq": 4}));
    fill(&c, 100, 3); // seqs 5..=7, the child's own rows
    let child = jsons(&c);
    c.close().unwrap();
    assert_eq!(query(&dsn, "SELECT count(*)::text FROM kerman_events WHERE session_id = 'c'"), "3");
    assert_eq!(store.core().read("c").unwrap().iter().map(kerman::Event::to_json).collect::<Vec<_>>(), child);
    // Forks of forks: in the child's own rows, at its cut, below it.
    for (at, id) in [(6u64, "g-own"), (4, "g-cut"), (2, "g-below")] {
        store.fork("c", at, Some(id)).unwrap();
        let g = store.open(id).unwrap();
        assert_eq!(jsons(&g), child[..=usize::try_from(at).unwrap()], "{id}");
        fill(&g, 1000, 1);
        assert_eq!(g.range(0, None).last().unwrap().seq, at + 1);
        g.close().unwrap();
    }
    store.fork("g-own", 7, Some("gg")).unwrap();
    let gg = store.open("gg").unwrap();
    assert_eq!(jsons(&gg)[..7], child[..7]);
    gg.close().unwrap();
    p.close().unwrap();
    let after: Vec<String> = rows(&dsn, "p").lines().take(8).map(str::to_string).collect();
    assert_eq!(after, before.lines().map(str::to_string).collect::<Vec<_>>(), "the parent's rows are unchanged");
    // A follower of a fork reads its chain too.
    let follower = store.follow("g-below").unwrap();
    assert_eq!(follower.len(), 4);
    follower.close().unwrap();
}

#[test]
fn a_parent_is_deleted_only_after_its_forks() {
    let Some(dsn) = dsn() else { return };
    let (dsn, _schema) = fresh_schema(&dsn);
    let store = store(&dsn);
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 3);
    p.close().unwrap();
    store.fork("p", 2, Some("b")).unwrap();
    store.fork("p", 1, Some("a")).unwrap();
    store.fork("a", 1, Some("a2")).unwrap();
    match store.delete("p") {
        Err(LogError::HasForks { id, forks }) => assert_eq!((id.as_str(), forks), ("p", vec!["a".to_string(), "b".to_string()])),
        other => panic!("expected HasForks, got {other:?}"),
    }
    assert!(matches!(store.delete("a"), Err(LogError::HasForks { .. })));
    for id in ["a2", "a", "b", "p"] {
        store.delete(id).unwrap();
    }
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn schema_version_9_keeps_the_copied_forks_of_a_version_7_database() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    let mut setup =
        String::from("CREATE TABLE kerman_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());");
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 7) {
        setup.push_str(sql);
        let _ = write!(setup, ";INSERT INTO kerman_schema (version) VALUES ({version});");
    }
    // A parent and a fork as version 7 made it: every row copied.
    let record = |seq: u64| format!(r#"{{"type":"x/n","seq":{seq},"time":1,"data":{{"n":{seq}}}}}"#);
    let _ = write!(
        setup,
        "INSERT INTO kerman_sessions (id, header, last_seq) VALUES ('p', '{{\"version\":1,\"id\":\"p\",\"createdAt\":0}}', 2),
             ('c', '{{\"version\":1,\"id\":\"c\",\"createdAt\":0,\"forkedFrom\":{{\"id\":\"p\",\"seq\":1}}}}', 1);
         INSERT INTO kerman_events VALUES ('p', 0, 1, 'x/n', '{}'), ('p', 1, 1, 'x/n', '{}'), ('p', 2, 1, 'x/n', '{}'),
             ('c', 0, 1, 'x/n', '{}'), ('c', 1, 1, 'x/n', '{}');",
        record(0),
        record(1),
        record(2),
        record(0),
        record(1)
    );
    query(&dsn, &format!("SET search_path TO {schema};{setup}"));
    let core = PgCore::connect(&dsn, PgOptions::default()).unwrap();
    assert_eq!(core.applied_migrations(), &[8, 9]);
    drop(core);
    let store = store(&dsn);
    // The copy needs nothing of its parent, which may go first.
    store.delete("p").unwrap();
    let c = store.open("c").unwrap();
    assert_eq!(jsons(&c), [record(0), record(1)]);
    c.close().unwrap();
}
