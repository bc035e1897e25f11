//! The Node watch's index ([`ClusterNodes`]) at 5,000 nodes with 20 labels each (the labels
//! of a typical cloud node: kubelet's, the cloud provider's, a few of the operator's).
//!
//! `cargo bench -p kpulse-aggregator-api --bench nodes`
//!
//! - the heap it holds (a counting allocator: bytes allocated and not freed), printed once;
//! - `status_update`: a watch event that changes no label (what most Node events are);
//! - `relabel`: one node's labels changed;
//! - `lookup` / `list`: one node; all 5,000 (what a NodeMetrics get or list reads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use kpulse_aggregator_api::metadata::ClusterNodeList;
use kpulse_aggregator_api::{
    nodes::{ClusterNodes, Labels},
    watched::Change,
};

const NODES: usize = 5_000;

/// The system allocator, counting the bytes in use.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter is added.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn node_name(n: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        n / 65_536,
        (n / 256) % 256,
        n % 256
    )
}

/// Twenty labels as a managed cloud node has them.
fn labels(n: usize) -> BTreeMap<String, String> {
    let name = node_name(n);
    let zone = format!("eu-west-1{}", ["a", "b", "c"][n % 3]);
    let pairs: Vec<(&str, String)> = vec![
        ("beta.kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/instance-type", "m6i.2xlarge".into()),
        ("beta.kubernetes.io/os", "linux".into()),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND".into()),
        ("eks.amazonaws.com/nodegroup", format!("workers-{}", n % 8)),
        (
            "eks.amazonaws.com/nodegroup-image",
            "ami-0a1b2c3d4e5f67890".into(),
        ),
        (
            "eks.amazonaws.com/sourceLaunchTemplateId",
            "lt-0123456789abcdef0".into(),
        ),
        ("eks.amazonaws.com/sourceLaunchTemplateVersion", "7".into()),
        (
            "failure-domain.beta.kubernetes.io/region",
            "eu-west-1".into(),
        ),
        ("failure-domain.beta.kubernetes.io/zone", zone.clone()),
        (
            "k8s.io/cloud-provider-aws",
            "0123456789abcdef0123456789abcdef".into(),
        ),
        ("kubernetes.io/arch", "amd64".into()),
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux".into()),
        ("node.kubernetes.io/instance-type", "m6i.2xlarge".into()),
        ("team", format!("team-{:02}", n % 40)),
        ("topology.ebs.csi.aws.com/zone", zone.clone()),
        ("topology.k8s.aws/zone-id", format!("euw1-az{}", n % 3 + 1)),
        ("topology.kubernetes.io/region", "eu-west-1".into()),
        ("topology.kubernetes.io/zone", zone),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn all() -> BTreeMap<String, Labels> {
    (0..NODES)
        .map(|n| (node_name(n), Labels::new(labels(n))))
        .collect()
}

fn bench(c: &mut Criterion) {
    let text: usize = all()
        .iter()
        .map(|(n, l)| n.len() + l.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>())
        .sum();
    let before = IN_USE.load(Ordering::Relaxed);
    let nodes = ClusterNodes::new();
    nodes.apply(Change::Replace(all()));
    let held = IN_USE.load(Ordering::Relaxed) - before;
    eprintln!(
        "nodes: {NODES} nodes x 20 labels: {} KiB of names, keys and values; the index holds \
         {} KiB on the heap ({} bytes per node)",
        text / 1024,
        held / 1024,
        held / NODES
    );

    let mut g = c.benchmark_group("nodes");
    let mut n = 0;
    g.bench_function("status_update", |b| {
        b.iter_batched(
            || {
                n = (n + 1) % NODES;
                Change::Upsert {
                    name: node_name(n),
                    value: Labels::new(labels(n)),
                }
            },
            |change| black_box(nodes.apply(change)),
            criterion::BatchSize::SmallInput,
        )
    });
    let mut flip = false;
    g.bench_function("relabel", |b| {
        b.iter_batched(
            || {
                flip = !flip;
                let mut l = labels(7);
                l.insert("team".into(), if flip { "x" } else { "y" }.into());
                Change::Upsert {
                    name: node_name(7),
                    value: Labels::new(l),
                }
            },
            |change| black_box(nodes.apply(change)),
            criterion::BatchSize::SmallInput,
        )
    });
    let name = node_name(4_321);
    g.bench_function("lookup", |b| b.iter(|| black_box(nodes.node(&name))));
    g.bench_function("list", |b| b.iter(|| black_box(nodes.nodes())));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
