//! When a container's counters were zero ([`kpulse_wire::ContainerSample::started_at`]),
//! placed on the agent's timeline by the boot instant ([`clock::boot`]), so that it moves
//! with the sample timestamps when the wall clock steps. Two sources, in this order:
//!
//! 1. **The earliest process in the cgroup**: from `cgroup.procs` and `/proc/PID/stat`
//!    (clock ticks since boot, 10 ms). A container's CPU counter starts when its first
//!    process runs, so the earliest start among the processes still in it is the instant
//!    the counter was zero (to one clock tick, while that first process lives — the
//!    container's PID 1 normally does). Only where the agent sees the node's processes
//!    (`cargo xtask demo`, an agent on the host or with `hostPID`): from another PID
//!    namespace every other container's `cgroup.procs` lists `0`.
//! 2. **The cgroup's creation** ([`Collector::birth`]): the eBPF program `cgroup_mkdir`
//!    notes the boot-clock instant each cgroup is made, to the nanosecond. A cgroup's
//!    counters are zero when it is made, so this is the instant exactly. It needs no
//!    process IDs, so it works where the agent runs in its own PID namespace (the
//!    DaemonSet's `hostPID: false`), but only for cgroups made while the agent runs.
//!
//! Processes come first although creation is finer, because the value must not change
//! when the agent restarts (the server takes a changed `started_at` for a container
//! restart): a restarted agent no longer knows the creation of older cgroups, and where it
//! can read processes it must read the same value as before; where it cannot, it sends
//! none, which the server does not compare.
//!
//! With neither (a container older than the agent, seen from a pod), `started_at` is absent
//! and the server waits for the second sample. The value is found once per cgroup instance
//! (cgroup id) and then kept, because the server treats a changed `started_at` as a
//! restart. Kubernetes' own `containerStatuses[].state.running.startedAt` is not used: it
//! is whole seconds, so a rate over a container's first second could be off by half.
//!
//! The server uses it only for windows of at least 250 ms, where a 10 ms uncertainty is
//! under 4 % (see the aggregator store's first-interval rule).

use std::path::{Path, PathBuf};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};

use kpulse_wire::{stream::PodCounters, UnixNanos};

use crate::{clock, collect::Collector, probe, sample::Snapshot};

/// Most processes read per cgroup when looking for the earliest start.
const MAX_PROCS: usize = 256;

/// Where the start times of one [`StartTimes::fill`] came from: one count per container
/// cgroup seen for the first time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// From the cgroup's creation (eBPF).
    pub creation: u64,
    /// From its earliest process (`/proc`).
    pub processes: u64,
    /// Not known: the server waits for a second sample.
    pub unknown: u64,
}

/// Start times per cgroup id, for the cgroups of the current tick.
#[derive(Debug)]
pub struct StartTimes {
    /// The hierarchy `cgroup.procs` is read in; `None`: processes are not read.
    procs_root: Option<PathBuf>,
    ticks_per_second: u64,
    /// Nanoseconds since boot; the boot instant is added when a tick is filled.
    known: HashMap<u64, Option<u64>>,
}

impl StartTimes {
    /// Start times from the processes in the cgroups under `procs_root` (a hierarchy in
    /// which every process is placed: the cgroup2 mount) and, failing those, from the
    /// collector's creation instants.
    pub fn new(procs_root: Option<&Path>) -> StartTimes {
        StartTimes {
            procs_root: procs_root.map(Path::to_owned),
            ticks_per_second: probe::clock_ticks(),
            known: HashMap::new(),
        }
    }

    /// Sets `started_at` of every container in `counters` from its cgroup (by id, found
    /// in `snap`); `None` where it cannot be known. Forgets cgroups no longer sampled.
    pub fn fill(
        &mut self,
        snap: &Snapshot,
        collector: &dyn Collector,
        counters: &mut [PodCounters],
    ) -> Found {
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
        let mut found = Found::default();
        for (id, path) in paths {
            let start = if let Some(first) = self.earliest_start(path) {
                found.processes += 1;
                Some(first)
            } else if let Some(born) = collector.birth(id) {
                found.creation += 1;
                Some(born)
            } else {
                found.unknown += 1;
                None
            };
            self.known.insert(id, start);
        }
        let mut live = HashSet::new();
        let boot = clock::boot();
        for c in counters.iter_mut().flat_map(|p| p.containers.iter_mut()) {
            c.started_at = c.cgroup_id.and_then(|id| {
                live.insert(id.0);
                let since_boot = self.known.get(&id.0).copied().flatten()?;
                boot?.0.checked_add(since_boot).map(UnixNanos)
            });
        }
        self.known.retain(|id, _| live.contains(id));
        found
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
        if path.is_empty() {
            return None;
        }
        let procs = std::fs::read_to_string(
            self.procs_root
                .as_ref()?
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

    /// A collector that knows the creation of the cgroups in `births`.
    struct Births(Vec<(u64, u64)>);

    impl Collector for Births {
        fn source(&self) -> crate::sample::Source {
            crate::sample::Source::Ebpf
        }
        fn collect(&mut self) -> Result<Snapshot, crate::collect::CollectError> {
            unreachable!("not collected")
        }
        fn birth(&self, id: u64) -> Option<u64> {
            self.0.iter().find(|(i, _)| *i == id).map(|(_, at)| *at)
        }
    }

    fn container(name: &str, id: u64) -> kpulse_wire::ContainerSample {
        kpulse_wire::ContainerSample {
            name: name.into(),
            timestamp: UnixNanos(0),
            cgroup_id: Some(kpulse_wire::CgroupId(id)),
            started_at: None,
            cpu: kpulse_wire::CpuNanos(0),
            memory_working_set: kpulse_wire::Bytes(0),
            swap: None,
            signals: None,
        }
    }

    fn snapshot(cgroups: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            timestamp: crate::sample::UnixNanos(0),
            source: crate::sample::Source::Ebpf,
            cgroups: cgroups
                .iter()
                .map(|(path, id)| crate::sample::CgroupSample {
                    path: (*path).into(),
                    id: crate::sample::CgroupId(*id),
                    cpu: None,
                    memory: None,
                    pressure: None,
                    throttling: None,
                })
                .collect(),
            node: crate::sample::NodeSample {
                cpu: crate::sample::CpuNanos(0),
                memory_working_set: crate::sample::Bytes(0),
                swap: None,
            },
            dropped: 0,
        }
    }

    #[test]
    fn processes_first_then_creation_then_unknown_once_per_cgroup() {
        let root = std::env::temp_dir().join(format!("kpulse-starttime-{}", std::process::id()));
        let procs = root.join("old");
        std::fs::create_dir_all(&procs).expect("temp dir");
        // A cgroup whose only process is this test: its start is ours.
        std::fs::write(
            procs.join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .expect("cgroup.procs");
        let own = start_ticks(&std::fs::read_to_string("/proc/self/stat").expect("own stat"))
            .expect("starttime");
        let own_ns = own * 1_000_000_000 / probe::clock_ticks();

        let snap = snapshot(&[("/new", 7), ("/old", 8), ("/hidden", 9)]);
        // `old` was also made while the program ran: its processes still decide.
        let collector = Births(vec![(7, 5_000_000_000), (8, 1)]);
        let mut counters = vec![PodCounters {
            uid: "u".into(),
            containers: vec![
                container("new", 7),
                container("old", 8),
                container("hidden", 9),
            ],
            signals: None,
        }];
        let mut st = StartTimes::new(Some(&root));
        let found = st.fill(&snap, &collector, &mut counters);
        assert_eq!(
            found,
            Found {
                creation: 1,
                processes: 1,
                unknown: 1
            }
        );
        let boot = clock::boot().expect("clocks").0;
        let started: Vec<Option<u64>> = counters[0]
            .containers
            .iter()
            .map(|c| c.started_at.map(|s| s.0))
            .collect();
        assert_eq!(
            started,
            vec![Some(boot + 5_000_000_000), Some(boot + own_ns), None]
        );
        // Known cgroups are not looked up again, and keep their value.
        let found = st.fill(&snap, &Births(vec![(7, 1), (9, 1)]), &mut counters);
        assert_eq!(found, Found::default());
        assert_eq!(
            counters[0].containers[0].started_at.map(|s| s.0),
            Some(boot + 5_000_000_000)
        );
        assert_eq!(counters[0].containers[2].started_at, None);
        // A cgroup gone from the tick is forgotten.
        counters[0].containers.truncate(1);
        st.fill(&snap, &collector, &mut counters);
        assert_eq!(st.len(), 1);
        // Without a procs root, only creation instants.
        let mut counters = vec![PodCounters {
            uid: "u".into(),
            containers: vec![container("new", 7), container("old", 8)],
            signals: None,
        }];
        let found = StartTimes::new(None).fill(&snap, &Births(vec![(7, 1)]), &mut counters);
        assert_eq!(
            found,
            Found {
                creation: 1,
                processes: 0,
                unknown: 1
            }
        );
        std::fs::remove_dir_all(&root).expect("remove temp dir");
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
