//! `kpulse-agent run`'s loop: every `--resolution`, after a random phase offset (so that the
//! agents of a cluster do not push in step), collect → (with `--custom-metrics`, the
//! [`Windows`] of pressure and throttling) → attribute → publish one [`Tick`].
//!
//! The loop runs on a thread of its own (from the blocking pool): the collector reads files
//! or walks BPF maps, the join with the [`PodIndex`](crate::attribute::PodIndex) and the
//! start times follow, and nothing in it waits for the network. It sleeps until the next
//! tick and hands each tick to the shipper's tasks ([`Publisher`]), so a tick costs one
//! wake-up of this thread and one of the runtime's. A tick that overruns the resolution
//! makes the next ones skip, never queue.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use kpulse_wire::{NodeSample, UnixNanos};

use crate::{
    attribute::{Attribution, Attributor},
    collect::Collector,
    sample::Snapshot,
    selfmetrics::AgentMetrics,
    ship::{Publisher, Shipper, Tick},
    window::Windows,
};

/// Why the loop ended other than by `stop`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The collector panicked; the process should exit (and be restarted).
    #[error("the collector panicked")]
    CollectorPanicked(#[source] tokio::task::JoinError),
}

/// What the loop needs.
pub struct TickLoop {
    /// The collector (`collect::select`).
    pub collector: Box<dyn Collector>,
    /// The pods.
    pub attributor: Attributor,
    /// Tick interval.
    pub resolution: Duration,
    /// With `--custom-metrics`: each cgroup's pressure and throttling over the window.
    pub windows: Option<Windows>,
    /// Where containers' start times are read (`cgroup.procs`) when the collector has no
    /// creation instant: the cgroup2 mount; `None`: creation instants only (see
    /// `starttime`).
    pub procs_root: Option<std::path::PathBuf>,
    /// Self-metrics.
    pub metrics: Arc<AgentMetrics>,
}

impl std::fmt::Debug for TickLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TickLoop")
            .field("collector", &self.collector.source())
            .field("resolution", &self.resolution)
            .finish_non_exhaustive()
    }
}

/// Turns a collection and its attribution into a [`Tick`].
pub fn tick(
    snap: &Snapshot,
    attribution: Attribution,
    pods: &Arc<crate::attribute::PodSet>,
    node_started_at: Option<UnixNanos>,
) -> Tick {
    Tick {
        node: NodeSample {
            timestamp: snap.timestamp,
            started_at: node_started_at,
            cpu: snap.node.cpu,
            memory_working_set: snap.node.memory_working_set,
            swap: snap.node.swap,
        },
        pods: pods.clone(),
        counters: attribution.counters,
    }
}

/// Log-worthy state of the loop (changes are logged, not ticks).
#[derive(Default)]
struct Seen {
    error: Option<String>,
    unattributed: bool,
    dropped: u64,
}

impl TickLoop {
    /// Runs until `stop` resolves, publishing every tick to `shipper`.
    ///
    /// The loop runs on a thread of the blocking pool; this future waits for it, and on
    /// `stop` wakes it and waits for the tick in progress, if any, to end.
    ///
    /// # Errors
    ///
    /// [`RunError::CollectorPanicked`]: collection cannot go on.
    pub async fn run(
        self,
        shipper: &Shipper,
        stop: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let publisher = shipper.publisher();
        // Nothing is ever sent: dropping the sender ends the loop's wait at once.
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let mut thread =
            tokio::task::spawn_blocking(move || self.run_blocking(&publisher, &stop_rx));
        tokio::select! {
            r = &mut thread => return r.map_err(RunError::CollectorPanicked),
            () = stop => {}
        }
        drop(stop_tx);
        thread.await.map_err(RunError::CollectorPanicked)
    }

    /// The loop: wait for the next tick (or the end), collect, attribute, publish.
    fn run_blocking(self, publisher: &Publisher, stop: &crossbeam_channel::Receiver<()>) {
        let TickLoop {
            mut collector,
            attributor,
            resolution,
            mut windows,
            procs_root,
            metrics,
        } = self;
        let mut starts = crate::starttime::StartTimes::new(procs_root.as_deref());
        let mut joins = crate::attribute::JoinCache::default();
        let phase = Duration::from_nanos(fastrand::u64(
            0..u64::try_from(resolution.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        ));
        tracing::info!(
            resolution = %humantime::format_duration(resolution),
            phase = ?phase,
            "collecting"
        );
        let mut due = Instant::now() + phase;
        let mut seen = Seen::default();
        let mut collector_stats = crate::collect::CollectorStats::default();
        loop {
            match stop.recv_deadline(due) {
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                // The sender is gone: stop.
                Ok(()) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
            due = next_tick(due, resolution, Instant::now());
            if let Some(step) = crate::clock::check() {
                metrics.clock_steps.inc();
                // Timestamps jumped: no share may span the step either.
                if let Some(w) = windows.as_mut() {
                    w.clear();
                }
                tracing::warn!(
                    %step,
                    "the wall clock stepped: timestamps follow it from this tick on; every \
                     series restarts, so no rate spans the step"
                );
            }
            let index = attributor.current();
            let started = Instant::now();
            let result = collector.collect().map(|s| {
                if let Some(w) = windows.as_mut() {
                    w.observe(&s);
                }
                let mut a = joins.join(&index, &s, windows.as_ref());
                let found = starts.fill(&s, collector.as_ref(), &mut a.counters);
                (s, a, found)
            });
            metrics
                .collection_duration
                .observe(started.elapsed().as_secs_f64());
            let now = collector.stats();
            metrics
                .collector
                .record(collector.source(), &collector_stats, &now);
            collector_stats = now;
            metrics
                .start_time_cache_entries
                .set(i64::try_from(starts.len()).unwrap_or(i64::MAX));
            let (snap, attribution, found) = match result {
                Ok(r) => r,
                Err(e) => {
                    metrics.collection_errors.inc();
                    let msg = kpulse_process::error_chain(&e);
                    if seen.error.as_deref() != Some(msg.as_str()) {
                        tracing::error!(error = %msg, "collection failed; tick skipped");
                        seen.error = Some(msg);
                    }
                    continue;
                }
            };
            if seen.error.take().is_some() {
                tracing::info!("collection works again");
            }
            metrics.start_times.record(found);
            metrics
                .cgroups
                .set(i64::try_from(snap.cgroups.len()).unwrap_or(i64::MAX));
            metrics
                .pods
                .set(i64::try_from(index.pods().len()).unwrap_or(i64::MAX));
            snap.log_dropped_change(&mut seen.dropped);
            let unattributed = attribution.unattributed;
            metrics
                .unattributed_cgroups
                .set(i64::try_from(unattributed).unwrap_or(i64::MAX));
            metrics
                .incomplete_pods
                .set(i64::try_from(attribution.incomplete_pods).unwrap_or(i64::MAX));
            if (unattributed > 0) != seen.unattributed {
                if unattributed > 0 {
                    tracing::info!(
                        cgroups = unattributed,
                        pods_known = index.pods().len(),
                        "cgroups under kubepods belong to no known pod; not sent"
                    );
                } else {
                    tracing::info!("every kubepods cgroup is attributed again");
                }
                seen.unattributed = unattributed > 0;
            }
            publisher.publish(tick(&snap, attribution, index.pods(), crate::clock::boot()));
        }
    }
}

/// The tick after the one `due`, skipping those already missed at `now` (a tick that
/// overran the resolution): the next multiple of `period` after `now`, never a burst.
fn next_tick(due: Instant, period: Duration, now: Instant) -> Instant {
    let next = due + period;
    if next > now {
        return next;
    }
    let behind = now.duration_since(next).as_nanos();
    let missed = behind / period.as_nanos().max(1) + 1;
    let skip = u32::try_from(missed)
        .ok()
        .and_then(|n| period.checked_mul(n));
    skip.and_then(|d| next.checked_add(d))
        .unwrap_or(now + period)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn on_time_ticks_follow_the_period() {
        let t0 = Instant::now();
        assert_eq!(next_tick(t0, SECOND, t0), t0 + SECOND);
        assert_eq!(
            next_tick(t0, SECOND, t0 + Duration::from_millis(999)),
            t0 + SECOND
        );
    }

    #[test]
    fn overrun_ticks_are_skipped_not_queued() {
        let t0 = Instant::now();
        // The tick due at t0 ended at t0 + 1 s: the one due then is missed.
        assert_eq!(next_tick(t0, SECOND, t0 + SECOND), t0 + 2 * SECOND);
        assert_eq!(
            next_tick(t0, SECOND, t0 + Duration::from_millis(3500)),
            t0 + 4 * SECOND
        );
        // The phase is kept: ticks stay on t0's grid.
        let hour = Duration::from_secs(3600);
        assert_eq!(
            next_tick(
                t0,
                Duration::from_millis(100),
                t0 + hour + Duration::from_millis(50)
            ),
            t0 + hour + Duration::from_millis(100)
        );
    }
}
