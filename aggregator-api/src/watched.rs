//! A name → value mirror of one Kubernetes watch, and the one loop that keeps it current.
//!
//! The server watches two kinds of object: Nodes ([`crate::nodes`]: which exist, their
//! labels) and the agent DaemonSet's pods ([`crate::agents`]: which nodes run a Ready
//! agent). Both keep, per object name, a small value ([`Mirror`]); both apply a (re-)list
//! whole at its end, so that readers never see half a list ([`Relist`]); both tell
//! readiness whether the API refused the list for a reason retrying does not fix
//! ([`refused`]). [`follow_into`] is that loop, once. Every watch of the server, also the
//! authentication ConfigMap's ([`crate::auth::authconfig`]), retries with [`backoff`].

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use kube::runtime::{
    utils::{Backoff, ResetTimerBackoff},
    watcher, WatchStreamExt,
};
use parking_lot::RwLock;

/// The longest wait between two tries of a failing watch.
///
/// kube-runtime's default backoff grows to 30 s: a replica whose kube-apiserver was away
/// half a minute (a restart, an upgrade) came back to it up to 30 s late, and so took up
/// to that long to follow a CA rotated meanwhile, refusing the new CA's clients until then
/// (14.6 and 17.6 s measured by the cluster check's client-CA rotation). Capped here, it is
/// at most twice this late (the jitter adds up to as much again); while kube-apiserver is
/// away, each replica lists each watched kind once every few seconds.
pub const BACKOFF_MAX: Duration = Duration::from_secs(3);
/// How long after a watch's last error its mirror counts as current again
/// ([`Mirror::current`]): a failing watch errs at least every `2 × BACKOFF_MAX` (its retries'
/// longest wait), and a watch resumed from its last resource version brings the changes it
/// missed at once; quiet twice that long, it is watching again.
pub const QUIET_AFTER_ERROR: Duration = Duration::from_secs(4 * BACKOFF_MAX.as_secs());

/// The backoff of the server's watches: kube-runtime's default (from 0.8 s, doubling, a
/// jitter adding up to as much again, back to the start after 120 s without a failure)
/// with the doubling capped at [`BACKOFF_MAX`].
pub fn backoff() -> impl Backoff {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(
        watcher::ExponentialBackoff::from(exponential),
        Duration::from_secs(120),
    )
}

/// One change a watch reports, about objects named `name` with what is kept of them (`V`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<V> {
    /// An object was added, or changed (what is kept of it may be the same).
    Upsert {
        /// `metadata.name`.
        name: String,
        /// What is kept of it.
        value: V,
    },
    /// An object was deleted.
    Delete {
        /// `metadata.name`.
        name: String,
    },
    /// A complete list, replacing everything (the watch's first list, or a re-list).
    Replace(BTreeMap<String, V>),
}

/// What a watch has seen: a value per object name, sorted by name. Written by the watch
/// (rarely), read by every request or readiness check.
#[derive(Debug)]
pub struct Mirror<V> {
    items: RwLock<BTreeMap<String, V>>,
    /// The first complete list has been applied.
    listed: AtomicBool,
    /// The API refused the list for good (see [`refused`]) and none has come since.
    refused: AtomicBool,
    /// A (re-)list is under way: what is here is as old as its start.
    relisting: AtomicBool,
    /// The watch's last error.
    last_error: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl<V> Default for Mirror<V> {
    fn default() -> Self {
        Mirror {
            items: RwLock::new(BTreeMap::new()),
            listed: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            relisting: AtomicBool::new(false),
            last_error: parking_lot::Mutex::new(None),
        }
    }
}

impl<V: PartialEq> Mirror<V> {
    /// Empty, not listed.
    pub fn new() -> std::sync::Arc<Mirror<V>> {
        std::sync::Arc::new(Mirror::default())
    }

    /// Whether a complete list has been seen: before that the set is not authoritative.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Whether the API refused the list for a reason retrying does not fix (RBAC, no such
    /// resource, not a Kubernetes API) and no list has succeeded since.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    /// Whether the set is listed and its watch is working: no re-list under way, no error
    /// for [`QUIET_AFTER_ERROR`]. Then what is here is the API's state as of the watch's
    /// latency, not of an outage's or a re-list's start.
    pub fn current(&self) -> bool {
        self.current_at(std::time::Instant::now())
    }

    fn current_at(&self, now: std::time::Instant) -> bool {
        self.listed()
            && !self.relisting.load(Ordering::Acquire)
            && self
                .last_error
                .lock()
                .is_none_or(|at| now.saturating_duration_since(at) >= QUIET_AFTER_ERROR)
    }

    /// Records a re-list's start (`true`) or end.
    pub fn set_relisting(&self, relisting: bool) {
        self.relisting.store(relisting, Ordering::Release);
    }

    /// Records a watch error now.
    pub fn watch_failed(&self) {
        *self.last_error.lock() = Some(std::time::Instant::now());
    }

    /// Records whether the last list attempt was [`refused`].
    pub fn set_refused(&self, refused: bool) {
        self.refused.store(refused, Ordering::Release);
    }

    /// Applies one change. True if the set or a value changed.
    pub fn apply(&self, change: Change<V>) -> bool {
        match change {
            Change::Upsert { name, value } => {
                let mut items = self.items.write();
                if items.get(&name).is_some_and(|v| *v == value) {
                    return false;
                }
                items.insert(name, value);
                true
            }
            Change::Delete { name } => self.items.write().remove(&name).is_some(),
            Change::Replace(all) => {
                let mut items = self.items.write();
                let changed = *items != all;
                *items = all;
                drop(items);
                self.listed.store(true, Ordering::Release);
                changed
            }
        }
    }

    /// Whether the API has an object `name` (as last seen).
    pub fn contains(&self, name: &str) -> bool {
        self.items.read().contains_key(name)
    }

    /// How many objects the API has (as last seen).
    pub fn len(&self) -> usize {
        self.items.read().len()
    }

    /// Whether the API has no object (as last seen).
    pub fn is_empty(&self) -> bool {
        self.items.read().is_empty()
    }

    /// `f` of what is kept of `name`, if the API has it.
    pub fn get<T>(&self, name: &str, f: impl FnOnce(&V) -> T) -> Option<T> {
        self.items.read().get(name).map(f)
    }

    /// `f` of every `(name, value)`, in name order.
    pub fn collect<T, C: FromIterator<T>>(&self, f: impl FnMut((&String, &V)) -> T) -> C {
        self.items.read().iter().map(f).collect()
    }
}

/// Turns a watch's events into [`Change`]s: the objects of a (re-)list are gathered until
/// its end and applied at once, so that readers never see half a list.
#[derive(Debug)]
pub struct Relist<V> {
    pending: Option<BTreeMap<String, V>>,
}

impl<V> Default for Relist<V> {
    fn default() -> Self {
        Relist { pending: None }
    }
}

impl<V> Relist<V> {
    /// The change one event (about `(name, value)`) makes, if any (`None` while a list is
    /// being gathered).
    pub fn on(&mut self, event: watcher::Event<(String, V)>) -> Option<Change<V>> {
        match event {
            watcher::Event::Init => {
                self.pending = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitApply((name, value)) => {
                self.pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, value);
                None
            }
            watcher::Event::InitDone => {
                Some(Change::Replace(self.pending.take().unwrap_or_default()))
            }
            watcher::Event::Apply((name, value)) => Some(Change::Upsert { name, value }),
            watcher::Event::Delete((name, _)) => Some(Change::Delete { name }),
        }
    }
}

/// What [`follow_into`] says about its watch.
pub struct Narration<'a, V> {
    /// What is watched, for the log (`"Nodes"`).
    pub what: &'a str,
    /// Logs the first error of a failing spell (once per spell, at WARN: it says what
    /// falls back and which permissions the watch needs).
    pub failing: &'a (dyn Fn(&watcher::Error) + Sync),
    /// Logs the first complete list.
    pub listed: &'a (dyn Fn(&BTreeMap<String, V>) + Sync),
}

/// Keeps `mirror` current from `stream` (a watcher with its backoff), keeping `kept(object)`
/// of each object. Never returns while the stream does not end. Errors are logged (see
/// [`Narration`]) and retried by the stream's backoff; what was seen last stays in use.
pub async fn follow_into<K, V, S>(
    stream: S,
    mirror: &Mirror<V>,
    kept: impl Fn(K) -> (String, V),
    say: Narration<'_, V>,
) where
    V: PartialEq,
    S: WatchStreamExt<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut relist = Relist::default();
    let mut failing = false;
    while let Some(event) = next(stream.as_mut()).await {
        let event = match event {
            Ok(e) => e,
            Err(error) => {
                if !failing {
                    (say.failing)(&error);
                }
                if !mirror.listed() {
                    mirror.set_refused(refused(&error));
                }
                mirror.watch_failed();
                failing = true;
                continue;
            }
        };
        if failing {
            tracing::info!(what = say.what, "watching again");
            failing = false;
        }
        mirror.set_refused(false);
        // A (re-)list replaces everything only at its end: until then what is here is as
        // old as the list's start, or the outage's.
        if matches!(event, watcher::Event::Init) {
            mirror.set_relisting(true);
        }
        let Some(change) = relist.on(map_event(event, &kept)) else {
            continue;
        };
        let replace = matches!(change, Change::Replace(_));
        if let Change::Replace(all) = &change {
            if !mirror.listed() {
                (say.listed)(all);
            }
        }
        mirror.apply(change);
        if replace {
            mirror.set_relisting(false);
        }
    }
}

/// Whether a watch error is one retrying does not fix: the API forbids the list (RBAC), has
/// no such resource, or does not answer like a Kubernetes API. Readiness stops waiting for
/// a list that is refused so ([`crate::health::Completeness`]).
pub fn refused(error: &watcher::Error) -> bool {
    let e = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        watcher::Error::WatchError(status) => return matches!(status.code, 403 | 404),
        watcher::Error::NoResourceVersion => return true,
    };
    match e {
        kube::Error::Api(status) => matches!(status.code, 403 | 404),
        kube::Error::SerdeError(_) => true,
        _ => false,
    }
}

/// The same event about `f(object)`.
pub(crate) fn map_event<A, B>(e: watcher::Event<A>, f: impl FnOnce(A) -> B) -> watcher::Event<B> {
    match e {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The next item of a stream (this crate has no `futures` dependency).
async fn next<S: WatchStreamExt + ?Sized>(mut stream: std::pin::Pin<&mut S>) -> Option<S::Item> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_once_listed_and_while_the_watch_works() {
        let m = Mirror::<u32>::new();
        assert!(!m.current(), "not listed");
        m.apply(Change::Replace(BTreeMap::from([("a".to_string(), 1)])));
        assert!(m.current());
        m.set_relisting(true);
        assert!(!m.current(), "re-listing: as old as the list's start");
        m.set_relisting(false);
        assert!(m.current());
        m.watch_failed();
        let now = std::time::Instant::now();
        assert!(!m.current_at(now), "failing: out of date by any amount");
        assert!(m.contains("a"), "what was seen stays");
        assert!(
            m.current_at(now + QUIET_AFTER_ERROR),
            "quiet since: watching again"
        );
    }

    #[test]
    fn a_failing_watch_retries_within_twice_the_cap() {
        let mut b = backoff();
        let first = b.next().unwrap_or_default();
        assert!(
            (Duration::from_millis(800)..=Duration::from_millis(1600)).contains(&first),
            "{first:?}"
        );
        let later: Vec<Duration> = b.by_ref().take(1000).collect();
        assert_eq!(later.len(), 1000, "a watch retries for ever");
        assert!(later.iter().all(|d| *d <= BACKOFF_MAX * 2), "{later:?}");
        // It grows: past the first tries, some waits are above the start's twice.
        assert!(later.iter().any(|d| *d > Duration::from_millis(1600)));
        b.reset();
        assert!(b.next().unwrap_or_default() <= Duration::from_millis(1600));
    }
}
