//! The served window, decided by measurement: the HPA's reaction to a load step and its
//! replica flapping on a bursty workload, with kpulse serving each `--metric-window` in
//! turn (fixed, or adaptive: [`WindowSpec`]) and with metrics-server, in one run.
//!
//! - **Reaction**: the load-step trials of [`super::hpa`] (Deployment `web`), at the
//!   controller-manager's default 15 s sync.
//! - **Flapping**: Deployment `bursty` (request 100m, limit 200m) whose every pod, each
//!   second, spins for one second at its limit with probability 1/6 and otherwise sleeps:
//!   a mean of 33 % of its request, below the HPA's 50 % target and outside its 10 %
//!   tolerance, so an HPA that saw the mean would never scale it. Its HPA is the one of
//!   `web` (50 %, 1–4 replicas, scale-up stabilisation as `--scale-up-stabilization` says,
//!   none by default, scale-down stabilisation 30 s). Over
//!   each phase the benchmark counts the HPA's rescales, the highest replica count and the
//!   replica-seconds above one, and samples the utilisation the HPA reports every second.
//!   The first `bursty` pod's cgroup counter gives the workload's true mean.
//!
//! kpulse's window is switched with `kubectl set env` of `KPULSE_METRIC_WINDOW` and
//! `KPULSE_METRIC_WINDOW_MODE` on the aggregator-api (a rollout), and removed again at the
//! end, whatever happens; the `v1beta1.metrics.k8s.io` APIService is pointed at the source
//! under test as in [`super::hpa`].

use std::{
    fmt::Write as _,
    fs, thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{api::Source, hpa, joined, percentile, Bench, NAMESPACE};

const WINDOW_ENV: &str = "KPULSE_METRIC_WINDOW";
const WINDOW_MODE_ENV: &str = "KPULSE_METRIC_WINDOW_MODE";

/// One kpulse window under test: `15s` (`--metric-window=15s`, fixed) or `adaptive:45s`
/// (`--metric-window=45s --metric-window-mode=adaptive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    window: Duration,
    adaptive: bool,
}

impl std::str::FromStr for WindowSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<WindowSpec, String> {
        let (adaptive, w) = match s.strip_prefix("adaptive:") {
            Some(w) => (true, w),
            None => (false, s),
        };
        let window = humantime::parse_duration(w).map_err(|e| format!("{s}: {e}"))?;
        if adaptive && window.is_zero() {
            return Err(format!("{s}: an adaptive window must be positive"));
        }
        Ok(WindowSpec { window, adaptive })
    }
}

impl std::fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = humantime::format_duration(self.window);
        if self.adaptive {
            write!(f, "adaptive, up to {w}")
        } else {
            write!(f, "{w}")
        }
    }
}

/// Each second: spin for one second (`sleep 1` in the background, spinning until it ends)
/// with probability 1/6 while the flag file exists, else sleep.
const BURSTY_SCRIPT: &str = "trap 'exit 0' TERM; while :; do if [ -e /v/on ] && [ $((RANDOM % 6)) -eq 0 ]; then sleep 1 & p=$!; while kill -0 $p 2>/dev/null; do :; done; wait $p; else sleep 1; fi; done";

/// One configuration under test.
#[derive(Clone, Copy, Debug)]
struct Setting {
    source: Source,
    /// kpulse's `--metric-window` and mode.
    window: Option<WindowSpec>,
}

impl Setting {
    fn name(&self) -> String {
        match self.window {
            Some(w) => format!("kpulse, window {w}"),
            None => format!("{} (15 s resolution)", self.source.name()),
        }
    }
}

/// What one or more bursty phases saw.
#[derive(Debug, Default)]
struct Flapping {
    rescales: usize,
    max_replicas: i64,
    /// ∫ (replicas − 1) dt over the phases, in seconds.
    extra_replica_seconds: f64,
    /// The utilisation the HPA reported, sampled every second (%).
    seen: Vec<f64>,
    /// The first pod's true mean over each phase, in % of its request.
    true_means: Vec<f64>,
    /// Total time of the phases.
    phase: Duration,
    /// Rescales of each phase.
    per_phase: Vec<usize>,
}

impl Flapping {
    fn add(&mut self, other: Flapping) {
        self.rescales += other.rescales;
        self.max_replicas = self.max_replicas.max(other.max_replicas);
        self.extra_replica_seconds += other.extra_replica_seconds;
        self.seen.extend(other.seen);
        self.true_means.extend(other.true_means);
        self.phase += other.phase;
        self.per_phase.push(other.rescales);
    }
}

/// Sets kpulse's window on the aggregator-api (`None`: its default) and waits for the
/// rollout.
fn set_window(bench: &Bench, window: Option<WindowSpec>) -> Result<()> {
    let assignments = match window {
        Some(w) => [
            format!("{WINDOW_ENV}={}ms", w.window.as_millis()),
            format!(
                "{WINDOW_MODE_ENV}={}",
                if w.adaptive { "adaptive" } else { "fixed" }
            ),
        ],
        None => [format!("{WINDOW_ENV}-"), format!("{WINDOW_MODE_ENV}-")],
    };
    const DEPLOYMENT: &str = "deployment/kpulse-aggregator-api";
    let mut set = bench.kubectl();
    set.args(["-n", "kpulse-system", "set", "env", DEPLOYMENT])
        .args(&assignments);
    let mut rollout = bench.kubectl();
    rollout
        .args(["-n", "kpulse-system", "rollout", "status", DEPLOYMENT])
        .args(["--timeout=300s", "--request-timeout=0"]);
    for mut kubectl in [set, rollout] {
        crate::exec::output(&mut kubectl)?;
    }
    Ok(())
}

fn bursty_phase(bench: &Bench, flag: &std::path::Path, phase: Duration) -> Result<Flapping> {
    hpa::settle(bench, "bursty")?;
    let pods = bench.json(&["get", "pods", "-n", NAMESPACE, "-l", "app=bursty"])?;
    // The one running pod (a scaled-down one may still be terminating).
    let first = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .and_then(|p| p["metadata"]["name"].as_str())
        .context("no running bursty pod")?
        .to_string();
    let cgroup = bench.container_cgroup(NAMESPACE, &first)?;
    fs::write(flag, b"")?;
    let cpu0 = cgroup.cpu_ns()?;
    let on = Instant::now();
    let mut f = Flapping {
        max_replicas: 1,
        phase,
        ..Flapping::default()
    };
    let mut replicas = 1i64;
    let mut last = Instant::now();
    let result = (|| -> Result<()> {
        while on.elapsed() < phase {
            thread::sleep(Duration::from_secs(1).saturating_sub(last.elapsed()));
            let v = bench.json(&["get", "hpa", "bursty", "-n", NAMESPACE])?;
            let now = Instant::now();
            f.extra_replica_seconds += (replicas - 1) as f64 * (now - last).as_secs_f64();
            last = now;
            let current = v["status"]["currentReplicas"].as_i64().unwrap_or(replicas);
            let desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(current);
            // The HPA's decisions are its rescales: desiredReplicas changing.
            if desired != replicas {
                f.rescales += 1;
                replicas = desired;
                f.max_replicas = f.max_replicas.max(desired);
            }
            if let Some(u) = v["status"]["currentMetrics"][0]["resource"]["current"]
                ["averageUtilization"]
                .as_f64()
            {
                f.seen.push(u);
            }
        }
        Ok(())
    })();
    let elapsed = on.elapsed();
    let cpu1 = cgroup.cpu_ns();
    fs::remove_file(flag)?;
    result?;
    // The first pod's mean in % of its 100m request.
    f.true_means.extend(
        cpu1.ok()
            .map(|c| c.saturating_sub(cpu0) as f64 / elapsed.as_nanos() as f64 / 0.1 * 100.0),
    );
    Ok(f)
}

/// `rounds` bursty phases per setting, interleaved (every setting once, then again), so
/// that a drift of the machine or of the random workload falls on all of them; the step
/// trials run in the first round.
pub fn run(
    bench: &mut Bench,
    trials: usize,
    windows: &[WindowSpec],
    phase: Duration,
    rounds: usize,
    scale_up: Duration,
) -> Result<()> {
    let web_dir = bench.dirs.run.join("versus-hpa");
    let bursty_dir = bench.dirs.run.join("versus-bursty");
    for d in [&web_dir, &bursty_dir] {
        fs::create_dir_all(d)?;
        let _ = fs::remove_file(d.join("on"));
    }
    let original = bench.json(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
    ensure!(
        original["spec"]["service"]["namespace"] == "kpulse-system",
        "v1beta1.metrics.k8s.io does not point at kpulse"
    );
    bench.apply("hpa", &hpa::manifest(&web_dir, scale_up))?;
    bench.apply(
        "bursty",
        &hpa::workload("bursty", BURSTY_SCRIPT, &bursty_dir, scale_up),
    )?;
    bench.rollout("web", Duration::from_secs(120))?;
    bench.rollout("bursty", Duration::from_secs(120))?;

    let mut settings: Vec<Setting> = windows
        .iter()
        .map(|&w| Setting {
            source: Source::Kpulse,
            window: Some(w),
        })
        .collect();
    settings.push(Setting {
        source: Source::MetricsServer,
        window: None,
    });
    let mut results: Vec<(Setting, Vec<hpa::Trial>, Flapping)> = settings
        .iter()
        .map(|s| (*s, Vec::new(), Flapping::default()))
        .collect();
    let mut failure = None;
    'rounds: for round in 0..rounds.max(1) {
        for (setting, kept_trials, kept) in &mut results {
            let setting = &*setting;
            let r = (|| -> Result<(Vec<hpa::Trial>, Flapping)> {
                if let Some(w) = setting.window {
                    set_window(bench, Some(w))?;
                }
                hpa::point_apiservice(bench, setting.source, &original)?;
                let mut up = Vec::new();
                for i in 0..if round == 0 { trials } else { 0 } {
                    let t = hpa::trial(bench, &web_dir.join("on"), hpa::DEFAULT_SYNC)
                        .with_context(|| format!("{}: trial {}", setting.name(), i + 1))?;
                    println!(
                    "versus: window: {}: trial {}/{trials}: up after {:.1} s to {}, down after {:.1} s",
                    setting.name(),
                    i + 1,
                    t.up,
                    t.replicas,
                    t.down
                );
                    up.push(t);
                }
                let f = bursty_phase(bench, &bursty_dir.join("on"), phase)
                    .with_context(|| format!("{}: bursty phase", setting.name()))?;
                println!(
                "versus: window: {}: round {}: bursty for {:.0} s: {} rescales, up to {} replicas, {:.0} extra replica-seconds",
                setting.name(),
                round + 1,
                phase.as_secs_f64(),
                f.rescales,
                f.max_replicas,
                f.extra_replica_seconds
            );
                Ok((up, f))
            })();
            for d in [&web_dir, &bursty_dir] {
                let _ = fs::remove_file(d.join("on"));
            }
            match r {
                Ok((up, f)) => {
                    kept_trials.extend(up);
                    kept.add(f);
                }
                Err(e) => {
                    failure = Some(e);
                    break 'rounds;
                }
            }
        }
    }
    results.retain(|(_, _, f)| !f.per_phase.is_empty());
    // Whatever happened: kpulse at its default window, metrics.k8s.io back on kpulse.
    set_window(bench, None).context("restoring the aggregator-api's window")?;
    hpa::point_apiservice(bench, Source::Kpulse, &original)
        .context("pointing v1beta1.metrics.k8s.io back at kpulse")?;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The served window: HPA reaction and flapping ({trials} step trials, {rounds} × \
         {:.0} s bursty phases each, interleaved)\n\n\
         Step trials as in \"The HPA on each source\" (controller-manager's default 15 s \
         sync). Bursty: each pod spins for 1 s at its 200m limit with probability 1/6 every \
         second (mean 33 % of its 100m request; target 50 %, so the right answer is 1 \
         replica throughout); same HPA ({}). Rescales are changes of `desiredReplicas`; \
         utilisation is what the HPA reported, sampled every second.\n",
        phase.as_secs_f64(),
        hpa::describe_scale_up(scale_up)
    );
    let _ = writeln!(
        out,
        "| source | first scale-up p50 | max | every trial | bursty: rescales (per phase) | max replicas | extra replicas (mean) | HPA-seen utilisation p50 / p95 / max | true mean (first pod, per phase) |\n|---|---|---|---|---|---|---|---|---|"
    );
    for (setting, trials, f) in &mut results {
        let mut up: Vec<f64> = trials.iter().map(|t| t.up).collect();
        let every = joined(trials.iter(), |t| format!("{:.1}", t.up));
        // No step trials (`--hpa-trials 0`): no figures rather than NaN.
        let secs = |v: f64| {
            if v.is_nan() {
                "–".to_string()
            } else {
                format!("{v:.1} s")
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {every} | {} ({}) | {} | {:.2} | {:.0} / {:.0} / {:.0} % | {} |",
            setting.name(),
            secs(percentile(&mut up, 0.5)),
            secs(percentile(&mut up, 1.0)),
            f.rescales,
            joined(&f.per_phase, ToString::to_string),
            f.max_replicas,
            f.extra_replica_seconds / f.phase.as_secs_f64(),
            percentile(&mut f.seen, 0.5),
            percentile(&mut f.seen, 0.95),
            percentile(&mut f.seen, 1.0),
            joined(&f.true_means, |m| format!("{m:.0} %")),
        );
    }
    bench.section(&out);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_specs_are_fixed_or_adaptive() {
        let spec = |s: &str| s.parse::<WindowSpec>();
        assert_eq!(
            spec("15s"),
            Ok(WindowSpec {
                window: Duration::from_secs(15),
                adaptive: false
            })
        );
        let a = spec("adaptive:45s").expect("adaptive");
        assert!(a.adaptive);
        assert_eq!(a.window, Duration::from_secs(45));
        assert_eq!(a.to_string(), "adaptive, up to 45s");
        assert!(spec("adaptive:0s").is_err());
        assert!(spec("adaptive").is_err());
        assert!(spec("fast").is_err());
    }
}
