//! Message ids: UUIDv7 (the millisecond clock, then random bits), sorted in the order a
//! process makes them.
//!
//! Random bits come from the OS in 4 KiB batches rather than one `getrandom` system call per
//! id: that call (~0.5 µs here) was 6–8% of a whole loop turn. The batch is never reused in a
//! forked child: a `pthread_atfork` handler bumps a generation counter that the next id checks,
//! so parent and child cannot hand out the same bits.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{SystemTime, UNIX_EPOCH};

const POOL: usize = 4096;
/// Bytes of randomness per id (73 of the 80 bits are used).
const TAKE: usize = 10;

struct State {
    generation: u64,
    pool: Box<[u8; POOL]>,
    used: usize,
    /// The last id's millisecond and random part: ids in the same millisecond count up from
    /// it, so ids sort in the order they were made (as `uuid::Uuid::now_v7` does).
    last_ms: u64,
    last: u128,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static FORKS: AtomicU64 = AtomicU64::new(0);
static WATCH_FORKS: Once = Once::new();

#[cfg(unix)]
extern "C" fn forked_child() {
    // Only an atomic add: safe in a child of a multi-threaded process.
    FORKS.fetch_add(1, Ordering::SeqCst);
}

fn watch_forks() {
    WATCH_FORKS.call_once(|| {
        #[cfg(unix)]
        // SAFETY: registers a handler that only increments an atomic.
        unsafe {
            libc::pthread_atfork(None, None, Some(forked_child));
        }
    });
}

fn fill(pool: &mut [u8]) {
    if getrandom::fill(pool).is_ok() {
        return;
    }
    // The OS generator failed (it practically never does): fall back to std's per-thread
    // hasher keys, which came from the OS earlier, over the clock and a counter, rather than
    // fail to make an id.
    let keys = std::collections::hash_map::RandomState::new();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    for (i, chunk) in pool.chunks_mut(8).enumerate() {
        let mut h = keys.build_hasher();
        h.write_u128(now);
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
    }
}

/// A new UUIDv7 in its text form.
pub fn new_id() -> String {
    watch_forks();
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let generation = FORKS.load(Ordering::SeqCst);
    let mut guard = STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let state = guard.get_or_insert_with(|| State { generation: u64::MAX, pool: Box::new([0; POOL]), used: POOL, last_ms: 0, last: 0 });
    let forked = state.generation != generation;
    if forked {
        // A fresh process (or a forked child): nothing of the old pool is reused.
        state.generation = generation;
        state.used = POOL;
    }
    let (ms, random) = if ms <= state.last_ms {
        // Same millisecond (or the clock stepped back): count up from the last id. A forked
        // child jumps a random 48-bit distance instead of 1, so it neither repeats the ids its
        // parent makes next nor sorts before the ids it inherited.
        let step = if forked { 1 + (take(state) & ((1 << 48) - 1)) } else { 1 };
        (state.last_ms, state.last + step)
    } else {
        // 73 random bits: the 74-bit field can then count up within a millisecond without
        // ever overflowing.
        (ms, take(state) & ((1 << 73) - 1))
    };
    state.last_ms = ms;
    state.last = random;
    drop(guard);
    uuid::Uuid::from_bytes(layout(ms, random)).to_string()
}

/// The next 80 bits of the pool, refilling it when it runs out.
fn take(state: &mut State) -> u128 {
    if state.used + TAKE > POOL {
        fill(&mut state.pool[..]);
        state.used = 0;
    }
    let mut bytes = [0u8; 16];
    bytes[..TAKE].copy_from_slice(&state.pool[state.used..state.used + TAKE]);
    state.used += TAKE;
    u128::from_le_bytes(bytes)
}

/// The RFC 9562 UUIDv7 layout: 48-bit milliseconds, version 7, 12 bits of `random`, the
/// variant, its other 62 bits.
#[allow(clippy::cast_possible_truncation, reason = "each field takes its low bits of `random`, masked")]
fn layout(ms: u64, random: u128) -> [u8; 16] {
    let rand_a = (random >> 62) as u16 & 0x0FFF;
    let rand_b = random as u64 & ((1 << 62) - 1);
    let mut out = [0u8; 16];
    out[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    out[6..8].copy_from_slice(&(0x7000 | rand_a).to_be_bytes());
    out[8..].copy_from_slice(&((0b10 << 62) | rand_b).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_v7_unique_and_sorted() {
        let ids: Vec<String> = (0..20_000).map(|_| new_id()).collect();
        let unique: HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "ids made one after another sort in that order");
        for id in &ids[..10] {
            let parsed = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(parsed.get_version_num(), 7);
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        }
    }

    #[test]
    fn a_new_generation_takes_fresh_random_bits() {
        let a = new_id();
        FORKS.fetch_add(1, Ordering::SeqCst);
        let b = new_id();
        // Not a continuation of `a`'s counter: the random part of `b` is fresh.
        let (ra, rb) = (uuid::Uuid::parse_str(&a).unwrap().as_u128(), uuid::Uuid::parse_str(&b).unwrap().as_u128());
        assert!(rb.wrapping_sub(ra) > 1 << 20, "{a} then {b}");
    }

    #[test]
    fn layout_puts_the_fields_where_the_rfc_says() {
        let id = uuid::Uuid::from_bytes(layout(0x0123_4567_89AB, (0xABC << 62) | 0x1234));
        assert_eq!(id.to_string(), "01234567-89ab-7abc-8000-000000001234");
    }
}
