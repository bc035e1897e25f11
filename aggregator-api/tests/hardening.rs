//! Hardening, end to end: the server binary on loopback (with a Kubernetes API double),
//! attacked the ways issue 6 lists — forged front-proxy headers, certificates that must
//! not authenticate, odd names and encodings, malformed and oversized agent frames,
//! oversized requests, too many connections, stuck watchers, secrets in logs, and the
//! Kubernetes API going away.
//!
//! Timing limits (slow headers and bodies, idle connections, trickled frames) are tested
//! with short timeouts next to the code (`serve.rs`, `ingest.rs`); here the binary runs with
//! its defaults except where a flag says otherwise.

mod common;
use common::AcceptAny;

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kpulse_testkit::review_api::{ReviewApi, AGENT};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

const V1B1: &str = "/apis/metrics.k8s.io/v1beta1";

// ---------------------------------------------------------------------------------------
// Certificates.

/// A CA issuing client certificates (rcgen).
struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A client certificate and its key.
struct Identity {
    cert: CertificateDer<'static>,
    cert_pem: String,
    key_der: Vec<u8>,
    key_pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = p.self_signed(&key).expect("self-signed");
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    /// A client certificate for `cn` (in `org`), valid now or expired years ago.
    fn client(&self, cn: &str, org: Option<&str>, expired: bool) -> Identity {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, o);
        }
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        Identity {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key_der: key.serialize_der(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A serving certificate for `localhost` and 127.0.0.1: (certificate PEM, key PEM).
    fn server(&self) -> (String, String) {
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
                127, 0, 0, 1,
            ])));
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    fn write(&self, path: &Path) -> String {
        std::fs::write(path, &self.pem).expect("CA file");
        path.to_str().expect("utf8").to_string()
    }
}

// ---------------------------------------------------------------------------------------
// The server.

struct Server {
    child: Child,
    port: u16,
    ingest_port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    /// The server's stderr so far.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's resident set size and its peak, in KiB.
    fn memory_kib(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from {status}"))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kpulse-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir
}

/// Starts the server in `dir` with `args` (after loopback ports and a certificate
/// directory), `env` added; stderr goes to `dir/server.log`.
fn start_server(dir: PathBuf, args: &[String], env: &[(&str, &str)]) -> Server {
    launch(
        dir,
        Command::new(env!("CARGO_BIN_EXE_kpulse-aggregator-api")),
        args,
        env,
    )
}

/// [`start_server`] with the soft open-file limit at `soft` (a container of containerd 2
/// starts at 1,024), the hard one inherited.
fn start_server_with_soft_nofile(dir: PathBuf, args: &[String], soft: u64) -> Server {
    start_server_with_nofile(dir, args, soft, None)
}

/// [`start_server`] with the soft open-file limit at `soft` and the hard one lowered to
/// `hard` (lowering needs no privilege).
fn start_server_with_nofile(dir: PathBuf, args: &[String], soft: u64, hard: Option<u64>) -> Server {
    // The soft limit first: a hard one below the soft one in force is refused.
    let hard = hard.map_or(String::new(), |h| format!(" && ulimit -Hn {h}"));
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        &format!("ulimit -Sn {soft}{hard} && exec \"$@\""),
        "server",
    ])
    .arg(env!("CARGO_BIN_EXE_kpulse-aggregator-api"));
    launch(dir, cmd, args, &[])
}

/// Starts `cmd` (the server, or what execs it) as [`start_server`] says.
fn launch(dir: PathBuf, mut cmd: Command, args: &[String], env: &[(&str, &str)]) -> Server {
    let (port, ingest_port) = (free_port(), free_port());
    let log = dir.join("server.log");
    // The API double answers reviews but publishes no service account issuer keys and no
    // agent pods: a server verifying agents' tokens itself would keep its agents' port
    // closed for ingest::PORT_WAIT waiting for them. Reviews, unless a test says otherwise.
    if !args
        .iter()
        .any(|a| a.starts_with("--agent-token-verification"))
    {
        cmd.arg("--agent-token-verification=review");
    }
    let child = cmd
        .args(["--bind-address", "127.0.0.1", "--secure-port"])
        .arg(port.to_string())
        .arg("--ingest-port")
        .arg(ingest_port.to_string())
        .arg("--cert-dir")
        .arg(dir.join("certs"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start server");
    let s = Server {
        child,
        port,
        ingest_port,
        dir,
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    for p in [port, ingest_port] {
        while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
            assert!(
                Instant::now() < deadline,
                "server did not listen on {p}:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    s
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

// ---------------------------------------------------------------------------------------
// A client: one request per connection, HTTP/1.1 or HTTP/2, with an optional client
// certificate, from any loopback address.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    H1,
    H2,
}

fn client_config(identity: Option<&Identity>, proto: Proto) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)));
    let mut cfg = match identity {
        Some(id) => builder
            .with_client_auth_cert(
                vec![id.cert.clone()],
                PrivateKeyDer::try_from(id.key_der.clone()).expect("key"),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![match proto {
        Proto::H1 => b"http/1.1".to_vec(),
        Proto::H2 => b"h2".to_vec(),
    }];
    Arc::new(cfg)
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect_from(
    port: u16,
    from: [u8; 4],
    identity: Option<&Identity>,
    proto: Proto,
) -> std::io::Result<Tls> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((from, 0)))?;
    let tcp = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    tokio_rustls::TlsConnector::from(client_config(identity, proto))
        .connect(name, tcp)
        .await
}

/// A response, read whole.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text()))
    }

    /// A `Status` object with this code and reason; its message.
    fn status_object(&self, code: u16, reason: &str) -> String {
        assert_eq!(self.status.as_u16(), code, "{}", self.text());
        let v = self.json();
        assert_eq!(
            (
                v["kind"].as_str(),
                v["apiVersion"].as_str(),
                v["status"].as_str()
            ),
            (Some("Status"), Some("v1"), Some("Failure")),
            "{v}"
        );
        assert_eq!(v["code"], code, "{v}");
        assert_eq!(v["reason"], reason, "{v}");
        v["message"].as_str().unwrap_or_default().to_string()
    }
}

/// One request on a new connection; `Err` when the connection or the request failed.
async fn call_from(
    port: u16,
    from: [u8; 4],
    identity: Option<&Identity>,
    proto: Proto,
    req: Request<Full<Bytes>>,
) -> Result<Answer, String> {
    let tls = connect_from(port, from, identity, proto)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let response = match proto {
        Proto::H1 => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            send.send_request(req).await
        }
        Proto::H2 => {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            send.send_request(req).await
        }
    }
    .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .map_err(|_| "body timed out".to_string())?
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Answer {
        status,
        headers,
        body,
    })
}

async fn call(
    port: u16,
    identity: Option<&Identity>,
    proto: Proto,
    req: Request<Full<Bytes>>,
) -> Answer {
    call_from(port, [127, 0, 0, 1], identity, proto, req)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A GET of `path` (origin form for HTTP/1.1, absolute for HTTP/2) with `headers`.
fn get(proto: Proto, path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    request(proto, "GET", path, headers, Bytes::new())
}

fn request(
    proto: Proto,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let uri = match proto {
        Proto::H1 => path.to_string(),
        Proto::H2 => format!("https://localhost{path}"),
    };
    let mut b = Request::builder().method(method).uri(uri);
    if proto == Proto::H1 {
        b = b.header(http::header::HOST, "localhost");
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body)).expect("request")
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

// ---------------------------------------------------------------------------------------
// Data: a feed file the server follows (node-a with `pods` pods in namespace demo, one
// container each, new counters every `every`).

struct Feeder {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    fn start(path: PathBuf, pods: usize, every: Duration) -> Feeder {
        Feeder::start_with_blob(path, pods, 0, every)
    }

    /// Each pod with a label `blob` of `blob` bytes besides `app=demo` (0: none).
    fn start_with_blob(path: PathBuf, pods: usize, blob: usize, every: Duration) -> Feeder {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut f = std::fs::File::create(&path).expect("feed file");
            let hello = json!({"hello": {"version": {"major": 1, "minor": 0},
                "node_name": "node-a", "node_labels": {"zone": "z1"}, "agent": "feeder"}});
            writeln!(f, "{hello}").expect("write");
            let meta: Vec<Value> = (0..pods)
                .map(|i| {
                    let mut l = serde_json::Map::new();
                    l.insert("app".into(), json!("demo"));
                    if blob > 0 {
                        l.insert("blob".into(), json!("v".repeat(blob)));
                    }
                    json!({"uid": format!("u-{i}"), "namespace": "demo",
                        "name": if i == 0 { "web".to_string() } else { format!("pod-{i}") },
                        "labels": l})
                })
                .collect();
            let nanos = || {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as u64
            };
            let start = nanos();
            let boot = start - 3_600_000_000_000;
            let mut first = true;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let now = nanos();
                // CPU since `started_at`, when the counters were zero, so that a rate over
                // any window (a young series' whole life, with the adaptive window) is exact.
                let t = now - (start - 1_000_000_000);
                let counters: Vec<Value> = (0..pods)
                    .map(|i| {
                        json!({"uid": format!("u-{i}"), "containers": [{"name": "app",
                            "timestamp": now, "cpu": t / 10 + i as u64,
                            "memory_working_set": (64u64 << 20) + i as u64,
                            "started_at": start - 1_000_000_000}]})
                    })
                    .collect();
                let node = json!({"timestamp": now, "started_at": boot,
                    "cpu": (now - boot) / 4, "memory_working_set": 3u64 << 30});
                let message = if first {
                    json!({"snapshot": {"sent_at": now, "node": node, "pods": meta,
                        "counters": counters}})
                } else {
                    json!({"update": {"sent_at": now, "node": node, "counters": counters}})
                };
                first = false;
                writeln!(f, "{message}").expect("write");
                f.flush().expect("flush");
                std::thread::sleep(every);
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

/// Waits until `path` answers 200 for `token`.
async fn wait_for(port: u16, path: &str, token: &str) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = call(
            port,
            None,
            Proto::H2,
            get(Proto::H2, path, &[("authorization", &bearer(token))]),
        )
        .await;
        if a.status == StatusCode::OK {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: {} {}",
            a.status,
            a.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sample of the server's own metrics (`/metrics`, as `tester`).
async fn self_metric(port: u16, name: &str) -> f64 {
    let a = wait_for(port, "/metrics", "kpulse-test").await;
    a.text()
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

// ---------------------------------------------------------------------------------------
// Security checks.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_front_proxy_names_users_and_bad_certificates_do_not_authenticate() {
    let dir = temp_dir("authn");
    let api = ReviewApi::standard();
    let proxy_ca = Ca::new("front-proxy-ca");
    let client_ca = Ca::new("client-ca");
    let stranger = Ca::new("stranger-ca");
    let args = strings(&[
        "--authentication-skip-lookup",
        "--requestheader-client-ca-file",
        &proxy_ca.write(&dir.join("proxy-ca.crt")),
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--client-ca-file",
        &client_ca.write(&dir.join("client-ca.crt")),
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server(dir, &args, &[]);
    let nodes = format!("{V1B1}/nodes");
    let as_tester = [("x-remote-user", "tester"), ("x-remote-group", "dev")];

    // The front proxy with its certificate names the user, over either protocol.
    let proxy = proxy_ca.client("front-proxy-client", None, false);
    for proto in [Proto::H1, Proto::H2] {
        let a = call(s.port, Some(&proxy), proto, get(proto, &nodes, &as_tester)).await;
        assert_eq!(a.status, StatusCode::OK, "{proto:?}: {}", a.text());
        assert_eq!(a.json()["kind"], "NodeMetricsList");
    }
    assert_eq!(api.reviewed_users(), ["tester"], "one review, then cached");

    // The same headers without the proxy's certificate never make `tester`.
    // No credentials at all: 401.
    for proto in [Proto::H1, Proto::H2] {
        let a = call(s.port, None, proto, get(proto, &nodes, &as_tester)).await;
        assert_eq!(a.status_object(401, "Unauthorized"), "Unauthorized");
    }
    // A certificate from the client CA: its own user, whom the review then denies.
    let jane = client_ca.client("jane", Some("dev"), false);
    let a = call(
        s.port,
        Some(&jane),
        Proto::H2,
        get(Proto::H2, &nodes, &as_tester),
    )
    .await;
    let message = a.status_object(403, "Forbidden");
    assert!(
        message.contains(r#"User "jane""#) && !message.contains("tester"),
        "{message}"
    );
    // A bearer token: its own user.
    let a = call(
        s.port,
        None,
        Proto::H2,
        get(
            Proto::H2,
            &nodes,
            &[
                ("x-remote-user", "tester"),
                ("authorization", &bearer("denied-token")),
            ],
        ),
    )
    .await;
    let message = a.status_object(403, "Forbidden");
    assert!(message.contains(r#"User "nobody""#), "{message}");

    // Certificates that do not authenticate at all: 401, whatever the headers say.
    for (what, id) in [
        (
            "a front-proxy certificate whose CN is not allowed",
            proxy_ca.client("evil-proxy", None, false),
        ),
        (
            "an expired front-proxy certificate",
            proxy_ca.client("front-proxy-client", None, true),
        ),
        (
            "an expired client certificate",
            client_ca.client("tester", Some("dev"), true),
        ),
        (
            "a proxy certificate from another CA",
            stranger.client("front-proxy-client", None, false),
        ),
        (
            "a client certificate from another CA",
            stranger.client("tester", Some("dev"), false),
        ),
    ] {
        for proto in [Proto::H1, Proto::H2] {
            let a = call(s.port, Some(&id), proto, get(proto, &nodes, &as_tester)).await;
            assert_eq!(a.status.as_u16(), 401, "{what} ({proto:?}): {}", a.text());
            a.status_object(401, "Unauthorized");
        }
    }
    assert_eq!(
        api.reviewed_users(),
        ["tester", "jane", "nobody"],
        "only the proxy's user was ever `tester`"
    );
    // Why is in the server's log (never in the answer).
    let log = s.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_and_encodings_get_the_apiservers_answers() {
    let dir = temp_dir("names");
    let api = ReviewApi::standard();
    let feed = dir.join("feed.jsonl");
    let _feeder = Feeder::start(feed.clone(), 3, Duration::from_millis(200));
    let args = strings(&[
        "--authentication-skip-lookup",
        "--feed-file",
        feed.to_str().expect("utf8"),
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server(dir, &args, &[]);
    let web = format!("{V1B1}/namespaces/demo/pods/web");
    let a = wait_for(s.port, &web, "kpulse-test").await;
    assert_eq!(a.json()["kind"], "PodMetrics");

    let route = "the server could not find the requested resource";
    let long = "a".repeat(254);
    let pod = |name: &str| format!("pods \"{name}\" not found");
    let node = |name: &str| format!("node \"{name}\" not found");
    // (path, message of the 404 Status), as the apiserver routes and metrics-server's
    // listers answer (see api/request.rs for the Go code each follows).
    let cases: Vec<(String, String)> = vec![
        (format!("{V1B1}/namespaces/..%2f../pods/x"), route.into()),
        (
            format!("{V1B1}/namespaces/demo/pods/..%2f..%2fnodes%2fnode-a"),
            route.into(),
        ),
        (format!("{V1B1}/namespaces/demo/pods/a%2Fb"), route.into()),
        (format!("{V1B1}/namespaces/demo/pods/web/x"), route.into()),
        (format!("{V1B1}/namespaces/demo/pods/./web"), route.into()),
        (format!("{V1B1}/namespaces/demo/./pods/web"), route.into()),
        (format!("{V1B1}/../../api/v1/nodes"), route.into()),
        (format!("{V1B1}/namespaces/demo/pods/%2e%2e"), pod("..")),
        (format!("{V1B1}/namespaces/%2e%2e/pods/web"), pod("web")),
        (
            format!("{V1B1}/namespaces/demo/pods/web%252f"),
            pod("web%2f"),
        ),
        (format!("{V1B1}/namespaces/demo%252f/pods/web"), pod("web")),
        (
            format!("{V1B1}/namespaces/demo/pods/web%00"),
            pod("web\\x00"),
        ),
        (
            format!("{V1B1}/namespaces/demo/pods/%c0%ae%c0%ae"),
            pod("\u{fffd}\u{fffd}\u{fffd}\u{fffd}"),
        ),
        (
            format!("{V1B1}/nodes/%c0%ae%c0%ae"),
            node("\u{fffd}\u{fffd}\u{fffd}\u{fffd}"),
        ),
        (format!("{V1B1}/namespaces/demo/pods/{long}"), pod(&long)),
        (format!("{V1B1}/nodes/{long}"), node(&long)),
        (format!("{V1B1}/namespaces/demo/pods/WEB"), pod("WEB")),
        (format!("{V1B1}/nodes/NODE-A"), node("NODE-A")),
        (format!("{V1B1}/namespaces/demo/pods/web;x"), pod("web;x")),
    ];
    let auth = bearer("kpulse-test");
    for (path, message) in &cases {
        for proto in [Proto::H1, Proto::H2] {
            let a = call(
                s.port,
                None,
                proto,
                get(proto, path, &[("authorization", &auth)]),
            )
            .await;
            assert_eq!(
                &a.status_object(404, "NotFound"),
                message,
                "{path} ({proto:?})"
            );
            // In protobuf when asked for (kubectl top asks so): the same Status.
            let a = call(
                s.port,
                None,
                proto,
                get(
                    proto,
                    path,
                    &[
                        ("authorization", &auth),
                        ("accept", "application/vnd.kubernetes.protobuf"),
                    ],
                ),
            )
            .await;
            assert_eq!(a.status.as_u16(), 404, "{path} ({proto:?})");
            assert_eq!(
                a.headers["content-type"], "application/vnd.kubernetes.protobuf",
                "{path}"
            );
            assert!(
                a.body.starts_with(b"k8s\0")
                    && a.body.windows(6).any(|w| w == b"Status")
                    && a.body.windows(8).any(|w| w == b"NotFound"),
                "{path}: {:?}",
                a.body
            );
        }
    }
    // An invalid escape: Go's HTTP server's plain 400, before any routing.
    for proto in [Proto::H1, Proto::H2] {
        let a = call(
            s.port,
            None,
            proto,
            get(
                proto,
                &format!("{V1B1}/namespaces/demo/pods/%zz"),
                &[("authorization", &auth)],
            ),
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.text().as_str()),
            (400, "400 Bad Request")
        );
    }
    // Bodies: a GET's is ignored, as the apiserver does (JSON, protobuf or garbage); other
    // methods are not allowed on metrics.
    for (content_type, body) in [
        ("application/json", Bytes::from_static(b"{\"kind\":\"Pod\"")),
        (
            "application/vnd.kubernetes.protobuf",
            Bytes::from_static(b"k8s\0\x0a\xff\xff\xff\xff\x0f"),
        ),
        ("application/octet-stream", Bytes::from(vec![0xffu8; 4096])),
    ] {
        for proto in [Proto::H1, Proto::H2] {
            let headers = [
                ("authorization", auth.as_str()),
                ("content-type", content_type),
            ];
            let a = call(
                s.port,
                None,
                proto,
                request(proto, "GET", &web, &headers, body.clone()),
            )
            .await;
            assert_eq!(a.status, StatusCode::OK, "{content_type}: {}", a.text());
            assert_eq!(a.json()["kind"], "PodMetrics");
            for method in ["POST", "PUT", "PATCH", "DELETE"] {
                let a = call(
                    s.port,
                    None,
                    proto,
                    request(proto, method, &web, &headers, body.clone()),
                )
                .await;
                a.status_object(405, "MethodNotAllowed");
            }
        }
    }
    let log = s.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

// ---------------------------------------------------------------------------------------
// The agents' port: malformed and oversized frames.

/// A frame of `payload` behind its 4-byte big-endian length.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(payload.len())
        .expect("len")
        .to_be_bytes()
        .to_vec();
    f.extend_from_slice(payload);
    f
}

fn hello_frame(node: &str, labels: &BTreeMap<String, String>) -> Vec<u8> {
    frame(
        json!({"hello": {"version": {"major": 1, "minor": 0}, "node_name": node,
            "node_labels": labels, "agent": "hardening"}})
        .to_string()
        .as_bytes(),
    )
}

/// POSTs `body` whole to the agents' stream path with node-a's token; the answer.
async fn ingest_post(port: u16, body: Vec<u8>) -> Answer {
    call(
        port,
        None,
        Proto::H2,
        request(
            Proto::H2,
            "POST",
            kpulse_wire::stream::STREAM_PATH,
            &[
                (kpulse_wire::stream::VERSION_HEADER, "1.0"),
                ("authorization", &bearer("node-a-token")),
            ],
            Bytes::from(body),
        ),
    )
    .await
}

/// The server messages in a stream's response body.
fn server_messages(body: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = body;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(payload) = rest.get(4..4 + len) else {
            break;
        };
        out.push(serde_json::from_slice(payload).expect("a ServerMessage"));
        rest = &rest[4 + len..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_agent_frames_are_refused() {
    let dir = temp_dir("frames");
    let api = ReviewApi::standard();
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server(dir, &args, &[]);
    let labels = BTreeMap::from([("zone".to_string(), "z1".to_string())]);
    let refused = |a: &Answer| -> String {
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
        a.json()["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("an Error message: {}", a.text()))
            .to_string()
    };

    // Before the stream: the first frame must be a readable Hello within its limit.
    let garbage = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n".to_vec();
    let m = refused(&ingest_post(s.ingest_port, garbage).await);
    assert!(m.contains("over the 4194304-byte limit"), "{m}");
    let m = refused(&ingest_post(s.ingest_port, frame(b"{\"hello\": 5")).await);
    assert!(m.starts_with("cannot read the Hello:"), "{m}");
    let m = refused(&ingest_post(s.ingest_port, frame(b"\xff\xfe\x00")).await);
    assert!(m.starts_with("cannot read the Hello:"), "{m}");
    let m = refused(&ingest_post(s.ingest_port, frame(b"{\"update\": {}}")).await);
    assert!(
        m.starts_with("cannot read the Hello:") || m.contains("must be a Hello"),
        "{m}"
    );
    let big = BTreeMap::from([("big".to_string(), "x".repeat(70 << 10))]);
    let m = refused(&ingest_post(s.ingest_port, hello_frame("node-a", &big)).await);
    assert_eq!(m, "the Hello is over 65536 bytes");
    let m = refused(&ingest_post(s.ingest_port, hello_frame("../etc", &labels)).await);
    assert!(m.contains("../etc"), "{m}");
    let m = refused(&ingest_post(s.ingest_port, hello_frame("NODE-A", &labels)).await);
    assert!(m.contains("NODE-A"), "{m}");

    // After the Hello: the stream is welcomed, then ended with the reason.
    for (what, after, reason) in [
        (
            "a frame announcing 4 MiB + 1",
            ((4u32 << 20) + 1).to_be_bytes().to_vec(),
            "frame of 4194305 bytes is over the 4194304-byte limit",
        ),
        (
            "malformed JSON",
            frame(b"{\"update\": {\"sent_at\": \"x\""),
            "malformed",
        ),
        ("garbage", frame(&[0xff; 64]), "malformed"),
    ] {
        let mut body = hello_frame("node-a", &labels);
        body.extend(after);
        let a = ingest_post(s.ingest_port, body).await;
        assert_eq!(a.status, StatusCode::OK, "{what}: {}", a.text());
        let messages = server_messages(&a.body);
        assert_eq!(messages.len(), 2, "{what}: {messages:?}");
        assert!(messages[0]["welcome"].is_object(), "{what}: {messages:?}");
        let message = messages[1]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.to_lowercase().contains(reason), "{what}: {message}");
    }
    let log = s.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

// ---------------------------------------------------------------------------------------
// Limits of the binary, with its defaults and flags.

/// The server's log once `ready` holds for it, within 10 s (the log as it is then, for the
/// assertions that follow, if not).
async fn log_once(s: &Server, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = s.log_text();
        if ready(&log) || Instant::now() > deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `Max open files` of `/proc/<pid>/limits`: (soft, hard).
fn open_file_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{line}");
    (numbers[0], numbers[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_and_bounds_the_agent_streams() {
    let (_, hard) = open_file_limits(std::process::id());
    assert!(
        hard > 2048,
        "this test needs a hard open-file limit above 2,048 (it is {hard})"
    );
    let dir = temp_dir("nofile");
    let api = ReviewApi::standard();
    // More streams than any open-file limit leaves room for.
    let asked = hard + 10_000;
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
        "--max-agent-streams",
        &asked.to_string(),
    ]);
    let s = start_server_with_soft_nofile(dir, &args, 1024);
    // Raised before the ports are bound.
    assert_eq!(open_file_limits(s.child.id()), (hard, hard));
    let streams = hard - 1408 - 64;
    let log = log_once(&s, |l| l.contains("fewer agent streams")).await;
    assert!(
        log.contains("open-file limit raised to the hard limit")
            && log.contains("inherited=1024")
            && log.contains(&format!("now={hard}")),
        "{log}"
    );
    assert!(
        log.contains("fewer agent streams than --max-agent-streams")
            && log.contains(&format!("max_agent_streams={asked}"))
            && log.contains(&format!("streams={streams}")),
        "{log}"
    );
    drop(s);

    // The default is above any cluster: bounded by the limit, said without a warning.
    let dir = temp_dir("nofile-default");
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server_with_soft_nofile(dir, &args, 1024);
    let log = log_once(&s, |l| {
        l.contains("serving agents' streams") && l.contains("kubelet fallback")
    })
    .await;
    if streams >= 10_000 {
        assert!(!log.contains("fewer agent streams"), "{log}");
    }
    if hard < 150_000 + 1408 + 64 && streams >= 10_000 {
        assert!(
            log.contains("agent streams bounded by the open-file limit")
                && log.contains(&format!("streams={streams}")),
            "{log}"
        );
    }
    drop(s);

    // A hard limit that leaves room for few streams is a warning, even at the default.
    let dir = temp_dir("nofile-small");
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server_with_nofile(dir, &args, 1024, Some(4096));
    assert_eq!(open_file_limits(s.child.id()), (4096, 4096));
    let log = log_once(&s, |l| l.contains("fewer agent streams")).await;
    assert!(
        log.contains("max_agent_streams=150000")
            && log.contains(&format!("streams={}", 4096 - 1408 - 64)),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_connection_limits_of_the_binary() {
    let dir = temp_dir("limits");
    let api = ReviewApi::standard();
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
        "--max-connections-per-ip",
        "4",
        "--http2-max-streams-per-connection",
        "2",
    ]);
    let s = start_server(dir, &args, &[]);
    let nodes = format!("{V1B1}/nodes");

    // Connections that never send a request, over either protocol: closed by the
    // server once the header timeout (10 s) is over. Timed while the rest goes on.
    let silent: Vec<_> = [Proto::H1, Proto::H2]
        .into_iter()
        .map(|proto| {
            let port = s.port;
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut tls = connect_from(port, [127, 0, 0, 3], None, proto)
                    .await
                    .expect("connect");
                let started = Instant::now();
                let mut buf = [0u8; 1024];
                let closed = tokio::time::timeout(Duration::from_secs(40), async {
                    while let Ok(n) = tls.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                })
                .await;
                (proto, closed.is_ok(), started.elapsed())
            })
        })
        .collect();

    // Bodies: 64 KiB are read (and the request goes on to authentication), one byte more
    // is 413.
    for proto in [Proto::H1, Proto::H2] {
        let a = call(
            s.port,
            None,
            proto,
            request(proto, "GET", &nodes, &[], Bytes::from(vec![b'x'; 64 << 10])),
        )
        .await;
        a.status_object(401, "Unauthorized");
        let a = call(
            s.port,
            None,
            proto,
            request(
                proto,
                "GET",
                &nodes,
                &[],
                Bytes::from(vec![b'x'; (64 << 10) + 1]),
            ),
        )
        .await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{proto:?}");
    }

    // Headers: 1 MiB in all. Below it the request is served; above it, 431.
    let value = |n: usize| "v".repeat(n);
    for proto in [Proto::H1, Proto::H2] {
        let fits = value(1000 << 10);
        let a = call(s.port, None, proto, get(proto, &nodes, &[("x-big", &fits)])).await;
        a.status_object(401, "Unauthorized");
        let over = value(1 << 20);
        let a = call(s.port, None, proto, get(proto, &nodes, &[("x-big", &over)])).await;
        assert_eq!(
            a.status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{proto:?}"
        );
    }
    // The front proxy's groups, one line each: 500 lines are fine on HTTP/1.1.
    let groups: Vec<(&str, String)> = (0..500)
        .map(|i| ("x-remote-group", format!("group-{i}")))
        .collect();
    let headers: Vec<(&str, &str)> = groups.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = call(s.port, None, Proto::H1, get(Proto::H1, &nodes, &headers)).await;
    a.status_object(401, "Unauthorized");

    // Connections per IP: four from 127.0.0.1 are served, a fifth is closed at once;
    // 127.0.0.2 is unaffected; when one of the four ends, 127.0.0.1 may connect again.
    let mut held = Vec::new();
    for _ in 0..4 {
        let tls = connect_from(s.port, [127, 0, 0, 1], None, Proto::H2)
            .await
            .expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("handshake");
        let conn = tokio::spawn(conn);
        let r = send
            .send_request(get(Proto::H2, "/livez", &[]))
            .await
            .expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
        held.push((send, conn));
    }
    let fifth = call_from(
        s.port,
        [127, 0, 0, 1],
        None,
        Proto::H2,
        get(Proto::H2, "/livez", &[]),
    )
    .await;
    assert!(
        fifth.is_err(),
        "a fifth connection from 127.0.0.1: {fifth:?}"
    );
    let other = call_from(
        s.port,
        [127, 0, 0, 2],
        None,
        Proto::H2,
        get(Proto::H2, "/livez", &[]),
    )
    .await
    .expect("127.0.0.2 is served");
    assert_eq!(other.status, StatusCode::OK);
    // The API port and the agents' port count separately.
    let ingest = call_from(
        s.ingest_port,
        [127, 0, 0, 1],
        None,
        Proto::H2,
        get(Proto::H2, "/", &[]),
    )
    .await
    .expect("the agents' port is served");
    assert_eq!(ingest.status, StatusCode::NOT_FOUND);
    let (send, conn) = held.pop().expect("held");
    drop(send);
    conn.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while call_from(
        s.port,
        [127, 0, 0, 1],
        None,
        Proto::H2,
        get(Proto::H2, "/livez", &[]),
    )
    .await
    .is_err()
    {
        assert!(Instant::now() < deadline, "the slot was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    let log = s.log_text();
    assert_eq!(
        log.matches("reached --max-connections-per-ip").count(),
        1,
        "one WARN per address reaching the limit:\n{log}"
    );

    // HTTP/2 streams per connection: two requests whose bodies never end hold both
    // streams; a third waits until one of them ends.
    let tls = connect_from(s.port, [127, 0, 0, 2], None, Proto::H2)
        .await
        .expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut bodies = Vec::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let req = Request::post(format!("https://localhost{nodes}"))
            .body(kpulse_testkit::ChannelBody(rx))
            .expect("request");
        let mut send = send.clone();
        held.push(tokio::spawn(async move { send.send_request(req).await }));
        bodies.push(tx);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third_send = send.clone();
    let third = tokio::spawn(async move {
        let req = Request::get("https://localhost/livez")
            .body(kpulse_testkit::ChannelBody(tokio::sync::mpsc::channel(1).1))
            .expect("request");
        third_send.send_request(req).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third stream was served while two were open"
    );
    bodies.pop();
    let r = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a stream ended")
        .expect("task")
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    drop(bodies);
    for h in held {
        let r = h.await.expect("task").expect("answer");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }

    for task in silent {
        let (proto, closed, took) = task.await.expect("task");
        eprintln!("a silent {proto:?} connection was closed after {took:?}");
        assert!(
            closed && took >= Duration::from_secs(9) && took < Duration::from_secs(25),
            "a silent {proto:?} connection: closed {closed} after {took:?} (limit 10 s)"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The agents' port at the start.

/// A server that verifies agents' tokens itself keeps its agents' port closed until it can
/// (the issuer's keys and the agent pods' first list, which the API double never serves),
/// then opens it anyway after ingest::PORT_WAIT (10 s), says so, and reviews the tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_port_waits_for_local_token_checks_then_opens_with_reviews() {
    let dir = temp_dir("port-wait");
    let api = ReviewApi::standard();
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
        "--agent-token-verification=local",
    ]);
    let t0 = Instant::now();
    let s = start_server(dir, &args, &[]);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(9),
        "the agents' port opened {took:?} after the start, before the server could check tokens"
    );
    let log = std::fs::read_to_string(&s.log).expect("server log");
    assert!(
        log.contains("serving agents' streams before this replica can verify their tokens itself"),
        "{log}"
    );
    // Reviewed: the agent's token goes to the API's TokenReview.
    let a = ingest_post(s.ingest_port, hello_frame("node-a", &BTreeMap::new())).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(api.reviews("tokenreviews"), 1);
}

// ---------------------------------------------------------------------------------------
// The Kubernetes API unreachable.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kubernetes_api_fails_closed_and_cached_answers_last_their_ttl() {
    const TTL: Duration = Duration::from_secs(4);
    let dir = temp_dir("outage");
    let mut api = ReviewApi::standard();
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
        "--authentication-token-webhook-cache-ttl=4s",
        "--authorization-webhook-cache-authorized-ttl=4s",
        "--authorization-webhook-cache-unauthorized-ttl=4s",
    ]);
    let s = start_server(dir, &args, &[]);
    let nodes = format!("{V1B1}/nodes");
    let pods = format!("{V1B1}/pods");
    let as_user =
        |token: &str, path: &str| get(Proto::H2, path, &[("authorization", &bearer(token))]);

    // Before the outage: reviewed and cached.
    let a = call(s.port, None, Proto::H2, as_user("kpulse-test", &nodes)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let cached_at = Instant::now();
    assert_eq!(
        (
            api.reviews("tokenreviews"),
            api.reviews("subjectaccessreviews")
        ),
        (1, 1)
    );
    api.stop();

    // Within the TTL, the cached decisions still hold.
    let a = call(s.port, None, Proto::H2, as_user("kpulse-test", &nodes)).await;
    assert!(
        cached_at.elapsed() < TTL,
        "the check took longer than the cache TTL"
    );
    assert_eq!(a.status, StatusCode::OK, "cached: {}", a.text());
    // A token never reviewed: 401, saying why.
    let a = call(s.port, None, Proto::H2, as_user("never-seen-token", &nodes)).await;
    let message = a.status_object(401, "Unauthorized");
    assert!(
        message.contains("could not be verified") && message.contains("retry"),
        "{message}"
    );
    // A cached token but a decision never made (another resource): the review fails
    // closed as a 500, in the apiserver's words.
    let a = call(s.port, None, Proto::H2, as_user("kpulse-test", &pods)).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", a.text());
    assert!(
        a.text().starts_with(&format!(
            "Internal Server Error: \"{pods}\": SubjectAccessReview failed"
        )),
        "{}",
        a.text()
    );
    // An agent's token never reviewed: 503 on the agents' port (agents retry).
    let a = ingest_post(s.ingest_port, hello_frame("node-a", &BTreeMap::new())).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.text());
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot verify the token now")),
        "{}",
        a.text()
    );

    // After the TTL, the cached decisions are gone too.
    tokio::time::sleep(
        (cached_at + TTL + Duration::from_millis(500)).saturating_duration_since(Instant::now()),
    )
    .await;
    let a = call(s.port, None, Proto::H2, as_user("kpulse-test", &nodes)).await;
    a.status_object(401, "Unauthorized");

    // The log names the failure (one WARN per kind of review when the API stops
    // answering), never a token.
    let log = s.log_text();
    for review in ["TokenReview", "SubjectAccessReview"] {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("Kubernetes API not answering reviews; failing closed")
                && l.contains(review)),
            "no WARN for {review}:\n{log}"
        );
    }
    for secret in [
        "kpulse-test",
        "never-seen-token",
        "node-a-token",
        "server-token",
    ] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

// ---------------------------------------------------------------------------------------
// Watchers that stop reading.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_that_stop_reading_are_dropped_and_memory_stays_bounded() {
    // Big looks at little CPU (a debug build on a shared machine): few pods, each with a
    // long label.
    const PODS: usize = 600;
    const STUCK_H1: usize = 2;
    const STUCK_H2: usize = 2;
    let dir = temp_dir("watchers");
    let api = ReviewApi::standard();
    let feed = dir.join("feed.jsonl");
    let _feeder = Feeder::start_with_blob(feed.clone(), PODS, 2500, Duration::from_millis(500));
    let args = strings(&[
        "--authentication-skip-lookup",
        "--feed-file",
        feed.to_str().expect("utf8"),
        "--kubeconfig",
        api.kubeconfig(&dir).to_str().expect("utf8"),
    ]);
    let s = start_server(dir, &args, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let look_bytes = loop {
        let list = wait_for(
            s.port,
            &format!("{V1B1}/namespaces/demo/pods"),
            "kpulse-test",
        )
        .await;
        let items = list.json()["items"].as_array().map_or(0, Vec::len);
        if items == PODS {
            break list.body.len();
        }
        assert!(Instant::now() < deadline, "{items} of {PODS} pods listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (baseline_kib, _) = s.memory_kib();
    let watch = format!("{V1B1}/namespaces/demo/pods?watch=1");

    // Stuck watchers: HTTP/1.1 ones that send the request and never read a byte, and
    // HTTP/2 ones that never read their response body (so never grant flow control).
    let mut stuck_h1 = Vec::new();
    for _ in 0..STUCK_H1 {
        use tokio::io::AsyncWriteExt;
        let mut tls = connect_from(s.port, [127, 0, 0, 1], None, Proto::H1)
            .await
            .expect("connect");
        tls.write_all(
            format!(
                "GET {watch} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer kpulse-test\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("write");
        tls.flush().await.expect("flush");
        stuck_h1.push(tls);
    }
    let mut stuck_h2 = Vec::new();
    for _ in 0..STUCK_H2 {
        let tls = connect_from(s.port, [127, 0, 0, 1], None, Proto::H2)
            .await
            .expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let r = send
            .send_request(get(
                Proto::H2,
                &watch,
                &[("authorization", &bearer("kpulse-test"))],
            ))
            .await
            .expect("watch");
        assert_eq!(r.status(), StatusCode::OK);
        stuck_h2.push((send, r));
    }
    // And one that reads: it must not be dropped.
    let reader = {
        let port = s.port;
        let watch = watch.clone();
        tokio::spawn(async move {
            let tls = connect_from(port, [127, 0, 0, 1], None, Proto::H2)
                .await
                .expect("connect");
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .expect("handshake");
            tokio::spawn(conn);
            let r = send
                .send_request(get(
                    Proto::H2,
                    &watch,
                    &[("authorization", &bearer("kpulse-test"))],
                ))
                .await
                .expect("watch");
            let mut body = r.into_body();
            let mut bytes = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                bytes += frame.data_ref().map_or(0, Bytes::len);
            }
            bytes
        })
    };

    // Every stuck watcher is dropped once its queue is full (16 looks or 16 MiB); the
    // reader is not.
    let started = Instant::now();
    let stuck = (STUCK_H1 + STUCK_H2) as f64;
    let mut peak_kib;
    loop {
        let dropped = self_metric(s.port, "kpulse_aggregator_watches_dropped_slow_total").await;
        let (_, hwm) = s.memory_kib();
        peak_kib = hwm;
        if dropped >= stuck {
            assert_eq!(dropped, stuck, "only the stuck watchers are dropped");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{dropped} of {stuck} stuck watchers dropped after 120 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let took = started.elapsed();
    assert_eq!(
        self_metric(s.port, "kpulse_aggregator_watches").await,
        1.0,
        "the reader's watch is the only one left"
    );
    assert!(!reader.is_finished(), "the reading watcher was ended");
    // What the stuck watchers held is bounded by their queues (16 looks or 16 MiB and a
    // look each) and the connections' buffers: far below this, whatever the test's
    // duration.
    let growth_mib = peak_kib.saturating_sub(baseline_kib) / 1024;
    let per_watcher_mib = (16 * look_bytes).min((16 << 20) + look_bytes) >> 20;
    eprintln!(
        "{stuck} stuck watchers dropped after {took:?}; a look is {look_bytes} bytes; \
         peak RSS {} MiB over a baseline of {} MiB",
        growth_mib,
        baseline_kib / 1024
    );
    let bound_mib = (STUCK_H1 + STUCK_H2) * (per_watcher_mib + 16) + 256;
    assert!(
        (growth_mib as usize) < bound_mib,
        "peak RSS grew by {growth_mib} MiB (bound {bound_mib} MiB)"
    );
    drop(stuck_h1);
    drop(stuck_h2);
    reader.abort();
}

// ---------------------------------------------------------------------------------------
// No secret in any log.

/// `kpulse-agent`, built next to the server by `cargo build --workspace` / `cargo test
/// --workspace` (`cargo xtask test`).
fn agent_bin() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_BIN_EXE_kpulse-aggregator-api"))
        .parent()?
        .join("kpulse-agent");
    bin.is_file().then_some(bin)
}

/// The lines of a PEM block's body (the base64 between the markers).
fn pem_body_lines(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_or_token_ever_appears_in_logs() {
    const USER_TOKEN: &str = "SECRET-USER-TOKEN-4f1a9c";
    const BOGUS_TOKEN: &str = "SECRET-BOGUS-TOKEN-99d3e1";
    const AGENT_TOKEN: &str = "SECRET-AGENT-TOKEN-b7e2d0";
    const SERVER_TOKEN: &str = "SECRET-SERVER-TOKEN-0c5e7a";
    let dir = temp_dir("secrets");
    let api = ReviewApi::start(Arc::new(|kind: &str, spec: &Value| {
        if kind == "tokenreviews" {
            let kpulse = spec["audiences"] == json!(["kpulse"]);
            match spec["token"].as_str().unwrap_or_default() {
                USER_TOKEN => json!({"authenticated": true, "user": {"username": "tester"}}),
                AGENT_TOKEN if kpulse => json!({"authenticated": true, "audiences": ["kpulse"],
                    "user": {"username": AGENT,
                             "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}}}),
                _ => json!({"authenticated": false, "error": "token not recognised"}),
            }
        } else {
            json!({"allowed": spec["user"] == "tester"})
        }
    }));
    let serving_ca = Ca::new("serving-ca");
    let (server_cert, server_key) = serving_ca.server();
    let agents_ca = Ca::new("agents-ca");
    let node_b = agents_ca.client("node-b", None, false);
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf8").to_string()
    };
    let args = strings(&[
        "--authentication-skip-lookup",
        "--kubeconfig",
        api.kubeconfig_with_token(&dir, SERVER_TOKEN)
            .to_str()
            .expect("utf8"),
        "--tls-cert-file",
        &write("server.crt", &server_cert),
        "--tls-private-key-file",
        &write("server.key", &server_key),
        "--agent-client-ca-file",
        &agents_ca.write(&dir.join("agents-ca.crt")),
    ]);
    let serving_ca_file = serving_ca.write(&dir.join("serving-ca.crt"));
    let token_file = write("token", &format!("{AGENT_TOKEN}\n"));
    let node_b_cert = write("node-b.crt", &node_b.cert_pem);
    let node_b_key = write("node-b.key", &node_b.key_pem);
    let pods_file = write("pods.json", "{\"pods\":[]}");
    let s = start_server(
        dir.clone(),
        &args,
        &[("RUST_LOG", "trace"), ("RUST_BACKTRACE", "1")],
    );

    // Users: a good token and a bogus one, over both protocols, at the API port and on
    // the agents' port; a forged front-proxy header too.
    for proto in [Proto::H1, Proto::H2] {
        let a = call(
            s.port,
            None,
            proto,
            get(
                proto,
                &format!("{V1B1}/nodes"),
                &[("authorization", &bearer(USER_TOKEN))],
            ),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let a = call(
            s.port,
            None,
            proto,
            get(
                proto,
                &format!("{V1B1}/nodes"),
                &[
                    ("authorization", &bearer(BOGUS_TOKEN)),
                    ("x-remote-user", "system:admin"),
                ],
            ),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.text());
    }
    for token in [BOGUS_TOKEN, USER_TOKEN] {
        let a = call(
            s.ingest_port,
            None,
            Proto::H2,
            request(
                Proto::H2,
                "POST",
                kpulse_wire::stream::STREAM_PATH,
                &[
                    (kpulse_wire::stream::VERSION_HEADER, "1.0"),
                    ("authorization", &bearer(token)),
                ],
                Bytes::from(hello_frame("node-a", &BTreeMap::new())),
            ),
        )
        .await;
        assert!(
            a.status == StatusCode::UNAUTHORIZED || a.status == StatusCode::FORBIDDEN,
            "{}",
            a.text()
        );
    }

    // The real agent, at its most verbose: node-a with a token file, node-b with a client
    // certificate.
    let mut agents: Vec<(Child, PathBuf)> = Vec::new();
    match agent_bin() {
        Some(bin) => {
            for (node, credentials) in [
                (
                    "node-a",
                    vec!["--token-file".to_string(), token_file.clone()],
                ),
                (
                    "node-b",
                    vec![
                        "--client-cert-file".to_string(),
                        node_b_cert.clone(),
                        "--client-key-file".to_string(),
                        node_b_key.clone(),
                    ],
                ),
            ] {
                let log = dir.join(format!("agent-{node}.log"));
                let child = Command::new(&bin)
                    .arg("run")
                    .args(["--node-name", node, "--pods-file", &pods_file])
                    .args(["--server", &format!("127.0.0.1:{}", s.ingest_port)])
                    .args([
                        "--server-name",
                        "localhost",
                        "--server-ca-file",
                        &serving_ca_file,
                    ])
                    .args(["--collector", "cgroupfs", "--metrics-bind-address", ""])
                    .args(credentials)
                    .env("RUST_LOG", "trace")
                    .stdout(
                        std::fs::File::create(dir.join(format!("agent-{node}.out"))).expect("out"),
                    )
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("start the agent");
                agents.push((child, log));
            }
            // Both streams accepted, then a few ticks.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let log = s.log_text();
                let accepted = ["node-a", "node-b"].iter().all(|n| {
                    log.lines()
                        .any(|l| l.contains("agent stream accepted") && l.contains(n))
                });
                if accepted {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "agents not accepted within 30 s:\n{}",
                    log.lines()
                        .filter(|l| l.contains("agent"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "kpulse-agent is not built next to the server"
            );
            eprintln!(
                "no_secret_or_token_ever_appears_in_logs: kpulse-agent not built next to the \
                 server; checking the server's log only (build it with `cargo build -p \
                 kpulse-agent`)"
            );
        }
    }
    for (child, _) in &mut agents {
        let _ = child.kill();
        let _ = child.wait();
    }

    let mut logs = vec![("server".to_string(), s.log_text())];
    for (_, log) in &agents {
        logs.push((
            log.display().to_string(),
            std::fs::read_to_string(log).expect("agent log"),
        ));
        let out = log.with_extension("out");
        logs.push((
            out.display().to_string(),
            std::fs::read_to_string(&out).unwrap_or_default(),
        ));
    }
    let mut secrets = vec![
        USER_TOKEN.to_string(),
        BOGUS_TOKEN.to_string(),
        AGENT_TOKEN.to_string(),
        SERVER_TOKEN.to_string(),
    ];
    secrets.extend(pem_body_lines(&server_key));
    secrets.extend(pem_body_lines(&node_b.key_pem));
    for (name, text) in &logs {
        assert!(
            text.len() > 1000 || name.ends_with(".out"),
            "{name}: not verbose? {text}"
        );
        for secret in &secrets {
            if let Some(at) = text.find(secret.as_str()) {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
                panic!(
                    "{name} contains a secret ({}…):\n{}",
                    &secret[..8],
                    &text[line_start..line_end]
                );
            }
        }
        let lower = text.to_lowercase();
        for pattern in [
            "bearer secret",
            "authorization: bearer",
            "\"authorization\": \"bearer",
        ] {
            assert!(!lower.contains(pattern), "{name} contains {pattern:?}");
        }
    }
    eprintln!(
        "searched {} log bytes ({}) for {} secrets",
        logs.iter().map(|(_, t)| t.len()).sum::<usize>(),
        logs.iter()
            .map(|(n, t)| format!("{n}: {}", t.len()))
            .collect::<Vec<_>>()
            .join(", "),
        secrets.len()
    );
}
