//! The agent's own metrics, in the Prometheus text format (prometheus-client), served over
//! plain HTTP at `/metrics` on `--metrics-bind-address` (loopback by default: a node-local
//! scraper or `kubectl port-forward` reads it; it carries no pod data).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kpulse_agent_unattributed_cgroups` | gauge, per tick | none |
//! | `kpulse_agent_incomplete_pods` | gauge, per tick | none |
//! | `kpulse_agent_collection_duration_seconds` | histogram (1 ms … 10 s) | none |
//! | `kpulse_agent_collection_errors_total` | counter | none |
//! | `kpulse_agent_clock_steps_total` | counter | none |
//! | `kpulse_agent_collector` | gauge, 1 for the collector in use | `collector` (`ebpf`, `cgroupfs`) |
//! | `kpulse_agent_collector_fallbacks_total` | counter (eBPF → cgroupfs while running) | none |
//! | `kpulse_agent_ebpf_relinks_total` | counter | `reason` (`program_replaced`, `cgroup_removed`) |
//! | `kpulse_agent_ebpf_foreign_walks_total` | counter | none |
//! | `kpulse_agent_cgroups` | gauge, per tick | none |
//! | `kpulse_agent_ebpf_walk_records` | gauge, per tick | none |
//! | `kpulse_agent_ebpf_walk_names_copied` | gauge, per tick | none |
//! | `kpulse_agent_path_cache_entries` | gauge, per tick | none |
//! | `kpulse_agent_start_time_cache_entries` | gauge, per tick | none |
//! | `kpulse_agent_start_times_total` | counter, per new container cgroup | `source` (`creation`, `processes`, `unknown`) |
//! | `kpulse_agent_pods` | gauge, per tick | none |
//! | `kpulse_agent_sent_ticks_total` | counter | `replica` |
//! | `kpulse_agent_dropped_ticks_total` | counter | `replica` |
//! | `kpulse_agent_reconnects_total` | counter | `replica` |
//! | `kpulse_agent_stream_errors_total` | counter | `replica`, `reason` |
//! | `kpulse_agent_streams_up` | gauge | none |
//! | `kpulse_agent_heap_in_use_bytes` | gauge, read at scrape (glibc only) | none |
//!
//! The per-tick sizes (`cgroups`, `ebpf_walk_records`, `path_cache_entries`,
//! `start_time_cache_entries`, `pods`) and the heap in use are what shows that the agent
//! holds nothing for cgroups and pods that are gone: after churn they return to their
//! earlier values, while the resident size may stay at the allocator's peak.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::{prometheus_text, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::{collect::CollectorStats, probe, sample::Source, ship::ShipMetrics};

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Bucket bounds (seconds) of the collection duration.
pub const COLLECTION_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Longest a metrics connection may stay open.
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// Most metrics connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16;

/// `kpulse_agent_heap_in_use_bytes`, read at each scrape ([`probe::heap_in_use`]).
#[derive(Debug)]
struct HeapCollector;

impl prometheus_client::collector::Collector for HeapCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let Some(bytes) = probe::heap_in_use() else {
            return Ok(());
        };
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(
            i64::try_from(bytes).unwrap_or(i64::MAX),
        );
        let metric = encoder.encode_descriptor(
            "heap_in_use",
            "Heap allocated and not freed (glibc mallinfo2), unlike the resident size, which \
             keeps what the allocator retains after a peak",
            Some(&Unit::Bytes),
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// The agent's metrics.
#[derive(Debug)]
pub struct AgentMetrics {
    /// Cgroups under kubepods not joined to a known pod, last tick.
    pub unattributed_cgroups: Gauge,
    /// Known pods left out of the last tick because not all their containers were measured.
    pub incomplete_pods: Gauge,
    /// Time one collection took (collector plus attribution).
    pub collection_duration: Histogram,
    /// Collections that failed.
    pub collection_errors: Counter,
    /// Steps of the wall clock seen (see `clock`).
    pub clock_steps: Counter,
    /// Cgroups in the last tick.
    pub cgroups: Gauge,
    /// Sizes of the agent's per-cgroup state, and the collector's counters.
    pub collector: CollectorMetrics,
    /// Entries of the start-time cache (`starttime`), last tick.
    pub start_time_cache_entries: Gauge,
    /// Where new containers' start times came from (`starttime::Found`).
    pub start_times: StartTimeMetrics,
    /// Pods in the attribution index, last tick.
    pub pods: Gauge,
    /// The shipper's metrics.
    pub ship: Arc<ShipMetrics>,
    registry: Registry,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CollectorLabel {
    collector: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartSourceLabel {
    source: &'static str,
}

/// Container cgroups seen for the first time, by where their start time came from.
#[derive(Debug, Default)]
pub struct StartTimeMetrics {
    by_source: Family<StartSourceLabel, Counter>,
}

impl StartTimeMetrics {
    /// Adds one [`StartTimes::fill`](crate::starttime::StartTimes::fill)'s counts.
    pub fn record(&self, found: crate::starttime::Found) {
        for (source, n) in [
            ("creation", found.creation),
            ("processes", found.processes),
            ("unknown", found.unknown),
        ] {
            self.by_source
                .get_or_create(&StartSourceLabel { source })
                .inc_by(n);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RelinkLabel {
    reason: &'static str,
}

/// What the collector reports about itself ([`CollectorStats`]), as metrics.
#[derive(Debug, Default)]
pub struct CollectorMetrics {
    in_use: Family<CollectorLabel, Gauge>,
    fallbacks: Counter,
    relinks: Family<RelinkLabel, Counter>,
    foreign_walks: Counter,
    walk_records: Gauge,
    walk_names_copied: Gauge,
    path_cache_entries: Gauge,
}

impl CollectorMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "collector",
            "1 for the collector in use (ebpf or cgroupfs)",
            self.in_use.clone(),
        );
        r.register(
            "collector_fallbacks",
            "Switches from the eBPF collector to cgroupfs while running (--collector auto)",
            self.fallbacks.clone(),
        );
        r.register(
            "ebpf_relinks",
            "eBPF iterator links made again: their program replaced by another process, or their cgroup removed",
            self.relinks.clone(),
        );
        r.register(
            "ebpf_foreign_walks",
            "eBPF walks done again because another walk of our link overwrote their records",
            self.foreign_walks.clone(),
        );
        r.register(
            "ebpf_walk_records",
            "Records the last tick's eBPF walks returned (all hierarchies)",
            self.walk_records.clone(),
        );
        r.register(
            "ebpf_walk_names_copied",
            "Of the last tick's eBPF records, those whose name was copied (cgroups new to their slot); 0 in a tree that did not change",
            self.walk_names_copied.clone(),
        );
        r.register(
            "path_cache_entries",
            "Entries of the eBPF collector's cgroup id to path caches",
            self.path_cache_entries.clone(),
        );
    }

    /// Records the collector's state after a tick; `last` is what the previous call
    /// recorded (the collector's counters are cumulative, the metrics' too).
    pub fn record(&self, source: Source, last: &CollectorStats, now: &CollectorStats) {
        for (name, s) in [("ebpf", Source::Ebpf), ("cgroupfs", Source::Cgroupfs)] {
            self.in_use
                .get_or_create(&CollectorLabel { collector: name })
                .set(i64::from(source == s));
        }
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&self.walk_records, now.walk_records);
        gauge(&self.walk_names_copied, now.walk_names_copied);
        gauge(&self.path_cache_entries, now.path_cache_entries);
        let delta = |a: u64, b: u64| a.saturating_sub(b);
        self.fallbacks.inc_by(delta(now.fallbacks, last.fallbacks));
        self.foreign_walks
            .inc_by(delta(now.foreign_walks, last.foreign_walks));
        self.relinks
            .get_or_create(&RelinkLabel {
                reason: "program_replaced",
            })
            .inc_by(delta(
                now.relinks_program_replaced,
                last.relinks_program_replaced,
            ));
        self.relinks
            .get_or_create(&RelinkLabel {
                reason: "cgroup_removed",
            })
            .inc_by(delta(
                now.relinks_cgroup_removed,
                last.relinks_cgroup_removed,
            ));
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics::new()
    }
}

impl AgentMetrics {
    /// Everything registered under `kpulse_agent_`.
    pub fn new() -> AgentMetrics {
        let mut registry = Registry::default();
        let unattributed_cgroups = Gauge::default();
        let incomplete_pods = Gauge::default();
        let collection_duration = Histogram::new(COLLECTION_BUCKETS);
        let collection_errors = Counter::default();
        let clock_steps = Counter::default();
        let cgroups = Gauge::default();
        let collector = CollectorMetrics::default();
        let start_time_cache_entries = Gauge::default();
        let start_times = StartTimeMetrics::default();
        let pods = Gauge::default();
        let ship = Arc::new(ShipMetrics::default());
        {
            let r = registry.sub_registry_with_prefix("kpulse_agent");
            r.register(
                "unattributed_cgroups",
                "Cgroups under kubepods that the last tick could not join to a known pod",
                unattributed_cgroups.clone(),
            );
            r.register(
                "incomplete_pods",
                "Known pods left out of the last tick because not all their running containers were measured",
                incomplete_pods.clone(),
            );
            r.register_with_unit(
                "collection_duration",
                "Time one collection and attribution took",
                Unit::Seconds,
                collection_duration.clone(),
            );
            r.register(
                "collection_errors",
                "Collections that failed (the tick was skipped)",
                collection_errors.clone(),
            );
            r.register(
                "clock_steps",
                "Steps of the node's wall clock seen; each restarts every series once",
                clock_steps.clone(),
            );
            r.register("cgroups", "Cgroups the last tick reported", cgroups.clone());
            collector.register(r);
            r.register(
                "start_time_cache_entries",
                "Containers whose start time the agent keeps (one per container cgroup sent)",
                start_time_cache_entries.clone(),
            );
            r.register(
                "start_times",
                "Container cgroups seen for the first time, by where their start time came from: the cgroup's creation (eBPF), its earliest process (/proc), or unknown (the first value waits for a second sample)",
                start_times.by_source.clone(),
            );
            r.register(
                "pods",
                "Pods in the attribution index (watched, or in --pods-file)",
                pods.clone(),
            );
            ship.register(r);
            // Writes nothing where the C library is not glibc.
            r.register_collector(Box::new(HeapCollector));
        }
        AgentMetrics {
            unattributed_cgroups,
            incomplete_pods,
            collection_duration,
            collection_errors,
            clock_steps,
            cgroups,
            collector,
            start_time_cache_entries,
            start_times,
            pods,
            ship,
            registry,
        }
    }

    /// The text exposition.
    ///
    /// # Errors
    ///
    /// Formatting errors (none in practice: the sink is a `String`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Serves `GET /metrics` over HTTP/1 on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<AgentMetrics>,
    stop: impl std::future::Future<Output = ()>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            () = &mut stop => return,
        };
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => return,
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(tcp), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, conn).await;
            drop(permit);
        });
    }
}

fn respond(req: &Request<Incoming>, metrics: &AgentMetrics) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ct: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(ct) {
            r.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match metrics.encode() {
        Ok(text) => reply(StatusCode::OK, CONTENT_TYPE, text),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "encoding failed\n".into(),
        ),
    }
}

/// Binds `addr` for [`serve`].
///
/// # Errors
///
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        let m = AgentMetrics::new();
        m.unattributed_cgroups.set(3);
        m.collection_duration.observe(0.002);
        assert_eq!(m.ship.dropped("10.0.0.1:443"), 0);
        let stats = CollectorStats {
            relinks_program_replaced: 1,
            path_cache_entries: 7,
            ..Default::default()
        };
        m.collector
            .record(Source::Ebpf, &CollectorStats::default(), &stats);
        // Cumulative counters are added as differences.
        let later = CollectorStats {
            relinks_program_replaced: 2,
            ..stats
        };
        m.collector.record(Source::Ebpf, &stats, &later);
        let text = m.encode().expect("encode");
        for want in [
            "# TYPE kpulse_agent_unattributed_cgroups gauge",
            "kpulse_agent_unattributed_cgroups 3",
            "# TYPE kpulse_agent_collection_duration_seconds histogram",
            "# TYPE kpulse_agent_dropped_ticks_total counter",
            "kpulse_agent_dropped_ticks_total{replica=\"10.0.0.1:443\"} 0",
            "kpulse_agent_streams_up 0",
            "kpulse_agent_collection_errors_total 0",
            "kpulse_agent_collector{collector=\"ebpf\"} 1",
            "kpulse_agent_collector{collector=\"cgroupfs\"} 0",
            "kpulse_agent_ebpf_relinks_total{reason=\"program_replaced\"} 2",
            "kpulse_agent_ebpf_relinks_total{reason=\"cgroup_removed\"} 0",
            "kpulse_agent_collector_fallbacks_total 0",
            "kpulse_agent_path_cache_entries 7",
            "kpulse_agent_pods 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn heap_in_use_follows_allocations_read_at_scrape() {
        let m = AgentMetrics::new();
        let heap = |text: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix("kpulse_agent_heap_in_use_bytes "))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no kpulse_agent_heap_in_use_bytes in\n{text}"))
        };
        // The gauge is process-wide: another test thread allocating or freeing a large
        // block between two readings can blur one attempt, not five in a row.
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = heap(&m.encode().expect("encode"));
            assert!(before > 0.0);
            // 64 MiB, touched, held: served by mmap, counted in hblkhd.
            let block = vec![1u8; 64 << 20];
            let during = heap(&m.encode().expect("encode"));
            drop(std::hint::black_box(block));
            let after = heap(&m.encode().expect("encode"));
            let grew = during - before >= f64::from(60u32 << 20);
            let shrank = during - after >= f64::from(60u32 << 20);
            if grew && shrank {
                return;
            }
            seen.push(format!("{before} → {during} → {after}"));
        }
        panic!("the heap gauge did not follow a 64 MiB block: {seen:?}");
    }
}
