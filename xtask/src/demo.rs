//! `cargo xtask demo`: kpulse on this machine, with no Kubernetes cluster, seen through the
//! real `kubectl top`.
//!
//! Steps: build the eBPF object, the agent and the aggregator-api; make a CA and
//! certificates (server, agent, a `system:masters` kubectl user) and a kubeconfig in
//! `target/demo/`; create two demo "pods" as cgroups under `kpulse-demo` (`web`: a busy loop
//! limited to half a core; `cache`: 200 MiB resident) and a pods file describing them;
//! start the aggregator-api (x509 authentication, `--authorization-mode AlwaysAllow`, no
//! Kubernetes API) and the agent (`--pods-file`); show `kubectl top pod -A` and
//! `kubectl get podmetrics -A` every second until `--duration` or Ctrl-C. Every process
//! started is killed by PID and every cgroup created removed, on errors too (drop guards).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};
use time::OffsetDateTime;

/// Parent of the demo's cgroups, in every hierarchy.
const PARENT: &str = "kpulse-demo";
/// The demo's namespace.
const NAMESPACE: &str = "demo";
/// The kubectl user's certificate: CN = user, O = group.
const ADMIN_USER: &str = "demo-admin";
const ADMIN_GROUP: &str = "system:masters";
/// Resident memory of `cache`, MiB.
const CACHE_MIB: u64 = 200;
/// `web`'s CPU limit: quota per period, µs (half a core).
const WEB_QUOTA_US: u64 = 50_000;
const WEB_PERIOD_US: u64 = 100_000;

/// `cargo xtask demo` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// How long to run (e.g. 60s, 2m); default: until Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Use the binaries already in target/debug (and the eBPF object embedded in the agent).
    #[arg(long)]
    no_build: bool,
    /// Print each refresh after the previous one instead of clearing the screen.
    #[arg(long)]
    no_clear: bool,
    /// The node's name (the agent's certificate CN).
    #[arg(long, default_value = "demo-node")]
    node_name: String,
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: expected a duration such as 60s, 500ms or 2m");
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .ok_or_else(bad)?;
    let n: u64 = n.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(bad()),
    }
}

/// Runs the demo.
pub fn run(opts: &Options) -> Result<()> {
    let root = crate::vm::workspace_root()?;
    check_prereqs()?;
    // Handlers first: a Ctrl-C during the build or the start still cleans up.
    let stop = stop_signal()?;
    let bin = root.join("target/debug");
    if opts.no_build {
        for b in ["kpulse-agent", "kpulse-aggregator-api"] {
            ensure!(
                bin.join(b).is_file(),
                "--no-build: {} is missing; run without --no-build",
                bin.join(b).display()
            );
        }
    } else {
        // Into target/ebpf/kpulse.bpf.o, which the agent's build script embeds.
        crate::build_ebpf::run(&crate::build_ebpf::Options {
            release: false,
            no_install: false,
            clippy: false,
        })?;
        crate::exec::run(Command::new("cargo").current_dir(&root).args([
            "build",
            "-p",
            "kpulse-agent",
            "-p",
            "kpulse-aggregator-api",
        ]))?;
    }
    let dir = root.join("target/demo");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let started = Instant::now();
    let (api_port, ingest_port) = (crate::exec::free_port()?, crate::exec::free_port()?);
    let files = write_pki(&dir, &opts.node_name, api_port)?;
    println!("kubeconfig: {}", files.kubeconfig.display());

    let mut procs = Processes::default();
    let pods: Vec<String> = PODS.iter().map(|(pod, _, _)| (*pod).to_owned()).collect();
    let cgroups = Cgroups::create(&detect_hierarchies()?, PARENT, &pods)?;
    start_workloads(&cgroups, &mut procs)?;
    write_pods_file(&dir.join("pods.json"))?;

    let ca = files.ca.display().to_string();
    let mut server = Command::new(bin.join("kpulse-aggregator-api"));
    server
        .args(["--bind-address", "127.0.0.1"])
        .args(["--secure-port", &api_port.to_string()])
        .args(["--ingest-port", &ingest_port.to_string()])
        .arg("--tls-cert-file")
        .arg(&files.server_cert)
        .arg("--tls-private-key-file")
        .arg(&files.server_key)
        .args(["--client-ca-file", &ca, "--agent-client-ca-file", &ca])
        .args(["--authorization-mode", "AlwaysAllow"])
        .arg("--authentication-skip-lookup")
        // Standalone whatever $KUBECONFIG says: certificates only, no Kubernetes API.
        .arg("--authentication-token-webhook=false")
        .args(["--metric-expiry", "10s"]);
    procs.spawn("aggregator-api", server, &dir.join("aggregator-api.log"))?;
    let mut agent = Command::new(bin.join("kpulse-agent"));
    agent
        .args(["run", "--node-name", &opts.node_name])
        .args(["--server", &format!("127.0.0.1:{ingest_port}")])
        .args(["--server-ca-file", &ca])
        .arg("--client-cert-file")
        .arg(&files.agent_cert)
        .arg("--client-key-file")
        .arg(&files.agent_key)
        .arg("--pods-file")
        .arg(dir.join("pods.json"))
        .args(["--collector", "auto", "--resolution", "1s"])
        .args(["--metrics-bind-address", ""]);
    procs.spawn("agent", agent, &dir.join("agent.log"))?;

    let kubectl = |args: &[&str]| -> Result<String> {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&files.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run kubectl")?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok(text)
    };
    let deadline = opts.duration.map(|d| Instant::now() + d);
    // Rates need two points of each container: about two ticks after the agent starts.
    println!("waiting for the first metrics of both pods…");
    let first = Instant::now() + Duration::from_secs(30);
    // A signal before the first metrics ends the demo as one after them does: cleanly.
    let early = loop {
        procs.check_running(&dir)?;
        let top = kubectl(&["top", "pod", "-n", NAMESPACE, "--no-headers"])?;
        if PODS
            .iter()
            .all(|(pod, _, _)| top.lines().any(|l| l.starts_with(&format!("{pod} "))))
        {
            break None;
        }
        ensure!(
            Instant::now() < first,
            "no metrics of the demo pods after 30 s: kubectl said {top:?}; see the logs in {}",
            dir.display()
        );
        if let Ok(signal) = stop.recv_timeout(Duration::from_millis(250)) {
            break Some(signal);
        }
    };
    let mut refreshes = 0u32;
    let reason = if let Some(signal) = early {
        signal
    } else {
        loop {
            procs.check_running(&dir)?;
            let mut screen = String::new();
            for args in [
                ["top", "pod", "-A"].as_slice(),
                ["get", "podmetrics", "-A"].as_slice(),
            ] {
                let _ = writeln!(screen, "$ kubectl {}", args.join(" "));
                screen.push_str(&kubectl(args)?);
                screen.push('\n');
            }
            if opts.no_clear {
                println!("{screen}");
            } else {
                // What `watch` does: home, clear, draw.
                print!("\x1b[H\x1b[2J");
                let elapsed = started.elapsed().as_secs();
                println!(
                "kpulse demo — node {}, {elapsed} s — kubeconfig {} — Ctrl-C to stop\n\n{screen}",
                opts.node_name,
                files.kubeconfig.display()
            );
            }
            refreshes += 1;
            let wait = Duration::from_secs(1);
            let wait = match deadline {
                Some(d) if d <= Instant::now() => break "time is up",
                Some(d) => wait.min(d - Instant::now()),
                None => wait,
            };
            match stop.recv_timeout(wait) {
                Ok(signal) => break signal,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the signal thread ended"),
            }
        }
    };
    let (stopped, removed) = (procs.stop(), cgroups.remove());
    println!(
        "kpulse demo: {reason} after {} s and {refreshes} refreshes; stopped {stopped} \
         processes, removed {removed} cgroups; logs in {}",
        started.elapsed().as_secs(),
        dir.display()
    );
    Ok(())
}

/// Root, kubectl and python3.
fn check_prereqs() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .context("no Uid in /proc/self/status")?;
    ensure!(
        euid == "0",
        "the demo creates cgroups and loads eBPF programs: run it as root"
    );
    for (tool, hint) in [
        ("kubectl", "https://kubernetes.io/docs/tasks/tools/"),
        ("python3", "apt-get install python3"),
    ] {
        let found = Command::new(tool)
            .arg(if tool == "kubectl" {
                "version"
            } else {
                "--version"
            })
            .args(if tool == "kubectl" {
                ["--client"].as_slice()
            } else {
                [].as_slice()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ensure!(found, "the demo needs {tool} on PATH ({hint})");
    }
    Ok(())
}

/// SIGINT or SIGTERM, as a message, from a thread running a small tokio runtime (the
/// handlers replace the default action; children get the default back at exec).
pub(crate) fn stop_signal() -> Result<mpsc::Receiver<&'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("cannot start the signal runtime")?;
    // Installed here, before returning: a signal from now on is seen.
    let (mut int, mut term) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let name = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => "interrupted",
                _ = term.recv() => "terminated",
            }
        });
        let _ = tx.send(name);
    });
    Ok(rx)
}

/// What [`write_pki`] wrote.
pub(crate) struct PkiFiles {
    pub(crate) ca: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) agent_cert: PathBuf,
    pub(crate) agent_key: PathBuf,
    pub(crate) kubeconfig: PathBuf,
}

/// A CA, the server's certificate (localhost, 127.0.0.1), the agent's (CN = node), the
/// kubectl user's (`demo-admin` in `system:masters`) and a kubeconfig embedding the latter.
pub(crate) fn write_pki(dir: &Path, node: &str, api_port: u16) -> Result<PkiFiles> {
    let now = OffsetDateTime::now_utc();
    let (ca_pem, ca_key) = crate::certs::new_ca(now)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).context("using the new CA")?;
    let leaf = |cn: &str, org: Option<&str>, names: &[&str], server: bool| -> Result<_> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .context("certificate names")?;
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(o) = org {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(30);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("cannot generate a key")?;
        let cert = params
            .signed_by(&key, &issuer)
            .with_context(|| format!("cannot sign the certificate of {cn}"))?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let (server_crt, server_key) = leaf("localhost", None, &["localhost", "127.0.0.1"], true)?;
    let (agent_crt, agent_key) = leaf(node, None, &[], false)?;
    let (admin_crt, admin_key) = leaf(ADMIN_USER, Some(ADMIN_GROUP), &[], false)?;
    let w = crate::certs::write;
    w(dir, "ca.crt", &ca_pem, false)?;
    w(dir, "server.crt", &server_crt, false)?;
    w(dir, "server.key", &server_key, true)?;
    w(dir, "agent.crt", &agent_crt, false)?;
    w(dir, "agent.key", &agent_key, true)?;
    let b64 = crate::certs::b64;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kpulse-demo\n  cluster:\n    \
         server: https://127.0.0.1:{api_port}\n    certificate-authority-data: {}\n\
         users:\n- name: {ADMIN_USER}\n  user:\n    client-certificate-data: {}\n    \
         client-key-data: {}\ncontexts:\n- name: kpulse-demo\n  context:\n    cluster: \
         kpulse-demo\n    user: {ADMIN_USER}\ncurrent-context: kpulse-demo\n",
        b64(&ca_pem),
        b64(&admin_crt),
        b64(&admin_key),
    );
    w(dir, "kubeconfig", &kubeconfig, true)?;
    Ok(PkiFiles {
        ca: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
        agent_cert: dir.join("agent.crt"),
        agent_key: dir.join("agent.key"),
        kubeconfig: dir.join("kubeconfig"),
    })
}

/// The demo pods: `(pod, container, uid)`.
const PODS: [(&str, &str, &str); 2] = [
    ("web", "nginx", "6b1f3c2e-0d4a-4c5e-9f00-00000000d001"),
    ("cache", "redis", "6b1f3c2e-0d4a-4c5e-9f00-00000000d002"),
];

fn write_pods_file(path: &Path) -> Result<()> {
    let pods: Vec<_> = PODS
        .iter()
        .map(|(name, container, uid)| {
            serde_json::json!({
                "uid": uid, "namespace": NAMESPACE, "name": name,
                "labels": {"app": name},
                "containers": [{"name": container, "cgroup": format!("/{PARENT}/{name}")}],
            })
        })
        .collect();
    let json = serde_json::json!({ "pods": pods });
    fs::write(path, format!("{json:#}\n")).with_context(|| format!("writing {}", path.display()))
}

/// The cgroup hierarchies to create the demo's cgroups in.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hierarchies {
    /// Pure cgroup v2 with cpu and memory: one mount.
    Unified(PathBuf),
    /// The controller-less cgroup2 mount, and the v1 mounts carrying cpu, cpuacct and
    /// memory (`cpu` first: it takes the quota).
    Hybrid { unified: PathBuf, v1: Vec<PathBuf> },
}

pub(crate) fn detect_hierarchies() -> Result<Hierarchies> {
    let text = fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let h = hierarchies_from_mountinfo(&text)?;
    if let Hierarchies::Unified(mount) = &h {
        let controllers = fs::read_to_string(mount.join("cgroup.controllers"))?;
        for c in ["cpu", "memory"] {
            ensure!(
                controllers.split_whitespace().any(|x| x == c),
                "cgroup v2 at {} has no {c} controller",
                mount.display()
            );
        }
    }
    Ok(h)
}

/// Pure v2 when there is no v1 `memory` hierarchy; hybrid otherwise.
fn hierarchies_from_mountinfo(text: &str) -> Result<Hierarchies> {
    let mut unified = None;
    let (mut cpu, mut cpuacct, mut memory) = (None, None, None);
    for line in text.lines() {
        // `... mount_point options - fstype source super_options`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (fstype, opts) = (right.next(), right.nth(1).unwrap_or(""));
        let mount = PathBuf::from(mount);
        match fstype {
            Some("cgroup2") if unified.is_none() => unified = Some(mount),
            Some("cgroup") => {
                let opts: Vec<&str> = opts.split(',').collect();
                for (name, slot) in [
                    ("cpu", &mut cpu),
                    ("cpuacct", &mut cpuacct),
                    ("memory", &mut memory),
                ] {
                    if opts.contains(&name) && slot.is_none() {
                        *slot = Some(mount.clone());
                    }
                }
            }
            _ => {}
        }
    }
    let unified = unified.context("no cgroup2 mount")?;
    match (cpu, cpuacct, memory) {
        (None, None, None) => Ok(Hierarchies::Unified(unified)),
        (Some(cpu), Some(cpuacct), Some(memory)) => {
            let mut v1 = vec![cpu];
            for m in [cpuacct, memory] {
                if !v1.contains(&m) {
                    v1.push(m);
                }
            }
            Ok(Hierarchies::Hybrid { unified, v1 })
        }
        _ => bail!("cgroup v1 without all of cpu, cpuacct and memory: not supported"),
    }
}

/// Cgroups under one parent in every hierarchy; [`Cgroups::remove`] (or drop) kills what
/// runs in them and removes them, children first.
pub(crate) struct Cgroups {
    hierarchies: Hierarchies,
    /// The parent, relative to each mount.
    parent: String,
    /// Every directory created, parents first.
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    /// `parent` and, under it, `children` (paths relative to it, parents before their
    /// children: `a`, `a/b`), in every hierarchy of `h`; a tree left by a killed run is
    /// removed first.
    pub(crate) fn create(h: &Hierarchies, parent: &str, children: &[String]) -> Result<Cgroups> {
        let mounts: Vec<&PathBuf> = match h {
            Hierarchies::Unified(m) => vec![m],
            Hierarchies::Hybrid { unified, v1 } => v1.iter().chain([unified]).collect(),
        };
        // Left over by a run that was killed: clean it first.
        for m in &mounts {
            remove_tree(&m.join(parent));
        }
        let mut cg = Cgroups {
            hierarchies: match h {
                Hierarchies::Unified(m) => Hierarchies::Unified(m.clone()),
                Hierarchies::Hybrid { unified, v1 } => Hierarchies::Hybrid {
                    unified: unified.clone(),
                    v1: v1.clone(),
                },
            },
            parent: parent.to_owned(),
            dirs: Vec::new(),
        };
        for m in &mounts {
            let parent = m.join(parent);
            fs::create_dir(&parent).with_context(|| format!("mkdir {}", parent.display()))?;
            cg.dirs.push(parent.clone());
            let unified = matches!(h, Hierarchies::Unified(_));
            if unified {
                // The root must delegate cpu and memory for the parent to have them.
                let _ = fs::write(m.join("cgroup.subtree_control"), "+cpu +memory");
            }
            for c in children {
                let c = parent.join(c);
                if unified {
                    // Each directory delegates cpu and memory to the next one down.
                    if let Some(up) = c.parent() {
                        let ctl = up.join("cgroup.subtree_control");
                        fs::write(&ctl, "+cpu +memory").with_context(|| {
                            format!("enabling cpu and memory in {}", ctl.display())
                        })?;
                    }
                }
                fs::create_dir(&c).with_context(|| format!("mkdir {}", c.display()))?;
                cg.dirs.push(c);
            }
        }
        Ok(cg)
    }

    /// The cgroup `child` (as given to [`Cgroups::create`]) in every hierarchy.
    pub(crate) fn of(&self, child: &str) -> Vec<PathBuf> {
        let mounts: Vec<&PathBuf> = match &self.hierarchies {
            Hierarchies::Unified(m) => vec![m],
            Hierarchies::Hybrid { unified, v1 } => v1.iter().chain([unified]).collect(),
        };
        mounts
            .into_iter()
            .map(|m| m.join(&self.parent).join(child))
            .collect()
    }

    /// A shell prefix moving the shell into `child` in every hierarchy
    /// (`echo $$ > …/cgroup.procs && …`).
    pub(crate) fn join_shell(&self, child: &str) -> String {
        self.of(child)
            .iter()
            .map(|d| format!("echo $$ > '{}' && ", d.join("cgroup.procs").display()))
            .collect()
    }

    /// Limits `pod` to [`WEB_QUOTA_US`] per [`WEB_PERIOD_US`].
    fn limit_cpu(&self, pod: &str) -> Result<()> {
        let write = |path: PathBuf, value: String| {
            fs::write(&path, &value)
                .with_context(|| format!("writing {value} to {}", path.display()))
        };
        match &self.hierarchies {
            Hierarchies::Unified(m) => write(
                m.join(PARENT).join(pod).join("cpu.max"),
                format!("{WEB_QUOTA_US} {WEB_PERIOD_US}"),
            ),
            Hierarchies::Hybrid { v1, .. } => {
                let dir = v1[0].join(PARENT).join(pod);
                write(dir.join("cpu.cfs_period_us"), WEB_PERIOD_US.to_string())?;
                write(dir.join("cpu.cfs_quota_us"), WEB_QUOTA_US.to_string())
            }
        }
    }

    /// Kills what runs in them and removes them; how many were removed.
    pub(crate) fn remove(mut self) -> usize {
        let removed = self.dirs.len();
        self.remove_all();
        removed
    }

    fn remove_all(&mut self) {
        for d in self.dirs.drain(..).rev() {
            kill_members(&d);
            remove_dir(&d);
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// SIGKILLs every process in cgroup `dir` (not its children).
fn kill_members(dir: &Path) {
    let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in procs.split_whitespace() {
        let _ = Command::new("kill")
            .args(["-KILL", pid])
            .stderr(Stdio::null())
            .status();
    }
}

/// rmdir, retried briefly while the kernel releases the cgroup of killed processes.
fn remove_dir(dir: &Path) {
    for _ in 0..100 {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    eprintln!("kpulse demo: cannot remove {}", dir.display());
}

/// A left-over cgroup tree: kill its processes, remove children first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
        kill_members(dir);
        remove_dir(dir);
    }
}

/// `web` (a busy loop, half a core) and `cache` (200 MiB resident, then asleep), each
/// joining its cgroups before it starts (memory is charged where it is first touched).
fn start_workloads(cgroups: &Cgroups, procs: &mut Processes) -> Result<()> {
    cgroups.limit_cpu("web")?;
    let web = format!("{}while :; do :; done", cgroups.join_shell("web"));
    let cache = format!(
        "{}exec python3 -c 'import time; b = b\"x\" * ({CACHE_MIB} << 20); time.sleep(1 << 30)'",
        cgroups.join_shell("cache")
    );
    for (name, script) in [("web", web), ("cache", cache)] {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]);
        procs.spawn(name, cmd, Path::new("/dev/null"))?;
    }
    Ok(())
}

/// The processes the demo started; [`Processes::stop`] (or drop) ends them by PID.
#[derive(Default)]
pub(crate) struct Processes(Vec<(&'static str, PathBuf, Child)>);

impl Processes {
    /// Starts `cmd` in its own process group (a Ctrl-C is the demo's to handle), stdout
    /// and stderr to `log`.
    pub(crate) fn spawn(&mut self, name: &'static str, mut cmd: Command, log: &Path) -> Result<()> {
        use std::os::unix::process::CommandExt as _;
        let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .process_group(0)
            // Plain logs.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        self.0.push((name, log.to_path_buf(), child));
        Ok(())
    }

    /// Fails naming a process that exited, and its log.
    pub(crate) fn check_running(&mut self, dir: &Path) -> Result<()> {
        for (name, log, child) in &mut self.0 {
            if let Some(status) = child.try_wait()? {
                let log = if log.starts_with(dir) {
                    format!("; see {}", log.display())
                } else {
                    String::new()
                };
                bail!("{name} exited: {status}{log}");
            }
        }
        Ok(())
    }

    /// Last started first: SIGTERM (the agent and the server drain), SIGKILL after 3 s;
    /// how many.
    pub(crate) fn stop(mut self) -> usize {
        let n = self.0.len();
        self.stop_all();
        n
    }

    fn stop_all(&mut self) {
        for (_, _, mut child) in self.0.drain(..).rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "60", "s", "1.5s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hybrid_and_unified_layouts() {
        let hybrid = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            hierarchies_from_mountinfo(hybrid).expect("hybrid"),
            Hierarchies::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                v1: vec![
                    "/sys/fs/cgroup/cpu".into(),
                    "/sys/fs/cgroup/cpuacct".into(),
                    "/sys/fs/cgroup/memory".into()
                ],
            }
        );
        let joint = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            hierarchies_from_mountinfo(joint).expect("joint"),
            Hierarchies::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                v1: vec![
                    "/sys/fs/cgroup/cpu,cpuacct".into(),
                    "/sys/fs/cgroup/memory".into()
                ],
            }
        );
        let unified = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            hierarchies_from_mountinfo(unified).expect("unified"),
            Hierarchies::Unified("/sys/fs/cgroup".into())
        );
    }
}
