//! The agent → aggregator stream: versioned messages in length-prefixed frames.
//!
//! # Session
//!
//! An agent opens one HTTP/2 `POST` to [`STREAM_PATH`] per server replica, with
//! [`VERSION_HEADER`] set to [`VERSION`], and keeps its request body open. The body is a
//! sequence of frames, each a [`AgentMessage`]:
//!
//! 1. [`AgentMessage::Hello`] — who is speaking: the protocol version and the node. The
//!    server checks the agent's identity against this node before anything else.
//! 2. [`AgentMessage::Snapshot`] — the full state of the node: its totals and every
//!    attributed pod with its metadata and container counters. It replaces whatever the
//!    server held for this node (a reconnecting agent starts over).
//! 3. [`AgentMessage::Update`], once per tick — the node's totals and the counters of every
//!    pod it attributes now, plus the *changes* to pod metadata: pods added or relabelled
//!    (`upserts`) and pods gone (`removed`, served no more from that moment).
//!
//! The response body carries [`ServerMessage`]s in the same framing: a
//! [`ServerMessage::Welcome`] once the stream is accepted, and a [`ServerMessage::Error`]
//! before the server ends a stream it cannot continue. Refusals before the stream starts
//! (identity, version) are HTTP errors whose body is a [`ServerMessage::Error`] in JSON.
//!
//! # Versions
//!
//! [`VERSION`] is `major.minor`. A minor version only adds optional fields (older readers
//! ignore them: no message denies unknown fields); a new major version is a new protocol,
//! and both ends refuse a major they do not speak with an error naming both versions
//! ([`Version::check`]).
//!
//! History: 1.0, the first; 1.1 adds `swap` to [`crate::NodeSample`] and
//! [`crate::ContainerSample`] (sent on nodes with swap only); 1.2 adds `signals` (pressure
//! and throttling over the agent's window, [`crate::Signals`]) to [`crate::ContainerSample`]
//! and [`PodCounters`] (sent by agents run with `--custom-metrics` only), in a compact array
//! form (see [`crate::Signals`]; the object form of the first 1.2 builds, never released,
//! is refused); 1.3 adds `ready_since` (when the pod last became Ready) to [`PodMeta`] and
//! [`crate::PodSample`] (sent by agents that watch their pods, i.e. not from a pods file).
//!
//! # Framing
//!
//! Each frame is a 4-byte big-endian length, then that many bytes of JSON (serde_json): one
//! message, externally tagged (`{"update":{…}}`). External tagging lets serde decode the
//! message in one pass; an internal `"type"` field made it buffer every message first and
//! cost the server about a third of its ingest CPU (measured with perf at 500 nodes).
//! A frame longer than [`MAX_FRAME_BYTES`] is an error on both ends ([`Decoder`]), so a
//! peer can never make the other buffer without bound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ContainerSample, NodeSample, Signals, UnixNanos};

/// The request path of the stream.
pub const STREAM_PATH: &str = "/kpulse.wire/v1/stream";

/// The request and response header carrying [`VERSION`] as `major.minor`.
pub const VERSION_HEADER: &str = "kpulse-wire-version";

/// The protocol version this crate speaks.
pub const VERSION: Version = Version { major: 1, minor: 3 };

/// The largest frame either end accepts: a node with 1,000 pods of 4 containers, with
/// labels, is about 1 MiB of JSON.
pub const MAX_FRAME_BYTES: usize = 4 << 20;

/// Content type of both bodies.
pub const CONTENT_TYPE: &str = "application/x-kpulse-stream";

/// A protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    /// Incompatible changes.
    pub major: u16,
    /// Compatible additions.
    pub minor: u16,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for Version {
    type Err = Error;

    fn from_str(s: &str) -> Result<Version, Error> {
        let bad = || Error::BadVersion {
            text: s.chars().take(32).collect(),
        };
        let (major, minor) = s.trim().split_once('.').ok_or_else(bad)?;
        Ok(Version {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl Version {
    /// Whether a peer speaking `theirs` can talk to us (same major).
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedVersion`] naming both versions.
    pub fn check(theirs: Version) -> Result<(), Error> {
        if theirs.major == VERSION.major {
            Ok(())
        } else {
            Err(Error::UnsupportedVersion {
                theirs,
                ours: VERSION,
            })
        }
    }
}

/// What an agent sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentMessage {
    /// First: who is speaking.
    Hello(Hello),
    /// Second: the whole node.
    Snapshot(Snapshot),
    /// Then one per tick.
    Update(Update),
}

/// Who is speaking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version the agent speaks.
    pub version: Version,
    /// The node this stream describes (`metadata.name` of the Node). The server only
    /// accepts it from an identity bound to that node.
    pub node_name: String,
    /// The node's labels, when the agent knows them (standalone mode); otherwise empty.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// Free text for logs: the agent's version and collector.
    #[serde(default)]
    pub agent: String,
}

/// A pod's identity and labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMeta {
    /// `metadata.uid`: the key of every later reference to this pod.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// While the pod is Ready: its Ready condition's `lastTransitionTime` (whole seconds,
    /// as the API has it), i.e. when it last became Ready (protocol 1.3). Absent while it
    /// is not Ready, or when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_since: Option<UnixNanos>,
}

/// One pod's counters in a tick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodCounters {
    /// The pod (its [`PodMeta::uid`]).
    pub uid: String,
    /// Every container of the pod, or the pod is left out of the tick (as
    /// [`crate::PodSample`]).
    pub containers: Vec<ContainerSample>,
    /// The pod's pressure and throttling (protocol 1.2, `--custom-metrics`), as
    /// [`crate::PodSample::signals`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,
}

/// The whole node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// When the agent assembled it.
    pub sent_at: UnixNanos,
    /// The node's totals.
    pub node: NodeSample,
    /// Every pod the agent attributes, with or without counters this tick.
    pub pods: Vec<PodMeta>,
    /// Counters of the pods measured this tick.
    pub counters: Vec<PodCounters>,
    /// The tick before this one, when the agent has it (optional). With it a server that
    /// starts or restarts has two points for every container at once and serves rates
    /// immediately instead of one resolution later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
}

/// The counters of the tick before a [`Snapshot`]'s, for the pods the snapshot lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    /// The node's totals then.
    pub node: NodeSample,
    /// The pods' counters then.
    pub counters: Vec<PodCounters>,
}

/// One tick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// When the agent assembled it.
    pub sent_at: UnixNanos,
    /// The node's totals.
    pub node: NodeSample,
    /// Pods new since the last message, or whose metadata changed.
    #[serde(default)]
    pub upserts: Vec<PodMeta>,
    /// Pods gone since the last message (their uids): served no more.
    #[serde(default)]
    pub removed: Vec<String>,
    /// Counters of the pods measured this tick. A known pod without counters is not
    /// served this tick (it is not gone: that is what `removed` says).
    pub counters: Vec<PodCounters>,
}

/// What the server sends back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerMessage {
    /// The stream is accepted.
    Welcome {
        /// The version the server speaks.
        version: Version,
    },
    /// The server refuses or ends the stream, and why.
    Error {
        /// A sentence for the agent's log.
        message: String,
    },
}

/// Protocol errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A frame announces more than [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    FrameTooLarge {
        /// The announced length.
        len: usize,
    },
    /// A frame is not a message of this protocol.
    #[error("malformed message: {source}")]
    Malformed {
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The peer speaks another major version.
    #[error("wire protocol {theirs} is not supported (this end speaks {ours}); run matching agent and server versions")]
    UnsupportedVersion {
        /// The peer's version.
        theirs: Version,
        /// Ours.
        ours: Version,
    },
    /// A version string is not `major.minor`.
    #[error("{text:?} is not a protocol version (expected major.minor)")]
    BadVersion {
        /// The text (at most 32 characters of it).
        text: String,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({pending} bytes pending)")]
    Truncated {
        /// Bytes buffered.
        pending: usize,
    },
}

/// Encodes one message as a frame.
///
/// # Errors
///
/// [`Error::FrameTooLarge`] when the message does not fit a frame.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, Error> {
    let mut out = vec![0u8; 4];
    serde_json::to_writer(&mut out, message).map_err(|source| Error::Malformed { source })?;
    let len = out.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(Error::FrameTooLarge { len });
    }
    let prefix = u32::try_from(len).map_err(|_| Error::FrameTooLarge { len })?;
    out[..4].copy_from_slice(&prefix.to_be_bytes());
    Ok(out)
}

/// Buffer capacity a [`Decoder`] keeps when it holds no partial frame.
const IDLE_CAPACITY: usize = 4096;

/// Splits a byte stream into messages. Holds at most one frame (plus the bytes of the
/// chunk being pushed) in memory. Decoded frames are skipped over, not shifted out one by
/// one: the consumed bytes are dropped once per [`Decoder::push`], so a chunk full of
/// small frames costs time linear in its size.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded.
    start: usize,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, if one is buffered.
    ///
    /// # Errors
    ///
    /// [`Error::FrameTooLarge`] as soon as a length prefix over [`MAX_FRAME_BYTES`] is
    /// seen; [`Error::Malformed`] for a complete frame that is not a message.
    pub fn next_message<T: for<'de> Deserialize<'de>>(&mut self) -> Result<Option<T>, Error> {
        let pending = &self.buf[self.start..];
        let Some(prefix) = pending.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(Error::FrameTooLarge { len });
        }
        let Some(frame) = pending.get(4..4 + len) else {
            return Ok(None);
        };
        let message = serde_json::from_slice(frame).map_err(|source| Error::Malformed { source });
        self.start += 4 + len;
        if self.start == self.buf.len() {
            self.start = 0;
            self.buf.clear();
            if self.buf.capacity() > IDLE_CAPACITY {
                // Between ticks a stream holds nothing: thousands of idle streams must not
                // each keep a frame-sized buffer.
                self.buf = Vec::new();
            }
        }
        message.map(Some)
    }

    /// Call at the end of the stream.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] when a partial frame is left.
    pub fn finish(&self) -> Result<(), Error> {
        match self.pending() {
            0 => Ok(()),
            pending => Err(Error::Truncated { pending }),
        }
    }

    /// Bytes buffered and not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bytes, CpuNanos};

    fn node() -> NodeSample {
        NodeSample {
            timestamp: UnixNanos(10),
            started_at: Some(UnixNanos(1)),
            cpu: CpuNanos(5),
            memory_working_set: Bytes(7),
            swap: None,
        }
    }

    fn messages() -> Vec<AgentMessage> {
        vec![
            AgentMessage::Hello(Hello {
                version: VERSION,
                node_name: "n1".into(),
                node_labels: BTreeMap::from([("zone".into(), "a".into())]),
                agent: "kpulse-agent test".into(),
            }),
            AgentMessage::Snapshot(Snapshot {
                sent_at: UnixNanos(11),
                node: node(),
                pods: vec![PodMeta {
                    uid: "u1".into(),
                    namespace: "ns".into(),
                    name: "web".into(),
                    labels: BTreeMap::new(),
                    ready_since: Some(UnixNanos(5_000_000_000)),
                }],
                counters: vec![PodCounters {
                    uid: "u1".into(),
                    containers: vec![ContainerSample {
                        name: "app".into(),
                        timestamp: UnixNanos(10),
                        cgroup_id: None,
                        started_at: None,
                        cpu: CpuNanos(3),
                        memory_working_set: Bytes(4),
                        swap: None,
                        signals: None,
                    }],
                    signals: None,
                }],
                previous: None,
            }),
            AgentMessage::Update(Update {
                sent_at: UnixNanos(12),
                node: node(),
                upserts: vec![],
                removed: vec!["u1".into()],
                counters: vec![],
            }),
        ]
    }

    #[test]
    fn frames_round_trip_byte_by_byte() {
        let mut stream = Vec::new();
        for m in messages() {
            stream.extend(encode(&m).expect("encode"));
        }
        let mut d = Decoder::new();
        let mut got = Vec::new();
        for b in &stream {
            d.push(std::slice::from_ref(b));
            while let Some(m) = d.next_message::<AgentMessage>().expect("decode") {
                got.push(m);
            }
        }
        assert_eq!(got, messages());
        d.finish().expect("nothing left");
    }

    #[test]
    fn many_frames_in_one_chunk_and_frames_split_across_chunks() {
        let one: Vec<u8> = messages()
            .iter()
            .flat_map(|m| encode(m).expect("encode"))
            .collect();
        // 200 rounds of every message in one chunk, then the same split at odd places.
        let stream: Vec<u8> = one.iter().copied().cycle().take(one.len() * 200).collect();
        let want: Vec<AgentMessage> = messages()
            .into_iter()
            .cycle()
            .take(messages().len() * 200)
            .collect();
        for chunk in [stream.len(), 7, 1000, 4099] {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                d.push(c);
                while let Some(m) = d.next_message::<AgentMessage>().expect("decode") {
                    got.push(m);
                }
                assert!(
                    d.pending() < one.len(),
                    "only a partial frame stays pending"
                );
            }
            assert_eq!(got.len(), want.len(), "chunks of {chunk}");
            assert!(got == want, "chunks of {chunk}");
            assert_eq!(d.pending(), 0);
            d.finish().expect("nothing left");
        }
    }

    #[test]
    fn oversized_malformed_and_truncated_frames_are_errors() {
        let mut d = Decoder::new();
        d.push(&u32::MAX.to_be_bytes());
        assert!(matches!(
            d.next_message::<AgentMessage>(),
            Err(Error::FrameTooLarge { .. })
        ));
        let mut d = Decoder::new();
        d.push(&3u32.to_be_bytes());
        d.push(b"{x}");
        assert!(matches!(
            d.next_message::<AgentMessage>(),
            Err(Error::Malformed { .. })
        ));
        let mut d = Decoder::new();
        d.push(&10u32.to_be_bytes());
        d.push(b"{}");
        assert!(d.next_message::<AgentMessage>().expect("waits").is_none());
        assert!(matches!(d.finish(), Err(Error::Truncated { pending: 6 })));
        // A message of another type is malformed, not a panic.
        let mut d = Decoder::new();
        d.push(
            &encode(&ServerMessage::Error {
                message: "x".into(),
            })
            .expect("encode"),
        );
        assert!(matches!(
            d.next_message::<AgentMessage>(),
            Err(Error::Malformed { .. })
        ));
    }

    #[test]
    fn versions() {
        assert_eq!(
            "1.7".parse::<Version>().expect("parse"),
            Version { major: 1, minor: 7 }
        );
        assert!("1".parse::<Version>().is_err());
        assert!("a.b".parse::<Version>().is_err());
        Version::check(Version { major: 1, minor: 9 }).expect("same major");
        let e = Version::check(Version { major: 2, minor: 0 }).expect_err("other major");
        assert_eq!(
            e.to_string(),
            format!(
                "wire protocol 2.0 is not supported (this end speaks {VERSION}); run matching agent and server versions"
            )
        );
    }

    #[test]
    fn unknown_fields_are_ignored_for_minor_additions() {
        let json = r#"{"hello":{"version":{"major":1,"minor":4},"node_name":"n","future":true}}"#;
        let m: AgentMessage = serde_json::from_str(json).expect("decode");
        assert!(matches!(m, AgentMessage::Hello(h) if h.node_name == "n" && h.agent.is_empty()));
    }

    /// A 1.2 agent's pod has no `ready_since`; a 1.3 one sends it only while the pod is
    /// Ready.
    #[test]
    fn ready_since_is_optional() {
        let old: PodMeta =
            serde_json::from_str(r#"{"uid":"u","namespace":"n","name":"p"}"#).expect("1.2");
        assert_eq!(old.ready_since, None);
        let json = serde_json::to_string(&old).expect("encode");
        assert!(!json.contains("ready_since"), "{json}");
        let new: PodMeta = serde_json::from_str(
            r#"{"uid":"u","namespace":"n","name":"p","ready_since":1700000005000000000}"#,
        )
        .expect("1.3");
        assert_eq!(new.ready_since, Some(UnixNanos(1_700_000_005_000_000_000)));
    }
}
