//! The server binary on loopback, driven by real kubectl binaries (every installed
//! version) and a rustls client: health endpoints, HTTP/2, certificate reload, shutdown.

mod common;
use common::AcceptAny;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use kpulse_testkit::review_api::ReviewApi;

struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
    _api: ReviewApi,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start(name: &str, extra: &[&str]) -> Server {
    let dir = std::env::temp_dir().join(format!("kpulse-serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let port = free_port();
    let api = ReviewApi::standard();
    let child = Command::new(env!("CARGO_BIN_EXE_kpulse-aggregator-api"))
        .args([
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
            "--ingest-port",
            &free_port().to_string(),
            "--cert-dir",
        ])
        .arg(dir.join("certs"))
        .arg("--kubeconfig")
        .arg(api.kubeconfig(&dir))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start server");
    let s = Server {
        child,
        port,
        dir,
        _api: api,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

fn kubectls() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/lib/google-cloud-sdk/bin")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("kubectl.1."))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    if Path::new("/usr/bin/kubectl").exists() {
        v.push("/usr/bin/kubectl".into());
    }
    v
}

/// A kubeconfig for the test server (a bearer token kubectl sends; the certificate is not
/// verified, the server's is self-signed).
fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: anonymous\n  user: {{token: kpulse-test}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: anonymous}}\ncurrent-context: t\n"
    );
    std::fs::write(&path, text).expect("kubeconfig");
    path
}

fn kubectl(bin: &Path, dir: &Path, port: u16, args: &[&str]) -> (bool, String, String) {
    kubectl_as(bin, dir, port, "kpulse-test", args)
}

fn kubectl_as(
    bin: &Path,
    dir: &Path,
    port: u16,
    token: &str,
    args: &[&str],
) -> (bool, String, String) {
    let kc = kubeconfig(dir, port);
    let text = std::fs::read_to_string(&kc)
        .expect("kubeconfig")
        .replace("kpulse-test", token);
    let kc = dir.join(format!("kubeconfig-{token}"));
    std::fs::write(&kc, text).expect("kubeconfig");
    let out = Command::new(bin)
        .env("KUBECONFIG", kc)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .arg("--request-timeout=10s")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn requests_are_authenticated_and_authorized_through_the_kubernetes_api() {
    let bins = kubectls();
    let bin = bins.last().expect("a kubectl");
    let s = start("authz", &[]);
    // Authenticated by TokenReview, allowed by SubjectAccessReview: the path itself is
    // not served yet (404), which proves the request got past both gates.
    let (ok, _, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "kpulse-test",
        &["get", "--raw", "/nothing-here"],
    );
    assert!(
        !ok && (err.contains("NotFound") || err.contains("404")),
        "{err}"
    );
    // A token the API does not accept: 401.
    let (ok, _, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "wrong",
        &["get", "--raw", "/nothing-here"],
    );
    assert!(!ok && err.contains("Unauthorized"), "{err}");
    // Authenticated but denied: 403 naming the user and the reason.
    let (ok, _, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "denied-token",
        &["get", "--raw", "/nothing-here"],
    );
    assert!(
        !ok && err.contains("forbidden") && err.contains("nobody"),
        "{err}"
    );
    // The metrics API itself, behind the same gates: an empty list (no agent has sent data),
    // discovery, a NotFound in metrics-server's words, and a denial naming the resource.
    let (ok, out, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "kpulse-test",
        &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "{\"kind\":\"NodeMetricsList\",\"apiVersion\":\"metrics.k8s.io/v1beta1\",\"metadata\":{},\"items\":[]}\n");
    let (ok, out, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "kpulse-test",
        &["get", "--raw", "/apis/metrics.k8s.io/v1beta1"],
    );
    assert!(
        ok && out.contains("\"kind\":\"APIResourceList\"") && out.contains("\"name\":\"pods\""),
        "{out} {err}"
    );
    let (ok, _, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "kpulse-test",
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1/namespaces/default/pods/nope",
        ],
    );
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = kubectl_as(
        bin,
        &s.dir,
        s.port,
        "denied-token",
        &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"],
    );
    assert!(
        !ok && err.contains("cannot list resource")
            && err.contains("nodes")
            && err.contains("metrics.k8s.io"),
        "{err}"
    );
    // Health endpoints need no credentials at all.
    let (ok, out, err) = kubectl_as(bin, &s.dir, s.port, "wrong", &["get", "--raw", "/livez"]);
    assert!(ok && out == "ok", "{out} {err}");
}

#[test]
fn health_endpoints_answer_every_kubectl() {
    let bins = kubectls();
    assert!(
        !bins.is_empty(),
        "no kubectl installed: the test needs the real client"
    );
    let s = start("health", &[]);
    for bin in &bins {
        // No agent has sent data: not ready, with the apiserver's verbose listing.
        let (ok, out, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/readyz?verbose"]);
        assert!(!ok, "{}: ready without data: {out}", bin.display());
        assert!(
            err.contains("[-]metric-storage-ready failed: reason withheld")
                || out.contains("[-]metric-storage-ready failed"),
            "{}: {out} {err}",
            bin.display()
        );
        let (ok, out, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/readyz/ping"]);
        assert!(ok && out == "ok", "{}: {out} {err}", bin.display());
        let (ok, out, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/healthz"]);
        assert!(ok && out == "ok", "{}: {out} {err}", bin.display());
        let (ok, _, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/nothing-here"]);
        assert!(
            !ok && err.contains("NotFound") || err.contains("404"),
            "{}: {err}",
            bin.display()
        );
    }
}

/// Writes the feed file the server follows, in the agents' wire messages: a Hello for
/// node `node-a`, a Snapshot announcing pods `demo/web` (two containers at 300m and 200m
/// of CPU) and `demo/cache` (idle, 200 MiB), then an Update every 200 ms, counters
/// advancing exactly at those rates.
struct Feeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    fn start(path: PathBuf) -> Feeder {
        use std::io::Write;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut f = std::fs::File::create(&path).expect("feed file");
            let hello = serde_json::json!({"hello": {"version": {"major": 1, "minor": 0},
                "node_name": "node-a", "node_labels": {"zone": "z1"}, "agent": "feeder"}});
            writeln!(f, "{hello}").expect("write");
            let pods = serde_json::json!([
                {"uid": "u-web", "namespace": "demo", "name": "web", "labels": {"app": "web"}},
                {"uid": "u-cache", "namespace": "demo", "name": "cache", "labels": {"app": "cache"}},
            ]);
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64;
            let boot = start - 3_600_000_000_000;
            let mut first = true;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as u64;
                // CPU since `started_at`, when the counters were zero, so that a rate over
                // any window (a young series' whole life, with the adaptive window) is exact.
                let t = now - (start - 1_000_000_000);
                let container = |name: &str, cpu: u64, mem: u64| {
                    serde_json::json!({"name": name, "timestamp": now, "cpu": cpu,
                        "memory_working_set": mem, "started_at": start - 1_000_000_000})
                };
                let node = serde_json::json!({"timestamp": now, "started_at": boot,
                    "cpu": (now - boot) / 4, "memory_working_set": 3u64 << 30});
                let counters = serde_json::json!([
                    {"uid": "u-web", "containers": [
                        container("app", t * 3 / 10, 64 << 20),
                        container("sidecar", t * 2 / 10, 16 << 20)]},
                    {"uid": "u-cache", "containers": [container("redis", 0, 200 << 20)]},
                ]);
                let message = if first {
                    serde_json::json!({"snapshot": {"sent_at": now, "node": node,
                        "pods": pods, "counters": counters}})
                } else {
                    serde_json::json!({"update": {"sent_at": now, "node": node,
                        "counters": counters}})
                };
                first = false;
                writeln!(f, "{message}").expect("write");
                f.flush().expect("flush");
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Feeder {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Millicores in a `kubectl top` cell such as `500m`.
fn millicores(cell: &str) -> u64 {
    cell.strip_suffix('m')
        .and_then(|n| n.parse().ok())
        .or_else(|| cell.parse::<u64>().ok().map(|c| c * 1000))
        .unwrap_or_else(|| panic!("not a CPU cell: {cell}"))
}

#[test]
fn fed_metrics_reach_every_kubectl_as_top_tables_objects_and_watches() {
    let bins = kubectls();
    assert!(!bins.is_empty(), "no kubectl installed");
    let dir = std::env::temp_dir().join(format!("kpulse-feed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let feed = dir.join("feed.jsonl");
    let feeder = Feeder::start(feed.clone());
    let mut s = start(
        "feed",
        &[
            "--authentication-skip-lookup",
            "--feed-file",
            feed.to_str().expect("utf8"),
        ],
    );
    let newest = bins.last().expect("a kubectl");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, _, _) = kubectl(newest, &s.dir, s.port, &["get", "--raw", "/readyz"]);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "not ready within 10 s of data");
        std::thread::sleep(Duration::from_millis(100));
    }
    for bin in &bins {
        let v = bin.display();
        // kubectl top asks for protobuf first.
        let (ok, out, err) = kubectl(
            bin,
            &s.dir,
            s.port,
            &["top", "pod", "-n", "demo", "--containers"],
        );
        assert!(ok, "{v}: {err}");
        let rows: Vec<Vec<&str>> = out
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        let cell = |pod: &str, c: &str| {
            rows.iter()
                .find(|r| r[0] == pod && r[1] == c)
                .map(|r| (millicores(r[2]), r[3].to_owned()))
                .unwrap_or_else(|| panic!("{v}: no row {pod}/{c} in\n{out}"))
        };
        let (app, app_mem) = cell("web", "app");
        let (sidecar, _) = cell("web", "sidecar");
        let (redis, redis_mem) = cell("cache", "redis");
        // Counters advance exactly at these rates; the only error is rounding to millicores.
        assert!((299..=301).contains(&app), "{v}: app {app}m\n{out}");
        assert!(
            (199..=201).contains(&sidecar),
            "{v}: sidecar {sidecar}m\n{out}"
        );
        assert_eq!(
            (redis, app_mem.as_str(), redis_mem.as_str()),
            (0, "64Mi", "200Mi"),
            "{v}\n{out}"
        );

        // (`kubectl top node` also lists core/v1 Nodes, which only a kube-apiserver serves.)
        let (ok, out, err) = kubectl(
            bin,
            &s.dir,
            s.port,
            &["get", "nodemetrics", "-l", "zone=z1"],
        );
        assert!(ok && out.contains("node-a"), "{v}: {out} {err}");

        // Table through kubectl get, with label selectors, in both API versions.
        for resource in [
            "podmetrics.v1beta1.metrics.k8s.io",
            "podmetrics.v1.metrics.k8s.io",
        ] {
            let (ok, out, err) = kubectl(
                bin,
                &s.dir,
                s.port,
                &["get", resource, "-A", "-l", "app=web"],
            );
            assert!(ok, "{v} {resource}: {err}");
            assert!(
                out.contains("web") && !out.contains("cache"),
                "{v} {resource}: {out}"
            );
        }
        let (ok, out, err) = kubectl(
            bin,
            &s.dir,
            s.port,
            &[
                "get",
                "--raw",
                "/apis/metrics.k8s.io/v1/namespaces/demo/pods/cache",
            ],
        );
        assert!(ok, "{v}: {err}");
        let o: serde_json::Value = serde_json::from_str(&out).expect("PodMetrics JSON");
        assert_eq!(o["kind"], "PodMetrics");
        assert_eq!(o["metadata"]["labels"]["app"], "cache");
        assert_eq!(o["containers"][0]["usage"]["memory"], "200Mi");
    }

    // A raw watch: events as JSON lines until the server's timeout ends the stream.
    let (ok, out, err) = kubectl(
        newest,
        &s.dir,
        s.port,
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/demo/pods?watch=1&timeoutSeconds=3",
        ],
    );
    assert!(ok, "{err}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let of = |kind: &str, name: &str| {
        events
            .iter()
            .filter(|e| e["type"] == kind && e["object"]["metadata"]["name"] == name)
            .count()
    };
    assert_eq!((of("ADDED", "cache"), of("ADDED", "web")), (1, 1), "{out}");
    assert!(of("MODIFIED", "web") >= 1, "web changes every batch: {out}");

    // kubectl get -w on every version: a Table stream, header once, a row per change.
    for bin in &bins {
        let kc = kubeconfig(&s.dir, s.port);
        let mut child = Command::new(bin)
            .env("KUBECONFIG", kc)
            .env("HOME", "/nonexistent")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .args([
                "get",
                "podmetrics",
                "-n",
                "demo",
                "web",
                "-w",
                "--output-watch-events",
            ])
            .spawn()
            .expect("kubectl -w");
        std::thread::sleep(Duration::from_millis(3500));
        let _ = child.kill();
        let out = child.wait_with_output().expect("output");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines
                .first()
                .is_some_and(|h| h.starts_with("EVENT") && h.contains("CPU")),
            "{}: {text} {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            text.matches("EVENT").count(),
            1,
            "{}: one header\n{text}",
            bin.display()
        );
        let modified = lines
            .iter()
            .filter(|l| l.starts_with("MODIFIED") && l.contains("web"))
            .count();
        assert!(modified >= 1, "{}: rows per change\n{text}", bin.display());
    }

    // SIGTERM with a watch open: the watch ends and the server exits promptly.
    let kc = kubeconfig(&s.dir, s.port);
    let mut watcher = Command::new(newest)
        .env("KUBECONFIG", kc)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .args(["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes?watch=1"])
        .spawn()
        .expect("watch");
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: kill(2) on the child this test started.
    #[allow(unsafe_code)]
    let rc = unsafe { libc_kill(s.child.id() as i32, 15) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = s.child.try_wait().expect("wait") {
            assert!(status.success(), "exit after SIGTERM: {status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an open watch held the server past 5 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    drop(feeder);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS client that records what the server presented and which protocol it chose.
fn handshake(port: u16) -> (Vec<u8>, Option<Vec<u8>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client");
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).expect("handshake");
    }
    let cert = conn.peer_certificates().expect("server cert")[0].to_vec();
    (cert, conn.alpn_protocol().map(<[u8]>::to_vec))
}

/// One HTTP/1.1 GET over TLS, with a bearer token or without credentials: the status,
/// the `Content-Type` and the body.
fn https_get(port: u16, path: &str, token: Option<&str>) -> (u16, String, String) {
    use std::io::{Read, Write};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client");
    let sock = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\n{auth}connection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    // The server may close without close_notify: keep what arrived.
    let _ = tls.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let content_type = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

#[test]
fn self_metrics_are_served_behind_the_same_gates() {
    let bins = kubectls();
    let bin = bins.last().expect("a kubectl");
    let s = start("selfmetrics", &[]);
    let nodes = "/apis/metrics.k8s.io/v1beta1/nodes";
    // Requests to be counted: a NodeMetrics list (200) and one with a bad token (401).
    let (ok, _, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", nodes]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl_as(bin, &s.dir, s.port, "wrong", &["get", "--raw", nodes]);
    assert!(!ok && err.contains("Unauthorized"), "{err}");

    // Authenticated and allowed by SubjectAccessReview (`get` on the non-resource path).
    let (code, content_type, body) = https_get(s.port, "/metrics", Some("kpulse-test"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let labels =
        r#"verb="list",group="metrics.k8s.io",version="v1beta1",resource="nodes",endpoint="api""#;
    for line in [
        format!("kpulse_aggregator_requests_total{{{labels},code=\"200\"}} 1\n"),
        format!("kpulse_aggregator_requests_total{{{labels},code=\"401\"}} 1\n"),
        format!("kpulse_aggregator_request_duration_seconds_count{{{labels}}} 2\n"),
        "kpulse_aggregator_store_nodes 0\n".to_string(),
        "# TYPE kpulse_aggregator_metric_freshness_seconds histogram\n".to_string(),
    ] {
        assert!(body.contains(&line), "{line} missing from {body}");
    }
    // kubectl reads it too; the scrape above is counted by now.
    let (ok, out, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/metrics"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(r#"kpulse_aggregator_requests_total{verb="get",group="",version="",resource="",endpoint="metrics",code="200"} 1"#),
        "{out}"
    );

    // Not open: no credentials is 401, a user the SubjectAccessReview denies is 403.
    let (code, _, body) = https_get(s.port, "/metrics", None);
    assert_eq!(code, 401, "{body}");
    let (code, _, body) = https_get(s.port, "/metrics", Some("denied-token"));
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("nobody") && body.contains("/metrics"),
        "{body}"
    );

    // Liveness includes the store's maintenance loop.
    let (ok, out, err) = kubectl(bin, &s.dir, s.port, &["get", "--raw", "/livez?verbose"]);
    assert!(
        ok && out.contains("[+]ping ok\n[+]metric-collection-timely ok\n"),
        "{out} {err}"
    );
}

#[test]
fn http2_is_negotiated_and_certificates_reload_without_restart() {
    let dir = std::env::temp_dir().join(format!("kpulse-certfiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let write = |host: &str| {
        let g = rcgen::generate_simple_self_signed(vec![host.to_string()]).expect("gen");
        std::fs::write(dir.join("tls.key"), g.signing_key.serialize_pem()).expect("key");
        std::fs::write(dir.join("tls.crt"), g.cert.pem()).expect("cert");
    };
    write("first.example");
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let s = start(
        "files",
        &[
            "--tls-cert-file",
            cert.to_str().expect("utf8"),
            "--tls-private-key-file",
            key.to_str().expect("utf8"),
        ],
    );
    let (first, alpn) = handshake(s.port);
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "HTTP/2 via ALPN");
    std::thread::sleep(Duration::from_millis(1100));
    write("second.example");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (now, _) = handshake(s.port);
        if now != first {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new certificate not served within 10 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_exit_with_usage_code_and_sigterm_drains() {
    let out = Command::new(env!("CARGO_BIN_EXE_kpulse-aggregator-api"))
        .args(["--tls-min-version", "VersionTLS10", "--tls-cert-file", "/x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("VersionTLS10") && err.contains("go together"),
        "{err}"
    );

    let mut s = start("term", &[]);
    // SAFETY: kill(2) on the child this test started.
    #[allow(unsafe_code)]
    let rc = unsafe { libc_kill(s.child.id() as i32, 15) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = s.child.try_wait().expect("wait") {
            assert!(status.success(), "exit after SIGTERM: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }

    // With --shutdown-delay-duration the port stays open and answers after SIGTERM, with
    // /readyz failing on `shutdown` (kube-apiserver still routes here for a moment), and
    // the server exits after the delay.
    let mut s = start("term-delay", &["--shutdown-delay-duration", "3s"]);
    let (code, _, body) = https_get(s.port, "/readyz/shutdown", None);
    assert_eq!(code, 200, "before SIGTERM: {body}");
    let signalled = Instant::now();
    // SAFETY: kill(2) on the child this test started.
    #[allow(unsafe_code)]
    let rc = unsafe { libc_kill(s.child.id() as i32, 15) };
    assert_eq!(rc, 0);
    // The signal is handled on the server's own time: wait (bounded) until /readyz says so
    // (a request right after kill(2) can still find `shutdown` ok).
    loop {
        let (_, _, body) = https_get(s.port, "/readyz?verbose", None);
        if body.contains("[-]shutdown failed: reason withheld") {
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_millis(1500),
            "/readyz still ready 1.5 s after SIGTERM: {body}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut answered = 0;
    let mut unready = 0;
    loop {
        if let Some(status) = s.child.try_wait().expect("wait") {
            assert!(status.success(), "exit after SIGTERM: {status}");
            break;
        }
        if signalled.elapsed() < Duration::from_millis(2500) {
            // Well inside the delay: every request is answered.
            let (code, _, body) = https_get(s.port, "/readyz?verbose", None);
            assert_eq!(code, 500, "readyz during the delay: {body}");
            assert!(
                body.contains("[-]shutdown failed: reason withheld"),
                "{body}"
            );
            let (code, _, body) = https_get(s.port, "/livez", None);
            assert_eq!(code, 200, "livez during the delay: {body}");
            answered += 1;
            unready += 1;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(13),
            "no exit within 10 s after the delay"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "exited {took:?} after SIGTERM, before the 3 s delay"
    );
    assert!(answered >= 5 && unready == answered, "{answered} answers");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
