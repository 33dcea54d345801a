//! What a forked child inherits of this process's session files (docs/guide.md, "Processes
//! and fork").
//!
//! `fork()` copies the descriptors of every open log but none of their writer or follower
//! threads. Two things follow, and both are handled here:
//!
//! * An inherited descriptor refers to the same open file description as the parent's, and a
//!   `flock` belongs to the open file description: as long as any copy stays open the lock
//!   stays held, so a child would keep its (dead) parent's sessions locked. A `pthread_atfork`
//!   child handler therefore points every owning log's descriptor at `/dev/null` (`dup3`, so
//!   the number stays taken and close-on-exec) the moment the child starts, before any of its
//!   code runs. The parent's lock is untouched (closing a copy never unlocks).
//! * A log's threads are gone in the child, so waiting for them would hang, and joining them
//!   panics. Every backend records the fork [`generation`] it was started in; one that sees
//!   another refuses appends and flushes with `LogError::Forked` and closes without touching
//!   its threads or locks (their state may have been mid-update at the fork).
//!
//! Every descriptor the store opens is close-on-exec (`std` opens with `O_CLOEXEC`).
//!
//! Windows has no fork (a child process inherits no handle the store opens), so there the
//! generation never changes and the table stays empty.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;

/// Incremented in every forked child (by the atfork handler).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The descriptors of the owning logs of this process (-1: a free slot). A fixed table of
/// atomics, because the child handler may take no lock (another thread may have held it at
/// the fork). A process with more owning logs open than slots leaves the rest registered
/// nowhere: its children keep those locks (documented).
const SLOTS: usize = 4096;
static FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

static INSTALL: Once = Once::new();

/// The fork generation of this process: equal to the one a backend recorded at start exactly
/// when this is the process that started it.
pub(super) fn generation() -> u64 {
    INSTALL.call_once(|| {
        #[cfg(unix)]
        // SAFETY: registers a handler that only performs async-signal-safe calls.
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    GENERATION.load(Ordering::SeqCst)
}

/// The process id the owner of a backend started in, and its generation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Origin {
    pub pid: u32,
    generation: u64,
}

impl Origin {
    pub(super) fn here() -> Origin {
        Origin { pid: std::process::id(), generation: generation() }
    }

    /// Whether this is a forked child of the process that made `self`.
    pub(super) fn forked(&self) -> bool {
        GENERATION.load(Ordering::SeqCst) != self.generation
    }
}

/// An owning log's descriptor in the table, for as long as the guard lives: drop it after
/// the lock is released and before the descriptor is closed (so a fork in between cannot
/// clobber a reused descriptor number, and an inherited copy holds no lock).
pub(super) struct Registered(Option<usize>, Origin);

impl Registered {
    pub(super) fn new(file: &std::fs::File) -> Registered {
        #[cfg(unix)]
        let fd = std::os::fd::AsRawFd::as_raw_fd(file);
        #[cfg(not(unix))]
        let (fd, _) = (-1, file);
        generation();
        if fd < 0 {
            return Registered(None, Origin::here());
        }
        for (i, slot) in FDS.iter().enumerate() {
            if slot.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return Registered(Some(i), Origin::here());
            }
        }
        Registered(None, Origin::here())
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // In a child the table was emptied at the fork (and the slot may be reused since).
        if let (Some(i), false) = (self.0, self.1.forked()) {
            FDS[i].store(-1, Ordering::SeqCst);
        }
    }
}

/// The atfork child handler: async-signal-safe calls only (open, dup3, close).
#[cfg(unix)]
extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    super::fsio::forget_held();
    // SAFETY: plain descriptor syscalls on numbers this process registered; the path is a
    // NUL-terminated literal.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        for slot in &FDS {
            let fd = slot.swap(-1, Ordering::SeqCst);
            if fd < 0 {
                continue;
            }
            if null < 0 || replace(null, fd) < 0 {
                // Without /dev/null, closing still drops the reference; the number stays
                // unused by us (the child's copy of the log never touches it again).
                libc::close(fd);
            }
        }
        if null >= 0 {
            libc::close(null);
        }
    }
}

/// Points descriptor `fd` at `null`'s open file, close-on-exec; negative on failure.
///
/// # Safety
///
/// `fd` is a descriptor of a log registered in `FDS`, which nothing in this (child) process
/// uses any more, and `null` is open: async-signal-safe calls on descriptors only.
#[cfg(target_os = "linux")]
unsafe fn replace(null: i32, fd: i32) -> i32 {
    // SAFETY: the caller's contract; `dup3` takes no memory.
    unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) }
}

/// As on Linux, with `dup2` and then `fcntl` (no `dup3` here).
///
/// # Safety
///
/// As for the Linux `replace`.
#[cfg(all(unix, not(target_os = "linux")))]
unsafe fn replace(null: i32, fd: i32) -> i32 {
    // SAFETY: the caller's contract; neither call takes memory.
    unsafe {
        let r = libc::dup2(null, fd);
        if r >= 0 {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        r
    }
}
