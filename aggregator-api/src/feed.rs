//! A file feed: the store's and the metadata's loader for tests and offline use, until agents
//! stream (`--feed-file`).
//!
//! The file is JSON Lines, appended to by whoever produces it; each complete line is one of
//!
//! ```text
//! {"metadata": {"nodes": [{"name": "n1", "labels": {...}}], "pods": [{"namespace": "ns", "name": "p", "labels": {...}}]}}
//! {"batch": <kpulse_wire::NodeBatch>}
//! ```
//!
//! `metadata` replaces all node and pod metadata; `batch` is ingested into the store as an
//! agent's batch would be. The server follows the file as `tail -F` does: lines are read once,
//! a partial last line waits for its newline, and a file that was replaced or truncated is
//! read again from its start. A bad line is logged with its number and skipped; a line longer
//! than [`MAX_LINE_BYTES`] is skipped up to its newline.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kpulse_wire::NodeBatch;
use serde::Deserialize;

use crate::{
    metadata::{MetadataDocument, StaticMetadata},
    store::{Clock, Store},
};

/// Longest line read (a batch of a 110-pod node is about 60 KiB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// How often the file is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// One line of the feed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Line {
    /// Replaces the metadata.
    Metadata(MetadataDocument),
    /// One node's batch.
    Batch(NodeBatch),
}

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
            out.push(serde_json::from_slice::<Line>(&line).map_err(|e| BadLine {
                number: self.line_number,
                reason: e.to_string(),
            }));
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

/// Applies one line.
pub fn apply<C: Clock>(line: Line, store: &Store<C>, metadata: &StaticMetadata) {
    match line {
        Line::Metadata(doc) => {
            tracing::info!(
                nodes = doc.nodes.len(),
                pods = doc.pods.len(),
                "feed: metadata replaced"
            );
            metadata.replace(doc);
        }
        Line::Batch(batch) => {
            let node = batch.node_name.clone();
            if let Err(e) = store.ingest(batch) {
                tracing::warn!(%node, error = %e, "feed: batch refused");
            }
        }
    }
}

/// Follows `path` until the task is dropped, applying every line.
pub async fn follow<C: Clock + 'static>(
    path: PathBuf,
    store: Arc<Store<C>>,
    metadata: Arc<StaticMetadata>,
) {
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
                        Ok(line) => apply(line, &store, &metadata),
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

    const BATCH: &str = r#"{"batch":{"node_name":"n1","sent_at":1,"node":{"timestamp":1,"cpu":5,"memory_working_set":7},"pods":[]}}"#;

    fn kinds(lines: &[Result<Line, BadLine>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| match l {
                Ok(Line::Metadata(_)) => "metadata".to_owned(),
                Ok(Line::Batch(b)) => format!("batch {}", b.node_name),
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
        write!(
            f,
            "{{\"metadata\":{{\"nodes\":[{{\"name\":\"n1\"}}]}}}}\n\n{BATCH}\nnot json\n{{\"bat"
        )
        .expect("write");
        f.flush().expect("flush");
        assert_eq!(
            kinds(&tail.poll().expect("poll")),
            ["metadata", "batch n1", "bad 4"]
        );
        assert!(tail.poll().expect("poll").is_empty(), "read once");
        writeln!(f, "ch\":{}}}", &BATCH[9..BATCH.len() - 1]).expect("write");
        f.flush().expect("flush");
        assert_eq!(
            kinds(&tail.poll().expect("poll")),
            ["batch n1"],
            "partial line completed"
        );

        // Replaced by a new file: read from its start.
        let tmp = temp("follow.new");
        std::fs::write(&tmp, format!("{BATCH}\n")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        assert_eq!(kinds(&tail.poll().expect("poll")), ["batch n1"]);
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
        writeln!(f, "{BATCH}").expect("write");
        f.flush().expect("flush");
        assert_eq!(kinds(&tail.poll().expect("poll")), ["batch n1"]);
        std::fs::remove_file(&path).expect("cleanup");
    }
}
