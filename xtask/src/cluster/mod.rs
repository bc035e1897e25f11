//! `cargo xtask cluster up | down | status`: a real single-node Kubernetes on this machine,
//! built from the components' published Go modules, with kpulse's images built from its
//! Containerfiles and imported, so that the README's install steps run on it as written.
//!
//! `up` builds what is missing ([`gobuild`], [`images`]; pinned in [`versions`]), then
//! starts, in order: etcd, kube-apiserver (aggregation layer as kubeadm sets it up),
//! kube-controller-manager, kube-scheduler, containerd (runc, CNI bridge), the kubelet,
//! kube-proxy, and CoreDNS; it waits for each and for the node to be `Ready`, and writes the
//! admin kubeconfig to `target/cluster/kubeconfig`. `--install` then runs the README's
//! install (`cargo xtask certs`, `kubectl apply -k deploy/`) and waits for both APIServices
//! and `kubectl top`. `down`, and any failure of `up`, undo everything ([`host::teardown`]).
//! What this changes on the machine, and the network's bounds, are in [`host`].

mod agent_in_vm;
mod arm64_node;
mod bench_discovery;
mod bench_fleet;
mod check;
mod custom_metrics;
mod daemons;
mod fallback;
mod faults;
mod fleet;
mod flowcontrol;
pub(crate) mod gobuild;
mod host;
mod images;
mod migrate;
mod pki;
mod swap;
mod tokens;
pub mod versions;
pub mod versus;

pub(crate) use host::unmount_under;

use std::{
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use host::Dirs;

/// `cargo xtask cluster` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Build what is missing and start the cluster; prints the kubeconfig's path.
    Up(UpOptions),
    /// Stop everything `up` started and undo every change it made to this machine.
    Down,
    /// Which processes run, the node, the metrics APIServices.
    Status,
    /// Only build the components and images (no cluster is started).
    Build(BuildOptions),
    /// Check kpulse on the running cluster with the real clients (after `up --install`).
    Check(CheckOptions),
    /// Discovery through kube-apiserver, idle and while thousands of simulated nodes stream
    /// to the installed aggregator-api (after `up --install`).
    BenchDiscovery(bench_discovery::Options),
    /// Thousands of Nodes and their Pods, kept by kwok, in the running cluster (or
    /// `--remove` them).
    Fleet(fleet::Options),
    /// What kpulse costs kube-apiserver and etcd with a kwok fleet (on against off, in
    /// alternating rounds), a replica's restart with every agent reconnecting, and `kubectl
    /// top` at that size (after `up --install`).
    BenchFleet(bench_fleet::Options),
}

#[derive(Debug, clap::Args)]
pub struct UpOptions {
    /// Kubernetes version (minor or full) among those in xtask/src/cluster/versions.rs.
    #[arg(long, default_value = versions::RELEASES[0].kubernetes)]
    kubernetes: String,
    /// Then install kpulse as the README says: `cargo xtask certs`, `kubectl apply -k deploy/`.
    #[arg(long)]
    install: bool,
    /// Instead of --install: install metrics-server first, then replace it with kpulse as
    /// deploy/README.md says, while `kubectl top pod -A` runs every 100 ms (every call must
    /// succeed).
    #[arg(long, conflicts_with = "install")]
    migrate: bool,
    /// On failure, leave everything running for a look (then `cluster down`).
    #[arg(long)]
    keep_on_failure: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckOptions {
    /// Only the checks whose name contains this (e.g. `HPA`, `rollout`, `kubectl.1.27`).
    #[arg(long)]
    only: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct BuildOptions {
    /// Kubernetes version (minor or full).
    #[arg(long, default_value = versions::RELEASES[0].kubernetes)]
    kubernetes: String,
    /// Only the release's Go components, not the images nor the arm64 node's components
    /// (`cargo xtask test` builds those once, with the first release, whose check runs the
    /// arm64 node).
    #[arg(long)]
    components_only: bool,
    /// Build the images, but leave booting the other architectures' agent images on their
    /// kernels (`agent_in_vm`) to the next `up` or `build`: `cargo xtask test` passes it to
    /// its background build, which gets only idle CPU while the VM stage's guests take all.
    #[arg(long)]
    no_image_boot: bool,
}

pub fn run(opts: &Options) -> Result<()> {
    match &opts.action {
        Action::Up(o) => up(o),
        Action::Down => down(),
        Action::Status => status(),
        Action::Check(o) => {
            let (dirs, kubectl) = running()?;
            check::run(&dirs, kubectl, o.only.as_deref(), true)
        }
        Action::BenchDiscovery(o) => {
            let (dirs, kubectl) = running()?;
            bench_discovery::run(o, &dirs, &kubectl)
        }
        Action::Fleet(o) => {
            let (dirs, _) = running()?;
            fleet::run(o, &dirs, &running_release(&dirs)?)
        }
        Action::BenchFleet(o) => {
            let (dirs, kubectl) = running()?;
            bench_fleet::run(o, &dirs, &kubectl, &running_release(&dirs)?)
        }
        Action::Build(o) => {
            let release = release(&o.kubernetes)?;
            let root = crate::vm::workspace_root()?;
            preflight()?;
            let dirs = Dirs::new(&root);
            if o.components_only {
                build_components(&dirs, &release).map(|_| ())
            } else {
                build_all(&root, &dirs, &release, !o.no_image_boot)?;
                // The arm64 node of `cluster check` (built once; the check finds it built).
                arm64_node::build(&root, &dirs.build, &release).map(|_| ())
            }
        }
    }
}

/// The running cluster's directories and its release's kubectl.
fn running() -> Result<(Dirs, PathBuf)> {
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    let release = running_release(&dirs)?;
    let kubectl = gobuild::kubernetes(&release).bin(&dirs.build, "kubectl");
    Ok((dirs, kubectl))
}

/// The release of the cluster that is up (what `up` wrote in its state).
pub(super) fn running_release(dirs: &Dirs) -> Result<versions::Release> {
    let version = fs::read_to_string(dirs.state.join("release"))
        .context("no cluster is up: cargo xtask cluster up --install")?;
    release(version.trim())
}

pub(crate) fn release(want: &str) -> Result<versions::Release> {
    versions::release(want).with_context(|| {
        format!(
            "Kubernetes {want} is not pinned; choose one of {}",
            versions::RELEASES
                .iter()
                .map(|r| r.kubernetes)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// What `up` needs from Debian, by the command that proves it is there.
const DEBIAN_PACKAGES: [(&str, &str); 13] = [
    ("/usr/include/seccomp.h", "libseccomp-dev"),
    ("/usr/bin/pkg-config", "pkg-config"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/sbin/conntrack", "conntrack"),
    ("/usr/bin/buildah", "buildah"),
    ("/usr/bin/mmdebstrap", "mmdebstrap"),
    // Runs the other architecture's binaries of kpulse's images (`images::Builder`).
    ("/usr/bin/qemu-aarch64", "qemu-user"),
    // Boots the arm64 agent image on Debian's arm64 kernel (`agent_in_vm`).
    ("/usr/bin/qemu-system-aarch64", "qemu-system-arm"),
    ("/bin/busybox", "busybox-static"),
    ("/usr/bin/gcc", "gcc"),
    ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
    // The arm64 pause program and the arm64 node's static runc.
    ("/usr/bin/aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("/usr/aarch64-linux-gnu/lib/libc.a", "libc6-dev-arm64-cross"),
];

/// Root, and the Debian packages (installed with apt when missing).
pub(crate) fn preflight() -> Result<()> {
    let uid = crate::exec::output(Command::new("id").arg("-u"))?;
    ensure!(uid.trim() == "0", "cargo xtask cluster needs root");
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if !missing.is_empty() {
        println!("cluster: installing Debian packages: {}", missing.join(" "));
        crate::exec::run(Command::new("apt-get").args([
            "-o",
            "DPkg::Lock::Timeout=300",
            "update",
            "-q",
        ]))?;
        crate::exec::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args([
                    "-o",
                    "DPkg::Lock::Timeout=300",
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                ])
                .args(&missing),
        )?;
    }
    Ok(())
}

/// Paths of what [`build_all`] made.
struct Built {
    kube: PathBuf,
    etcd: PathBuf,
    containerd: PathBuf,
    cni: PathBuf,
    runc: PathBuf,
    archives: Vec<images::Archive>,
}

impl Built {
    fn kube(&self, name: &str) -> PathBuf {
        self.kube.join(name)
    }
}

/// Builds (or finds built) the release's Go components: Kubernetes, then the others.
fn build_components(
    dirs: &Dirs,
    release: &versions::Release,
) -> Result<(gobuild::Component, Vec<gobuild::Component>)> {
    let kube = gobuild::kubernetes(release);
    gobuild::build(&kube, &dirs.build)?;
    let others = gobuild::node_components(release);
    for c in &others {
        gobuild::build(c, &dirs.build)?;
    }
    // Not run by `up`, but by the cluster checks' fleet: built here, with the rest (in CI
    // in the background), not in the middle of the checks.
    gobuild::build(&gobuild::kwok(), &dirs.build)?;
    Ok((kube, others))
}

/// Builds everything `up` runs; `boot_images`: also boot the other architectures' agent
/// images on their kernels (`agent_in_vm`).
fn build_all(
    root: &Path,
    dirs: &Dirs,
    release: &versions::Release,
    boot_images: bool,
) -> Result<Built> {
    let started = Instant::now();
    let (kube, others) = build_components(dirs, release)?;
    let find = |name: &str| -> Result<&gobuild::Component> {
        others
            .iter()
            .find(|c| c.name == name)
            .with_context(|| format!("no component {name}"))
    };
    let bin_dir = |c: &gobuild::Component| c.dir(&dirs.build).join("bin");
    let builder = images::Builder::new(root)?;
    builder.base_images()?;
    let mut archives = builder.kpulse_images(boot_images)?;
    let coredns = find("coredns")?;
    let ms = find("metrics-server")?;
    archives.extend(builder.addon_images(
        &coredns.bin(&dirs.build, "coredns"),
        &ms.bin(&dirs.build, "metrics-server"),
    )?);
    println!(
        "cluster: everything built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Built {
        kube: bin_dir(&kube),
        etcd: find("etcd")?.bin(&dirs.build, "etcd"),
        containerd: bin_dir(find("containerd")?),
        cni: bin_dir(find("cni-plugins")?),
        runc: find("runc")?.bin(&dirs.build, "runc"),
        archives,
    })
}

fn up(opts: &UpOptions) -> Result<()> {
    let release = release(&opts.kubernetes)?;
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    if dirs.state.join("release").exists() {
        bail!(
            "a cluster is up, or was not taken down: run `cargo xtask cluster down` first \
             ({} exists)",
            dirs.state.join("release").display()
        );
    }
    preflight()?;
    let started = Instant::now();
    let built = build_all(&root, &dirs, &release, true)?;
    dirs.create()?;
    fs::write(dirs.state.join("release"), release.kubernetes)?;
    let result = start(&dirs, &built, &release).and_then(|()| {
        if opts.install {
            install(&root, &dirs, &built)
        } else if opts.migrate {
            let t = step("migration from metrics-server under a reader");
            let text = migrate::migrate(&root, &dirs, &built.kube("kubectl"))?;
            done(&format!("migration: {text}"), t);
            Ok(())
        } else {
            Ok(())
        }
    });
    if let Err(e) = result {
        if opts.keep_on_failure {
            eprintln!(
                "cluster: up failed; left as it is (--keep-on-failure): cargo xtask cluster down"
            );
            return Err(e);
        }
        eprintln!(
            "cluster: up failed; taking down what it started (logs stay in {})",
            dirs.logs.display()
        );
        for p in teardown(&dirs) {
            eprintln!("cluster: down: {p}");
        }
        return Err(e);
    }
    println!(
        "cluster: Kubernetes {} up in {:.0} s\n  export KUBECONFIG={}\n  kubectl get nodes\n  \
         cargo xtask cluster down   # when done",
        release.kubernetes,
        started.elapsed().as_secs_f64(),
        dirs.kubeconfig().display()
    );
    Ok(())
}

/// `kubectl` of the cluster's own version with the admin kubeconfig.
fn kubectl(dirs: &Dirs, built: &Built) -> Command {
    let mut cmd = Command::new(built.kube("kubectl"));
    cmd.arg("--kubeconfig").arg(dirs.kubeconfig());
    cmd
}

fn step(what: &str) -> Instant {
    println!("cluster: {what}");
    Instant::now()
}

fn done(what: &str, since: Instant) {
    println!("cluster: {what} ({:.1} s)", since.elapsed().as_secs_f64());
}

/// An HTTP GET on loopback, plain; the status line and body.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse()?, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    s.take(64 * 1024).read_to_string(&mut body)?;
    Ok(body)
}

fn start(dirs: &Dirs, built: &Built, release: &versions::Release) -> Result<()> {
    let t = step("network: bridge, service route, sysctls, iptables guard");
    host::network_up(dirs)?;
    done("network ready", t);
    let t = step("swap: the machine's, or a file");
    host::swap_up(dirs)?;
    done(
        &format!("{} kB of swap", host::swap_total_kb().unwrap_or_default()),
        t,
    );

    let pki = pki::make(
        &dirs.pki,
        &pki::ApiserverNames {
            service_ip: host::KUBERNETES_SERVICE_IP,
            node_ip: host::NODE_IP,
        },
        daemons::NODE_NAME,
        &daemons::apiserver_url(),
    )?;
    fs::copy(dirs.pki.join("admin.kubeconfig"), dirs.kubeconfig())?;

    let t = step("etcd");
    let pid = host::start(dirs, "etcd", &built.etcd, &daemons::etcd(dirs), &[])?;
    host::wait_for(
        dirs,
        "etcd /health",
        Some(("etcd", pid)),
        Duration::from_secs(60),
        || Ok(http_get("127.0.0.1:2379", "/health")?.contains("\"health\":\"true\"")),
    )?;
    done("etcd healthy", t);

    let t = step(&format!("kube-apiserver {}", release.kubernetes));
    let pid = host::start(
        dirs,
        "kube-apiserver",
        &built.kube("kube-apiserver"),
        &daemons::apiserver(&pki),
        &[],
    )?;
    host::wait_for(
        dirs,
        "kube-apiserver /readyz",
        Some(("kube-apiserver", pid)),
        Duration::from_secs(120),
        || {
            let out = kubectl(dirs, built)
                .args(["get", "--raw", "/readyz", "--request-timeout=2s"])
                .output()?;
            Ok(out.status.success())
        },
    )?;
    done("kube-apiserver ready", t);

    let t = step("kube-controller-manager and kube-scheduler");
    let cm = host::start(
        dirs,
        "kube-controller-manager",
        &built.kube("kube-controller-manager"),
        &daemons::controller_manager(&pki),
        &[],
    )?;
    let sched = host::start(
        dirs,
        "kube-scheduler",
        &built.kube("kube-scheduler"),
        &daemons::scheduler(&pki),
        &[],
    )?;
    // Both are healthy when the API has a kube-root-ca.crt ConfigMap (controller-manager)
    // and once CoreDNS's pod is scheduled (below).
    host::wait_for(
        dirs,
        "kube-controller-manager (ConfigMap default/kube-root-ca.crt)",
        Some(("kube-controller-manager", cm)),
        Duration::from_secs(90),
        || {
            Ok(kubectl(dirs, built)
                .args(["-n", "default", "get", "configmap", "kube-root-ca.crt"])
                .output()?
                .status
                .success())
        },
    )?;
    ensure!(
        host::alive(sched),
        "kube-scheduler exited:\n{}",
        host::log_tail(dirs, "kube-scheduler", 30)
    );
    done("controllers running", t);

    let t = step("containerd");
    let config = daemons::containerd_config(dirs, &built.cni, &built.runc)?;
    let path = format!(
        "{}:{}",
        built.containerd.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    let pid = host::start(
        dirs,
        "containerd",
        &built.containerd.join("containerd"),
        &["--config".into(), config.display().to_string()],
        &[("PATH", path)],
    )?;
    let sock = dirs.containerd_socket();
    host::wait_for(
        dirs,
        "containerd's socket",
        Some(("containerd", pid)),
        Duration::from_secs(60),
        || {
            Ok(Command::new(built.containerd.join("ctr"))
                .arg("--address")
                .arg(&sock)
                .arg("version")
                .output()?
                .status
                .success())
        },
    )?;
    images::import(&built.containerd.join("ctr"), &sock, &built.archives)?;
    done(
        &format!("containerd up, {} images imported", built.archives.len()),
        t,
    );

    let t = step(&format!("kubelet {}", release.kubernetes));
    daemons::cni_config(dirs)?;
    host::pod_cgroups_up()?;
    let config = daemons::kubelet_config(dirs, &pki)?;
    let pid = host::start(
        dirs,
        "kubelet",
        &built.kube("kubelet"),
        &daemons::kubelet(dirs, &pki, &config),
        &[],
    )?;
    host::wait_for(
        dirs,
        "the node to be Ready",
        Some(("kubelet", pid)),
        Duration::from_secs(180),
        || {
            let out = kubectl(dirs, built)
                .args([
                    "get",
                    "node",
                    daemons::NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .output()?;
            Ok(String::from_utf8_lossy(&out.stdout).trim() == "True")
        },
    )?;
    done("node Ready", t);

    let t = step("kube-proxy");
    let config = daemons::kube_proxy_config(dirs, &pki)?;
    let pid = host::start(
        dirs,
        "kube-proxy",
        &built.kube("kube-proxy"),
        &[format!("--config={}", config.display())],
        &[],
    )?;
    host::wait_for(
        dirs,
        "kube-proxy /healthz",
        Some(("kube-proxy", pid)),
        Duration::from_secs(60),
        || {
            Ok(http_get("127.0.0.1:10256", "/healthz")?
                .lines()
                .next()
                .is_some_and(|status| status.contains(" 200 ")))
        },
    )?;
    host::guard_first()?;
    done("kube-proxy healthy", t);

    let t = step("CoreDNS");
    let manifest = daemons::coredns_manifest(dirs)?;
    crate::exec::run(kubectl(dirs, built).arg("apply").arg("-f").arg(&manifest))?;
    crate::exec::run(kubectl(dirs, built).args([
        "-n",
        "kube-system",
        "rollout",
        "status",
        "deployment/coredns",
        "--timeout=120s",
    ]))?;
    done("CoreDNS ready", t);
    Ok(())
}

/// The README's install, step by step, timed: `cargo xtask certs`, `kubectl apply -k
/// deploy/`, then the time from the apply until both APIServices are `Available=True` and
/// until `kubectl top pod -A` lists every running pod.
fn install(root: &Path, dirs: &Dirs, built: &Built) -> Result<()> {
    let t = step("install: cargo xtask certs");
    crate::certs::run(&crate::certs::Options {
        out: None,
        days: 365,
        new_ca: false,
    })?;
    done("certs", t);
    let applied = step("install: kubectl apply -k deploy/");
    crate::exec::run(
        kubectl(dirs, built)
            .current_dir(root)
            .args(["apply", "-k", "deploy/"]),
    )?;
    done("applied", applied);
    host::wait_for(
        dirs,
        "APIServices Available=True",
        None,
        Duration::from_secs(300),
        || {
            let out = kubectl(dirs, built)
                .args([
                    "get",
                    "apiservice",
                    "v1beta1.metrics.k8s.io",
                    "v1.metrics.k8s.io",
                    "-o",
                    "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Available\")].status}{\"\\n\"}{end}",
                ])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            Ok(text.lines().filter(|l| l.trim() == "True").count() == 2)
        },
    )?;
    let available = applied.elapsed();
    done(
        "install: both APIServices Available (since the apply)",
        applied,
    );
    let mut missing = Vec::new();
    host::wait_for(
        dirs,
        "kubectl top pod -A to list every running pod",
        None,
        Duration::from_secs(180),
        || {
            let running = crate::exec::output(kubectl(dirs, built).args([
                "get",
                "pods",
                "-A",
                "--field-selector=status.phase=Running",
                "-o",
                "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
            ]))?;
            let out = kubectl(dirs, built)
                .args(["top", "pod", "-A", "--no-headers"])
                .output()?;
            if !out.status.success() {
                return Ok(false);
            }
            let listed = String::from_utf8_lossy(&out.stdout).to_string();
            let listed: std::collections::BTreeSet<(String, String)> = listed
                .lines()
                .filter_map(|l| {
                    let mut w = l.split_whitespace();
                    Some((w.next()?.to_string(), w.next()?.to_string()))
                })
                .collect();
            missing = running
                .lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(ns, name)| (ns.to_string(), name.to_string()))
                .filter(|p| !listed.contains(p))
                .map(|(ns, name)| format!("{ns}/{name}"))
                .collect();
            Ok(!running.trim().is_empty() && missing.is_empty())
        },
    )
    .with_context(|| format!("not listed: {missing:?}"))?;
    println!(
        "cluster: install timing: kubectl apply -k deploy/ → both APIServices Available in \
         {:.1} s → kubectl top pod -A complete (every running pod) in {:.1} s",
        available.as_secs_f64(),
        applied.elapsed().as_secs_f64()
    );
    crate::exec::run(kubectl(dirs, built).args(["top", "pod", "-A"]))?;
    crate::exec::run(kubectl(dirs, built).args(["top", "node"]))?;
    Ok(())
}

/// Stops the kubelet, removes every pod through the CRI (CNI releases addresses, mounts go),
/// then [`host::teardown`].
fn teardown(dirs: &Dirs) -> Vec<String> {
    let kubelet_pid = fs::read_to_string(dirs.state.join("kubelet.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if let Some(pid) = kubelet_pid.filter(|p| host::alive(*p)) {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while host::alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let crictl = crictl(dirs);
    if dirs.containerd_socket().exists() && crictl.is_file() {
        let _ = Command::new("timeout")
            .arg("60")
            .arg(&crictl)
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", dirs.containerd_socket().display()))
            .args(["rmp", "--all", "--force"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    host::teardown(dirs)
}

/// The cluster's `crictl` (one build for every release).
pub(crate) fn crictl(dirs: &Dirs) -> PathBuf {
    dirs.build
        .join(format!("crictl-{}/bin/crictl", versions::CRI_TOOLS))
}

fn down() -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    let t = step("down: stopping pods and processes, undoing network, mounts, cgroups");
    let mut problems = teardown(&dirs);
    // Checked afresh, whatever teardown thought it did.
    problems.extend(
        host::leftovers(&dirs)
            .into_iter()
            .map(|l| format!("left behind: {l}")),
    );
    if problems.is_empty() {
        done("down: everything removed (no process, cgroup, mount, interface, iptables chain or sysctl of the cluster left)", t);
        Ok(())
    } else {
        bail!("down left things behind:\n  {}", problems.join("\n  "))
    }
}

/// The end-to-end test of `cargo xtask test`: `up --install` (or `--migrate`, from
/// metrics-server) with `kubernetes`, `check`, then `down` (also after a failure), which
/// must leave nothing behind.
pub fn end_to_end(kubernetes: &str, migrate: bool) -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    if dirs.state.join("release").exists() {
        println!("cluster: a cluster was left up; taking it down first");
        down()?;
    }
    up(&UpOptions {
        kubernetes: kubernetes.to_string(),
        install: !migrate,
        migrate,
        keep_on_failure: false,
    })?;
    let release = release(kubernetes)?;
    // The failure modes once, on the release installed as the README says.
    let checked = check::run(
        &dirs,
        gobuild::kubernetes(&release).bin(&dirs.build, "kubectl"),
        None,
        !migrate,
    );
    let downed = down();
    checked.and(downed)
}

fn status() -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    let Ok(version) = fs::read_to_string(dirs.state.join("release")) else {
        println!("cluster: not up");
        return Ok(());
    };
    println!("cluster: Kubernetes {}", version.trim());
    let mut entries: Vec<_> = fs::read_dir(&dirs.state)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let pid: Option<u32> = fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let name = e
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let state = match pid {
            Some(p) if host::alive(p) => format!("running (pid {p})"),
            Some(p) => format!(
                "NOT running (pid {p} gone; see {})",
                dirs.logs.join(format!("{name}.log")).display()
            ),
            None => "unknown".into(),
        };
        println!("  {name:<24} {state}");
    }
    let release = release(version.trim())?;
    let kubectl_bin = gobuild::kubernetes(&release).bin(&dirs.build, "kubectl");
    for args in [
        vec!["get", "nodes", "-o", "wide"],
        vec![
            "get",
            "apiservices",
            "v1beta1.metrics.k8s.io",
            "v1.metrics.k8s.io",
        ],
        vec!["get", "pods", "-A"],
    ] {
        let _ = Command::new(&kubectl_bin)
            .arg("--kubeconfig")
            .arg(dirs.kubeconfig())
            .args(&args)
            .arg("--request-timeout=5s")
            .status();
    }
    Ok(())
}
