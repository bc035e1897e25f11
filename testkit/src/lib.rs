//! Test support shared by kpulse's crates; a dev-dependency only, never part of a binary.
//! Its functions panic on I/O errors, as tests do.
//!
//! - [`replay_fuzz_inputs`]: the normal test suite's replay of the committed fuzz inputs
//!   (`fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`) through the same bodies
//!   cargo-fuzz runs (see docs/fuzzing.md).
//! - [`review_api::ReviewApi`]: the Kubernetes API double (TokenReview,
//!   SubjectAccessReview) of the integration tests that run a server alone.
//! - [`ChannelBody`]: an HTTP body fed by a channel (streams the tests write by hand).

pub mod review_api;

/// An HTTP body fed by a bounded channel: each message is one data frame; the body ends
/// when every sender is gone. The in-test aggregators' response streams and the
/// hand-written request streams of the ingest tests.
#[derive(Debug)]
pub struct ChannelBody(pub tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

use std::path::{Path, PathBuf};

/// The `fuzz/` directory of the repository.
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Runs `body` on every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`;
/// panics naming each input that panics, or when a directory is missing or empty (a
/// replay of nothing must not pass).
pub fn replay_fuzz_inputs(target: &str, body: fn(&[u8])) {
    let fuzz = fuzz_dir();
    let mut failures = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = fuzz.join(kind).join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                entry
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                    .path()
            })
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{} holds no inputs", dir.display());
        for file in files {
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if std::panic::catch_unwind(|| body(&data)).is_err() {
                failures.push(file.display().to_string());
            }
        }
    }
    assert!(failures.is_empty(), "inputs that fail: {failures:#?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_without_inputs_fails() {
        let r = std::panic::catch_unwind(|| replay_fuzz_inputs("no-such-target", |_| {}));
        assert!(r.is_err());
    }

    #[test]
    fn a_panicking_body_fails_naming_the_input() {
        let r = std::panic::catch_unwind(|| replay_fuzz_inputs("quantity", |_| panic!("boom")));
        let message = r.expect_err("must fail");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("fuzz/regressions/quantity/"), "{text}");
    }
}
