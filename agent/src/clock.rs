//! The agent's timeline: wall-clock nanoseconds that advance with `CLOCK_BOOTTIME`, so that
//! a step of the node's wall clock (`date -s`, an NTP step, a leap second inserted by
//! stepping) never shortens, lengthens or reverses the window between two samples.
//!
//! Every timestamp the agent sends with a counter — each sample's
//! [`timestamp`](kpulse_wire::ContainerSample::timestamp), each container's
//! [`started_at`](kpulse_wire::ContainerSample::started_at) (process start times are
//! clock ticks since boot) and the node's boot time — is `anchor + CLOCK_BOOTTIME`, where
//! `anchor` is the wall-clock instant of boot. `CLOCK_BOOTTIME` is slewed by NTP like the
//! wall clock but never stepped, so `CLOCK_REALTIME − CLOCK_BOOTTIME` changes only when the
//! wall clock steps.
//!
//! Once per tick [`check`] compares the anchor with the wall clock. A difference larger than
//! [`STEP_THRESHOLD`] is a step: the agent moves the anchor (so that its timestamps stay
//! comparable with the aggregator's clock, which expires old data) and logs it. Moving the
//! anchor moves every `started_at` with it, which the aggregator reads as a new instance of
//! every container and of the node: it never subtracts a counter read before the step from
//! one read after it. Each series misses one rate (the next tick brings it back) instead of
//! serving a window that is off by the step — which after a backward step of half a
//! second would have doubled every rate.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use kpulse_wire::UnixNanos;

use crate::probe::{self, ClockId};

/// A disagreement between the anchor and the wall clock beyond this is a step. Slewing
/// moves both clocks alike; reading the two clocks one after the other differs by
/// microseconds.
pub const STEP_THRESHOLD: Duration = Duration::from_millis(100);

/// The wall-clock instant of boot the timeline counts from; 0 until first needed.
static ANCHOR: AtomicU64 = AtomicU64::new(0);

/// A step of the wall clock, seen by [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The anchor before.
    pub from: UnixNanos,
    /// The anchor after.
    pub to: UnixNanos,
}

impl Step {
    /// How far the wall clock moved, in nanoseconds (negative: backwards).
    pub fn nanos(&self) -> i128 {
        i128::from(self.to.0) - i128::from(self.from.0)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.nanos();
        let sign = if n < 0 { "-" } else { "+" };
        let d = Duration::from_nanos(u64::try_from(n.unsigned_abs()).unwrap_or(u64::MAX));
        write!(f, "{sign}{d:?}")
    }
}

/// The wall-clock instant of boot on the timeline; `None` if the clocks cannot be read.
pub fn boot() -> Option<UnixNanos> {
    match ANCHOR.load(Ordering::Relaxed) {
        0 => {
            let b = read_anchor()?;
            // First caller wins; a concurrent one reads the winner's anchor.
            match ANCHOR.compare_exchange(0, b.0, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => Some(b),
                Err(current) => Some(UnixNanos(current)),
            }
        }
        a => Some(UnixNanos(a)),
    }
}

/// Reads of the two clocks tried for one anchor; the tightest wins.
const ANCHOR_READS: usize = 8;
/// A read whose two `CLOCK_BOOTTIME` reads are this close is taken at once.
const ANCHOR_GOOD_ENOUGH: u128 = 20_000;

/// The wall-clock instant of boot, `CLOCK_REALTIME − CLOCK_BOOTTIME`, to within
/// microseconds (`/proc/stat`'s `btime` is whole seconds).
///
/// Each read brackets the wall clock between two reads of `CLOCK_BOOTTIME`. A thread
/// preempted between the reads — milliseconds on a loaded node, tens of them in an
/// emulated VM — would otherwise shift every timestamp of the agent's life by the
/// preemption, so that a counter read at `t` is reported at `t + preemption`.
/// `None` if a clock cannot be read.
fn read_anchor() -> Option<UnixNanos> {
    let mut reads = [BracketedRead::default(); ANCHOR_READS];
    let mut taken = 0;
    for read in &mut reads {
        let before = probe::clock_nanos(ClockId::Boottime)?;
        let real = probe::clock_nanos(ClockId::Realtime)?;
        let after = probe::clock_nanos(ClockId::Boottime)?;
        *read = BracketedRead {
            before,
            real,
            after,
        };
        taken += 1;
        if after.saturating_sub(before) <= ANCHOR_GOOD_ENOUGH {
            break;
        }
    }
    tightest_anchor(&reads[..taken])
}

/// `CLOCK_REALTIME` read between two reads of `CLOCK_BOOTTIME`.
#[derive(Clone, Copy, Debug, Default)]
struct BracketedRead {
    before: u128,
    real: u128,
    after: u128,
}

/// The anchor of the read with the narrowest bracket: the wall clock minus the middle of
/// the bracket.
fn tightest_anchor(reads: &[BracketedRead]) -> Option<UnixNanos> {
    let best = reads
        .iter()
        .filter(|r| r.after >= r.before)
        .min_by_key(|r| r.after - r.before)?;
    let mid = best.before + (best.after - best.before) / 2;
    u64::try_from(best.real.checked_sub(mid)?)
        .ok()
        .map(UnixNanos)
}

/// Now, on the timeline. Falls back to the wall clock if `CLOCK_BOOTTIME` cannot be read.
pub fn now() -> UnixNanos {
    let on_timeline = boot().and_then(|anchor| {
        let since_boot = probe::clock_nanos(ClockId::Boottime)?;
        u64::try_from(u128::from(anchor.0) + since_boot)
            .ok()
            .map(UnixNanos)
    });
    on_timeline.unwrap_or_else(wall)
}

fn wall() -> UnixNanos {
    UnixNanos::from_system_time(std::time::SystemTime::now())
}

/// Moves the anchor if the wall clock stepped since the last call; returns the step.
pub fn check() -> Option<Step> {
    let anchor = boot()?;
    let to = stepped(anchor, read_anchor()?, STEP_THRESHOLD)?;
    ANCHOR.store(to.0, Ordering::Relaxed);
    Some(Step { from: anchor, to })
}

/// `now` (a fresh reading of the wall-clock instant of boot) when it is more than
/// `threshold` away from `anchor`.
fn stepped(anchor: UnixNanos, now: UnixNanos, threshold: Duration) -> Option<UnixNanos> {
    let threshold = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
    (now.0.abs_diff(anchor.0) > threshold).then_some(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u128 = 1_000_000_000;
    const BOOT: u64 = 1_700_000_000_000_000_000;

    fn read(before: u128, real: u128, after: u128) -> BracketedRead {
        BracketedRead {
            before,
            real,
            after,
        }
    }

    #[test]
    fn jitter_and_slew_are_not_steps() {
        let t = STEP_THRESHOLD;
        // Reading the clocks one after the other: microseconds apart.
        assert_eq!(stepped(UnixNanos(BOOT), UnixNanos(BOOT + 40_000), t), None);
        assert_eq!(
            stepped(UnixNanos(BOOT), UnixNanos(BOOT - 99_000_000), t),
            None
        );
    }

    #[test]
    fn steps_either_way_move_the_anchor_by_the_step() {
        let t = STEP_THRESHOLD;
        let back = stepped(UnixNanos(BOOT), UnixNanos(BOOT - 500_000_000), t);
        assert_eq!(back, Some(UnixNanos(BOOT - 500_000_000)));
        let fwd = stepped(UnixNanos(BOOT), UnixNanos(BOOT + 3_600_000_000_000), t);
        assert_eq!(fwd, Some(UnixNanos(BOOT + 3_600_000_000_000)));
        let step = Step {
            from: UnixNanos(BOOT),
            to: UnixNanos(BOOT - 500_000_000),
        };
        assert_eq!(step.nanos(), -500_000_000);
        assert_eq!(step.to_string(), "-500ms");
    }

    #[test]
    fn a_read_preempted_between_the_clocks_does_not_move_the_anchor() {
        let boot = u128::from(BOOT);
        // Read 1: preempted for 12 ms after the first CLOCK_BOOTTIME read, so the wall
        // clock is 12 ms late relative to it. Read 2: 3 µs apart.
        let reads = [
            read(5 * S, boot + 5 * S + 12_000_000, 5 * S + 12_001_000),
            read(6 * S, boot + 6 * S + 1_000, 6 * S + 3_000),
        ];
        let anchor = tightest_anchor(&reads).map(|a| a.0);
        // The middle of read 2's bracket is 1.5 µs after its first read: within it.
        assert_eq!(anchor, Some(BOOT - 500));
        // Taking read 1 alone (the old single read) would have been 6 ms off.
        let alone = tightest_anchor(&reads[..1]).map(|a| a.0);
        assert_eq!(alone, Some(BOOT + 5_999_500));
    }

    #[test]
    fn nonsense_reads_give_no_anchor() {
        // A wall clock before boot, or a bracket that runs backwards.
        assert_eq!(tightest_anchor(&[read(5 * S, 3, 5 * S + 1)]), None);
        assert_eq!(tightest_anchor(&[read(5 * S, 9 * S, 5 * S - 1)]), None);
        assert_eq!(tightest_anchor(&[]), None);
    }

    #[test]
    fn the_anchor_read_here_is_tight() {
        let reads: Vec<BracketedRead> = (0..ANCHOR_READS)
            .filter_map(|_| {
                let before = probe::clock_nanos(ClockId::Boottime)?;
                let real = probe::clock_nanos(ClockId::Realtime)?;
                let after = probe::clock_nanos(ClockId::Boottime)?;
                Some(read(before, real, after))
            })
            .collect();
        let narrowest = reads.iter().map(|r| r.after - r.before).min();
        // Eight tries: at least one is not preempted, even on a busy test machine.
        assert!(narrowest.is_some_and(|w| w < 5_000_000), "{reads:?}");
        let a = read_anchor().map(|a| a.0).unwrap_or_default();
        let b = tightest_anchor(&reads).map(|a| a.0).unwrap_or_default();
        assert!(a.abs_diff(b) < 5_000_000, "{a} vs {b}");
    }

    #[test]
    fn the_timeline_follows_boottime_and_starts_at_the_wall_clock() {
        let a = now();
        let wall_now = wall();
        assert!(
            a.0.abs_diff(wall_now.0) < 50_000_000,
            "{a:?} vs {wall_now:?}"
        );
        let b = now();
        assert!(b >= a);
        let boot = boot().map(|b| b.0).unwrap_or_default();
        let since = probe::clock_nanos(ClockId::Boottime).unwrap_or_default();
        assert!(u128::from(now().0) >= u128::from(boot) + since);
    }
}
