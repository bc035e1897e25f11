//! The aggregation layer's failure modes on the real cluster, as `cluster check` runs them
//! last (they restart kube-apiserver and take kpulse away):
//!
//! - **the front-proxy CA rotated**: kube-apiserver restarted with a new front-proxy CA and
//!   proxy client certificate. It adds the new CA to
//!   `kube-system/extension-apiserver-authentication` (keeping the old one there); every
//!   replica must take it from the ConfigMap without a restart. Then the rotation's last
//!   step: the ConfigMap deleted, kube-apiserver writes it anew with its own CA only, and
//!   every replica must stop trusting the old one. `kubectl top node` runs every 100 ms
//!   throughout: how long it fails after kube-apiserver is ready again is kpulse's share of
//!   the outage;
//! - **the client CA rotated**: kube-apiserver restarted with a client CA bundle holding a
//!   second CA; a client certificate of the new CA, presented straight to each replica, is
//!   refused before and accepted after, again without a restart;
//! - **every replica down**: what `kubectl top`, `kubectl api-resources`, the namespace
//!   controller and the garbage collector do while the APIService has no endpoints, then the
//!   time from the replicas' return to `Available=True` and to complete answers, and none
//!   incomplete after `Available=True`.
//!
//! What kube-apiserver and its controllers do is recorded, not judged: the checks fail only
//! on what kpulse controls (following a rotation without a restart, refusing the old CA,
//! complete answers once available, coming back at all).

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{anyhow, ensure, Context, Result};
use serde_json::Value;

use super::{
    check::{Ctx, DEPLOYMENT, NAMESPACE, SELECTOR},
    host, pki,
};

const APISERVICES: [&str; 2] = ["v1beta1.metrics.k8s.io", "v1.metrics.k8s.io"];
/// How often the readers read.
const READ_EVERY: Duration = Duration::from_millis(100);
/// The longest any wait below may take.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(60);
/// A read a replica answers as the request-header (front-proxy) user, or straight as a
/// client-certificate user.
const PROBE_PATH: &str = "/apis/metrics.k8s.io/v1beta1/nodes";

/// One read of a reader that runs while a fault is injected.
struct Read {
    at: Instant,
    error: Option<String>,
}

/// Runs `during` while another thread calls `read` every [`READ_EVERY`]; the reads are as
/// many as `during` lasts (its waits are all bounded).
fn reading<T>(
    read: impl Fn() -> Result<()> + Sync,
    during: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<Read>)> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut reads = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                let error = read().err().map(|e| last_line(&format!("{e:#}")));
                reads.push(Read { at, error });
                thread::sleep(READ_EVERY.saturating_sub(at.elapsed()));
            }
            reads
        });
        let result = during();
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join().map_err(|_| anyhow!("the reader panicked"))?;
        Ok((result?, reads))
    })
}

/// The last non-empty line of an error (kubectl's message), at most 200 characters.
fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    line.chars().take(200).collect()
}

/// Failed reads from `from` on: how many, and when (seconds after `t0`).
fn failures(reads: &[Read], t0: Instant, from: Instant) -> (usize, String) {
    let all = reads.iter().filter(|r| r.at >= from).count();
    let failed: Vec<&Read> = reads
        .iter()
        .filter(|r| r.at >= from && r.error.is_some())
        .collect();
    let (Some(first), Some(last)) = (failed.first(), failed.last()) else {
        return (0, format!("0 of {all} reads failed"));
    };
    let secs = |r: &Read| r.at.saturating_duration_since(t0).as_secs_f64();
    (
        failed.len(),
        format!(
            "{} of {all} reads failed, {:.1}–{:.1} s after the restart began (last: {})",
            failed.len(),
            secs(first),
            secs(last),
            last.error.as_deref().unwrap_or("")
        ),
    )
}

/// Polls `ok` every 100 ms until it says yes; the moment it did. Errors count as "not yet"
/// (the last is in the timeout's message).
fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> Result<bool>,
) -> Result<Instant> {
    super::check::poll(
        what,
        timeout,
        Duration::from_millis(100),
        || Ok(()),
        || Ok(ok()?.then(Instant::now)),
    )
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

/// `kubectl top node` through kube-apiserver: succeeds with at least one node listed.
fn top_node(ctx: &Ctx<'_>) -> Result<()> {
    let out = crate::exec::output(ctx.kubectl().args(["top", "node", "--no-headers"]))?;
    ensure!(!out.trim().is_empty(), "kubectl top node listed nothing");
    Ok(())
}

fn apiserver_ready(ctx: &Ctx<'_>) -> Result<bool> {
    Ok(ctx
        .kubectl()
        .args(["get", "--raw", "/readyz", "--request-timeout=2s"])
        .output()?
        .status
        .success())
}

/// The value of `--<flag>=` on kube-apiserver's running command line.
fn apiserver_flag(ctx: &Ctx<'_>, flag: &str) -> Result<String> {
    let pid_file = ctx.dirs.state.join("kube-apiserver.pid");
    let pid = fs::read_to_string(&pid_file)
        .with_context(|| format!("cannot read {}", pid_file.display()))?;
    let cmdline = fs::read(format!("/proc/{}/cmdline", pid.trim()))
        .context("kube-apiserver is not running")?;
    let prefix = format!("--{flag}=");
    cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
        .with_context(|| format!("kube-apiserver has no --{flag}"))
}

/// Restarts kube-apiserver with these flags' values replaced.
fn restart_apiserver(ctx: &Ctx<'_>, flags: &[(&str, &Path)]) -> Result<()> {
    for (flag, _) in flags {
        apiserver_flag(ctx, flag)?;
    }
    host::restart(ctx.dirs, "kube-apiserver", |args| {
        args.into_iter()
            .map(|arg| {
                flags
                    .iter()
                    .find(|(flag, _)| arg.starts_with(&format!("--{flag}=")))
                    .map_or(arg.clone(), |(flag, value)| {
                        format!("--{flag}={}", value.display())
                    })
            })
            .collect()
    })?;
    Ok(())
}

/// Restarts kube-apiserver with `flags` and waits for its `/readyz`, then for `pem` in the
/// ConfigMap's `key`: the two moments.
fn restart_and_publish(
    ctx: &Ctx<'_>,
    flags: &[(&str, &Path)],
    key: &str,
    pem: &str,
) -> Result<(Instant, Instant)> {
    restart_apiserver(ctx, flags)?;
    let ready = wait_until("kube-apiserver /readyz", RESTART_TIMEOUT, || {
        apiserver_ready(ctx)
    })?;
    let published = wait_until(
        &format!("the new CA in extension-apiserver-authentication's {key}"),
        FOLLOW_TIMEOUT,
        || Ok(auth_configmap(ctx, key)?.contains(pem.trim())),
    )?;
    Ok((ready, published))
}

/// A key of `kube-system/extension-apiserver-authentication`.
fn auth_configmap(ctx: &Ctx<'_>, key: &str) -> Result<String> {
    let v = ctx.json(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "extension-apiserver-authentication",
    ])?;
    Ok(v["data"][key].as_str().unwrap_or("").to_string())
}

/// A running aggregator-api replica.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Replica {
    pod: String,
    uid: String,
    restarts: u64,
    pid: u64,
}

fn replicas(ctx: &Ctx<'_>) -> Result<Vec<Replica>> {
    let pods = ctx.json(&["get", "pods", "-n", NAMESPACE, "-l", SELECTOR])?;
    let mut out = Vec::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        if !p["metadata"]["deletionTimestamp"].is_null() || p["status"]["phase"] != "Running" {
            continue;
        }
        let status = &p["status"]["containerStatuses"][0];
        let Some(id) = status["containerID"]
            .as_str()
            .and_then(|id| id.strip_prefix("containerd://"))
        else {
            continue;
        };
        out.push(Replica {
            pod: p["metadata"]["name"].as_str().unwrap_or("?").to_string(),
            uid: p["metadata"]["uid"].as_str().unwrap_or("?").to_string(),
            restarts: status["restartCount"].as_u64().unwrap_or(0),
            pid: super::check::container_pid(ctx, id)?,
        });
    }
    out.sort();
    ensure!(!out.is_empty(), "no running aggregator-api replica");
    Ok(out)
}

/// Same pods, none restarted.
fn same_replicas(before: &[Replica], after: &[Replica]) -> Result<()> {
    let ids = |r: &[Replica]| -> Vec<(String, String, u64)> {
        r.iter()
            .map(|r| (r.pod.clone(), r.uid.clone(), r.restarts))
            .collect()
    };
    ensure!(
        ids(before) == ids(after),
        "the replicas changed (restarted or replaced): {:?} → {:?}",
        ids(before),
        ids(after)
    );
    Ok(())
}

/// The HTTP status a replica answers [`PROBE_PATH`] with, for a request made inside its
/// network namespace with this client certificate and these headers (curl, verifying the
/// serving certificate against `deploy/generated/ca.crt`).
fn replica_status(replica: &Replica, cert: &Path, key: &Path, headers: &[&str]) -> Result<u16> {
    let ca = crate::vm::workspace_root()?.join("deploy/generated/ca.crt");
    let host = "kpulse-aggregator-api.kpulse-system.svc";
    let mut cmd = Command::new("nsenter");
    cmd.args(["-t", &replica.pid.to_string(), "--net", "--"])
        .args(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--max-time", "5", "--cacert"])
        .arg(&ca)
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key);
    for h in headers {
        cmd.args(["-H", h]);
    }
    cmd.args([
        "--resolve",
        &format!("{host}:10250:127.0.0.1"),
        &format!("https://{host}:10250{PROBE_PATH}"),
    ]);
    let code = crate::exec::output(&mut cmd)?;
    code.trim()
        .parse()
        .with_context(|| format!("curl printed {code:?}, not a status"))
}

/// Every replica answers `cert` with `want(status)`.
fn all_answer(
    replicas: &[Replica],
    cert: &Path,
    key: &Path,
    headers: &[&str],
    want: fn(u16) -> bool,
) -> Result<bool> {
    for r in replicas {
        if !want(replica_status(r, cert, key, headers)?) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn accepted(code: u16) -> bool {
    code == 200
}

/// Refused for who it is: 401 (not authenticated) or 403 (authenticated as someone else).
fn refused(code: u16) -> bool {
    code == 401 || code == 403
}

/// A suffix that makes this run's files new.
fn generation() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn pki_file(ctx: &Ctx<'_>, name: &str) -> PathBuf {
    ctx.dirs.pki.join(name)
}

/// The front-proxy headers of a user kpulse's SubjectAccessReview lets read metrics.
const PROXIED_ADMIN: [&str; 2] = [
    "X-Remote-User: kpulse-check-proxied",
    "X-Remote-Group: system:masters",
];

pub(super) fn front_proxy_rotation(ctx: &Ctx<'_>) -> Result<String> {
    let before = replicas(ctx)?;
    let old_cert = PathBuf::from(apiserver_flag(ctx, "proxy-client-cert-file")?);
    let old_key = PathBuf::from(apiserver_flag(ctx, "proxy-client-key-file")?);
    let old_ca = fs::read_to_string(apiserver_flag(ctx, "requestheader-client-ca-file")?)
        .context("cannot read the front-proxy CA")?;
    let g = generation();
    let (ca, client) = pki::ca_and_client(
        &ctx.dirs.pki,
        &format!("front-proxy-ca-{g}"),
        &format!("front-proxy-client-{g}"),
        "front-proxy-client",
        None,
    )?;
    let old_proxy = || all_answer(&before, &old_cert, &old_key, &PROXIED_ADMIN, accepted);
    let new_proxy = || all_answer(&before, &client.cert, &client.key, &PROXIED_ADMIN, accepted);
    // Before: the old proxy certificate works and the new one is refused, on every replica.
    ensure!(
        old_proxy()?,
        "before the rotation, a replica refused kube-apiserver's proxy certificate"
    );
    ensure!(
        all_answer(&before, &client.cert, &client.key, &PROXIED_ADMIN, refused)?,
        "before the rotation, a replica accepted a proxy certificate of an unknown CA"
    );

    let t0 = Instant::now();
    let (times, reads) = reading(
        || top_node(ctx),
        || {
            // kube-apiserver adds its CA to the ConfigMap's and keeps the ones there (so that
            // the apiservers of a rolling upgrade trust each other): both are trusted now.
            let (ready, published) = restart_and_publish(
                ctx,
                &[
                    ("requestheader-client-ca-file", &ca.cert),
                    ("proxy-client-cert-file", &client.cert),
                    ("proxy-client-key-file", &client.key),
                ],
                "requestheader-client-ca-file",
                &ca.cert_pem,
            )?;
            let followed = wait_until(
                "every replica trusting the new front-proxy CA",
                FOLLOW_TIMEOUT,
                &new_proxy,
            )?;
            let kept_old =
                auth_configmap(ctx, "requestheader-client-ca-file")?.contains(old_ca.trim());
            let served = wait_until("kubectl top node", FOLLOW_TIMEOUT, || {
                Ok(top_node(ctx).is_ok())
            })?;
            // The rotation's last step: the ConfigMap deleted, kube-apiserver writes it anew
            // with its own CA only, and the old CA must no longer be trusted.
            crate::exec::output(ctx.kubectl().args([
                "-n",
                "kube-system",
                "delete",
                "configmap",
                "extension-apiserver-authentication",
            ]))?;
            let deleted = Instant::now();
            let rewritten = wait_until(
                "extension-apiserver-authentication rewritten with the new CA only",
                FOLLOW_TIMEOUT,
                || {
                    let bundle = auth_configmap(ctx, "requestheader-client-ca-file")?;
                    Ok(bundle.contains(ca.cert_pem.trim()) && !bundle.contains(old_ca.trim()))
                },
            )?;
            let dropped = wait_until(
                "every replica refusing the old front-proxy CA",
                FOLLOW_TIMEOUT,
                || {
                    Ok(
                        all_answer(&before, &old_cert, &old_key, &PROXIED_ADMIN, refused)?
                            && new_proxy()?,
                    )
                },
            )?;
            // Keep reading a little past the end.
            thread::sleep(Duration::from_secs(3));
            Ok(Times {
                ready,
                published,
                kept_old,
                followed,
                served,
                deleted,
                rewritten,
                dropped,
            })
        },
    )?;
    same_replicas(&before, &replicas(ctx)?)?;
    let (_, after) = failures(&reads, t0, times.ready);
    let (_, all_reads) = failures(&reads, t0, t0);
    Ok(format!(
        "kube-apiserver ready {:.1} s after the restart began; the new CA in the ConfigMap \
         {:.1} s after that ({}); every replica ({}) trusting it {:.1} s after that, without a \
         restart; kubectl top node served again {:.1} s after kube-apiserver was ready. \
         ConfigMap deleted: rewritten with the new CA only {:.1} s later, every replica \
         refusing the old CA {:.1} s after that. kubectl top node throughout: {all_reads}; \
         after kube-apiserver was ready: {after}",
        secs(t0, times.ready),
        secs(times.ready, times.published),
        if times.kept_old {
            "kube-apiserver kept the old CA beside it"
        } else {
            "without the old CA"
        },
        before.len(),
        secs(times.published, times.followed),
        secs(times.ready, times.served),
        secs(times.deleted, times.rewritten),
        secs(times.rewritten, times.dropped),
    ))
}

/// The moments of a front-proxy rotation.
struct Times {
    ready: Instant,
    published: Instant,
    kept_old: bool,
    followed: Instant,
    served: Instant,
    deleted: Instant,
    rewritten: Instant,
    dropped: Instant,
}

pub(super) fn client_ca_rotation(ctx: &Ctx<'_>) -> Result<String> {
    let before = replicas(ctx)?;
    let old_bundle = PathBuf::from(apiserver_flag(ctx, "client-ca-file")?);
    let g = generation();
    let (ca, user) = pki::ca_and_client(
        &ctx.dirs.pki,
        &format!("client-ca-{g}"),
        &format!("client-ca-{g}-user"),
        "kpulse-check-rotated",
        Some("system:masters"),
    )?;
    // The rotation's first step: a bundle of the old CA(s) and the new one.
    let bundle = pki_file(ctx, &format!("client-ca-bundle-{g}.crt"));
    let old = fs::read_to_string(&old_bundle)
        .with_context(|| format!("cannot read {}", old_bundle.display()))?;
    fs::write(&bundle, format!("{}\n{}", old.trim_end(), ca.cert_pem))
        .with_context(|| format!("cannot write {}", bundle.display()))?;
    let (admin_cert, admin_key) = (pki_file(ctx, "admin.crt"), pki_file(ctx, "admin.key"));
    ensure!(
        all_answer(&before, &admin_cert, &admin_key, &[], accepted)?,
        "before the rotation, a replica refused the admin's client certificate"
    );
    ensure!(
        all_answer(&before, &user.cert, &user.key, &[], refused)?,
        "before the rotation, a replica accepted a client certificate of an unknown CA"
    );

    let t0 = Instant::now();
    let ((ready, published, followed), reads) = reading(
        || top_node(ctx),
        || {
            let (ready, published) = restart_and_publish(
                ctx,
                &[("client-ca-file", &bundle)],
                "client-ca-file",
                &ca.cert_pem,
            )?;
            let followed = wait_until(
                "every replica trusting the new client CA and still the old",
                FOLLOW_TIMEOUT,
                || {
                    Ok(all_answer(&before, &user.cert, &user.key, &[], accepted)?
                        && all_answer(&before, &admin_cert, &admin_key, &[], accepted)?)
                },
            )?;
            wait_until("kubectl top node", FOLLOW_TIMEOUT, || {
                Ok(top_node(ctx).is_ok())
            })?;
            thread::sleep(Duration::from_secs(3));
            Ok((ready, published, followed))
        },
    )?;
    same_replicas(&before, &replicas(ctx)?)?;
    let (_, all) = failures(&reads, t0, t0);
    let (_, after) = failures(&reads, t0, ready);
    Ok(format!(
        "kube-apiserver ready {:.1} s after the restart began, the bundle in the ConfigMap \
         {:.1} s after that, every replica ({}) accepting the new CA's certificate (and still \
         the old CA's) {:.1} s after that, without a restart; kubectl top node: {all}; after \
         kube-apiserver was ready: {after}",
        secs(t0, ready),
        secs(ready, published),
        before.len(),
        secs(published, followed),
    ))
}

const DOWN_NS: &str = "kpulse-faults-ns";
const GC_NS: &str = "kpulse-faults-gc";
/// How long after deleting a namespace with no replica up its state is read: long enough
/// for the namespace controller to have tried and given its reason, short for CI.
const NAMESPACE_LOOK_AFTER: Duration = Duration::from_secs(20);

/// Each APIService's `Available` condition: (status, reason).
fn availability(ctx: &Ctx<'_>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in APISERVICES {
        let v = ctx.json(&["get", "apiservice", name])?;
        let c = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Available")
            .with_context(|| format!("{name} has no Available condition"))?;
        out.push((
            c["status"].as_str().unwrap_or("?").to_string(),
            format!(
                "{}: {}",
                c["reason"].as_str().unwrap_or("?"),
                last_line(c["message"].as_str().unwrap_or(""))
            ),
        ));
    }
    Ok(out)
}

/// A command's exit status and its stderr's last line, for what a user sees.
fn what_user_sees(cmd: &mut Command) -> Result<(bool, String, String)> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        last_line(&String::from_utf8_lossy(&out.stderr)),
    ))
}

fn apply_json(ctx: &Ctx<'_>, name: &str, json: &str) -> Result<()> {
    let file = ctx.dirs.etc.join(name);
    fs::write(&file, json).with_context(|| format!("cannot write {}", file.display()))?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    Ok(())
}

/// A list's items.
fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v["items"].as_array().into_iter().flatten()
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn key(o: &Value) -> Option<String> {
    let name = o["metadata"]["name"].as_str()?;
    Some(match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    })
}

/// Nodes and running pods (outside kpulse-system) a complete answer lists now. Pods of a
/// namespace being deleted are left out: the namespace controller deletes them as soon as
/// discovery works again, which a check that takes the metrics API down delays (an earlier
/// check's namespace can still be Terminating with its pods running).
fn expected_sets(ctx: &Ctx<'_>) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let nodes = items(&ctx.json(&["get", "nodes"])?)
        .filter_map(key)
        .collect();
    let terminating: BTreeSet<String> = items(&ctx.json(&["get", "namespaces"])?)
        .filter(|o| !o["metadata"]["deletionTimestamp"].is_null())
        .filter_map(key)
        .collect();
    let pods = items(&ctx.json(&["get", "pods", "-A", "--field-selector=status.phase=Running"])?)
        .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
        .filter(|o| o["metadata"]["namespace"] != NAMESPACE)
        .filter(|o| {
            o["metadata"]["namespace"]
                .as_str()
                .is_none_or(|ns| !terminating.contains(ns))
        })
        .filter_map(key)
        .collect();
    Ok((nodes, pods))
}

/// What one NodeMetrics and one PodMetrics list leave out of the nodes and running pods the
/// API holds at that moment (read first, so a pod deleted meanwhile is still listed).
fn missing(ctx: &Ctx<'_>) -> Result<Vec<String>> {
    let (nodes, pods) = expected_sets(ctx)?;
    let listed = |args: &[&str]| -> Result<BTreeSet<String>> {
        Ok(items(&ctx.json(args)?).filter_map(key).collect())
    };
    let (ln, lp) = (
        listed(&["get", "nodemetrics"])?,
        listed(&["get", "podmetrics", "-A"])?,
    );
    Ok(nodes
        .difference(&ln)
        .chain(pods.difference(&lp))
        .cloned()
        .collect())
}

fn scale_to(ctx: &Ctx<'_>, replicas: u64) -> Result<()> {
    let replicas = format!("--replicas={replicas}");
    crate::exec::output(
        ctx.kubectl()
            .args(["-n", NAMESPACE, "scale", DEPLOYMENT, &replicas]),
    )
    .map(drop)
}

/// Deletes this check's namespaces, ignoring errors (cleanup).
fn delete_namespaces(ctx: &Ctx<'_>, wait: &str) {
    for ns in [DOWN_NS, GC_NS] {
        let _ = ctx
            .kubectl()
            .args(["delete", "namespace", ns, wait, "--ignore-not-found"])
            .arg("--request-timeout=0")
            .output();
    }
}

pub(super) fn every_replica_down(ctx: &Ctx<'_>) -> Result<String> {
    let scale = ctx.json(&["-n", NAMESPACE, "get", DEPLOYMENT])?["spec"]["replicas"]
        .as_u64()
        .filter(|n| *n > 0)
        .context("the aggregator-api Deployment has no replicas")?;
    // The namespaces of an earlier run, if any, gone first; this run's after it.
    delete_namespaces(ctx, "--wait=true");
    let result = replicas_down_and_back(ctx, scale);
    delete_namespaces(ctx, "--wait=false");
    // Whatever happened, kpulse must be back.
    scale_to(ctx, scale)?;
    result
}

fn replicas_down_and_back(ctx: &Ctx<'_>, scale: u64) -> Result<String> {
    let before = missing(ctx)?;
    ensure!(
        before.is_empty(),
        "answers were incomplete before the replicas went down: {before:?} missing"
    );
    // A namespace to delete and an owner with a dependent, for the namespace controller and
    // the garbage collector, made while everything is up.
    for ns in [DOWN_NS, GC_NS] {
        crate::exec::output(ctx.kubectl().args(["create", "namespace", ns]))?;
    }
    crate::exec::output(ctx.kubectl().args([
        "-n",
        DOWN_NS,
        "create",
        "configmap",
        "something",
        "--from-literal=a=b",
    ]))?;
    crate::exec::output(ctx.kubectl().args([
        "-n",
        GC_NS,
        "create",
        "configmap",
        "owner",
        "--from-literal=a=b",
    ]))?;
    let owner_uid = ctx.json(&["-n", GC_NS, "get", "configmap", "owner"])?["metadata"]["uid"]
        .as_str()
        .context("the owner has no uid")?
        .to_string();
    apply_json(
        ctx,
        "faults-dependent.json",
        &format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"dependent","namespace":"{GC_NS}",
"ownerReferences":[{{"apiVersion":"v1","kind":"ConfigMap","name":"owner","uid":"{owner_uid}"}}]}},"data":{{"a":"b"}}}}"#
        ),
    )?;

    // Down.
    let t_down = Instant::now();
    scale_to(ctx, 0)?;
    let gone = wait_until("every replica gone", RESTART_TIMEOUT, || {
        Ok(
            ctx.json(&["get", "pods", "-n", NAMESPACE, "-l", SELECTOR])?["items"]
                .as_array()
                .is_none_or(|a| a.is_empty()),
        )
    })?;
    let unavailable = wait_until("Available=False", FOLLOW_TIMEOUT, || {
        Ok(availability(ctx)?.iter().all(|(s, _)| s == "False"))
    })?;
    let conditions = availability(ctx)?
        .into_iter()
        .map(|(_, reason)| reason)
        .collect::<Vec<_>>();
    let (top_ok, _, top_err) = what_user_sees(ctx.kubectl().args(["top", "node"]))?;
    ensure!(!top_ok, "kubectl top node succeeded with no replica");
    // `kubectl api-resources` of the cluster's release and of the oldest installed one.
    let mut api_resources = Vec::new();
    let oldest = super::check::installed_kubectls().into_iter().next();
    for bin in std::iter::once(None).chain(oldest.map(Some)) {
        let mut cmd = match &bin {
            Some(bin) => ctx.kubectl_with(bin),
            None => ctx.kubectl(),
        };
        let (ok, listed, stderr) = what_user_sees(cmd.args(["api-resources", "--no-headers"]))?;
        let lists_pods = listed.lines().any(|l| l.starts_with("pods "));
        api_resources.push(format!(
            "{}: exit {}, {} pods listed, stderr {stderr:?}",
            bin.as_deref()
                .and_then(Path::file_name)
                .map_or("the cluster's kubectl".into(), |n| n.to_string_lossy()),
            if ok { "0" } else { "non-zero" },
            if lists_pods { "with" } else { "without" },
        ));
    }

    crate::exec::output(
        ctx.kubectl()
            .args(["delete", "namespace", DOWN_NS, "--wait=false"]),
    )?;
    crate::exec::output(ctx.kubectl().args([
        "-n",
        GC_NS,
        "delete",
        "configmap",
        "owner",
        "--cascade=background",
    ]))?;
    let t_deleted = Instant::now();
    let gc = wait_until("the garbage collector", Duration::from_secs(30), || {
        Ok(!ctx
            .kubectl()
            .args(["-n", GC_NS, "get", "configmap", "dependent"])
            .output()?
            .status
            .success())
    });
    // What the namespace controller says of the deleted namespace once it has retried a few
    // times (its first retries come within milliseconds, then back off).
    thread::sleep(NAMESPACE_LOOK_AFTER.saturating_sub(t_deleted.elapsed()));
    let ns = ctx
        .kubectl()
        .args(["get", "namespace", DOWN_NS, "-o", "json"])
        .output()?;
    let namespace = if ns.status.success() {
        let v: Value = serde_json::from_slice(&ns.stdout).context("namespace: not JSON")?;
        let true_conditions: Vec<String> = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "True")
            .map(|c| {
                format!(
                    "{} ({})",
                    c["type"].as_str().unwrap_or("?"),
                    last_line(c["message"].as_str().unwrap_or(""))
                )
            })
            .collect();
        format!(
            "{} after {:.0} s, conditions: {}",
            v["status"]["phase"].as_str().unwrap_or("?"),
            secs(t_deleted, Instant::now()),
            true_conditions.join("; ")
        )
    } else {
        format!("deleted within {:.0} s", secs(t_deleted, Instant::now()))
    };
    let gc = match gc {
        Ok(at) => format!(
            "deleted the dependent {:.1} s after its owner",
            secs(t_deleted, at)
        ),
        Err(e) => format!("had not deleted the dependent: {e:#}"),
    };

    // Back.
    let t_back = Instant::now();
    scale_to(ctx, scale)?;
    let available = wait_until("Available=True again", RESTART_TIMEOUT, || {
        Ok(availability(ctx)?.iter().all(|(s, _)| s == "True"))
    })?;
    // From Available=True on, every answer must be complete.
    let mut incomplete = Vec::new();
    let mut reads = 0;
    let complete = loop {
        reads += 1;
        match missing(ctx) {
            Ok(m) if m.is_empty() => break Instant::now(),
            Ok(m) => incomplete.push(format!("missing {}", m.join(", "))),
            Err(e) => incomplete.push(last_line(&format!("{e:#}"))),
        }
        ensure!(
            available.elapsed() < FOLLOW_TIMEOUT,
            "answers not complete {} s after Available=True: {incomplete:?}",
            FOLLOW_TIMEOUT.as_secs()
        );
        thread::sleep(Duration::from_millis(200));
    };
    for _ in 0..10 {
        reads += 1;
        match missing(ctx) {
            Ok(m) if m.is_empty() => {}
            Ok(m) => incomplete.push(format!("missing {}", m.join(", "))),
            Err(e) => incomplete.push(last_line(&format!("{e:#}"))),
        }
        thread::sleep(Duration::from_millis(200));
    }
    let ns_gone = wait_until("the namespace deleted", RESTART_TIMEOUT, || {
        Ok(!ctx
            .kubectl()
            .args(["get", "namespace", DOWN_NS])
            .output()?
            .status
            .success())
    });
    let ns_gone = match ns_gone {
        Ok(at) => format!("{:.1} s", secs(t_back, at)),
        Err(e) => format!("not yet: {e:#}"),
    };
    ensure!(
        incomplete.is_empty(),
        "{} of {reads} reads after Available=True were incomplete or failed: {incomplete:?}",
        incomplete.len()
    );
    Ok(format!(
        "replicas gone {:.1} s after scaling to 0, Available=False {:.1} s after that ({}); \
         kubectl top node: {}; kubectl api-resources: {}; \
         a deleted namespace: {namespace}; the garbage collector {gc}. Back: Available=True \
         {:.1} s after scaling to {scale}, complete answers {:.1} s after that ({reads} reads \
         from Available=True on, none incomplete); the namespace gone {ns_gone} after scaling \
         up",
        secs(t_down, gone),
        secs(gone, unavailable),
        conditions.join(" | "),
        top_err,
        api_resources.join(" | "),
        secs(t_back, available),
        secs(available, complete),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_from_a_moment_on() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let reads = vec![
            Read {
                at: at(0),
                error: None,
            },
            Read {
                at: at(100),
                error: Some("connection refused".into()),
            },
            Read {
                at: at(2_000),
                error: Some("Unauthorized".into()),
            },
            Read {
                at: at(2_100),
                error: None,
            },
        ];
        let (n, text) = failures(&reads, t0, t0);
        assert_eq!(n, 2);
        assert_eq!(
            text,
            "2 of 4 reads failed, 0.1–2.0 s after the restart began (last: Unauthorized)"
        );
        assert_eq!(failures(&reads, t0, at(2_050)).0, 0);
        assert_eq!(failures(&reads, t0, at(2_050)).1, "0 of 1 reads failed");
    }

    #[test]
    fn last_line_is_kubectls_message() {
        assert_eq!(
            last_line("\"kubectl\" failed: exit status: 1\nerror: Unauthorized\n\n"),
            "error: Unauthorized"
        );
        assert_eq!(last_line(""), "");
    }
}
