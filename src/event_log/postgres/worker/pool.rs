//! Which connection of the pool serves a request.
//!
//! A request that names a session goes to the connection already serving a request of that
//! session, if one is in flight; otherwise to the least busy connection (ties to the lowest
//! index, so a store used by one caller at a time stays on its first connection and the
//! others are never opened). A session's requests therefore run one after another in
//! submission order, whatever the pool size: a new one moves to another connection only once
//! none of its earlier ones is left. Requests that name no session go to the least busy one,
//! and so do the plain reads of blocking callers (`exists`, `read`, a follower's first read,
//! `sessions`): nothing is submitted behind them, and they see every commit that completed
//! before they were made, so many threads reading one session need not queue.

use std::collections::HashMap;

use super::Request;

/// The busy count of every connection, and the connection of each session with requests in
/// flight (an entry lives only while its count is above zero, so the map stays small).
/// `renewing` marks the connection running the lease renewal: short (it skips locked rows),
/// so it is not counted busy, and a request picks it only when no other is as idle. Counted
/// busy, a renewal on the one free connection tied it with a connection stuck on a row lock,
/// and the tie went to the stuck one (the lower index): the request then waited out the lock.
pub(super) struct Routing {
    busy: Vec<usize>,
    renewing: Vec<bool>,
    sessions: HashMap<String, (usize, usize)>,
}

/// The key that orders LISTEN subscriptions among themselves (a subscribe before its
/// unsubscribe); no session id is empty, so it cannot collide with one.
const LISTENER: &str = "";

impl Routing {
    pub(super) fn new(size: usize) -> Routing {
        Routing { busy: vec![0; size], renewing: vec![false; size], sessions: HashMap::new() }
    }

    /// The connection for a request with this key (see [`key`]), counted busy until
    /// [`Routing::finished`].
    pub(super) fn pick(&mut self, key: Option<&str>) -> usize {
        if let Some((lane, n)) = key.and_then(|k| self.sessions.get_mut(k)) {
            *n += 1;
            self.busy[*lane] += 1;
            return *lane;
        }
        let lane = (0..self.busy.len()).min_by_key(|&i| (self.busy[i], self.renewing[i])).unwrap_or(0);
        self.busy[lane] += 1;
        if let Some(k) = key {
            self.sessions.insert(k.to_string(), (lane, 1));
        }
        lane
    }

    /// Whether `lane` should run the due lease renewal: it is the first idle connection (the
    /// one a request would get), or none is idle. If so it is marked renewing until
    /// [`Routing::renewed`].
    pub(super) fn claim_renewal(&mut self, lane: usize) -> bool {
        let first_idle = self.busy.iter().position(|&b| b == 0);
        if first_idle.is_some_and(|idle| idle != lane) {
            return false;
        }
        self.renewing[lane] = true;
        true
    }

    /// `lane`'s renewal is done.
    pub(super) fn renewed(&mut self, lane: usize) {
        self.renewing[lane] = false;
    }

    /// A request picked for `lane` with `key` has been served.
    pub(super) fn finished(&mut self, lane: usize, key: Option<&str>) {
        self.busy[lane] = self.busy[lane].saturating_sub(1);
        let Some(k) = key else { return };
        if let Some((_, n)) = self.sessions.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                self.sessions.remove(k);
            }
        }
    }
}

/// What orders `request` against others: its session id, the listener's key for
/// subscriptions, `None` for requests that may run anywhere at any time.
pub(super) fn key(request: &Request) -> Option<&str> {
    use Request as R;
    match request {
        R::Create { id, .. }
        | R::Fork { id, .. }
        | R::Open { id }
        | R::Delete { id }
        | R::ReadAfter { id, .. }
        | R::Enqueue { id, .. }
        | R::Staged { id }
        | R::StageOp { id, .. }
        | R::Outcome { id, .. }
        | R::Withdraw { id, .. }
        | R::Unpark { id }
        | R::MarkRunnable { id }
        | R::Deferred { id, .. } => Some(id),
        R::Append { lease, .. }
        | R::AppendStaged { lease, .. }
        | R::Release { lease }
        | R::Unstage { lease, .. }
        | R::Settle { lease, .. }
        | R::Park { lease, .. } => Some(&lease.session_id),
        R::Listen { .. } | R::Unlisten { .. } => Some(LISTENER),
        R::Read { .. } | R::Exists { .. } | R::Peek { .. } | R::Sessions { .. } => None,
        R::List | R::Take { .. } | R::Ping | R::InjectFault(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_stays_on_its_connection_while_it_has_requests_in_flight() {
        let mut r = Routing::new(3);
        assert_eq!(r.pick(Some("a")), 0);
        assert_eq!(r.pick(Some("b")), 1);
        assert_eq!(r.pick(Some("a")), 0, "behind a's first request");
        assert_eq!(r.pick(None), 2);
        r.finished(0, Some("a"));
        assert_eq!(r.pick(Some("a")), 0, "a still has one in flight there");
        r.finished(0, Some("a"));
        r.finished(0, Some("a"));
        r.finished(1, Some("b"));
        r.finished(2, None);
        assert!(r.sessions.is_empty());
        assert_eq!(r.busy, vec![0, 0, 0]);
        // Idle again: everything goes to the first connection.
        assert_eq!(r.pick(Some("b")), 0);
    }

    #[test]
    fn renewals_go_to_the_first_idle_connection_or_to_any_when_none_is_idle() {
        let mut r = Routing::new(3);
        assert!(!r.claim_renewal(1));
        assert!(r.claim_renewal(0));
        r.renewed(0);
        r.pick(Some("slow"));
        assert!(!r.claim_renewal(0) && !r.claim_renewal(2));
        assert!(r.claim_renewal(1));
        r.renewed(1);
        r.pick(None);
        r.pick(None);
        assert!(r.claim_renewal(0), "none idle: whoever looks");
    }

    #[test]
    fn a_request_goes_behind_a_renewal_rather_than_behind_a_stuck_request() {
        let mut r = Routing::new(2);
        assert_eq!(r.pick(Some("stuck")), 0);
        assert!(r.claim_renewal(1));
        assert_eq!(r.pick(Some("other")), 1, "the renewing connection, not the one stuck on a lock");
        r.renewed(1);
        r.finished(1, Some("other"));
        // Two idle connections, one renewing: the other one.
        r.finished(0, Some("stuck"));
        assert!(r.claim_renewal(0));
        assert_eq!(r.pick(None), 1);
    }

    #[test]
    fn with_one_connection_everything_goes_to_it() {
        let mut r = Routing::new(1);
        assert_eq!((r.pick(Some("a")), r.pick(None), r.pick(Some("b"))), (0, 0, 0));
    }
}
