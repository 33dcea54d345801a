//! Trace and span ids derived from the session id and log positions, as `kerman.otel`'s Python
//! builder derives them (`_spans.py`), so both paths, and every export of a log, give the same
//! ids (docs/tracing.md, "Ids"). One SHA-256 per session gives a key of four 64-bit words; an
//! id is a word mixed with the seq by `SplitMix64`'s finaliser, a bijection of 64-bit integers:
//! the spans of one session never share an id (distinct seqs give distinct ids), and an id
//! costs a few multiplications instead of a hash.

use sha2::{Digest, Sha256};

/// `SplitMix64`'s finaliser (Steele, Lea and Flood, 2014): each step is invertible, so distinct
/// inputs give distinct outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The ids of one session: SHA-256 of `kerman\0{session}`, as four big-endian words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key([u64; 4]);

impl Key {
    pub fn new(session: &str) -> Key {
        let mut hasher = Sha256::new();
        hasher.update(b"kerman\0");
        hasher.update(session.as_bytes());
        let hash = hasher.finalize();
        let mut words = [0u64; 4];
        for (word, bytes) in words.iter_mut().zip(hash.chunks_exact(8)) {
            let mut be = [0u8; 8];
            be.copy_from_slice(bytes);
            *word = u64::from_be_bytes(be);
        }
        Key(words)
    }

    /// The trace id of the turn that started at `seq` (and of the turns that continue it):
    /// `mix(k1 ^ seq)` then `mix(k2 ^ seq)`, big-endian.
    pub fn trace(&self, seq: u64) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&mix(self.0[1] ^ seq).to_be_bytes());
        id[8..].copy_from_slice(&mix(self.0[2] ^ seq).to_be_bytes());
        valid(id)
    }

    /// The span id of the span that the event at `seq` opens: `mix(k0 ^ seq)`, big-endian.
    pub fn span(&self, seq: u64) -> [u8; 8] {
        valid(mix(self.0[0] ^ seq).to_be_bytes())
    }
}

/// 0 is the invalid id: the one seq whose id would be 0 (a chance of 2^-64 per session) gets 1.
fn valid<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

/// The trace id of the turn that started at `seq` in `session`.
pub fn trace_id(session: &str, seq: u64) -> [u8; 16] {
    Key::new(session).trace(seq)
}

/// The span id of the span that the event at `seq` of `session` opens.
pub fn span_id(session: &str, seq: u64) -> [u8; 8] {
    Key::new(session).span(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_session_keys_words_mixed_with_the_seq() {
        // Computed independently, in Python from docs/tracing.md's description:
        // k = sha256(b"kerman\0s").digest(); words k0..k3 big-endian; SplitMix64's finaliser.
        assert_eq!(u64::from_be_bytes(span_id("s", 7)), 0x2546_c2dc_e08b_f1d7);
        assert_eq!(u128::from_be_bytes(trace_id("s", 7)), 0x9658_fbba_a125_e8a8_435b_a860_f94e_7ba2);
        assert_eq!(u64::from_be_bytes(span_id("01a2519d-1edc-746e", 0)), 0x3174_5110_110b_98ad);
    }

    #[test]
    fn the_spans_of_a_session_never_share_an_id() {
        let key = Key::new("s");
        let mut seen: Vec<u64> = (0..100_000).map(|seq| u64::from_be_bytes(key.span(seq))).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
        assert_ne!(span_id("s", 7), span_id("t", 7));
        // the finaliser is a bijection: x=0 is its one fixed point at 0
        assert_eq!(mix(0), 0);
        assert_ne!(mix(1), mix(2));
    }
}
