//! Server restart under load, with the real processes on loopback: one
//! `kpulse-aggregator-api` and the `loadgen` example's simulated agents (the agent's own
//! shipping code, 200 nodes with a client certificate each). Once every node and pod is
//! served, the server is SIGKILLed and started again on the same ports; the agents
//! reconnect and every node and pod must be served again — complete, with every container's
//! rate as simulated, fresh — well within a generous deadline (the measured time is printed,
//! `-- --nocapture`; `cargo xtask bench-restart` measures it at 1,000 nodes for
//! docs/benchmarks.md).
//!
//! "Served" is judged by `loadgen --wait-complete`, the reader `cargo xtask soak` uses: it
//! polls the NodeMetrics list and every PodMetrics (protobuf) and checks each answer.
//!
//! Needs the server binary and the example next to this test's agent binary: `cargo test
//! --workspace` builds both; alone, `cargo build -p kpulse-aggregator-api -p kpulse-agent
//! --example loadgen` first. No root needed.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use serde_json::Value;

const NODES: usize = 200;
const PODS: usize = 5;
const CONTAINERS: usize = 2;
/// Not a target (that is 3 s, measured by `cargo xtask bench-restart`): a bound that a
/// loaded test machine never reaches, so the test cannot flake.
const DEADLINE: Duration = Duration::from_secs(30);

/// A child process, SIGKILLed and reaped on drop.
struct Proc(Child);

impl Proc {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The test's directory, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A binary built next to the agent's.
fn sibling(relative: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_kpulse-agent"))
        .parent()
        .map(|d| d.join(relative))
        .expect("the agent binary has a directory");
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test --workspace` builds it; or run `cargo build -p \
         kpulse-aggregator-api -p kpulse-agent --example loadgen` first",
        bin.display()
    );
    bin
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

struct Setup {
    dir: PathBuf,
    loadgen: PathBuf,
    server: PathBuf,
    server_args: Vec<String>,
    api: String,
    shape: Vec<String>,
}

impl Setup {
    fn start_server(&self, n: usize) -> Proc {
        let log = std::fs::File::create(self.dir.join(format!("server-{n}.log"))).expect("log");
        Proc(
            Command::new(&self.server)
                .args(&self.server_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start the server"),
        )
    }

    /// Starts a reader that polls until every node and pod is served.
    fn start_waiter(&self, n: usize) -> (Proc, PathBuf) {
        let out = self.dir.join(format!("waiter-{n}.out"));
        let child = Command::new(&self.loadgen)
            .arg("--ca-dir")
            .arg(self.dir.join("ca"))
            .args(["--read-api", &self.api, "--wait-complete"])
            .args(["--timeout-secs", &DEADLINE.as_secs().to_string()])
            .args(&self.shape)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("waiter output"))
            .stderr(std::fs::File::create(self.dir.join(format!("waiter-{n}.log"))).expect("log"))
            .spawn()
            .expect("start the reader");
        (Proc(child), out)
    }

    /// Waits for the reader; its verdict, with the server's log on failure.
    fn finish(&self, mut waiter: Proc, out: &Path, server_log: usize) -> Value {
        let limit = Instant::now() + DEADLINE + Duration::from_secs(15);
        while waiter.0.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < limit, "the reader did not end");
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(out).expect("reader output");
        let v: Value = text
            .lines()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default();
        if v["complete"] != true {
            let log = std::fs::read_to_string(self.dir.join(format!("server-{server_log}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "not every node and pod served within {DEADLINE:?}: {text}\nserver log (last \
                 lines, newest first):\n{}",
                tail.join("\n")
            );
        }
        v
    }
}

#[test]
fn server_restart_under_load_serves_everything_again() {
    let dir = TempDir(std::env::temp_dir().join(format!("kpulse-restart-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("test directory");
    let loadgen = sibling("examples/loadgen");
    let server = sibling("kpulse-aggregator-api");
    let ca = dir.0.join("ca");
    let status = Command::new(&loadgen)
        .arg("--ca-dir")
        .arg(&ca)
        .arg("--init-only")
        .status()
        .expect("run loadgen --init-only");
    assert!(status.success(), "loadgen --init-only: {status}");
    let (api_port, ingest_port) = (free_port(), free_port());
    let ca_file = ca.join("ca.crt").display().to_string();
    let server_args: Vec<String> = [
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        &api_port.to_string(),
        "--ingest-port",
        &ingest_port.to_string(),
        "--cert-dir",
        &dir.0.join("certs").display().to_string(),
        "--agent-client-ca-file",
        &ca_file,
        "--client-ca-file",
        &ca_file,
        "--authorization-mode",
        "AlwaysAllow",
        "--authentication-skip-lookup",
    ]
    .map(String::from)
    .to_vec();
    let shape: Vec<String> = [
        "--nodes",
        &NODES.to_string(),
        "--pods",
        &PODS.to_string(),
        "--containers",
        &CONTAINERS.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let setup = Setup {
        dir: dir.0.clone(),
        loadgen: loadgen.clone(),
        server,
        server_args,
        api: format!("127.0.0.1:{api_port}"),
        shape: shape.clone(),
    };

    let mut server = setup.start_server(0);
    let _agents = Proc(
        Command::new(&loadgen)
            .arg("--ca-dir")
            .arg(&ca)
            .args(["--server", &format!("127.0.0.1:{ingest_port}")])
            .args(&shape)
            .args(["--ramp-secs", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("loadgen.log")).expect("log"))
            .spawn()
            .expect("start the load generator"),
    );
    let started = Instant::now();
    let (waiter, out) = setup.start_waiter(0);
    setup.finish(waiter, &out, 0);
    println!(
        "{NODES} nodes × {PODS} pods served {:.2} s after the agents started",
        started.elapsed().as_secs_f64()
    );

    // Let every stream settle into its updates, then restart under load.
    std::thread::sleep(Duration::from_secs(2));
    server.kill();
    let (waiter, out) = setup.start_waiter(1);
    let spawned = SystemTime::now();
    let _server = setup.start_server(1);
    let v = setup.finish(waiter, &out, 1);
    let at = |key: &str| {
        v[key]
            .as_str()
            .and_then(|s| s.parse::<u128>().ok())
            .map(|t| t.saturating_sub(unix_ns(spawned)) as f64 / 1e9)
    };
    let complete = at("complete_unix_ns").expect("complete_unix_ns");
    println!(
        "server SIGKILLed and restarted under load: first answer {:.2} s, every node served \
         {:.2} s, every node and pod served again {complete:.2} s after the new process \
         started ({} polls; the target, measured by `cargo xtask bench-restart`, is 3 s)",
        at("first_answer_unix_ns").unwrap_or(f64::NAN),
        at("nodes_complete_unix_ns").unwrap_or(f64::NAN),
        v["polls"]
    );
    assert!(complete < DEADLINE.as_secs_f64());
}
