//! A file feed: agents' messages read from a file instead of the network (`--feed-file`),
//! for tests and offline use.
//!
//! The file is JSON Lines, appended to by whoever produces it; each complete line is one
//! [`AgentMessage`] of the wire protocol, in its JSON form:
//!
//! ```text
//! {"hello":{"version":{"major":1,"minor":0},"node_name":"n1","node_labels":{"zone":"a"}}}
//! {"snapshot":{"sent_at":…,"node":{…},"pods":[{"uid":"u1","namespace":"ns","name":"p","labels":{…}}],"counters":[{"uid":"u1","containers":[…]}]}}
//! {"update":{"sent_at":…,"node":{…},"upserts":[],"removed":["u1"],"counters":[…]}}
//! ```
//!
//! A Hello selects the node the following lines apply to, creating its session the first
//! time; a Hello for a node that already has a feed session selects it again without
//! resetting it (only the node's labels are updated), so several nodes can be interleaved
//! in one file. Snapshots and Updates go through the same session code as agents' network
//! streams ([`crate::session`]); the file is local, so its identities are trusted. A node
//! that an agent then streams over the network is taken over by that stream: the feed's
//! lines for it are refused until the file says Hello for it again.
//!
//! The server follows the file as `tail -F` does: lines are read once, a partial last line
//! waits for its newline, and a file that was replaced or truncated is read again from its
//! start. A bad line is logged with its number and skipped; a line longer than
//! [`MAX_LINE_BYTES`] is skipped up to its newline.

use std::{
    collections::HashMap,
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kpulse_wire::stream::AgentMessage;

use crate::{
    session::{check_hello, HelloError, Lease, SessionError, Sessions},
    store::Clock,
};

/// Longest line read (a batch of a 110-pod node is about 60 KiB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// How often the file is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Most nodes one feed file may describe.
pub const MAX_NODES: usize = 65_536;

/// One line of the feed.
pub type Line = AgentMessage;

/// Reading the feed failed (the file is retried on the next poll).
#[derive(Debug, thiserror::Error)]
#[error("feed {path}: {source}")]
pub struct Error {
    path: String,
    #[source]
    source: std::io::Error,
}

/// A line that is not a feed line.
#[derive(Debug, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number in the file (as it was when read).
    pub number: u64,
    /// Why.
    pub reason: String,
}

/// Follows one file: where it was read up to, and which file that was.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    identity: Option<(u64, u64)>,
    offset: u64,
    line_number: u64,
    partial: Vec<u8>,
    skipping: bool,
}

impl Tail {
    /// Follows `path` from its start (it need not exist yet).
    pub fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_owned(),
            identity: None,
            offset: 0,
            line_number: 0,
            partial: Vec::new(),
            skipping: false,
        }
    }

    /// The complete lines appended since the last call, parsed.
    ///
    /// # Errors
    ///
    /// When the file cannot be read; a missing file is not an error (nothing yet).
    pub fn poll(&mut self) -> Result<Vec<Result<Line, BadLine>>, Error> {
        let fail = |source| Error {
            path: self.path.display().to_string(),
            source,
        };
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(fail(e)),
        };
        let meta = file.metadata().map_err(fail)?;
        let identity = Some((meta.dev(), meta.ino()));
        if identity != self.identity || meta.len() < self.offset {
            // A new file, or this one truncated: from the start.
            self.identity = identity;
            self.offset = 0;
            self.line_number = 0;
            self.partial.clear();
            self.skipping = false;
        }
        if meta.len() == self.offset {
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(self.offset)).map_err(fail)?;
        // Bounded per poll: at most one maximal line plus what is pending.
        let budget = (MAX_LINE_BYTES as u64).saturating_mul(2);
        let mut fresh = Vec::new();
        file.take(budget).read_to_end(&mut fresh).map_err(fail)?;
        self.offset += fresh.len() as u64;
        let mut out = Vec::new();
        let mut rest: &[u8] = &fresh;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let (piece, after) = rest.split_at(end);
            rest = &after[1..];
            self.line_number += 1;
            if self.skipping {
                self.skipping = false;
                self.partial.clear();
                continue;
            }
            if self.partial.len() + piece.len() > MAX_LINE_BYTES {
                self.partial.clear();
                out.push(Err(BadLine {
                    number: self.line_number,
                    reason: format!("longer than {MAX_LINE_BYTES} bytes; skipped"),
                }));
                continue;
            }
            self.partial.extend_from_slice(piece);
            let line = std::mem::take(&mut self.partial);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            out.push(
                serde_json::from_slice::<AgentMessage>(&line).map_err(|e| BadLine {
                    number: self.line_number,
                    reason: e.to_string(),
                }),
            );
        }
        if !self.skipping {
            self.partial.extend_from_slice(rest);
            if self.partial.len() > MAX_LINE_BYTES {
                out.push(Err(BadLine {
                    number: self.line_number + 1,
                    reason: format!("longer than {MAX_LINE_BYTES} bytes; skipped"),
                }));
                self.partial.clear();
                self.skipping = true;
            }
        }
        Ok(out)
    }
}

/// Why a line was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A Snapshot or Update before any Hello.
    #[error("{0} before any Hello: nothing says which node it describes")]
    NoHello(&'static str),
    /// A Hello that a network stream would be refused for.
    #[error("Hello refused: {0}")]
    Hello(#[from] HelloError),
    /// More than [`MAX_NODES`] nodes.
    #[error("more than {MAX_NODES} nodes in the feed")]
    TooManyNodes,
    /// The session refused the message.
    #[error("node {node}: {source}")]
    Session {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: SessionError,
    },
}

/// The feed's sessions, by node, and the node the next lines apply to.
#[derive(Debug)]
pub struct FeedSessions<C: Clock + 'static> {
    sessions: Arc<Sessions<C>>,
    open: HashMap<String, Lease<C>>,
    current: Option<String>,
}

impl<C: Clock + 'static> FeedSessions<C> {
    /// No session yet; they will be claimed from `sessions`.
    pub fn new(sessions: Arc<Sessions<C>>) -> FeedSessions<C> {
        FeedSessions {
            sessions,
            open: HashMap::new(),
            current: None,
        }
    }

    /// Applies one line.
    ///
    /// # Errors
    ///
    /// [`ApplyError`]; the line is then skipped.
    pub fn apply(&mut self, message: AgentMessage) -> Result<(), ApplyError> {
        let kind = match &message {
            AgentMessage::Hello(hello) => {
                check_hello(hello)?;
                let node = hello.node_name.clone();
                match self.open.get(&node) {
                    Some(lease) => lease.set_node_labels(&hello.node_labels),
                    None => {
                        if self.open.len() >= MAX_NODES {
                            return Err(ApplyError::TooManyNodes);
                        }
                        // The file takes no replacement notice: a refused apply says so.
                        let (lease, _replaced) = self.sessions.claim(hello);
                        tracing::info!(%node, "feed: session started");
                        self.open.insert(node.clone(), lease);
                    }
                }
                self.current = Some(node);
                return Ok(());
            }
            AgentMessage::Snapshot(_) => "Snapshot",
            AgentMessage::Update(_) => "Update",
        };
        let Some(node) = self.current.clone() else {
            return Err(ApplyError::NoHello(kind));
        };
        let Some(lease) = self.open.get_mut(&node) else {
            return Err(ApplyError::NoHello(kind));
        };
        match lease.apply(message) {
            Ok(_) => Ok(()),
            Err(source) => {
                if matches!(source, SessionError::Replaced { .. }) {
                    self.open.remove(&node);
                    self.current = None;
                }
                Err(ApplyError::Session { node, source })
            }
        }
    }
}

/// Follows `path` until the task is dropped, applying every line.
pub async fn follow<C: Clock + 'static>(path: PathBuf, sessions: Arc<Sessions<C>>) {
    let mut feed = FeedSessions::new(sessions);
    let mut tail = Tail::new(&path);
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        ticks.tick().await;
        let (back, polled) = match tokio::task::spawn_blocking(move || {
            let r = tail.poll();
            (tail, r)
        })
        .await
        {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "feed: reader task failed; no longer following");
                return;
            }
        };
        tail = back;
        match polled {
            Ok(lines) => {
                last_error = None;
                for line in lines {
                    match line {
                        Ok(line) => {
                            if let Err(e) = feed.apply(line) {
                                tracing::warn!(
                                    path = %path.display(),
                                    error = %kpulse_process::error_chain(&e),
                                    "feed: line not applied"
                                );
                            }
                        }
                        Err(bad) => tracing::warn!(
                            path = %path.display(),
                            line = bad.number,
                            reason = %bad.reason,
                            "feed: line skipped"
                        ),
                    }
                }
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(&text) {
                    tracing::warn!(error = %text, "feed: cannot read; retrying");
                    last_error = Some(text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("kpulse-feed-{}-{name}", std::process::id()))
    }

    const HELLO: &str = r#"{"hello":{"version":{"major":1,"minor":0},"node_name":"n1"}}"#;
    const UPDATE: &str = r#"{"update":{"sent_at":1,"node":{"timestamp":1,"cpu":5,"memory_working_set":7},"counters":[]}}"#;

    fn kinds(lines: &[Result<Line, BadLine>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| match l {
                Ok(AgentMessage::Hello(h)) => format!("hello {}", h.node_name),
                Ok(AgentMessage::Snapshot(_)) => "snapshot".to_owned(),
                Ok(AgentMessage::Update(_)) => "update".to_owned(),
                Err(bad) => format!("bad {}", bad.number),
            })
            .collect()
    }

    #[test]
    fn follows_appends_partial_lines_and_replacement() {
        let path = temp("follow");
        let _ = std::fs::remove_file(&path);
        let mut tail = Tail::new(&path);
        assert!(tail.poll().expect("missing is empty").is_empty());

        let mut f = File::create(&path).expect("create");
        write!(f, "{HELLO}\n\n{UPDATE}\nnot json\n{}", &UPDATE[..5]).expect("write");
        f.flush().expect("flush");
        assert_eq!(
            kinds(&tail.poll().expect("poll")),
            ["hello n1", "update", "bad 4"]
        );
        assert!(tail.poll().expect("poll").is_empty(), "read once");
        writeln!(f, "{}", &UPDATE[5..]).expect("write");
        f.flush().expect("flush");
        assert_eq!(
            kinds(&tail.poll().expect("poll")),
            ["update"],
            "partial line completed"
        );

        // Replaced by a new file: read from its start.
        let tmp = temp("follow.new");
        std::fs::write(&tmp, format!("{HELLO}\n")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        assert_eq!(kinds(&tail.poll().expect("poll")), ["hello n1"]);
        // Truncated: from the start too.
        std::fs::write(&path, "{\"x\":1}\n").expect("truncate");
        let lines = tail.poll().expect("poll");
        assert_eq!(kinds(&lines), ["bad 1"]);
        std::fs::remove_file(&path).expect("cleanup");
    }

    #[test]
    fn overlong_lines_are_skipped_to_their_end() {
        let path = temp("long");
        let mut f = File::create(&path).expect("create");
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        f.write_all(&long).expect("write");
        f.flush().expect("flush");
        let mut tail = Tail::new(&path);
        assert_eq!(kinds(&tail.poll().expect("poll")), ["bad 1"]);
        f.write_all(b"yyy\n").expect("write");
        writeln!(f, "{HELLO}").expect("write");
        f.flush().expect("flush");
        assert_eq!(kinds(&tail.poll().expect("poll")), ["hello n1"]);
        std::fs::remove_file(&path).expect("cleanup");
    }

    #[test]
    fn hellos_select_sessions_without_resetting_them() {
        use crate::{
            metadata::{MetadataSource, StreamMetadata},
            selfmetrics::IngestMetrics,
            store::{Store, StoreConfig},
        };
        let store = Arc::new(Store::new(StoreConfig::new(Duration::from_secs(10))).expect("store"));
        let sessions = Sessions::new(store, StreamMetadata::new(), IngestMetrics::new());
        let mut feed = FeedSessions::new(sessions.clone());
        let line = |s: String| serde_json::from_str::<AgentMessage>(&s).expect("line");
        let hello = |node: &str| {
            line(format!(
                r#"{{"hello":{{"version":{{"major":1,"minor":0}},"node_name":"{node}"}}}}"#
            ))
        };
        let snapshot = |uid: &str, name: &str| {
            line(format!(
                r#"{{"snapshot":{{"sent_at":1,"node":{{"timestamp":1,"cpu":5,"memory_working_set":7}},
                    "pods":[{{"uid":"{uid}","namespace":"ns","name":"{name}"}}],"counters":[]}}}}"#
            ))
        };
        let names = || -> Vec<String> {
            sessions
                .sink()
                .metadata
                .pods(None)
                .into_iter()
                .map(|p| p.name)
                .collect()
        };

        assert!(matches!(
            feed.apply(line(UPDATE.into())),
            Err(ApplyError::NoHello("Update"))
        ));
        feed.apply(hello("a")).expect("hello a");
        feed.apply(snapshot("ua", "pa")).expect("snapshot a");
        feed.apply(hello("b")).expect("hello b");
        feed.apply(snapshot("ub", "pb")).expect("snapshot b");
        // Back to a: its session (and its Snapshot) is still there, so an Update applies.
        feed.apply(hello("a")).expect("hello a again");
        feed.apply(line(UPDATE.into())).expect("update a");
        assert_eq!(names(), ["pa", "pb"]);
        assert!(sessions.is_live("a") && sessions.is_live("b"));

        // A network stream for a takes it over; the feed's lines for a are refused until
        // the file says Hello for it again.
        let (_stream, _) = sessions.claim(&kpulse_wire::stream::Hello {
            version: kpulse_wire::stream::VERSION,
            node_name: "a".into(),
            node_labels: Default::default(),
            agent: String::new(),
        });
        assert!(matches!(
            feed.apply(line(UPDATE.into())),
            Err(ApplyError::Session {
                source: SessionError::Replaced { .. },
                ..
            })
        ));
        assert!(matches!(
            feed.apply(line(UPDATE.into())),
            Err(ApplyError::NoHello(_))
        ));
        let mut bad = hello("a");
        if let AgentMessage::Hello(h) = &mut bad {
            h.version.major = 2;
        }
        assert!(matches!(feed.apply(bad), Err(ApplyError::Hello(_))));
    }
}
