//! What the load measurements (`bench-ingest`, `soak`, `bench-restart`) share: the release
//! binaries, the simulated agents' CA, the server and the `loadgen` example (agents or
//! reader) as child processes, the server's `/metrics`, and a process's CPU time and RSS.
//!
//! Every child runs in its own process group (a Ctrl-C is the xtask's to handle: see
//! [`Stop`]) and is killed by PID and reaped when its [`Proc`] is dropped, so every exit
//! path, errors and signals included, leaves nothing running.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

/// The release binaries the measurements run.
pub struct Binaries {
    /// `kpulse-aggregator-api`.
    pub server: PathBuf,
    /// The `loadgen` example of kpulse-agent.
    pub loadgen: PathBuf,
}

/// Builds (unless `no_build`) and locates the release server and load generator.
pub fn release_binaries(no_build: bool) -> Result<Binaries> {
    let root = crate::vm::workspace_root()?;
    if !no_build {
        // One invocation: the server's library is built once, with the features both need
        // (the example uses it too), instead of once per invocation.
        crate::exec::run(Command::new("cargo").current_dir(&root).args([
            "build",
            "--release",
            "-p",
            "kpulse-aggregator-api",
            "--bin",
            "kpulse-aggregator-api",
            "-p",
            "kpulse-agent",
            "--example",
            "loadgen",
        ]))?;
    }
    let release = root.join("target/release");
    let bins = Binaries {
        server: release.join("kpulse-aggregator-api"),
        loadgen: release.join("examples/loadgen"),
    };
    for b in [&bins.server, &bins.loadgen] {
        ensure!(
            b.is_file(),
            "{} is missing; run without --no-build",
            b.display()
        );
    }
    Ok(bins)
}

/// Fails unless curl runs (the `/metrics` scrapes use it).
pub fn require_curl(tool: &str) -> Result<()> {
    ensure!(
        Command::new("curl")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok(),
        "{tool} scrapes /metrics with curl: apt-get install curl"
    );
    Ok(())
}

/// A scratch directory under the system's temporary directory, removed on drop unless
/// kept.
pub struct Scratch {
    /// The directory.
    pub dir: PathBuf,
    name: String,
}

impl Scratch {
    /// `<tmp>/kpulse-<name>-<pid>`, empty.
    pub fn new(name: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("kpulse-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch {
            dir,
            name: name.to_owned(),
        })
    }

    /// Keeps its files: moves them to `<tmp>/kpulse-<name>-logs-<pid>` and says where.
    pub fn keep(&self) {
        let kept =
            self.dir
                .with_file_name(format!("kpulse-{}-logs-{}", self.name, std::process::id()));
        if fs::rename(&self.dir, &kept).is_ok() {
            eprintln!("{}: logs in {}", self.name, kept.display());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// SIGINT and SIGTERM of the xtask, as an error to return (the drop guards then clean up).
pub struct Stop(mpsc::Receiver<&'static str>);

impl Stop {
    /// Installs the handlers (see `demo::stop_signal`).
    pub fn install() -> Result<Stop> {
        crate::demo::stop_signal().map(Stop)
    }

    /// An error if a signal arrived.
    pub fn check(&self) -> Result<()> {
        match self.0.try_recv() {
            Ok(signal) => bail!("{signal}"),
            Err(_) => Ok(()),
        }
    }

    /// Sleeps `d`, or fails as soon as a signal arrives.
    pub fn sleep(&self, d: Duration) -> Result<()> {
        match self.0.recv_timeout(d) {
            Ok(signal) => bail!("{signal}"),
            Err(_) => Ok(()),
        }
    }
}

/// A child process: killed (SIGKILL) and reaped on drop.
pub struct Proc {
    /// For messages.
    pub name: String,
    /// Its stderr (and stdout, unless captured elsewhere).
    pub log: PathBuf,
    child: std::process::Child,
}

/// Raises the soft limit of open files to the hard one, then runs the command: a stream per
/// simulated node on each side. (The server raises its own as well.)
const NOFILE: &str = "ulimit -n \"$(ulimit -Hn)\" && exec \"$@\"";

impl Proc {
    /// Starts `program args` in its own process group with the file limit raised, stderr to
    /// `log`, stdout to `stdout` (or `log`).
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        nice: bool,
        log: &Path,
        stdout: Option<&Path>,
    ) -> Result<Proc> {
        Proc::spawn_with_env(name, program, args, nice, log, stdout, &[])
    }

    /// [`Proc::spawn`] with environment variables set.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        nice: bool,
        log: &Path,
        stdout: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let mut cmd = if nice {
            let mut c = Command::new("nice");
            c.args(["-n", "19", "bash"]);
            c
        } else {
            Command::new("bash")
        };
        cmd.args(["-c", NOFILE, name]).arg(program).args(args);
        let err = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let out = match stdout {
            Some(p) => fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            None => err.try_clone()?,
        };
        let child = cmd
            .process_group(0)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_owned(),
            log: log.to_path_buf(),
            child,
        })
    }

    /// Its PID (`nice` and `bash` exec it: the program's own).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails naming the process and its log if it exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited: {status}; see {}", self.name, self.log.display());
        }
        Ok(())
    }

    /// Sends `signal` (`TERM`, `INT`, …) to it by PID.
    pub fn signal(&self, signal: &str) -> Result<()> {
        crate::exec::run(
            Command::new("kill")
                .args([&format!("-{signal}"), &self.pid().to_string()])
                .stderr(Stdio::null()),
        )
    }

    /// Waits until it exits, at most `limit`.
    pub fn wait_for(&mut self, limit: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then SIGKILL if it is still there after `grace`; its exit status.
    pub fn stop(&mut self, grace: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        let _ = self.signal("TERM");
        if let Some(status) = self.wait_for(grace)? {
            return Ok(status);
        }
        self.kill()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        let _ = self.child.kill();
        self.child.wait().context("reaping")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The simulated agents' CA (`ca.crt`, also the users' CA) and a user certificate
/// (`client.crt`, `client.key`) for the API and `/metrics`, made by `loadgen --init-only`.
pub struct Pki {
    /// The directory `loadgen --ca-dir` takes.
    pub dir: PathBuf,
    /// The CA certificate.
    pub ca: PathBuf,
    /// The user's certificate and key.
    pub client: (PathBuf, PathBuf),
}

impl Pki {
    /// Makes them in `dir`.
    pub fn create(loadgen: &Path, dir: &Path) -> Result<Pki> {
        crate::exec::run(
            Command::new(loadgen)
                .arg("--ca-dir")
                .arg(dir)
                .arg("--init-only"),
        )?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.crt"),
            client: (dir.join("client.crt"), dir.join("client.key")),
        })
    }
}

/// How the server authenticates readers.
pub enum ServerAuth<'a> {
    /// Anonymous reads of `/metrics` only (a Kubernetes API that is not there is
    /// configured and never called).
    AnonymousMetrics {
        /// Where to write its kubeconfig.
        kubeconfig: PathBuf,
    },
    /// Client certificates from the agents' CA; every authenticated request allowed.
    ClientCerts(&'a Pki),
}

/// A server on loopback: its ports and arguments, so that it can be started again the same.
pub struct Server {
    /// `--secure-port`.
    pub api_port: u16,
    /// `--ingest-port`.
    pub ingest_port: u16,
    args: Vec<String>,
    /// The user certificate its `/metrics` is read with, if any.
    pub client: Option<(PathBuf, PathBuf)>,
    env: Vec<(String, String)>,
}

impl Server {
    /// A server on two free loopback ports, its self-signed certificate in `dir/certs`,
    /// agents authenticated by `agents_ca`.
    pub fn new(dir: &Path, agents_ca: &Path, auth: ServerAuth<'_>) -> Result<Server> {
        let (api_port, ingest_port) = (crate::exec::free_port()?, crate::exec::free_port()?);
        let path = |p: &Path| p.display().to_string();
        let mut args: Vec<String> = [
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &api_port.to_string(),
            "--ingest-port",
            &ingest_port.to_string(),
            "--cert-dir",
            &path(&dir.join("certs")),
            "--agent-client-ca-file",
            &path(agents_ca),
            "--authentication-skip-lookup",
            // Every simulated agent connects from 127.0.0.1.
            "--max-connections-per-ip=0",
        ]
        .map(String::from)
        .to_vec();
        let client = match auth {
            ServerAuth::AnonymousMetrics { kubeconfig } => {
                fs::write(
                    &kubeconfig,
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: \"http://127.0.0.1:9\"}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: none, user: u}\ncurrent-context: c\n",
                )
                .with_context(|| format!("writing {}", kubeconfig.display()))?;
                args.extend([
                    "--kubeconfig".to_owned(),
                    path(&kubeconfig),
                    // The agents use certificates: no tokens to review or verify (a replica
                    // verifying tokens itself would keep its agents' port closed for 10 s
                    // waiting for keys this API never gives). A flag every build has, for
                    // `--against`.
                    "--authentication-token-webhook=false".to_owned(),
                    "--anonymous-auth".to_owned(),
                    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
                        .to_owned(),
                ]);
                None
            }
            ServerAuth::ClientCerts(pki) => {
                args.extend([
                    "--client-ca-file".to_owned(),
                    path(&pki.ca),
                    "--authorization-mode".to_owned(),
                    "AlwaysAllow".to_owned(),
                ]);
                Some(pki.client.clone())
            }
        };
        Ok(Server {
            api_port,
            ingest_port,
            args,
            client,
            env: Vec::new(),
        })
    }

    /// `127.0.0.1:<ingest port>`.
    pub fn ingest(&self) -> String {
        format!("127.0.0.1:{}", self.ingest_port)
    }

    /// The ingest port at `n` loopback addresses (127.0.0.1 … 127.0.0.n): with more than
    /// one, the agents' port listens on every address of the host (`--ingest-bind-address
    /// 0.0.0.0`; the port was found free on 127.0.0.1 only), for one server to take more
    /// streams than one destination address has ephemeral ports for (about 28,000 on
    /// Linux's default range). So other hosts could reach it while it runs; it asks every
    /// client for a certificate of the load generator's own CA, and only this machine's
    /// load generator has one.
    pub fn ingest_addresses(&mut self, n: u8) -> Vec<String> {
        if n > 1 && !self.args.iter().any(|a| a == "--ingest-bind-address") {
            self.args
                .extend(["--ingest-bind-address".to_owned(), "0.0.0.0".to_owned()]);
        }
        (1..=n.max(1))
            .map(|i| format!("127.0.0.{i}:{}", self.ingest_port))
            .collect()
    }

    /// Adds `--flag value` to the server's command line.
    pub fn flag(&mut self, flag: &str, value: String) {
        self.args.extend([flag.to_owned(), value]);
    }

    /// `127.0.0.1:<API port>`.
    pub fn api(&self) -> String {
        format!("127.0.0.1:{}", self.api_port)
    }

    /// Starts the server, stderr to `log`.
    pub fn start(&self, bin: &Path, log: &Path) -> Result<Proc> {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Proc::spawn_with_env("the server", bin, &self.args, false, log, None, &env)
    }

    /// Sets environment variables of the server (`KEY=VALUE` each) for its next starts.
    pub fn set_env(&mut self, vars: &[String]) -> Result<()> {
        for v in vars {
            let (k, val) = v
                .split_once('=')
                .with_context(|| format!("{v:?} is not KEY=VALUE"))?;
            self.env.push((k.to_owned(), val.to_owned()));
        }
        Ok(())
    }

    /// Its `/metrics`.
    pub fn scrape(&self) -> Result<Metrics> {
        scrape(self.api_port, self.client.as_ref())
    }

    /// Waits until `/metrics` answers, failing if `proc` exits or `limit` passes.
    pub fn wait_answering(&self, proc: &mut Proc, limit: Duration, stop: &Stop) -> Result<()> {
        let deadline = Instant::now() + limit;
        while self.scrape().is_err() {
            proc.check_running()?;
            ensure!(
                Instant::now() < deadline,
                "the server did not answer within {limit:?}; see {}",
                proc.log.display()
            );
            stop.sleep(Duration::from_millis(200))?;
        }
        Ok(())
    }
}

/// The simulated fleet: the flags `soak` and `bench-restart` share.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Fleet {
    /// Simulated agents (nodes).
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 30)]
    pub pods: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 2)]
    pub containers: usize,
    /// Seconds over which the agents connect at first.
    #[arg(long, default_value_t = 30)]
    pub ramp_secs: u64,
}

impl Fleet {
    /// Refuses an empty fleet.
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.agents > 0 && self.pods > 0 && self.containers > 0,
            "--agents, --pods and --containers must be positive"
        );
        Ok(())
    }

    /// The load generator's agents of this fleet, streaming to `servers`.
    pub fn agents<'a>(&self, servers: &'a [String], nice: bool) -> Agents<'a> {
        Agents {
            nodes: self.agents,
            pods: self.pods,
            containers: self.containers,
            ramp_secs: self.ramp_secs,
            servers,
            spread: false,
            resolution_ms: 1000,
            nice,
            log_filter: None,
            custom_metrics: false,
            node_prefix: None,
        }
    }
}

/// The load generator's agents.
pub struct Agents<'a> {
    /// Nodes simulated.
    pub nodes: usize,
    /// Pods per node.
    pub pods: usize,
    /// Containers per pod.
    pub containers: usize,
    /// Seconds over which they connect.
    pub ramp_secs: u64,
    /// Where they stream: every node to every one, or with `spread` node i to the
    /// (i mod n)th (one server at several addresses, [`Server::ingest_addresses`]).
    pub servers: &'a [String],
    pub spread: bool,
    /// Each node's tick interval (1,000: the agent's default of one batch a second).
    pub resolution_ms: u64,
    /// At the lowest priority (`nice 19`), so that the server gets the CPU it asks for, as
    /// on its own node; or at the normal one, so that they keep their 1 Hz on a busy host.
    pub nice: bool,
    /// `RUST_LOG` of the load generator (default: warnings).
    pub log_filter: Option<&'a str>,
    /// Also send pressure and throttling (`loadgen --custom-metrics`).
    pub custom_metrics: bool,
    /// Node names `<prefix><index>` (default: the load generator's `sim-`): two load
    /// generators streaming to one server at once need different ones.
    pub node_prefix: Option<&'a str>,
}

impl Agents<'_> {
    /// `--nodes … --pods … --containers …`: what a reader of them needs too.
    pub fn shape(&self) -> Vec<String> {
        [
            "--nodes",
            &self.nodes.to_string(),
            "--pods",
            &self.pods.to_string(),
            "--containers",
            &self.containers.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// Starts them; their JSON summary goes to `summary`.
    pub fn start(&self, bin: &Path, pki: &Pki, log: &Path, summary: &Path) -> Result<Proc> {
        let mut args = vec!["--ca-dir".to_owned(), pki.dir.display().to_string()];
        for s in self.servers {
            args.extend(["--server".to_owned(), s.clone()]);
        }
        args.extend(self.shape());
        args.extend(["--ramp-secs".to_owned(), self.ramp_secs.to_string()]);
        args.extend(["--resolution-ms".to_owned(), self.resolution_ms.to_string()]);
        if self.spread {
            args.push("--spread".to_owned());
        }
        if self.custom_metrics {
            args.push("--custom-metrics".to_owned());
        }
        if let Some(prefix) = self.node_prefix {
            args.extend(["--node-prefix".to_owned(), prefix.to_owned()]);
        }
        let env: Vec<(&str, &str)> = self
            .log_filter
            .map(|f| ("RUST_LOG", f))
            .into_iter()
            .collect();
        Proc::spawn_with_env(
            "the load generator",
            bin,
            &args,
            self.nice,
            log,
            Some(summary),
            &env,
        )
    }
}

/// A reader polling until every node and pod of the agents is served
/// (`loadgen --wait-complete`).
pub struct Waiter {
    proc: Proc,
    out: PathBuf,
    limit_secs: u64,
}

impl Waiter {
    /// Starts it (files `waiter-<name>.{out,log}` in `dir`); it gives up after `limit_secs`.
    pub fn start(
        bins: &Binaries,
        pki: &Pki,
        server: &Server,
        agents: &Agents<'_>,
        dir: &Path,
        name: &str,
        limit_secs: u64,
    ) -> Result<Waiter> {
        let mut args = vec![
            "--ca-dir".to_owned(),
            pki.dir.display().to_string(),
            "--read-api".to_owned(),
            server.api(),
            "--wait-complete".to_owned(),
            "--timeout-secs".to_owned(),
            limit_secs.to_string(),
        ];
        args.extend(agents.shape());
        let out = dir.join(format!("waiter-{name}.out"));
        let proc = Proc::spawn(
            "the reader",
            &bins.loadgen,
            &args,
            false,
            &dir.join(format!("waiter-{name}.log")),
            Some(&out),
        )?;
        Ok(Waiter {
            proc,
            out,
            limit_secs,
        })
    }

    /// Waits for its verdict: the JSON it printed when complete, an error otherwise.
    pub fn finish(mut self, stop: &Stop) -> Result<serde_json::Value> {
        // It gives up by itself after its limit; this is only a backstop.
        let deadline = Instant::now() + Duration::from_secs(self.limit_secs + 15);
        while self.proc.wait_for(Duration::from_millis(200))?.is_none() {
            stop.check()?;
            ensure!(Instant::now() < deadline, "the reader did not end");
        }
        let v = read_summary(&self.out)?;
        if v["complete"] != true {
            bail!(
                "not complete within {} s: {}; see {}",
                self.limit_secs,
                v["last"],
                self.proc.log.display()
            );
        }
        Ok(v)
    }
}

/// Reads the JSON line a `loadgen` wrote to `path` (its summary).
pub fn read_summary(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no JSON summary in {}", path.display()))?;
    serde_json::from_str(line).with_context(|| format!("the summary in {}", path.display()))
}

/// `utime + stime` of `pid`, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .zip(fields.get(12).and_then(|s| s.parse::<u64>().ok()))
        .map(|(u, s)| u + s)
        .context("utime/stime")?;
    // USER_HZ is 100 on every Linux ABI that matters here.
    Ok(ticks as f64 / 100.0)
}

/// The `TcpExt` counter `name` (`ListenDrops`, …) of the network namespace that `pid` is
/// in, from `/proc/PID/net/netstat`: a pod's counters, read from the host.
pub fn tcp_ext_counter(pid: u32, name: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/net/netstat");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    netstat_counter(&text, "TcpExt", name).with_context(|| format!("no TcpExt {name} in {path}"))
}

/// Counter `name` of group `group` in the text of `/proc/net/netstat`: for each group a
/// line of names, then a line of values, each starting `Group:`.
fn netstat_counter(text: &str, group: &str, name: &str) -> Option<u64> {
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter_map(|l| l.strip_prefix(prefix.as_str()));
    let names = lines.next()?;
    let values = lines.next()?;
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
pub fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// A `/metrics` page: `name{labels}` → value.
pub type Metrics = BTreeMap<String, f64>;

/// The server's `/metrics` on `port`, anonymously or with a client certificate.
pub fn scrape(port: u16, client: Option<&(PathBuf, PathBuf)>) -> Result<Metrics> {
    let mut cmd = Command::new("curl");
    cmd.args(["-skf", "--max-time", "10"]);
    if let Some((cert, key)) = client {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let text = crate::exec::output(cmd.arg(format!("https://127.0.0.1:{port}/metrics")))?;
    Ok(parse_metrics(&text))
}

/// A plain-HTTP `/metrics` at `addr` (`host:port`), such as the agent's.
pub fn scrape_http(addr: &str) -> Result<Metrics> {
    let text = crate::exec::output(
        Command::new("curl")
            .args(["-sf", "--max-time", "10"])
            .arg(format!("http://{addr}/metrics")),
    )?;
    Ok(parse_metrics(&text))
}

/// A Prometheus text page as [`Metrics`] (comments skipped).
pub fn parse_metrics(text: &str) -> Metrics {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// A value, 0 when absent.
pub fn value(m: &Metrics, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

/// The change of `key` from `a` to `b`.
pub fn delta(a: &Metrics, b: &Metrics, key: &str) -> f64 {
    value(b, key) - value(a, key)
}

/// The sum of every series of `name` (its labels, if any, passing `keep`).
pub fn sum(m: &Metrics, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            let labels = match k.strip_prefix(name) {
                Some("") => "",
                Some(l) if l.starts_with('{') => l,
                _ => return false,
            };
            keep(labels)
        })
        .map(|(_, v)| v)
        .sum()
}

/// The q-quantile of the histogram `name` over the window from `a` to `b`, interpolated
/// within a bucket, over the series whose labels contain `labels` (all of them for "").
pub fn quantile(a: &Metrics, b: &Metrics, name: &str, labels: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{");
    let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for k in b.keys() {
        let Some(rest) = k.strip_prefix(&prefix) else {
            continue;
        };
        if !rest.contains(labels) {
            continue;
        }
        let Some(le) = rest
            .split_once("le=\"")
            .and_then(|(_, v)| v.split_once('"'))
            .map(|(v, _)| v)
        else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let entry = by_le.entry(le.to_bits()).or_insert((le, 0.0));
        entry.1 += delta(a, b, k);
    }
    let mut buckets: Vec<(f64, f64)> = by_le.into_values().collect();
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let target = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= target {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let span = count - lower.1;
            let frac = if span > 0.0 {
                (target - lower.1) / span
            } else {
                1.0
            };
            return Some(lower.0 + frac * (le - lower.0));
        }
        lower = (le, count);
    }
    None
}

/// Milliseconds, or `n/a`.
pub fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("n/a".to_string(), |s| format!("{:.1} ms", s * 1e3))
}

/// This process's hard open-file limit (what its children may raise theirs to).
pub fn open_file_limit() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").context("/proc/self/limits")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("/proc/self/limits: no Max open files")?;
    line.split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok())
        .nth(1)
        .context("/proc/self/limits: Max open files without a hard limit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstat_counters_by_group_and_name() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                    TcpExt: 0 4339 4340\n\
                    IpExt: InNoRoutes ListenDrops\n\
                    IpExt: 7 9\n";
        assert_eq!(netstat_counter(text, "TcpExt", "ListenDrops"), Some(4340));
        assert_eq!(
            netstat_counter(text, "TcpExt", "ListenOverflows"),
            Some(4339)
        );
        assert_eq!(netstat_counter(text, "IpExt", "ListenDrops"), Some(9));
        assert_eq!(netstat_counter(text, "TcpExt", "Missing"), None);
        assert_eq!(
            netstat_counter("TcpExt: ListenDrops\n", "TcpExt", "ListenDrops"),
            None
        );
        // This process's own namespace has the counter.
        assert!(tcp_ext_counter(std::process::id(), "ListenDrops").is_ok());
    }

    fn metrics(pairs: &[(&str, f64)]) -> Metrics {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let a = Metrics::new();
        let b = metrics(&[
            ("h_bucket{le=\"0.01\"}", 50.0),
            ("h_bucket{le=\"0.02\"}", 90.0),
            ("h_bucket{le=\"0.1\"}", 100.0),
            ("h_bucket{le=\"+Inf\"}", 100.0),
        ]);
        assert_eq!(quantile(&a, &b, "h", "", 0.5), Some(0.01));
        let p99 = quantile(&a, &b, "h", "", 0.99).expect("p99");
        assert!((p99 - 0.092).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(&a, &a, "h", "", 0.5), None);
    }

    #[test]
    fn quantiles_add_up_labelled_series() {
        let a = Metrics::new();
        let b = metrics(&[
            ("h_bucket{verb=\"get\",endpoint=\"api\",le=\"0.01\"}", 50.0),
            ("h_bucket{verb=\"get\",endpoint=\"api\",le=\"+Inf\"}", 50.0),
            ("h_bucket{verb=\"list\",endpoint=\"api\",le=\"0.01\"}", 0.0),
            ("h_bucket{verb=\"list\",endpoint=\"api\",le=\"+Inf\"}", 50.0),
            (
                "h_bucket{verb=\"get\",endpoint=\"health\",le=\"0.01\"}",
                1000.0,
            ),
            (
                "h_bucket{verb=\"get\",endpoint=\"health\",le=\"+Inf\"}",
                1000.0,
            ),
        ]);
        // Half of the API's requests within 10 ms, the other half beyond.
        assert_eq!(quantile(&a, &b, "h", "endpoint=\"api\"", 0.5), Some(0.01));
        assert_eq!(quantile(&a, &b, "h", "endpoint=\"api\"", 0.99), Some(0.01));
    }

    #[test]
    fn sums_select_by_name_and_labels() {
        let m = metrics(&[
            ("r_total{code=\"200\"}", 5.0),
            ("r_total{code=\"503\"}", 2.0),
            ("r_total_other", 100.0),
            ("r", 7.0),
        ]);
        assert_eq!(sum(&m, "r_total", |l| l.contains("code=\"5")), 2.0);
        assert_eq!(sum(&m, "r_total", |_| true), 7.0);
        assert_eq!(sum(&m, "r", |_| true), 7.0);
    }
}
