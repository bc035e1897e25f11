//! `cargo xtask test`: every test of the project, as CI runs it.
//!
//! 1. the eBPF toolchain and object (`build-ebpf --release`, installing what is missing);
//! 2. `cargo fmt --check`, `cargo clippy --all-targets -D warnings`, and the same lints on
//!    `ebpf/` with Debian's clippy (`build_ebpf::clippy`, installing `rust-web-clippy`);
//! 3. `cargo test` of the host workspace: unit tests, the `deploy/` manifest checks
//!    (`xtask/tests/manifests.rs`, real `kubectl kustomize`), and the accuracy test against
//!    this machine's kernel (real cgroups, processes and eBPF; root needed);
//! 4. the agent's kernel-facing tests again inside qemu VMs booting Debian's 6.1 and 6.12
//!    kernels with pure cgroup v2 ([`VM_TESTS`]: accuracy, eBPF faults, agent restart).
//!
//! 5. kpulse on a real single-node Kubernetes of each pinned release
//!    (`cluster::end_to_end`: `cluster up --install` on the first, `cluster up --migrate`
//!    from metrics-server on the others, then `cluster check` and `cluster down`).
//!
//! With `CI=true` nothing may skip: the accuracy test fails instead of skipping, and the
//! VM and cluster stages cannot be turned off.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{bail, ensure, Context, Result};

use crate::{build_ebpf, cluster, exec, vm};

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
const VM_TESTS: [&str; 3] = ["accuracy", "faults", "agent_restart"];

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn in_ci() -> bool {
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
        vm::ensure_prereqs()?;
        let mut tests = Vec::with_capacity(VM_TESTS.len());
        for name in VM_TESTS {
            tests.push((name, test_executable(&root, "kpulse-agent", name)?));
        }
        let agent = root.join("target/debug/kpulse-agent");
        ensure!(
            agent.is_file(),
            "{} is missing: the host tests should have built it",
            agent.display()
        );
        let kernels: Vec<vm::Kernel> = if opts.kernels.is_empty() {
            vm::Kernel::all().to_vec()
        } else {
            opts.kernels.clone()
        };
        let env = vec![
            ("CI".to_string(), "true".to_string()),
            (
                "KPULSE_AGENT_BIN".to_string(),
                "/kpulse/kpulse-agent".to_string(),
            ),
            ("RUST_BACKTRACE".to_string(), "1".to_string()),
        ];
        let files = vec![(agent, "/kpulse/kpulse-agent".to_string())];
        let mut failed = Vec::new();
        for k in kernels {
            for (name, exe) in &tests {
                let outcome = vm::run_in_vm_retrying(
                    &root,
                    &vm::VmRun {
                        kernel: k,
                        exe,
                        args: &[],
                        env: &env,
                        extra_files: &files,
                        timeout: Duration::from_secs(600),
                        memory_mib: 1024,
                        cpus: 2,
                    },
                )
                .with_context(|| format!("VM run of {name} on kernel {k}"))?;
                println!("--- {name} on kernel {k}: exit code {}", outcome.exit_code);
                print!("{}", outcome.output);
                if outcome.exit_code != 0 {
                    failed.push(format!("{name} on {k}"));
                }
            }
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
        let versions: Vec<String> = if opts.kubernetes.is_empty() {
            cluster::versions::RELEASES
                .iter()
                .map(|r| r.kubernetes.to_string())
                .collect()
        } else {
            opts.kubernetes.clone()
        };
        for (i, v) in versions.iter().enumerate() {
            let started = std::time::Instant::now();
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
