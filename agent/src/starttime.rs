//! When a container's counters were zero ([`kpulse_wire::ContainerSample::started_at`]):
//! the start of the earliest process in its cgroup, from `/proc/PID/stat` (clock ticks
//! since boot, 10 ms), placed on the agent's timeline by the boot instant ([`clock::boot`]),
//! so that it moves with the sample timestamps when the wall clock steps.
//!
//! A container's CPU counter starts when its first process runs in the cgroup, so the
//! earliest start time among the processes still in it is the instant the counter was zero
//! (to one clock tick, and as long as that first process is alive — the container's PID 1
//! normally is). The value is computed once per cgroup instance (cgroup id) and then kept,
//! because the server treats a changed `started_at` as a restart. Kubernetes' own
//! `containerStatuses[].state.running.startedAt` is not used: it is whole seconds, so a
//! rate over a container's first second could be off by half.
//!
//! The server uses it only for windows of at least 250 ms, where a 10 ms uncertainty is
//! under 4 % (see the aggregator store's first-interval rule).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use kpulse_wire::{stream::PodCounters, UnixNanos};

use crate::{clock, probe, sample::Snapshot};

/// Most processes read per cgroup when looking for the earliest start.
const MAX_PROCS: usize = 256;

/// Start times per cgroup id, for the cgroups of the current tick.
#[derive(Debug)]
pub struct StartTimes {
    procs_root: PathBuf,
    ticks_per_second: u64,
    /// Nanoseconds since boot; the boot instant is added when a tick is filled.
    known: HashMap<u64, Option<u64>>,
}

impl StartTimes {
    /// Start times from the cgroups under `procs_root` (a hierarchy in which every process
    /// is placed: the cgroup2 mount).
    pub fn new(procs_root: &Path) -> StartTimes {
        StartTimes {
            procs_root: procs_root.to_owned(),
            ticks_per_second: probe::clock_ticks(),
            known: HashMap::new(),
        }
    }

    /// Sets `started_at` of every container in `counters` from its cgroup (by id, found
    /// in `snap`); `None` where it cannot be known. Forgets cgroups no longer sampled.
    pub fn fill(&mut self, snap: &Snapshot, counters: &mut [PodCounters]) {
        let wanted: HashMap<u64, &str> = counters
            .iter()
            .flat_map(|p| &p.containers)
            .filter_map(|c| c.cgroup_id.map(|id| id.0))
            .filter(|id| !self.known.contains_key(id))
            .map(|id| (id, ""))
            .collect();
        let mut paths = wanted;
        if !paths.is_empty() {
            for c in &snap.cgroups {
                if let Some(p) = paths.get_mut(&c.id.0) {
                    *p = &c.path;
                }
            }
        }
        for (id, path) in paths {
            let start = if path.is_empty() {
                None
            } else {
                self.earliest_start(path)
            };
            self.known.insert(id, start);
        }
        let mut live = std::collections::HashSet::new();
        let boot = clock::boot();
        for c in counters.iter_mut().flat_map(|p| p.containers.iter_mut()) {
            c.started_at = c.cgroup_id.and_then(|id| {
                live.insert(id.0);
                let since_boot = self.known.get(&id.0).copied().flatten()?;
                boot?.0.checked_add(since_boot).map(UnixNanos)
            });
        }
        self.known.retain(|id, _| live.contains(id));
    }

    /// Cgroups whose start time is kept (those of the last tick's containers).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no start time is kept.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The earliest start of the processes in the cgroup at `path` (relative to the root),
    /// in nanoseconds since boot.
    fn earliest_start(&self, path: &str) -> Option<u64> {
        let procs = std::fs::read_to_string(
            self.procs_root
                .join(path.trim_start_matches('/'))
                .join("cgroup.procs"),
        )
        .ok()?;
        let ticks = procs
            .lines()
            .take(MAX_PROCS)
            .filter_map(|pid| pid.trim().parse::<u32>().ok())
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                start_ticks(&stat)
            })
            .min()?;
        let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(self.ticks_per_second);
        u64::try_from(nanos).ok()
    }
}

/// Field 22 (`starttime`) of a `/proc/PID/stat` line, in clock ticks since boot.
fn start_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_after_odd_command_names() {
        let line = "4242 (a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 987654 1000 100 18446744073709551615";
        assert_eq!(start_ticks(line), Some(987_654));
        assert_eq!(start_ticks("garbage"), None);
        assert_eq!(start_ticks("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_started_before_now_and_after_boot() {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
        let ticks = start_ticks(&stat).expect("starttime");
        let boot = clock::boot().expect("clocks");
        let now = clock::now();
        let start = boot.0 + ticks * 1_000_000_000 / probe::clock_ticks();
        assert!(start > boot.0 && start <= now.0, "{start} {boot:?} {now:?}");
    }
}
