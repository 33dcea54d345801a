//! A self-pipe that wakes an event loop without the GIL.
//!
//! `call_soon_threadsafe` needs the GIL on the calling thread, and the loop thread, woken by
//! it, then waits for that thread to let the GIL go: two hand-offs where one will do. A writer
//! thread that rings a [`Doorbell`] only writes a byte to a pipe; the loop, which watches the
//! read end with `add_reader`, wakes and runs the callback itself.

#[cfg(unix)]
mod imp {
    use std::io::{self, PipeReader, PipeWriter, Read, Write};
    use std::os::fd::{AsRawFd, RawFd};

    /// Both ends of the pipe, non-blocking (`std::io::pipe` opens them close-on-exec).
    pub struct Doorbell {
        read: PipeReader,
        write: PipeWriter,
    }

    fn nonblocking(fd: RawFd) -> io::Result<()> {
        // std has no `set_nonblocking` for pipes, hence fcntl.
        // SAFETY: `fd` is an open descriptor the caller owns and keeps open for the call;
        // F_GETFL and F_SETFL only read and set its status flags, and no memory is passed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    impl Doorbell {
        pub fn new() -> io::Result<Doorbell> {
            // A pipe, not `UnixStream::pair` (which `set_nonblocking` would make safe too): a
            // one-byte write to a socket costs ~1.2 µs here, to a pipe ~0.25 µs.
            let (read, write) = io::pipe()?;
            nonblocking(read.as_raw_fd())?;
            nonblocking(write.as_raw_fd())?;
            Ok(Doorbell { read, write })
        }

        /// The descriptor the event loop watches.
        pub fn fd(&self) -> RawFd {
            self.read.as_raw_fd()
        }

        /// Wakes the loop. Any thread, no GIL. A full pipe already has a wake-up pending.
        pub fn ring(&self) {
            let _ = (&self.write).write(&[0]);
        }

        /// Empties the pipe (on the loop thread, before looking at what the rings were for).
        pub fn clear(&self) {
            let mut buf = [0u8; 64];
            // The read end is non-blocking: an empty pipe ends the loop with `WouldBlock`.
            while matches!((&self.read).read(&mut buf), Ok(n) if n == buf.len()) {}
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
