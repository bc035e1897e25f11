//! `cargo xtask test`: every test of the project, as CI runs it.
//!
//! 1. the eBPF toolchain and object (`build-ebpf --release`, installing what is missing);
//! 2. `cargo fmt --check`, `cargo clippy --all-targets -D warnings`, the same lints on
//!    `ebpf/` with Debian's clippy (`build_ebpf::clippy`, installing `rust-web-clippy`), and
//!    `go-golden --check` (aggregator-api's `golden.jsonl` is what Go prints);
//! 3. `cargo test` of the host workspace: unit tests, the `deploy/` manifest checks
//!    (`xtask/tests/manifests.rs`, real `kubectl kustomize`), and the accuracy test against
//!    this machine's kernel (real cgroups, processes and eBPF; root needed);
//! 4. the agent's kernel-facing tests again inside qemu VMs booting Debian's 6.1 and 6.12
//!    amd64 kernels and its 6.12 arm64 kernel with pure cgroup v2 ([`VM_TESTS`]: accuracy,
//!    agent restart, eBPF faults; one boot per kernel). For arm64 the agent and the tests are
//!    cross-built first (`cross::build`), with the same eBPF object.
//!
//! 5. kpulse on a real single-node Kubernetes of each pinned release
//!    (`cluster::end_to_end`: `cluster up --install` on the first, `cluster up --migrate`
//!    from metrics-server on the others, then `cluster check` and `cluster down`).
//!
//! The clusters' builds (about 35 minutes of a cold run) start in the background right
//! after stage 1 ([`ClusterPrebuild`]), as `SCHED_IDLE` processes: they take only the CPU
//! the lints and tests leave idle, and stage 5 waits for its release's build. They include
//! the images; booting the arm64 agent image in an arm64 VM (`cluster::agent_in_vm`) is
//! left to stage 5's `up`, in the foreground.
//!
//! With `CI=true` nothing may skip: the accuracy test fails instead of skipping, and the
//! VM and cluster stages cannot be turned off.

use std::{
    fs::{self, File},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::{build_ebpf, cluster, cross, exec, go_golden, vm};

/// `cargo xtask test` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Skip the qemu VM stage (refused when CI=true).
    #[arg(long)]
    pub no_vm: bool,
    /// Only these kernels in the VM stage (default: all).
    #[arg(long = "kernel")]
    pub kernels: Vec<vm::Kernel>,
    /// Skip the real-cluster stage (refused when CI=true).
    #[arg(long)]
    pub no_cluster: bool,
    /// Only these Kubernetes versions in the cluster stage (default: every pinned release).
    #[arg(long = "kubernetes")]
    pub kubernetes: Vec<String>,
}

/// The agent's integration tests that run again in every VM kernel: each depends on the
/// kernel (BTF layout, iterator and link behaviour) or on the cgroup hierarchy (pure v2 there,
/// hybrid on this host). `churn` runs on this host only: under TCG the agent's heap sometimes
/// ends a round about 180 KiB higher, once, when ticks overrun (see
/// docs/design/collection.md), which its strict memory check cannot tell from a leak.
///
/// One boot per kernel runs them all, one after another in this order (the host stage's
/// order, where they also share one machine): a boot costs about half a minute under TCG.
const VM_TESTS: [&str; 3] = ["accuracy", "agent_restart", "faults"];
/// Where the VM stage puts the kernel's `brd` module, for the tests' swap area.
const SWAP_MODULE_GUEST: &str = "/kpulse/brd.ko";

/// Where the guest finds the test executables.
const VM_TEST_DIR: &str = "/kpulse/tests";

/// The line the guest's suite prints after each test: `<prefix><name> <exit code>`.
const VM_SUITE_MARK: &str = "==> kpulse-vm-suite: exit code of ";

/// The guest's `/bin/sh` script: each test of [`VM_TESTS`] in turn, its exit code after it;
/// the script's own code is the number of tests that failed.
fn vm_suite_script() -> String {
    let mut script = String::from("#!/bin/sh\n# Written by `cargo xtask test`.\nfailed=0\n");
    for name in VM_TESTS {
        script.push_str(&format!(
            "echo '==> kpulse-vm-suite: {name}'\n{VM_TEST_DIR}/{name}\ncode=$?\n\
             echo \"{VM_SUITE_MARK}{name} $code\"\n[ $code -eq 0 ] || failed=$((failed + 1))\n"
        ));
    }
    script.push_str("exit $failed\n");
    script
}

/// The (test, exit code) pairs the suite printed.
fn vm_suite_exit_codes(output: &str) -> Vec<(String, i32)> {
    output
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix(VM_SUITE_MARK))
        .filter_map(|rest| {
            let (name, code) = rest.rsplit_once(' ')?;
            Some((name.to_string(), code.parse().ok()?))
        })
        .collect()
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Whether this runs in CI (`CI=true`), where nothing may be skipped.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs every stage; stops at the first failing one.
pub fn run(opts: &Options) -> Result<()> {
    let ci = in_ci();
    if ci && opts.no_vm {
        bail!("--no-vm is refused when CI=true: the VM kernels are part of the test suite");
    }
    if ci && opts.no_cluster {
        bail!("--no-cluster is refused when CI=true: the real cluster is part of the test suite");
    }
    let root = vm::workspace_root()?;
    let versions: Vec<String> = if opts.kubernetes.is_empty() {
        cluster::versions::RELEASES
            .iter()
            .map(|r| r.kubernetes.to_string())
            .collect()
    } else {
        opts.kubernetes.clone()
    };
    let kernels: Vec<vm::Kernel> = if opts.kernels.is_empty() {
        vm::Kernel::all().to_vec()
    } else {
        opts.kernels.clone()
    };
    let mut arches: Vec<vm::Arch> = kernels.iter().map(|k| k.arch()).collect();
    arches.sort();
    arches.dedup();
    let mut passed = 0u32;
    // A cold run writes about 16 GiB: Rust's target/ (about 6 GiB with .ci/run's settings),
    // the Go module and build caches of the cluster stage, the VM kernels and the images.
    // Say what there is, so that a run that fills the disk is told from a failing test.
    println!("xtask test: {}", disk_free(&root));

    let t = stage("eBPF toolchain and object");
    build_ebpf::run(&build_ebpf::Options {
        release: true,
        no_install: false,
        clippy: false,
    })?;
    finished("eBPF toolchain and object", t);
    passed += 1;

    // What the later stages need from apt is installed now, in the foreground, so that the
    // background build never runs apt beside another apt.
    let prebuild = if opts.no_cluster {
        None
    } else {
        cluster::preflight()?;
        if !opts.no_vm {
            vm::ensure_prereqs(&arches)?;
        }
        // `cluster up` boots the arm64 agent image in a VM (`cluster::agent_in_vm`): its
        // kernel and busybox are downloaded now, in the foreground, so that nothing unpacks
        // them beside the VM stage or the background build.
        for arch in [vm::Arch::Amd64, vm::Arch::Arm64] {
            if arch != vm::Arch::host() {
                let kernel = vm::Kernel::newest(arch)
                    .with_context(|| format!("no VM kernel for {}", arch.debian()))?;
                vm::fetch(&root, kernel)?;
            }
        }
        Some(ClusterPrebuild::start(&root, &versions)?)
    };

    let t = stage("format and lints");
    exec::run(cargo().current_dir(&root).args(["fmt", "--all", "--check"]))?;
    exec::run(cargo().current_dir(&root).args([
        "clippy",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The host clippy skips ebpf/ (it only builds for bpfel-unknown-none): Debian's clippy of
    // the eBPF build's own rustc lints it.
    build_ebpf::clippy()?;
    // aggregator-api's Go goldens are what Go prints now.
    go_golden::run(&go_golden::Options { check: true })?;
    finished("format and lints", t);
    passed += 1;

    let t = stage("host tests (unit tests; accuracy on this kernel)");
    // The agent's integration tests make Cargo build `target/debug/kpulse-agent`, which the
    // VM stage copies into its guests; a separate `cargo build -p kpulse-agent` first would
    // compile about twenty crates twice, with the agent's features instead of the workspace's.
    exec::run(cargo().current_dir(&root).args([
        "test",
        "--workspace",
        "--exclude",
        "kpulse-ebpf",
    ]))?;
    finished("host tests", t);
    passed += 1;

    if opts.no_vm {
        println!("xtask test: VM stage skipped (--no-vm)");
    } else {
        let t = stage("agent tests in qemu VMs (Debian kernels, pure cgroup v2)");
        vm::ensure_prereqs(&arches)?;
        let agent = root.join("target/debug/kpulse-agent");
        ensure!(
            agent.is_file(),
            "{} is missing: the host tests should have built it",
            agent.display()
        );
        let mut host_files = vec![(agent, "/kpulse/kpulse-agent".to_string())];
        for name in VM_TESTS {
            host_files.push((
                test_executable(&root, "kpulse-agent", name)?,
                format!("{VM_TEST_DIR}/{name}"),
            ));
        }
        // Cross-built when the first arm64 kernel comes.
        let mut arm64_files: Option<Vec<(PathBuf, String)>> = None;
        let suite = root.join("target/vm/suite.sh");
        fs::create_dir_all(root.join("target/vm"))?;
        fs::write(&suite, vm_suite_script())
            .and_then(|()| {
                fs::set_permissions(&suite, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            })
            .with_context(|| format!("cannot write {}", suite.display()))?;
        let env = vec![
            ("CI".to_string(), "true".to_string()),
            (
                "KPULSE_AGENT_BIN".to_string(),
                "/kpulse/kpulse-agent".to_string(),
            ),
            ("RUST_BACKTRACE".to_string(), "1".to_string()),
        ];
        let mut failed = Vec::new();
        for &k in &kernels {
            let mut files = match k.arch() {
                vm::Arch::Amd64 => host_files.clone(),
                vm::Arch::Arm64 => match &arm64_files {
                    Some(files) => files.clone(),
                    None => {
                        let built = Instant::now();
                        match arm64_vm_files(&root) {
                            Ok(files) => {
                                println!(
                                    "--- the agent and its tests cross-built for arm64 in {:.0} s",
                                    built.elapsed().as_secs_f64()
                                );
                                arm64_files.insert(files).clone()
                            }
                            Err(e) => {
                                println!("--- kernel {k}: the arm64 build failed: {e:#}");
                                failed.push(format!("the arm64 build for {k}"));
                                continue;
                            }
                        }
                    }
                },
            };
            let booted = Instant::now();
            // The RAM-disk driver the accuracy test puts its swap area on (see its `swap`).
            let brd = vm::kernel_module(&root, k, "drivers/block/brd")?;
            files.push((brd, SWAP_MODULE_GUEST.to_string()));
            let mut env = env.clone();
            env.push((
                "KPULSE_SWAP_MODULE".to_string(),
                SWAP_MODULE_GUEST.to_string(),
            ));
            let outcome = vm::run_in_vm_retrying(
                &root,
                &vm::VmRun {
                    kernel: k,
                    exe: &suite,
                    args: &[],
                    env: &env,
                    extra_files: &files,
                    root_fs: None,
                    // Each test takes one to three minutes under TCG (x86-64 on x86-64), up to
                    // twice that emulating Arm.
                    timeout: Duration::from_secs(600 * VM_TESTS.len() as u64),
                    memory_mib: 1024,
                    cpus: 2,
                    tap: None,
                    cancel: None,
                    pid_file: None,
                },
            )
            .with_context(|| format!("VM run of {} on kernel {k}", VM_TESTS.join(", ")))?;
            print!("{}", outcome.output);
            let codes = vm_suite_exit_codes(&outcome.output);
            for name in VM_TESTS {
                match codes.iter().find(|(n, _)| n == name) {
                    Some((_, 0)) => println!("--- {name} on kernel {k}: passed"),
                    Some((_, code)) => {
                        println!("--- {name} on kernel {k}: exit code {code}");
                        failed.push(format!("{name} on {k}"));
                    }
                    None => {
                        println!("--- {name} on kernel {k}: did not report");
                        failed.push(format!("{name} on {k} (no report)"));
                    }
                }
            }
            println!(
                "--- kernel {k}: one boot, {} tests, {:.0} s",
                VM_TESTS.len(),
                booted.elapsed().as_secs_f64()
            );
        }
        if !failed.is_empty() {
            println!("stages: {passed} passed, 1 failed");
            bail!("VM stage failed: {}", failed.join(", "));
        }
        finished("VM stage", t);
        passed += 1;
    }
    if opts.no_cluster {
        println!("xtask test: cluster stage skipped (--no-cluster)");
    } else {
        let t = stage(
            "kpulse on real Kubernetes clusters (cargo xtask cluster: up --install, check, down)",
        );
        for (i, v) in versions.iter().enumerate() {
            let started = std::time::Instant::now();
            if let Some(p) = &prebuild {
                if let Err(e) = p.wait(v) {
                    println!("stages: {passed} passed, 1 failed");
                    return Err(e.context(format!("cluster stage failed on Kubernetes {v}")));
                }
            }
            // The newest release installs kpulse on a fresh cluster as the README says; the
            // others replace a running metrics-server as deploy/README.md says.
            let migrate = i > 0;
            if let Err(e) = cluster::end_to_end(v, migrate) {
                println!("stages: {passed} passed, 1 failed");
                return Err(e.context(format!("cluster stage failed on Kubernetes {v}")));
            }
            println!(
                "xtask test: Kubernetes {v}: built, up, checked and down in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        finished("cluster stage", t);
        passed += 1;
    }
    println!("stages: {passed} passed, 0 failed");
    Ok(())
}

/// The cluster stage's builds, run by a thread of this process as child processes
/// (`cargo xtask cluster build`, one release after another; the images with the first) under
/// `chrt --idle 0`: the kernel runs them only on CPU time no other task wants, so the tests
/// keep their speed while the builds fill what they leave idle. Each child leads its own
/// process group, which dropping this (a stage failed, or everything finished) ends by PID.
struct ClusterPrebuild {
    /// One report per release, in order, until one fails.
    reports: mpsc::Receiver<Prebuilt>,
    /// buildah's storage and run root: a build stopped midway leaves its mounts there.
    images: PathBuf,
    state: Arc<Mutex<PrebuildState>>,
    thread: Option<thread::JoinHandle<()>>,
}

#[derive(Default)]
struct PrebuildState {
    cancelled: bool,
    /// The running child's PID, which is also its process group's ID.
    child: Option<u32>,
}

struct Prebuilt {
    version: String,
    log: PathBuf,
    took: Duration,
    outcome: Result<(), String>,
}

impl ClusterPrebuild {
    fn start(root: &Path, versions: &[String]) -> Result<ClusterPrebuild> {
        let exe = std::env::current_exe().context("cannot find this xtask's executable")?;
        let dir = root.join("target/cluster");
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // At most one report per release: the channel holds no more than `versions.len()`.
        let (tx, reports) = mpsc::channel();
        let state = Arc::new(Mutex::new(PrebuildState::default()));
        let shared = Arc::clone(&state);
        let versions = versions.to_vec();
        println!(
            "xtask test: building the clusters ({}) in the background, SCHED_IDLE; logs: {}",
            versions.join(", "),
            dir.join("prebuild-<version>.log").display()
        );
        let thread = thread::Builder::new()
            .name("cluster-prebuild".into())
            .spawn(move || {
                for (i, version) in versions.into_iter().enumerate() {
                    let log = dir.join(format!("prebuild-{version}.log"));
                    let started = Instant::now();
                    let outcome = prebuild_one(&exe, &version, i > 0, &log, &shared);
                    let failed = outcome.is_err();
                    let report = Prebuilt {
                        version,
                        log,
                        took: started.elapsed(),
                        outcome: outcome.map_err(|e| format!("{e:#}")),
                    };
                    if tx.send(report).is_err() || failed {
                        break;
                    }
                }
            })
            .context("cannot start the background build's thread")?;
        Ok(ClusterPrebuild {
            reports,
            images: root.join("target/cluster/images"),
            state,
            thread: Some(thread),
        })
    }

    /// Waits for `version`'s build; says what it built and how long the wait was.
    fn wait(&self, version: &str) -> Result<()> {
        let started = Instant::now();
        let report = self.reports.recv().map_err(|_| {
            anyhow!("the background build stopped before it built Kubernetes {version}")
        })?;
        ensure!(
            report.version == version,
            "the background build reported Kubernetes {} while Kubernetes {version} was \
             awaited",
            report.version
        );
        let text = fs::read_to_string(&report.log).unwrap_or_default();
        match report.outcome {
            Ok(()) => {
                for line in text.lines().filter(|l| {
                    l.contains(" built in ") || l.contains(" made in ") || l.contains("kept (")
                }) {
                    println!("  background: {line}");
                }
                println!(
                    "xtask test: Kubernetes {version}: background build took {:.0} s; this \
                     stage waited {:.0} s for it",
                    report.took.as_secs_f64(),
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            }
            Err(e) => {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(60)..].join("\n");
                bail!(
                    "building Kubernetes {version} (in the background) failed: {e}\n--- last \
                     lines of {} ---\n{tail}",
                    report.log.display()
                )
            }
        }
    }
}

/// One `cargo xtask cluster build` child, to its end; its PID is in `state` while it runs.
fn prebuild_one(
    exe: &Path,
    version: &str,
    components_only: bool,
    log: &Path,
    state: &Mutex<PrebuildState>,
) -> Result<()> {
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new("chrt");
    cmd.args(["--idle", "0"])
        .arg(exe)
        .args(["cluster", "build", "--kubernetes", version]);
    if components_only {
        cmd.arg("--components-only");
    } else {
        // Idle CPU only: `up`, in the foreground, boots the arm64 agent image.
        cmd.arg("--no-image-boot");
    }
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = {
        let mut s = state
            .lock()
            .map_err(|_| anyhow!("background build state poisoned"))?;
        ensure!(!s.cancelled, "cancelled");
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        s.child = Some(child.id());
        child
    };
    let status = child.wait();
    if let Ok(mut s) = state.lock() {
        s.child = None;
    }
    let status = status.context("waiting for the background build")?;
    ensure!(status.success(), "`{cmd:?}` failed ({status})");
    Ok(())
}

impl Drop for ClusterPrebuild {
    fn drop(&mut self) {
        let mut stopped = false;
        if let Ok(mut s) = self.state.lock() {
            s.cancelled = true;
            if let Some(pid) = s.child {
                println!("xtask test: stopping the background build (process group {pid})");
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{pid}")])
                    .status();
                stopped = true;
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // buildah, stopped in a build, leaves its containers' overlays mounted (and the
        // checkout then cannot be removed).
        if stopped {
            for point in cluster::unmount_under(std::slice::from_ref(&self.images)) {
                println!(
                    "xtask test: still mounted after the build stopped: {}",
                    point.display()
                );
            }
        }
    }
}

#[must_use = "the stage's start, for `finished`"]
fn stage(name: &str) -> std::time::Instant {
    println!("\n==> xtask test: {name}");
    std::time::Instant::now()
}

/// One line per finished stage, so that CI's log says what each costs.
fn finished(name: &str, since: std::time::Instant) {
    let free = vm::workspace_root()
        .map(|root| disk_free(&root))
        .unwrap_or_else(|e| format!("disk: unknown ({e})"));
    println!(
        "==> xtask test: {name}: passed in {:.0} s ({free})",
        since.elapsed().as_secs_f64()
    );
}

/// The space left on the file system of `target/`, as `df` reports it to this user.
fn disk_free(root: &std::path::Path) -> String {
    let out = exec::output(
        Command::new("df")
            .args(["--output=avail,target", "-B1"])
            .arg(root),
    );
    let parsed = out.ok().and_then(|out| {
        let line = out.lines().nth(1)?.to_string();
        let (avail, mount) = line.trim().split_once(' ')?;
        Some((avail.parse::<u64>().ok()?, mount.trim().to_string()))
    });
    match parsed {
        Some((avail, mount)) => format!(
            "disk: {:.1} GiB free on {mount}",
            avail as f64 / (1u64 << 30) as f64
        ),
        None => "disk: free space unknown (df failed)".to_string(),
    }
}

/// The agent and its [`VM_TESTS`] built for arm64, as (host path, guest path).
fn arm64_vm_files(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let built = cross::build(root, "kpulse-agent", &VM_TESTS)?;
    let agent = built
        .bins
        .iter()
        .find(|(name, _)| name == "kpulse-agent")
        .map(|(_, exe)| exe.clone())
        .context("the arm64 build made no kpulse-agent binary")?;
    let mut files = vec![(agent, "/kpulse/kpulse-agent".to_string())];
    for name in VM_TESTS {
        let (_, exe) = built
            .tests
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("the arm64 build made no test {name}"))?;
        files.push((exe.clone(), format!("{VM_TEST_DIR}/{name}")));
    }
    Ok(files)
}

/// Builds an integration test without running it and returns its executable.
fn test_executable(root: &std::path::Path, package: &str, test: &str) -> Result<PathBuf> {
    let out = exec::output(cargo().current_dir(root).args([
        "test",
        "--no-run",
        "--message-format=json",
        "-p",
        package,
        "--test",
        test,
    ]))?;
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == test {
            if let Some(exe) = v["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo did not report an executable for test {test} of {package}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_suite_runs_every_test_and_reports_each_exit_code() {
        let script = vm_suite_script();
        assert!(script.starts_with("#!/bin/sh\n"));
        for name in VM_TESTS {
            assert!(
                script.contains(&format!("\n{VM_TEST_DIR}/{name}\n")),
                "{script}"
            );
        }
        // What a guest prints: every test's output, then its mark; a failing one counts.
        let output = format!(
            "==> kpulse-vm-suite: accuracy\nok\n{VM_SUITE_MARK}accuracy 0\n\
             {VM_SUITE_MARK}agent_restart 101\r\nnot a mark: {VM_SUITE_MARK}\n"
        );
        assert_eq!(
            vm_suite_exit_codes(&output),
            vec![
                ("accuracy".to_string(), 0),
                ("agent_restart".to_string(), 101)
            ]
        );
    }

    #[test]
    fn the_vm_suite_script_runs_in_a_shell() -> Result<()> {
        // The same script with the tests replaced by shell functions: one fails.
        let script = vm_suite_script().replace(&format!("{VM_TEST_DIR}/"), "t_");
        let body = format!(
            "t_accuracy() {{ echo acc; }}\nt_agent_restart() {{ return 3; }}\nt_faults() {{ :; }}\n{}",
            script.trim_start_matches("#!/bin/sh\n")
        );
        let out = Command::new("sh").arg("-c").arg(&body).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert_eq!(
            vm_suite_exit_codes(&text),
            vec![
                ("accuracy".to_string(), 0),
                ("agent_restart".to_string(), 3),
                ("faults".to_string(), 0)
            ]
        );
        Ok(())
    }
}
