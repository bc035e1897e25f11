//! An agent image built for another architecture than this machine's, run on that
//! architecture's kernel: a qemu VM (`vm::run_in_vm`, TCG) whose root file system is the
//! image's files (its loader, C library and binary; every file owned by root, as the agent
//! runs), booting Debian's kernel of the image's architecture with pure cgroup v2.
//!
//! The image's `kpulse-agent dump --collector ebpf` must load the embedded eBPF object there
//! (no fallback to the cgroup files) and report a cgroup the script made and left idle with
//! the kernel's own figures: `cpu.stat`'s `usage_usec`, `memory.current`, and
//! `memory.current` less `memory.stat`'s `inactive_file`, read just before and just after the
//! agent. The agent's kernel-facing tests run on the same kernel in `cargo xtask test`'s VM
//! stage from a cross-built test binary; this runs the image an arm64 node would pull.
//!
//! The run takes about 10 s here (TCG), but the cluster builds its images on every `up`: a
//! run that passed is remembered by the image's digest, the kernel package and
//! [`CHECK_VERSION`] (`<dir>/checked/`), so the same image is not booted twice on the same
//! kernel by the same check.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::vm::{self, Arch, Kernel};

/// Part of a passed run's record: raise it when the script or the comparison changes.
const CHECK_VERSION: u32 = 1;
/// The cgroup the script fills and leaves idle.
const CGROUP: &str = "/kpulse-vm/image-check";
/// Relative slack on the kernel's before/after range (the accuracy targets' ±2 %).
const TOLERANCE: f64 = 0.02;
/// Least CPU time and memory the script's cgroup must have for the comparison to mean
/// something: the busy loop, and the 4 MiB tmpfs file it writes.
const MIN_CPU_NS: u64 = 1_000_000;
const MIN_MEMORY_BYTES: u64 = 4 << 20;
/// Boot, script, power-off: 8 s on an idle machine; generous for a background build that
/// gets only idle CPU.
const TIMEOUT: Duration = Duration::from_secs(900);

/// The guest's test: busybox `sh` from the VM, the agent from the image.
fn script() -> String {
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask cluster build` (xtask/src/cluster/agent_in_vm.rs).
set -eu
cg=/sys/fs/cgroup{CGROUP}
mkdir $cg
# CPU time, and memory that stays charged (a tmpfs file), in a cgroup then left idle.
sh -c "echo \$\$ > $cg/cgroup.procs; i=0; while [ \$i -lt 20000 ]; do i=\$((i+1)); done; head -c {MIN_MEMORY_BYTES} /dev/zero > /tmp/image-check"
sleep 1
kernel() {{
    echo "kernel $1 $(sed -n 's/^usage_usec //p' $cg/cpu.stat) $(cat $cg/memory.current) $(sed -n 's/^inactive_file //p' $cg/memory.stat)"
}}
kernel before
/usr/local/bin/kpulse-agent dump --collector ebpf --count 1
kernel after
"#
    )
}

/// Runs the agent of the image mounted at `image_root` (`name` for `arch`, `digest`) in a VM
/// of `arch`, unless this digest already passed; `dir` is the image builder's directory.
pub fn check(
    workspace: &Path,
    dir: &Path,
    name: &str,
    digest: &str,
    image_root: &Path,
    arch: Arch,
) -> Result<()> {
    let kernel = Kernel::newest(arch).with_context(|| format!("no VM kernel for {arch:?}"))?;
    let package =
        vm::installed_package(workspace, kernel).unwrap_or_else(|| kernel.package().into());
    let stamp = stamp_path(dir, digest, &package)?;
    if let Ok(passed) = fs::read_to_string(&stamp) {
        println!(
            "cluster: {name} for {}: this image ({digest}) passed on {package} before: {}",
            arch.debian(),
            passed.trim()
        );
        return Ok(());
    }
    let script_path = dir.join(format!("agent-in-vm-{}.sh", arch.debian()));
    fs::write(&script_path, script())
        .and_then(|()| {
            fs::set_permissions(
                &script_path,
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
        })
        .with_context(|| format!("cannot write {}", script_path.display()))?;
    println!(
        "cluster: {name} for {}: booting Debian's {kernel} kernel under qemu (TCG) with the \
         image as its root file system",
        arch.debian()
    );
    let started = Instant::now();
    let outcome = vm::run_in_vm_retrying(
        workspace,
        &vm::VmRun {
            kernel,
            exe: &script_path,
            args: &[],
            env: &[],
            extra_files: &[],
            root_fs: Some(image_root),
            timeout: TIMEOUT,
            memory_mib: 1024,
            cpus: 2,
            tap: None,
            cancel: None,
            pid_file: None,
        },
    )
    .with_context(|| format!("{name} for {}: the VM run", arch.debian()))?;
    ensure!(
        outcome.exit_code == 0,
        "{name} for {}: the agent's run on kernel {kernel} exited with {}:\n{}",
        arch.debian(),
        outcome.exit_code,
        outcome.output
    );
    let report = Report::parse(&outcome.output).with_context(|| {
        format!(
            "{name} for {} on kernel {kernel}: the agent's output\n{}",
            arch.debian(),
            outcome.output
        )
    })?;
    // The kernel the VM booted (downloaded by the run if it was not there).
    let package = vm::installed_package(workspace, kernel).unwrap_or(package);
    let stamp = stamp_path(dir, digest, &package)?;
    let summary = format!(
        "{report} ({package}, {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    println!("cluster: {name} for {}: {summary}", arch.debian());
    if let Some(parent) = stamp.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    fs::write(&stamp, format!("{summary}\n"))
        .with_context(|| format!("cannot write {}", stamp.display()))
}

/// Where a passed run of the image `digest` on the kernel of Debian package `package`
/// (`name version`) is remembered.
fn stamp_path(dir: &Path, digest: &str, package: &str) -> Result<PathBuf> {
    let (algorithm, hex) = digest
        .split_once(':')
        .filter(|(a, h)| {
            !a.is_empty()
                && a.bytes().all(|b| b.is_ascii_alphanumeric())
                && !h.is_empty()
                && h.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .with_context(|| format!("{digest:?} is not an image digest"))?;
    ensure!(!package.is_empty(), "no kernel package");
    // Debian's names and versions, with the space between and an epoch's colon as `_`.
    let package: String = package
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+-.~".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(dir
        .join("checked")
        .join(format!("{algorithm}-{hex}.{package}.v{CHECK_VERSION}")))
}

/// The kernel's figures for the idle cgroup, as the script printed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelFigures {
    usage_usec: u64,
    memory_current: u64,
    inactive_file: u64,
}

/// What the agent reported and the kernel's range around it.
#[derive(Debug, PartialEq)]
struct Report {
    cpu_ns: u64,
    usage: u64,
    working_set: u64,
    before: KernelFigures,
    after: KernelFigures,
}

impl Report {
    fn parse(output: &str) -> Result<Report> {
        let mut before = None;
        let mut after = None;
        let mut cgroup = None;
        let mut node = false;
        for line in output.lines() {
            if let Some(rest) = line.strip_prefix("kernel ") {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let [when, usec, current, inactive] = fields[..] else {
                    bail!("a kernel line with {} fields: {line:?}", fields.len());
                };
                let number = |s: &str| -> Result<u64> {
                    s.parse()
                        .with_context(|| format!("{s:?} in {line:?} is not a number"))
                };
                let figures = KernelFigures {
                    usage_usec: number(usec)?,
                    memory_current: number(current)?,
                    inactive_file: number(inactive)?,
                };
                match when {
                    "before" => before = Some(figures),
                    "after" => after = Some(figures),
                    other => bail!("a kernel line {other:?}"),
                }
            } else if line.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("the agent printed {line:?}"))?;
                let collector = v["collector"].as_str().unwrap_or_default();
                ensure!(
                    collector == "ebpf",
                    "the agent collected with {collector:?}, not eBPF: {line}"
                );
                match v["kind"].as_str() {
                    Some("node") => node = v["cpu_ns"].as_u64().is_some_and(|n| n > 0),
                    Some("cgroup") if v["path"].as_str() == Some(CGROUP) => {
                        let field = |key: &str| -> Result<u64> {
                            v[key]
                                .as_u64()
                                .with_context(|| format!("no {key} for {CGROUP}: {line}"))
                        };
                        cgroup = Some((
                            field("cpu_ns")?,
                            field("memory_usage_bytes")?,
                            field("memory_working_set_bytes")?,
                        ));
                    }
                    _ => {}
                }
            }
        }
        let before = before.context("the script printed no kernel figures before the agent")?;
        let after = after.context("the script printed no kernel figures after the agent")?;
        let (cpu_ns, usage, working_set) =
            cgroup.with_context(|| format!("the agent reported no cgroup {CGROUP}"))?;
        ensure!(node, "the agent reported no node CPU time");
        let report = Report {
            cpu_ns,
            usage,
            working_set,
            before,
            after,
        };
        report.check()?;
        Ok(report)
    }

    fn check(&self) -> Result<()> {
        let (b, a) = (self.before, self.after);
        ensure!(
            b.usage_usec.saturating_mul(1000) >= MIN_CPU_NS && b.memory_current >= MIN_MEMORY_BYTES,
            "the cgroup had too little to compare ({} µs, {} bytes)",
            b.usage_usec,
            b.memory_current
        );
        within(
            "CPU time (µs)",
            self.cpu_ns / 1000,
            b.usage_usec,
            a.usage_usec,
        )?;
        within(
            "memory usage",
            self.usage,
            b.memory_current,
            a.memory_current,
        )?;
        let ws = |k: KernelFigures| k.memory_current.saturating_sub(k.inactive_file);
        within("working set", self.working_set, ws(b), ws(a))
    }
}

/// `value` lies between `one` and `other` (either order), give or take [`TOLERANCE`].
fn within(what: &str, value: u64, one: u64, other: u64) -> Result<()> {
    let (lo, hi) = (one.min(other) as f64, one.max(other) as f64);
    let v = value as f64;
    ensure!(
        v >= lo * (1.0 - TOLERANCE) && v <= hi * (1.0 + TOLERANCE),
        "{what}: the agent reported {value}, the kernel {one} before and {other} after \
         (±{:.0} %)",
        TOLERANCE * 100.0
    );
    Ok(())
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        write!(
            f,
            "the image's agent loaded its eBPF object; idle cgroup: CPU {:.3} ms (kernel {:.3} \
             ms), memory {:.2} MiB (kernel {:.2}), working set {:.2} MiB (kernel {:.2})",
            self.cpu_ns as f64 / 1e6,
            self.after.usage_usec as f64 / 1e3,
            mib(self.usage),
            mib(self.after.memory_current),
            mib(self.working_set),
            mib(self
                .after
                .memory_current
                .saturating_sub(self.after.inactive_file)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(agent_cpu_ns: u64, collector: &str) -> String {
        format!(
            "kernel before 52311 6291456 4194304\n\
             2026-12-06T04:00:00Z  INFO kpulse_agent: collector ready collector={collector}\n\
             {{\"kind\":\"cgroup\",\"collector\":\"{collector}\",\"timestamp_ns\":1,\"path\":\"/\",\
             \"id\":1,\"cpu_ns\":9000000000,\"memory_usage_bytes\":null}}\n\
             {{\"kind\":\"cgroup\",\"collector\":\"{collector}\",\"timestamp_ns\":1,\
             \"path\":\"{CGROUP}\",\"id\":7,\"cpu_ns\":{agent_cpu_ns},\
             \"memory_usage_bytes\":6291456,\"memory_working_set_bytes\":2097152,\
             \"memory_rss_bytes\":0}}\n\
             {{\"kind\":\"node\",\"collector\":\"{collector}\",\"timestamp_ns\":1,\
             \"cpu_ns\":9000000000,\"memory_working_set_bytes\":1}}\n\
             kernel after 52311 6291456 4194304\n"
        )
    }

    #[test]
    fn the_kernels_figures_pass() -> Result<()> {
        let report = Report::parse(&output(52_311_999, "ebpf"))?;
        assert_eq!(report.cpu_ns, 52_311_999);
        assert_eq!(report.working_set, 2 << 20);
        assert!(report
            .to_string()
            .contains("CPU 52.312 ms (kernel 52.311 ms)"));
        Ok(())
    }

    #[test]
    fn other_figures_or_another_collector_fail() {
        let wrong = Report::parse(&output(60_000_000, "ebpf")).err();
        assert!(
            wrong.is_some_and(|e| e.to_string().contains("CPU time (µs)")),
            "a CPU figure 15 % off passed"
        );
        let fallback = Report::parse(&output(52_311_000, "cgroupfs")).err();
        assert!(fallback.is_some_and(|e| e.to_string().contains("not eBPF")));
        let fails_with = |text: &str, what: &str| {
            let e = Report::parse(text).err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(what)),
                "{e:?} instead of {what:?}"
            );
        };
        let missing = output(52_311_000, "ebpf").replace(CGROUP, "/elsewhere");
        fails_with(&missing, "reported no cgroup");
        let no_after = output(52_311_000, "ebpf").replace("kernel after", "x");
        fails_with(&no_after, "no kernel figures after");
        let idle = output(0, "ebpf").replace("52311", "0");
        fails_with(&idle, "too little to compare");
    }

    #[test]
    fn stamps_are_named_by_digest_only() -> Result<()> {
        let dir = Path::new("/d");
        let package = "linux-image-6.12.117+deb12-cloud-arm64 6.12.117-1~deb12u1";
        assert_eq!(
            stamp_path(dir, "sha256:0a1f", package)?,
            Path::new(
                "/d/checked/sha256-0a1f.linux-image-6.12.117+deb12-cloud-arm64_6.12.117-1~deb12u1.v1"
            )
        );
        assert!(stamp_path(dir, "sha256:../x", package).is_err());
        assert!(stamp_path(dir, "", package).is_err());
        assert_eq!(
            stamp_path(dir, "sha256:0a1f", "../x")?,
            Path::new("/d/checked/sha256-0a1f..._x.v1")
        );
        Ok(())
    }

    #[test]
    fn the_script_runs_the_images_agent_with_the_ebpf_collector() {
        let s = script();
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains("/usr/local/bin/kpulse-agent dump --collector ebpf --count 1\n"));
        assert!(s.contains("cg=/sys/fs/cgroup/kpulse-vm/image-check\n"));
        let (before, after) = (
            s.find("kernel before").unwrap_or(usize::MAX),
            s.find("kernel after").unwrap_or(0),
        );
        assert!(before < after);
    }
}
