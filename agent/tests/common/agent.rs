//! The real `kpulse-agent` binary as a child process: its output lines, its log, its
//! `/metrics`; killed (SIGKILL) on drop.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

/// The agent binary of this build (or `KPULSE_AGENT_BIN`).
pub fn bin() -> PathBuf {
    std::env::var_os("KPULSE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kpulse-agent")))
}

/// The aggregator-api binary built next to the agent's (`cargo build --workspace`,
/// `cargo test --workspace`).
pub fn server_bin() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kpulse-agent"))
        .parent()
        .map(|d| d.join("kpulse-aggregator-api"))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "{} is missing: build the server first (`cargo build -p kpulse-aggregator-api`, or run \
         `cargo test --workspace`)",
        bin.display()
    );
    bin
}

/// A directory of a test, removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A running agent.
pub struct Agent {
    child: Child,
    /// Its pid.
    pub pid: u32,
    log: Arc<Mutex<String>>,
    /// Its stdout, line by line.
    pub lines: mpsc::Receiver<String>,
    metrics_port: Option<u16>,
}

impl Agent {
    /// Starts `kpulse-agent <args>` (logs at info, no colours).
    pub fn spawn(args: &[String], metrics_port: Option<u16>) -> Agent {
        Agent::spawn_with_env(args, metrics_port, &[])
    }

    /// [`Agent::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        args: &[String],
        metrics_port: Option<u16>,
        env: &[(&str, &str)],
    ) -> Agent {
        let mut child = Command::new(bin())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin().display()));
        let pid = child.id();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let l = log.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Ok(mut g) = l.lock() {
                    g.push_str(&line);
                }
                line.clear();
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Agent {
            child,
            pid,
            log,
            lines,
            metrics_port,
        }
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// Waits until the log has a line containing every one of `needles`; returns it.
    pub fn wait_log(&mut self, needles: &[&str], limit: Duration) -> Option<String> {
        let t = Instant::now();
        loop {
            if let Some(l) = self
                .log()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return Some(l.to_owned());
            }
            if t.elapsed() > limit || self.exited() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has ended.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// `GET /metrics`, or `None` while it is not served.
    pub fn metrics(&self) -> Option<String> {
        let port = self.metrics_port?;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let (_, text) = body.split_once("\r\n\r\n")?;
        Some(text.to_owned())
    }

    /// The value of metric `series` (exact name with labels), if exposed.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics()?;
        value_of(&text, series)
    }

    /// Waits until metric `series` satisfies `pred`; returns its value.
    pub fn wait_metric(
        &mut self,
        series: &str,
        pred: impl Fn(f64) -> bool,
        limit: Duration,
    ) -> Option<f64> {
        let t = Instant::now();
        loop {
            if let Some(v) = self.metric(series).filter(|v| pred(*v)) {
                return Some(v);
            }
            if t.elapsed() > limit || self.exited() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Resident memory, bytes (`VmRSS`).
    pub fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The value of `series` in a Prometheus text exposition.
pub fn value_of(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok()).flatten()
    })
}
