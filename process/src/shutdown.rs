//! The one shutdown signal: SIGTERM (kubelet stopping the pod) or SIGINT (a terminal).

use std::future::Future;

use tokio::signal::unix::{signal, SignalKind};

/// Installs the SIGTERM and SIGINT handlers now (so that a signal arriving from here on is
/// not lost, and no longer kills the process), and returns a future that resolves at the
/// first of them, logging which. Needs a Tokio runtime.
///
/// # Errors
///
/// When a handler cannot be installed.
pub fn install() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    })
}
