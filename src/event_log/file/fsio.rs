//! File-system steps of the store: locking, atomic creation, directory syncs, backups.

use std::collections::HashSet;
use std::fs::{self, File, TryLockError};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::super::LogError;
use super::sys::{self, create_private, Key};

fn io_at(what: &str, path: &Path, e: std::io::Error) -> LogError {
    LogError::io(format!("{what} {}", path.display()), e)
}

/// Makes a directory entry change (link, unlink) durable (a no-op on Windows, which has no
/// directory sync: see `sys_windows::sync_dir`).
pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    sys::sync_dir(dir).map_err(|e| io_at("syncing directory", dir, e))
}

/// The session files (their [`Key`]s: device and inode, or their Windows counterparts) that
/// owning logs of this process hold locked, so that a second opener here can be told that it
/// is this process, not another, that holds one.
static HELD: Mutex<Option<HashSet<Key>>> = Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<HashSet<Key>>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// In a forked child (from the atfork handler): the parent's logs hold nothing here. Takes
/// the lock only if free (another thread may have held it at the fork) and frees no memory.
#[cfg(unix)]
pub(super) fn forget_held() {
    if let Ok(mut held) = HELD.try_lock() {
        if let Some(set) = held.as_mut() {
            set.clear();
        }
    }
}

/// An owning log's entry in [`HELD`] and its descriptor's in the fork table
/// (`forks.rs`); taken as soon as the lock is, and dropped after the file is unlocked but
/// before it is closed.
pub(super) struct Hold(Option<Key>, #[allow(dead_code)] super::forks::Registered, super::forks::Origin);

impl Hold {
    pub(super) fn new(file: &File) -> Hold {
        let registered = super::forks::Registered::new(file);
        let key = sys::key_of_file(file).ok();
        if let Some(key) = key {
            held().get_or_insert_with(HashSet::new).insert(key);
        }
        Hold(key, registered, super::forks::Origin::here())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.2.forked() {
            return;
        }
        if let (Some(key), Some(set)) = (self.0, held().as_mut()) {
            set.remove(&key);
        }
    }
}

/// Opens session `id`'s file at `path` read-write and takes its exclusive advisory lock
/// without waiting: the one owner of a session (also `delete` and `repair`).
pub(super) fn open_locked(path: &Path, id: &str) -> Result<File, LogError> {
    // A name replaced under us (deleted and created again) is simply opened again.
    for _ in 0..3 {
        if let Some(file) = try_open_locked(path, id)? {
            return Ok(file);
        }
    }
    Err(LogError::Locked { id: id.into() })
}

/// Opens session `id`'s file read-only, taking no lock: readers never stand in an owner's way
/// (the file only grows by whole records, and each record carries its checksum).
pub(super) fn open_reader(path: &Path, id: &str) -> Result<File, LogError> {
    open_session(path, id, false)
}

fn not_regular(path: &Path, id: &str, kind: &str) -> LogError {
    LogError::io(
        format!("refusing session {id:?} at {}", path.display()),
        std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("it is {kind}, not a regular file (session files are never opened through links; remove or rename it)"),
        ),
    )
}

/// Opens the session file at `path` without following a link (and, on Unix, without blocking:
/// a FIFO would wait for a writer), then refuses anything that is not a regular file (a device
/// would read without bound). On Windows an open for writing is the owner's lock, and fails
/// with [`LogError::Locked`] (or `LockedHere`) while another owner holds the file.
fn open_session(path: &Path, id: &str, write: bool) -> Result<File, LogError> {
    let file = match sys::open_session(path, write) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(LogError::NotFound { id: id.into() }),
        Err(e) if write && sys::is_held_elsewhere(&e) => return Err(locked(sys::key_at(path).ok(), id)),
        Err(e) => {
            // ELOOP (a link), EISDIR, ENXIO (a FIFO opened for writing with no reader), a
            // directory refused on Windows, ...: say what the entry is when it is not a
            // regular file.
            return Err(match fs::symlink_metadata(path) {
                Ok(meta) if !sys::is_regular(&meta) => not_regular(path, id, sys::kind_of(&meta)),
                _ => io_at("opening", path, e),
            });
        }
    };
    let meta = file.metadata().map_err(|e| io_at("inspecting", path, e))?;
    if !sys::is_regular(&meta) {
        return Err(not_regular(path, id, sys::kind_of(&meta)));
    }
    Ok(file)
}

/// The error for a session file (identified by `key`) that another owner holds: `LockedHere`
/// when that owner is a log of this process.
fn locked(key: Option<Key>, id: &str) -> LogError {
    let here = key.is_some_and(|key| held().as_ref().is_some_and(|s| s.contains(&key)));
    if here {
        LogError::LockedHere { id: id.into() }
    } else {
        LogError::Locked { id: id.into() }
    }
}

fn try_open_locked(path: &Path, id: &str) -> Result<Option<File>, LogError> {
    let file = open_session(path, id, true)?;
    match sys::try_lock(&file) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(locked(sys::key_of_file(&file).ok(), id)),
        Err(TryLockError::Error(e)) => return Err(io_at("locking", path, e)),
    }
    // A delete may have unlinked the file between our open and our lock; the lock only
    // counts for the file the name still points to. (On Windows the open is the lock, so this
    // always holds, but costs little to confirm.)
    let ours = sys::key_of_file(&file).map_err(|e| io_at("inspecting", path, e))?;
    match sys::key_at(path) {
        Ok(named) if named == ours => Ok(Some(file)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(LogError::NotFound { id: id.into() }),
        Err(e) => Err(io_at("inspecting", path, e)),
    }
}

pub(super) fn read_all(mut file: &File, path: &Path) -> Result<Vec<u8>, LogError> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| io_at("reading", path, e))?;
    Ok(bytes)
}

/// Cuts `file` to `len` bytes and makes that durable.
pub(super) fn truncate(file: &File, len: u64, path: &Path) -> Result<(), LogError> {
    file.set_len(len).and_then(|()| file.sync_data()).map_err(|e| io_at("truncating", path, e))
}

/// Removes the temporary name however creation ends (after a link, the file lives on under
/// its final name).
struct TempGuard<'a>(&'a Path);

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0);
    }
}

/// When [`create_locked`] makes the new file and its name durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durable {
    /// Before it returns: the file is synced before the link, the directory after it.
    Now,
    /// Later, by the file's owner: nothing is synced here, and `start` is handed the directory,
    /// held open, to sync after the file at its first durable write (a session's name becomes
    /// durable with its first durable record; until then a crash of the machine may leave no
    /// session, or a file holding part of its header, which `open` takes for a session created
    /// anew: see [`super::format::unborn`]).
    Later,
}

/// Creates `dir/name` holding `contents`, all or nothing: written (and, [`Durable::Now`],
/// synced) under a hidden temporary name, locked, handed to `start` (the session's writer),
/// then hard-linked into place (which fails if the name is taken); the temporary name is
/// removed and, `Durable::Now`, the directory synced. Returns what `start` made of the locked
/// file; `Ok(None)` if the name already exists.
///
/// Everything that can fail runs before the link, except `Durable::Now`'s directory sync: if
/// that fails, the name is unlinked again (while `start`'s owner still holds the lock, so
/// nobody can have opened the session meanwhile) before the error is returned, so a failed
/// create leaves no session and the same create can be tried again. With `Durable::Later`
/// nothing can fail after the link (the directory is opened before it).
pub(super) fn create_locked<T>(
    dir: &Path,
    name: &str,
    stem: &str,
    contents: &[u8],
    durable: Durable,
    start: impl FnOnce(File, Option<sys::Dir>) -> Result<T, LogError>,
) -> Result<Option<T>, LogError> {
    let target = dir.join(name);
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let tmp = dir.join(format!(".{stem}.{}.tmp", random_hex()));
        match create_private(&tmp) {
            Ok(file) => break (tmp, file),
            // A leftover or concurrent temporary with the same name: draw another.
            Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(io_at("creating", &tmp, e)),
        }
    };
    let guard = TempGuard(&tmp);
    let written = match durable {
        Durable::Now => file.write_all(contents).and_then(|()| file.sync_all()),
        Durable::Later => file.write_all(contents),
    };
    written.map_err(|e| io_at("writing", &tmp, e))?;
    match sys::try_lock(&file) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(io_at("locking", &tmp, ErrorKind::WouldBlock.into())),
        Err(TryLockError::Error(e)) => return Err(io_at("locking", &tmp, e)),
    }
    let held = match durable {
        Durable::Now => None,
        Durable::Later => Some(sys::open_dir(dir).map_err(|e| io_at("opening directory", dir, e))?),
    };
    // Declared after `guard`, so on every early return it goes first: its lock is released
    // before the temporary name is removed.
    let owner = start(file, held)?;
    match fs::hard_link(&tmp, &target) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(io_at("linking", &target, e)),
    }
    drop(guard);
    if durable == Durable::Now {
        if let Err(e) = sys::sync_dir(dir) {
            return Err(unlink_after(dir, &target, e));
        }
    }
    Ok(Some(owner))
}

/// Undoes a link whose directory sync failed with `error`: the error to report, saying that
/// the session was not created (or, if the name cannot be removed, that it was).
fn unlink_after(dir: &Path, target: &Path, error: std::io::Error) -> LogError {
    let context = format!("syncing directory {} after creating {}", dir.display(), target.display());
    match fs::remove_file(target) {
        Ok(()) => {
            // Best effort: the link may not have reached the disk either (its sync failed).
            let _ = sys::sync_dir(dir);
            LogError::io(format!("{context} (undone: the session was not created)"), error)
        }
        Err(undo) => LogError::io(format!("{context} (and removing it again failed: {undo}; the session exists)"), error),
    }
}

/// 12 random lowercase hex digits (the random tail of a UUIDv7).
fn random_hex() -> String {
    let simple = uuid::Uuid::now_v7().simple().to_string();
    simple[simple.len() - 12..].to_string()
}

/// Writes `bytes` (a copy of a session file, or the lines `repair` set aside) to the first free
/// `<path>.<suffix>[.N]`, durably.
pub(super) fn write_backup(path: &Path, suffix: &str, bytes: &[u8]) -> Result<PathBuf, LogError> {
    let base = path.as_os_str().to_os_string();
    for n in 0..10_000u32 {
        let mut name = base.clone();
        name.push(if n == 0 { format!(".{suffix}") } else { format!(".{suffix}.{n}") });
        let backup = PathBuf::from(name);
        let mut file = match create_private(&backup) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_at("creating", &backup, e)),
        };
        file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| io_at("writing", &backup, e))?;
        if let Some(dir) = backup.parent() {
            sync_dir(dir)?;
        }
        return Ok(backup);
    }
    Err(io_at("finding a free backup name for", path, ErrorKind::AlreadyExists.into()))
}

/// Replaces the file at `dir/name` with `contents`, all or nothing: written and synced under a
/// hidden temporary name, renamed over the old name, and the directory synced. `owner` is the
/// old file's locked handle, released once the new file is in place; readers that have the
/// old file open keep reading the old file.
///
/// On Windows the owner's handle is closed just before the rename: without POSIX rename
/// semantics (FAT and exFAT, older Windows, Wine) a file cannot be renamed over while any
/// handle has it open, ours included. A rival owner that opens the old file in that moment
/// finds it corrupt (it is what is being repaired) and makes the rename fail, not succeed
/// wrongly; so does a reader holding the old file open there.
pub(super) fn replace(dir: &Path, name: &str, stem: &str, contents: &[u8], owner: File) -> Result<(), LogError> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{stem}.{}.tmp", random_hex()));
    let mut file = create_private(&tmp).map_err(|e| io_at("creating", &tmp, e))?;
    let guard = TempGuard(&tmp);
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(|e| io_at("writing", &tmp, e))?;
    drop(file);
    let owner = if cfg!(windows) {
        drop(owner);
        None
    } else {
        Some(owner)
    };
    fs::rename(&tmp, &target).map_err(|e| io_at("renaming over", &target, e))?;
    std::mem::forget(guard);
    let synced = sync_dir(dir);
    drop(owner);
    synced
}
