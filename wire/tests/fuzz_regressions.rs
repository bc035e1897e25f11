//! Replays the committed fuzz inputs of `fuzz/` through the same bodies cargo-fuzz runs: the
//! minimized corpus (`fuzz/corpus/<target>/`) and every input that once crashed
//! (`fuzz/regressions/<target>/`). See docs/fuzzing.md.

use kpulse_testkit::{fuzz_dir, replay_fuzz_inputs};

#[test]
fn wire_decoder() {
    replay_fuzz_inputs("wire_decoder", kpulse_wire::fuzzing::wire_decoder);
}

/// Writes the seed inputs of `fuzz/corpus/wire_decoder/` (frames made by `encode`): run with
/// `cargo test -p kpulse-wire --test fuzz_regressions -- --ignored`, then minimize with
/// `cargo xtask fuzz --minimize`.
#[test]
#[ignore = "writes seed files into fuzz/corpus"]
fn write_seeds() {
    use std::collections::BTreeMap;

    use kpulse_wire::stream::{
        encode, AgentMessage, Hello, PodCounters, PodMeta, Previous, ServerMessage, Snapshot,
        Update, VERSION,
    };
    use kpulse_wire::{Bytes, CgroupId, ContainerSample, CpuNanos, NodeSample, UnixNanos};

    let node = NodeSample {
        timestamp: UnixNanos(1_700_000_000_000_000_000),
        started_at: Some(UnixNanos(1_699_000_000_000_000_000)),
        cpu: CpuNanos(441_268_738_000),
        memory_working_set: Bytes(1_529_110_528),
        swap: None,
    };
    let container = |name: &str, id: u64| ContainerSample {
        name: name.into(),
        timestamp: UnixNanos(1_700_000_000_000_000_000),
        cgroup_id: Some(CgroupId(id)),
        started_at: id
            .is_multiple_of(2)
            .then_some(UnixNanos(1_699_999_000_000_000_000)),
        cpu: CpuNanos(1_268_270_216),
        memory_working_set: Bytes(74_625_024),
        swap: None,
        signals: None,
    };
    let pod = |uid: &str, name: &str| PodMeta {
        uid: uid.into(),
        namespace: "default".into(),
        name: name.into(),
        labels: BTreeMap::from([("app".into(), name.into()), ("tier".into(), "é\"\\".into())]),
        ready_since: None,
    };
    let counters = vec![PodCounters {
        uid: "5f8c0f2a-1b2c-4d3e-9f00-0123456789ab".into(),
        containers: vec![container("app", 4711), container("sidecar", 4712)],
        signals: None,
    }];
    let agent = [
        AgentMessage::Hello(Hello {
            version: VERSION,
            node_name: "node-a".into(),
            node_labels: BTreeMap::from([("topology.kubernetes.io/zone".into(), "a".into())]),
            agent: "kpulse-agent 0.1.0 ebpf".into(),
        }),
        AgentMessage::Snapshot(Snapshot {
            sent_at: UnixNanos(1_700_000_000_500_000_000),
            node,
            pods: vec![
                pod("5f8c0f2a-1b2c-4d3e-9f00-0123456789ab", "web-0"),
                pod("9c8d5d1b1e8e0e8f8d9b5b7e0b3c4a4f", "etcd-node-a"),
            ],
            counters: counters.clone(),
            previous: Some(Previous {
                node,
                counters: counters.clone(),
            }),
        }),
        AgentMessage::Update(Update {
            sent_at: UnixNanos(u64::MAX),
            node: NodeSample {
                started_at: None,
                ..node
            },
            upserts: vec![pod("214f3ba8-4b69-4bdb-a7d5-5ecc73f04ae9", "api")],
            removed: vec!["9c8d5d1b1e8e0e8f8d9b5b7e0b3c4a4f".into()],
            counters,
        }),
    ];
    let server = [
        ServerMessage::Welcome { version: VERSION },
        ServerMessage::Error {
            message: "wire protocol 2.0 is not supported".into(),
        },
    ];
    let agent_frames: Vec<Vec<u8>> = agent.iter().map(|m| encode(m).expect("encode")).collect();
    let server_frames: Vec<Vec<u8>> = server.iter().map(|m| encode(m).expect("encode")).collect();
    let dir = fuzz_dir().join("corpus/wire_decoder");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let write = |name: &str, flags: u8, chunking: u8, frames: &[Vec<u8>]| {
        let mut data = vec![flags, chunking];
        for (i, frame) in frames.iter().enumerate() {
            if flags & 2 == 0 {
                data.extend_from_slice(frame);
            } else {
                // Framed mode: payloads separated by NUL bytes.
                if i > 0 {
                    data.push(0);
                }
                data.extend_from_slice(&frame[4..]);
            }
        }
        std::fs::write(dir.join(format!("seed-{name}")), data).expect("write seed");
    };
    write("agent-session-whole", 0, 255, &agent_frames);
    write("agent-session-bytewise", 0, 0, &agent_frames);
    write("agent-session-chunks", 0, 7, &agent_frames);
    write("agent-session-framed", 2, 255, &agent_frames);
    for (i, frame) in agent_frames.iter().enumerate() {
        write(&format!("agent-{i}"), 0, 255, std::slice::from_ref(frame));
    }
    write("server-session", 1, 3, &server_frames);
    write("server-session-framed", 3, 255, &server_frames);
    // The stream ends inside a frame, and a frame is over the limit.
    let mut truncated = agent_frames[0].clone();
    truncated.truncate(truncated.len() - 3);
    write("agent-truncated", 0, 9, &[truncated]);
    write("oversized-prefix", 0, 255, &[vec![0x00, 0x40, 0x00, 0x01]]);
}
