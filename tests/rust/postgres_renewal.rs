//! Lease renewal against a real server: a store holding more leases than one renewal
//! statement extends keeps every one of them, and a lease an append extended lately is left
//! alone (the append did the renewal's work; updating the row again would lock it for nothing).

use std::time::Duration;

use kerman::event_log::postgres::{PgCore, PgOptions};

use crate::postgres_recovery::Admin;
use crate::postgres_store::{dsn, sample_events};

impl Admin {
    /// The row version of session `id` (its `xmin`): it changes whenever the row is updated.
    fn row_version(&self, id: &str) -> String {
        let row = self.rt.block_on(self.client.query_one("SELECT xmin::text FROM kerman_sessions WHERE id = $1", &[&id])).unwrap();
        row.get(0)
    }
}

fn core(dsn: &str, lease_ttl_ms: u64) -> PgCore {
    PgCore::connect(dsn, PgOptions { lease_ttl_ms, ..PgOptions::default() }).unwrap()
}

#[test]
fn leases_beyond_one_renewal_piece_all_stay_live() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    // Long enough a TTL that creating them all takes less than one.
    let ttl = Duration::from_secs(3);
    let c = core(&dsn, u64::try_from(ttl.as_millis()).unwrap());
    let ids: Vec<String> = (0..700).map(|_| c.create(None).unwrap().0.session_id).collect();
    // Only the renewals keep them now (this wait is the subject of the test: leases lapse
    // with time); every piece must run, not just the first.
    std::thread::sleep(2 * ttl);
    assert_eq!(admin.live_leases(&ids), ids.len() as i64, "some idle leases lapsed");
}

#[test]
fn a_lease_an_append_extended_lately_is_not_renewed_again() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    // Renewals every second; a lease extended within the last half second is left for the
    // next one (slack for a loaded machine: the appends below come every 50 ms or so).
    let c = core(&dsn, 3000);
    let (busy, _) = c.create(None).unwrap();
    let (idle, _) = c.create(None).unwrap();
    let idle_before = admin.row_version(&idle.session_id);
    let events = sample_events(60);
    let mut touched_between_appends = 0;
    for event in events.chunks(1) {
        c.append(&busy, event).unwrap();
        let after_append = admin.row_version(&busy.session_id);
        // Pacing, not synchronisation: several renewal ticks pass during the loop.
        std::thread::sleep(Duration::from_millis(40));
        if admin.row_version(&busy.session_id) != after_append {
            touched_between_appends += 1;
        }
    }
    assert_eq!(touched_between_appends, 0, "a renewal updated a lease appends kept fresh");
    assert_ne!(admin.row_version(&idle.session_id), idle_before, "the idle lease was never renewed");
}
