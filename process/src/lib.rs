//! What kpulse's binaries (the agent and the aggregator-api) share at their edges: logging
//! ([`init_logging`]), running `main` and its exit codes ([`run_main`]), the one shutdown signal ([`shutdown`]), errors
//! rendered with their causes for log fields ([`error_chain`]), certificates and keys
//! read from PEM files ([`pem`]) and the open-file limit ([`limits`]).

use std::future::Future;
use std::process::ExitCode;

pub mod limits;
pub mod pem;
pub mod shutdown;
pub mod tls;

/// Logs to stderr at the level `RUST_LOG` asks for (`info` by default), in colour only on
/// a terminal (in a pod, `kubectl logs` would show the escape codes).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// sysexits' `EX_USAGE`: the command line was wrong.
pub const EX_USAGE: u8 = 64;

/// A binary's `main`: `validated` (the command line's check), then `run` on `runtime`, as
/// built; prints `<name>: <error with its causes>` to stderr and returns [`EX_USAGE`] for a
/// bad command line, failure for anything else that fails.
pub fn run_main<E, F>(
    name: &str,
    validated: Result<(), E>,
    runtime: impl FnOnce() -> std::io::Result<tokio::runtime::Runtime>,
    run: impl FnOnce() -> F,
) -> ExitCode
where
    E: std::fmt::Display,
    F: Future<Output = anyhow::Result<()>>,
{
    if let Err(e) = validated {
        eprintln!("{name}: {e}");
        return ExitCode::from(EX_USAGE);
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `outer: cause: root cause`, for log fields (anyhow's `{:#}` does the same at a binary's
/// edge).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_in_order() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "entity not found",
        ));
        assert_eq!(error_chain(&e), "cannot read /x: entity not found");
        assert_eq!(error_chain(&e.0), "entity not found");
    }
}
