//! FileStore: the on-disk format, recovery, locking and the writer thread.

use std::fs;
use std::io;
#[cfg(unix)]
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kerman::event_log::file::{Durability, Fault, FaultPoint, FileStore, Recovery};
use kerman::event_log::{LogError, SessionLog, Store};
use serde_json::json;

const MODES: [Durability; 4] = [Durability::Strict, Durability::Checkpoint, Durability::Batch, Durability::None];

fn store(dir: &Path) -> FileStore {
    FileStore::new(dir.join("store"), Durability::None).unwrap()
}

/// A record line written by hand, as docs/format.md describes it.
fn framed(json: &str) -> String {
    format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()))
}

fn fill(log: &SessionLog, n: usize) {
    for i in 0..n {
        log.append("goal/change", &json!({"goal": format!("g{i} ✓"), "n": i, "nested": {"z": [1, null], "a": "\n"}})).unwrap();
    }
}

fn jsons(log: &SessionLog) -> Vec<String> {
    log.range(0, None).iter().map(kerman::Event::to_json).collect()
}

/// A closed session `id` holding `n` events; returns its path and bytes.
fn closed_session(store: &FileStore, id: &str, n: usize) -> (PathBuf, Vec<u8>) {
    let log = store.create(Some(id)).unwrap();
    fill(&log, n);
    log.close().unwrap();
    let path = store.path_of(id).unwrap();
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

/// Byte offset where 1-based line `line` starts.
fn line_start(bytes: &[u8], line: usize) -> usize {
    if line == 1 {
        return 0;
    }
    bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(line - 2).map(|(i, _)| i + 1).unwrap()
}

#[test]
fn round_trip_keeps_header_and_event_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let log = store.create(Some("s1")).unwrap();
    fill(&log, 5);
    let (header, written) = (log.header().clone(), jsons(&log));
    log.close().unwrap();

    let (log, recovery) = store.open_with_report("s1").unwrap();
    assert_eq!(recovery, Recovery::default());
    assert_eq!(log.header(), &header);
    assert_eq!(jsons(&log), written);
    assert_eq!(log.header()["version"], json!(1));
    assert_eq!(log.header()["id"], json!("s1"));

    // The file is exactly: the header record, then one framed `to_json()` line per event.
    let text = fs::read_to_string(store.path_of("s1").unwrap()).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut record = serde_json::Map::new();
    record.insert("type".into(), json!("session"));
    record.extend(header);
    assert_eq!(lines[0], framed(&serde_json::to_string(&record).unwrap()));
    for (line, json) in lines[1..].iter().zip(&written) {
        assert_eq!(*line, framed(json));
    }
    assert_eq!(lines.len(), 6);
}

// Unix only: Windows has no mode bits; a session file takes the ACL it inherits from the
// store's folder (docs/durability.md, "Windows").
#[cfg(unix)]
#[test]
fn session_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, _) = closed_session(&store, "p", 1);
    assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let minted = store.create(None).unwrap();
    let minted_path = store.path_of(minted.id()).unwrap();
    assert_eq!(fs::metadata(minted_path).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn hostile_ids_stay_inside_the_root_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let ids = ["a/b", "..", ".", "../../escape", "/abs", "ünï/cødé", "ctl\u{1}\u{1f}\n\t", "~7E", "x.jsonl", "-", "a b", "\u{7f}"];
    for id in ids {
        closed_session(&store, id, 1);
        assert_eq!(store.path_of(id).unwrap().parent(), Some(store.root()));
        assert!(store.exists(id).unwrap());
        assert_eq!(store.open(id).unwrap().id(), id);
    }
    // Files we did not write as sessions are not sessions.
    for name in ["notes.txt", ".hidden.jsonl", "abc.jsonl.corrupt", "~41.jsonl", "a~2.jsonl"] {
        fs::write(store.root().join(name), framed("{}") + &framed("{}")).unwrap();
    }
    let mut expected: Vec<String> = ids.iter().map(std::string::ToString::to_string).collect();
    expected.sort();
    assert_eq!(store.list().unwrap(), expected);
    // Nothing escaped: the parent holds only the root, the root only flat files.
    let outside: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(outside, ["store"]);
    assert!(fs::read_dir(store.root()).unwrap().all(|e| e.unwrap().file_type().unwrap().is_file()));
}

#[test]
fn ids_that_cannot_be_file_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    assert!(matches!(store.create(Some(&"x".repeat(300))), Err(LogError::InvalidId(_))));
    assert!(matches!(store.create(Some(&"é".repeat(40))), Err(LogError::InvalidId(_))));
    assert!(matches!(store.create(Some("")), Err(LogError::InvalidId(_))));
    assert!(store.create(Some(&"x".repeat(234))).is_ok());
}

#[test]
fn exists_not_found_and_locked() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    assert!(matches!(store.open("missing"), Err(LogError::NotFound { .. })));
    assert!(matches!(store.delete("missing"), Err(LogError::NotFound { .. })));
    assert!(!store.exists("missing").unwrap());

    let log = store.create(Some("s")).unwrap();
    assert!(matches!(store.create(Some("s")), Err(LogError::Exists { .. })));
    // The creator owns the session until it closes; the error says it is held here.
    assert!(matches!(store.open("s"), Err(LogError::LockedHere { .. })));
    fill(&log, 1);
    log.close().unwrap();

    let log = store.open("s").unwrap();
    assert!(matches!(store.open("s"), Err(LogError::LockedHere { .. })));
    assert!(matches!(store.delete("s"), Err(LogError::LockedHere { .. })));
    // Readers take no lock: an open session reads as committed so far.
    assert_eq!(store.read("s").unwrap().events.len(), 1);
    assert!(matches!(store.repair("s"), Err(LogError::LockedHere { .. })));
    log.close().unwrap();

    let log = store.open("s").unwrap();
    drop(log); // dropping without close releases the session too
    store.delete("s").unwrap();
    assert!(!store.exists("s").unwrap());
    assert!(matches!(store.open("s"), Err(LogError::NotFound { .. })));
}

/// The child side of the next test: run only when the parent names a store (the test binary
/// started again with `--exact`), it owns session "s" until its stdin closes.
#[test]
fn lock_holding_child() {
    let Some(root) = std::env::var_os("KERMAN_TEST_LOCK_CHILD") else { return };
    let store = FileStore::new(PathBuf::from(root), Durability::None).unwrap();
    let log = store.open("s").unwrap();
    fill(&log, 1);
    let (tx, rx) = std::sync::mpsc::channel();
    log.flush(Box::new(move |r| tx.send(r.is_ok()).unwrap()));
    assert!(rx.recv().unwrap(), "the append is written");
    println!("kerman-lock-held");
    io::Write::flush(&mut io::stdout()).unwrap();
    io::Read::read_to_end(&mut io::stdin(), &mut Vec::new()).unwrap();
    log.close().unwrap();
}

/// An owner in another process (an flock on Unix, the handle's sharing mode on Windows): a
/// second owner here is told `Locked`, not `LockedHere`; readers read and follow meanwhile; the
/// session is free again once that process is gone.
#[test]
fn a_session_owned_by_another_process_is_locked_and_readable() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    closed_session(&store, "s", 2);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "file_store::lock_holding_child", "--nocapture", "--test-threads=1"])
        .env("KERMAN_TEST_LOCK_CHILD", store.root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = io::BufReader::new(child.stdout.take().unwrap()).lines();
    // (The harness prints the test's name on the same line, before the test runs.)
    assert!(lines.by_ref().map(Result::unwrap).any(|l| l.ends_with("kerman-lock-held")), "the child never held the session");

    assert!(matches!(store.open("s"), Err(LogError::Locked { .. })), "{:?}", store.open("s").err());
    assert!(matches!(store.delete("s"), Err(LogError::Locked { .. })));
    assert!(matches!(store.repair("s"), Err(LogError::Locked { .. })));
    assert_eq!(store.read("s").unwrap().events.len(), 3, "the child's flushed append is readable");
    let follower = store.follow("s").unwrap();
    assert_eq!(follower.len(), 3);
    follower.close().unwrap();

    drop(child.stdin.take());
    assert!(lines.map(Result::unwrap).all(|l| !l.ends_with("kerman-lock-held")));
    assert!(child.wait().unwrap().success());
    let log = store.open("s").unwrap();
    assert_eq!(log.len(), 3);
    log.close().unwrap();
}

#[test]
fn empty_sessions_are_listed_as_they_exist() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.create(Some("empty")).unwrap().close().unwrap();
    closed_session(&store, "full", 1);
    assert!(store.exists("empty").unwrap());
    assert_eq!(store.list().unwrap(), ["empty", "full"]);
}

#[test]
fn a_cut_anywhere_in_the_last_record_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, bytes) = closed_session(&store, "t", 3);
    let last = line_start(&bytes, 4); // header, seq 0, seq 1, then seq 2
    let original = store.read("t").unwrap().events;
    for cut in last..bytes.len() {
        fs::write(&path, &bytes[..cut]).unwrap();
        let (log, recovery) = store.open_with_report("t").unwrap();
        assert_eq!(log.len(), 2, "cut at {cut}");
        assert_eq!(log.range(0, None), original[..2].to_vec());
        assert_eq!(recovery.truncated_bytes, (cut - last) as u64);
        assert_eq!(recovery.truncated_at_line, (cut > last).then_some(4));
        assert_eq!(fs::metadata(&path).unwrap().len(), last as u64);
        let next = log.append("goal/change", &json!({"after": cut})).unwrap();
        assert_eq!(next.seq, 2);
        log.close().unwrap();
        let reopened = store.read("t").unwrap();
        assert_eq!(reopened.events.len(), 3);
        assert_eq!(reopened.events[2].data(), json!({"after": cut}));
        assert_eq!(reopened.torn_tail_bytes, 0);
    }
}

#[test]
fn a_bit_flip_in_the_last_record_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, mut bytes) = closed_session(&store, "b", 4);
    let last = line_start(&bytes, 5);
    bytes[last + 20] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let (log, recovery) = store.open_with_report("b").unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(recovery.truncated_at_line, Some(5));
    assert_eq!(recovery.truncated_bytes, (bytes.len() - last) as u64);
}

#[test]
fn a_bit_flip_in_a_middle_record_is_corruption_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, mut bytes) = closed_session(&store, "c", 5);
    let middle = line_start(&bytes, 3); // seq 1 lives on line 3
    bytes[middle + 30] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    for err in [store.open("c").unwrap_err(), store.read("c").unwrap_err()] {
        match err {
            LogError::Corrupt { path: p, line, seq, .. } => assert_eq!((p, line, seq), (path.clone(), 3, 1)),
            other => panic!("expected Corrupt, got {other}"),
        }
    }
    assert_eq!(fs::read(&path).unwrap(), bytes);

    // A record whose seq does not continue, followed by valid ones, is corruption too.
    let (path2, bytes2) = closed_session(&store, "d", 3);
    let dup = &bytes2[line_start(&bytes2, 3)..line_start(&bytes2, 4)];
    let mut doubled = bytes2[..line_start(&bytes2, 4)].to_vec();
    doubled.extend_from_slice(dup);
    doubled.extend_from_slice(&bytes2[line_start(&bytes2, 4)..]);
    fs::write(&path2, &doubled).unwrap();
    assert!(matches!(store.open("d"), Err(LogError::Corrupt { line: 4, seq: 2, .. })));
}

#[test]
fn repair_keeps_every_record_that_verifies_at_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, mut bytes) = closed_session(&store, "r", 5);
    let (bad, next) = (line_start(&bytes, 4), line_start(&bytes, 5)); // seq 2
    bytes[bad + 12] ^= 0x04;
    fs::write(&path, &bytes).unwrap();
    fs::write(store.root().join("r.jsonl.corrupt"), b"an older backup").unwrap();

    // The plan names the line and the seq, and writes nothing.
    let plan = store.plan_repair("r").unwrap();
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(plan.dropped.iter().map(|d| (d.line, d.bytes.clone())).collect::<Vec<_>>(), [(4, bad as u64..next as u64)]);
    assert_eq!(plan.lost.iter().map(|l| (l.seqs.clone(), l.lines.clone())).collect::<Vec<_>>(), [(2..3, vec![4])]);
    assert_eq!((plan.kept_events, plan.events, plan.backup.clone(), plan.quarantine.clone()), (4, 6, None, None));
    // So does a read that allows damage; it skips exactly that.
    let read = store.read_damaged("r").unwrap();
    assert_eq!(read.snapshot.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 3, 4]);
    assert_eq!(read.skipped.as_ref().map(|s| s.lost.clone()), Some(plan.lost.clone()));

    let report = store.repair("r").unwrap();
    let backup = store.root().join("r.jsonl.corrupt.1");
    let quarantine = store.root().join("r.jsonl.damaged");
    assert_eq!((report.backup.as_deref(), report.quarantine.as_deref()), (Some(backup.as_path()), Some(quarantine.as_path())));
    assert_eq!((report.kept_events, report.removed_bytes), (4, (next - bad) as u64));
    assert_eq!(fs::read(&backup).unwrap(), bytes);
    assert_eq!(fs::read(&quarantine).unwrap(), &bytes[bad..next]);
    // (No mode bits on Windows: the files inherit the folder's ACL.)
    #[cfg(unix)]
    for file in [&backup, &quarantine, &path] {
        assert_eq!(fs::metadata(file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let repaired = fs::read(&path).unwrap();
    assert_eq!(&repaired[..bad], &bytes[..bad], "the records before the damage are untouched");
    let log = store.open("r").unwrap();
    let events = log.range(0, None);
    assert_eq!(
        events.iter().map(|e| e.kind().to_string()).collect::<Vec<_>>(),
        ["goal/change", "goal/change", "log/damaged", "goal/change", "goal/change", "log/repaired"]
    );
    assert_eq!(events[2].data(), json!({"seqs": [2, 2], "lines": [4, 4], "backup": "r.jsonl.corrupt.1"}));
    assert_eq!(events[3].data()["n"], 3, "later records keep their seqs");
    assert_eq!(events[5].data()["lostSeqs"], json!([[2, 2]]));
    assert_eq!(events[5].data()["quarantine"], "r.jsonl.damaged");
    log.close().unwrap();
    assert_eq!(store.list().unwrap(), ["r"]);

    // A healthy file is left alone.
    let report = store.repair("r").unwrap();
    assert_eq!((report.kept_events, report.removed_bytes, report.backup), (6, 0, None));
}

#[test]
fn repair_sets_aside_records_that_do_not_continue_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, mut bytes) = closed_session(&store, "o", 3);
    let clean = bytes.clone();
    // A copy of seq 0 (verifies, but repeats) and a record claiming an absurd seq.
    bytes.extend_from_slice(&clean[line_start(&clean, 2)..line_start(&clean, 3)]);
    bytes.extend_from_slice(framed(r#"{"type":"x/far","seq":999999999,"time":1,"data":0}"#).as_bytes());
    bytes.extend_from_slice(framed(r#"{"type":"x/next","seq":3,"time":1,"data":0}"#).as_bytes());
    fs::write(&path, &bytes).unwrap();
    let report = store.repair("o").unwrap();
    assert_eq!(report.dropped.iter().map(|d| (d.line, d.claimed_seq)).collect::<Vec<_>>(), [(5, Some(0)), (6, Some(999_999_999))]);
    assert!(report.lost.is_empty());
    let log = store.open("o").unwrap();
    assert_eq!(log.range(0, None).iter().map(|e| e.kind().to_string()).collect::<Vec<_>>()[3..], ["x/next", "log/repaired"]);
}

#[test]
fn a_follower_grows_with_the_owner_and_refuses_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let owner = store.create(Some("f")).unwrap();
    fill(&owner, 2);
    owner.flush_blocking().unwrap();
    let follower = store.follow("f").unwrap();
    assert_eq!(follower.len(), 2);
    assert!(matches!(follower.append("x/y", &json!(1)), Err(LogError::ReadOnly { .. })));
    fill(&owner, 3);
    owner.flush_blocking().unwrap();
    // A waiter runs at the follower's next growth, which may adopt the three records in more
    // than one look: wait until it holds all five (or has stopped), within a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while follower.len() < 5 && !follower.is_closed() {
        let (tx, rx) = std::sync::mpsc::channel();
        follower.wait_beyond(
            follower.len(),
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        rx.recv_timeout(left).expect("the follower did not grow");
    }
    assert_eq!(jsons(&follower)[..5], jsons(&owner)[..]);
    owner.close().unwrap();
    follower.close().unwrap();
    assert_eq!(store.open("f").unwrap().len(), 5, "the follower wrote nothing");
}

#[test]
fn read_reports_a_torn_tail_without_touching_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, bytes) = closed_session(&store, "t", 3);
    let torn = &bytes[..bytes.len() - 7];
    fs::write(&path, torn).unwrap();
    let snapshot = store.read("t").unwrap();
    assert_eq!(snapshot.events.len(), 2);
    assert_eq!(snapshot.torn_tail_bytes, (torn.len() - line_start(&bytes, 4)) as u64);
    assert_eq!(snapshot.size_bytes, torn.len() as u64);
    assert_eq!(snapshot.path, path);
    assert_eq!(snapshot.header["id"], json!("t"));
    assert_eq!(fs::read(&path).unwrap(), torn);
}

#[test]
fn headers_from_other_versions_or_damaged_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let path = store.path_of("v").unwrap();
    // The version is checked before anything else about the header.
    fs::write(&path, framed(r#"{"type":"another","version":3}"#) + &framed("whatever")).unwrap();
    let err = store.open("v").unwrap_err();
    let message = err.to_string();
    match err {
        LogError::UnsupportedFormat { path: p, found, supported } => assert_eq!((p, found, supported), (path.clone(), 3, 2)),
        other => panic!("expected UnsupportedFormat, got {other}"),
    }
    assert!(message.contains("version 3") && message.contains("versions 1 and 2") && message.contains(&path.display().to_string()));
    assert!(matches!(store.read("v"), Err(LogError::UnsupportedFormat { found: 3, .. })));
    assert!(matches!(store.repair("v"), Err(LogError::UnsupportedFormat { found: 3, .. })));

    // (An empty file, or part of a header line, is what a crash leaves of a creation that
    // never synced: file_store_syncs.rs.)
    for damaged in ["not a record\n".into(), framed(r#"{"type":"session","version":1,"id":"v""#), framed("x")[..5].to_string() + "\n"] {
        fs::write(&path, &damaged).unwrap();
        assert!(matches!(store.open("v"), Err(LogError::Corrupt { line: 1, seq: 0, .. })), "{damaged:?}");
        assert_eq!(fs::read(&path).unwrap(), damaged.as_bytes());
    }
}

#[test]
fn a_log_ending_inside_a_turn_gets_closers_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).with_open_hook(kerman::agent_loop::crash_closers());
    let text = framed(r#"{"type":"session","version":1,"id":"crash","createdAt":1}"#)
        + &framed(r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1}}"#)
        + &framed(r#"{"type":"step/start","seq":1,"time":11,"data":{"turn":1,"step":1}}"#);
    fs::write(store.path_of("crash").unwrap(), text).unwrap();

    let (log, recovery) = store.open_with_report("crash").unwrap();
    assert_eq!(recovery.closers, 2);
    let kinds: Vec<String> = log.range(0, None).iter().map(|e| e.kind().to_string()).collect();
    assert_eq!(kinds, ["turn/start", "step/start", "step/end", "turn/end"]);
    let written = jsons(&log);
    log.close().unwrap();

    // The closers were written like any append, so the next open finds a closed turn.
    let (log, recovery) = store.open_with_report("crash").unwrap();
    assert_eq!(recovery.closers, 0);
    assert_eq!(jsons(&log), written);
}

#[test]
fn a_store_runs_only_the_open_hook_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let text = framed(r#"{"type":"session","version":1,"id":"crash","createdAt":1}"#)
        + &framed(r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1}}"#);
    let bare = store(dir.path());
    fs::write(bare.path_of("crash").unwrap(), &text).unwrap();
    // Storage knows no turns: without a hook the open turn is handed out as stored.
    let (log, recovery) = bare.open_with_report("crash").unwrap();
    assert_eq!((recovery.closers, log.len()), (0, 1));
    log.close().unwrap();

    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook_seen = Arc::clone(&seen);
    let hooked = bare.clone().with_open_hook(Arc::new(move |log: &SessionLog| {
        hook_seen.lock().unwrap().push(log.len());
        Ok(3)
    }));
    let (log, recovery) = hooked.open_with_report("crash").unwrap();
    assert_eq!((recovery.closers, seen.lock().unwrap().clone()), (3, vec![1]));
    log.close().unwrap();

    let failing = bare.with_open_hook(Arc::new(|_: &SessionLog| Err(LogError::ReadOnly { id: "hook".into() })));
    assert!(matches!(failing.open("crash"), Err(LogError::ReadOnly { .. })));
}

/// A store whose writers fail at `point` while `armed` is set. Writes fail short (10 bytes
/// reach the file first), so the cleanup has something to cut off.
fn faulty(dir: &Path, durability: Durability, point: FaultPoint) -> (FileStore, Arc<AtomicBool>) {
    let armed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&armed);
    let store = FileStore::new(dir.join("store"), durability).unwrap().with_fault(Arc::new(move |site| {
        (site.point == point && flag.load(Ordering::SeqCst)).then(|| Fault::Short { bytes: 10, error: io::Error::other("injected") })
    }));
    (store, armed)
}

#[test]
fn a_failed_write_or_sync_fails_the_barrier_truncates_and_poisons() {
    for (durability, point) in [(Durability::Strict, FaultPoint::Sync), (Durability::None, FaultPoint::Write)] {
        let dir = tempfile::tempdir().unwrap();
        let (store, armed) = faulty(dir.path(), durability, point);
        let log = store.create(Some("f")).unwrap();
        fill(&log, 2);
        log.flush_blocking().unwrap();
        let path = store.path_of("f").unwrap();
        let durable = fs::read(&path).unwrap();

        armed.store(true, Ordering::SeqCst);
        // Committed in memory: the writer only fails once it tries to write it.
        log.append("goal/change", &json!({"doomed": true})).unwrap();
        assert!(matches!(log.flush_blocking(), Err(LogError::Write { .. })), "{durability:?}");
        assert_eq!(fs::read(&path).unwrap(), durable, "partial bytes must be cut off");
        armed.store(false, Ordering::SeqCst);

        assert!(matches!(log.append("goal/change", &json!({})), Err(LogError::Write { .. })));
        assert_eq!(log.len(), 3, "a refused append commits nothing");
        assert!(matches!(log.flush_blocking(), Err(LogError::Write { .. })));
        assert!(matches!(log.close(), Err(LogError::Write { .. })));

        let log = store.open("f").unwrap();
        assert_eq!(log.len(), 2);
        log.append("goal/change", &json!({})).unwrap();
        log.flush_blocking().unwrap();
    }
}

#[test]
fn a_failed_cut_back_leaves_a_torn_tail_that_open_truncates() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("store"), Durability::Strict).unwrap().with_fault(Arc::new(|site| match site.point {
        FaultPoint::Write if site.seqs.start == 2 => Some(Fault::Short { bytes: 15, error: io::Error::other("short") }),
        FaultPoint::CutBack => Some(Fault::Fail(io::Error::other("no cut"))),
        _ => None,
    }));
    let log = store.create(Some("t")).unwrap();
    fill(&log, 2);
    log.flush_blocking().unwrap();
    fill(&log, 1);
    let Err(LogError::Write { detail }) = log.flush_blocking() else { panic!("the barrier must fail") };
    assert!(detail.contains("cutting the file back") && detail.contains("no cut"), "{detail}");
    assert!(log.close().is_err());

    let (log, recovery) = store.open_with_report("t").unwrap();
    assert_eq!(recovery.truncated_bytes, 15);
    assert_eq!(log.len(), 2);
}

#[test]
fn every_mode_makes_everything_durable_by_flush_and_close() {
    for durability in MODES {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("store"), durability).unwrap();
        let log = store.create(Some("m")).unwrap();
        fill(&log, 40);
        log.flush_blocking().unwrap();
        // Acknowledged means written: every record is in the file already.
        let lines = fs::read(store.path_of("m").unwrap()).unwrap().iter().filter(|b| **b == b'\n').count();
        assert_eq!(lines, 41, "{durability:?}");
        fill(&log, 60);
        let written = jsons(&log);
        log.close().unwrap();
        assert_eq!(jsons(&store.open("m").unwrap()), written, "{durability:?}");
    }
}

#[test]
fn flush_with_nothing_pending_answers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("store"), Durability::Batch).unwrap();
    let log = store.create(Some("q")).unwrap();
    // The first barrier waits for the creation's sync (file_store_syncs.rs); after it nothing
    // is pending.
    log.flush_blocking().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let me = std::thread::current().id();
    log.flush(Box::new(move |r| tx.send((r.is_ok(), std::thread::current().id() == me)).unwrap()));
    assert_eq!(rx.try_recv().unwrap(), (true, true));
}

#[test]
fn durability_names_parse() {
    for durability in MODES {
        assert_eq!(durability.as_str().parse::<Durability>().unwrap(), durability);
    }
    assert_eq!(Durability::default(), Durability::Checkpoint);
    assert!("fast".parse::<Durability>().is_err());
}

#[test]
fn concurrent_appenders_and_barriers_keep_every_event_in_order() {
    for durability in [Durability::Strict, Durability::Checkpoint] {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("store"), durability).unwrap();
        let log = store.create(Some("c")).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        log.append("goal/change", &json!({"t": t, "i": i})).unwrap();
                        if i % 10 == 9 {
                            log.flush_blocking().unwrap();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let written = jsons(&log);
        log.close().unwrap();
        let snapshot = store.read("c").unwrap();
        assert_eq!(snapshot.events.iter().map(kerman::Event::to_json).collect::<Vec<_>>(), written);
        assert_eq!(snapshot.events.len(), 200);
    }
}

// Unix only (FIFOs, /dev/zero); the Windows counterpart is the next test.
#[cfg(unix)]
#[test]
fn entries_that_are_not_regular_files_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let (victim, before) = closed_session(&FileStore::new(elsewhere.path(), Durability::None).unwrap(), "v", 2);
    let fifo = store.path_of("fifo").unwrap();
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, which only reads it (std has
    // no safe mkfifo).
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(&victim, store.path_of("link").unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/zero", store.path_of("zero").unwrap()).unwrap();
    fs::create_dir(store.path_of("dir").unwrap()).unwrap();
    for (id, kind) in [("fifo", "a FIFO"), ("link", "a symbolic link"), ("zero", "a symbolic link"), ("dir", "a directory")] {
        assert!(store.exists(id).unwrap() && store.list().unwrap().contains(&id.to_string()));
        let refusals = [
            store.open(id).map(|_| ()),
            store.read(id).map(|_| ()),
            store.follow(id).map(|_| ()),
            store.delete(id),
            store.repair(id).map(|_| ()),
        ];
        for refusal in refusals {
            let text = refusal.unwrap_err().to_string();
            assert!(text.contains(kind) && text.contains("not a regular file"), "{id}: {text}");
        }
    }
    assert_eq!(fs::read(&victim).unwrap(), before, "nothing was written through the link");
}

/// Windows: a symbolic link (to a session file elsewhere, or to a folder) is opened itself and
/// refused, never followed; a folder under a session's name is refused too.
#[cfg(windows)]
#[test]
fn entries_that_are_not_regular_files_are_refused_on_windows() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let (victim, before) = closed_session(&FileStore::new(elsewhere.path(), Durability::None).unwrap(), "v", 2);
    fs::create_dir(store.path_of("dir").unwrap()).unwrap();
    let mut cases = vec![("dir", "a directory")];
    // Creating a link needs a privilege (or developer mode) on Windows, and Wine 8's
    // CreateSymbolicLinkW reports success but makes nothing (a Unix symlink shows as a plain
    // file there): the link cases run only where a link was really made.
    let links: [(&str, &dyn Fn(&Path) -> io::Result<()>); 2] = [
        ("link", &|at| std::os::windows::fs::symlink_file(&victim, at)),
        ("dirlink", &|at| std::os::windows::fs::symlink_dir(elsewhere.path(), at)),
    ];
    for (id, make) in links {
        let at = store.path_of(id).unwrap();
        match make(&at).and_then(|()| fs::symlink_metadata(&at)) {
            Ok(meta) if meta.file_type().is_symlink() => cases.push((id, "a symbolic link or junction")),
            made => eprintln!("not testing {id}: no symbolic link could be made ({made:?})"),
        }
    }
    for (id, kind) in cases {
        assert!(store.exists(id).unwrap(), "{id} exists");
        assert!(store.list().unwrap().contains(&id.to_string()), "{id} is listed: {:?}", store.list());
        let refusals = [
            store.open(id).map(|_| ()),
            store.read(id).map(|_| ()),
            store.follow(id).map(|_| ()),
            store.delete(id),
            store.repair(id).map(|_| ()),
        ];
        for refusal in refusals {
            let text = refusal.unwrap_err().to_string();
            assert!(text.contains(kind) && text.contains("not a regular file"), "{id}: {text}");
        }
    }
    assert_eq!(fs::read(&victim).unwrap(), before, "nothing was written through the link");
}

#[test]
fn a_follower_of_a_file_rewritten_in_place_stops_without_splicing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (path, _) = closed_session(&store, "r", 3);
    let follower = store.follow("r").unwrap();
    // Another session's bytes over the same inode, longer than what the follower has shown.
    // Written by hand: a session created by the store in the same millisecond (creation syncs
    // nothing now) could have the very same header and first records.
    let mut replacement = framed(r#"{"type":"session","version":1,"id":"r","createdAt":1}"#);
    for seq in 0..6 {
        replacement += &framed(&format!(r#"{{"type":"x/y","seq":{seq},"time":1,"data":{{}}}}"#));
    }
    let replacement = replacement.into_bytes();
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(&replacement).unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !follower.is_closed() {
        assert!(std::time::Instant::now() < deadline, "the follower did not stop");
        let tx = tx.clone();
        follower.wait_beyond(
            follower.len(),
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        let _ = rx.recv_timeout(std::time::Duration::from_secs(1));
    }
    assert_eq!(follower.len(), 3, "nothing of the other session was adopted");
}
