//! Shipping: every tick, to every aggregator replica, over the wire stream
//! ([`kpulse_wire::stream`]).
//!
//! # Use
//!
//! ```no_run
//! # async fn demo(tick: kpulse_agent::ship::Tick) -> Result<(), kpulse_agent::ship::tls::TlsError> {
//! use std::sync::Arc;
//! use kpulse_agent::ship::{self, Credentials, Replicas, ShipConfig, Shipper};
//!
//! let tls = ship::tls::client_config(&ship::tls::TlsOptions {
//!     ca_file: Some("/etc/kpulse/ca.crt".into()),
//!     ..Default::default()
//! })?;
//! let mut config = ShipConfig::new(
//!     Replicas::Service { host: "kpulse-aggregator.kube-system.svc".into(), port: 443 },
//!     tls,
//! );
//! config.credentials = Credentials::TokenFile("/var/run/secrets/kpulse/token".into());
//! let shipper = Shipper::spawn(config, ship::hello("node-1", "kpulse-agent demo"));
//! shipper.publish(tick); // once per tick; never blocks
//! shipper.shutdown(std::time::Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```
//!
//! A load generator simulating many agents in one process spawns one [`Shipper`] per
//! simulated node, sharing one [`ShipMetrics`] (and, when identities allow, one TLS
//! configuration), with [`Credentials::Token`] or a per-node client certificate; each
//! publishes its own [`Tick`]s. A shipper costs one supervisor task plus one task and one
//! HTTP/2 connection per replica.
//!
//! # What happens
//!
//! - **Replicas**: a static list ([`Replicas::Static`], `--server`), or a headless Service's
//!   DNS name resolved to all its A/AAAA records every [`ShipConfig::resolve_interval`]
//!   ([`Replicas::Service`], `--server-service`); a replica task is started for each new
//!   address and stopped for each address gone. A failed resolution keeps the current set.
//! - **Per replica, one task**: TCP → TLS (ALPN h2) → HTTP/2 → `POST`
//!   [`STREAM_PATH`](kpulse_wire::stream::STREAM_PATH) whose request body is fed from a small
//!   bounded channel: [`Hello`], a [`Snapshot`](kpulse_wire::stream::Snapshot) of the latest
//!   tick (the full state at connect time), then one [`Update`](kpulse_wire::stream::Update)
//!   per tick (encoded once per tick and shared by every stream whose server holds the
//!   tick's pod set; a stream behind on pod changes encodes its own). Response
//!   frames are read: `Welcome` is checked for the version, `Error` is logged.
//! - **Identity**: the token file (`--token-file`, a projected ServiceAccount token) is
//!   re-read on every connect, because kubelet rotates it, and sent as
//!   `Authorization: Bearer` (marked sensitive: never indexed by HPACK, never logged); or a
//!   client certificate in the TLS configuration.
//! - **Queues and drops**: each replica reads ticks from its own bounded queue of
//!   [`ShipConfig::queue_ticks`] (a `tokio::sync::broadcast` receiver): when a replica falls
//!   behind, the *oldest* ticks are dropped and counted
//!   (`kpulse_agent_dropped_ticks_total{replica}`). No metadata is lost with them: every
//!   tick carries the full pod set ([`PodSet`], shared, not copied), and each stream diffs
//!   it against what *it* last sent, so the next Update carries every upsert and removal
//!   that happened meanwhile.
//! - **Reconnects**: jittered exponential backoff ([`Backoff`]: 200 ms doubling to 30 s,
//!   full jitter, reset once a stream stayed up 60 s; refused connections — nothing
//!   listening, as while a replica restarts — only up to 2 s for about a minute, so the
//!   agents are back soon after a restarted replica listens); a new stream starts with a
//!   new Snapshot. A stream whose body cannot be written for [`Timeouts::stall`] is abandoned.
//! - **Logs**: state changes only. A refusal (identity, version) or an `Error` frame is
//!   one ERROR line; the same failure again is logged at DEBUG until something changes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use kpulse_wire::{
    stream::{Hello, PodCounters, VERSION},
    NodeSample,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::pki_types::ServerName;
use tokio::{
    sync::{broadcast, watch},
    task::JoinSet,
};

use crate::attribute::PodSet;

mod session;
pub mod tls;

pub use session::StreamError;

/// One tick of a node: what every replica is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    /// The node's totals.
    pub node: NodeSample,
    /// Every pod attributed now (metadata). Share one `Arc` across ticks while the set is
    /// unchanged: streams then skip the diff.
    pub pods: Arc<PodSet>,
    /// Counters of the pods measured this tick.
    pub counters: Vec<PodCounters>,
}

/// Where the replicas are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// Fixed `host:port` entries, one replica each (resolved at every connect).
    Static(Vec<String>),
    /// A headless Service: every A/AAAA record of `host` is a replica on `port`.
    Service {
        /// `name.namespace.svc` (or any DNS name).
        host: String,
        /// The port.
        port: u16,
    },
}

/// What the agent presents besides its TLS client certificate. `Debug` never shows a token.
#[derive(Clone, Default)]
pub enum Credentials {
    /// Nothing (mTLS only, or a test server).
    #[default]
    None,
    /// A bearer token re-read from this file at every connect.
    TokenFile(PathBuf),
    /// A fixed bearer token (load generators).
    Token(Arc<str>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::TokenFile(p) => f.debug_tuple("TokenFile").field(p).finish(),
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Reconnect delays: full jitter over an exponentially growing cap.
///
/// Two counts grow the cap ([`Retry`]): failures that cost the replica something (a
/// handshake, a refusal, a stream cut), up to [`Backoff::max`]; and connections refused in a
/// row (nothing listens on the replica's port: the kernel's reset, which costs the replica
/// nothing), only up to [`Backoff::refused_max`]. So a replica that restarts after a healthy
/// stream has its agents back within about `refused_max` of listening, not after a cap that
/// doubled while it was down. Two limits keep that fast lane for restarts:
/// - the refusals' cap is never below the failures' previous one: agents whose streams keep
///   failing (a replica crash-looping under them) spread their returns as before;
/// - after [`Backoff::refused_fast`] refusals in a row (about a minute), refusals count as
///   failures: a replica down that long is gone or crash-looping, and an address that always
///   refuses (a wrong port) is not knocked on every second for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first cap.
    pub initial: Duration,
    /// The largest cap.
    pub max: Duration,
    /// The largest cap after connections refused in a row.
    pub refused_max: Duration,
    /// Refusals in a row that back off up to [`Backoff::refused_max`]; later ones count as
    /// failures.
    pub refused_fast: u32,
    /// A stream that stayed up this long resets the cap to `initial`.
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            // On average one SYN a second from each agent to a replica that is down...
            refused_max: Duration::from_secs(2),
            // ...for about a minute (the first four caps are shorter).
            refused_fast: 64,
            reset_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The cap after `failures` consecutive failures (0 = the first retry).
    pub fn cap(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// A delay uniformly drawn from `[0, cap(failures)]`.
    pub fn delay(&self, failures: u32, rng: &mut fastrand::Rng) -> Duration {
        jitter(self.cap(failures), rng)
    }
}

/// A delay uniformly drawn from `[0, cap]`.
fn jitter(cap: Duration, rng: &mut fastrand::Rng) -> Duration {
    let cap = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=cap))
}

/// One replica's reconnect state: what [`Backoff`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// Failures in a row, refused connections not counted (until there are
    /// [`Backoff::refused_fast`] of them).
    pub failures: u32,
    /// Connections refused in a row.
    pub refusals: u32,
}

impl Retry {
    /// The cap of the next delay after an attempt that failed; `refused`: its connection
    /// was refused at every address (nothing listening), else it failed or ended otherwise.
    /// Counts the attempt.
    pub fn next_cap(&mut self, refused: bool, backoff: &Backoff) -> Duration {
        if refused && self.refusals < backoff.refused_fast {
            // Never below the cap the failures had reached before this run of refusals.
            let floor = backoff
                .refused_max
                .max(backoff.cap(self.failures.saturating_sub(1)));
            self.refusals += 1;
            return backoff.cap(self.refusals - 1).min(floor);
        }
        let cap = backoff.cap(self.failures);
        self.failures = self.failures.saturating_add(1);
        if !refused {
            self.refusals = 0;
        }
        cap
    }

    /// The delay before the next attempt: [`Retry::next_cap`] with full jitter.
    pub fn after(&mut self, refused: bool, backoff: &Backoff, rng: &mut fastrand::Rng) -> Duration {
        jitter(self.next_cap(refused, backoff), rng)
    }

    /// A stream that stayed up [`Backoff::reset_after`]: the next failure starts over.
    pub fn reset(&mut self) {
        *self = Retry::default();
    }
}

/// Time limits of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// DNS resolution.
    pub resolve: Duration,
    /// TCP connect, per address.
    pub connect: Duration,
    /// TLS and HTTP/2 handshakes, then the response headers.
    pub handshake: Duration,
    /// Longest wait to hand one frame to the connection before the stream is abandoned.
    pub stall: Duration,
    /// HTTP/2 PING interval (dead peers are noticed within interval + timeout).
    pub keepalive_interval: Duration,
    /// HTTP/2 PING timeout.
    pub keepalive_timeout: Duration,
    /// On shutdown, how long a stream waits for the server to end its response.
    pub close: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            resolve: Duration::from_secs(5),
            connect: Duration::from_secs(5),
            handshake: Duration::from_secs(10),
            stall: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            close: Duration::from_secs(2),
        }
    }
}

/// Everything a [`Shipper`] needs.
#[derive(Clone, Debug)]
pub struct ShipConfig {
    /// Where the replicas are.
    pub replicas: Replicas,
    /// TLS client configuration (ALPN `h2`): [`tls::client_config`].
    pub tls: Arc<rustls::ClientConfig>,
    /// The name the servers' certificate must carry; `None`: the Service's DNS name, or each
    /// static entry's host.
    pub server_name: Option<String>,
    /// Bearer token, if any.
    pub credentials: Credentials,
    /// Ticks queued per replica before the oldest is dropped.
    pub queue_ticks: usize,
    /// Reconnect delays.
    pub backoff: Backoff,
    /// Time limits.
    pub timeouts: Timeouts,
    /// How often a Service's DNS name is resolved again.
    pub resolve_interval: Duration,
    /// Counters, shareable among shippers.
    pub metrics: Arc<ShipMetrics>,
}

/// Default [`ShipConfig::queue_ticks`].
pub const DEFAULT_QUEUE_TICKS: usize = 8;

/// Default [`ShipConfig::resolve_interval`].
pub const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_secs(10);

impl ShipConfig {
    /// A configuration with the defaults: no credentials, 8 queued ticks, default backoff
    /// and timeouts, resolution every 10 s, its own metrics.
    pub fn new(replicas: Replicas, tls: Arc<rustls::ClientConfig>) -> ShipConfig {
        ShipConfig {
            replicas,
            tls,
            server_name: None,
            credentials: Credentials::None,
            queue_ticks: DEFAULT_QUEUE_TICKS,
            backoff: Backoff::default(),
            timeouts: Timeouts::default(),
            resolve_interval: DEFAULT_RESOLVE_INTERVAL,
            metrics: Arc::new(ShipMetrics::default()),
        }
    }
}

/// The [`Hello`] of this protocol version for `node_name`.
pub fn hello(node_name: &str, agent: &str) -> Hello {
    Hello {
        version: VERSION,
        node_name: node_name.to_owned(),
        node_labels: BTreeMap::new(),
        agent: agent.to_owned(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabel {
    replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    replica: String,
    reason: &'static str,
}

/// The shipper's counters (one set can serve many shippers). Series of a replica that goes
/// away are removed, so labels stay bounded by the replicas present.
#[derive(Debug, Default)]
pub struct ShipMetrics {
    sent: Family<ReplicaLabel, Counter>,
    dropped: Family<ReplicaLabel, Counter>,
    reconnects: Family<ReplicaLabel, Counter>,
    errors: Family<ErrorLabels, Counter>,
    streams_up: Gauge,
}

impl ShipMetrics {
    /// Registers the metrics (`kpulse_agent_` is the caller's prefix, if any):
    /// `sent_ticks_total{replica}`, `dropped_ticks_total{replica}`,
    /// `reconnects_total{replica}`, `stream_errors_total{replica,reason}`, `streams_up`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sent_ticks",
            "Ticks written to a replica's stream (as a Snapshot or an Update)",
            self.sent.clone(),
        );
        registry.register(
            "dropped_ticks",
            "Ticks dropped from a replica's queue (the oldest first) because the stream fell behind",
            self.dropped.clone(),
        );
        registry.register(
            "reconnects",
            "Streams to a replica started again after a failure or an end",
            self.reconnects.clone(),
        );
        registry.register(
            "stream_errors",
            "Streams that failed or were refused, by reason",
            self.errors.clone(),
        );
        registry.register(
            "streams_up",
            "Streams accepted by a replica and open now",
            self.streams_up.clone(),
        );
    }

    /// Total ticks written to `replica`'s streams: each stream's Snapshot (the latest tick
    /// when it started) and every Update. A tick published while no stream was up, and
    /// replaced by a newer one before a stream started, is neither sent nor dropped.
    pub fn sent(&self, replica: &str) -> u64 {
        Self::read(&self.sent, replica)
    }

    /// Total ticks dropped for `replica` (its series is created at 0 if missing).
    pub fn dropped(&self, replica: &str) -> u64 {
        self.dropped
            .get_or_create(&ReplicaLabel {
                replica: replica.into(),
            })
            .get()
    }

    /// Streams to `replica` started again after a failure or an end.
    pub fn reconnects(&self, replica: &str) -> u64 {
        Self::read(&self.reconnects, replica)
    }

    /// Streams to `replica` that failed or were refused, by reason (only reasons seen).
    pub fn stream_errors(&self, replica: &str) -> BTreeMap<&'static str, u64> {
        StreamError::REASONS
            .iter()
            .filter_map(|reason| {
                let n = self
                    .errors
                    .get(&ErrorLabels {
                        replica: replica.into(),
                        reason,
                    })
                    .map(|c| c.get())?;
                (n > 0).then_some((*reason, n))
            })
            .collect()
    }

    fn read(family: &Family<ReplicaLabel, Counter>, replica: &str) -> u64 {
        family
            .get(&ReplicaLabel {
                replica: replica.into(),
            })
            .map_or(0, |c| c.get())
    }

    /// Streams open now, across replicas (and shippers sharing these metrics).
    pub fn streams_up(&self) -> i64 {
        self.streams_up.get()
    }

    fn forget(&self, replica: &str) {
        let l = ReplicaLabel {
            replica: replica.into(),
        };
        self.sent.remove(&l);
        self.dropped.remove(&l);
        self.reconnects.remove(&l);
        for reason in StreamError::REASONS {
            self.errors.remove(&ErrorLabels {
                replica: replica.into(),
                reason,
            });
        }
    }
}

/// A tick with its sequence number.
#[derive(Clone, Debug)]
struct Published {
    seq: u64,
    /// When it was published: its Updates' `sent_at`.
    sent_at: kpulse_wire::UnixNanos,
    tick: Arc<Tick>,
    /// Its Update for a stream whose server already holds this tick's pod set (no upserts,
    /// no removals), encoded once by the first stream that sends it and shared by the
    /// others; `None` inside if encoding failed (each stream then reports the error).
    unchanged: Arc<std::sync::OnceLock<Option<bytes::Bytes>>>,
    /// The tick published before this one: a new stream's Snapshot carries it, so that a
    /// (re)started server has two points at once.
    previous: Option<Arc<Tick>>,
}

/// State shared by a shipper's tasks.
#[derive(Debug)]
struct Shared {
    config: ShipConfig,
    hello: Hello,
    ticks: broadcast::Sender<Published>,
    latest: watch::Sender<Option<Published>>,
}

/// Streams ticks to every replica; see the module docs.
#[derive(Debug)]
pub struct Shipper {
    publisher: Publisher,
    stop: watch::Sender<bool>,
    supervisor: tokio::task::JoinHandle<()>,
}

impl Shipper {
    /// Starts the supervisor (and through it the replica tasks). Needs a Tokio runtime.
    pub fn spawn(config: ShipConfig, hello: Hello) -> Shipper {
        let (ticks, _) = broadcast::channel(config.queue_ticks.max(1));
        let (latest, _) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            config,
            hello,
            ticks,
            latest,
        });
        let supervisor = tokio::spawn(supervise(shared.clone(), stop_rx));
        Shipper {
            publisher: Publisher {
                shared,
                seq: Arc::new(AtomicU64::new(0)),
            },
            stop,
            supervisor,
        }
    }

    /// Hands a tick to every replica's queue. Never blocks; a replica that is behind loses
    /// its oldest queued tick.
    pub fn publish(&self, tick: Tick) {
        self.publisher.publish(tick);
    }

    /// A handle that publishes from any thread (the collecting thread): the replicas' tasks
    /// are woken on the runtime.
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// The metrics this shipper counts into.
    pub fn metrics(&self) -> &Arc<ShipMetrics> {
        &self.publisher.shared.config.metrics
    }

    /// Ends every stream (the request bodies end cleanly), waiting up to `grace`; what is
    /// still running then is aborted.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        let mut supervisor = self.supervisor;
        if tokio::time::timeout(grace, &mut supervisor).await.is_err() {
            tracing::warn!(
                grace = %humantime::format_duration(grace),
                "streams did not end within the grace period; aborting them"
            );
            supervisor.abort();
            let _ = supervisor.await;
        }
    }
}

/// Publishes ticks to a [`Shipper`]'s replicas; see [`Shipper::publisher`].
#[derive(Clone, Debug)]
pub struct Publisher {
    shared: Arc<Shared>,
    seq: Arc<AtomicU64>,
}

impl Publisher {
    /// [`Shipper::publish`].
    pub fn publish(&self, tick: Tick) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = self.shared.latest.borrow().as_ref().map(|p| p.tick.clone());
        let p = Published {
            seq,
            sent_at: kpulse_wire::UnixNanos::from_system_time(std::time::SystemTime::now()),
            tick: Arc::new(tick),
            unchanged: Arc::default(),
            previous,
        };
        self.shared.latest.send_replace(Some(p.clone()));
        // No receiver (no stream connected) is not an error: the next Snapshot has it.
        let _ = self.shared.ticks.send(p);
    }
}

/// One replica as a task sees it.
#[derive(Clone, Debug)]
struct Target {
    /// The `replica` label and log field.
    label: String,
    /// Where to connect.
    addr: TargetAddr,
    /// `:authority` of the request.
    authority: String,
    /// The name the certificate must carry.
    server_name: ServerName<'static>,
}

#[derive(Clone, Debug)]
enum TargetAddr {
    /// Resolved at every connect.
    Name(String),
    /// One address of a Service.
    Fixed(SocketAddr),
}

/// Splits `host:port` (`[v6]:port` too) into host (without brackets) and port.
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty() && port != 0).then(|| (host.to_owned(), port))
}

fn server_name(config: &ShipConfig, host: &str) -> Option<ServerName<'static>> {
    let name = config.server_name.as_deref().unwrap_or(host);
    ServerName::try_from(name.to_owned()).ok()
}

async fn supervise(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tasks = JoinSet::new();
    let mut running: HashMap<String, (watch::Sender<bool>, tokio::task::AbortHandle)> =
        HashMap::new();
    let spawn = |tasks: &mut JoinSet<()>, target: Target| {
        let (tx, rx) = watch::channel(false);
        let handle = tasks.spawn(session::run_replica(shared.clone(), target, rx));
        (tx, handle)
    };
    match &shared.config.replicas {
        Replicas::Static(entries) => {
            for entry in entries {
                let Some((host, _)) = split_host_port(entry) else {
                    tracing::error!(server = %entry, "not host:port; skipped");
                    continue;
                };
                let Some(name) = server_name(&shared.config, &host) else {
                    tracing::error!(server = %entry, "no valid TLS server name; skipped");
                    continue;
                };
                let target = Target {
                    label: entry.clone(),
                    addr: TargetAddr::Name(entry.clone()),
                    authority: entry.clone(),
                    server_name: name,
                };
                running.insert(entry.clone(), spawn(&mut tasks, target));
            }
            stopped(&mut stop).await;
        }
        Replicas::Service { host, port } => {
            let authority = format!("{host}:{port}");
            let Some(name) = server_name(&shared.config, host) else {
                tracing::error!(service = %host, "no valid TLS server name; nothing to stream to");
                stopped(&mut stop).await;
                return;
            };
            let mut last_error: Option<String> = None;
            loop {
                match resolve(host, *port, shared.config.timeouts.resolve).await {
                    Ok(addrs) => {
                        if last_error.take().is_some() {
                            tracing::info!(service = %authority, "service resolves again");
                        }
                        let now: HashSet<String> = addrs.iter().map(|a| a.to_string()).collect();
                        let gone: Vec<String> = running
                            .keys()
                            .filter(|k| !now.contains(*k))
                            .cloned()
                            .collect();
                        let mut added = Vec::new();
                        for a in addrs {
                            let label = a.to_string();
                            if running.contains_key(&label) {
                                continue;
                            }
                            let target = Target {
                                label: label.clone(),
                                addr: TargetAddr::Fixed(a),
                                authority: authority.clone(),
                                server_name: name.clone(),
                            };
                            running.insert(label.clone(), spawn(&mut tasks, target));
                            added.push(label);
                        }
                        for label in &gone {
                            if let Some((tx, handle)) = running.remove(label) {
                                let _ = tx.send(true);
                                // Give it the close timeout, then abort.
                                let close = shared.config.timeouts.close;
                                tokio::spawn(async move {
                                    tokio::time::sleep(close).await;
                                    handle.abort();
                                });
                            }
                            shared.config.metrics.forget(label);
                        }
                        if !added.is_empty() || !gone.is_empty() {
                            tracing::info!(
                                service = %authority,
                                added = ?added,
                                removed = ?gone,
                                replicas = running.len(),
                                "aggregator replicas changed"
                            );
                        }
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        if last_error.as_deref() != Some(msg.as_str()) {
                            tracing::warn!(
                                service = %authority,
                                error = %msg,
                                replicas = running.len(),
                                "cannot resolve the aggregator service; keeping the current replicas"
                            );
                            last_error = Some(msg);
                        }
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(shared.config.resolve_interval) => {}
                    () = stopped(&mut stop) => break,
                    // Reap finished tasks so that the set does not grow with churn.
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                }
            }
        }
    }
    for (tx, _) in running.values() {
        let _ = tx.send(true);
    }
    while tasks.join_next().await.is_some() {}
}

/// Waits until `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn resolve(host: &str, port: u16, limit: Duration) -> Result<Vec<SocketAddr>, StreamError> {
    let target = format!("{host}:{port}");
    let found = tokio::time::timeout(limit, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| StreamError::Timeout { what: "resolving" })?
        .map_err(|source| StreamError::Resolve { target, source })?;
    let mut addrs: Vec<SocketAddr> = found.collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let b = Backoff::default();
        assert_eq!(b.cap(0), Duration::from_millis(200));
        assert_eq!(b.cap(1), Duration::from_millis(400));
        assert_eq!(b.cap(7), Duration::from_millis(25_600));
        assert_eq!(b.cap(8), Duration::from_secs(30));
        assert_eq!(b.cap(u32::MAX), Duration::from_secs(30));
        let mut rng = fastrand::Rng::with_seed(7);
        let delays: Vec<Duration> = (0..1000).map(|_| b.delay(3, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1600)));
        let mean = delays.iter().sum::<Duration>() / 1000;
        assert!(
            mean > Duration::from_millis(700) && mean < Duration::from_millis(900),
            "full jitter averages half the cap: {mean:?}"
        );
    }

    #[test]
    fn refused_connections_back_off_to_their_own_cap_for_a_while() {
        let b = Backoff::default();
        let ms = Duration::from_millis;
        let mut retry = Retry::default();
        // The stream of a healthy replica cut by its end: an ordinary failure.
        assert_eq!(retry.next_cap(false, &b), ms(200));
        // Then refused while it is down: 200 ms doubling, but only to refused_max, while
        // the failures' count stays where it was.
        let caps: Vec<Duration> = (0..b.refused_fast)
            .map(|_| retry.next_cap(true, &b))
            .collect();
        assert_eq!(
            &caps[..5],
            &[ms(200), ms(400), ms(800), ms(1_600), ms(2_000)]
        );
        assert!(caps[5..].iter().all(|c| *c == b.refused_max), "{caps:?}");
        assert_eq!(
            retry,
            Retry {
                failures: 1,
                refusals: b.refused_fast
            }
        );
        // Refused for longer than that: refusals count as failures again, to the usual 30 s.
        let later: Vec<Duration> = (0..10).map(|_| retry.next_cap(true, &b)).collect();
        assert_eq!(later[0], ms(400));
        assert_eq!(later[9], b.max);
        // It listens but the handshake fails: the failures' count goes on, refusals start
        // over.
        assert_eq!(retry.next_cap(false, &b), b.max);
        assert_eq!(retry.refusals, 0);
        retry.reset();
        assert_eq!(retry, Retry::default());
    }

    #[test]
    fn refusals_after_failures_in_a_row_keep_the_failures_cap() {
        let b = Backoff::default();
        let mut retry = Retry::default();
        // A replica that keeps failing its agents' streams (crash-looping under them):
        // six failures, the last cap 6.4 s.
        for _ in 0..6 {
            retry.next_cap(false, &b);
        }
        let caps: Vec<Duration> = (0..8).map(|_| retry.next_cap(true, &b)).collect();
        assert_eq!(caps[4], Duration::from_millis(3_200));
        assert!(
            caps[5..].iter().all(|c| *c == Duration::from_millis(6_400)),
            "{caps:?}"
        );
        // Full jitter over the cap.
        let mut rng = fastrand::Rng::with_seed(3);
        let delays: Vec<Duration> = (0..40).map(|_| retry.after(true, &b, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(6_400)));
    }

    /// Through the whole reconnect loop: shippers refused for 6 s (the old doubling would
    /// have grown their caps to 6.4 s or more) are all connected within 5 s of the port
    /// listening. Each of the 20 is back within 2 s with refused_max; with a 6.4 s cap the
    /// chance that all 20 are within 5 s is under 1 %.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_shippers_are_back_soon_after_the_port_listens() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let tls = tls::client_config(&tls::TlsOptions {
            insecure_skip_verify: true,
            ..Default::default()
        })
        .expect("tls");
        let shippers: Vec<Shipper> = (0..20)
            .map(|i| {
                Shipper::spawn(
                    ShipConfig::new(
                        Replicas::Static(vec![format!("127.0.0.1:{port}")]),
                        tls.clone(),
                    ),
                    hello(&format!("n{i}"), "test"),
                )
            })
            .collect();
        // A stream starts with a tick to send.
        for s in &shippers {
            s.publish(Tick {
                node: NodeSample {
                    timestamp: kpulse_wire::UnixNanos(1),
                    started_at: None,
                    cpu: kpulse_wire::CpuNanos(1),
                    memory_working_set: kpulse_wire::Bytes(0),
                    swap: None,
                },
                pods: Arc::new(PodSet::default()),
                counters: vec![],
            });
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        let refused: u64 = shippers
            .iter()
            .flat_map(|s| s.metrics().stream_errors(&format!("127.0.0.1:{port}")))
            .filter(|(reason, _)| *reason == "connect")
            .map(|(_, n)| n)
            .sum();
        assert!(
            refused >= 20 * 5,
            "each shipper refused several times: {refused}"
        );
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the port again");
        let listening = tokio::time::Instant::now();
        // Held open, never answered: each shipper waits out its handshake (10 s), so it
        // connects once in the 5 s.
        let mut held = Vec::new();
        while held.len() < 20 {
            match tokio::time::timeout_at(listening + Duration::from_secs(5), listener.accept())
                .await
            {
                Ok(Ok((s, _))) => held.push(s),
                Ok(Err(e)) => panic!("accept: {e}"),
                Err(_) => break,
            }
        }
        assert_eq!(
            held.len(),
            20,
            "shippers connected within 5 s of the port listening"
        );
        drop(held);
        let ends: Vec<_> = shippers
            .into_iter()
            .map(|s| tokio::spawn(s.shutdown(Duration::from_secs(1))))
            .collect();
        for end in ends {
            end.await.expect("shut down");
        }
    }

    #[test]
    fn tokens_never_show_in_debug() {
        let c = Credentials::Token("s3cret".into());
        assert_eq!(format!("{c:?}"), "Token(<redacted>)");
    }

    #[test]
    fn host_port() {
        assert_eq!(
            split_host_port("a.b.svc:443"),
            Some(("a.b.svc".into(), 443))
        );
        assert_eq!(split_host_port("[::1]:8443"), Some(("::1".into(), 8443)));
        assert_eq!(split_host_port("::1:8443"), None);
        assert_eq!(split_host_port("host"), None);
        assert_eq!(split_host_port("host:0"), None);
        assert_eq!(split_host_port(":443"), None);
        assert_eq!(split_host_port("host:x"), None);
    }

    #[tokio::test]
    async fn publish_keeps_the_latest_and_never_blocks() {
        let tls = tls::client_config(&tls::TlsOptions {
            insecure_skip_verify: true,
            ..Default::default()
        })
        .expect("tls");
        let shipper = Shipper::spawn(
            ShipConfig::new(Replicas::Static(vec![]), tls),
            hello("n", "test"),
        );
        let mut rx = shipper.publisher.shared.ticks.subscribe();
        for i in 0..100 {
            shipper.publish(Tick {
                node: NodeSample {
                    timestamp: kpulse_wire::UnixNanos(i),
                    started_at: None,
                    cpu: kpulse_wire::CpuNanos(i),
                    memory_working_set: kpulse_wire::Bytes(0),
                    swap: None,
                },
                pods: Arc::new(PodSet::default()),
                counters: vec![],
            });
        }
        let latest = shipper
            .publisher
            .shared
            .latest
            .borrow()
            .clone()
            .expect("latest");
        assert_eq!(latest.seq, 100);
        // The queue kept the newest 8 and says how many it dropped.
        assert!(matches!(
            rx.recv().await,
            Err(broadcast::error::RecvError::Lagged(92))
        ));
        assert_eq!(rx.recv().await.expect("tick").seq, 93);
        shipper.shutdown(Duration::from_secs(1)).await;
    }
}
