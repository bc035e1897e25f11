//! The agents' port end to end: the server binary on loopback, a Kubernetes API double
//! answering TokenReviews (and SubjectAccessReviews for kubectl), a minimal agent (an
//! HTTP/2 client over tokio-rustls streaming wire frames) and the real kubectl.

mod common;
use common::AcceptAny;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kpulse_testkit::review_api::ReviewApi;
use kpulse_wire::stream::{
    encode, AgentMessage, Decoder, Hello, PodCounters, PodMeta, ServerMessage, Snapshot, Update,
    STREAM_PATH, VERSION, VERSION_HEADER,
};
use kpulse_wire::{ContainerSample, CpuNanos, NodeSample, UnixNanos};
use serde_json::Value;
use tokio::sync::mpsc;

const KUBECTL: &str = "/usr/bin/kubectl";

struct Server {
    child: Child,
    port: u16,
    ingest_port: u16,
    dir: PathBuf,
    api: ReviewApi,
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

fn start(name: &str) -> Server {
    let dir = std::env::temp_dir().join(format!("kpulse-ingest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let (port, ingest_port) = (free_port(), free_port());
    let api = ReviewApi::standard();
    let child = Command::new(env!("CARGO_BIN_EXE_kpulse-aggregator-api"))
        .args(["--bind-address", "127.0.0.1", "--secure-port"])
        .arg(port.to_string())
        .arg("--ingest-port")
        .arg(ingest_port.to_string())
        .arg("--authentication-skip-lookup")
        .arg("--cert-dir")
        .arg(dir.join("certs"))
        .arg("--kubeconfig")
        .arg(api.kubeconfig(&dir))
        // The double answers reviews only (no issuer keys, no agent pods): a server verifying
        // tokens itself would keep its agents' port closed for ingest::PORT_WAIT first.
        .arg("--agent-token-verification=review")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start server");
    let s = Server {
        child,
        port,
        ingest_port,
        dir,
        api,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    for p in [port, ingest_port] {
        while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
            assert!(Instant::now() < deadline, "server did not listen on {p}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    s
}

/// kubectl as `tester`; the server's certificate is self-signed.
fn kubectl(dir: &Path, port: u16, args: &[&str]) -> (bool, String, String) {
    let kc = dir.join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: t\n  user: {{token: kpulse-test}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: t}}\ncurrent-context: t\n"
        ),
    )
    .expect("kubeconfig");
    let out = Command::new(KUBECTL)
        .env("KUBECONFIG", kc)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .arg("--request-timeout=10s")
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl off the runtime's threads.
async fn kubectl_async(dir: &Path, port: u16, args: &[&str]) -> (bool, String, String) {
    let dir = dir.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&dir, port, &args)
    })
    .await
    .expect("kubectl task")
}

use kpulse_testkit::ChannelBody;

/// One agent stream: the request body's sender and the response.
struct AgentStream {
    tx: mpsc::Sender<Bytes>,
    status: http::StatusCode,
    body: Incoming,
    decoder: Decoder,
}

impl AgentStream {
    /// Opens a stream over a new HTTP/2 connection, `first` queued before the request.
    async fn open(
        port: u16,
        token: Option<&str>,
        version: &str,
        first: &[AgentMessage],
    ) -> AgentStream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        let (tx, rx) = mpsc::channel(64);
        for m in first {
            tx.send(encode(m).expect("encode").into())
                .await
                .expect("queue");
        }
        let mut req = http::Request::post(format!("https://localhost{STREAM_PATH}"))
            .header(VERSION_HEADER, version)
            .header(
                http::header::CONTENT_TYPE,
                kpulse_wire::stream::CONTENT_TYPE,
            );
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let response = tokio::time::timeout(
            Duration::from_secs(20),
            send.send_request(req.body(ChannelBody(rx)).expect("request")),
        )
        .await
        .expect("response in time")
        .expect("response");
        let status = response.status();
        AgentStream {
            tx,
            status,
            body: response.into_body(),
            decoder: Decoder::new(),
        }
    }

    /// The next server message, or `None` when the response ended.
    async fn next(&mut self) -> Option<ServerMessage> {
        loop {
            if let Some(m) = self.decoder.next_message().expect("decode") {
                return Some(m);
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("a frame in time")?
                .ok()?;
            if let Ok(data) = frame.into_data() {
                self.decoder.push(&data);
            }
        }
    }

    /// The JSON error of a refused stream.
    async fn refusal(self) -> String {
        let body = self.body.collect().await.expect("body").to_bytes();
        match serde_json::from_slice(&body) {
            Ok(ServerMessage::Error { message }) => message,
            other => panic!("not an error body: {other:?} {body:?}"),
        }
    }
}

fn now() -> u64 {
    UnixNanos::from_system_time(std::time::SystemTime::now()).0
}

fn hello(node: &str) -> AgentMessage {
    AgentMessage::Hello(Hello {
        version: VERSION,
        node_name: node.into(),
        node_labels: [("zone".to_string(), "z1".to_string())].into(),
        agent: "ingest-test".into(),
    })
}

/// Counters of the test's pods at `now`: `web` (app at 300m, sidecar at 200m) and, until
/// removed, `cache` (idle, 200 MiB).
fn tick(start: u64, now: u64, cache: bool) -> (NodeSample, Vec<PodCounters>) {
    // CPU since the containers' `started_at`, when their counters were zero: a rate over any
    // window, the whole life included (the adaptive window's, while it is young), is exact.
    let t = now - (start - 1_000_000_000);
    let container = |name: &str, cpu: u64, mem: u64| ContainerSample {
        name: name.into(),
        timestamp: UnixNanos(now),
        cgroup_id: None,
        started_at: Some(UnixNanos(start - 1_000_000_000)),
        cpu: CpuNanos(cpu),
        memory_working_set: kpulse_wire::Bytes(mem),
        swap: None,
        signals: None,
    };
    let boot = start - 3_600_000_000_000;
    let node = NodeSample {
        timestamp: UnixNanos(now),
        started_at: Some(UnixNanos(boot)),
        cpu: CpuNanos((now - boot) / 4),
        memory_working_set: kpulse_wire::Bytes(3 << 30),
        swap: None,
    };
    let mut pods = vec![PodCounters {
        uid: "u-web".into(),
        containers: vec![
            container("app", t * 3 / 10, 64 << 20),
            container("sidecar", t * 2 / 10, 16 << 20),
        ],
        signals: None,
    }];
    if cache {
        pods.push(PodCounters {
            uid: "u-cache".into(),
            containers: vec![container("redis", 0, 200 << 20)],
            signals: None,
        });
    }
    (node, pods)
}

fn pod(uid: &str, name: &str) -> PodMeta {
    PodMeta {
        uid: uid.into(),
        namespace: "demo".into(),
        name: name.into(),
        labels: [("app".to_string(), name.to_string())].into(),
        ready_since: None,
    }
}

/// Millicores in a `kubectl top` cell such as `300m`.
fn millicores(cell: &str) -> u64 {
    cell.strip_suffix('m')
        .and_then(|n| n.parse().ok())
        .or_else(|| cell.parse::<u64>().ok().map(|c| c * 1000))
        .unwrap_or_else(|| panic!("not a CPU cell: {cell}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_stream_their_own_node_and_kubectl_sees_it() {
    assert!(Path::new(KUBECTL).exists(), "the test needs {KUBECTL}");
    let mut s = start("e2e");
    let start_ns = now();

    // node-a's agent: Hello, Snapshot, then an Update every 200 ms.
    let (node, counters) = tick(start_ns, start_ns, true);
    let snapshot = AgentMessage::Snapshot(Snapshot {
        sent_at: UnixNanos(start_ns),
        node,
        pods: vec![pod("u-web", "web"), pod("u-cache", "cache")],
        counters,
        previous: None,
    });
    let mut agent = AgentStream::open(
        s.ingest_port,
        Some("node-a-token"),
        "1.0",
        &[hello("node-a"), snapshot],
    )
    .await;
    assert_eq!(agent.status, http::StatusCode::OK);
    assert_eq!(
        agent.next().await,
        Some(ServerMessage::Welcome { version: VERSION })
    );
    let tx = agent.tx.clone();
    let (remove_tx, mut remove_rx) = mpsc::channel::<tokio::sync::oneshot::Sender<()>>(1);
    let updater = tokio::spawn(async move {
        let mut cache = true;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut removed = Vec::new();
            let mut ack = None;
            if let Ok(a) = remove_rx.try_recv() {
                cache = false;
                removed.push("u-cache".to_string());
                ack = Some(a);
            }
            let t = now();
            let (node, counters) = tick(start_ns, t, cache);
            let update = AgentMessage::Update(Update {
                sent_at: UnixNanos(t),
                node,
                upserts: vec![],
                removed,
                counters,
            });
            if tx
                .send(encode(&update).expect("encode").into())
                .await
                .is_err()
            {
                return;
            }
            if let Some(a) = ack {
                let _ = a.send(());
            }
        }
    });

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (ok, _, _) = kubectl_async(&s.dir, s.port, &["get", "--raw", "/readyz"]).await;
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready within 15 s of streaming"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // kubectl top: every container at the streamed rates.
    let (ok, out, err) = kubectl_async(
        &s.dir,
        s.port,
        &["top", "pod", "-n", "demo", "--containers"],
    )
    .await;
    assert!(ok, "{err}");
    let rows: Vec<Vec<String>> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    let cell = |pod: &str, c: &str| {
        rows.iter()
            .find(|r| r[0] == pod && r[1] == c)
            .map(|r| (millicores(&r[2]), r[3].clone()))
            .unwrap_or_else(|| panic!("no row {pod}/{c} in\n{out}"))
    };
    let (app, app_mem) = cell("web", "app");
    let (sidecar, _) = cell("web", "sidecar");
    let (redis, redis_mem) = cell("cache", "redis");
    assert!((299..=301).contains(&app), "app {app}m\n{out}");
    assert!((199..=201).contains(&sidecar), "sidecar {sidecar}m\n{out}");
    assert_eq!(
        (redis, app_mem.as_str(), redis_mem.as_str()),
        (0, "64Mi", "200Mi"),
        "{out}"
    );
    // Objects carry the streamed labels, pods and node alike.
    let (ok, out, err) = kubectl_async(
        &s.dir,
        s.port,
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/demo/pods/web",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let o: serde_json::Value = serde_json::from_str(&out).expect("PodMetrics");
    assert_eq!(o["metadata"]["labels"]["app"], "web", "{out}");
    let (ok, out, err) =
        kubectl_async(&s.dir, s.port, &["get", "nodemetrics", "-l", "zone=z1"]).await;
    assert!(ok && out.contains("node-a"), "{out} {err}");

    // Another node with node-a's token: 403, saying why.
    let stolen = AgentStream::open(
        s.ingest_port,
        Some("node-a-token"),
        "1.0",
        &[hello("node-b")],
    )
    .await;
    assert_eq!(stolen.status, http::StatusCode::FORBIDDEN);
    let message = stolen.refusal().await;
    assert!(
        message.contains(r#"token is bound to node "node-a", not "node-b""#),
        "{message}"
    );
    // Another major version: 400 naming both.
    let future = AgentStream::open(
        s.ingest_port,
        Some("node-a-token"),
        "2.0",
        &[hello("node-a")],
    )
    .await;
    assert_eq!(future.status, http::StatusCode::BAD_REQUEST);
    let message = future.refusal().await;
    assert!(
        message.contains("2.0") && message.contains(&kpulse_wire::stream::VERSION.to_string()),
        "{message}"
    );
    // No credentials: 401.
    let anonymous = AgentStream::open(s.ingest_port, None, "1.0", &[hello("node-a")]).await;
    assert_eq!(anonymous.status, http::StatusCode::UNAUTHORIZED);

    // A removal: the pod is gone at once (long before --metric-expiry), the rest stays.
    let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
    remove_tx.send(ack_tx).await.expect("updater");
    tokio::time::timeout(Duration::from_secs(5), ack_rx)
        .await
        .expect("removal sent in time")
        .expect("ack");
    let removed_at = Instant::now();
    loop {
        let (ok, _, err) = kubectl_async(
            &s.dir,
            s.port,
            &[
                "get",
                "--raw",
                "/apis/metrics.k8s.io/v1beta1/namespaces/demo/pods/cache",
            ],
        )
        .await;
        if !ok {
            assert!(
                err.contains("not found") || err.contains("NotFound"),
                "{err}"
            );
            break;
        }
        assert!(
            removed_at.elapsed() < Duration::from_secs(3),
            "cache still served 3 s after its removal"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ok, out, err) = kubectl_async(&s.dir, s.port, &["top", "pod", "-n", "demo"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("web") && !out.contains("cache"), "{out}");

    // The server's own numbers.
    let (ok, out, err) = kubectl_async(&s.dir, s.port, &["get", "--raw", "/metrics"]).await;
    assert!(ok, "{err}");
    for line in [
        "kpulse_aggregator_ingest_streams 1\n",
        "kpulse_aggregator_ingest_rejected_total{reason=\"wrong_node\"} 1\n",
        "kpulse_aggregator_ingest_rejected_total{reason=\"bad_version\"} 1\n",
        "kpulse_aggregator_ingest_rejected_total{reason=\"no_credentials\"} 1\n",
        "kpulse_aggregator_ingest_messages_total{type=\"snapshot\"} 1\n",
    ] {
        assert!(out.contains(line), "{line} missing from {out}");
    }
    // Every review of the agent's token asked for audience kpulse.
    let agent_reviews: Vec<Value> = s
        .api
        .seen()
        .into_iter()
        .filter(|(kind, spec)| kind == "tokenreviews" && spec["token"] == "node-a-token")
        .map(|(_, spec)| spec["audiences"].clone())
        .collect();
    assert!(!agent_reviews.is_empty());
    assert!(
        agent_reviews
            .iter()
            .all(|a| *a == serde_json::json!(["kpulse"])),
        "{agent_reviews:?}"
    );

    // A newer stream for node-a replaces the older one, which is told why.
    updater.abort();
    let mut newer = AgentStream::open(
        s.ingest_port,
        Some("node-a-token"),
        "1.0",
        &[hello("node-a")],
    )
    .await;
    assert_eq!(newer.status, http::StatusCode::OK);
    assert_eq!(
        newer.next().await,
        Some(ServerMessage::Welcome { version: VERSION })
    );
    assert_eq!(
        agent.next().await,
        Some(ServerMessage::Error {
            message: r#"replaced by a newer stream for node "node-a""#.into()
        })
    );
    // The node's data outlives the replaced stream.
    let (ok, out, err) = kubectl_async(&s.dir, s.port, &["top", "pod", "-n", "demo"]).await;
    assert!(ok && out.contains("web"), "{out} {err}");

    // SIGTERM: the open stream is ended with a reason and the server exits promptly.
    // SAFETY: kill(2) on the child this test started.
    #[allow(unsafe_code)]
    let rc = unsafe { libc_kill(s.child.id() as i32, 15) };
    assert_eq!(rc, 0);
    assert!(matches!(
        newer.next().await,
        Some(ServerMessage::Error { message }) if message.contains("shutting down")
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = s.child.try_wait().expect("wait") {
            assert!(status.success(), "exit after SIGTERM: {status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an open agent stream held the server past 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(newer);
    drop(agent);
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
