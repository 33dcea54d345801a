//! The Windows side of the store's file-system steps (the same functions as `sys_unix.rs`;
//! docs/durability.md, "Windows", says what differs for users).
//!
//! * The owner's lock is the sharing mode of its handle, not a byte-range lock: Windows'
//!   `LockFileEx` (what std's `File::try_lock` uses) is mandatory, so a locked file could not
//!   be read by `read` and `follow`, which must never stand in an owner's way. An owner opens
//!   the file for writing sharing only reading and deleting; a second owner (any process)
//!   then fails to open it with `ERROR_SHARING_VIOLATION`, while readers, which share
//!   everything, open and read it freely. The lock ends when the handle is closed, as an
//!   `flock` ends with its descriptor.
//! * Links are never followed: session files are opened with `FILE_FLAG_OPEN_REPARSE_POINT`,
//!   so a symbolic link or junction is opened itself and then refused (std reports it as a
//!   symlink from its reparse tag), as `O_NOFOLLOW` refuses one on Unix.
//! * A file's identity is (volume serial number, file index) from
//!   `GetFileInformationByHandle`, the counterpart of (device, inode); std keeps its own
//!   accessors for them unstable, hence windows-sys.
//! * There is no directory fsync: see [`sync_dir`].
//! * No mode bits: new files and folders take the ACL they inherit from the store's folder.

use std::fs::{self, File, Metadata, OpenOptions, TryLockError};
use std::io;
use std::os::windows::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Foundation::ERROR_SHARING_VIOLATION;
use windows_sys::Win32::Storage::FileSystem::{
    GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE,
    FILE_SHARE_READ, FILE_SHARE_WRITE,
};

/// What an owner's handle lets others do: read (readers, followers) and delete or rename the
/// name (std's own opens share deleting too), but not open the file for writing.
const OWNER_SHARING: u32 = FILE_SHARE_READ | FILE_SHARE_DELETE;
/// Readers stand in nobody's way.
const READER_SHARING: u32 = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;

/// A file's identity (volume serial number, file index), the same for every name and handle
/// of it on NTFS. (ReFS has 128-bit file ids, of which this keeps the low 64 bits.)
pub(super) type Key = (u64, u64);

/// The identity of an open file.
pub(super) fn key_of_file(file: &File) -> io::Result<Key> {
    // SAFETY: an all-zero BY_HANDLE_FILE_INFORMATION is a valid value (integers only).
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open for the duration of the call (`file` is borrowed), and
    // `info` is a valid out-pointer of the type the function writes.
    if unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((u64::from(info.dwVolumeSerialNumber), u64::from(info.nFileIndexHigh) << 32 | u64::from(info.nFileIndexLow)))
}

/// The identity of the entry at `path`, not following a link. Opened with no access to the
/// data, which no sharing mode refuses (the way std's `symlink_metadata` looks at a file).
pub(super) fn key_at(path: &Path) -> io::Result<Key> {
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(READER_SHARING)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)?;
    key_of_file(&file)
}

/// Whether an entry is something a session file may be: a regular file, not a link (a
/// symbolic link or junction, opened itself, is a symlink to std).
pub(super) fn is_regular(meta: &Metadata) -> bool {
    meta.file_type().is_file()
}

/// What an entry that is not a regular file is, for refusals.
pub(super) fn kind_of(meta: &Metadata) -> &'static str {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        "a symbolic link or junction"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// Opens a session file without following a link; for writing, it is the owner's lock too.
/// Handles are not inherited by child processes (std opens them so).
pub(super) fn open_session(path: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .share_mode(if write { OWNER_SHARING } else { READER_SHARING })
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)
}

/// Whether a failed `open_session(.., true)` means that another owner (in this process or
/// another) holds the file: its handle does not share writing.
pub(super) fn is_held_elsewhere(e: &io::Error) -> bool {
    e.raw_os_error() == Some(ERROR_SHARING_VIOLATION as i32)
}

/// The owner's handle is its lock (taken by the open), so there is nothing more to take.
pub(super) fn try_lock(_file: &File) -> Result<(), TryLockError> {
    Ok(())
}

/// The lock ends with the handle.
pub(super) fn unlock(_file: &File) {}

/// Creates a new file (its ACL inherited from the folder), locked from the start: the
/// temporary file of a creation is an owner's from its first byte.
pub(super) fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create_new(true).share_mode(OWNER_SHARING).open(path)
}

/// Creates the store's directory (and its parents), its ACL inherited from its parent.
pub(super) fn create_dir(root: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).create(root)
}

/// Nothing to do: Windows cannot flush a directory (`FlushFileBuffers` needs a handle with
/// write access, which a directory does not give). NTFS journals its metadata, so a create,
/// link, rename or delete is never half done after a crash, but the latest of them may be
/// undone by one (the journal reaches the disk within seconds, or at the next flush of any
/// file on the volume). File data is flushed as on Unix.
pub(super) fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// A directory held for a later [`sync_open_dir`] (nothing to hold: see [`sync_dir`]).
pub(super) struct Dir;

pub(super) fn open_dir(_dir: &Path) -> io::Result<Dir> {
    Ok(Dir)
}

/// [`sync_dir`] on a directory opened beforehand: a no-op, as [`sync_dir`].
pub(super) fn sync_open_dir(_dir: &Dir) -> io::Result<()> {
    Ok(())
}

/// `seek_write` may write less than asked; it also moves the handle's cursor, which nothing
/// else uses (the store reads and writes at explicit offsets after the first full read).
pub(super) fn write_all_at(file: &File, mut bytes: &[u8], mut offset: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        match file.seek_write(bytes, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn read_exact_at(file: &File, mut bytes: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        match file.seek_read(bytes, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                bytes = &mut bytes[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The last write time (in 100 ns units since 1601).
pub(super) fn modified(meta: &Metadata) -> (i64, i64) {
    (meta.last_write_time() as i64, 0)
}

/// Opens (creating it if missing) the store's hidden lock file; `File::lock` locks it (a
/// mandatory lock is fine here: nothing reads this file).
pub(super) fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)
}

/// Nothing to do: `FlushFileBuffers` needs write access, which a reader's handle lacks (and
/// asking for it would be an owner's lock). A shared fork on Windows therefore relies on the
/// parent's owner's own durability mode for the records it inherits (docs/durability.md).
pub(super) fn sync_reader(_file: &File) -> io::Result<()> {
    Ok(())
}
