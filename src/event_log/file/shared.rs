//! Forks that share their parent's records (format version 2, docs/format.md "Forks that
//! share"): the child's file holds its header, which names the parent, the cut and the
//! checksum of the parent's header line, and then only the child's own events; every reader
//! reads events `0..=cut` through the parent's file (verified as any read), then the child's.
//!
//! So `fork` costs the same whatever the parent's length: it reads the parent's header and its
//! last records (to check the cut), syncs the parent's file (the inherited records are the
//! child's too from now on) and writes one header line. The parent's file is never written.
//! In exchange, a session forks read through cannot be deleted before them (`delete` names
//! them), and a child whose parent is gone, replaced or cut back below the cut cannot be read
//! ([`LogError::BrokenFork`]).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::format::{self, Parent, PARENT_HEADER, SHARED_VERSION};
use super::{fsio, names, sys, FileStore};
use crate::event_log::{fork_beyond, fork_header, resolve_id, Event, LogError};

/// The hidden file in the root whose lock `fork` and `delete` take, so that a delete cannot
/// miss a fork of the session being created meanwhile.
const FORKS_LOCK: &str = ".forks.lock";

/// How much of a file's end `fork` reads first when looking for its last record.
const TAIL_WINDOW: u64 = 64 * 1024;

fn io_at(what: &str, path: &Path, e: std::io::Error) -> LogError {
    LogError::io(format!("{what} {}", path.display()), e)
}

impl FileStore {
    /// The store's fork lock, held until the returned file is dropped.
    pub(super) fn forks_lock(&self) -> Result<File, LogError> {
        let path = self.root.join(FORKS_LOCK);
        let file = sys::open_lock_file(&path).map_err(|e| io_at("opening", &path, e))?;
        file.lock().map_err(|e| io_at("locking", &path, e))?;
        Ok(file)
    }

    /// Makes session `child` a fork of `id` at `at_seq` sharing its records (see the module).
    pub(super) fn fork_shared(&self, id: &str, at_seq: u64, new_id: Option<&str>) -> Result<String, LogError> {
        let parent_path = self.path_of(id)?;
        let child = resolve_id(new_id)?;
        let name = names::file_name(&child)?;
        if self.root.join(&name).symlink_metadata().is_ok() {
            return Err(LogError::Exists { id: child });
        }
        let _forks = self.forks_lock()?;
        let file = fsio::open_reader(&parent_path, id)?;
        let line = header_line(&file, &parent_path)?;
        let header = format::parse_header(&line, &parent_path, id)?;
        let total = file.metadata().map_err(|e| io_at("inspecting", &parent_path, e))?.len();
        let len = committed_len(&file, &parent_path, total, line.len() as u64 + 1, header.base())?;
        if at_seq >= len {
            return Err(fork_beyond(id, at_seq, len));
        }
        // The inherited records are the child's from now on: they must survive a crash of the
        // parent's owner (whose durability mode may not have synced them yet).
        sys::sync_reader(&file).map_err(|e| io_at("syncing", &parent_path, e))?;
        let mut child_header = fork_header(&child, id, at_seq);
        child_header.insert("version".into(), Value::from(SHARED_VERSION));
        let crc = String::from_utf8_lossy(&line[..8]).into_owned();
        child_header.insert(PARENT_HEADER.into(), Value::String(crc));
        let bytes = format::header_line(&child_header);
        // Synced now: a fork's header is all of it, and `fork` returns its id as made.
        match fsio::create_locked(&self.root, &name, &names::encode(&child), &bytes, fsio::Durable::Now, |file, _| Ok(file))? {
            Some(_unlocked_on_drop) => Ok(child),
            None => Err(LogError::Exists { id: child }),
        }
    }

    /// Puts the events a shared fork reads through its parent before `scan`'s own (nothing to
    /// do for any other file).
    pub(super) fn inherit(&self, id: &str, scan: &mut format::Scan) -> Result<(), LogError> {
        let mut events = self.inherited(id, scan.parent.as_ref())?;
        if !events.is_empty() {
            events.append(&mut scan.events);
            scan.events = events;
        }
        Ok(())
    }

    /// The events session `id` reads through `parent` (none when it is no shared fork).
    pub(super) fn inherited(&self, id: &str, parent: Option<&Parent>) -> Result<Vec<Event>, LogError> {
        match parent {
            Some(parent) => self.prefix(id, parent, &mut vec![id.to_string()]),
            None => Ok(Vec::new()),
        }
    }

    /// Events `0..=parent.seq` of session `parent.id`, read for its fork `child`.
    fn prefix(&self, child: &str, parent: &Parent, seen: &mut Vec<String>) -> Result<Vec<Event>, LogError> {
        let broken = |detail: String| LogError::BrokenFork { id: child.into(), parent: parent.id.clone(), seq: parent.seq, detail };
        // Each step of a chain asks for no more than the one before, so only a forged file
        // can loop; refuse it rather than recurse forever.
        if seen.contains(&parent.id) {
            return Err(broken("its chain of parents loops back to a session already read".into()));
        }
        seen.push(parent.id.clone());
        let path = self.path_of(&parent.id)?;
        let file = match fsio::open_reader(&path, &parent.id) {
            Err(LogError::NotFound { .. }) => return Err(broken("the parent does not exist (its file was removed by hand?)".into())),
            other => other?,
        };
        let bytes = fsio::read_all(&file, &path)?;
        if bytes.get(..8) != Some(parent.header_crc.as_bytes()) {
            return Err(broken("the session under that id is not the one forked (its header line changed)".into()));
        }
        let count = parent.seq + 1;
        let mut scan = format::scan_upto(&bytes, &path, &parent.id, Some(count))?;
        if let Some(err) = scan.corruption(&path) {
            return Err(err);
        }
        let end = scan.base + scan.events.len() as u64;
        if end < count {
            let has = if end == 0 { "it has no events".to_string() } else { format!("it now ends at seq {}", end - 1) };
            return Err(broken(format!("{has}, before the cut (it was cut back after the fork)")));
        }
        let own = usize::try_from(count.saturating_sub(scan.base)).unwrap_or(usize::MAX).min(scan.events.len());
        scan.events.truncate(own);
        let mut events = match &scan.parent {
            // The parent is a shared fork too: its first events (up to the cut, at most) are
            // its own parent's.
            Some(grand) => {
                let upto = Parent { seq: grand.seq.min(parent.seq), ..grand.clone() };
                self.prefix(&parent.id, &upto, seen)?
            }
            None => Vec::new(),
        };
        events.append(&mut scan.events);
        Ok(events)
    }

    /// The shared forks that read through session `id`'s current file, sorted.
    pub(super) fn forks_of(&self, id: &str, file: &File, path: &Path) -> Result<Vec<String>, LogError> {
        let line = header_line(file, path)?;
        let crc = &line[..line.len().min(8)];
        let mut forks = Vec::new();
        for other in super::Store::list(self)? {
            if other == id {
                continue;
            }
            // A file that cannot be read is no reader of this one's records as far as anyone
            // can tell: `open` of it fails on its own account.
            let Ok(other_path) = self.path_of(&other) else { continue };
            let Ok(other_file) = fsio::open_reader(&other_path, &other) else { continue };
            let Ok(other_line) = header_line(&other_file, &other_path) else { continue };
            let Ok(header) = format::parse_header(&other_line, &other_path, &other) else { continue };
            if header.parent.is_some_and(|p| p.id == id && p.header_crc.as_bytes() == crc) {
                forks.push(other);
            }
        }
        Ok(forks)
    }
}

/// A file's first line, without its newline (read a little at a time: only the header).
fn header_line(file: &File, path: &Path) -> Result<Vec<u8>, LogError> {
    let total = file.metadata().map_err(|e| io_at("inspecting", path, e))?.len();
    let mut line = Vec::new();
    let mut chunk = 4096u64;
    while (line.len() as u64) < total {
        let at = line.len() as u64;
        let mut buf = vec![0u8; usize::try_from(chunk.min(total - at)).unwrap_or(usize::MAX)];
        sys::read_exact_at(file, &mut buf, at).map_err(|e| io_at("reading", path, e))?;
        if let Some(end) = buf.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buf[..end]);
            return Ok(line);
        }
        line.extend_from_slice(&buf);
        chunk *= 2;
    }
    let detail = if total == 0 { "the file is empty" } else { "header: unterminated line" };
    Err(LogError::Corrupt { path: path.to_path_buf(), line: 1, seq: 0, detail: detail.into() })
}

/// How many events a reader of the file would see (the seq after its last record that
/// verifies; `base` when none does), reading from the end: a torn or incomplete last record is
/// skipped as readers skip it. `body` is where the first event's line starts.
fn committed_len(file: &File, path: &Path, total: u64, body: u64, base: u64) -> Result<u64, LogError> {
    let mut window = TAIL_WINDOW;
    loop {
        let start = total.saturating_sub(window).max(body);
        let mut buf = vec![0u8; usize::try_from(total - start).unwrap_or(usize::MAX)];
        sys::read_exact_at(file, &mut buf, start).map_err(|e| io_at("reading", path, e))?;
        // Unless the window reaches the first event, its first line may be cut: skip it.
        let first = match (start == body, buf.iter().position(|&b| b == b'\n')) {
            (true, _) => 0,
            (false, Some(i)) => i + 1,
            (false, None) => {
                window = window.saturating_mul(4);
                continue;
            }
        };
        // Complete lines only: whatever follows the last newline is a write in progress.
        let mut end = buf.iter().rposition(|&b| b == b'\n');
        while let Some(stop) = end.filter(|&stop| stop >= first) {
            let begin = buf[first..stop].iter().rposition(|&b| b == b'\n').map_or(first, |i| first + i + 1);
            let parsed = format::unframe(&buf[begin..stop]).and_then(|json| Event::from_json(json, &mut |k: &str| Arc::<str>::from(k)));
            if let Ok(event) = parsed {
                return Ok(event.seq + 1);
            }
            end = begin.checked_sub(1);
        }
        if start == body {
            return Ok(base);
        }
        window = window.saturating_mul(4);
    }
}
