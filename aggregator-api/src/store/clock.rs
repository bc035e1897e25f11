//! Where the store reads "now" from: the [`Clock`] trait, the system's wall clock and a
//! manual clock for tests and benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpulse_wire::UnixNanos;

/// Where the store reads "now" from: expiry and the receive time of batches.
pub trait Clock: Send + Sync {
    /// The current wall-clock time.
    fn now(&self) -> UnixNanos;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixNanos {
        UnixNanos::from_system_time(SystemTime::now())
    }
}

/// A clock that only moves when told to, for tests and benchmarks. Share it with the store
/// through an `Arc`.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `now`.
    pub fn new(now: UnixNanos) -> ManualClock {
        ManualClock(AtomicU64::new(now.0))
    }

    /// Sets the time (it may go backwards).
    pub fn set(&self, now: UnixNanos) {
        self.0.store(now.0, Ordering::SeqCst);
    }

    /// Moves the time forward, saturating.
    pub fn advance(&self, by: Duration) {
        let by = duration_nanos(by);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixNanos {
        UnixNanos(self.0.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> UnixNanos {
        (**self).now()
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(super) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
