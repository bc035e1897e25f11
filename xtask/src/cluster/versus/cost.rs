//! What each system costs on the node, and what each does when the node is saturated.
//!
//! **Cost.** The node is filled with idle pods (a Deployment of `sleep`), then phases of
//! equal length alternate: metrics-server scaled to 0, then to 1 (its default 15 s
//! resolution), twice. CPU is each cgroup's counter over the phase: the kpulse pods'
//! (agent, every aggregator-api replica), metrics-server's pod, and the kubelet's and
//! containerd's own cgroups (`kpulse-cluster/<name>` on cgroup v2). What metrics-server
//! makes the kubelet and containerd spend is measured directly: 100 scrapes of the kubelet's
//! `/metrics/resource` back to back, less the same time at rest, per scrape, at one scrape
//! per 15 s (the difference between phases with and without metrics-server is printed too,
//! but the kubelet's own work varies more than that between phases). Memory is each pod's
//! working set at the end of the phase. Then the agent runs at `--resolution=100ms` for one
//! phase (metrics-server at 0), and back to 1 s.
//!
//! **Under load.** Phases before, during and after every CPU is saturated by best-effort
//! pods (two spinning shells per CPU, no requests or limits): both APIs are read every
//! 100 ms as the HPA's identity; the data age of each answer (arrival − served timestamp,
//! an upper bound since timestamps are whole seconds) and every failed read are counted,
//! with metrics-server's own scrape counters (`metrics_server_kubelet_request_*`).

use std::{
    fmt::Write as _,
    fs,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{
    api::{prometheus_samples, Api, Source},
    freshness::pod,
    percentile, truth, Bench, Poller, NAMESPACE,
};
use crate::cluster::host;

/// CPU and memory of one thing over a phase.
#[derive(Clone, Copy, Debug, Default)]
struct Use {
    cores: f64,
    memory: f64,
}

/// Something whose CPU is measured: cgroup counter files, and how to read its memory.
struct Meter {
    name: String,
    cpu: Box<dyn Fn() -> Result<u64>>,
    memory: Box<dyn Fn() -> Result<u64>>,
}

/// The pods matching `selector` in `namespace`, as pod-level cgroups.
fn pod_meters(bench: &Bench, namespace: &str, selector: &str, name: &str) -> Result<Vec<Meter>> {
    let pods = bench.json(&["get", "pods", "-n", namespace, "-l", selector])?;
    let mut out = Vec::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        let pod = p["metadata"]["name"]
            .as_str()
            .context("pod without a name")?;
        let files = bench
            .container_cgroup(namespace, pod)?
            .pod_level()
            .context("no pod-level cgroup")?;
        let (f1, f2) = (files.clone(), files);
        out.push(Meter {
            name: name.to_string(),
            cpu: Box::new(move || f1.cpu_ns()),
            memory: Box::new(move || f2.working_set()),
        });
    }
    ensure!(
        !out.is_empty(),
        "no running pod for {name} ({namespace}, {selector})"
    );
    Ok(out)
}

/// A process the cluster started: its cgroup v2 CPU and the main process's RSS.
fn daemon_meter(bench: &Bench, name: &str) -> Result<Meter> {
    let dir = host::cgroup2_root()?.join(host::CGROUP).join(name);
    let pid: u32 = fs::read_to_string(bench.dirs.state.join(format!("{name}.pid")))?
        .trim()
        .parse()
        .with_context(|| format!("{name}.pid"))?;
    let stat: PathBuf = dir.join("cpu.stat");
    Ok(Meter {
        name: name.to_string(),
        cpu: Box::new(move || {
            let text = fs::read_to_string(&stat)?;
            text.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000)
                .context("cpu.stat without usage_usec")
        }),
        memory: Box::new(move || {
            let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
                .context("no VmRSS")
        }),
    })
}

/// Each meter's use over `phase` (CPU), memory at its end; meters with the same name summed.
fn measure(meters: &[Meter], phase: Duration) -> Result<Vec<(String, Use)>> {
    let before: Vec<u64> = meters.iter().map(|m| (m.cpu)()).collect::<Result<_>>()?;
    let t = Instant::now();
    thread::sleep(phase);
    let after: Vec<u64> = meters.iter().map(|m| (m.cpu)()).collect::<Result<_>>()?;
    let secs = t.elapsed().as_secs_f64();
    let mut out: Vec<(String, Use)> = Vec::new();
    for (i, m) in meters.iter().enumerate() {
        let u = Use {
            cores: after[i].saturating_sub(before[i]) as f64 / 1e9 / secs,
            memory: (m.memory)()? as f64,
        };
        match out.iter_mut().find(|(n, _)| *n == m.name) {
            Some((_, sum)) => {
                sum.cores += u.cores;
                sum.memory += u.memory;
            }
            None => out.push((m.name.clone(), u)),
        }
    }
    Ok(out)
}

fn get(uses: &[(String, Use)], name: &str) -> Use {
    uses.iter()
        .find(|(n, _)| n == name)
        .map_or(Use::default(), |(_, u)| *u)
}

fn scale_metrics_server(bench: &Bench, replicas: u32) -> Result<()> {
    crate::exec::output(bench.kubectl().args([
        "scale",
        "deployment",
        "-n",
        "kube-system",
        "metrics-server",
        &format!("--replicas={replicas}"),
    ]))?;
    let t = Instant::now();
    loop {
        let v = bench.json(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "k8s-app=metrics-server",
        ])?;
        let pods = v["items"].as_array().cloned().unwrap_or_default();
        let ready = pods
            .iter()
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count();
        if pods.len() == replicas as usize && ready == replicas as usize {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(180),
            "metrics-server did not reach {replicas} ready replicas in 180 s"
        );
        thread::sleep(Duration::from_secs(1));
    }
}

fn set_agent_resolution(bench: &Bench, resolution: &str) -> Result<()> {
    let ds = bench.json(&["get", "daemonset", "-n", "kpulse-system", "kpulse-agent"])?;
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("the agent has no args")?;
    let i = args
        .iter()
        .position(|a| a.as_str().is_some_and(|a| a.starts_with("--resolution=")))
        .context("the agent has no --resolution")?;
    let patch = format!(
        r#"[{{"op":"replace","path":"/spec/template/spec/containers/0/args/{i}","value":"--resolution={resolution}"}}]"#
    );
    crate::exec::output(bench.kubectl().args([
        "patch",
        "daemonset",
        "-n",
        "kpulse-system",
        "kpulse-agent",
        "--type=json",
        "-p",
        &patch,
    ]))?;
    crate::exec::output(bench.kubectl().args([
        "rollout",
        "status",
        "daemonset",
        "-n",
        "kpulse-system",
        "kpulse-agent",
        "--timeout=180s",
    ]))?;
    Ok(())
}

/// The meters of kpulse's pods, metrics-server's (if running), the kubelet and containerd.
fn meters(bench: &Bench, with_metrics_server: bool) -> Result<Vec<Meter>> {
    let mut m = pod_meters(
        bench,
        "kpulse-system",
        "app.kubernetes.io/name=kpulse-agent",
        "kpulse agent",
    )?;
    m.extend(pod_meters(
        bench,
        "kpulse-system",
        "app.kubernetes.io/name=kpulse-aggregator-api",
        "kpulse aggregator-api",
    )?);
    if with_metrics_server {
        m.extend(pod_meters(
            bench,
            "kube-system",
            "k8s-app=metrics-server",
            "metrics-server",
        )?);
    }
    m.push(daemon_meter(bench, "kubelet")?);
    m.push(daemon_meter(bench, "containerd")?);
    Ok(m)
}

/// What one scrape of the kubelet's `/metrics/resource` (what metrics-server reads) costs the
/// kubelet and containerd, in CPU seconds: `n` scrapes back to back by the benchmark (with
/// the API server's kubelet client certificate), minus what both spent at rest at the same
/// rate just before. Returns `(kubelet, containerd, mean scrape duration)`.
fn scrape_cost(bench: &Bench, n: usize) -> Result<(f64, f64, f64)> {
    let meters = [
        daemon_meter(bench, "kubelet")?,
        daemon_meter(bench, "containerd")?,
    ];
    let read = || -> Result<Vec<u64>> { meters.iter().map(|m| (m.cpu)()).collect() };
    let rest = Duration::from_secs(30);
    let r0 = read()?;
    thread::sleep(rest);
    let r1 = read()?;
    let t = Instant::now();
    for _ in 0..n {
        crate::exec::output(
            std::process::Command::new("curl")
                .args(["-sSk", "--fail", "--max-time", "10", "-o", "/dev/null"])
                .arg("--cert")
                .arg(bench.dirs.pki.join("apiserver-kubelet-client.crt"))
                .arg("--key")
                .arg(bench.dirs.pki.join("apiserver-kubelet-client.key"))
                .arg(format!("https://{}:10250/metrics/resource", host::NODE_IP)),
        )?;
    }
    let busy = t.elapsed().as_secs_f64();
    let r2 = read()?;
    let per = |i: usize| {
        let at_rest = (r1[i] - r0[i]) as f64 / 1e9 / rest.as_secs_f64();
        ((r2[i] - r1[i]) as f64 / 1e9 - at_rest * busy) / n as f64
    };
    Ok((per(0), per(1), busy / n as f64))
}

/// The idle pods the cost part puts on the node.
#[derive(Clone, Copy, Debug)]
pub struct Filler {
    /// Pods.
    pub pods: usize,
    /// Containers in each.
    pub containers: usize,
}

pub fn run(bench: &mut Bench, filler: Filler, phase: Duration, rounds: usize) -> Result<()> {
    let Filler { pods, containers } = filler;
    anyhow::ensure!(containers > 0, "--cost-containers must be positive");
    let container = |i: usize| {
        format!(
            r#"{{"name":"c{i}","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do sleep 1; done"],
"resources":{{"requests":{{"cpu":"1m","memory":"4Mi"}}}}}}"#,
            image = crate::cluster::images::BUSYBOX_IMAGE
        )
    };
    let list: Vec<String> = (0..containers).map(container).collect();
    let filler = format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"filler","namespace":"{NAMESPACE}"}},
"spec":{{"replicas":{pods},"selector":{{"matchLabels":{{"app":"filler"}}}},
"template":{{"metadata":{{"labels":{{"app":"filler","kpulse.dev/bench":"versus"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{}]}}}}}}}}"#,
        list.join(",")
    );
    bench.apply("filler", &filler)?;
    let t = Instant::now();
    bench.rollout("filler", Duration::from_secs(900))?;
    let on_node = bench.json(&["get", "pods", "-A", "--field-selector=status.phase=Running"])?
        ["items"]
        .as_array()
        .map_or(0, |a| a.len());
    println!(
        "versus: {pods} filler pods ready after {:.0} s; {on_node} pods running on the node",
        t.elapsed().as_secs_f64()
    );
    // Settle after the burst of pod starts.
    thread::sleep(Duration::from_secs(30));
    let mut off = Vec::new();
    let mut on = Vec::new();
    for round in 0..rounds {
        scale_metrics_server(bench, 0)?;
        // Its last scrape's work on the node is over.
        thread::sleep(Duration::from_secs(10));
        off.push(measure(&meters(bench, false)?, phase)?);
        scale_metrics_server(bench, 1)?;
        // Its first scrapes, then steady state.
        thread::sleep(Duration::from_secs(20));
        on.push(measure(&meters(bench, true)?, phase)?);
        println!("versus: cost round {} of {rounds} measured", round + 1);
    }
    scale_metrics_server(bench, 0)?;
    let scrapes = 100;
    let (kubelet_scrape, containerd_scrape, scrape_time) = scrape_cost(bench, scrapes)?;
    set_agent_resolution(bench, "100ms")?;
    // The new agent's start-up (eBPF load, first pod list) is not part of its steady cost.
    thread::sleep(Duration::from_secs(15));
    let fast = measure(&meters(bench, false)?, phase);
    set_agent_resolution(bench, "1s")?;
    scale_metrics_server(bench, 1)?;
    let fast = fast?;

    let mean = |sets: &[Vec<(String, Use)>], name: &str| {
        let n = sets.len().max(1) as f64;
        sets.iter().fold(Use::default(), |a, s| {
            let u = get(s, name);
            Use {
                cores: a.cores + u.cores / n,
                memory: a.memory + u.memory / n,
            }
        })
    };
    let all: Vec<Vec<(String, Use)>> = off.iter().chain(on.iter()).cloned().collect();
    let agent = mean(&all, "kpulse agent");
    let aggr = mean(&all, "kpulse aggregator-api");
    let ms = mean(&on, "metrics-server");
    let kubelet_on = mean(&on, "kubelet");
    let kubelet_off = mean(&off, "kubelet");
    let ctrd_on = mean(&on, "containerd");
    let ctrd_off = mean(&off, "containerd");
    let fast_agent = get(&fast, "kpulse agent");
    let fast_aggr = get(&fast, "kpulse aggregator-api");

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Cost on a node with {on_node} running pods ({pods} idle filler pods of {containers} container(s))\n\n\
         CPU in cores (cgroup counters over {} s phases; metrics-server off/on alternated {rounds} \
         times, kpulse measured in all of them), memory = working set at the phase's end (the kubelet's \
         and containerd's: the main process's RSS).\n",
        phase.as_secs()
    );
    let _ = writeln!(out, "| | CPU (cores) | memory (MiB) |\n|---|---|---|");
    let mib = |b: f64| b / 1048576.0;
    let mut row = |name: &str, u: Use| {
        let memory = if u.memory.is_nan() {
            "–".to_string()
        } else {
            format!("{:.1}", mib(u.memory))
        };
        let _ = writeln!(out, "| {name} | {:.4} | {memory} |", u.cores);
    };
    row("kpulse agent, `--resolution=1s`", agent);
    row("kpulse aggregator-api (all replicas), 1 s", aggr);
    row(
        "**kpulse at 1 s**",
        Use {
            cores: agent.cores + aggr.cores,
            memory: agent.memory + aggr.memory,
        },
    );
    row("kpulse agent, `--resolution=100ms`", fast_agent);
    row("kpulse aggregator-api (all replicas), 100 ms", fast_aggr);
    row(
        "**kpulse at 100 ms**",
        Use {
            cores: fast_agent.cores + fast_aggr.cores,
            memory: fast_agent.memory + fast_aggr.memory,
        },
    );
    row("metrics-server, `--metric-resolution=15s`", ms);
    let per_scrape = kubelet_scrape + containerd_scrape;
    row(
        "kubelet + containerd serving its scrapes (per scrape ÷ 15 s, below)",
        Use {
            cores: per_scrape / 15.0,
            memory: f64::NAN,
        },
    );
    row(
        "**metrics-server + the scrapes it makes the node serve**",
        Use {
            cores: ms.cores + per_scrape / 15.0,
            memory: ms.memory,
        },
    );
    let _ = writeln!(
        out,
        "\nOne `/metrics/resource` scrape of this node ({scrapes} back to back, less the same \
         time at rest) costs the kubelet **{:.1} ms** and containerd **{:.1} ms** of CPU and \
         takes {:.0} ms; metrics-server makes one every 15 s.\n\n\
         Measured the other way, running minus not running over whole phases (noisier: the \
         kubelet's own work moves by more than a scrape costs between phases): kubelet \
         {:+.4} cores (rounds {}), containerd {:+.4} cores (rounds {}).\n",
        kubelet_scrape * 1e3,
        containerd_scrape * 1e3,
        scrape_time * 1e3,
        kubelet_on.cores - kubelet_off.cores,
        rounds_text(&off, &on, "kubelet"),
        ctrd_on.cores - ctrd_off.cores,
        rounds_text(&off, &on, "containerd"),
    );
    bench.section(&out);
    Ok(())
}

/// `off → on` per round, for one meter.
fn rounds_text(off: &[Vec<(String, Use)>], on: &[Vec<(String, Use)>], name: &str) -> String {
    off.iter()
        .zip(on)
        .map(|(a, b)| format!("{:.4} → {:.4}", get(a, name).cores, get(b, name).cores))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sums of metrics-server's scrape counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct Scrapes {
    ok: f64,
    failed: f64,
    duration_sum: f64,
    duration_count: f64,
    over_1s: f64,
}

async fn scrapes(api: &Api) -> Result<Scrapes> {
    let text = api.get("/metrics").await?;
    let sum = |name: &str, filter: &dyn Fn(&str) -> bool| {
        prometheus_samples(&text, name)
            .into_iter()
            .filter(|(l, _)| filter(l))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let count = sum(
        "metrics_server_kubelet_request_duration_seconds_count",
        &|_| true,
    );
    let le_1 = sum(
        "metrics_server_kubelet_request_duration_seconds_bucket",
        &|l| l.contains("le=\"1\""),
    );
    Ok(Scrapes {
        ok: sum("metrics_server_kubelet_request_total", &|l| {
            l.contains("success=\"true\"")
        }),
        failed: sum("metrics_server_kubelet_request_total", &|l| {
            l.contains("success=\"false\"")
        }),
        duration_sum: sum(
            "metrics_server_kubelet_request_duration_seconds_sum",
            &|_| true,
        ),
        duration_count: count,
        over_1s: count - le_1,
    })
}

pub fn under_load(bench: &mut Bench, rt: &tokio::runtime::Runtime, phase: Duration) -> Result<()> {
    let cpus = thread::available_parallelism().map_or(2, |n| n.get());
    bench.apply(
        "probe",
        &pod(
            "probe",
            "100m",
            "16Mi",
            "trap 'exit 0' TERM; while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.05; done",
            "",
        ),
    )?;
    bench.wait_ready(NAMESPACE, "app=probe", Duration::from_secs(120))?;
    let admin = rt.block_on(async {
        Api::metrics_server_as(
            &bench.apis[1].host(),
            &bench.dirs.pki.join("front-proxy-client.crt"),
            &bench.dirs.pki.join("front-proxy-client.key"),
            "kpulse-bench",
            &["system:masters", "system:authenticated"],
        )
    })?;
    let poller = Poller::start(rt, &bench.apis, "app=probe", Duration::from_millis(100));
    // Until metrics-server has scraped the new probe pod twice (its first window).
    thread::sleep(Duration::from_secs(20));
    let mut marks = vec![(truth::now_ns(), rt.block_on(scrapes(&admin))?)];
    thread::sleep(phase);
    marks.push((truth::now_ns(), rt.block_on(scrapes(&admin))?));
    let hog = format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"hog","namespace":"{NAMESPACE}"}},
"spec":{{"replicas":{cpus},"selector":{{"matchLabels":{{"app":"hog"}}}},
"template":{{"metadata":{{"labels":{{"app":"hog"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"main","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; (while :; do :; done) & while :; do :; done"]}}]}}}}}}}}"#,
        image = crate::cluster::images::BUSYBOX_IMAGE
    );
    bench.apply("hog", &hog)?;
    bench.rollout("hog", Duration::from_secs(300))?;
    marks.push((truth::now_ns(), rt.block_on(scrapes(&admin))?));
    thread::sleep(phase);
    marks.push((truth::now_ns(), rt.block_on(scrapes(&admin))?));
    crate::exec::output(bench.kubectl().args([
        "delete",
        "deployment",
        "-n",
        NAMESPACE,
        "hog",
        "--wait=true",
        "--timeout=120s",
    ]))?;
    marks.push((truth::now_ns(), rt.block_on(scrapes(&admin))?));
    thread::sleep(phase);
    marks.push((truth::now_ns(), rt.block_on(scrapes(&admin))?));
    let seen = poller.seen.clone();
    drop(poller);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Under load: {cpus} CPUs saturated by {cpus} best-effort pods (2 spinning shells each)\n\n\
         Both APIs read every 100 ms as the HPA's identity for one pod (`probe`). Age = arrival \
         − served timestamp (whole seconds, so up to 1 s more than the true age); the oldest \
         data in an answer is that age plus its window. Scrapes: metrics-server's \
         `metrics_server_kubelet_request_*` over the phase ({} s each).\n",
        phase.as_secs()
    );
    let _ = writeln!(
        out,
        "| phase | source | answers | failed | age p50 | p95 | max | window start's age p95 | scrapes ok / failed | scrape mean | scrapes > 1 s |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let phases = [("before", 0, 1), ("saturated", 2, 3), ("after", 4, 5)];
    for (name, a, b) in phases {
        let (from, s0) = marks[a];
        let (to, s1) = marks[b];
        for source in Source::ALL {
            let obs: Vec<_> = seen
                .of(source)
                .into_iter()
                .filter(|o| o.at >= from && o.at <= to)
                .collect();
            let failed = obs.iter().filter(|o| o.points.is_err()).count();
            let served: Vec<(f64, f64)> = obs
                .iter()
                .filter_map(|o| {
                    let p = o.points.as_ref().ok()?.iter().find(|p| p.pod == "probe")?;
                    let age = (o.at - i128::from(p.timestamp) * 1_000_000_000) as f64 / 1e9;
                    Some((age, age + p.window.as_secs_f64()))
                })
                .collect();
            let mut ages: Vec<f64> = served.iter().map(|a| a.0).collect();
            let mut oldest: Vec<f64> = served.iter().map(|a| a.1).collect();
            let scrape = if source == Source::MetricsServer {
                let n = s1.duration_count - s0.duration_count;
                format!(
                    "{:.0} / {:.0} | {:.3} s | {:.0}",
                    s1.ok - s0.ok,
                    s1.failed - s0.failed,
                    if n > 0.0 {
                        (s1.duration_sum - s0.duration_sum) / n
                    } else {
                        f64::NAN
                    },
                    s1.over_1s - s0.over_1s
                )
            } else {
                "– | – | –".to_string()
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {failed} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {scrape} |",
                source.name(),
                obs.len(),
                percentile(&mut ages, 0.5),
                percentile(&mut ages, 0.95),
                percentile(&mut ages, 1.0),
                percentile(&mut oldest, 0.95),
            );
        }
    }
    bench.section(&out);
    Ok(())
}
