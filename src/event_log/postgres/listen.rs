//! The LISTEN connection: a second connection per store, opened on first use, that receives
//! the NOTIFYs of the sessions this store follows (append channels) or owns (enqueue
//! channels) and hands each to its subscribers.
//!
//! It runs as a task on the store's runtime thread. A helper task polls the connection for
//! `AsyncMessage::Notification`s and forwards them into the same input channel that carries
//! subscribe/unsubscribe commands, so the task never has to wait on two things at once. When
//! the connection is lost it reconnects with backoff, LISTENs again on every channel and tells
//! every subscriber [`Note::Listening`]: notifications sent meanwhile are lost, so subscribers
//! treat that as "read what you missed". Subscribers run on the runtime thread and must only
//! queue work (submit a request), never block.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use md5::{Digest, Md5};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client};

use super::tls::Target;

/// What a subscriber hears.
pub enum Note {
    /// The channel is (again) being listened on: anything may have been missed before this.
    Listening,
    /// A notification, with its payload (a hint only: subscribers read the database).
    Notified(String),
}

pub type Subscriber = Arc<dyn Fn(Note) + Send + Sync>;

/// The channels of a session: commits (for followers), staged input (for the owner), and the
/// owner's answers to staged operations (for their requesters).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Channel {
    Appends,
    Enqueued,
    Outcomes,
}

/// The channel name for `session_id`: a fixed prefix and the md5 of the id, which the server
/// computes the same way in `pg_notify('kerman_a_' || md5(id), ...)`. Ids are any string, and
/// channel names are identifiers of at most 63 bytes, so the id itself cannot be the name.
pub fn channel_name(kind: Channel, session_id: &str) -> String {
    let prefix = match kind {
        Channel::Appends => "kerman_a_",
        Channel::Enqueued => "kerman_e_",
        Channel::Outcomes => "kerman_o_",
    };
    let digest = Md5::digest(session_id.as_bytes());
    let mut name = String::with_capacity(prefix.len() + 32);
    name.push_str(prefix);
    for b in &digest {
        let _ = write!(name, "{b:02x}");
    }
    name
}

/// What the LISTEN task is told: commands from the store, and news from its connection.
enum Input {
    /// Subscription `id`: tell `subscriber` about NOTIFYs on `channel`.
    Subscribe { id: u64, channel: String, subscriber: Subscriber },
    /// Ends subscription `id`.
    Unsubscribe { id: u64 },
    /// From the connection of generation `generation`.
    Notification { generation: u64, channel: String, payload: String },
    /// The connection of generation `generation` was lost.
    Lost { generation: u64 },
}

/// A fresh subscription id (unique in the process).
pub fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The store's listener, started by the first subscription (most stores never need one).
pub struct Lazy {
    target: Target,
    listener: Option<Listener>,
}

impl Lazy {
    pub fn new(target: Target) -> Lazy {
        Lazy { target, listener: None }
    }

    /// Must run on the runtime thread (it may spawn the task).
    pub fn get(&mut self) -> &Listener {
        let target = &self.target;
        self.listener.get_or_insert_with(|| Listener::start(target.clone()))
    }

    pub fn started(&self) -> Option<&Listener> {
        self.listener.as_ref()
    }
}

/// A handle on the LISTEN task. Commands are queued, never awaited.
pub struct Listener {
    tx: UnboundedSender<Input>,
}

const FIRST_DELAY: Duration = Duration::from_millis(50);
const MAX_DELAY: Duration = Duration::from_secs(5);

impl Listener {
    /// Spawns the task on the current (runtime) thread's runtime; it connects at once.
    pub fn start(mut target: Target) -> Listener {
        target.config.application_name(format!("kerman-listen-{}", std::process::id()));
        let (tx, rx) = unbounded_channel();
        tokio::spawn(run(target, rx, tx.clone()));
        Listener { tx }
    }

    pub fn subscribe(&self, id: u64, channel: String, subscriber: Subscriber) {
        let _ = self.tx.send(Input::Subscribe { id, channel, subscriber });
    }

    pub fn unsubscribe(&self, id: u64) {
        let _ = self.tx.send(Input::Unsubscribe { id });
    }
}

#[derive(Default)]
struct Subscriptions {
    by_channel: HashMap<String, Vec<(u64, Subscriber)>>,
    channel_of: HashMap<u64, String>,
}

impl Subscriptions {
    /// Adds one; true if its channel is new (needs a LISTEN).
    fn add(&mut self, id: u64, channel: String, subscriber: Subscriber) -> bool {
        self.channel_of.insert(id, channel.clone());
        let subs = self.by_channel.entry(channel).or_default();
        subs.push((id, subscriber));
        subs.len() == 1
    }

    /// Removes one; returns its channel if nobody else listens there (needs an UNLISTEN).
    fn remove(&mut self, id: u64) -> Option<String> {
        let channel = self.channel_of.remove(&id)?;
        let subs = self.by_channel.get_mut(&channel)?;
        subs.retain(|(i, _)| *i != id);
        if !subs.is_empty() {
            return None;
        }
        self.by_channel.remove(&channel);
        Some(channel)
    }

    fn tell(&self, channel: &str, note: impl Fn() -> Note) {
        for (_, subscriber) in self.by_channel.get(channel).into_iter().flatten() {
            subscriber(note());
        }
    }
}

async fn run(target: Target, mut rx: UnboundedReceiver<Input>, tx: UnboundedSender<Input>) {
    let mut subs = Subscriptions::default();
    let mut delay = FIRST_DELAY;
    let mut generation = 0u64;
    loop {
        generation += 1;
        let Ok(client) = connect(&target, generation, tx.clone()).await else {
            // Keep applying commands while waiting, so unsubscribes are not lost.
            let until = Instant::now() + delay;
            delay = (delay * 2).min(MAX_DELAY);
            loop {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(input)) => apply_offline(&mut subs, input),
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            continue;
        };
        let channels: Vec<String> = subs.by_channel.keys().cloned().collect();
        if listen(&client, &channels, "LISTEN").await.is_err() {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_DELAY);
            continue;
        }
        delay = FIRST_DELAY;
        for channel in &channels {
            subs.tell(channel, || Note::Listening);
        }
        // Serve this connection until it is lost (or the store ends: the sender side closes).
        loop {
            let Some(input) = rx.recv().await else { return };
            match input {
                Input::Subscribe { id, channel, subscriber } => {
                    let new = subs.add(id, channel.clone(), Arc::clone(&subscriber));
                    if new && listen(&client, &[channel], "LISTEN").await.is_err() {
                        break;
                    }
                    subscriber(Note::Listening);
                }
                Input::Unsubscribe { id } => {
                    if let Some(channel) = subs.remove(id) {
                        if listen(&client, &[channel], "UNLISTEN").await.is_err() {
                            break;
                        }
                    }
                }
                Input::Notification { generation: g, channel, payload } if g == generation => {
                    subs.tell(&channel, || Note::Notified(payload.clone()));
                }
                Input::Lost { generation: g } if g == generation => break,
                // From a connection already replaced.
                Input::Notification { .. } | Input::Lost { .. } => {}
            }
        }
        // Lost: wait a moment before reconnecting, so a server that is down is not hammered.
        tokio::time::sleep(FIRST_DELAY).await;
    }
}

/// Commands while there is no connection: only the bookkeeping (the next connect LISTENs).
fn apply_offline(subs: &mut Subscriptions, input: Input) {
    match input {
        Input::Subscribe { id, channel, subscriber } => drop(subs.add(id, channel, subscriber)),
        Input::Unsubscribe { id } => drop(subs.remove(id)),
        Input::Notification { .. } | Input::Lost { .. } => {}
    }
}

/// Connects (the target names the connection `kerman-listen-<pid>`, so an operator, or a test,
/// can find it in `pg_stat_activity`) and spawns the task that polls it for notifications.
async fn connect(target: &Target, generation: u64, tx: UnboundedSender<Input>) -> Result<Client, ()> {
    let (client, mut connection) = target.connect().await.map_err(|_| ())?;
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let input = Input::Notification { generation, channel: n.channel().to_string(), payload: n.payload().to_string() };
                    if tx.send(input).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return drop(tx.send(Input::Lost { generation })),
            }
        }
    });
    Ok(client)
}

/// `LISTEN`s or `UNLISTEN`s `channels` in one round trip. Names are `kerman_[ae]_<hex>`, safe
/// as bare identifiers.
async fn listen(client: &Client, channels: &[String], verb: &str) -> Result<(), tokio_postgres::Error> {
    if channels.is_empty() {
        return Ok(());
    }
    let mut sql = String::new();
    for c in channels {
        let _ = write!(sql, "{verb} {c};");
    }
    client.batch_execute(&sql).await
}
