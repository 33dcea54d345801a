//! The POSIX side of the store's file-system steps (`sys_windows.rs` is the other side; both
//! offer the same functions, so `fsio.rs`, `follow.rs` and `writer.rs` hold no `cfg`).
//!
//! The owner's lock is an `flock` on its descriptor (std's `File::try_lock`), advisory, so
//! readers open and read freely.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Session files and their backups are private to their owner.
const FILE_MODE: u32 = 0o600;

/// A file's identity (device, inode), the same for every name and descriptor of it.
pub(super) type Key = (u64, u64);

fn key_of(meta: &Metadata) -> Key {
    (meta.dev(), meta.ino())
}

/// The identity of the entry at `path`, not following a symbolic link.
pub(super) fn key_at(path: &Path) -> io::Result<Key> {
    fs::symlink_metadata(path).map(|m| key_of(&m))
}

/// The identity of an open file.
pub(super) fn key_of_file(file: &File) -> io::Result<Key> {
    file.metadata().map(|m| key_of(&m))
}

/// Whether an entry is something a session file may be: a regular file, not a link.
pub(super) fn is_regular(meta: &Metadata) -> bool {
    meta.file_type().is_file()
}

/// What an entry that is not a regular file is, for refusals ("a FIFO", "a symbolic link").
pub(super) fn kind_of(meta: &Metadata) -> &'static str {
    let file_type = meta.file_type();
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

/// Opens a session file without following a symbolic link (ELOOP) and without blocking (a
/// FIFO would wait for a writer), then puts the descriptor back to blocking I/O.
/// Descriptors are close-on-exec (as every `std` open is).
pub(super) fn open_session(path: &Path, write: bool) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(write).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
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

/// Whether a failed `open_session(.., true)` means that another owner holds the file (never
/// here: the lock is taken after the open, by [`try_lock`]).
pub(super) fn is_held_elsewhere(_e: &io::Error) -> bool {
    false
}

/// Takes the owner's exclusive lock without waiting.
pub(super) fn try_lock(file: &File) -> Result<(), TryLockError> {
    file.try_lock()
}

/// Releases the owner's lock (closing the descriptor would too; this is explicit so that the
/// lock is gone before the fork table forgets the descriptor).
pub(super) fn unlock(file: &File) {
    let _ = file.unlock();
}

/// Creates a new file readable and writable by its owner only (exactly 0600).
pub(super) fn create_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(FILE_MODE).open(path)?;
    // The umask may have narrowed the mode further; the contract is exactly 0600.
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Creates the store's directory (and its parents): 0700 for the directories created here
/// (the umask can only narrow it); an existing folder keeps the mode it was given.
pub(super) fn create_dir(root: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(root)
}

/// Makes a directory entry change (create, link, unlink, rename) durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// A directory held open for a later [`sync_open_dir`]: that sync then needs no descriptor
/// (none may be left by then) and reaches the directory the name was linked in.
pub(super) struct Dir(File);

pub(super) fn open_dir(dir: &Path) -> io::Result<Dir> {
    File::open(dir).map(Dir)
}

/// [`sync_dir`] on a directory opened beforehand.
pub(super) fn sync_open_dir(dir: &Dir) -> io::Result<()> {
    dir.0.sync_all()
}

pub(super) fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    file.write_all_at(bytes, offset)
}

pub(super) fn read_exact_at(file: &File, bytes: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(bytes, offset)
}

/// The modification time, as precisely as the file system keeps it.
pub(super) fn modified(meta: &Metadata) -> (i64, i64) {
    (meta.mtime(), meta.mtime_nsec())
}

/// Opens (creating it, 0600, if missing) the store's hidden lock file.
pub(super) fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Makes what was written to a file durable through a descriptor opened only for reading
/// (`fdatasync` needs no write access).
pub(super) fn sync_reader(file: &File) -> io::Result<()> {
    file.sync_data()
}
