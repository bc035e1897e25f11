//! The open-file limit. A process starts with the soft `RLIMIT_NOFILE` it inherits: 1,024 in
//! a container of containerd 2 (which no longer raises it for its containers) or of a
//! systemd service without `LimitNOFILE`, while the hard limit is far higher (524,288 on
//! systemd ≥ 240). Go's runtime raises the soft limit to the hard one at start, so
//! metrics-server never meets it; a Rust binary must do so itself, or its 1,025th socket
//! fails with `EMFILE`.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The open-file limit before and after [`raise_open_files`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit the process started with.
    pub inherited: u64,
    /// The soft limit now: what the process may open.
    pub soft: u64,
    /// The hard limit: what an unprivileged process may raise its soft limit to.
    pub hard: u64,
}

/// Reading or raising the limit failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} the open-file limit (RLIMIT_NOFILE): {source}")]
pub struct LimitError {
    action: &'static str,
    source: nix::Error,
}

/// The soft open-file limit in force.
pub fn open_files() -> Result<u64, LimitError> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .map_err(|source| LimitError {
            action: "read",
            source,
        })
}

/// Raises the soft open-file limit to the hard one, as Go's runtime does, and says what it
/// was and is.
pub fn raise_open_files() -> Result<OpenFiles, LimitError> {
    let (inherited, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| LimitError {
        action: "read",
        source,
    })?;
    if inherited < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| LimitError {
            action: "raise",
            source,
        })?;
    }
    Ok(OpenFiles {
        inherited,
        soft: inherited.max(hard),
        hard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() -> Result<(), LimitError> {
        let files = raise_open_files()?;
        assert_eq!(files.soft, files.hard);
        assert!(files.inherited <= files.soft);
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| LimitError {
            action: "read",
            source,
        })?;
        assert_eq!((soft, hard), (files.soft, files.hard));
        Ok(())
    }
}
