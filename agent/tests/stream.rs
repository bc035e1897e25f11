//! `kpulse-agent run` end to end, on loopback: the real binary in standalone mode
//! (`--pods-file`) measures a busy loop in a cgroup this test creates and streams it to a
//! tiny in-test aggregator (HTTP/2 over TLS with a test CA, hyper, `kpulse_wire::stream`).
//!
//! Checked: Hello names the node and carries the bearer token; a Snapshot, then an Update
//! about every second with the test pod's CPU counter increasing; a label change arrives as
//! an upsert; a restarted server gets a reconnect with a fresh Snapshot and the rotated
//! token; removing the pod from the file yields `removed`; a 403 and a version refusal give
//! one clear ERROR line each; the token never appears in the logs; SIGTERM stops the agent;
//! self-metrics count the reconnects. With eBPF loadable, a shorter run uses it too.
//!
//! Needs root (cgroups). Skips without it, unless `CI=true`.

mod common;

use std::{
    convert::Infallible,
    io::{BufRead, BufReader, Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use common::TestCgroups;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kpulse_agent::layout::Layout;
use kpulse_testkit::ChannelBody;
use kpulse_wire::stream::{
    encode, AgentMessage, Decoder, ServerMessage, Snapshot, Update, STREAM_PATH, VERSION,
    VERSION_HEADER,
};
use tokio::sync::mpsc;

const NODE: &str = "test-node";
const POD_UID: &str = "3c1d2b4a-0000-4000-8000-00000000beef";
const TIMEOUT: Duration = Duration::from_secs(15);

/// Connection numbers, unique across the test servers of this process.
static CONNECTIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

fn agent_bin() -> PathBuf {
    std::env::var_os("KPULSE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kpulse-agent")))
}

/// What the test server saw.
#[derive(Debug)]
enum Event {
    /// A stream request (accepted or refused).
    Request {
        conn: usize,
        authorization: Option<String>,
        version: Option<String>,
    },
    /// A frame of an accepted stream.
    Message { conn: usize, message: AgentMessage },
}

/// How the server answers.
#[derive(Clone, Debug)]
enum Mode {
    Accept,
    Refuse {
        status: StatusCode,
        message: String,
        version: Option<&'static str>,
    },
}

type Pki = common::pki::TestPki;

fn pki(dir: &Path) -> Pki {
    common::pki::TestPki::new(dir, "kpulse test CA")
}

/// The in-test aggregator: accepts or refuses streams, reports what it sees. Dropping it
/// closes the listener and every connection (a server crash, as the agent sees it).
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(addr: SocketAddr, pki: &Pki, mode: Mode, events: mpsc::Sender<Event>) -> Server {
        let mut listener = None;
        for _ in 0..100 {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let listener = listener.expect("bind the test server");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let conn = CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let acceptor = acceptor.clone();
                let mode = mode.clone();
                let events = events.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        handle(req, conn, mode.clone(), events.clone())
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Server { addr, task }
    }
}

async fn handle(
    req: Request<Incoming>,
    conn: usize,
    mode: Mode,
    events: mpsc::Sender<Event>,
) -> Result<Response<ChannelBody>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let _ = events
        .send(Event::Request {
            conn,
            authorization: header("authorization"),
            version: header(VERSION_HEADER),
        })
        .await;
    let (tx, rx) = mpsc::channel(16);
    let mut response = Response::new(ChannelBody(rx));
    if req.uri().path() != STREAM_PATH {
        *response.status_mut() = StatusCode::NOT_FOUND;
        return Ok(response);
    }
    match mode {
        Mode::Refuse {
            status,
            message,
            version,
        } => {
            *response.status_mut() = status;
            if let Some(v) = version {
                response
                    .headers_mut()
                    .insert(VERSION_HEADER, http::HeaderValue::from_static(v));
            }
            let body = serde_json::to_vec(&ServerMessage::Error { message }).expect("json");
            let _ = tx.try_send(Bytes::from(body));
        }
        Mode::Accept => {
            response.headers_mut().insert(
                VERSION_HEADER,
                http::HeaderValue::from_str(&VERSION.to_string()).expect("version"),
            );
            let welcome = encode(&ServerMessage::Welcome { version: VERSION }).expect("encode");
            let _ = tx.try_send(Bytes::from(welcome));
            let mut body = req.into_body();
            tokio::spawn(async move {
                let mut decoder = Decoder::new();
                while let Some(Ok(frame)) = body.frame().await {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    decoder.push(&data);
                    while let Ok(Some(message)) = decoder.next_message::<AgentMessage>() {
                        if events.send(Event::Message { conn, message }).await.is_err() {
                            return;
                        }
                    }
                }
                // The request ended: end the response too (tx dropped here).
                drop(tx);
            });
        }
    }
    Ok(response)
}

/// The agent process: killed on drop; stderr collected.
struct Agent {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    fn start(args: &[String]) -> Agent {
        let mut child = Command::new(agent_bin())
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("NODE_NAME")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kpulse-agent");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("agent: {line}");
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
        Agent { child, stderr }
    }

    fn lines(&self) -> Vec<String> {
        self.stderr.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits until a stderr line contains every one of `parts`.
    async fn wait_line(&self, parts: &[&str]) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(l) = self
                .lines()
                .into_iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
            {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no agent log line with {parts:?}; got:\n{}",
                self.lines().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM);
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            assert!(Instant::now() < deadline, "agent did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next event, within [`TIMEOUT`].
async fn next(rx: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(TIMEOUT, rx.recv())
        .await
        .expect("an event from the agent in time")
        .expect("server alive")
}

/// Skips events until `f` picks one.
async fn until<T>(rx: &mut mpsc::Receiver<Event>, mut f: impl FnMut(Event) -> Option<T>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        assert!(Instant::now() < deadline, "expected event did not come");
        if let Some(t) = f(next(rx).await) {
            return t;
        }
    }
}

/// A new stream: its request, Hello and Snapshot.
async fn new_stream(rx: &mut mpsc::Receiver<Event>) -> (usize, Option<String>, Snapshot) {
    let (conn, auth, version) = until(rx, |e| match e {
        Event::Request {
            conn,
            authorization,
            version,
        } => Some((conn, authorization, version)),
        _ => None,
    })
    .await;
    assert_eq!(
        version.as_deref(),
        Some(kpulse_wire::stream::VERSION.to_string().as_str())
    );
    match next(rx).await {
        Event::Message {
            conn: c,
            message: AgentMessage::Hello(h),
        } if c == conn => {
            assert_eq!(h.node_name, NODE);
            assert_eq!(h.version, VERSION);
            assert!(h.agent.starts_with("kpulse-agent "), "{}", h.agent);
        }
        other => panic!("expected Hello, got {other:?}"),
    }
    match next(rx).await {
        Event::Message {
            conn: c,
            message: AgentMessage::Snapshot(s),
        } if c == conn => (conn, auth, s),
        other => panic!("expected Snapshot, got {other:?}"),
    }
}

async fn update(rx: &mut mpsc::Receiver<Event>, conn: usize) -> Update {
    until(rx, |e| match e {
        Event::Message {
            conn: c,
            message: AgentMessage::Update(u),
        } if c == conn => Some(u),
        Event::Message { message, .. } if !matches!(message, AgentMessage::Update(_)) => {
            panic!("unexpected {message:?}")
        }
        _ => None,
    })
    .await
}

fn app_cpu(counters: &[kpulse_wire::stream::PodCounters]) -> Option<u64> {
    let pod = counters.iter().find(|p| p.uid == POD_UID)?;
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    assert_eq!(c.name, "app");
    assert!(c.cgroup_id.is_some());
    Some(c.cpu.0)
}

fn write_pods(path: &Path, cgroup: &str, pods: bool, version: &str) {
    let json = if pods {
        serde_json::json!({"pods": [{
            "uid": POD_UID, "namespace": "demo", "name": "web",
            "labels": {"app": "web", "version": version},
            "containers": [{"name": "app", "cgroup": cgroup}],
        }]})
    } else {
        serde_json::json!({"pods": []})
    };
    // Write then rename: the agent never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json.to_string()).expect("write pods file");
    std::fs::rename(&tmp, path).expect("rename pods file");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn metrics(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("metrics request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("metrics response");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Root, or a reason to skip (a failure in CI).
fn preflight(test: &str) -> bool {
    if common::is_root() {
        return true;
    }
    assert!(!common::in_ci(), "{test}: needs root in CI");
    println!("{test}: SKIPPED: needs root (creates cgroups)");
    false
}

struct Setup {
    dir: PathBuf,
    /// Removed (with the busy loop) on drop.
    _cgroups: TestCgroups,
    cgroup: String,
    root: String,
    pods_file: PathBuf,
    pki: Pki,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(name: &str) -> Setup {
    let layout = Layout::detect().expect("cgroup layout");
    let parent = format!("kpulse-{name}-{}", std::process::id());
    let mut cgroups = TestCgroups::create(&layout, &parent, &["app"]);
    let busy = Command::new("/bin/sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("busy loop");
    cgroups.adopt(busy, "app");
    let dir = std::env::temp_dir().join(&parent);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cgroup = format!("/{parent}/app");
    let pods_file = dir.join("pods.json");
    write_pods(&pods_file, &cgroup, true, "1");
    let pki = pki(&dir);
    Setup {
        dir,
        _cgroups: cgroups,
        cgroup,
        root: format!("/{parent}"),
        pods_file,
        pki,
    }
}

fn agent_args(s: &Setup, port: u16, collector: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--node-name",
        NODE,
        "--server",
        &format!("127.0.0.1:{port}"),
        "--server-name",
        "localhost",
        "--collector",
        collector,
        "--cgroup-root",
        &s.root,
        "--resolution",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push("--pods-file".into());
    a.push(s.pods_file.display().to_string());
    a.push("--server-ca-file".into());
    a.push(s.pki.ca_file.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_streams_to_the_aggregator() {
    if !preflight("agent_streams_to_the_aggregator") {
        return;
    }
    let s = setup("stream");
    let token_file = s.dir.join("token");
    std::fs::write(&token_file, "s3cret-token-one\n").expect("token");
    let metrics_port = free_port();
    let (tx, mut rx) = mpsc::channel(256);
    let server = Server::start(
        "127.0.0.1:0".parse().expect("addr"),
        &s.pki,
        Mode::Accept,
        tx.clone(),
    )
    .await;
    let addr = server.addr;
    let mut agent = Agent::start(&agent_args(
        &s,
        addr.port(),
        "cgroupfs",
        &[
            "--token-file",
            &token_file.display().to_string(),
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
        ],
    ));

    // Hello, then the Snapshot: the node and the test pod with its container's counters.
    let (conn, auth, snap) = new_stream(&mut rx).await;
    assert_eq!(auth.as_deref(), Some("Bearer s3cret-token-one"));
    assert!(snap.node.cpu.0 > 0 && snap.node.memory_working_set.0 > 0);
    assert!(snap.node.started_at.is_some());
    assert_eq!(snap.pods.len(), 1);
    assert_eq!(snap.pods[0].uid, POD_UID);
    assert_eq!(snap.pods[0].labels["version"], "1");
    let mut last = app_cpu(&snap.counters).expect("the test pod measured");

    // Updates about every second, the busy loop's CPU time growing.
    let mut times = Vec::new();
    for _ in 0..3 {
        let u = update(&mut rx, conn).await;
        times.push(Instant::now());
        assert!(u.upserts.is_empty() && u.removed.is_empty());
        let cpu = app_cpu(&u.counters).expect("the test pod measured");
        assert!(
            cpu > last + 100_000_000,
            "busy loop CPU should grow by >0.1 s per tick: {last} -> {cpu}"
        );
        last = cpu;
    }
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap > Duration::from_millis(500) && gap < Duration::from_millis(1500),
            "updates {gap:?} apart"
        );
    }

    // A label change is an upsert.
    write_pods(&s.pods_file, &s.cgroup, true, "2");
    let u = until(&mut rx, |e| match e {
        Event::Message {
            message: AgentMessage::Update(u),
            ..
        } if !u.upserts.is_empty() => Some(u),
        _ => None,
    })
    .await;
    assert_eq!(u.upserts[0].labels["version"], "2");

    // The token rotates; the server restarts: a new stream, a fresh Snapshot, the new token.
    std::fs::write(&token_file, "s3cret-token-two").expect("token");
    drop(server);
    let restarted = Instant::now();
    let server = Server::start(addr, &s.pki, Mode::Accept, tx.clone()).await;
    let (conn2, auth, snap) = new_stream(&mut rx).await;
    let reconnect = restarted.elapsed();
    assert_ne!(conn2, conn);
    assert_eq!(auth.as_deref(), Some("Bearer s3cret-token-two"));
    assert_eq!(snap.pods[0].labels["version"], "2");
    assert!(app_cpu(&snap.counters).expect("measured") >= last);
    println!("reconnected {reconnect:?} after the server restart");
    // One more tick: by now the agent has read the Welcome.
    let _ = update(&mut rx, conn2).await;
    let m = metrics(metrics_port);
    assert!(metric(&m, "kpulse_agent_reconnects_total{") >= 1.0, "{m}");
    assert!(
        metric(&m, "kpulse_agent_stream_errors_total{") >= 1.0,
        "{m}"
    );
    assert_eq!(metric(&m, "kpulse_agent_streams_up "), 1.0, "{m}");
    assert_eq!(metric(&m, "kpulse_agent_unattributed_cgroups "), 0.0, "{m}");
    assert!(metric(&m, "kpulse_agent_collection_duration_seconds_count") >= 4.0);

    // The pod leaves the file: removed, and its counters stop.
    write_pods(&s.pods_file, &s.cgroup, false, "2");
    let u = until(&mut rx, |e| match e {
        Event::Message {
            message: AgentMessage::Update(u),
            ..
        } if !u.removed.is_empty() => Some(u),
        _ => None,
    })
    .await;
    assert_eq!(u.removed, [POD_UID]);
    assert!(app_cpu(&u.counters).is_none());
    let u = update(&mut rx, conn2).await;
    assert!(u.removed.is_empty() && u.counters.is_empty());

    // An identity refusal: one clear ERROR with the server's message, however many retries.
    drop(server);
    let refusal = "node test-node: identity system:serviceaccount:kube-system:other is not allowed";
    let server = Server::start(
        addr,
        &s.pki,
        Mode::Refuse {
            status: StatusCode::FORBIDDEN,
            message: refusal.into(),
            version: Some("1.0"),
        },
        tx.clone(),
    )
    .await;
    let line = agent
        .wait_line(&[
            "ERROR",
            "refused the agent's identity (HTTP 403 Forbidden)",
            refusal,
        ])
        .await;
    println!("identity refusal: {line}");
    for _ in 0..2 {
        until(&mut rx, |e| {
            matches!(e, Event::Request { .. }).then_some(())
        })
        .await;
    }
    let n = agent
        .lines()
        .iter()
        .filter(|l| l.contains("refused the agent's identity"))
        .count();
    assert_eq!(n, 1, "the same refusal is logged once");

    // A version refusal names both versions.
    drop(server);
    let _server = Server::start(
        addr,
        &s.pki,
        Mode::Refuse {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "wire protocol {} is not supported (this end speaks 2.0); run matching agent and server versions",
                kpulse_wire::stream::VERSION
            ),
            version: Some("2.0"),
        },
        tx.clone(),
    )
    .await;
    let want = format!(
        "the agent speaks {}, the server 2.0",
        kpulse_wire::stream::VERSION
    );
    let line = agent.wait_line(&["ERROR", &want]).await;
    println!("version refusal: {line}");

    // SIGTERM: a clean, prompt exit. The token never reached the logs.
    let status = agent.terminate();
    assert!(status.success(), "agent exit: {status}");
    let lines = agent.lines();
    assert!(lines.iter().any(|l| l.contains("stopped")));
    assert!(
        !lines.iter().any(|l| l.contains("s3cret")),
        "a token leaked into the logs"
    );
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_streams_with_ebpf() {
    if !preflight("agent_streams_with_ebpf") {
        return;
    }
    let loadable = kpulse_agent::probe::object_bytes(None)
        .map_err(|e| e.to_string())
        .and_then(|b| kpulse_agent::probe::CgroupIter::load(&b, 64).map_err(|e| e.to_string()));
    if let Err(reason) = loadable {
        assert!(!common::in_ci(), "eBPF must load in CI: {reason}");
        println!("agent_streams_with_ebpf: SKIPPED: {reason}");
        return;
    }
    let s = setup("ebpf");
    let (tx, mut rx) = mpsc::channel(256);
    let server = Server::start(
        "127.0.0.1:0".parse().expect("addr"),
        &s.pki,
        Mode::Accept,
        tx,
    )
    .await;
    let agent = Agent::start(&agent_args(
        &s,
        server.addr.port(),
        "ebpf",
        &["--metrics-bind-address", ""],
    ));
    let (conn, auth, snap) = new_stream(&mut rx).await;
    assert_eq!(auth, None);
    let mut last = app_cpu(&snap.counters).expect("the test pod measured");
    for _ in 0..2 {
        let cpu = app_cpu(&update(&mut rx, conn).await.counters).expect("measured");
        assert!(cpu > last + 100_000_000, "{last} -> {cpu}");
        last = cpu;
    }
    agent
        .wait_line(&["collector ready", "collector=ebpf"])
        .await;
    drop(agent);
    drop(s);
}

/// The shipping library as a load generator uses it: many simulated nodes in one process,
/// each its own [`Shipper`], sharing one TLS configuration and one set of metrics, their
/// replicas found through a DNS name (`localhost` stands in for a headless Service).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_shippers_in_one_process() {
    use kpulse_agent::{
        attribute::PodSet,
        ship::{self, Credentials, Replicas, ShipConfig, ShipMetrics, Shipper, Tick},
    };
    use kpulse_wire::{Bytes as Mem, CpuNanos, NodeSample, UnixNanos};

    const NODES: usize = 200;
    let dir = std::env::temp_dir().join(format!("kpulse-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pki = pki(&dir);
    let (tx, mut rx) = mpsc::channel(1024);
    let server = Server::start("127.0.0.1:0".parse().expect("addr"), &pki, Mode::Accept, tx).await;
    let tls = ship::tls::client_config(&ship::tls::TlsOptions {
        ca_file: Some(pki.ca_file.clone()),
        ..Default::default()
    })
    .expect("tls");
    let metrics = Arc::new(ShipMetrics::default());
    let started = Instant::now();
    let shippers: Vec<Shipper> = (0..NODES)
        .map(|i| {
            let mut c = ShipConfig::new(
                Replicas::Service {
                    host: "localhost".into(),
                    port: server.addr.port(),
                },
                tls.clone(),
            );
            c.credentials = Credentials::Token(format!("token-{i}").into());
            c.metrics = metrics.clone();
            Shipper::spawn(c, ship::hello(&format!("sim-{i}"), "loadgen"))
        })
        .collect();
    let pods = Arc::new(PodSet::default());
    let tick = |n: u64| Tick {
        node: NodeSample {
            timestamp: UnixNanos(n),
            started_at: Some(UnixNanos(1)),
            cpu: CpuNanos(n),
            memory_working_set: Mem(1),
            swap: None,
        },
        pods: pods.clone(),
        counters: vec![],
    };
    for s in &shippers {
        s.publish(tick(1));
    }
    let mut hellos = std::collections::HashSet::new();
    let mut snapshots = 0;
    while snapshots < NODES {
        match next(&mut rx).await {
            Event::Message {
                message: AgentMessage::Hello(h),
                ..
            } => {
                assert!(hellos.insert(h.node_name), "one stream per node");
            }
            Event::Message {
                message: AgentMessage::Snapshot(s),
                ..
            } => {
                assert_eq!(s.node.cpu, CpuNanos(1));
                snapshots += 1;
            }
            _ => {}
        }
    }
    let connected = started.elapsed();
    for s in &shippers {
        s.publish(tick(2));
    }
    let mut updates = 0;
    while updates < NODES {
        if let Event::Message {
            message: AgentMessage::Update(u),
            ..
        } = next(&mut rx).await
        {
            assert_eq!(u.node.cpu, CpuNanos(2));
            updates += 1;
        }
    }
    println!(
        "{NODES} simulated agents: all streams up after {connected:?}, one tick each delivered after {:?}",
        started.elapsed()
    );
    let deadline = Instant::now() + TIMEOUT;
    while metrics.streams_up() != i64::try_from(NODES).expect("fits") {
        assert!(
            Instant::now() < deadline,
            "streams_up {}",
            metrics.streams_up()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let label = server.addr.to_string();
    assert_eq!(metrics.dropped(&label), 0);
    let stop = Instant::now();
    for s in shippers {
        s.shutdown(Duration::from_secs(5)).await;
    }
    assert_eq!(metrics.streams_up(), 0);
    println!("{NODES} shippers shut down in {:?}", stop.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
