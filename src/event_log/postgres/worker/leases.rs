//! The leases a store holds, and when each was last extended.
//!
//! An append extends its session's lease as a side effect (`sql::append` sets `expires_at`),
//! so a session that is busy needs no renewal; the renewal extends only the leases nothing
//! else extended lately, in pieces (see [`RENEW_CHUNK`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::super::Lease;

/// How many leases one renewal statement extends. The statement holds those rows locked
/// until it commits, and an append or enqueue of one of them waits meanwhile: one statement
/// for a worker's thousands of leases took up to 190 ms under load, a few hundred take a few.
pub(super) const RENEW_CHUNK: usize = 256;

#[derive(Default)]
pub(super) struct Leases {
    /// Session id -> (epoch, when its lease was last extended: a statement that extends it
    /// was sent then, so the server's `now()` for it was later; `None`: not known).
    map: HashMap<String, (i64, Option<Instant>)>,
}

impl Leases {
    /// Holds `id` under `epoch`, extended at `at`.
    pub(super) fn hold(&mut self, id: &str, epoch: i64, at: Instant) {
        self.map.insert(id.to_string(), (epoch, Some(at)));
    }

    /// Holds `id` under `epoch`, extended at a time not known: due at the next renewal.
    pub(super) fn adopt(&mut self, id: &str, epoch: i64) {
        self.map.insert(id.to_string(), (epoch, None));
    }

    /// Notes that `lease` was extended at `at` (by an append or a renewal), if still held.
    pub(super) fn extended(&mut self, lease: &Lease, at: Instant) {
        self.extended_id(&lease.session_id, lease.epoch, at);
    }

    fn extended_id(&mut self, id: &str, epoch: i64, at: Instant) {
        if let Some(held) = self.map.get_mut(id) {
            if held.0 == epoch && held.1.is_none_or(|before| before < at) {
                held.1 = Some(at);
            }
        }
    }

    /// Stops holding `lease` if it is the one held.
    pub(super) fn release(&mut self, lease: &Lease) {
        if self.map.get(&lease.session_id).is_some_and(|held| held.0 == lease.epoch) {
            self.map.remove(&lease.session_id);
        }
    }

    /// Stops holding session `id`, whatever its epoch.
    pub(super) fn remove(&mut self, id: &str) {
        self.map.remove(id);
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(super) fn ids(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }

    /// The leases to renew now, as (id, epoch), in pieces of at most [`RENEW_CHUNK`]: those
    /// not extended within `fresh` (all of them when `fresh` is zero).
    pub(super) fn due(&self, now: Instant, fresh: Duration) -> Vec<Vec<(String, i64)>> {
        let stale = |at: &Option<Instant>| at.is_none_or(|at| now.saturating_duration_since(at) >= fresh);
        let due: Vec<(String, i64)> =
            self.map.iter().filter(|(_, (_, at))| stale(at)).map(|(id, (epoch, _))| (id.clone(), *epoch)).collect();
        due.chunks(RENEW_CHUNK).map(<[_]>::to_vec).collect()
    }

    /// Notes that the renewal sent at `at` extended these (id, epoch) leases.
    pub(super) fn renewed(&mut self, leases: &[(String, i64)], at: Instant) {
        for (id, epoch) in leases {
            self.extended_id(id, *epoch, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, epoch: i64) -> Lease {
        Lease { session_id: id.into(), owner: "o".into(), epoch }
    }

    #[test]
    fn only_leases_not_extended_lately_are_due_in_pieces() {
        let t0 = Instant::now();
        let mut leases = Leases::default();
        for i in 0..RENEW_CHUNK + 10 {
            leases.hold(&format!("s{i}"), 1, t0);
        }
        let later = t0 + Duration::from_secs(1);
        // Extended by an append a moment ago: not due.
        leases.extended(&lease("s0", 1), later);
        // A stale epoch's append extends nothing.
        leases.extended(&lease("s1", 7), later);
        let due = leases.due(later + Duration::from_millis(10), Duration::from_millis(500));
        assert_eq!(due.iter().map(Vec::len).collect::<Vec<_>>(), vec![RENEW_CHUNK, 9]);
        let ids: Vec<&str> = due.iter().flatten().map(|(id, _)| id.as_str()).collect();
        assert!(!ids.contains(&"s0") && ids.contains(&"s1"));
        // With no freshness window, everything is due.
        assert_eq!(leases.due(later, Duration::ZERO).iter().map(Vec::len).sum::<usize>(), RENEW_CHUNK + 10);
    }

    #[test]
    fn a_renewal_marks_what_it_extended_and_release_checks_the_epoch() {
        let t0 = Instant::now();
        let mut leases = Leases::default();
        leases.hold("a", 2, t0);
        leases.hold("b", 2, t0);
        leases.adopt("c", 2);
        let t1 = t0 + Duration::from_secs(1);
        leases.renewed(&[("a".into(), 2)], t1);
        let mut due = leases.due(t1, Duration::from_millis(500)).concat();
        due.sort();
        assert_eq!(due, vec![("b".to_string(), 2), ("c".to_string(), 2)]);
        leases.release(&lease("a", 1));
        assert!(leases.contains("a"));
        leases.release(&lease("a", 2));
        assert!(!leases.contains("a"));
    }
}
