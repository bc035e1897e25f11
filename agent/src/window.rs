//! Pressure and throttling over a trailing window: the step between collection and
//! attribution that `--custom-metrics` adds.
//!
//! The collector reports cumulative counters ([`Pressure`], [`Throttling`]); the custom
//! metrics are shares of a window. [`Windows`] keeps, for every cgroup that has such
//! counters, a few of its past readings (bounded: at most [`MAX_POINTS`] per cgroup), and
//! [`Windows::figures`] answers with the share over the newest span of at least the window:
//! always the difference of two kernel readings, divided by the elapsed time (pressure) or
//! by the elapsed periods (throttling), with the span stated. Nothing is interpolated.
//!
//! # Where the window ends
//!
//! - **Pressure.** The kernel brings a cgroup's PSI totals up to date in its averaging work,
//!   every 2 s while the cgroup is active, and whenever someone reads its pressure files
//!   (kubelet does, for every container). Totals read at an arbitrary tick are therefore
//!   short of up to 2 s of stall, by an amount that depends on who read the files when. The
//!   eBPF walk reads instead what the averaging writes together: `avg_total` and
//!   `avg_last_update`, the totals *as of a known instant* of the kernel's clock, which
//!   reads of the files do not move ([`crate::sample::PsiAveraged`]). A window runs from
//!   one such reading to another, and its length is the difference of their kernel
//!   instants, so no stall is counted against the wrong span. When the instant has not
//!   moved for two of the kernel's update periods and a tick (a late averaging work is
//!   measured at up to 2.08 s on a busy 2-CPU VM, never near twice the period), the cgroup
//!   is idle and its totals are final: the reading is then taken as of the tick (its
//!   instant advanced by the time since the agent first saw it, at most one tick short). The cgroupfs
//!   collector's readings are current at the read, and taken as of the tick.
//! - **Throttling.** `nr_periods` and `nr_throttled` are counted by the period timer and do
//!   not lag: every reading is exact. A cgroup with a quota that ran no period in the
//!   window was not throttled: its share is 0.
//!
//! A cgroup is known by its id; a new id (a restarted container) starts over, and so does
//! a counter that went backwards. A cgroup absent from a tick is forgotten. When the wall
//! clock steps (the agent's timestamps follow it, see `clock`), everything starts over.

use std::{collections::VecDeque, time::Duration};

use foldhash::{HashMap, HashMapExt as _};
use kpulse_wire::{Fraction, Signals};

use crate::sample::{CgroupId, Snapshot};

/// How often the kernel brings a cgroup's PSI totals up to date while it is active
/// (`PSI_FREQ`, 2 s).
pub const PSI_UPDATE_PERIOD: Duration = Duration::from_secs(2);

/// The shortest window accepted: longer than a few of the kernel's PSI updates, so that
/// their 2 s steps cannot dominate a share.
pub const MIN_WINDOW: Duration = Duration::from_secs(10);

/// Readings kept per cgroup and counter kind, at most: they are spaced at least
/// `window / (MAX_POINTS - 4)` apart, so the oldest is always old enough.
pub const MAX_POINTS: usize = 36;

/// One reading of a pair of counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    /// When the agent read it (its timeline, ns).
    t: u64,
    /// The instant the counters are of, on the clock windows are measured with (ns): the
    /// kernel's averaging instant for eBPF PSI, else `t`.
    k: u64,
    v: [u64; 2],
}

/// A reading as the collector gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    /// The counters' own instant on the kernel's clock, when they carry one (eBPF PSI:
    /// `avg_last_update`); `None`: they are current at the read (the files, CFS).
    at: Option<u64>,
    v: [u64; 2],
}

/// The readings of a pair of cumulative counters of one cgroup that may bound a window.
#[derive(Clone, Debug, Default)]
struct Track {
    /// Exact readings, oldest first, spaced at least `spacing` apart; the newest is kept
    /// separately in `end`.
    points: VecDeque<Point>,
    /// The newest exact reading: where the window ends.
    end: Option<Point>,
    /// The last reading, and when (agent time) its instant was first seen.
    last: Option<(Reading, u64)>,
}

impl Track {
    /// Records a reading taken at `t`. A reading that carries its own instant is exact
    /// when that instant is new (the kernel averaged since the last tick), or when it has
    /// not moved for longer than `settle` (the cgroup is idle and the totals are final: the
    /// instant then advances with the agent's clock). One without is always exact.
    fn observe(&mut self, t: u64, r: Reading, settle: u64, spacing: u64, keep: u64) {
        if let Some((last, _)) = self.last {
            let backwards = r.v.iter().zip(&last.v).any(|(new, old)| new < old)
                || matches!((r.at, last.at), (Some(new), Some(old)) if new < old);
            if backwards {
                // Not the same counting any more.
                *self = Track::default();
            }
        }
        // When the reading's instant is the last one's: since the tick that first saw it.
        let unmoved_since = match (r.at, self.last) {
            (Some(at), Some((last, seen))) if last.at == Some(at) => Some(seen),
            _ => None,
        };
        self.last = Some((r, unmoved_since.unwrap_or(t)));
        let point = match (r.at, unmoved_since) {
            (None, _) => Some(Point { t, k: t, v: r.v }),
            (Some(at), Some(seen)) => {
                let idle = t.saturating_sub(seen);
                (idle > settle).then_some(Point {
                    t,
                    k: at + idle,
                    v: r.v,
                })
            }
            (Some(at), None) => Some(Point { t, k: at, v: r.v }),
        };
        let Some(p) = point else { return };
        if let Some(end) = self.end {
            if p.t <= end.t || p.k <= end.k {
                return;
            }
            if self.points.back().is_none_or(|b| end.k - b.k >= spacing) {
                self.points.push_back(end);
            }
        }
        self.end = Some(p);
        // Keep the newest point at or before the start of the window, and none older.
        while self.points.len() >= 2 && self.points[1].k + keep <= p.k {
            self.points.pop_front();
        }
        while self.points.len() >= MAX_POINTS {
            self.points.pop_front();
        }
    }

    /// The differences over the newest span of at least `window` (on the counters' own
    /// clock) ending at the newest exact reading: `(Δv, Δk)`.
    fn span(&self, window: u64) -> Option<([u64; 2], u64)> {
        let end = self.end?;
        let start = self
            .points
            .iter()
            .rev()
            .find(|p| p.k.saturating_add(window) <= end.k)?;
        Some((
            [end.v[0] - start.v[0], end.v[1] - start.v[1]],
            end.k - start.k,
        ))
    }
}

/// The two tracks of one cgroup.
#[derive(Clone, Debug, Default)]
struct CgroupTracks {
    /// PSI `some` totals, ns: `[cpu, memory]`.
    pressure: Track,
    /// CFS `[nr_periods, nr_throttled]`.
    throttling: Track,
    /// The tick that last saw the cgroup.
    seen: u64,
}

/// A cgroup's CFS counters over its window: what a pod sums over its cgroups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottledPeriods {
    /// `Δnr_periods`.
    pub periods: u64,
    /// `Δnr_throttled`.
    pub throttled: u64,
    /// The span, ms.
    pub window_ms: u32,
}

impl ThrottledPeriods {
    /// The sum of two cgroups' counters, over the longer of their spans.
    pub fn plus(self, other: ThrottledPeriods) -> ThrottledPeriods {
        ThrottledPeriods {
            periods: self.periods.saturating_add(other.periods),
            throttled: self.throttled.saturating_add(other.throttled),
            window_ms: self.window_ms.max(other.window_ms),
        }
    }

    /// The share of periods throttled (0 when none ran).
    pub fn fraction(self) -> Fraction {
        Fraction::of(self.throttled, self.periods, self.window_ms).unwrap_or(Fraction {
            ppm: 0,
            window_ms: self.window_ms,
        })
    }
}

/// One cgroup's figures over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Pressure (`cpu_pressure`, `memory_pressure`).
    pub signals: Signals,
    /// The CFS counters behind `signals.cpu_throttled`, for sums over a pod's cgroups.
    pub throttling: Option<ThrottledPeriods>,
}

/// The readings of every cgroup with pressure or throttling counters.
#[derive(Debug)]
pub struct Windows {
    window: u64,
    settle: u64,
    spacing: u64,
    tick: u64,
    cgroups: HashMap<CgroupId, CgroupTracks>,
}

impl Windows {
    /// Shares over at least `window`, from a collector that reads every `resolution`.
    pub fn new(window: Duration, resolution: Duration) -> Windows {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let window = nanos(window).max(1);
        Windows {
            window,
            // An averaging instant that has not moved for two of the kernel's periods and a
            // tick: the cgroup is idle (the work stops rescheduling itself), not merely late.
            settle: nanos(PSI_UPDATE_PERIOD * 2).saturating_add(nanos(resolution)),
            spacing: window / (MAX_POINTS as u64 - 4),
            tick: 0,
            cgroups: HashMap::new(),
        }
    }

    /// The window shares are taken over, at least.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Records one collection; cgroups it does not list are forgotten.
    pub fn observe(&mut self, snap: &Snapshot) {
        self.tick += 1;
        let t = snap.timestamp.0;
        for c in &snap.cgroups {
            if c.pressure.is_none() && c.throttling.is_none() {
                continue;
            }
            let tracks = self.cgroups.entry(c.id).or_default();
            tracks.seen = self.tick;
            // A keep horizon a little past the window, so that its start point survives.
            let keep = self.window.saturating_add(self.spacing);
            match c.pressure {
                Some(p) => {
                    let reading = match p.averaged {
                        Some(a) => Reading {
                            at: Some(a.at_ns),
                            v: [a.cpu_some_ns, a.memory_some_ns],
                        },
                        None => Reading {
                            at: None,
                            v: [p.cpu_some_ns, p.memory_some_ns],
                        },
                    };
                    tracks
                        .pressure
                        .observe(t, reading, self.settle, self.spacing, keep);
                }
                None => tracks.pressure = Track::default(),
            }
            match c.throttling {
                Some(th) => tracks.throttling.observe(
                    t,
                    Reading {
                        at: None,
                        v: [th.periods, th.throttled],
                    },
                    self.settle,
                    self.spacing,
                    keep,
                ),
                None => tracks.throttling = Track::default(),
            }
        }
        let tick = self.tick;
        self.cgroups.retain(|_, tracks| tracks.seen == tick);
    }

    /// Forgets every reading (the agent's timestamps stepped: no window may span the
    /// step); shares come back one window later.
    pub fn clear(&mut self) {
        self.cgroups.clear();
    }

    /// How many cgroups have readings.
    pub fn len(&self) -> usize {
        self.cgroups.len()
    }

    /// Whether no cgroup has readings.
    pub fn is_empty(&self) -> bool {
        self.cgroups.is_empty()
    }

    /// A cgroup's figures; `None` when it has none yet (younger than the window, or no
    /// counters).
    pub fn figures(&self, id: CgroupId) -> Option<Figures> {
        let tracks = self.cgroups.get(&id)?;
        let ms = |dt: u64| u32::try_from(dt / 1_000_000).unwrap_or(u32::MAX);
        let mut figures = Figures::default();
        if let Some(([cpu, memory], dt)) = tracks.pressure.span(self.window) {
            figures.signals.cpu_pressure = Fraction::of(cpu, dt, ms(dt));
            figures.signals.memory_pressure = Fraction::of(memory, dt, ms(dt));
        }
        if let Some(([periods, throttled], dt)) = tracks.throttling.span(self.window) {
            let th = ThrottledPeriods {
                periods,
                throttled,
                window_ms: ms(dt),
            };
            figures.throttling = Some(th);
            figures.signals.cpu_throttled = Some(th.fraction());
        }
        (!figures.signals.is_empty()).then_some(figures)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sample::{
        CgroupSample, NodeSample, Pressure, PsiAveraged, Source, Throttling, UnixNanos,
    };
    use kpulse_wire::{Bytes, CpuNanos};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const W: Duration = Duration::from_secs(30);

    fn snap(t: u64, cgroups: Vec<CgroupSample>) -> Snapshot {
        Snapshot {
            timestamp: UnixNanos(t),
            source: Source::Ebpf,
            cgroups,
            node: NodeSample {
                cpu: CpuNanos(0),
                memory_working_set: Bytes(0),
                swap: None,
            },
            dropped: 0,
        }
    }

    fn cg(id: u64, pressure: Option<(u64, u64)>, throttling: Option<(u64, u64)>) -> CgroupSample {
        CgroupSample {
            path: Arc::from(format!("/c{id}")),
            id: CgroupId(id),
            cpu: Some(CpuNanos(0)),
            memory: None,
            pressure: pressure.map(|(cpu, mem)| Pressure {
                averaged: None,
                cpu_some_ns: cpu,
                memory_some_ns: mem,
            }),
            throttling: throttling.map(|(periods, throttled)| Throttling { periods, throttled }),
        }
    }

    /// A cgroup stalled a quarter of the time, averaged by the kernel every 2 s, whose
    /// pressure files someone else reads at odd moments (which moves the current totals
    /// but not the averaged ones), read every second at an odd phase: the share is a
    /// quarter exactly, over a span of at least the window between two averaging instants.
    #[test]
    fn pressure_windows_run_between_averaging_instants() {
        let mut w = Windows::new(W, Duration::from_secs(1));
        let mut last = None;
        for tick in 0..80u64 {
            let t = 1_000 * S + tick * S + 300 * MS;
            // The kernel's clock runs 5 s behind the agent's; it averages at its even seconds.
            let k = t - 5 * S;
            let averaged_at = (k / (2 * S)) * 2 * S;
            // A read of the files every 3 s moves the current totals to the read's instant.
            let read_at = if tick % 3 == 0 {
                k - 400 * MS
            } else {
                averaged_at
            };
            let mut c = cg(7, Some((read_at.max(averaged_at) / 4, 0)), None);
            if let Some(p) = c.pressure.as_mut() {
                p.averaged = Some(PsiAveraged {
                    at_ns: averaged_at,
                    cpu_some_ns: averaged_at / 4,
                    memory_some_ns: averaged_at / 8,
                });
            }
            w.observe(&snap(t, vec![c]));
            last = w.figures(CgroupId(7));
            // The first reading is already an averaging instant (994 s): 30 s of it pass at
            // tick 29.
            if tick < 29 {
                assert_eq!(last, None, "tick {tick}: younger than the window");
            }
        }
        let f = last.expect("figures after the window");
        let cpu = f.signals.cpu_pressure.expect("cpu pressure");
        assert_eq!(cpu.ppm, 250_000);
        assert_eq!(f.signals.memory_pressure.map(|m| m.ppm), Some(125_000));
        assert!((30_000..=32_000).contains(&cpu.window_ms), "{cpu:?}");
        assert_eq!(
            cpu.window_ms % 2_000,
            0,
            "both ends at averaging instants: {cpu:?}"
        );
        assert_eq!(f.signals.cpu_throttled, None);
        assert!(w.cgroups[&CgroupId(7)].pressure.points.len() <= MAX_POINTS);
    }

    /// The same staircase taken at the ticks (the current totals, as of arbitrary reads)
    /// would be off by up to one 2 s step over a window that is not a whole number of steps:
    /// the error the averaged readings avoid.
    #[test]
    fn without_the_averaging_instants_the_share_would_be_off() {
        let window = 31 * S;
        let mut track = Track::default();
        let mut worst = 0f64;
        for tick in 0..80u64 {
            let t = 1_000 * S + tick * S + 300 * MS;
            let total = ((t / (2 * S)) * 2 * S) / 4;
            track.observe(
                t,
                Reading {
                    at: None,
                    v: [total, 0],
                },
                0,
                S,
                window + S,
            );
            if let Some(([d, _], dt)) = track.span(window) {
                worst = worst.max((d as f64 / dt as f64 - 0.25).abs());
            }
        }
        assert!(worst > 0.005, "{worst}");
    }

    /// An idle cgroup's averaging instant stops moving; once it is overdue its totals are
    /// final: its share is 0, over a window ending at the latest tick, not at its last
    /// averaging long ago.
    #[test]
    fn an_idle_cgroup_has_zero_pressure_up_to_date() {
        let mut w = Windows::new(W, Duration::from_secs(1));
        for tick in 0..50u64 {
            let mut c = cg(1, Some((5 * S, 0)), None);
            if let Some(p) = c.pressure.as_mut() {
                p.averaged = Some(PsiAveraged {
                    at_ns: 77 * S,
                    cpu_some_ns: 5 * S,
                    memory_some_ns: 0,
                });
            }
            w.observe(&snap(tick * S, vec![c]));
        }
        let f = w.figures(CgroupId(1)).expect("figures");
        let cpu = f.signals.cpu_pressure.expect("cpu");
        assert_eq!(cpu.ppm, 0);
        assert!((30_000..=32_000).contains(&cpu.window_ms), "{cpu:?}");
    }

    /// Throttling readings are exact every tick; a quota that ran no period is 0, not absent.
    #[test]
    fn throttling_shares_of_periods() {
        let mut w = Windows::new(W, Duration::from_secs(1));
        for tick in 0..40u64 {
            // 10 periods per second, 4 of them throttled.
            w.observe(&snap(
                tick * S,
                vec![
                    cg(3, None, Some((10 * tick, 4 * tick))),
                    cg(4, None, Some((77, 7))),
                ],
            ));
        }
        let f = w.figures(CgroupId(3)).expect("figures");
        assert_eq!(f.signals.cpu_throttled.map(|c| c.ppm), Some(400_000));
        assert_eq!(f.signals.cpu_pressure, None);
        let th = f.throttling.expect("counters");
        assert!(th.periods >= 300 && th.window_ms >= 30_000, "{th:?}");
        let idle = w.figures(CgroupId(4)).expect("figures");
        assert_eq!(idle.signals.cpu_throttled.map(|c| c.ppm), Some(0));
        let sum = th.plus(idle.throttling.expect("idle counters"));
        assert_eq!(sum.fraction().ppm, 400_000);
    }

    /// A new id starts over, a counter going backwards starts over, a cgroup gone is
    /// forgotten.
    #[test]
    fn restarts_and_departures_start_over() {
        let mut w = Windows::new(W, Duration::from_secs(1));
        for tick in 0..40u64 {
            w.observe(&snap(tick * S, vec![cg(5, None, Some((10 * tick, tick)))]));
        }
        assert!(w.figures(CgroupId(5)).is_some());
        w.observe(&snap(40 * S, vec![cg(5, None, Some((3, 0)))]));
        assert_eq!(
            w.figures(CgroupId(5)).and_then(|f| f.signals.cpu_throttled),
            None
        );
        w.observe(&snap(41 * S, vec![cg(6, None, Some((3, 0)))]));
        assert_eq!(w.len(), 1, "cgroup 5 left");
        assert_eq!(w.figures(CgroupId(5)), None);
        // Without counters nothing is kept.
        w.observe(&snap(42 * S, vec![cg(8, None, None)]));
        assert!(w.is_empty());
        // A clock step forgets everything.
        w.observe(&snap(43 * S, vec![cg(9, None, Some((1, 0)))]));
        assert_eq!(w.len(), 1);
        w.clear();
        assert!(w.is_empty());
    }
}
