//! One series (the node's, or one container's): its last point, the earlier points its
//! rate may start from, and the rules that advance it and derive its rate ([`Limits`]):
//! restarts, points back in time, first-interval visibility and the served window (fixed,
//! or adaptive: see [`Level`]), as the `store` module docs describe them. Everything here
//! is a small `Copy` value.

use std::time::Duration;

use kpulse_wire::{Bytes, CgroupId, ContainerSample, CpuNanos, NodeSample, UnixNanos};

use super::clock::duration_nanos;
use super::{NanoCores, RestartRule, StoreConfig, WindowMode, MIN_FIRST_WINDOW};

const MIN_FIRST_WINDOW_NANOS: u64 = MIN_FIRST_WINDOW.as_nanos() as u64;

/// One measured point; the identity fields tell instances apart.
#[derive(Clone, Copy, Debug)]
pub(super) struct Point {
    pub(super) timestamp: UnixNanos,
    pub(super) cpu: CpuNanos,
    pub(super) memory: Bytes,
    pub(super) swap: Option<Bytes>,
    pub(super) started_at: Option<UnixNanos>,
    pub(super) cgroup_id: Option<CgroupId>,
}

impl Point {
    pub(super) fn of_container(c: &ContainerSample) -> Point {
        Point {
            timestamp: c.timestamp,
            cpu: c.cpu,
            memory: c.memory_working_set,
            swap: c.swap,
            started_at: c.started_at,
            cgroup_id: c.cgroup_id,
        }
    }

    pub(super) fn of_node(n: &NodeSample) -> Point {
        Point {
            timestamp: n.timestamp,
            cpu: n.cpu,
            memory: n.memory_working_set,
            swap: n.swap,
            started_at: n.started_at,
            cgroup_id: None,
        }
    }

    /// Same instance unless an identity field says otherwise: the cgroup id, known in both
    /// points, differs; or the start time does as `rule` reads it (`Changed`: known in both
    /// and different; `StartedAfterLastPoint`: the new one not before the last timestamp).
    fn same_instance(&self, new: &Point, rule: RestartRule) -> bool {
        let cgroup = match (self.cgroup_id, new.cgroup_id) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let start = match (self.started_at, new.started_at, rule) {
            (Some(a), Some(b), RestartRule::Changed) => a == b,
            // metrics-server keeps the last point only if the new start is before it.
            (_, Some(b), RestartRule::StartedAfterLastPoint) => b < self.timestamp,
            _ => true,
        };
        cgroup && start
    }
}

/// What a rate is computed from: an earlier point's time and counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Base {
    pub(super) timestamp: UnixNanos,
    pub(super) cpu: CpuNanos,
}

impl Base {
    fn of(p: &Point) -> Base {
        Base {
            timestamp: p.timestamp,
            cpu: p.cpu,
        }
    }
}

/// Points kept for the served window: the one the rate is taken from, then up to
/// [`WINDOW_STEPS`] younger ones spaced at least `window / WINDOW_STEPS` apart, so that
/// one of them is old enough when the window slides on.
const BASES: usize = WINDOW_STEPS as usize + 1;
/// See [`BASES`]: a served window is at most `window + window / WINDOW_STEPS` plus one
/// agent interval.
pub(super) const WINDOW_STEPS: u64 = 4;

/// Earlier points of one instance, oldest first; the oldest is the rate's base.
#[derive(Clone, Copy, Debug, Default)]
struct Bases {
    at: [Base; BASES],
    len: u8,
}

impl Bases {
    fn one(b: Base) -> Bases {
        let mut at = [Base::default(); BASES];
        at[0] = b;
        Bases { at, len: 1 }
    }

    fn as_slice(&self) -> &[Base] {
        &self.at[..usize::from(self.len).min(BASES)]
    }

    fn oldest(&self) -> Option<Base> {
        self.as_slice().first().copied()
    }

    fn newest(&self) -> Option<Base> {
        self.as_slice().last().copied()
    }

    /// Appends `b` (younger than every kept point). When full, the second oldest makes
    /// room: the oldest is the current base and must stay until a younger one is old
    /// enough. With the spacing [`Limits::advance`] keeps this never happens.
    fn push(&mut self, b: Base) {
        let len = usize::from(self.len).min(BASES);
        if len == BASES {
            self.at.copy_within(2.., 1);
            self.at[BASES - 1] = b;
        } else {
            self.at[len] = b;
            self.len += 1;
        }
    }

    /// Drops the oldest points while the next one is at least `qualify` before `t`: the
    /// base becomes the newest point old enough for the window.
    fn slide(&mut self, t: UnixNanos, qualify: u64) {
        let len = usize::from(self.len).min(BASES);
        let mut drop = 0;
        while drop + 1 < len && t.0.saturating_sub(self.at[drop + 1].timestamp.0) >= qualify {
            drop += 1;
        }
        if drop > 0 {
            self.at.copy_within(drop.., 0);
            self.len -= drop as u8;
        }
    }

    /// Keeps the points strictly before `p` whose counter is not above its (for a point
    /// that went back in time).
    fn truncate_after(&mut self, p: &Point) {
        let keep = self
            .as_slice()
            .iter()
            .take_while(|b| b.timestamp < p.timestamp && b.cpu <= p.cpu)
            .count();
        self.len = keep as u8;
    }
}

/// The last point of one instance and the earlier points its rate may start from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Series {
    last: Point,
    bases: Bases,
    /// The CPU level since it last changed ([`WindowMode::Adaptive`] only).
    level: Level,
}

/// An adaptive window's level change: the two newest intervals' CPU rates both more than
/// this many standard deviations above (or both below) the mean of the intervals before
/// them.
const LEVEL_Z: f64 = 4.0;
/// The smallest standard deviation a level change is measured against, in cores (5 mCPU),
/// so that an idle series' near-zero spread does not make every millicore a change.
const LEVEL_MIN_SD: f64 = 0.005;
/// ... and as a share of the mean: a steady series changes level only when both new
/// intervals are more than 4 × 5 % = 20 % away from it.
const LEVEL_MIN_RELATIVE_SD: f64 = 0.05;
/// Intervals the mean and spread must hold before a change is looked for.
const LEVEL_MIN_INTERVALS: u8 = 3;
/// An adaptive window of a Ready pod starts at least this long after the pod's Ready
/// transition as the API states it. The HPA ignores a pod's CPU in its initialisation period
/// while `timestamp < readyTransition + window`; both times are whole seconds there, so a
/// window starting one second after the stated transition is always used, and the first one
/// the series has is served about one agent interval after that.
pub(super) const READY_SLACK_NANOS: u64 = 1_000_000_000;

/// An adaptive window's view of a series' CPU since its level last changed: the mean and
/// variance of its intervals' rates (in cores; each interval weighs `1/n` while fewer
/// than the window's worth have been seen, then `interval / window`, so older intervals
/// fade out over about one window), and the newest interval's rate, held back so that a
/// change needs two intervals in a row to agree.
///
/// When the two newest intervals both lie more than [`LEVEL_Z`] standard deviations (at
/// least [`LEVEL_MIN_SD`] and [`LEVEL_MIN_RELATIVE_SD`] of the mean) on the same side of
/// the mean, the level has changed: the kept points older than the newest interval are
/// dropped, so the served window restarts at one interval and grows back to the setting.
/// A steady or noisy series is served over the whole window; a step is served over the
/// time since it, within about two intervals of it. A one-interval spike never moves the
/// window.
#[derive(Clone, Copy, Debug, Default)]
struct Level {
    mean: f32,
    variance: f32,
    /// The newest interval's rate, not yet merged, when `held`.
    pending: f32,
    held: bool,
    /// Intervals merged into `mean` and `variance` (saturating).
    intervals: u8,
}

impl Level {
    /// Takes the rate `x` (cores) of an interval of `dt_ns`; true when it and the interval
    /// before it show a change of level, after which the level starts again from `x`.
    fn observe(&mut self, x: f64, dt_ns: u64, window_ns: u64) -> bool {
        if self.held {
            let (p, mean) = (f64::from(self.pending), f64::from(self.mean));
            if self.intervals >= LEVEL_MIN_INTERVALS {
                let sd = f64::from(self.variance)
                    .sqrt()
                    .max(LEVEL_MIN_SD)
                    .max(LEVEL_MIN_RELATIVE_SD * mean.abs());
                let bound = LEVEL_Z * sd;
                if (p - mean > bound && x - mean > bound) || (mean - p > bound && mean - x > bound)
                {
                    *self = Level {
                        pending: x as f32,
                        held: true,
                        ..Level::default()
                    };
                    return true;
                }
            }
            self.intervals = self.intervals.saturating_add(1);
            let weight = (1.0 / f64::from(self.intervals))
                .max(dt_ns as f64 / window_ns.max(1) as f64)
                .min(1.0);
            let d = p - mean;
            let variance = f64::from(self.variance);
            self.mean = (mean + weight * d) as f32;
            self.variance = ((1.0 - weight) * (variance + weight * d * d)) as f32;
        }
        self.pending = x as f32;
        self.held = true;
        false
    }
}

/// The rate derived from a series.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rate {
    pub(super) timestamp: UnixNanos,
    pub(super) window: Duration,
    pub(super) cpu: NanoCores,
    pub(super) memory: Bytes,
    pub(super) swap: Option<Bytes>,
}

/// Limits in nanoseconds, as the hot paths use them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) expiry: u64,
    first_point_max_age: u64,
    /// A point this old or older can be the base of the served window (`window` less
    /// 1/16 of it; 0 with no window, i.e. the previous point).
    qualify: u64,
    /// Kept points are at least this far apart (`window / WINDOW_STEPS`).
    spacing: u64,
    /// The setting, for an adaptive window's weights; 0 unless the window is adaptive.
    adaptive_window: u64,
    restarts: RestartRule,
}

impl Limits {
    /// At most `expiry` old, by `now`. Timestamps ahead of `now` count as fresh; the
    /// receive-time check bounds how long that can last.
    pub(super) fn fresh(&self, t: UnixNanos, now: UnixNanos) -> bool {
        now.0.saturating_sub(t.0) <= self.expiry
    }

    pub(super) fn new(config: &StoreConfig) -> Limits {
        let window = duration_nanos(config.window);
        Limits {
            expiry: duration_nanos(config.metric_expiry),
            first_point_max_age: duration_nanos(config.first_point_max_age),
            qualify: window - window / 16,
            spacing: window / WINDOW_STEPS,
            adaptive_window: match config.window_mode {
                WindowMode::Fixed => 0,
                WindowMode::Adaptive => window,
            },
            restarts: config.restarts,
        }
    }

    /// The series of a point with no usable predecessor of its own instance.
    fn first(&self, last: Point) -> Series {
        let start = last.started_at.and_then(|start| {
            let age = last.timestamp.0.checked_sub(start.0)?;
            (age >= MIN_FIRST_WINDOW_NANOS && age <= self.first_point_max_age).then_some(Base {
                timestamp: start,
                cpu: CpuNanos(0),
            })
        });
        Series {
            last,
            bases: start.map(Bases::one).unwrap_or_default(),
            level: Level::default(),
        }
    }

    /// The series after `new` arrives; true when `new` starts a new instance. `ready_since`
    /// is when the series' pod last became Ready (whole seconds), if it is Ready and the
    /// agent said so: an adaptive window then never starts before it (see
    /// [`READY_SLACK_NANOS`]).
    pub(super) fn advance(
        &self,
        old: Option<&Series>,
        new: Point,
        now: UnixNanos,
        ready_since: Option<UnixNanos>,
    ) -> (Series, bool) {
        let Some(old) = old else {
            return (self.first(new), false);
        };
        if !old.last.same_instance(&new, self.restarts) {
            return (self.first(new), true);
        }
        if new.timestamp > old.last.timestamp {
            if new.cpu < old.last.cpu {
                // The counter went backwards: a new instance we could not otherwise tell.
                return (self.first(new), true);
            }
            if self.fresh(old.last.timestamp, now) {
                let mut bases = old.bases;
                let mut level = old.level;
                if self.adaptive_window > 0 {
                    let dt = new.timestamp.0 - old.last.timestamp.0;
                    let cores = (new.cpu.0 - old.last.cpu.0) as f64 / dt as f64;
                    let from_ready = ready_since.map(|r| r.0.saturating_add(READY_SLACK_NANOS));
                    let before_ready = from_ready.is_some_and(|from| {
                        old.last.timestamp.0 >= from
                            && bases.oldest().is_some_and(|b| b.timestamp.0 < from)
                    });
                    if level.observe(cores, dt, self.adaptive_window) || before_ready {
                        // The level changed, or the window reaches back before the pod became
                        // Ready: it restarts at the newest interval (too young to be pushed
                        // again below).
                        bases = Bases::one(Base::of(&old.last));
                    }
                }
                let spaced = bases.newest().is_none_or(|b| {
                    old.last.timestamp.0.saturating_sub(b.timestamp.0) >= self.spacing
                });
                if spaced {
                    bases.push(Base::of(&old.last));
                }
                bases.slide(new.timestamp, self.qualify);
                return (
                    Series {
                        last: new,
                        bases,
                        level,
                    },
                    false,
                );
            }
            return (self.first(new), false);
        }
        // A repeated or older point: keep the earlier points that are still older, if the
        // newest of them is fresh.
        let mut bases = old.bases;
        bases.truncate_after(&new);
        match bases.newest() {
            Some(p) if self.fresh(p.timestamp, now) => {
                bases.slide(new.timestamp, self.qualify);
                // Intervals are no longer what the level saw: it starts again.
                (
                    Series {
                        last: new,
                        bases,
                        level: Level::default(),
                    },
                    false,
                )
            }
            _ => (self.first(new), false),
        }
    }

    /// The rate of a series, if it has one and its last point is fresh.
    pub(super) fn rate(&self, s: &Series, now: UnixNanos) -> Option<Rate> {
        if !self.fresh(s.last.timestamp, now) {
            return None;
        }
        let base = s.bases.oldest()?;
        let (cpu, window) = cpu_rate(base, &s.last)?;
        Some(Rate {
            timestamp: s.last.timestamp,
            window,
            cpu,
            memory: s.last.memory,
            swap: s.last.swap,
        })
    }
}

/// `Δcpu × 10⁹ / Δt` in nanocores, saturating; `None` unless time moved forward and the
/// counter did not move back.
pub(super) fn cpu_rate(prev: Base, last: &Point) -> Option<(NanoCores, Duration)> {
    let dt = last.timestamp.0.checked_sub(prev.timestamp.0)?;
    if dt == 0 {
        return None;
    }
    let dcpu = last.cpu.0.checked_sub(prev.cpu.0)?;
    // u64::MAX × 10⁹ < 2⁹⁴: no overflow in u128.
    let rate = u128::from(dcpu) * 1_000_000_000 / u128::from(dt);
    Some((
        NanoCores(u64::try_from(rate).unwrap_or(u64::MAX)),
        Duration::from_nanos(dt),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_stays_small() {
        // Kept for every container of every node (about 1.1 M at 5,000 nodes): the
        // adaptive window's level adds 16 bytes to the 160 of the last point and the
        // window's kept points.
        assert_eq!(std::mem::size_of::<Level>(), 16);
        assert_eq!(std::mem::size_of::<Series>(), 176);
    }
}
