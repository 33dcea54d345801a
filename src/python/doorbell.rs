//! A self-pipe that wakes an event loop without the GIL.
//!
//! `call_soon_threadsafe` needs the GIL on the calling thread, and the loop thread, woken by
//! it, then waits for that thread to let the GIL go: two hand-offs where one will do. A writer
//! thread that rings a [`Doorbell`] only writes a byte to a pipe; the loop, which watches the
//! read end with `add_reader`, wakes and runs the callback itself.

#[cfg(unix)]
mod imp {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    pub struct Doorbell {
        read: OwnedFd,
        write: OwnedFd,
    }

    fn nonblocking_cloexec(fd: RawFd) -> io::Result<()> {
        // SAFETY: `fd` is an open descriptor owned by the caller; these calls only set flags.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    impl Doorbell {
        pub fn new() -> io::Result<Doorbell> {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: `fds` has room for the two descriptors `pipe` writes.
            if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: both descriptors were just opened and are owned by nothing else.
            let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            nonblocking_cloexec(read.as_raw_fd())?;
            nonblocking_cloexec(write.as_raw_fd())?;
            Ok(Doorbell { read, write })
        }

        /// The descriptor the event loop watches.
        pub fn fd(&self) -> RawFd {
            self.read.as_raw_fd()
        }

        /// Wakes the loop. Any thread, no GIL. A full pipe already has a wake-up pending.
        pub fn ring(&self) {
            // SAFETY: writes one byte from a live buffer to a descriptor we own.
            let _ = unsafe { libc::write(self.write.as_raw_fd(), b"\0".as_ptr().cast(), 1) };
        }

        /// Empties the pipe (on the loop thread, before looking at what the rings were for).
        pub fn clear(&self) {
            let mut buf = [0u8; 64];
            // SAFETY: reads into a live buffer of the given length; the descriptor is non-blocking.
            while unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } == buf.len() as isize {}
        }
    }
}

#[cfg(not(unix))]
mod imp {
    /// No self-pipe here: callers fall back to `call_soon_threadsafe`.
    pub struct Doorbell;

    impl Doorbell {
        pub fn new() -> std::io::Result<Doorbell> {
            Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no self-pipe on this platform"))
        }
        pub fn fd(&self) -> i64 {
            -1
        }
        pub fn ring(&self) {}
        pub fn clear(&self) {}
    }
}

pub use imp::Doorbell;
