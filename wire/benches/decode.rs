//! The server's first step for every tick of every node: decoding one agent's `Update` frame
//! (110 pods × 2 containers, what a full node sends each second), without and with the
//! pressure and throttling figures of `--custom-metrics` (protocol 1.2: every pod and every
//! container with all three).
//!
//! `cargo bench -p kpulse-wire --bench decode`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kpulse_wire::{
    stream::{self, AgentMessage, PodCounters, Update},
    Bytes, CgroupId, ContainerSample, CpuNanos, Fraction, NodeSample, Signals, UnixNanos,
};

const PODS: usize = 110;
const CONTAINERS: usize = 2;
const T: u64 = 1_764_806_400_123_456_789;

/// Figures as an agent's window gives them: shares of about 30 s.
fn signals(seed: u64) -> Option<Signals> {
    let share = |ppm: u64| Fraction::of(ppm % 1_000_000, 1_000_000, 30_017);
    Some(Signals {
        cpu_pressure: share(seed * 7_919),
        memory_pressure: share(seed * 104_729),
        cpu_throttled: share(seed * 1_299_709),
    })
}

fn update(with_signals: bool) -> AgentMessage {
    let counters = (0..PODS)
        .map(|p| PodCounters {
            uid: format!("{p:08x}-7c1e-4f3a-9b2d-5e6f7a8b9c0d"),
            containers: (0..CONTAINERS)
                .map(|c| {
                    let seed = (p * CONTAINERS + c) as u64 + 1;
                    ContainerSample {
                        name: format!("container-{c}"),
                        timestamp: UnixNanos(T + seed * 1_000),
                        cgroup_id: Some(CgroupId(40_000 + seed)),
                        started_at: Some(UnixNanos(T - 86_400_000_000_000)),
                        cpu: CpuNanos(seed * 123_456_789_012),
                        memory_working_set: Bytes(seed * 1_048_576 + 4_096),
                        swap: None,
                        signals: if with_signals { signals(seed) } else { None },
                    }
                })
                .collect(),
            signals: if with_signals {
                signals(p as u64 + 7)
            } else {
                None
            },
        })
        .collect();
    AgentMessage::Update(Update {
        sent_at: UnixNanos(T),
        node: NodeSample {
            timestamp: UnixNanos(T),
            started_at: Some(UnixNanos(T - 86_400_000_000_000)),
            cpu: CpuNanos(987_654_321_000_000),
            memory_working_set: Bytes(8 << 30),
            swap: None,
        },
        upserts: Vec::new(),
        removed: Vec::new(),
        counters,
    })
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_update");
    for (name, with_signals) in [("110_pods", false), ("110_pods_with_signals", true)] {
        let message = update(with_signals);
        let frame = match stream::encode(&message) {
            Ok(f) => f,
            Err(e) => panic!("encode: {e}"),
        };
        let body = &frame[4..];
        eprintln!("decode_update/{name}: {} bytes of JSON", body.len());
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let m: AgentMessage = match serde_json::from_slice(black_box(body)) {
                    Ok(m) => m,
                    Err(e) => panic!("decode: {e}"),
                };
                black_box(m)
            })
        });
    }
    group.finish();
}

criterion_group!(decode, benches);
criterion_main!(decode);
