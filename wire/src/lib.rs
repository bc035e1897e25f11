//! The agent → aggregator protocol: *cumulative* counters with their timestamps (rates are
//! derived by the server, from two points, as metrics-server does), pod metadata, and the
//! versioned, framed stream that carries them ([`stream`]). No I/O: the agent's and the
//! server's transports use it.
//!
//! The server's store consumes one [`NodeBatch`] per node per tick; the stream's messages
//! ([`stream::Snapshot`], [`stream::Update`]) carry the same samples without repeating pod
//! metadata every tick, and the server joins them back into batches.
//!
//! # What a batch means
//!
//! A [`NodeBatch`] is a **full snapshot** of one node: the node's own totals and every pod
//! the agent could attribute on that tick: a pod that is missing from a node's batch is gone
//! from that node, and the store forgets it (the stream's removals say so explicitly). An
//! agent that cannot measure every container of a pod leaves the whole pod out (as
//! metrics-server drops a pod whose container metrics are incomplete), rather than sending
//! a partial pod that would look like a pod with fewer containers.
//!
//! # Units
//!
//! Every quantity is an integer in a newtype that names its unit ([`CpuNanos`], [`Bytes`],
//! [`UnixNanos`]); there are no floats. CPU is a cumulative counter, never a rate: the agent
//! does not divide by anything. Timestamps are wall-clock nanoseconds since the epoch,
//! because the served metrics carry wall-clock timestamps and the aggregator compares
//! them with its own clock to expire old data. The agent takes them from a timeline that
//! advances with `CLOCK_BOOTTIME` (`kpulse_agent::clock`), so that the difference between
//! two timestamps of one instance is real elapsed time even when the node's wall clock
//! steps; at a step it moves every timestamp *and every `started_at`*, so the aggregator
//! sees new instances rather than a window bent by the step.
//!
//! # Instances and restarts
//!
//! A cumulative counter only makes sense within one *instance* of a container (one cgroup).
//! [`ContainerSample::cgroup_id`] and [`ContainerSample::started_at`] identify the instance:
//! when either changes between two samples of the same container name, the aggregator treats
//! the container as restarted and never subtracts counters of two different instances. Both
//! must therefore be *stable*: the same value in every sample of one instance.
//!
//! # What this crate is not
//!
//! Not the kernel ABI (`kpulse-common` is), not a client or a server: plain data with serde
//! derives and the frame codec.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

#[doc(hidden)]
pub mod fuzzing;
pub mod stream;

/// Cumulative CPU time in nanoseconds (a counter that only grows within one instance).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct CpuNanos(pub u64);

/// A quantity of memory in bytes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

/// A wall-clock instant: nanoseconds since the Unix epoch (`CLOCK_REALTIME`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct UnixNanos(pub u64);

impl UnixNanos {
    /// Converts a [`SystemTime`]; instants before the epoch become 0 and instants past
    /// `u64::MAX` nanoseconds (year 2554) saturate.
    pub fn from_system_time(t: SystemTime) -> UnixNanos {
        let since_epoch = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        UnixNanos(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The same instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        // Cannot overflow: u64 nanoseconds end in 2554, far inside SystemTime's range.
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_nanos(self.0))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// The time from `earlier` to `self`, or `None` when `earlier` is not before `self`.
    pub fn checked_since(self, earlier: UnixNanos) -> Option<Duration> {
        match self.0.checked_sub(earlier.0) {
            Some(d) if d > 0 => Some(Duration::from_nanos(d)),
            _ => None,
        }
    }
}

/// A cgroup id: the kernfs node id, which is also the inode number of the cgroup's
/// directory. Unique per boot, so a new container instance (a new cgroup) gets a new id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CgroupId(pub u64);

/// Everything one node's agent sends for one tick: a full snapshot of that node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBatch {
    /// The Kubernetes `Node` name (`metadata.name`) this batch describes.
    pub node_name: String,
    /// When the agent assembled the batch (the agent's clock). For transport-lag
    /// diagnostics; the aggregator orders points by their own timestamps, not by this.
    pub sent_at: UnixNanos,
    /// The node's own totals.
    pub node: NodeSample,
    /// Every pod on the node the agent attributed this tick. A pod absent here is gone.
    pub pods: Vec<PodSample>,
}

/// A node's totals at one instant, defined as kubelet defines them for the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSample {
    /// When the counters were read.
    pub timestamp: UnixNanos,
    /// When [`NodeSample::cpu`] was zero: the node's boot time. `None` if unknown. A change
    /// means the node rebooted.
    #[serde(default)]
    pub started_at: Option<UnixNanos>,
    /// Cumulative CPU time of the whole node since boot, as the kubelet reads it: the root
    /// cgroup's usage (v2 `cpu.stat`, v1 `cpuacct.usage`).
    pub cpu: CpuNanos,
    /// Working set of the whole node, as the kubelet computes it: the root memory cgroup's
    /// usage less its inactive file pages (v2: `anon + file - inactive_file` of
    /// `memory.stat`; v1: `memory.usage_in_bytes - total_inactive_file`), floored at 0.
    pub memory_working_set: Bytes,
    /// Swap in use on the node (`SwapTotal - SwapFree`), sent only when the node has swap:
    /// absent means "no swap on this node", and then no container of the batch carries
    /// swap either. Added in protocol 1.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<Bytes>,
}

/// One pod's containers at one tick.
///
/// Namespace and name are the keys the Metrics API serves by; the uid tells a pod from a
/// later pod of the same name (a StatefulSet replica recreated on the same node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSample {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Every container of the pod the agent measured; all of them, or the pod is left out.
    pub containers: Vec<ContainerSample>,
    /// The pod's pressure and throttling over the agent's window (protocol 1.2); absent
    /// unless the agent runs with `--custom-metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,
    /// When the pod last became Ready, while it is ([`stream::PodMeta::ready_since`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_since: Option<UnixNanos>,
}

/// One container's counters at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSample {
    /// The container's name in the pod spec.
    pub name: String,
    /// When the counters were read.
    pub timestamp: UnixNanos,
    /// The id of the cgroup the counters come from; a different id is a different instance
    /// (a restart). `None` if unknown.
    #[serde(default)]
    pub cgroup_id: Option<CgroupId>,
    /// When this instance's counters were zero: the container cgroup's creation. It must
    /// be the same value in every sample of one instance (compute it once). A change is a
    /// restart; a recent value lets the aggregator serve a rate after the first sample.
    /// `None` if unknown (then the first rate needs two samples).
    #[serde(default)]
    pub started_at: Option<UnixNanos>,
    /// Cumulative CPU time of this instance.
    pub cpu: CpuNanos,
    /// Working set: memory usage minus `inactive_file`, floored at 0.
    pub memory_working_set: Bytes,
    /// Swap used by this instance (kubelet's `container_swap_usage_bytes`): present on
    /// nodes with swap, absent elsewhere. Added in protocol 1.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<Bytes>,
    /// This instance's pressure and throttling over the agent's window (protocol 1.2);
    /// absent unless the agent runs with `--custom-metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,
}

/// What share of a trailing window a cgroup spent stalled or throttled: the difference of
/// two kernel readings of a cumulative counter, divided by what it is a share of. The agent
/// computes these (it keeps each cgroup's readings over its window); the server serves them
/// as they come. Added in protocol 1.2; every figure is optional, and absent where the
/// kernel keeps no such counter for the cgroup.
///
/// # On the wire
///
/// An array of the figures in the order of the fields, each a [`Fraction`] or `null`:
/// `[cpu_pressure, memory_pressure, cpu_throttled]`, for example
/// `[[871234,30000],[0,30000],[950000,30000]]`. Absent figures at the end are left out
/// (`[[871234,30000]]` has CPU pressure only). A later minor version may append figures;
/// a reader ignores the elements past those it knows. A node sends one of these per pod
/// and per container every tick: as an object with a key per figure it took the server
/// twice as long to decode (`cargo bench -p kpulse-wire --bench decode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// PSI `some` for CPU: the share of the window in which at least one task waited for a
    /// CPU (`cpu.pressure`).
    pub cpu_pressure: Option<Fraction>,
    /// PSI `some` for memory (`memory.pressure`).
    pub memory_pressure: Option<Fraction>,
    /// The share of CFS periods in the window in which the quota ran out (`cpu.stat`
    /// `nr_throttled / nr_periods`; 0 when no period ran).
    pub cpu_throttled: Option<Fraction>,
}

impl Signals {
    /// Whether no figure is present.
    pub fn is_empty(&self) -> bool {
        self.cpu_pressure.is_none()
            && self.memory_pressure.is_none()
            && self.cpu_throttled.is_none()
    }

    /// The figures in their wire order.
    fn figures(&self) -> [Option<Fraction>; 3] {
        [self.cpu_pressure, self.memory_pressure, self.cpu_throttled]
    }
}

impl Serialize for Signals {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let figures = self.figures();
        let len = figures
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1);
        let mut seq = serializer.serialize_seq(Some(len))?;
        for f in &figures[..len] {
            seq.serialize_element(f)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Signals {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Signals, D::Error> {
        struct Figures;
        impl<'de> serde::de::Visitor<'de> for Figures {
            type Value = Signals;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of [ppm, window_ms] figures or nulls")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Signals, A::Error> {
                let mut next = || -> Result<Option<Fraction>, A::Error> {
                    Ok(seq.next_element::<Option<Fraction>>()?.flatten())
                };
                let signals = Signals {
                    cpu_pressure: next()?,
                    memory_pressure: next()?,
                    cpu_throttled: next()?,
                };
                // Figures of later minor versions.
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(signals)
            }
        }
        deserializer.deserialize_seq(Figures)
    }
}

/// A share of a window, in integers: `ppm` parts per million (0 to [`Fraction::WHOLE`])
/// over `window_ms` milliseconds ending at the sample's timestamp or shortly before it.
///
/// On the wire it is the pair `[ppm, window_ms]`: a node sends about a thousand of them
/// each tick, and as an object with two keys they cost the server more than twice the
/// time to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "(u32, u32)", into = "(u32, u32)")]
pub struct Fraction {
    /// Parts per million of the window.
    pub ppm: u32,
    /// The window the share is of, in milliseconds.
    pub window_ms: u32,
}

impl From<(u32, u32)> for Fraction {
    fn from((ppm, window_ms): (u32, u32)) -> Fraction {
        Fraction { ppm, window_ms }
    }
}

impl From<Fraction> for (u32, u32) {
    fn from(f: Fraction) -> (u32, u32) {
        (f.ppm, f.window_ms)
    }
}

impl Fraction {
    /// One whole window, in parts per million.
    pub const WHOLE: u32 = 1_000_000;

    /// `part / whole` over `window_ms`, rounded to the nearest part per million and capped
    /// at one whole; `None` when `whole` is 0.
    pub fn of(part: u64, whole: u64, window_ms: u32) -> Option<Fraction> {
        if whole == 0 {
            return None;
        }
        let ppm = (u128::from(part) * u128::from(Fraction::WHOLE) + u128::from(whole) / 2)
            / u128::from(whole);
        Some(Fraction {
            ppm: u32::try_from(ppm.min(u128::from(Fraction::WHOLE))).unwrap_or(Fraction::WHOLE),
            window_ms,
        })
    }

    /// Whether a peer could have sent this: a share of at most one whole of a window
    /// longer than zero.
    pub fn is_valid(&self) -> bool {
        self.ppm <= Fraction::WHOLE && self.window_ms > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> NodeBatch {
        NodeBatch {
            node_name: "node-a".into(),
            sent_at: UnixNanos(1_700_000_000_500_000_000),
            node: NodeSample {
                timestamp: UnixNanos(1_700_000_000_000_000_000),
                started_at: Some(UnixNanos(1_699_000_000_000_000_000)),
                cpu: CpuNanos(123_456_789),
                memory_working_set: Bytes(4 << 30),
                swap: None,
            },
            pods: vec![PodSample {
                uid: "0b5e-uid".into(),
                namespace: "default".into(),
                name: "web-0".into(),
                containers: vec![ContainerSample {
                    name: "app".into(),
                    timestamp: UnixNanos(1_700_000_000_000_000_000),
                    cgroup_id: Some(CgroupId(4242)),
                    started_at: None,
                    cpu: CpuNanos(1_000),
                    memory_working_set: Bytes(1 << 20),
                    swap: None,
                    signals: None,
                }],
                signals: None,
                ready_since: None,
            }],
        }
    }

    #[test]
    fn json_round_trip_keeps_every_field() {
        let b = batch();
        let json = serde_json::to_string(&b).expect("serialize");
        let back: NodeBatch = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, b);
    }

    #[test]
    fn units_serialize_as_bare_integers() {
        let json = serde_json::to_value(batch()).expect("serialize");
        assert_eq!(json["node"]["cpu"], 123_456_789);
        assert_eq!(json["pods"][0]["containers"][0]["cgroup_id"], 4242);
        assert!(json["pods"][0]["containers"][0]["started_at"].is_null());
    }

    #[test]
    fn optional_identity_fields_may_be_absent() {
        let json = r#"{"name":"app","timestamp":5,"cpu":1,"memory_working_set":2}"#;
        let c: ContainerSample = serde_json::from_str(json).expect("deserialize");
        assert_eq!(c.cgroup_id, None);
        assert_eq!(c.started_at, None);
        assert_eq!(c.timestamp, UnixNanos(5));
        assert_eq!(c.swap, None, "a 1.0 agent sends no swap");
    }

    /// Swap (protocol 1.1) is written only when there is some to say, so a node without swap
    /// sends exactly what a 1.0 agent sent.
    #[test]
    fn swap_is_written_only_when_present() {
        let mut b = batch();
        let json = serde_json::to_string(&b).expect("serialize");
        assert!(!json.contains("swap"), "{json}");
        b.node.swap = Some(Bytes(3 << 30));
        b.pods[0].containers[0].swap = Some(Bytes(0));
        let json = serde_json::to_value(&b).expect("serialize");
        assert_eq!(json["node"]["swap"], 3u64 << 30);
        assert_eq!(json["pods"][0]["containers"][0]["swap"], 0);
        let back: NodeBatch = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, b);
    }

    /// Signals (protocol 1.2) are written only when present, and only the figures present.
    #[test]
    fn signals_are_written_only_when_present() {
        let mut b = batch();
        let json = serde_json::to_string(&b).expect("serialize");
        assert!(!json.contains("signals"), "{json}");
        let share = Fraction::of(1, 4, 30_000);
        b.pods[0].signals = Some(Signals {
            cpu_pressure: share,
            ..Signals::default()
        });
        b.pods[0].containers[0].signals = Some(Signals {
            cpu_throttled: Fraction::of(0, 7, 29_500),
            ..Signals::default()
        });
        let json = serde_json::to_value(&b).expect("serialize");
        assert_eq!(
            json["pods"][0]["signals"],
            serde_json::json!([[250_000, 30_000]])
        );
        assert_eq!(
            json["pods"][0]["containers"][0]["signals"],
            serde_json::json!([null, null, [0, 29_500]])
        );
        let back: NodeBatch = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, b);
    }

    /// The figures' array: nulls for absent ones, trailing absent ones left out, elements
    /// past the known figures ignored (a later minor version's), anything else refused.
    #[test]
    fn signals_are_an_array_of_pairs() {
        let f = |ppm, window_ms| Some(Fraction { ppm, window_ms });
        let all = Signals {
            cpu_pressure: f(871_234, 30_000),
            memory_pressure: f(0, 30_000),
            cpu_throttled: f(950_000, 29_000),
        };
        let json = serde_json::to_string(&all).expect("serialize");
        assert_eq!(json, "[[871234,30000],[0,30000],[950000,29000]]");
        let middle = Signals {
            memory_pressure: f(5, 1),
            ..Signals::default()
        };
        assert_eq!(
            serde_json::to_string(&middle).expect("serialize"),
            "[null,[5,1]]"
        );
        assert_eq!(
            serde_json::to_string(&Signals::default()).expect("serialize"),
            "[]"
        );
        for (text, want) in [
            ("[]", Signals::default()),
            ("[null,[5,1]]", middle),
            ("[null,[5,1],null]", middle),
            (
                "[[871234,30000],[0,30000],[950000,29000],[1,2],{\"later\":true}]",
                all,
            ),
        ] {
            let got: Signals = serde_json::from_str(text).expect(text);
            assert_eq!(got, want, "{text}");
        }
        for bad in [
            r#"{"cpu_pressure":{"ppm":1,"window_ms":2}}"#,
            "[[1]]",
            "[[1,2,3]]",
            "[[-1,2]]",
            "[[1,4294967296]]",
            "[\"1,2\"]",
            "[[1,2]",
        ] {
            assert!(
                serde_json::from_str::<Signals>(bad).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn fractions_round_cap_and_refuse_an_empty_whole() {
        assert_eq!(Fraction::of(1, 3, 1).map(|f| f.ppm), Some(333_333));
        assert_eq!(Fraction::of(2, 3, 1).map(|f| f.ppm), Some(666_667));
        assert_eq!(Fraction::of(5, 4, 1).map(|f| f.ppm), Some(Fraction::WHOLE));
        assert_eq!(
            Fraction::of(u64::MAX, u64::MAX, 1).map(|f| f.ppm),
            Some(Fraction::WHOLE)
        );
        assert_eq!(Fraction::of(0, 0, 1), None);
        assert!(Fraction {
            ppm: Fraction::WHOLE,
            window_ms: 1
        }
        .is_valid());
        assert!(!Fraction {
            ppm: Fraction::WHOLE + 1,
            window_ms: 1
        }
        .is_valid());
        assert!(!Fraction {
            ppm: 0,
            window_ms: 0
        }
        .is_valid());
    }

    #[test]
    fn unix_nanos_conversions() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(42);
        assert_eq!(UnixNanos::from_system_time(t), UnixNanos(42));
        assert_eq!(UnixNanos(42).to_system_time(), t);
        let max = UnixNanos(u64::MAX);
        assert_eq!(UnixNanos::from_system_time(max.to_system_time()), max);
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(UnixNanos::from_system_time(before), UnixNanos(0));
        assert_eq!(
            UnixNanos(10).checked_since(UnixNanos(4)),
            Some(Duration::from_nanos(6))
        );
        assert_eq!(UnixNanos(4).checked_since(UnixNanos(4)), None);
        assert_eq!(UnixNanos(4).checked_since(UnixNanos(10)), None);
    }
}
