//! `FileStore::repair`, its dry run and damaged reads (docs/format.md, "Repairing
//! corruption"); what a repair keeps and sets aside is decided in `salvage.rs`.

use std::path::{Path, PathBuf};

use super::salvage::{self, Dropped, Lost};
use super::{format, fsio, names, sys, FileStore, Snapshot};
use crate::event_log::LogError;

/// What `repair` did (or, from [`FileStore::plan_repair`], would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Verified records kept, each at its own seq.
    pub kept_events: u64,
    /// Events in the file afterwards: the kept ones, a `log/damaged` placeholder per lost seq
    /// and, after corruption, the closing `log/repaired` record.
    pub events: u64,
    /// Bytes of the lines set aside plus the torn tail.
    pub removed_bytes: u64,
    /// Lines set aside (corruption only), in file order.
    pub dropped: Vec<Dropped>,
    /// Runs of seqs whose records are lost (each now holds a placeholder).
    pub lost: Vec<Lost>,
    /// The torn tail cut off the end, and the line it started on.
    pub torn_tail_bytes: u64,
    pub torn_tail_line: Option<u64>,
    /// The copy of the whole file as it was (corruption only).
    pub backup: Option<PathBuf>,
    /// The lines set aside, verbatim and in order (when there were any).
    pub quarantine: Option<PathBuf>,
}

/// A corrupt session read as far as it verifies (`FileStore::read_damaged`).
#[derive(Clone, Debug)]
pub struct DamagedSnapshot {
    /// Every verified record that continues the log, at its own seq (a lost seq is a gap).
    pub snapshot: Snapshot,
    /// What was skipped; `None` if nothing was (the file is not corrupt).
    pub skipped: Option<RepairReport>,
}

impl FileStore {
    /// Repairs session `id`'s file (docs/format.md, "Repairing corruption"). A torn tail is cut
    /// off. A corrupt file is first copied whole to `<file>.corrupt[.N]`; the lines that do not
    /// verify (or do not continue the log) go, verbatim, to `<file>.damaged[.N]`; every verified
    /// record is kept at its seq, each lost seq gets a `log/damaged` placeholder, and a
    /// `log/repaired` record naming everything set aside is appended; the new file replaces the
    /// old one atomically. A damaged header or another format version is refused: there is
    /// nothing to keep.
    ///
    /// A shared fork's repair looks at its own file only (the records it reads through its
    /// parent are the parent's to repair); a parent's repair keeps its header line and every
    /// record at its seq, so its forks read on (a placeholder where a record was lost).
    ///
    /// A file a crash left before the session's first sync (`format::unborn`) is not damaged:
    /// what it holds is a torn tail of an empty session. Its repair does what `open` does to it,
    /// writing the header again (made durable here at once), and reports those bytes removed.
    pub fn repair(&self, id: &str) -> Result<RepairReport, LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_locked(&path, id)?;
        let bytes = fsio::read_all(&file, &path)?;
        let (report, salvage) = Self::plan(&bytes, &path, id)?;
        if format::unborn(&bytes) {
            let line = format::header_line(&crate::event_log::new_header(id));
            sys::write_all_at(&file, &line, 0)
                .and_then(|()| file.set_len(line.len() as u64))
                .and_then(|()| file.sync_all())
                .map_err(|e| LogError::io(format!("writing the header of {} again", path.display()), e))?;
            fsio::sync_dir(&self.root)?;
            return Ok(report);
        }
        let Some(salvage) = salvage else {
            if report.torn_tail_bytes > 0 {
                fsio::truncate(&file, bytes.len() as u64 - report.torn_tail_bytes, &path)?;
            }
            return Ok(report);
        };
        let backup = fsio::write_backup(&path, "corrupt", &bytes)?;
        let set_aside: Vec<u8> =
            salvage.dropped.iter().flat_map(|d| &bytes[super::at(d.bytes.start)..super::at(d.bytes.end)]).copied().collect();
        let quarantine = match set_aside.is_empty() {
            true => None,
            false => Some(fsio::write_backup(&path, "damaged", &set_aside)?),
        };
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let repaired =
            salvage::rebuild(&bytes, &salvage, crate::event_log::now_ms(), &name(&backup), quarantine.as_deref().map(name).as_deref());
        let file_name = names::file_name(id)?;
        fsio::replace(&self.root, &file_name, &names::encode(id), &repaired, file)?;
        Ok(RepairReport { backup: Some(backup), quarantine, ..report })
    }

    /// What [`repair`](Self::repair) would do, without doing it: reads the file without a lock
    /// and writes nothing (`backup` and `quarantine` stay `None`).
    pub fn plan_repair(&self, id: &str) -> Result<RepairReport, LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_reader(&path, id)?;
        Self::plan(&fsio::read_all(&file, &path)?, &path, id).map(|(report, _)| report)
    }

    /// Reads session `id` as far as its records verify, without changing anything: for a
    /// corrupt file, every verified record that continues the log, and what was skipped. A
    /// damaged header or another format version is still an error.
    pub fn read_damaged(&self, id: &str) -> Result<DamagedSnapshot, LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_reader(&path, id)?;
        let bytes = fsio::read_all(&file, &path)?;
        let (report, salvage) = Self::plan(&bytes, &path, id)?;
        let Some(salvage) = salvage else { return self.read(id).map(|snapshot| DamagedSnapshot { snapshot, skipped: None }) };
        let mut events = self.inherited(id, salvage.parent.as_ref())?;
        events.extend(salvage.events());
        let snapshot =
            Snapshot { events, torn_tail_bytes: salvage.torn_bytes(), size_bytes: salvage.total_len, header: salvage.header, path };
        Ok(DamagedSnapshot { snapshot, skipped: Some(report) })
    }

    /// The repair of `bytes`: its report, and the salvage if the file is corrupt (a torn tail
    /// alone is cut exactly as `open` cuts it).
    fn plan(bytes: &[u8], path: &Path, id: &str) -> Result<(RepairReport, Option<salvage::Salvage>), LogError> {
        if format::unborn(bytes) {
            // An empty session whose every byte is a torn tail, as `read` shows it.
            let torn = bytes.len() as u64;
            let report = RepairReport {
                removed_bytes: torn,
                torn_tail_bytes: torn,
                torn_tail_line: (torn > 0).then_some(1),
                ..RepairReport::default()
            };
            return Ok((report, None));
        }
        let scan = format::scan(bytes, path, id)?;
        if scan.corruption(path).is_none() {
            let report = RepairReport {
                kept_events: scan.events.len() as u64,
                events: scan.events.len() as u64,
                removed_bytes: scan.bad_bytes(),
                torn_tail_bytes: scan.bad_bytes(),
                torn_tail_line: scan.invalid.as_ref().map(|i| i.line),
                ..RepairReport::default()
            };
            return Ok((report, None));
        }
        let s = salvage::salvage(bytes, path, id)?;
        let placeholders: u64 = s.lost.iter().map(|l| l.seqs.end - l.seqs.start).sum();
        let report = RepairReport {
            kept_events: s.kept.len() as u64,
            events: s.kept.len() as u64 + placeholders + 1,
            removed_bytes: s.dropped.iter().map(|d| d.bytes.end - d.bytes.start).sum::<u64>() + s.torn_bytes(),
            dropped: s.dropped.clone(),
            lost: s.lost.clone(),
            torn_tail_bytes: s.torn_bytes(),
            torn_tail_line: s.torn.map(|(_, line)| line),
            backup: None,
            quarantine: None,
        };
        Ok((report, Some(s)))
    }
}
