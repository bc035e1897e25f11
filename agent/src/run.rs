//! `kpulse-agent run`'s loop: every `--resolution`, after a random phase offset (so that the
//! agents of a cluster do not push in step), collect → attribute → publish one [`Tick`].
//!
//! The collector runs on the blocking pool (it reads files or walks BPF maps); the join
//! with the [`PodIndex`](crate::attribute::PodIndex) runs there too. A tick that overruns
//! the resolution makes the next ones skip, never queue.

use std::{future::Future, sync::Arc, time::Duration};

use kpulse_wire::{NodeSample, UnixNanos};
use tokio::time::{Instant, MissedTickBehavior};

use crate::{
    attribute::{Attribution, Attributor},
    collect::Collector,
    sample::Snapshot,
    selfmetrics::AgentMetrics,
    ship::{Shipper, Tick},
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
            timestamp: UnixNanos(snap.timestamp.0),
            started_at: node_started_at,
            cpu: kpulse_wire::CpuNanos(snap.node.cpu.0),
            memory_working_set: kpulse_wire::Bytes(snap.node.memory_working_set.0),
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
    /// # Errors
    ///
    /// [`RunError::CollectorPanicked`]: collection cannot go on.
    pub async fn run(
        self,
        shipper: &Shipper,
        stop: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let TickLoop {
            collector,
            attributor,
            resolution,
            procs_root,
            metrics,
        } = self;
        let mut starts = Some(crate::starttime::StartTimes::new(procs_root.as_deref()));
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
        let mut interval = tokio::time::interval_at(Instant::now() + phase, resolution);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut stop = std::pin::pin!(stop);
        let mut collector = Some(collector);
        let mut seen = Seen::default();
        let mut collector_stats = crate::collect::CollectorStats::default();
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = &mut stop => return Ok(()),
            }
            let Some(mut c) = collector.take() else {
                return Ok(());
            };
            if let Some(step) = crate::clock::check() {
                metrics.clock_steps.inc();
                tracing::warn!(
                    %step,
                    "the wall clock stepped: timestamps follow it from this tick on; every \
                     series restarts, so no rate spans the step"
                );
            }
            let index = attributor.current();
            let started = std::time::Instant::now();
            let mut st = starts.take();
            let joined = tokio::task::spawn_blocking(move || {
                let r = c.collect().map(|s| {
                    let mut a = index.join(&s);
                    let found = st
                        .as_mut()
                        .map(|st| st.fill(&s, c.as_ref(), &mut a.counters))
                        .unwrap_or_default();
                    (s, a, index, found)
                });
                (c, st, r)
            })
            .await;
            let (c, st, result) = joined.map_err(RunError::CollectorPanicked)?;
            metrics
                .collection_duration
                .observe(started.elapsed().as_secs_f64());
            let now = c.stats();
            metrics.collector.record(c.source(), &collector_stats, &now);
            collector_stats = now;
            if let Some(st) = st.as_ref() {
                metrics
                    .start_time_cache_entries
                    .set(i64::try_from(st.len()).unwrap_or(i64::MAX));
            }
            collector = Some(c);
            starts = st;
            let (snap, attribution, index, found) = match result {
                Ok(r) => r,
                Err(e) => {
                    metrics.collection_errors.inc();
                    let msg = crate::error::chain(&e);
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
            if snap.dropped != seen.dropped {
                if snap.dropped > 0 {
                    tracing::warn!(
                        dropped = snap.dropped,
                        "cgroups left out of this tick (--max-cgroups, or unreadable)"
                    );
                } else {
                    tracing::info!("all cgroups reported again");
                }
                seen.dropped = snap.dropped;
            }
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
            shipper.publish(tick(&snap, attribution, index.pods(), crate::clock::boot()));
        }
    }
}
