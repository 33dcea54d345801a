//! File-system steps of the store: locking, atomic creation, directory syncs, backups.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::super::LogError;

/// Session files and their backups are private to their owner.
pub(super) const FILE_MODE: u32 = 0o600;

fn io_at(what: &str, path: &Path, e: std::io::Error) -> LogError {
    LogError::io(format!("{what} {}", path.display()), e)
}

/// Makes a directory entry change (link, unlink) durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_at("syncing directory", dir, e))
}

/// The session files (device, inode) that owning logs of this process hold locked, so that a
/// second opener here can be told that it is this process, not another, that holds one.
static HELD: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<HashSet<(u64, u64)>>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// In a forked child (from the atfork handler): the parent's logs hold nothing here. Takes
/// the lock only if free (another thread may have held it at the fork) and frees no memory.
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
pub(super) struct Hold(Option<(u64, u64)>, #[allow(dead_code)] super::forks::Registered, super::forks::Origin);

impl Hold {
    pub(super) fn new(file: &File) -> Hold {
        use std::os::fd::AsRawFd;
        let registered = super::forks::Registered::new(file.as_raw_fd());
        let key = file.metadata().ok().map(|m| (m.dev(), m.ino()));
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

/// What a directory entry is, for refusals ("a FIFO", "a symbolic link").
fn kind_of(file_type: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
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

/// Opens the session file at `path` without following a symbolic link and without blocking
/// (a FIFO would wait for a writer), then refuses anything that is not a regular file (a
/// device would read without bound). Descriptors are close-on-exec (as every `std` open is).
fn open_session(path: &Path, id: &str, write: bool) -> Result<File, LogError> {
    let opened = OpenOptions::new().read(true).write(write).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY).open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(LogError::NotFound { id: id.into() }),
        Err(e) => {
            // ELOOP (a link), EISDIR, ENXIO (a FIFO opened for writing with no reader), ...:
            // say what the entry is when it is not a regular file.
            return Err(match fs::symlink_metadata(path) {
                Ok(meta) if !meta.file_type().is_file() => not_regular(path, id, kind_of(meta.file_type())),
                _ => io_at("opening", path, e),
            });
        }
    };
    let meta = file.metadata().map_err(|e| io_at("inspecting", path, e))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, id, kind_of(meta.file_type())));
    }
    // Back to ordinary blocking I/O (O_NONBLOCK only mattered for the open itself).
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    unsafe {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

fn try_open_locked(path: &Path, id: &str) -> Result<Option<File>, LogError> {
    let file = open_session(path, id, true)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let here = file.metadata().ok().is_some_and(|m| held().as_ref().is_some_and(|s| s.contains(&(m.dev(), m.ino()))));
            return Err(if here { LogError::LockedHere { id: id.into() } } else { LogError::Locked { id: id.into() } });
        }
        Err(TryLockError::Error(e)) => return Err(io_at("locking", path, e)),
    }
    // A delete may have unlinked the file between our open and our lock; the lock only
    // counts for the file the name still points to.
    let ours = file.metadata().map_err(|e| io_at("inspecting", path, e))?;
    match fs::symlink_metadata(path) {
        Ok(named) if named.dev() == ours.dev() && named.ino() == ours.ino() => Ok(Some(file)),
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

fn create_private(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(FILE_MODE).open(path)?;
    // The umask may have narrowed the mode further; the contract is exactly 0600.
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Removes the temporary name however creation ends (after a link, the file lives on under
/// its final name).
struct TempGuard<'a>(&'a Path);

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0);
    }
}

/// Creates `dir/name` holding `contents`, all or nothing: written and synced under a hidden
/// temporary name, locked, then hard-linked into place (which fails if the name is taken) and
/// the directory synced. Returns the locked file; `Ok(None)` if the name already exists.
pub(super) fn create_locked(dir: &Path, name: &str, stem: &str, contents: &[u8]) -> Result<Option<File>, LogError> {
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
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(|e| io_at("writing", &tmp, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(io_at("locking", &tmp, ErrorKind::WouldBlock.into())),
        Err(TryLockError::Error(e)) => return Err(io_at("locking", &tmp, e)),
    }
    match fs::hard_link(&tmp, &target) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(io_at("linking", &target, e)),
    }
    drop(guard);
    sync_dir(dir)?;
    Ok(Some(file))
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
/// hidden temporary name, renamed over the old name, and the directory synced. Readers that
/// have the old file open keep reading the old file.
pub(super) fn replace(dir: &Path, name: &str, stem: &str, contents: &[u8]) -> Result<(), LogError> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{stem}.{}.tmp", random_hex()));
    let mut file = create_private(&tmp).map_err(|e| io_at("creating", &tmp, e))?;
    let guard = TempGuard(&tmp);
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(|e| io_at("writing", &tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| io_at("renaming over", &target, e))?;
    std::mem::forget(guard);
    sync_dir(dir)
}
