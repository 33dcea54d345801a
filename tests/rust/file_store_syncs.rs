//! FileStore: when the writer syncs. A session `create` made becomes durable (its header and its
//! name) with its first sync; every batch is synced when written, so `close` syncs nothing more.
//! And what a crash of the machine can leave of a session created but never synced opens as an
//! empty session, never as a torn one.

use std::fs;
use std::io;
use std::sync::{Arc, Mutex};

use kerman::event_log::file::{Durability, Fault, FaultPoint, FaultSite, FileStore};
use kerman::event_log::{LogError, SessionLog, Store};
use serde_json::json;

const SYNCED: [Durability; 3] = [Durability::Strict, Durability::Checkpoint, Durability::Batch];

/// A store that records every fault site its writers reach (and fails `fail`, if given).
fn counting(dir: &std::path::Path, durability: Durability, fail: Option<FaultPoint>) -> (FileStore, Arc<Mutex<Vec<FaultSite>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sites = Arc::clone(&seen);
    let store = FileStore::new(dir.join("store"), durability).unwrap().with_fault(Arc::new(move |site: &FaultSite| {
        sites.lock().unwrap().push(site.clone());
        (Some(site.point) == fail).then(|| Fault::Fail(io::Error::other("injected")))
    }));
    (store, seen)
}

fn points(seen: &Mutex<Vec<FaultSite>>) -> Vec<(FaultPoint, std::ops::Range<u64>)> {
    seen.lock().unwrap().iter().map(|s| (s.point, s.seqs.clone())).collect()
}

fn append(log: &SessionLog, n: u64) {
    log.append("goal/change", &json!({ "n": n })).unwrap();
}

#[test]
fn creation_syncs_nothing_its_first_batch_syncs_file_then_directory_and_close_nothing_more() {
    use FaultPoint::{Sync, SyncDirectory, Write};
    for durability in SYNCED {
        let dir = tempfile::tempdir().unwrap();
        let (store, seen) = counting(dir.path(), durability, None);
        let log = store.create(Some("s")).unwrap();
        assert_eq!(points(&seen), [], "{durability:?}: create syncs nothing");
        for n in 0..3 {
            append(&log, n);
            log.flush_blocking().unwrap();
        }
        log.close().unwrap();
        let expected = [(Write, 0..1), (Sync, 0..1), (SyncDirectory, 0..1), (Write, 1..2), (Sync, 1..2), (Write, 2..3), (Sync, 2..3)];
        assert_eq!(points(&seen), expected, "{durability:?}: one sync per batch, the directory once, none at close");
        // A session opened again owes no directory sync either.
        seen.lock().unwrap().clear();
        let log = store.open("s").unwrap();
        append(&log, 3);
        log.flush_blocking().unwrap();
        log.close().unwrap();
        assert_eq!(points(&seen), [(Write, 3..4), (Sync, 3..4)], "{durability:?}");
    }
}

#[test]
fn none_never_syncs_not_even_the_creation() {
    let dir = tempfile::tempdir().unwrap();
    let (store, seen) = counting(dir.path(), Durability::None, None);
    let log = store.create(Some("s")).unwrap();
    log.flush_blocking().unwrap();
    append(&log, 0);
    log.flush_blocking().unwrap();
    log.close().unwrap();
    assert_eq!(points(&seen), [(FaultPoint::Write, 0..1)]);
}

#[test]
fn a_barrier_or_close_with_nothing_appended_makes_the_creation_durable() {
    use FaultPoint::{Sync, SyncDirectory};
    let dir = tempfile::tempdir().unwrap();
    let (store, seen) = counting(dir.path(), Durability::Checkpoint, None);
    // A barrier right after create waits for the creation's sync (it was not answered at once).
    let log = store.create(Some("barrier")).unwrap();
    log.flush_blocking().unwrap();
    assert_eq!(points(&seen), [(Sync, 0..0), (SyncDirectory, 0..0)]);
    log.flush_blocking().unwrap();
    log.close().unwrap();
    assert_eq!(points(&seen).len(), 2, "once durable, an empty barrier and close sync nothing");
    // A session closed unwritten is synced by close.
    seen.lock().unwrap().clear();
    store.create(Some("closed")).unwrap().close().unwrap();
    assert_eq!(points(&seen), [(Sync, 0..0), (SyncDirectory, 0..0)]);
    assert_eq!(store.list().unwrap(), ["barrier", "closed"]);
}

#[test]
fn a_failed_first_sync_fails_the_barrier_and_leaves_a_valid_empty_session() {
    for point in [FaultPoint::Sync, FaultPoint::SyncDirectory] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = counting(dir.path(), Durability::Strict, Some(point));
        let log = store.create(Some("s")).unwrap();
        append(&log, 0);
        let Err(LogError::Write { detail }) = log.flush_blocking() else { panic!("{point:?}: the barrier must fail") };
        assert!(detail.contains("injected"), "{detail}");
        assert!(matches!(log.append("goal/change", &json!({})), Err(LogError::Write { .. })), "poisoned");
        assert!(matches!(log.close(), Err(LogError::Write { .. })), "the failure surfaces at close too");
        // The record was cut off: the session is there, valid and empty.
        let (log, recovery) = FileStore::new(dir.path().join("store"), Durability::Strict).unwrap().open_with_report("s").unwrap();
        assert_eq!((log.len(), recovery.truncated_bytes, recovery.recreated), (0, 0, false), "{point:?}");
        log.close().unwrap();
    }
    // The same when close itself makes the first sync: it reports the failure.
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = counting(dir.path(), Durability::Checkpoint, Some(FaultPoint::SyncDirectory));
    let Err(LogError::Write { detail }) = store.create(Some("s")).unwrap().close() else { panic!("close must fail") };
    assert!(detail.contains("directory") && detail.contains("injected"), "{detail}");
}

#[test]
fn a_later_sync_failure_still_surfaces_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let fail_second = Arc::new(Mutex::new(0u32));
    let count = Arc::clone(&fail_second);
    let store = FileStore::new(dir.path().join("store"), Durability::Batch).unwrap().with_fault(Arc::new(move |site: &FaultSite| {
        let mut n = count.lock().unwrap();
        if site.point == FaultPoint::Sync {
            *n += 1;
        }
        (site.point == FaultPoint::Sync && *n == 2).then(|| Fault::Fail(io::Error::other("second sync")))
    }));
    let log = store.create(Some("s")).unwrap();
    append(&log, 0);
    log.flush_blocking().unwrap();
    append(&log, 1);
    // Nobody waits on this batch: only close can tell.
    let (tx, rx) = std::sync::mpsc::channel();
    log.flush(Box::new(move |r| tx.send(r).unwrap()));
    assert!(rx.recv().unwrap().is_err());
    let Err(LogError::Write { detail }) = log.close() else { panic!("close must report the earlier failure") };
    assert!(detail.contains("second sync"), "{detail}");
}

/// Every state a crash of the machine can leave a session in when it was created and never
/// synced (neither the header nor the name had reached the disk): no file, an empty file, any
/// part of the header line, with or without zeros after it (a length that reached the disk
/// before the data), or the whole header (a process kill: the page cache survives).
#[test]
fn what_a_crash_leaves_of_a_creation_before_its_first_sync_is_absent_or_an_empty_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap();
    let log = store.create(Some("s")).unwrap();
    let path = store.path_of("s").unwrap();
    let header = fs::read(&path).unwrap();
    log.close().unwrap();
    assert_eq!(header.iter().filter(|&&b| b == b'\n').count(), 1, "the header line alone");

    let mut states: Vec<Option<Vec<u8>>> = vec![None];
    for cut in 0..=header.len() {
        states.push(Some(header[..cut].to_vec()));
        states.push(Some([&header[..cut], &[0u8; 64][..]].concat()));
    }
    for state in states {
        let label = state.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        match &state {
            None => fs::remove_file(&path).unwrap(),
            Some(bytes) => fs::write(&path, bytes).unwrap(),
        }
        let Some(bytes) = state else {
            // Absent: no session, and the same create works.
            assert!(!store.exists("s").unwrap() && store.list().unwrap().is_empty());
            assert!(matches!(store.open("s"), Err(LogError::NotFound { .. })));
            store.create(Some("s")).unwrap().close().unwrap();
            continue;
        };
        let whole = bytes.len() > header.len() - 1 && bytes.starts_with(&header);
        // Listed as it exists; read shows an empty session without touching the file.
        assert_eq!(store.list().unwrap(), ["s"], "{label:?}");
        let snapshot = store.read("s").unwrap();
        assert_eq!((snapshot.events.len(), snapshot.header.get("id")), (0, Some(&json!("s"))), "{label:?}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "read changes nothing");
        // Open gives a valid empty session (created again when its header was incomplete).
        let (log, recovery) = store.open_with_report("s").unwrap();
        assert_eq!(log.len(), 0, "{label:?}");
        assert_eq!(recovery.recreated, !whole, "{label:?}");
        // Zeros after a whole header are a torn tail; otherwise everything there was goes.
        let cut = if whole { bytes.len() - header.len() } else { bytes.len() };
        assert_eq!(recovery.truncated_bytes, cut as u64, "{label:?}");
        append(&log, 7);
        log.flush_blocking().unwrap();
        log.close().unwrap();
        let (log, recovery) = store.open_with_report("s").unwrap();
        assert_eq!((log.len(), recovery.truncated_bytes, recovery.recreated), (1, 0, false), "{label:?}");
        log.close().unwrap();
    }
}

/// Waits (on the log's own wake-ups, never a sleep) until `log` holds `len` events.
fn until_len(log: &SessionLog, len: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while log.len() < len {
        assert!(!log.is_closed(), "the follower stopped at {} events", log.len());
        assert!(std::time::Instant::now() < deadline, "the follower never showed {len} events");
        let (tx, rx) = std::sync::mpsc::channel();
        log.wait_beyond(
            log.len(),
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        let _ = rx.recv_timeout(std::time::Duration::from_secs(1));
    }
}

/// `follow` and `repair` read what a crash left of a creation as `open` and `read` do: an empty
/// session. The follower shows the records the session gets once opened (its header written
/// again); a repair writes the header again and reports every byte there was as a torn tail,
/// as `read` shows it, and its dry run changes nothing.
#[test]
fn follow_and_repair_take_a_creation_a_crash_cut_for_an_empty_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap();
    store.create(Some("s")).unwrap().close().unwrap();
    let path = store.path_of("s").unwrap();
    let header = fs::read(&path).unwrap();
    for bytes in [Vec::new(), header[..12].to_vec(), [&header[..30], &[0u8; 64][..]].concat()] {
        let label = String::from_utf8_lossy(&bytes).into_owned();
        let len = bytes.len() as u64;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(store.read("s").unwrap().torn_tail_bytes, len, "{label:?}");
        let plan = store.plan_repair("s").unwrap();
        assert_eq!((plan.kept_events, plan.events, plan.removed_bytes, plan.torn_tail_bytes), (0, 0, len, len), "{label:?}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "a dry run changes nothing");

        let follower = store.follow("s").unwrap();
        assert_eq!((follower.len(), follower.header().get("id")), (0, Some(&json!("s"))), "{label:?}");
        let log = store.open("s").unwrap();
        append(&log, 1);
        append(&log, 2);
        log.flush_blocking().unwrap();
        until_len(&follower, 2);
        assert_eq!(follower.range(0, None), log.range(0, None), "{label:?}");
        log.close().unwrap();
        follower.close().unwrap();

        fs::write(&path, &bytes).unwrap();
        let report = store.repair("s").unwrap();
        assert_eq!((report.kept_events, report.removed_bytes, report.backup), (0, len, None), "{label:?}");
        let (log, recovery) = store.open_with_report("s").unwrap();
        assert_eq!((log.len(), recovery.recreated, recovery.truncated_bytes), (0, false, 0), "{label:?}: a valid empty session");
        log.close().unwrap();
        assert_eq!(store.repair("s").unwrap().removed_bytes, 0, "nothing more to repair");
    }
}
