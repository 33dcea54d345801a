//! FileStore write-through: each append is in the session file when `append` returns (a killed
//! process loses none), while syncs keep their schedule (the window, a barrier, `close`). A
//! failed write-through append poisons the log and the file is cut back to what was durable.

use std::fs;
use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use kerman::event_log::file::{Durability, Fault, FaultPoint, FaultSite, FileStore};
use kerman::event_log::{LogError, SessionLog, Store};
use serde_json::json;

type Sites = Arc<Mutex<Vec<(FaultPoint, std::ops::Range<u64>)>>>;

/// A store recording every fault site, failing `Write` at the seqs `fail_at` holds.
fn recording(dir: &std::path::Path, durability: Durability, fail_at: Arc<Mutex<Option<u64>>>) -> (FileStore, Sites) {
    let seen: Sites = Arc::new(Mutex::new(Vec::new()));
    let sites = Arc::clone(&seen);
    let store = FileStore::new(dir.join("store"), durability).unwrap().with_fault(Arc::new(move |site: &FaultSite| {
        sites.lock().unwrap().push((site.point, site.seqs.clone()));
        let failing = site.point == FaultPoint::Write && *fail_at.lock().unwrap() == Some(site.seqs.start);
        failing.then(|| Fault::Fail(io::Error::other("injected")))
    }));
    (store, seen)
}

fn append(log: &SessionLog, n: u64) -> Result<(), LogError> {
    log.append("goal/change", &json!({ "n": n })).map(|_| ())
}

/// The records in the session file now (the header line excluded).
fn records_in_file(dir: &std::path::Path) -> usize {
    fs::read_to_string(dir.join("store").join("s.jsonl")).unwrap().lines().count() - 1
}

#[test]
fn each_append_is_in_the_file_when_it_returns_and_one_barrier_syncs_them_all() {
    for durability in [Durability::Checkpoint, Durability::Batch, Durability::Strict] {
        let dir = tempfile::tempdir().unwrap();
        let (store, seen) = recording(dir.path(), durability, Arc::default());
        let log = store.create(Some("s")).unwrap();
        log.set_write_through(true).unwrap();
        assert!(log.write_through());
        for (n, records) in (0..3).zip(1..) {
            append(&log, n).unwrap();
            assert_eq!(records_in_file(dir.path()), records, "{durability:?}: in the file before any barrier");
        }
        log.flush_blocking().unwrap();
        let sites = seen.lock().unwrap().clone();
        let writes: Vec<_> = sites.iter().filter(|(p, _)| *p == FaultPoint::Write).cloned().collect();
        assert_eq!(
            writes,
            [(FaultPoint::Write, 0..1), (FaultPoint::Write, 1..2), (FaultPoint::Write, 2..3)],
            "{durability:?}: the appends wrote, the writer did not"
        );
        assert!(sites.iter().any(|(p, seqs)| *p == FaultPoint::Sync && seqs.end == 3), "{durability:?}: {sites:?}");
        assert_eq!(sites.iter().filter(|(p, _)| *p == FaultPoint::SyncDirectory).count(), 1, "{durability:?}");
        log.close().unwrap();
        let log = store.open("s").unwrap();
        assert_eq!(log.len(), 3);
        log.close().unwrap();
    }
}

#[test]
fn close_syncs_what_was_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let (store, seen) = recording(dir.path(), Durability::Checkpoint, Arc::default());
    let log = store.create(Some("s")).unwrap();
    log.set_write_through(true).unwrap();
    append(&log, 0).unwrap();
    append(&log, 1).unwrap();
    log.close().unwrap();
    let sites = seen.lock().unwrap().clone();
    assert!(sites.iter().any(|(p, seqs)| *p == FaultPoint::Sync && seqs.end == 2), "{sites:?}");
}

#[test]
fn under_none_a_written_append_is_already_as_durable_as_promised() {
    let dir = tempfile::tempdir().unwrap();
    let (store, seen) = recording(dir.path(), Durability::None, Arc::default());
    let log = store.create(Some("s")).unwrap();
    log.set_write_through(true).unwrap();
    append(&log, 0).unwrap();
    log.flush_blocking().unwrap();
    log.close().unwrap();
    assert_eq!(*seen.lock().unwrap(), [(FaultPoint::Write, 0..1)]);
}

/// A store whose writer blocks at its first `point` until released (`entered` says it is
/// there), and fails the write of seq `fail_write` if given.
fn gated(dir: &std::path::Path, point: FaultPoint, fail_write: Option<u64>) -> (FileStore, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some((entered_tx, release_rx)));
    let store = FileStore::new(dir.join("store"), Durability::Checkpoint).unwrap().with_fault(Arc::new(move |site: &FaultSite| {
        if site.point == point {
            if let Some((entered, release)) = gate.lock().unwrap().take() {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
        }
        (site.point == FaultPoint::Write && Some(site.seqs.start) == fail_write).then(|| Fault::Fail(io::Error::other("injected")))
    }));
    (store, entered_rx, release_tx)
}

#[test]
fn it_is_refused_while_appends_wait_for_the_writer_and_accepted_after_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    // The writer blocks inside its first write until released: an append is either still
    // pending or being written when write-through is asked for, never already on disk.
    let (store, entered_rx, release_tx) = gated(dir.path(), FaultPoint::Write, None);
    let log = store.create(Some("s")).unwrap();
    append(&log, 0).unwrap();
    let Err(LogError::InvalidEvent(text)) = log.set_write_through(true) else { panic!("a pending append must refuse it") };
    assert!(text.contains("flush first") && text.contains("'s'"), "{text}");
    let (tx, rx) = mpsc::channel();
    log.flush(Box::new(move |r| tx.send(r).unwrap()));
    entered_rx.recv().unwrap();
    assert!(matches!(log.set_write_through(true), Err(LogError::InvalidEvent(_))), "refused while the writer writes");
    release_tx.send(()).unwrap();
    rx.recv().unwrap().unwrap();
    log.set_write_through(true).unwrap();
    append(&log, 1).unwrap();
    assert_eq!(records_in_file(dir.path()), 2);
    // Off again: appends wait for the writer's batch as before.
    log.set_write_through(false).unwrap();
    append(&log, 2).unwrap();
    log.flush_blocking().unwrap();
    log.close().unwrap();
    assert_eq!(records_in_file(dir.path()), 3);
}

#[test]
fn a_failed_write_through_poisons_the_log_and_cuts_the_file_back_to_what_was_durable() {
    let dir = tempfile::tempdir().unwrap();
    let fail_at = Arc::new(Mutex::new(None));
    let (store, _) = recording(dir.path(), Durability::Checkpoint, Arc::clone(&fail_at));
    let log = store.create(Some("s")).unwrap();
    log.set_write_through(true).unwrap();
    append(&log, 0).unwrap();
    log.flush_blocking().unwrap();
    append(&log, 1).unwrap(); // written, not synced
    *fail_at.lock().unwrap() = Some(2);
    let Err(LogError::Write { detail }) = append(&log, 2) else { panic!("the append must fail") };
    assert!(detail.contains("injected"), "{detail}");
    assert_eq!(log.len(), 2, "the failed append is not in the log");
    assert!(matches!(log.flush_blocking(), Err(LogError::Write { .. })), "barriers fail");
    assert!(matches!(append(&log, 3), Err(LogError::Write { .. })), "poisoned");
    assert!(matches!(log.close(), Err(LogError::Write { .. })), "the failure surfaces at close");
    let (log, recovery) = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap().open_with_report("s").unwrap();
    assert_eq!((log.len(), recovery.truncated_bytes), (1, 0), "cut back to the durable record, no torn tail");
    log.close().unwrap();
}

#[test]
fn a_barrier_waiting_when_a_write_through_fails_is_failed_and_one_already_synced_is_not() {
    let dir = tempfile::tempdir().unwrap();
    // The writer blocks in its first sync until released, while the appends go on.
    let (store, entered_rx, release_tx) = gated(dir.path(), FaultPoint::Sync, Some(2));
    let log = store.create(Some("s")).unwrap();
    log.set_write_through(true).unwrap();
    append(&log, 0).unwrap();
    let (first_tx, first_rx) = mpsc::channel();
    log.flush(Box::new(move |r| first_tx.send(r).unwrap()));
    entered_rx.recv().unwrap(); // syncing event 0
    append(&log, 1).unwrap(); // written, not synced
    let (second_tx, second_rx) = mpsc::channel();
    log.flush(Box::new(move |r| second_tx.send(r).unwrap()));
    assert!(append(&log, 2).is_err());
    release_tx.send(()).unwrap();
    first_rx.recv().unwrap().unwrap();
    let Err(LogError::Write { detail }) = second_rx.recv().unwrap() else { panic!("the barrier on event 1 must fail") };
    assert!(detail.contains("injected"), "{detail}");
    assert!(log.close().is_err());
    let log = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap().open("s").unwrap();
    assert_eq!(log.len(), 1, "event 1 was never durable: cut back with the failure");
    log.close().unwrap();
}
