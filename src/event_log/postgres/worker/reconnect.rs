//! Reconnecting the runtime thread's connection: jittered exponential backoff within the
//! store's reconnect budget, and telling a dropped connection from a statement's own error.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::config::Host;
use tokio_postgres::Config;

use super::super::sql::{self, Prepared};
use super::{within, Conn, Worker};
use crate::event_log::LogError;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Worker {
    /// The connection, reconnecting with jittered exponential backoff (bounded by the
    /// reconnect budget) if it is gone.
    pub(super) async fn connection(&mut self) -> Result<(), LogError> {
        if self.conn.as_ref().is_some_and(|c| !c.client.is_closed()) {
            return Ok(());
        }
        self.conn = None;
        let started = Instant::now();
        let deadline = started + self.reconnect_budget;
        let mut delay = FIRST_BACKOFF;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let last = match tokio::time::timeout_at(deadline.max(Instant::now() + FIRST_BACKOFF), self.reconnect()).await {
                Ok(Ok(conn)) => {
                    self.conn = Some(conn);
                    self.gave_up = false;
                    // Leases may have run down while the connection was away.
                    self.renew_held(Duration::ZERO).await;
                    return Ok(());
                }
                Ok(Err(e)) => e,
                Err(_) => "connect timed out".to_string(),
            };
            let pause = jitter(delay);
            if self.gave_up || Instant::now() + pause >= deadline {
                self.gave_up = true;
                return Err(LogError::Database {
                    context: format!("reconnect to {}", self.host),
                    detail: format!(
                        "gave up after {attempts} attempt(s) over {:.1} s; last error: {last}",
                        started.elapsed().as_secs_f64()
                    ),
                });
            }
            tokio::time::sleep(pause).await;
            delay = (delay * 2).min(MAX_BACKOFF);
        }
    }

    /// Extends the leases held that nothing extended within `fresh` (all of them if zero), a
    /// piece at a time, each within the request timeout; a piece that gets no reply gives the
    /// connection up (the next request reconnects). Whether it worked is not reported: a
    /// lapsed lease shows at the next append (refused if somebody took it).
    pub(super) async fn renew_held(&mut self, fresh: Duration) -> bool {
        // A copy: the renewal awaits, and other connections add and drop leases meanwhile.
        let pieces = super::lock(&self.shared.held).due(Instant::now(), fresh);
        let (limit, owner, ttl_ms) = (self.request_timeout, self.owner.as_str(), self.ttl_ms);
        for piece in pieces {
            let Some(conn) = self.conn.as_mut() else { return false };
            let sent = Instant::now();
            match within(limit, sql::renew(&mut conn.client, &piece, owner, ttl_ms)).await {
                // Rows skipped because they were locked stay due.
                Some(Ok(renewed)) => super::lock(&self.shared.held).renewed(&renewed, sent),
                Some(Err(_)) => return false,
                None => {
                    self.conn = None;
                    return false;
                }
            }
        }
        true
    }

    async fn reconnect(&self) -> Result<Conn, String> {
        let detail = |e: LogError| match e {
            LogError::Database { detail, .. } => detail,
            other => other.to_string(),
        };
        let (client, connection) = self.target.connect().await?;
        let task = super::drive(connection);
        let prepared = Prepared::new(&client, self.named).await.map_err(detail)?;
        Ok(Conn::new(client, prepared, task))
    }

    /// Whether the connection is gone (after a database error: the error may be the server's
    /// own, such as a constraint, on a healthy connection). Costs a round trip only then.
    pub(super) async fn lost(&mut self) -> bool {
        let Some(conn) = &self.conn else { return true };
        // No reply in time counts as gone, as for any request.
        let gone = conn.client.is_closed() || !matches!(within(self.request_timeout, conn.client.simple_query("")).await, Some(Ok(_)));
        if gone {
            self.conn = None;
        }
        gone
    }
}

/// host:port of the DSN's first host, for errors.
pub(super) fn host_of(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    // The driver's default port when the DSN names none.
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        #[cfg(unix)]
        Some(Host::Unix(_)) => format!("{host} (port {port})"),
        _ => format!("{host}:{port}"),
    }
}

/// A pause between `delay / 2` and `delay`, so stores cut off together do not reconnect in step.
fn jitter(delay: Duration) -> Duration {
    let r = getrandom::u64().unwrap_or(0) % 1000;
    delay / 2 + delay * (r as u32) / 2000
}
