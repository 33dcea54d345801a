//! Trace and span ids derived from the session id and log positions: the first bytes of
//! SHA-256 over `kerman\0{session}\0{what}\0{seq}`, as `kerman.otel`'s Python builder derives
//! them (`_digest`), so both paths, and every export of a log, give the same ids.

use sha2::{Digest, Sha256};

fn digest<const N: usize>(session: &str, what: &str, key: u64) -> [u8; N] {
    let mut hasher = Sha256::new();
    hasher.update(b"kerman\0");
    hasher.update(session.as_bytes());
    hasher.update(b"\0");
    hasher.update(what.as_bytes());
    hasher.update(b"\0");
    hasher.update(itoa::Buffer::new().format(key).as_bytes());
    let hash = hasher.finalize();
    let mut id = [0u8; N];
    id.copy_from_slice(&hash[..N]);
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1; // 0 is the invalid id
    }
    id
}

/// The trace id of the turn that started at `seq` (and of the turns that continue it).
pub fn trace_id(session: &str, seq: u64) -> [u8; 16] {
    digest(session, "trace", seq)
}

/// The span id of the span that the event at `seq` opens.
pub fn span_id(session: &str, seq: u64) -> [u8; 8] {
    digest(session, "span", seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_leading_bytes_of_the_digest() {
        // sha256("kerman\0s\0span\07") computed independently (Python's hashlib).
        let full = Sha256::digest(b"kerman\0s\0span\x007");
        assert_eq!(span_id("s", 7), full[..8]);
        assert_eq!(trace_id("s", 7)[..], Sha256::digest(b"kerman\0s\0trace\x007")[..16]);
        assert_ne!(span_id("s", 7), span_id("s", 8));
    }
}
