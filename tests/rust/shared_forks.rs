//! FileStore forks that share their parent's records (format version 2, docs/format.md): the
//! child's file is its header and its own events, every reader reads the parent's through its
//! file, the parent is never written, and the refusals (delete, a broken parent) name what
//! is wrong.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use kerman::event_log::file::{Durability, FileStore};
use kerman::event_log::{LogError, SessionLog, Store};
use serde_json::{json, Value};

fn store(dir: &Path) -> FileStore {
    FileStore::new(dir.join("store"), Durability::Strict).unwrap()
}

fn framed(json: &str) -> String {
    format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()))
}

fn fill(log: &SessionLog, from: usize, n: usize) {
    for i in from..from + n {
        log.append("x/n", &json!({"n": i, "text": format!("event {i}")})).unwrap();
    }
    log.flush_blocking().unwrap();
}

fn jsons(events: &[kerman::Event]) -> Vec<String> {
    events.iter().map(kerman::Event::to_json).collect()
}

fn read(store: &FileStore, id: &str) -> Vec<String> {
    jsons(&store.read(id).unwrap().events)
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path).unwrap().lines().map(str::to_string).collect()
}

fn header_of(path: &Path) -> Value {
    serde_json::from_str(&lines(path)[0][9..]).unwrap()
}

#[test]
fn a_fork_writes_its_header_alone_and_reads_the_parent_through_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let parent = store.create(Some("p")).unwrap();
    fill(&parent, 0, 10);
    parent.close().unwrap();
    let parent_path = store.path_of("p").unwrap();
    let before = fs::read(&parent_path).unwrap();

    assert_eq!(store.fork("p", 4, Some("c")).unwrap(), "c");
    let child_path = store.path_of("c").unwrap();
    // One line: the header, naming the parent, the cut and the parent's header checksum.
    let child_lines = lines(&child_path);
    assert_eq!(child_lines.len(), 1);
    let header = header_of(&child_path);
    assert_eq!(header["version"], json!(2));
    assert_eq!(header["forkedFrom"], json!({"id": "p", "seq": 4}));
    assert_eq!(header["parentHeader"], json!(String::from_utf8_lossy(&before[..8])));
    assert_eq!(read(&store, "c"), read(&store, "p")[..5]);

    // The child goes its own way: its events are appended to its own file, at seqs 5 and on.
    let child = store.open("c").unwrap();
    assert_eq!(child.len(), 5);
    assert_eq!(child.header()["forkedFrom"], json!({"id": "p", "seq": 4}));
    fill(&child, 100, 3);
    let expected = jsons(&child.range(0, None));
    child.close().unwrap();
    let child_lines = lines(&child_path);
    assert_eq!(child_lines.len(), 4);
    assert!(child_lines[1].contains(r#""seq":5,"#), "{}", child_lines[1]);
    assert_eq!(read(&store, "c"), expected);
    let reopened = store.open("c").unwrap();
    assert_eq!(jsons(&reopened.range(0, None)), expected);
    reopened.close().unwrap();
    assert_eq!(fs::read(&parent_path).unwrap(), before, "the parent is never written");
}

#[test]
fn forks_of_forks_read_along_the_chain_at_any_cut() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 6);
    p.close().unwrap();
    store.fork("p", 3, Some("c")).unwrap();
    let c = store.open("c").unwrap();
    fill(&c, 10, 4); // seqs 4..=7
    let c_events = read_log(&c);
    c.close().unwrap();
    let bytes: Vec<Vec<u8>> = ["p", "c"].iter().map(|id| fs::read(store.path_of(id).unwrap()).unwrap()).collect();
    // A cut in the child's own events, at its cut, and below it (in the grandparent's).
    for (at, id) in [(6u64, "g-own"), (3, "g-at-cut"), (1, "g-below"), (0, "g-first")] {
        store.fork("c", at, Some(id)).unwrap();
        assert_eq!(read(&store, id), c_events[..=usize::try_from(at).unwrap()], "{id}");
        let g = store.open(id).unwrap();
        fill(&g, 1000, 1);
        assert_eq!(g.range(0, None).last().unwrap().seq, at + 1);
        g.close().unwrap();
    }
    // A fork of a grandchild: three files deep.
    store.fork("g-own", 7, Some("gg")).unwrap();
    let gg = read(&store, "gg");
    assert_eq!(gg[..7], c_events[..7]);
    assert!(gg[7].contains(r#""n":1000"#));
    let after: Vec<Vec<u8>> = ["p", "c"].iter().map(|id| fs::read(store.path_of(id).unwrap()).unwrap()).collect();
    assert_eq!(after, bytes);
}

fn read_log(log: &SessionLog) -> Vec<String> {
    jsons(&log.range(0, None))
}

#[test]
fn a_parent_open_and_appending_is_forked_at_what_it_committed_and_read_while_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let parent = store.create(Some("p")).unwrap();
    fill(&parent, 0, 5);
    store.fork("p", 4, Some("c")).unwrap();
    let e = store.fork("p", 5, None).unwrap_err().to_string();
    assert_eq!(e, "cannot fork: at_seq 5 is past the end of session \"p\", which ends at seq 4");
    let prefix = read_log(&parent);
    fill(&parent, 5, 20);
    // A torn record at the parent's end (a write in progress) is no event yet.
    let path = store.path_of("p").unwrap();
    let follower = store.follow("c").unwrap();
    assert_eq!(read_log(&follower), prefix);
    let child = store.open("c").unwrap();
    assert_eq!(read_log(&child), prefix);
    fill(&child, 50, 2);
    fill(&parent, 25, 1);
    // Woken by the follower's growth (no sleeps), within a deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    while follower.len() < 7 && !follower.is_closed() {
        let (tx, rx) = std::sync::mpsc::channel();
        follower.wait_beyond(
            follower.len(),
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("the follower did not grow");
    }
    assert_eq!(read_log(&follower), read_log(&child));
    follower.close().unwrap();
    child.close().unwrap();
    parent.close().unwrap();
    assert_eq!(store.read("p").unwrap().events.len(), 26);
    let mut torn = fs::read(&path).unwrap();
    torn.extend_from_slice(b"0000 {\"type\":\"x/n\",\"seq\":26");
    fs::write(&path, &torn).unwrap();
    let e = store.fork("p", 26, None).unwrap_err().to_string();
    assert!(e.ends_with("which ends at seq 25"), "{e}");
    store.fork("p", 25, Some("at-the-end")).unwrap();
    assert_eq!(store.read("at-the-end").unwrap().events.len(), 26);
}

#[test]
fn a_parent_with_shared_forks_is_deleted_only_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 3);
    p.close().unwrap();
    store.fork("p", 1, Some("b")).unwrap();
    store.fork("p", 2, Some("a")).unwrap();
    store.fork("a", 2, Some("a2")).unwrap();
    match store.delete("p") {
        Err(LogError::HasForks { id, forks }) => assert_eq!((id.as_str(), forks), ("p", vec!["a".to_string(), "b".to_string()])),
        other => panic!("expected HasForks, got {other:?}"),
    }
    let e = store.delete("a").unwrap_err().to_string();
    assert_eq!(e, "session \"a\" cannot be deleted: its fork \"a2\" read their first events from it; delete it first");
    assert!(store.exists("p").unwrap() && store.exists("a").unwrap());
    for id in ["a2", "a", "b", "p"] {
        store.delete(id).unwrap();
    }
    assert_eq!(store.list().unwrap(), Vec::<String>::new(), "the fork lock file is hidden");
}

#[test]
fn a_broken_parent_is_named_by_every_reader_of_its_fork() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 6);
    p.close().unwrap();
    store.fork("p", 3, Some("c")).unwrap();
    let path = store.path_of("p").unwrap();
    let original = fs::read(&path).unwrap();
    let broken = |what: &str| {
        for result in [store.read("c").map(|_| ()), store.open("c").map(|_| ()), store.follow("c").map(|_| ())] {
            match result {
                Err(LogError::BrokenFork { id, parent, seq, detail }) => {
                    assert_eq!((id.as_str(), parent.as_str(), seq), ("c", "p", 3));
                    assert!(detail.contains(what), "{detail}");
                }
                other => panic!("expected BrokenFork ({what}), got {other:?}"),
            }
        }
    };

    // Damage after the cut is none of the child's business.
    let start = |line: usize| original.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(line - 2).map(|(i, _)| i + 1).unwrap();
    let mut damaged = original.clone();
    damaged[start(7) + 3] ^= 1; // seq 5's checksum
    fs::write(&path, &damaged).unwrap();
    assert_eq!(store.read("c").unwrap().events.len(), 4);
    // Below the cut it is the parent's corruption, named in the parent's file.
    let mut damaged = original.clone();
    damaged[start(3) + 3] ^= 1; // seq 1
    fs::write(&path, &damaged).unwrap();
    match store.read("c") {
        Err(LogError::Corrupt { path: p, line: 3, seq: 1, .. }) => assert_eq!(p, path),
        other => panic!("expected the parent's corruption, got {other:?}"),
    }
    // Cut back below the cut (by hand: the store never does).
    fs::write(&path, &original[..start(4)]).unwrap();
    broken("it now ends at seq 1, before the cut");
    // Removed by hand, then another session under the same id.
    fs::remove_file(&path).unwrap();
    broken("the parent does not exist");
    let other = store.create(Some("p")).unwrap();
    fill(&other, 0, 6);
    other.close().unwrap();
    broken("is not the one forked");
    // The child is readable again once the parent's file is back; a repair of the parent
    // keeps its header, so the child reads on (placeholders where records were lost).
    fs::write(&path, &original).unwrap();
    assert_eq!(store.read("c").unwrap().events.len(), 4);
    let mut damaged = original.clone();
    damaged[start(4) + 3] ^= 1; // seq 2
    fs::write(&path, &damaged).unwrap();
    store.repair("p").unwrap();
    let events = store.read("c").unwrap().events;
    assert_eq!(events.len(), 4);
    assert_eq!(events[2].kind(), "log/damaged");
}

#[test]
fn old_copied_forks_and_plain_sessions_read_as_before_and_other_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 3);
    p.close().unwrap();
    assert_eq!(header_of(&store.path_of("p").unwrap())["version"], json!(1), "plain sessions stay version 1");
    // A fork as earlier versions wrote it: version 1, every record copied.
    let copied = store.path_of("old").unwrap();
    let mut text = framed(r#"{"type":"session","version":1,"id":"old","createdAt":5,"forkedFrom":{"id":"p","seq":1}}"#);
    for line in &lines(&store.path_of("p").unwrap())[1..3] {
        text.push_str(line);
        text.push('\n');
    }
    fs::write(&copied, &text).unwrap();
    assert_eq!(read(&store, "old"), read(&store, "p")[..2]);
    // It holds its own records: the parent may go.
    store.delete("p").unwrap();
    assert_eq!(store.read("old").unwrap().events.len(), 2);
    let log = store.open("old").unwrap();
    fill(&log, 9, 1);
    log.close().unwrap();

    let bad = store.path_of("bad").unwrap();
    fs::write(&bad, framed(r#"{"type":"session","version":3,"id":"bad","createdAt":5}"#)).unwrap();
    match store.read("bad") {
        Err(e @ LogError::UnsupportedFormat { found: 3, supported: 2, .. }) => {
            assert!(e.to_string().contains("reads versions 1 and 2"), "{e}");
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
    // Version 2 without the parent it needs is a damaged header.
    fs::write(&bad, framed(r#"{"type":"session","version":2,"id":"bad","createdAt":5,"forkedFrom":{"id":"old","seq":0}}"#)).unwrap();
    match store.read("bad") {
        Err(LogError::Corrupt { line: 1, seq: 0, detail, .. }) => assert!(detail.contains("parentHeader"), "{detail}"),
        other => panic!("expected a damaged header, got {other:?}"),
    }
    // A forged loop of parents is refused, not followed forever.
    let crc = |id: &str| String::from_utf8_lossy(&fs::read(store.path_of(id).unwrap()).unwrap()[..8]).into_owned();
    let x = r#"{"type":"session","version":2,"id":"x","createdAt":5,"forkedFrom":{"id":"y","seq":0},"parentHeader":"00000000"}"#;
    fs::write(store.path_of("x").unwrap(), framed(x)).unwrap();
    let y = format!(
        r#"{{"type":"session","version":2,"id":"y","createdAt":5,"forkedFrom":{{"id":"x","seq":0}},"parentHeader":"{}"}}"#,
        crc("x")
    );
    fs::write(store.path_of("y").unwrap(), framed(&y)).unwrap();
    let x = format!(
        r#"{{"type":"session","version":2,"id":"x","createdAt":5,"forkedFrom":{{"id":"y","seq":0}},"parentHeader":"{}"}}"#,
        crc("y")
    );
    fs::write(store.path_of("x").unwrap(), framed(&x)).unwrap();
    assert!(matches!(store.read("x"), Err(LogError::BrokenFork { .. })));
}

#[test]
fn a_fork_repairs_its_own_records_at_their_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let p = store.create(Some("p")).unwrap();
    fill(&p, 0, 4);
    p.close().unwrap();
    store.fork("p", 2, Some("c")).unwrap();
    let c = store.open("c").unwrap();
    fill(&c, 10, 4); // seqs 3..=6, lines 2..=5
    c.close().unwrap();
    let path = store.path_of("c").unwrap();
    let mut bytes = fs::read(&path).unwrap();
    let second = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let third = second + bytes[second..].iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes[third + 2] ^= 1; // seq 4
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(store.read("c"), Err(LogError::Corrupt { line: 3, seq: 4, .. })));
    let damaged = store.read_damaged("c").unwrap();
    let seqs: Vec<u64> = damaged.snapshot.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 5, 6]);
    let report = store.repair("c").unwrap();
    assert_eq!(report.lost.iter().map(|l| (l.seqs.start, l.seqs.end)).collect::<Vec<_>>(), [(4, 5)]);
    let events = store.read("c").unwrap().events;
    let kinds: Vec<&str> = events.iter().map(kerman::Event::kind).collect();
    assert_eq!(kinds, ["x/n", "x/n", "x/n", "x/n", "log/damaged", "x/n", "x/n", "log/repaired"]);
    assert_eq!(header_of(&path)["version"], json!(2), "the header is kept");
}
