//! Store benchmarks at cluster scale: 5,000 nodes × 110 pods × 2 containers (1.1 million
//! container series), as metrics-server's `pkg/storage/storage_benchmark_test.go` measures
//! writes and reads of its storage.
//!
//! `cargo bench -p kpulse-aggregator-api --bench store`
//!
//! - `ingest/existing_node`: one node's next batch (110 pods × 2 containers), the steady
//!   state: every series moves by one point, no pod arrives or leaves.
//! - `ingest/existing_node_with_signals`: the same with pressure and throttling
//!   (`kpulse-agent run --custom-metrics`) on every pod and container.
//! - `ingest/new_node`: the first batch of a node nobody knew, so 110 pods enter the index.
//! - `read/*`: one pod; a 3,000-pod list (a namespace's pods, spread over all nodes); one node;
//!   all nodes; all pods; readiness.
//! - `read_during_ingest/*`: the same reads while another thread ingests batches
//!   back-to-back, to show that readers do not wait for the writer.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kpulse_aggregator_api::store::{ManualClock, Store, StoreConfig};
use kpulse_wire::{
    Bytes, ContainerSample, CpuNanos, Fraction, NodeBatch, NodeSample, PodSample, Signals,
    UnixNanos,
};

const NODES: usize = 5_000;
const PODS_PER_NODE: usize = 110;
const CONTAINERS_PER_POD: usize = 2;
/// About 3,000 pods per namespace.
const NAMESPACES: usize = 183;
const LIST: usize = 3_000;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

type BenchStore = Store<Arc<ManualClock>>;

/// A store whose data never expires during the run: the clock stands still and the
/// expiry is ten years, so timing never depends on housekeeping.
fn empty_store() -> BenchStore {
    let config = StoreConfig::new(Duration::from_secs(10 * 365 * 86_400));
    let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
    Store::with_clock(config, clock).expect("valid config")
}

fn node_name(n: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        n / 65_536,
        (n / 256) % 256,
        n % 256
    )
}

/// Pod `i` of the cluster: namespace and a Deployment-like name.
fn pod_key(i: usize) -> (String, String) {
    let namespace = format!("team-{:03}", i % NAMESPACES);
    let name = format!(
        "service-{:04}-7d9f8b6c5-{:05x}",
        i / 50,
        (i * 2_654_435_761) % 0xF_FFFF
    );
    (namespace, name)
}

/// Node `n`'s batch at tick `tick` (one second per tick).
fn node_batch(n: usize, tick: u64) -> NodeBatch {
    let t = UnixNanos(T0 + tick * S);
    let pods = (0..PODS_PER_NODE)
        .map(|j| {
            let i = n * PODS_PER_NODE + j;
            let (namespace, name) = pod_key(i);
            let containers = (0..CONTAINERS_PER_POD)
                .map(|k| ContainerSample {
                    name: format!("container-{k}"),
                    timestamp: t,
                    cgroup_id: None,
                    started_at: None,
                    cpu: CpuNanos(tick * (100_000_000 + k as u64)),
                    memory_working_set: Bytes(64 << 20),
                    swap: None,
                    signals: None,
                })
                .collect();
            PodSample {
                uid: format!("{i:08x}-7c1e-4f3a-9b2d-5e6f7a8b9c0d"),
                namespace,
                name,
                containers,
                signals: None,
                ready_since: None,
            }
        })
        .collect();
    NodeBatch {
        node_name: node_name(n),
        sent_at: t,
        node: NodeSample {
            timestamp: t,
            started_at: None,
            cpu: CpuNanos(tick * 4 * S),
            memory_working_set: Bytes(8 << 30),
            swap: None,
        },
        pods,
    }
}

/// `batch` with pressure and throttling on every pod and container.
fn with_signals(mut batch: NodeBatch) -> NodeBatch {
    let signals = |seed: u64| {
        let share = |ppm: u64| Fraction::of(ppm % 1_000_000, 1_000_000, 30_000);
        Some(Signals {
            cpu_pressure: share(seed * 7_919),
            memory_pressure: share(seed * 104_729),
            cpu_throttled: share(seed * 1_299_709),
        })
    };
    for (p, pod) in batch.pods.iter_mut().enumerate() {
        pod.signals = signals(p as u64);
        for (c, container) in pod.containers.iter_mut().enumerate() {
            container.signals = signals((p * CONTAINERS_PER_POD + c) as u64 + 1);
        }
    }
    batch
}

/// The same batch one tick later: timestamps and counters move, strings stay.
fn advance(batch: &mut NodeBatch) {
    let step = |t: &mut UnixNanos| t.0 += S;
    step(&mut batch.sent_at);
    step(&mut batch.node.timestamp);
    batch.node.cpu.0 += 4 * S;
    for pod in &mut batch.pods {
        for c in &mut pod.containers {
            step(&mut c.timestamp);
            c.cpu.0 += 100_000_000;
        }
    }
}

/// 5,000 nodes with two ticks each, so that every node and pod has a rate.
fn loaded_store() -> BenchStore {
    let started = Instant::now();
    let store = empty_store();
    for n in 0..NODES {
        let mut batch = node_batch(n, 1);
        store.ingest(batch.clone()).expect("ingest");
        advance(&mut batch);
        store.ingest(batch).expect("ingest");
    }
    eprintln!(
        "loaded {NODES} nodes, {} pods, {} containers in {:.1?}; process {}",
        NODES * PODS_PER_NODE,
        NODES * PODS_PER_NODE * CONTAINERS_PER_POD,
        started.elapsed(),
        resident_memory()
    );
    store
}

/// `VmRSS` of this process (Linux), for a rough idea of the store's footprint.
fn resident_memory() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "VmRSS: unknown".to_owned())
}

/// `LIST` pods of one namespace, spread over every node.
fn namespace_keys() -> Vec<(String, String)> {
    (0..NODES * PODS_PER_NODE)
        .step_by(NAMESPACES)
        .take(LIST)
        .map(pod_key)
        .collect()
}

fn benches(c: &mut Criterion) {
    let store = Arc::new(loaded_store());
    let keys = namespace_keys();
    let list: Vec<(&str, &str)> = keys.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert!(store.pod_metrics(&list).iter().all(Option::is_some));
    let one_pod = [list[LIST / 2]];
    let one_node_name = node_name(NODES / 2);
    let one_node = [one_node_name.as_str()];

    let mut ingest = c.benchmark_group("ingest");
    // Each iteration ingests `next`'s next tick.
    let mut ticks = |name: &str, mut next: NodeBatch| {
        ingest.bench_function(name, |b| {
            b.iter_batched(
                || {
                    advance(&mut next);
                    next.clone()
                },
                |batch| store.ingest(batch).expect("ingest"),
                BatchSize::SmallInput,
            )
        });
    };
    ticks("existing_node", node_batch(7, 2));
    // The same with what `kpulse-agent run --custom-metrics` adds: all three figures on
    // every pod and container.
    ticks("existing_node_with_signals", with_signals(node_batch(8, 2)));
    let mut fresh = 0usize;
    ingest.bench_function("new_node", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Nodes beyond the loaded ones, whose pods nobody has seen.
                let n = NODES + fresh % 1_000;
                fresh += 1;
                let batch = node_batch(n, 1);
                let started = Instant::now();
                black_box(store.ingest(batch).expect("ingest"));
                total += started.elapsed();
                store.remove_node(&node_name(n));
            }
            total
        })
    });
    ingest.finish();

    let mut read = c.benchmark_group("read");
    read.bench_function("get_1_pod", |b| {
        b.iter(|| store.pod_metrics(black_box(&one_pod)))
    });
    read.bench_function("list_3000_pods", |b| {
        b.iter(|| store.pod_metrics(black_box(&list)))
    });
    read.bench_function("get_1_node", |b| {
        b.iter(|| store.node_metrics(black_box(&one_node)))
    });
    read.bench_function("all_5000_nodes", |b| b.iter(|| store.nodes()));
    read.bench_function("ready", |b| b.iter(|| store.ready()));
    read.sample_size(10);
    read.bench_function("all_550000_pods", |b| b.iter(|| store.pods()));
    read.finish();

    // Another thread ingests every node's next batch back-to-back meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut batches: Vec<NodeBatch> = (0..NODES).map(|n| node_batch(n, 2)).collect();
            let mut ingested = 0u64;
            'run: loop {
                for batch in &mut batches {
                    if stop.load(Ordering::Relaxed) {
                        break 'run;
                    }
                    advance(batch);
                    store.ingest(batch.clone()).expect("ingest");
                    ingested += 1;
                }
            }
            ingested
        })
    };
    let started = Instant::now();
    let mut during = c.benchmark_group("read_during_ingest");
    during.bench_function("get_1_pod", |b| {
        b.iter(|| store.pod_metrics(black_box(&one_pod)))
    });
    during.bench_function("list_3000_pods", |b| {
        b.iter(|| store.pod_metrics(black_box(&list)))
    });
    during.finish();
    stop.store(true, Ordering::Relaxed);
    let ingested = writer.join().expect("writer thread");
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "background writer: {ingested} batches in {secs:.1} s ({:.0} batches/s, batch clone included)",
        ingested as f64 / secs
    );
}

criterion_group!(store, benches);
criterion_main!(store);
