//! `/healthz`, `/livez`, `/readyz` with named checks and `?verbose` / `?exclude=` output
//! in the format of k8s.io/apiserver's healthz package, so probes and humans read them
//! the same way as metrics-server's.
//!
//! # Liveness: `metric-collection-timely`
//!
//! metrics-server's check of that name fails when its last scrape of the kubelets is older
//! than 1.5 × the resolution. This server does not scrape: agents push. Failing livez when
//! agents are absent would make the kubelet restart a healthy server for something a
//! restart cannot fix (a node down, a network partition, agents not deployed yet), in a
//! loop. So livez asks whether the *server* still makes progress: the store's maintenance
//! loop (`main.rs`: [`Store::housekeep`](crate::store::Store::housekeep), which expires
//! nodes whose agents stopped) beats a [`Heartbeat`] after every pass, at the interval of
//! [`maintenance_schedule`], and the check fails when the last pass is older than the
//! bound it returns (3 intervals, at least [`MIN_LIVENESS_BOUND`]), with a reason such as
//! "the store's maintenance loop last ran 93s ago (limit 15s)". That happens when the
//! runtime is starved or wedged, or the loop died. Absent agents show in readyz
//! (`metric-storage-ready`) and in the store gauges of `/metrics` instead.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// The name of the liveness check on the store's maintenance loop.
pub const METRIC_COLLECTION_TIMELY: &str = "metric-collection-timely";
/// The longest time between two maintenance passes.
pub const MAX_MAINTENANCE_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest time between two maintenance passes (for a tiny `--metric-expiry`).
pub const MIN_MAINTENANCE_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest staleness of the maintenance heartbeat that fails livez.
pub const MIN_LIVENESS_BOUND: Duration = Duration::from_secs(10);

/// How often the store's maintenance runs for `metric_expiry` — half of it, within
/// [`MIN_MAINTENANCE_INTERVAL`]..=[`MAX_MAINTENANCE_INTERVAL`], so an expired node is dropped
/// at most 1.5 expiry periods after its last batch — and how old its last pass may be before
/// livez fails: three intervals, at least [`MIN_LIVENESS_BOUND`].
pub fn maintenance_schedule(metric_expiry: Duration) -> (Duration, Duration) {
    let interval = (metric_expiry / 2).clamp(MIN_MAINTENANCE_INTERVAL, MAX_MAINTENANCE_INTERVAL);
    (interval, (interval * 3).max(MIN_LIVENESS_BOUND))
}

/// A check that passes while a periodic task keeps reporting progress ([`Heartbeat::beat`])
/// and fails once its last beat is older than a bound. Time is monotonic ([`Instant`]):
/// wall-clock steps neither fail nor pass it.
#[derive(Debug)]
pub struct Heartbeat {
    name: String,
    what: String,
    max_age: Duration,
    /// What `last` counts from.
    base: Instant,
    /// Nanoseconds from `base` to the latest beat.
    last: AtomicU64,
}

impl Heartbeat {
    /// A check named `name` on the task `what` (for the failure reason), failing when the
    /// last beat is more than `max_age` old. Creation counts as a beat.
    pub fn new(name: &str, what: &str, max_age: Duration) -> Heartbeat {
        Heartbeat::started_at(name, what, max_age, Instant::now())
    }

    /// [`Heartbeat::new`] with creation at `now` (for tests).
    pub fn started_at(name: &str, what: &str, max_age: Duration, now: Instant) -> Heartbeat {
        Heartbeat {
            name: name.to_string(),
            what: what.to_string(),
            max_age,
            base: now,
            last: AtomicU64::new(0),
        }
    }

    /// Records progress now.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// Records progress at `at`; an earlier beat than the latest one changes nothing.
    pub fn beat_at(&self, at: Instant) {
        let nanos =
            u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::Relaxed);
    }

    /// The check's answer at `now`.
    pub fn check_at(&self, now: Instant) -> Result<(), String> {
        let last = self.base + Duration::from_nanos(self.last.load(Ordering::Relaxed));
        let age = now.saturating_duration_since(last);
        if age <= self.max_age {
            Ok(())
        } else {
            Err(format!(
                "{} last ran {}s ago (limit {:?})",
                self.what,
                age.as_secs(),
                self.max_age
            ))
        }
    }
}

impl Check for Heartbeat {
    fn name(&self) -> &str {
        &self.name
    }
    fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }
}

/// One named check.
pub trait Check: Send + Sync {
    /// The check's name (`metric-storage-ready`, ...).
    fn name(&self) -> &str;
    /// `Err(reason)` when unhealthy. The reason is logged, not sent to clients.
    fn check(&self) -> Result<(), String>;
}

/// A check from a closure.
pub struct FnCheck<F> {
    name: String,
    f: F,
}

impl<F: Fn() -> Result<(), String> + Send + Sync> FnCheck<F> {
    /// A named check.
    pub fn arc(name: &str, f: F) -> Arc<dyn Check>
    where
        F: 'static,
    {
        Arc::new(FnCheck {
            name: name.to_string(),
            f,
        })
    }
}

impl<F: Fn() -> Result<(), String> + Send + Sync> Check for FnCheck<F> {
    fn name(&self) -> &str {
        &self.name
    }
    fn check(&self) -> Result<(), String> {
        (self.f)()
    }
}

/// The always-passing `ping` check every endpoint has.
pub fn ping() -> Arc<dyn Check> {
    FnCheck::arc("ping", || Ok(()))
}

/// A health endpoint's answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// 200, 404 (unknown check name) or 500.
    pub status: u16,
    /// `text/plain` body.
    pub body: String,
}

/// Evaluates `checks` for endpoint `endpoint` (`healthz`, `livez`, `readyz`).
/// `sub` selects one check (`/readyz/<name>`); `query` is the raw query string.
pub fn evaluate(
    endpoint: &str,
    checks: &[Arc<dyn Check>],
    sub: Option<&str>,
    query: &str,
) -> Answer {
    let mut verbose = false;
    let mut exclude: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "verbose" => verbose = v.is_empty() || v == "true" || v == "1",
            "exclude" => exclude.push(v.to_string()),
            _ => {}
        }
    }
    if let Some(name) = sub {
        let Some(c) = checks.iter().find(|c| c.name() == name) else {
            return Answer {
                status: 404,
                body: "404 page not found\n".into(),
            };
        };
        return match c.check() {
            Ok(()) => Answer {
                status: 200,
                body: "ok".into(),
            },
            Err(reason) => {
                tracing::debug!(check = name, %reason, "{endpoint} check failed");
                Answer {
                    status: 500,
                    body: "internal server error: reason withheld\n".into(),
                }
            }
        };
    }
    let mut lines = String::new();
    let mut failed = false;
    for c in checks {
        if exclude.iter().any(|e| e == c.name()) {
            lines.push_str(&format!("[+]{} excluded: ok\n", c.name()));
            continue;
        }
        match c.check() {
            Ok(()) => lines.push_str(&format!("[+]{} ok\n", c.name())),
            Err(reason) => {
                failed = true;
                tracing::debug!(check = c.name(), %reason, "{endpoint} check failed");
                lines.push_str(&format!("[-]{} failed: reason withheld\n", c.name()));
            }
        }
    }
    if failed {
        Answer {
            status: 500,
            body: format!("{lines}{endpoint} check failed\n"),
        }
    } else if verbose {
        Answer {
            status: 200,
            body: format!("{lines}{endpoint} check passed\n"),
        }
    } else {
        Answer {
            status: 200,
            body: "ok".into(),
        }
    }
}

/// The name of the readiness check that the replica holds the whole cluster.
pub const METRIC_STORAGE_COMPLETE: &str = "metric-storage-complete";
/// How long every expected node must have been served before readiness passes: the first
/// rates of its pods (a second sample) arrive within one resolution after the node's.
pub const COMPLETENESS_WARMUP: Duration = Duration::from_secs(3);
/// Longest wait for completeness after start: then the replica is ready with what it has
/// (a node whose agent is Ready but cannot reach this replica must not keep it out for
/// ever), and says which nodes are missing.
pub const COMPLETENESS_MAX_WAIT: Duration = Duration::from_secs(60);

/// Readiness that means complete: every node that runs a Ready agent (the agent pods'
/// watch, [`crate::agents`]) and exists (the Node watch, [`crate::nodes`]) has a node rate
/// in the store, and has had one for [`COMPLETENESS_WARMUP`]; or [`COMPLETENESS_MAX_WAIT`]
/// has passed since the replica started; or the API refuses one of the two lists for a
/// reason retrying does not fix (RBAC, no such resource: then nothing says which nodes
/// should report, and only `metric-storage-ready` decides). Once passed it stays passed (a node that comes or
/// goes later is the store's business, not a reason to leave the Service). Liveness does
/// not depend on it.
pub struct Completeness {
    nodes: Arc<crate::nodes::ClusterNodes>,
    agents: Arc<crate::agents::AgentPods>,
    /// Whether the store serves a rate for this node.
    served: Box<dyn Fn(&str) -> bool + Send + Sync>,
    started: Instant,
    state: parking_lot::Mutex<CompletenessState>,
}

#[derive(Debug, Default)]
struct CompletenessState {
    /// Since when every expected node has been served.
    complete_since: Option<Instant>,
    passed: bool,
}

impl Completeness {
    /// A check started now.
    pub fn new(
        nodes: Arc<crate::nodes::ClusterNodes>,
        agents: Arc<crate::agents::AgentPods>,
        served: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Completeness {
        Self::started_at(nodes, agents, served, Instant::now())
    }

    /// A check started at `started` (tests).
    pub fn started_at(
        nodes: Arc<crate::nodes::ClusterNodes>,
        agents: Arc<crate::agents::AgentPods>,
        served: impl Fn(&str) -> bool + Send + Sync + 'static,
        started: Instant,
    ) -> Completeness {
        Completeness {
            nodes,
            agents,
            served: Box::new(served),
            started,
            state: parking_lot::Mutex::new(CompletenessState::default()),
        }
    }

    /// The check at `now`.
    pub fn check_at(&self, now: Instant) -> Result<(), String> {
        let mut state = self.state.lock();
        if state.passed {
            return Ok(());
        }
        let waited = now.saturating_duration_since(self.started);
        let missing = self.missing();
        match &missing {
            Ok(m) if m.is_empty() => {
                let since = *state.complete_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= COMPLETENESS_WARMUP {
                    state.passed = true;
                    tracing::info!(
                        waited = %humantime::format_duration(round_ms(waited)),
                        "every node with a Ready agent is served: ready"
                    );
                    return Ok(());
                }
            }
            _ => state.complete_since = None,
        }
        if waited >= COMPLETENESS_MAX_WAIT {
            state.passed = true;
            match &missing {
                Ok(m) => tracing::warn!(
                    missing = m.len(),
                    first = ?m.iter().take(5).collect::<Vec<_>>(),
                    "ready after {}s without every node that runs a Ready agent: those agents \
                     do not reach this replica",
                    COMPLETENESS_MAX_WAIT.as_secs()
                ),
                Err(why) => tracing::warn!(
                    reason = %why,
                    "ready after {}s without knowing which nodes should report",
                    COMPLETENESS_MAX_WAIT.as_secs()
                ),
            }
            return Ok(());
        }
        match missing {
            Ok(m) if m.is_empty() => {
                Err("every node with a Ready agent is served; warming up".into())
            }
            Ok(m) => Err(format!(
                "{} node(s) with a Ready agent not served yet, e.g. {}",
                m.len(),
                m.first().map(String::as_str).unwrap_or_default()
            )),
            Err(why) => Err(why),
        }
    }

    /// The expected nodes without a rate, or why they are not known yet.
    fn missing(&self) -> Result<Vec<String>, String> {
        if self.nodes.refused() || self.agents.refused() {
            // Which nodes should report cannot be known: do not wait for them.
            return Ok(Vec::new());
        }
        if !self.nodes.listed() {
            return Err("waiting for the list of Nodes".into());
        }
        if !self.agents.listed() {
            return Err("waiting for the list of agent pods".into());
        }
        Ok(self
            .agents
            .ready_nodes()
            .into_iter()
            .filter(|n| self.nodes.contains(n) && !(self.served)(n))
            .collect())
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Check for Completeness {
    fn name(&self) -> &str {
        METRIC_STORAGE_COMPLETE
    }
    fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(ready: bool) -> Vec<Arc<dyn Check>> {
        vec![
            ping(),
            FnCheck::arc("metric-storage-ready", move || {
                if ready {
                    Ok(())
                } else {
                    Err("no metrics to serve".into())
                }
            }),
        ]
    }

    #[test]
    fn passing() {
        assert_eq!(
            evaluate("readyz", &checks(true), None, ""),
            Answer {
                status: 200,
                body: "ok".into()
            }
        );
        assert_eq!(
            evaluate("readyz", &checks(true), None, "verbose").body,
            "[+]ping ok\n[+]metric-storage-ready ok\nreadyz check passed\n"
        );
    }

    #[test]
    fn failing_lists_every_check_and_withholds_reasons() {
        let a = evaluate("readyz", &checks(false), None, "");
        assert_eq!(a.status, 500);
        assert_eq!(
            a.body,
            "[+]ping ok\n[-]metric-storage-ready failed: reason withheld\nreadyz check failed\n"
        );
        assert!(!a.body.contains("no metrics"));
    }

    #[test]
    fn maintenance_runs_every_half_expiry_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(maintenance_schedule(s(10)), (s(5), s(15)));
        assert_eq!(maintenance_schedule(s(4)), (s(2), s(10)));
        assert_eq!(maintenance_schedule(s(600)), (s(5), s(15)));
        assert_eq!(
            maintenance_schedule(Duration::from_millis(1)),
            (Duration::from_millis(100), s(10))
        );
    }

    #[test]
    fn heartbeat_fails_once_the_last_beat_is_too_old() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let hb = Heartbeat::started_at(
            METRIC_COLLECTION_TIMELY,
            "the store's maintenance loop",
            Duration::from_secs(15),
            t0,
        );
        assert_eq!(hb.check_at(t0), Ok(()), "creation counts as a beat");
        assert_eq!(hb.check_at(at(15)), Ok(()));
        assert_eq!(
            hb.check_at(at(16)),
            Err("the store's maintenance loop last ran 16s ago (limit 15s)".into())
        );
        hb.beat_at(at(80));
        assert_eq!(hb.check_at(at(90)), Ok(()));
        hb.beat_at(at(20)); // late report of an older pass: ignored
        assert_eq!(
            hb.check_at(at(173)),
            Err("the store's maintenance loop last ran 93s ago (limit 15s)".into())
        );
        // As an endpoint check (on the real clock): the verbose listing names it, the
        // reason stays in the log.
        let stale = Heartbeat::new(
            METRIC_COLLECTION_TIMELY,
            "the loop",
            Duration::from_millis(1),
        );
        std::thread::sleep(Duration::from_millis(5));
        let checks: Vec<Arc<dyn Check>> = vec![ping(), Arc::new(stale)];
        let a = evaluate("livez", &checks, None, "verbose");
        assert_eq!(a.status, 500);
        assert_eq!(
            a.body,
            "[+]ping ok\n[-]metric-collection-timely failed: reason withheld\nlivez check failed\n"
        );
        let fresh: Vec<Arc<dyn Check>> = vec![
            ping(),
            Arc::new(Heartbeat::new(
                METRIC_COLLECTION_TIMELY,
                "the loop",
                Duration::from_secs(15),
            )),
        ];
        assert_eq!(
            evaluate("livez", &fresh, None, "verbose").body,
            "[+]ping ok\n[+]metric-collection-timely ok\nlivez check passed\n"
        );
    }

    #[test]
    fn exclude_and_single_checks() {
        let a = evaluate(
            "readyz",
            &checks(false),
            None,
            "exclude=metric-storage-ready&verbose",
        );
        assert_eq!(a.status, 200);
        assert!(
            a.body.contains("[+]metric-storage-ready excluded: ok\n"),
            "{}",
            a.body
        );
        assert_eq!(
            evaluate("readyz", &checks(true), Some("ping"), "").status,
            200
        );
        assert_eq!(
            evaluate("readyz", &checks(false), Some("metric-storage-ready"), "").status,
            500
        );
        assert_eq!(
            evaluate("readyz", &checks(true), Some("nope"), "").status,
            404
        );
    }

    mod completeness {
        use super::super::*;
        use crate::agents::AgentPods;
        use crate::nodes::ClusterNodes;
        use crate::watched::Change;
        use std::collections::{BTreeMap, BTreeSet};
        use std::sync::Mutex;

        struct Fixture {
            nodes: Arc<ClusterNodes>,
            agents: Arc<AgentPods>,
            served: Arc<Mutex<BTreeSet<String>>>,
            check: Completeness,
            t0: Instant,
        }

        fn fixture() -> Fixture {
            let nodes = ClusterNodes::new();
            let agents = AgentPods::new();
            let served = Arc::new(Mutex::new(BTreeSet::new()));
            let s = served.clone();
            let t0 = Instant::now();
            let check = Completeness::started_at(
                nodes.clone(),
                agents.clone(),
                move |n| s.lock().expect("lock").contains(n),
                t0,
            );
            Fixture {
                nodes,
                agents,
                served,
                check,
                t0,
            }
        }

        fn list(f: &Fixture, nodes: &[&str], agents: &[(&str, Option<&str>)]) {
            f.nodes.apply(Change::Replace(
                nodes
                    .iter()
                    .map(|n| ((*n).to_string(), Arc::new(BTreeMap::new())))
                    .collect(),
            ));
            f.agents.apply(Change::Replace(
                agents
                    .iter()
                    .map(|(p, n)| ((*p).to_string(), crate::agents::AgentPod::ready_on(*n)))
                    .collect(),
            ));
        }

        fn serve(f: &Fixture, node: &str) {
            f.served.lock().expect("lock").insert(node.to_string());
        }

        #[test]
        fn waits_for_every_node_with_a_ready_agent_then_warms_up() {
            let f = fixture();
            let at = |s: u64| f.t0 + Duration::from_secs(s);
            let err = f.check.check_at(at(0)).expect_err("nothing listed");
            assert!(err.contains("list of Nodes"), "{err}");
            // n3 has an agent that is not Ready, n4 an agent but no Node object, "gone":
            // neither is waited for.
            list(
                &f,
                &["n1", "n2", "n3"],
                &[
                    ("a1", Some("n1")),
                    ("a2", Some("n2")),
                    ("a3", None),
                    ("a4", Some("n4")),
                ],
            );
            serve(&f, "n1");
            let err = f.check.check_at(at(1)).expect_err("n2 missing");
            assert!(err.contains("1 node(s)") && err.contains("n2"), "{err}");
            serve(&f, "n2");
            let err = f.check.check_at(at(2)).expect_err("warming up");
            assert!(err.contains("warming up"), "{err}");
            assert!(f.check.check_at(at(4)).is_err(), "2 s of the 3 s warm-up");
            assert!(f.check.check_at(at(5)).is_ok());
            // Passed stays passed.
            f.served.lock().expect("lock").clear();
            assert!(f.check.check_at(at(6)).is_ok());
        }

        #[test]
        fn a_node_that_stops_being_served_restarts_the_warm_up() {
            let f = fixture();
            let at = |s: u64| f.t0 + Duration::from_secs(s);
            list(&f, &["n1"], &[("a1", Some("n1"))]);
            serve(&f, "n1");
            assert!(f.check.check_at(at(1)).is_err());
            f.served.lock().expect("lock").clear();
            assert!(f.check.check_at(at(3)).is_err());
            serve(&f, "n1");
            assert!(
                f.check.check_at(at(4)).is_err(),
                "warm-up starts again at 4 s"
            );
            assert!(f.check.check_at(at(7)).is_ok());
        }

        #[test]
        fn ready_after_the_longest_wait_with_what_it_has() {
            let f = fixture();
            list(&f, &["n1", "n2"], &[("a1", Some("n1")), ("a2", Some("n2"))]);
            serve(&f, "n1");
            assert!(f
                .check
                .check_at(f.t0 + COMPLETENESS_MAX_WAIT - Duration::from_millis(1))
                .is_err());
            assert!(f.check.check_at(f.t0 + COMPLETENESS_MAX_WAIT).is_ok());
        }

        #[test]
        fn a_refused_list_stops_the_wait() {
            let f = fixture();
            // Nothing listed, the agent pods forbidden: nothing says which nodes should
            // report, so only the warm-up is left.
            f.agents.set_refused(true);
            assert!(f.check.check_at(f.t0).is_err());
            assert!(f.check.check_at(f.t0 + COMPLETENESS_WARMUP).is_ok());
        }

        #[test]
        fn no_agents_expected_is_complete_after_the_warm_up() {
            let f = fixture();
            list(&f, &["n1"], &[]);
            assert!(f.check.check_at(f.t0).is_err());
            assert!(f.check.check_at(f.t0 + COMPLETENESS_WARMUP).is_ok());
        }
    }
}
