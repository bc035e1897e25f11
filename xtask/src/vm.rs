//! `cargo xtask vm`: run a Linux test executable inside qemu VMs that boot Debian's 6.1 and
//! 6.12 amd64 cloud kernels and its 6.12 arm64 cloud kernel with a pure cgroup v2 hierarchy,
//! and report its output and exit status.
//!
//! How a run works:
//! - The kernel is a Debian `linux-image-*-cloud-{amd64,arm64}` package (BTF built in),
//!   fetched once with `apt-get download` (arm64: with `cross::Apt`'s private configuration)
//!   and unpacked with `dpkg-deb -x` under `target/vm/<kernel>/`.
//! - The root file system is an initramfs written here (newc cpio, gzipped by `gzip`):
//!   busybox-static of the kernel's architecture, the test executable (amd64: with every
//!   library `ldd` lists; arm64: it must be static, as `cross::build` makes it), the extra
//!   files, and an `/init` script. The script mounts proc, sysfs, devtmpfs, cgroup2, bpffs, tracefs,
//!   debugfs and a tmpfs `/tmp`, brings up the loopback interface, enables `+cpu +memory`,
//!   moves itself into the leaf cgroup
//!   `/kpulse-vm/runner`, runs the test with stdout and stderr on the second serial port, then
//!   writes `KPULSE-EXIT-<token>-<code>` there and powers off. The token is random per run, so
//!   the test's own output cannot fake the status.
//! - qemu runs with TCG only: this host's /dev/kvm is paravirtual and Debian kernels crash or
//!   hang on it. amd64: serial port 1 (ttyS0) carries the kernel console, port 2 (ttyS1) the
//!   test. arm64 (`-machine virt -cpu max,pauth-impdef=on`: pointer authentication with
//!   qemu's cheap algorithm): the PL011 (ttyAMA0) carries the console, a virtio console
//!   (hvc0, built into Debian's cloud-arm64 kernel) the test.
//!
//! Not a test harness: it runs one executable per kernel and says how it exited.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::{cross, cross::Apt, exec};

/// Debian package of the 6.1 LTS cloud kernel (bookworm).
pub const PACKAGE_6_1: &str = "linux-image-6.1.0-57-cloud-amd64";
/// Debian package of the 6.12 LTS cloud kernel (bookworm-backports/security).
pub const PACKAGE_6_12: &str = "linux-image-6.12.117+deb12-cloud-amd64";
/// Debian package of the 6.12 LTS arm64 cloud kernel (the same build as [`PACKAGE_6_12`]).
pub const PACKAGE_ARM64_6_12: &str = "linux-image-6.12.117+deb12-cloud-arm64";

/// Where Debian's `busybox-static` puts its (static) binary.
const BUSYBOX: &str = "/bin/busybox";
/// Kernel command line after the console: pure cgroup v2, no reboot loops.
const KERNEL_ARGS: &str =
    "systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all panic=-1 quiet rdinit=/init";

/// The machine a VM emulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// x86-64, this host's own.
    Amd64,
    /// 64-bit Arm.
    Arm64,
}

impl Arch {
    /// Debian's name of the architecture.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The architecture of Debian's (and OCI's) name `name`.
    pub fn from_debian(name: &str) -> Result<Arch> {
        match name {
            "amd64" => Ok(Arch::Amd64),
            "arm64" => Ok(Arch::Arm64),
            other => bail!("no architecture {other:?}: amd64 or arm64"),
        }
    }

    /// The architecture of this machine (and of this executable).
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }

    /// qemu's user-mode emulator of this architecture (Debian's `qemu-user`).
    pub fn qemu_user(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-x86_64",
            Arch::Arm64 => "qemu-aarch64",
        }
    }

    /// The qemu binary (TCG only, see the module docs).
    fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// `e_machine` of this architecture's ELF files.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// The guest's console device (the kernel's `console=`).
    fn console(self) -> &'static str {
        match self {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    /// The guest device the test's output goes to.
    fn output_device(self) -> &'static str {
        match self {
            Arch::Amd64 => "/dev/ttyS1",
            Arch::Arm64 => "/dev/hvc0",
        }
    }

    /// The machine and the two character devices: `console` on the console port, `output`
    /// on the test's.
    fn qemu_machine_args(self) -> &'static [&'static str] {
        match self {
            Arch::Amd64 => &["-serial", "chardev:console", "-serial", "chardev:output"],
            Arch::Arm64 => &[
                "-machine",
                "virt",
                "-cpu",
                "max,pauth-impdef=on",
                "-serial",
                "chardev:console",
                "-device",
                "virtio-serial-pci",
                "-device",
                "virtconsole,chardev=output",
            ],
        }
    }
}
/// The MAC address of `cargo xtask vm --tap`'s card (locally administered, qemu's prefix).
pub const TAP_MAC: &str = "52:54:00:6b:70:01";
/// Prefix of the exit-status line the guest writes after the test; a token and code follow.
const MARKER_PREFIX: &str = "KPULSE-EXIT-";
/// Environment variable that keeps a run's staging directory (initramfs, serial logs).
const KEEP_ENV: &str = "KPULSE_VM_KEEP";
/// Where the test executable goes in the guest.
const GUEST_BIN_DIR: &str = "/kpulse";
/// In `target/vm/<kernel>/`: `Package Version` of the package actually unpacked.
const PACKAGE_STAMP: &str = "PACKAGE";
/// In `target/vm/<kernel>/`: the pinned package asked for (a fallback may have been used).
const PINNED_STAMP: &str = "PINNED";
/// Console lines quoted in errors.
const CONSOLE_TAIL: usize = 50;

/// A Debian cloud kernel the VM can boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kernel {
    /// 6.1 LTS (Debian 12's own kernel).
    V6_1,
    /// 6.12 LTS (Debian 13's kernel, built for Debian 12).
    V6_12,
    /// 6.12 LTS for arm64, under qemu's Arm emulation.
    Arm64V6_12,
}

impl Kernel {
    /// Every kernel: amd64 oldest first, then arm64.
    pub fn all() -> &'static [Kernel] {
        &[Kernel::V6_1, Kernel::V6_12, Kernel::Arm64V6_12]
    }

    /// The newest kernel of `arch`.
    pub fn newest(arch: Arch) -> Option<Kernel> {
        Kernel::all().iter().copied().rfind(|k| k.arch() == arch)
    }

    /// The machine this kernel runs on.
    pub fn arch(self) -> Arch {
        match self {
            Kernel::V6_1 | Kernel::V6_12 => Arch::Amd64,
            Kernel::Arm64V6_12 => Arch::Arm64,
        }
    }

    /// The Debian package this kernel comes from when the archive still has it.
    pub fn package(self) -> &'static str {
        match self {
            Kernel::V6_1 => PACKAGE_6_1,
            Kernel::V6_12 => PACKAGE_6_12,
            Kernel::Arm64V6_12 => PACKAGE_ARM64_6_12,
        }
    }

    /// apt for this kernel's architecture.
    fn apt(self, root: &Path) -> Result<Apt> {
        match self.arch() {
            Arch::Amd64 => Ok(Apt::host()),
            Arch::Arm64 => Apt::arm64(root),
        }
    }

    /// The `apt-cache search --names-only` pattern of this kernel's series.
    fn search_pattern(self) -> String {
        let arch = self.arch().debian();
        match self {
            Kernel::V6_1 => format!(r"^linux-image-6\.1\.0-[0-9]+-cloud-{arch}$"),
            Kernel::V6_12 | Kernel::Arm64V6_12 => {
                format!(r"^linux-image-6\.12\.[0-9]+.*-cloud-{arch}$")
            }
        }
    }

    /// If `name` is a package of this kernel series (`linux-image-6.1.0-N-cloud-amd64`,
    /// `linux-image-6.12.N+debM-cloud-{amd64,arm64}`), its ordering key: higher is newer.
    fn package_key(self, name: &str) -> Option<u64> {
        let prefix = match self {
            Kernel::V6_1 => "linux-image-6.1.0-",
            Kernel::V6_12 | Kernel::Arm64V6_12 => "linux-image-6.12.",
        };
        let suffix = format!("-cloud-{}", self.arch().debian());
        let middle = name.strip_prefix(prefix)?.strip_suffix(suffix.as_str())?;
        let (number, rest) = match middle.find(|c: char| !c.is_ascii_digit()) {
            Some(i) => middle.split_at(i),
            None => (middle, ""),
        };
        let ok_rest = match self {
            Kernel::V6_1 => rest.is_empty(),
            Kernel::V6_12 | Kernel::Arm64V6_12 => rest.is_empty() || rest.starts_with("+deb"),
        };
        if !ok_rest || rest.contains('-') {
            return None;
        }
        number.parse().ok()
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
            Kernel::Arm64V6_12 => "6.12-arm64",
        })
    }
}

impl FromStr for Kernel {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "6.1" => Ok(Kernel::V6_1),
            "6.12" => Ok(Kernel::V6_12),
            "6.12-arm64" => Ok(Kernel::Arm64V6_12),
            other => bail!("unknown kernel {other:?}: expected 6.1, 6.12 or 6.12-arm64"),
        }
    }
}

/// `cargo xtask vm [--kernel 6.1|6.12|6.12-arm64]... [--timeout SECS] -- <exe> [args...]`
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Kernel to boot (repeatable): 6.1, 6.12 or 6.12-arm64 (the executable must then be a
    /// static arm64 one). Default: all of them.
    #[arg(long = "kernel", value_name = "VERSION")]
    kernels: Vec<Kernel>,
    /// Seconds a VM may run (boot, test, power-off) before it is killed.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    timeout: u64,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    memory: u32,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// A network card on this host's tap device (made and bridged beforehand), MAC
    /// [`TAP_MAC`].
    #[arg(long, value_name = "DEVICE")]
    tap: Option<String>,
    /// Environment variable for the test (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env_arg)]
    env: Vec<(String, String)>,
    /// Extra file to copy into the guest (repeatable).
    #[arg(long = "file", value_name = "HOST:GUEST", value_parser = parse_file_arg)]
    files: Vec<(PathBuf, String)>,
    /// Also print the kernel console log of each VM.
    #[arg(long)]
    console: bool,
    /// The test executable (built for the kernels' architecture) and its arguments.
    #[arg(last = true, required = true, value_name = "EXE [ARGS]")]
    command: Vec<String>,
}

fn parse_env_arg(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    check_env_key(key).map_err(|e| e.to_string())?;
    Ok((key.to_owned(), value.to_owned()))
}

fn parse_file_arg(s: &str) -> Result<(PathBuf, String), String> {
    let (host, guest) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:GUEST"))?;
    guest_rel_path(guest).map_err(|e| e.to_string())?;
    Ok((PathBuf::from(host), guest.to_owned()))
}

/// One test run in one VM.
#[derive(Clone, Debug)]
pub struct VmRun<'a> {
    /// The kernel to boot.
    pub kernel: Kernel,
    /// Host path of the test executable (an ELF for the kernel's architecture, static for
    /// arm64, or a `#!/bin/sh` script).
    pub exe: &'a Path,
    /// Its arguments.
    pub args: &'a [String],
    /// Environment for the test, on top of `PATH`, `HOME`, `KPULSE_IN_VM=1`, `KPULSE_VM_KERNEL`.
    pub env: &'a [(String, String)],
    /// Files to copy in: (host path, absolute guest path). ELF executables bring their libraries.
    pub extra_files: &'a [(PathBuf, String)],
    /// A root file system copied in before anything else (a container image's, mounted), so
    /// that its programs run with its own loader and libraries; its `/dev`, `/proc` and
    /// `/sys` are left out (the guest mounts its own). Nothing of the VM's may replace a file
    /// of it.
    pub root_fs: Option<&'a Path>,
    /// Wall-clock limit for the whole VM, boot to power-off.
    pub timeout: Duration,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Guest vCPUs.
    pub cpus: u32,
    /// A network card on this host's tap device of that name (made and attached to a bridge
    /// by the caller), with this MAC address; `None`: no network but loopback.
    pub tap: Option<(&'a str, &'a str)>,
    /// Set by another thread: the VM is killed and the run fails ("cancelled").
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// Where qemu's PID is written while it runs (so that whoever cleans up after a killed
    /// caller can end it), removed when it ends.
    pub pid_file: Option<&'a Path>,
}

/// What a VM run reported.
#[derive(Clone, Debug)]
pub struct VmOutcome {
    /// The test's exit code (128 + N when killed by signal N).
    pub exit_code: i32,
    /// The test's stdout and stderr, from the dedicated serial port.
    pub output: String,
    /// The kernel console log.
    pub console: String,
}

/// Runs `cargo xtask vm`: the executable on each chosen kernel; fails if any run fails.
pub fn run(opts: &Options) -> Result<()> {
    let root = workspace_root()?;
    let (exe, args) = opts
        .command
        .split_first()
        .context("no executable given: cargo xtask vm -- <exe> [args...]")?;
    let exe = PathBuf::from(exe);
    ensure!(exe.is_file(), "{} is not a file", exe.display());
    let kernels: Vec<Kernel> = if opts.kernels.is_empty() {
        // The kernels of the executable's architecture; this host's for a script.
        let mut head = Vec::new();
        File::open(&exe)
            .and_then(|f| f.take(64).read_to_end(&mut head))
            .with_context(|| format!("failed to read {}", exe.display()))?;
        let arch = if elf_executable_machine(&head) == Some(Arch::Arm64.elf_machine()) {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        Kernel::all()
            .iter()
            .copied()
            .filter(|k| k.arch() == arch)
            .collect()
    } else {
        let mut k = opts.kernels.clone();
        k.sort();
        k.dedup();
        k
    };
    let mut arches: Vec<Arch> = kernels.iter().map(|k| k.arch()).collect();
    arches.dedup();
    ensure_prereqs(&arches)?;

    let mut failures = Vec::new();
    for &kernel in &kernels {
        let vm = VmRun {
            kernel,
            exe: &exe,
            args,
            env: &opts.env,
            extra_files: &opts.files,
            root_fs: None,
            timeout: Duration::from_secs(opts.timeout),
            memory_mib: opts.memory,
            cpus: opts.cpus,
            tap: opts.tap.as_deref().map(|t| (t, TAP_MAC)),
            cancel: None,
            pid_file: None,
        };
        let started = Instant::now();
        let result = run_in_vm_retrying(&root, &vm);
        let secs = started.elapsed().as_secs_f64();
        let package = installed_package(&root, kernel).unwrap_or_else(|| kernel.package().into());
        match result {
            Ok(outcome) => {
                println!(
                    "==> kernel {kernel} ({package}): exit code {} after {secs:.1} s",
                    outcome.exit_code
                );
                print!("{}", outcome.output);
                if !outcome.output.is_empty() && !outcome.output.ends_with('\n') {
                    println!();
                }
                if opts.console {
                    println!("--> kernel {kernel} console:\n{}", outcome.console);
                }
                if outcome.exit_code != 0 {
                    failures.push(format!("{kernel}: exit code {}", outcome.exit_code));
                }
            }
            Err(e) => {
                println!("==> kernel {kernel} ({package}): VM failed after {secs:.1} s");
                eprintln!("{e:#}");
                let first_line = e.to_string().lines().next().unwrap_or_default().to_owned();
                failures.push(format!("{kernel}: {first_line}"));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} VM runs failed: {}",
            failures.len(),
            kernels.len(),
            failures.join("; ")
        );
    }
    Ok(())
}

pub fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .with_context(|| format!("{} has no parent directory", manifest_dir.display()))
}

/// Checks for what VMs of `arches` need (qemu for each; a static busybox; for arm64 the
/// cross compiler and C library its executables are linked with); installs them with apt
/// when root on Debian.
pub fn ensure_prereqs(arches: &[Arch]) -> Result<()> {
    let mut missing = missing_prereqs(arches);
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().map(|(package, _)| *package).collect();
    let fix = format!("apt-get install {}", packages.join(" "));
    let why: Vec<&str> = missing.iter().map(|(_, why)| why.as_str()).collect();
    if !is_root()?
        || !Path::new("/etc/debian_version").exists()
        || find_in_path("apt-get").is_none()
    {
        bail!(
            "missing VM prerequisites: {}; install them with `sudo apt-get update && sudo {fix}`",
            why.join("; ")
        );
    }
    eprintln!("vm: {}; running apt-get update && {fix}", why.join("; "));
    // A fresh machine may have no package lists (or stale ones): update first, as apt wants.
    exec::run(Command::new("apt-get").args(["update", "-q"])).context("apt-get update failed")?;
    exec::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("{fix} failed"))?;
    missing = missing_prereqs(arches);
    if !missing.is_empty() {
        let why: Vec<&str> = missing.iter().map(|(_, why)| why.as_str()).collect();
        bail!("still missing after {fix}: {}", why.join("; "));
    }
    Ok(())
}

/// (Debian package, reason) for each missing prerequisite of VMs of `arches`.
fn missing_prereqs(arches: &[Arch]) -> Vec<(&'static str, String)> {
    let mut missing = Vec::new();
    for &arch in arches {
        let package = match arch {
            Arch::Amd64 => "qemu-system-x86",
            Arch::Arm64 => "qemu-system-arm",
        };
        if find_in_path(arch.qemu()).is_none() {
            missing.push((package, format!("{} not found in PATH", arch.qemu())));
        }
    }
    if arches.contains(&Arch::Arm64) {
        if find_in_path(cross::GCC).is_none() {
            missing.push((
                "gcc-aarch64-linux-gnu",
                format!("{} not found in PATH", cross::GCC),
            ));
        }
        // Only recommended by the compiler's package; the static link needs it.
        if !Path::new(cross::LIBC).is_file() {
            missing.push(("libc6-dev-arm64-cross", format!("no {}", cross::LIBC)));
        }
    }
    match fs::read(BUSYBOX) {
        Ok(bytes) if elf_is_dynamic(&bytes) == Some(false) => {}
        Ok(_) => missing.push((
            "busybox-static",
            format!("{BUSYBOX} is not a static executable"),
        )),
        Err(e) => missing.push(("busybox-static", format!("cannot read {BUSYBOX}: {e}"))),
    }
    missing
}

pub fn is_root() -> Result<bool> {
    let status =
        fs::read_to_string("/proc/self/status").context("failed to read /proc/self/status")?;
    euid_from_status(&status)
        .map(|uid| uid == 0)
        .context("no Uid line in /proc/self/status")
}

/// The effective uid from `/proc/<pid>/status` (`Uid: real effective saved fs`).
fn euid_from_status(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Downloads what a VM of `k` needs (its kernel, and its architecture's busybox), so that VMs
/// started later in parallel find them in place.
pub fn fetch(root: &Path, k: Kernel) -> Result<()> {
    kernel_image(root, k)?;
    guest_busybox(root, k.arch()).map(|_| ())
}

/// The static busybox of the guest's architecture: this machine's own, or Debian's
/// `busybox-static` for arm64 (downloaded once).
fn guest_busybox(root: &Path, arch: Arch) -> Result<PathBuf> {
    match arch {
        Arch::Amd64 => Ok(PathBuf::from(BUSYBOX)),
        Arch::Arm64 => cross::arm64_file(root, "busybox-static", BUSYBOX),
    }
}

/// Returns the kernel image (`vmlinuz-*`) for `k`, downloading and unpacking the Debian
/// package into `<root>/target/vm/<k>/` the first time.
pub fn kernel_image(root: &Path, k: Kernel) -> Result<PathBuf> {
    let vm_dir = root.join("target").join("vm");
    let dir = vm_dir.join(k.to_string());
    if dir.is_dir() {
        let pinned = fs::read_to_string(dir.join(PINNED_STAMP)).unwrap_or_default();
        if pinned.trim() == k.package() {
            return find_vmlinuz(&dir);
        }
        eprintln!(
            "vm: {} was unpacked for another package than {}; replacing it",
            dir.display(),
            k.package()
        );
        fs::remove_dir_all(&dir).with_context(|| format!("failed to remove {}", dir.display()))?;
    }
    fs::create_dir_all(&vm_dir)
        .with_context(|| format!("failed to create {}", vm_dir.display()))?;
    let pid = std::process::id();
    let download = vm_dir.join(format!("download-{k}-{pid}"));
    let unpack = vm_dir.join(format!("unpack-{k}-{pid}"));
    let result = download_and_unpack(root, k, &download, &unpack, &dir);
    // Best-effort: these are scratch directories.
    let _ = fs::remove_dir_all(&download);
    let _ = fs::remove_dir_all(&unpack);
    result?;
    find_vmlinuz(&dir)
}

fn download_and_unpack(
    root: &Path,
    k: Kernel,
    download: &Path,
    unpack: &Path,
    dest: &Path,
) -> Result<()> {
    for d in [download, unpack] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("failed to remove {}", d.display()))?;
        }
        fs::create_dir_all(d).with_context(|| format!("failed to create {}", d.display()))?;
    }
    let package = download_kernel_package(root, k, download)?;
    let deb = find_file(download, |name| name.ends_with(".deb"))?.with_context(|| {
        format!(
            "apt-get download {package} left no .deb in {}",
            download.display()
        )
    })?;
    let fields = exec::output(
        Command::new("dpkg-deb")
            .args(["--show", "--showformat=${Package} ${Version}\\n"])
            .arg(&deb),
    )?;
    eprintln!("vm: unpacking {}", fields.trim());
    exec::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(unpack))?;
    find_vmlinuz(unpack)?;
    for (name, content) in [
        (PACKAGE_STAMP, fields.as_str()),
        (PINNED_STAMP, k.package()),
    ] {
        let stamp = unpack.join(name);
        fs::write(&stamp, content)
            .with_context(|| format!("failed to write {}", stamp.display()))?;
    }
    if let Err(e) = fs::rename(unpack, dest) {
        // Another run may have finished first; its copy is as good as ours.
        if !dest.is_dir() {
            return Err(e).with_context(|| {
                format!(
                    "failed to rename {} to {}",
                    unpack.display(),
                    dest.display()
                )
            });
        }
    }
    Ok(())
}

/// Downloads the kernel's package into `dir` and returns its name: the pinned one, or the
/// newest of the same series when the archive no longer has it.
fn download_kernel_package(root: &Path, k: Kernel, dir: &Path) -> Result<String> {
    let apt = k.apt(root)?;
    let pinned = k.package();
    if apt.download_updating(pinned, dir).is_ok() {
        return Ok(pinned.to_owned());
    }
    let pattern = k.search_pattern();
    let search = apt.search(&pattern)?;
    let newest = newest_package(k, &search).with_context(|| {
        format!(
            "{pinned} cannot be downloaded and apt has no other {k} cloud kernel \
             (apt-cache search --names-only '{pattern}'); run `apt-get update` as root?"
        )
    })?;
    eprintln!("vm: {pinned} is not in the archive any more; using {newest} instead");
    apt.download(&newest, dir)?;
    Ok(newest)
}

/// The newest package of kernel `k`'s series in `apt-cache search` output (`name - summary`).
fn newest_package(k: Kernel, search_output: &str) -> Option<String> {
    search_output
        .lines()
        .filter_map(|line| line.split(" - ").next())
        .map(str::trim)
        .filter_map(|name| k.package_key(name).map(|key| (key, name)))
        .max()
        .map(|(_, name)| name.to_owned())
}

/// `Package Version` of the kernel unpacked for `k`, if any.
pub fn installed_package(root: &Path, k: Kernel) -> Option<String> {
    let stamp = root
        .join("target")
        .join("vm")
        .join(k.to_string())
        .join(PACKAGE_STAMP);
    fs::read_to_string(stamp).ok().map(|s| s.trim().to_owned())
}

fn find_vmlinuz(dir: &Path) -> Result<PathBuf> {
    let boot = dir.join("boot");
    find_file(&boot, |name| name.starts_with("vmlinuz-"))?.with_context(|| {
        format!(
            "no vmlinuz-* in {}; remove {} to download it again",
            boot.display(),
            dir.display()
        )
    })
}

/// The module `name` (e.g. `drivers/block/brd`) of kernel `k`'s package, uncompressed, for
/// a test to `insmod` in the guest (the initramfs has no module tree). Debian ships `.ko`
/// (6.1) or `.ko.xz` (6.12); an `.xz` is unpacked once to `target/vm/<k>/<file>.ko`.
pub fn kernel_module(root: &Path, k: Kernel, name: &str) -> Result<PathBuf> {
    kernel_image(root, k)?;
    let dir = root.join("target").join("vm").join(k.to_string());
    let modules = dir.join("lib").join("modules");
    let release = find_file(&modules, |_| true)?
        .with_context(|| format!("no kernel release under {}", modules.display()))?;
    let base = release.join("kernel").join(name);
    let plain = base.with_extension("ko");
    if plain.is_file() {
        return Ok(plain);
    }
    let xz = base.with_extension("ko.xz");
    ensure!(
        xz.is_file(),
        "kernel {k} has no module {name} ({} or .xz)",
        plain.display()
    );
    let file = Path::new(name)
        .file_name()
        .with_context(|| format!("module name {name}"))?;
    let out = dir.join(file).with_extension("ko");
    if !out.is_file() {
        let unpacked = Command::new("xz")
            .arg("-dc")
            .arg(&xz)
            .output()
            .with_context(|| format!("cannot run xz -dc {}", xz.display()))?;
        ensure!(
            unpacked.status.success(),
            "xz -dc {} failed: {}",
            xz.display(),
            String::from_utf8_lossy(&unpacked.stderr)
        );
        let tmp = out.with_extension(format!("ko.{}", std::process::id()));
        fs::write(&tmp, &unpacked.stdout)
            .and_then(|()| fs::rename(&tmp, &out))
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(out)
}

fn find_file(dir: &Path, matches: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    let entries = fs::read_dir(dir).with_context(|| format!("failed to read {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("failed to read {}", dir.display()))?;
        if entry.file_name().to_str().is_some_and(&matches) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// Boots `run.kernel` with an initramfs holding `run.exe`, runs it, and returns how it exited.
///
/// Errors (rather than an outcome) when the VM cannot be built or started, times out, or
/// powers off without reporting an exit status.
pub fn run_in_vm(root: &Path, run: &VmRun) -> Result<VmOutcome> {
    let vmlinuz = kernel_image(root, run.kernel)?;
    ensure!(run.cpus > 0, "a VM needs at least one vCPU");
    ensure!(
        run.memory_mib >= 128,
        "a VM needs at least 128 MiB of memory"
    );
    for (key, _) in run.env {
        check_env_key(key)?;
    }

    let staging = Staging::create(root)?;
    let token = random_token()?;
    let initramfs = staging.dir.join("initramfs.cpio");
    let busybox = guest_busybox(root, run.kernel.arch())?;
    build_initramfs(run, &busybox, &token, &initramfs)?;
    exec::run(
        Command::new("gzip")
            .args(["-1", "-n", "-f"])
            .arg(&initramfs),
    )?;
    let initramfs = staging.dir.join("initramfs.cpio.gz");

    let console_log = staging.dir.join("console.log");
    let output_log = staging.dir.join("output.log");
    let qemu_log = staging.dir.join("qemu.log");
    let qemu_stderr = File::create(&qemu_log)
        .with_context(|| format!("failed to create {}", qemu_log.display()))?;
    let arch = run.kernel.arch();
    let qemu_binary = arch.qemu();
    let mut cmd = Command::new(qemu_binary);
    cmd.args([
        "-accel",
        "tcg",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args(["-m", &run.memory_mib.to_string()])
    .args(["-smp", &run.cpus.to_string()])
    .arg("-chardev")
    .arg(chardev_file("console", &console_log)?)
    .arg("-chardev")
    .arg(chardev_file("output", &output_log)?)
    .args(arch.qemu_machine_args());
    if let Some((tap, mac)) = run.tap {
        cmd.arg("-netdev")
            .arg(format!("tap,id=net0,ifname={tap},script=no,downscript=no"))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=net0,mac={mac}"));
    }
    cmd.arg("-kernel")
        .arg(&vmlinuz)
        .arg("-initrd")
        .arg(&initramfs)
        .args([
            "-append",
            &format!("console={} {KERNEL_ARGS}", arch.console()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(qemu_stderr);
    let mut qemu = Qemu(Some(
        cmd.spawn()
            .with_context(|| format!("failed to start {cmd:?}"))?,
    ));
    let _pid_file = match (run.pid_file, qemu.0.as_ref()) {
        (Some(path), Some(child)) => Some(PidFile::write(path, child.id())?),
        _ => None,
    };

    let deadline = Instant::now() + run.timeout;
    let status = loop {
        if let Some(status) = qemu.try_wait()? {
            break status;
        }
        if run.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            qemu.kill();
            let output = read_lossy(&output_log).unwrap_or_default();
            bail!(
                "VM with kernel {} cancelled and killed\n--- last test output lines ---\n{}",
                run.kernel,
                tail(&output, CONSOLE_TAIL)
            );
        }
        if Instant::now() >= deadline {
            qemu.kill();
            let console = read_lossy(&console_log).unwrap_or_default();
            let output = read_lossy(&output_log).unwrap_or_default();
            bail!(
                "VM with kernel {} timed out after {} s and was killed\n\
                 --- last test output lines ---\n{}\n--- last console lines ---\n{}",
                run.kernel,
                run.timeout.as_secs(),
                tail(&output, CONSOLE_TAIL),
                tail(&console, CONSOLE_TAIL)
            );
        }
        thread::sleep(Duration::from_millis(50));
    };

    let console = read_lossy(&console_log)?;
    let output = normalize_newlines(&read_lossy(&output_log)?);
    if !status.success() {
        let qemu_err = read_lossy(&qemu_log).unwrap_or_default();
        bail!(
            "{qemu_binary} failed ({status}): {}\n--- last console lines ---\n{}",
            qemu_err.trim(),
            tail(&console, CONSOLE_TAIL)
        );
    }
    match parse_marker(&output, &token) {
        Some((test_output, exit_code)) => Ok(VmOutcome {
            exit_code,
            output: test_output.to_owned(),
            console,
        }),
        None => bail!(
            "VM did not report an exit status (kernel {})\n\
             --- last test output lines ---\n{}\n--- last {CONSOLE_TAIL} console lines ---\n{}",
            run.kernel,
            tail(&output, CONSOLE_TAIL),
            tail(&console, CONSOLE_TAIL)
        ),
    }
}

/// [`run_in_vm`], run once more when the guest kernel panicked before the test reported an
/// exit status. That is the emulator's failure, not the test's: under TCG with several
/// vCPUs, Debian's 6.12 kernel has oopsed on an `int3` left by live text patching (seen on a
/// loaded host). The retry is said out loud; a second panic fails the run.
pub fn run_in_vm_retrying(root: &Path, run: &VmRun<'_>) -> Result<VmOutcome> {
    match run_in_vm(root, run) {
        Err(e) if is_guest_panic(&e) => {
            println!(
                "==> kernel {}: the guest kernel panicked before the test reported; retrying \
                 once. Its console:\n{}",
                run.kernel,
                tail(&format!("{e:#}"), 12)
            );
            run_in_vm(root, run)
        }
        other => other,
    }
}

fn is_guest_panic(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    text.contains("did not report an exit status") && text.contains("Kernel panic")
}

/// The qemu child; killed (by its PID) and reaped if still running when dropped.
struct Qemu(Option<Child>);

impl Qemu {
    fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.0.as_mut() else {
            bail!("qemu was already reaped");
        };
        let status = child.try_wait().context("failed to wait for qemu")?;
        if status.is_some() {
            self.0 = None;
        }
        Ok(status)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            // Best-effort: it may have exited on its own in the meantime.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A file holding qemu's PID while it runs; removed when dropped.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &Path, pid: u32) -> Result<PidFile> {
        fs::write(path, format!("{pid}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A run's scratch directory, `<root>/target/vm/run-<pid>-<n>/`; removed when dropped
/// unless `KPULSE_VM_KEEP=1`.
struct Staging {
    dir: PathBuf,
    keep: bool,
}

impl Staging {
    fn create(root: &Path) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let vm_dir = root.join("target").join("vm");
        remove_stale_runs(&vm_dir);
        let dir = vm_dir.join(format!("run-{}-{n}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .with_context(|| format!("failed to remove stale {}", dir.display()))?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        Ok(Staging { dir, keep })
    }
}

/// Best-effort: removes `run-<pid>-<n>` directories left by runs whose process is gone
/// (e.g. interrupted with Ctrl-C).
fn remove_stale_runs(vm_dir: &Path) {
    let Ok(entries) = fs::read_dir(vm_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(run_dir_pid) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// The pid in a staging directory name `run-<pid>-<n>`.
fn run_dir_pid(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix("run-")?.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("vm: kept {} ({KEEP_ENV}=1)", self.dir.display());
        } else if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("vm: warning: failed to remove {}: {e}", self.dir.display());
        }
    }
}

/// `-chardev file,...` writing to `path` (commas doubled, as qemu's option syntax wants).
fn chardev_file(id: &str, path: &Path) -> Result<String> {
    let path = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(format!("file,id={id},path={}", path.replace(',', ",,")))
}

fn random_token() -> Result<String> {
    let mut bytes = [0u8; 12];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("failed to read /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_lossy(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Serial ports turn `\n` into `\r\n`; undo that.
fn normalize_newlines(s: &str) -> String {
    s.replace("\r\n", "\n")
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Finds the last `KPULSE-EXIT-<token>-<code>` in `output`; returns what the test printed
/// before it and the code. The marker may follow output that did not end with a newline.
fn parse_marker<'o>(output: &'o str, token: &str) -> Option<(&'o str, i32)> {
    let marker = format!("{MARKER_PREFIX}{token}-");
    let at = output.rfind(&marker)?;
    let rest = &output[at + marker.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    let code = rest[..end].parse().ok()?;
    Some((&output[..at], code))
}

/// Parses `ldd` output into the library paths to copy (the loader included).
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    let mut missing = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let target = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    missing.push(name.trim().to_owned());
                    continue;
                }
                target
            }
            None => line,
        };
        // `/path (0x...)`; vDSO lines and "statically linked" have no path.
        let path = target.split(" (").next().unwrap_or(target).trim();
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    ensure!(
        missing.is_empty(),
        "libraries not found by ldd: {}",
        missing.join(", ")
    );
    Ok(paths)
}

/// `Some(true)` for an ELF with a program interpreter (dynamically linked), `Some(false)`
/// for a static 64-bit little-endian ELF, `None` for anything else (e.g. a script).
fn elf_is_dynamic(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let phoff =
        usize::try_from(u64::from_le_bytes(bytes.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let p_type = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
        if p_type == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// `e_machine` of a 64-bit little-endian ELF executable or shared object (`ET_EXEC`,
/// `ET_DYN`); `None` for anything else (a script, a kernel module, data).
/// `e_machine` of the ELF executable at `path`; an error if it is not one.
pub fn elf_machine_of(path: &Path) -> Result<u16> {
    let mut head = Vec::new();
    File::open(path)
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .with_context(|| format!("cannot read {}", path.display()))?;
    elf_executable_machine(&head).with_context(|| {
        format!(
            "{} is not a 64-bit little-endian ELF executable",
            path.display()
        )
    })
}

fn elf_executable_machine(bytes: &[u8]) -> Option<u16> {
    const ET_EXEC: u16 = 2;
    const ET_DYN: u16 = 3;
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    matches!(u16_at(0x10)?, ET_EXEC | ET_DYN).then_some(u16_at(0x12)?)
}

/// An absolute guest path as a cpio name: no leading `/`, no `.`/`..`, not empty.
fn guest_rel_path(guest: &str) -> Result<String> {
    let path = Path::new(guest);
    ensure!(path.is_absolute(), "guest path {guest:?} is not absolute");
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(p) => parts.push(
                p.to_str()
                    .with_context(|| format!("guest path {guest:?} is not UTF-8"))?,
            ),
            _ => bail!("guest path {guest:?} must not contain `.` or `..`"),
        }
    }
    ensure!(!parts.is_empty(), "guest path {guest:?} names the root");
    Ok(parts.join("/"))
}

fn check_env_key(key: &str) -> Result<()> {
    let mut chars = key.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    ensure!(ok, "{key:?} is not a valid environment variable name");
    Ok(())
}

/// Quotes `s` for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest's `/init`: mount everything, set up cgroups, run the test, report, power off.
fn init_script(guest_exe: &str, run: &VmRun, token: &str) -> String {
    let mut env = vec![
        (
            "PATH".to_owned(),
            "/bin:/sbin:/usr/bin:/usr/sbin".to_owned(),
        ),
        ("HOME".to_owned(), "/root".to_owned()),
        ("KPULSE_IN_VM".to_owned(), "1".to_owned()),
        ("KPULSE_VM_KERNEL".to_owned(), run.kernel.to_string()),
    ];
    env.extend(run.env.iter().cloned());
    let exports: String = env
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
        .collect();
    let command: Vec<String> = std::iter::once(guest_exe)
        .chain(run.args.iter().map(String::as_str))
        .map(sh_quote)
        .collect();
    let command = command.join(" ");
    let out = run.kernel.arch().output_device();
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask vm`: pure cgroup v2 system, one test, power off.
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
out={out}
say() {{ echo "kpulse-vm init: $*"; [ -c $out ] && echo "kpulse-vm init: $*" > $out; }}
die() {{ say "FATAL: $*"; poweroff -f; }}
mount -t proc proc /proc || die "cannot mount proc"
mount -t sysfs sysfs /sys || die "cannot mount sysfs"
mount -t devtmpfs devtmpfs /dev || die "cannot mount devtmpfs"
stty -F $out raw -echo || say "cannot set $out raw"
mount -t tmpfs -o mode=1777,size=50% tmpfs /tmp || die "cannot mount /tmp"
mount -t tmpfs -o mode=755 tmpfs /run || say "cannot mount /run"
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || die "cannot mount cgroup2"
mount -t bpf -o mode=700 bpf /sys/fs/bpf || say "cannot mount bpffs"
mount -t tracefs tracefs /sys/kernel/tracing || say "cannot mount tracefs"
mount -t debugfs debugfs /sys/kernel/debug || say "cannot mount debugfs"
ulimit -l unlimited || say "cannot lift RLIMIT_MEMLOCK"
hostname kpulse-vm
ip link set lo up || say "cannot bring up the loopback interface"
cg=/sys/fs/cgroup
for c in cpu memory; do
    echo "+$c" > $cg/cgroup.subtree_control || say "cannot enable $c in /"
done
mkdir $cg/kpulse-vm || die "cannot create cgroup /kpulse-vm"
for c in cpu memory; do
    echo "+$c" > $cg/kpulse-vm/cgroup.subtree_control || say "cannot enable $c in /kpulse-vm"
done
mkdir $cg/kpulse-vm/runner || die "cannot create cgroup /kpulse-vm/runner"
echo $$ > $cg/kpulse-vm/runner/cgroup.procs || die "cannot join /kpulse-vm/runner"
cd /root || die "no /root"
{exports}{command} < /dev/null > $out 2>&1
code=$?
echo "{MARKER_PREFIX}{token}-$code" > $out
poweroff -f
"#
    )
}

/// One initramfs entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    /// A host file, copied with its permission bits.
    File(PathBuf),
    Bytes {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink(String),
    CharDev {
        major: u32,
        minor: u32,
    },
}

/// Initramfs contents by cpio name (guest path without the leading `/`). Sorted, so every
/// directory comes before what it holds.
#[derive(Default)]
struct Tree(BTreeMap<String, Node>);

impl Tree {
    fn insert(&mut self, guest: &str, node: Node) -> Result<()> {
        let name = guest_rel_path(guest)?;
        for (slash, _) in name.match_indices('/') {
            let parent = &name[..slash];
            match self.0.entry(parent.to_owned()).or_insert(Node::Dir) {
                Node::Dir => {}
                other => bail!("initramfs: /{parent} is both a directory and {other:?}"),
            }
        }
        match self.0.get(&name) {
            None => {
                self.0.insert(name, node);
            }
            Some(existing) if *existing == node => {}
            Some(existing) => {
                bail!("initramfs: /{name} would be both {existing:?} and {node:?}")
            }
        }
        Ok(())
    }

    /// Adds everything under `host` (a root file system; `guest` its path there, `""` at the
    /// top) but the kernel's file systems: directories, regular files and symbolic links
    /// (their targets as they are, so absolute ones resolve in the guest).
    fn insert_root_fs(&mut self, host: &Path, guest: &str) -> Result<()> {
        let entries =
            fs::read_dir(host).with_context(|| format!("cannot read {}", host.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot read {}", host.display()))?;
            let name = entry.file_name();
            let name = name
                .to_str()
                .with_context(|| format!("{:?} in {} is not UTF-8", name, host.display()))?;
            if guest.is_empty() && matches!(name, "dev" | "proc" | "sys") {
                continue;
            }
            let path = entry.path();
            let guest_path = format!("{guest}/{name}");
            let kind = entry
                .file_type()
                .with_context(|| format!("cannot stat {}", path.display()))?;
            if kind.is_dir() {
                self.insert(&guest_path, Node::Dir)?;
                self.insert_root_fs(&path, &guest_path)?;
            } else if kind.is_symlink() {
                let target = fs::read_link(&path)
                    .with_context(|| format!("cannot read the link {}", path.display()))?;
                let target = target
                    .to_str()
                    .with_context(|| format!("the link {} is not UTF-8", path.display()))?;
                self.insert(&guest_path, Node::Symlink(target.to_owned()))?;
            } else if kind.is_file() {
                self.insert(&guest_path, Node::File(path))?;
            } else {
                bail!(
                    "{} is neither a directory, a file nor a symbolic link",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// Adds the file at `host` as `guest`, with the libraries it needs if it is a dynamic ELF.
    /// An ELF executable must be built for `arch`, and statically for another architecture
    /// than this host's (`ldd` only knows this host's libraries).
    fn insert_program(&mut self, host: &Path, guest: &str, arch: Arch) -> Result<()> {
        let meta = fs::metadata(host).with_context(|| format!("cannot read {}", host.display()))?;
        ensure!(meta.is_file(), "{} is not a regular file", host.display());
        let mut head = Vec::new();
        File::open(host)
            .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
            .with_context(|| format!("failed to read {}", host.display()))?;
        if let Some(machine) = elf_executable_machine(&head) {
            ensure!(
                machine == arch.elf_machine(),
                "{} is an executable for ELF machine {machine}, not {} ({})",
                host.display(),
                arch.debian(),
                arch.elf_machine()
            );
        }
        if elf_is_dynamic(&head) == Some(true) {
            ensure!(
                arch == Arch::Amd64,
                "{} is dynamically linked: a {} VM needs a static executable",
                host.display(),
                arch.debian()
            );
            let ldd = exec::output(Command::new("ldd").arg(host))?;
            let libs = parse_ldd(&ldd).with_context(|| format!("ldd {}", host.display()))?;
            for lib in libs {
                let guest_lib = lib
                    .to_str()
                    .with_context(|| format!("{} is not UTF-8", lib.display()))?
                    .to_owned();
                self.insert(&guest_lib, Node::File(lib))?;
            }
        }
        self.insert(guest, Node::File(host.to_path_buf()))
    }

    fn write_cpio(&self, out: &mut impl Write) -> Result<()> {
        const S_IFDIR: u32 = 0o040_000;
        const S_IFREG: u32 = 0o100_000;
        const S_IFLNK: u32 = 0o120_000;
        const S_IFCHR: u32 = 0o020_000;
        let mut cpio = Cpio { out, ino: 0 };
        for (name, node) in &self.0 {
            match node {
                Node::Dir => cpio.entry(name, S_IFDIR | 0o755, 2, (0, 0), &[])?,
                Node::File(host) => {
                    let meta = fs::metadata(host)
                        .with_context(|| format!("cannot read {}", host.display()))?;
                    let data = fs::read(host)
                        .with_context(|| format!("failed to read {}", host.display()))?;
                    let mode = S_IFREG | (meta.permissions().mode() & 0o7777);
                    cpio.entry(name, mode, 1, (0, 0), &data)?;
                }
                Node::Bytes { data, mode } => cpio.entry(name, S_IFREG | mode, 1, (0, 0), data)?,
                Node::Symlink(target) => {
                    cpio.entry(name, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes())?
                }
                Node::CharDev { major, minor } => {
                    cpio.entry(name, S_IFCHR | 0o600, 1, (*major, *minor), &[])?
                }
            }
        }
        cpio.entry("TRAILER!!!", 0, 1, (0, 0), &[])
    }
}

/// A newc ("070701") cpio writer, the format the kernel unpacks as initramfs.
struct Cpio<'w, W: Write> {
    out: &'w mut W,
    ino: u32,
}

impl<W: Write> Cpio<'_, W> {
    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<()> {
        let size = u32::try_from(data.len()).with_context(|| format!("{name} is over 4 GiB"))?;
        let name_size = u32::try_from(name.len() + 1).context("cpio name too long")?;
        self.ino += 1;
        let fields = [
            self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        let mut header = String::from("070701");
        for f in fields {
            header.push_str(&format!("{f:08x}"));
        }
        let write = |out: &mut W, bytes: &[u8]| -> Result<()> {
            out.write_all(bytes)
                .context("failed to write the initramfs")
        };
        write(self.out, header.as_bytes())?;
        write(self.out, name.as_bytes())?;
        write(self.out, &[0])?;
        // Header (110 bytes) + name + NUL, then the data, each padded to 4 bytes.
        write(self.out, &[0; 3][..pad4(110 + name.len() + 1)])?;
        write(self.out, data)?;
        write(self.out, &[0; 3][..pad4(data.len())])
    }
}

fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Writes the (uncompressed) initramfs for `run` to `path`.
fn build_initramfs(run: &VmRun, busybox: &Path, token: &str, path: &Path) -> Result<()> {
    let exe_name = run
        .exe
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no UTF-8 file name", run.exe.display()))?;
    let guest_exe = format!("{GUEST_BIN_DIR}/{exe_name}");

    let mut tree = Tree::default();
    for dir in [
        "/bin",
        "/sbin",
        "/usr/bin",
        "/usr/sbin",
        "/dev",
        "/proc",
        "/sys",
        "/tmp",
        "/run",
        "/root",
        "/etc",
        "/var",
    ] {
        tree.insert(dir, Node::Dir)?;
    }
    if let Some(root_fs) = run.root_fs {
        tree.insert_root_fs(root_fs, "")
            .with_context(|| format!("cannot add the root file system {}", root_fs.display()))?;
    }
    tree.insert("/dev/console", Node::CharDev { major: 5, minor: 1 })?;
    tree.insert(BUSYBOX, Node::File(busybox.to_path_buf()))?;
    tree.insert("/bin/sh", Node::Symlink("busybox".into()))?;
    tree.insert(
        "/init",
        Node::Bytes {
            data: init_script(&guest_exe, run, token).into_bytes(),
            mode: 0o755,
        },
    )?;
    let arch = run.kernel.arch();
    tree.insert_program(run.exe, &guest_exe, arch)
        .with_context(|| format!("cannot add the test executable {}", run.exe.display()))?;
    for (host, guest) in run.extra_files {
        ensure!(
            !matches!(
                guest_rel_path(guest)?.as_str(),
                "init" | "bin/busybox" | "bin/sh"
            ),
            "extra file {guest} would replace the VM's own"
        );
        tree.insert_program(host, guest, arch)
            .with_context(|| format!("cannot add extra file {} as {guest}", host.display()))?;
    }

    let file =
        File::create(path).with_context(|| format!("failed to create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    tree.write_cpio(&mut out)?;
    out.flush()
        .with_context(|| format!("failed to write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_round_trip() {
        for &k in Kernel::all() {
            assert_eq!(k.to_string().parse::<Kernel>().ok(), Some(k));
        }
        assert_eq!("6.1".parse::<Kernel>().ok(), Some(Kernel::V6_1));
        assert_eq!("6.12".parse::<Kernel>().ok(), Some(Kernel::V6_12));
        assert_eq!(
            "6.12-arm64".parse::<Kernel>().ok(),
            Some(Kernel::Arm64V6_12)
        );
        assert!("6.6".parse::<Kernel>().is_err());
        assert!("".parse::<Kernel>().is_err());
        assert!("6.1.0".parse::<Kernel>().is_err());
    }

    #[test]
    fn pinned_packages_belong_to_their_series() {
        for &k in Kernel::all() {
            assert!(k.package_key(k.package()).is_some(), "{k}");
        }
        assert_eq!(Kernel::V6_1.package_key(PACKAGE_6_12), None);
        assert_eq!(Kernel::V6_12.package_key(PACKAGE_6_1), None);
        // The same release for the other architecture is another kernel.
        assert_eq!(Kernel::V6_12.package_key(PACKAGE_ARM64_6_12), None);
        assert_eq!(Kernel::Arm64V6_12.package_key(PACKAGE_6_12), None);
        assert_eq!(
            Kernel::Arm64V6_12.search_pattern(),
            r"^linux-image-6\.12\.[0-9]+.*-cloud-arm64$"
        );
    }

    #[test]
    fn each_machine_has_its_console_and_output() {
        let amd64 = Arch::Amd64.qemu_machine_args().join(" ");
        assert_eq!(amd64, "-serial chardev:console -serial chardev:output");
        let arm64 = Arch::Arm64.qemu_machine_args().join(" ");
        assert!(
            arm64.starts_with("-machine virt -cpu max,pauth-impdef=on "),
            "{arm64}"
        );
        assert!(
            arm64.ends_with("-device virtconsole,chardev=output"),
            "{arm64}"
        );
        assert_eq!(Kernel::Arm64V6_12.arch().output_device(), "/dev/hvc0");
        assert_eq!(Kernel::V6_1.arch().output_device(), "/dev/ttyS1");
    }

    #[test]
    fn newest_package_is_picked_numerically() {
        let search = "\
linux-image-6.1.0-9-cloud-amd64 - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-57-cloud-amd64 - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-58-cloud-amd64-dbg - Debug symbols for linux-image-6.1.0-58-cloud-amd64
linux-image-6.1.0-60-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.12.9+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud
linux-image-6.12.117+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud
linux-image-6.12.120+deb12-cloud-amd64-dbg - Debug symbols
linux-image-6.12.118+deb12-cloud-arm64 - Linux 6.12 for arm64 cloud (signed)
";
        assert_eq!(
            newest_package(Kernel::V6_1, search).as_deref(),
            Some("linux-image-6.1.0-57-cloud-amd64")
        );
        assert_eq!(
            newest_package(Kernel::V6_12, search).as_deref(),
            Some("linux-image-6.12.117+deb12-cloud-amd64")
        );
        assert_eq!(
            newest_package(Kernel::Arm64V6_12, search).as_deref(),
            Some("linux-image-6.12.118+deb12-cloud-arm64")
        );
        assert_eq!(newest_package(Kernel::V6_1, ""), None);
    }

    #[test]
    fn marker_gives_code_and_output() {
        let out = "hello\nworld\nKPULSE-EXIT-abc123-3\n";
        assert_eq!(parse_marker(out, "abc123"), Some(("hello\nworld\n", 3)));
        assert_eq!(parse_marker("KPULSE-EXIT-t-0\n", "t"), Some(("", 0)));
        // Output without a final newline: the marker follows on the same line.
        assert_eq!(
            parse_marker("partialKPULSE-EXIT-t-139\n", "t"),
            Some(("partial", 139))
        );
    }

    #[test]
    fn marker_needs_the_run_token() {
        // A test printing a marker with another token cannot fake its status...
        assert_eq!(parse_marker("KPULSE-EXIT-guess-0\n", "real"), None);
        // ...and one with the real token printed earlier is overridden by the last one.
        let out = "KPULSE-EXIT-real-0\nmore\nKPULSE-EXIT-real-1\n";
        assert_eq!(
            parse_marker(out, "real"),
            Some(("KPULSE-EXIT-real-0\nmore\n", 1))
        );
        assert_eq!(parse_marker("KPULSE-EXIT-real-\n", "real"), None);
        assert_eq!(parse_marker("", "real"), None);
    }

    #[test]
    fn ldd_output_is_parsed() {
        let out = "\tlinux-vdso.so.1 (0x00007ffc2b5f2000)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1c1a000000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c19e00000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f1c1a1a0000)\n";
        let paths = parse_ldd(out).ok();
        assert_eq!(
            paths,
            Some(vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ])
        );
        assert_eq!(parse_ldd("\tstatically linked\n").ok(), Some(vec![]));
    }

    #[test]
    fn ldd_missing_library_is_an_error() {
        let out =
            "\tlibnope.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n";
        let err = parse_ldd(out).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("libraries not found by ldd: libnope.so.1")
        );
    }

    #[test]
    fn guest_paths_are_checked() {
        assert_eq!(
            guest_rel_path("/etc/kpulse.toml").ok().as_deref(),
            Some("etc/kpulse.toml")
        );
        assert_eq!(guest_rel_path("/a//b/").ok().as_deref(), Some("a/b"));
        assert!(guest_rel_path("relative").is_err());
        assert!(guest_rel_path("/").is_err());
        assert!(guest_rel_path("/a/../b").is_err());
    }

    #[test]
    fn shell_quoting_and_env_names() {
        assert_eq!(sh_quote("it's $HOME"), r"'it'\''s $HOME'");
        assert!(check_env_key("RUST_LOG").is_ok());
        assert!(check_env_key("_x1").is_ok());
        assert!(check_env_key("1X").is_err());
        assert!(check_env_key("A-B").is_err());
        assert!(check_env_key("").is_err());
        assert_eq!(
            parse_env_arg("A=b=c"),
            Ok(("A".to_owned(), "b=c".to_owned()))
        );
        assert!(parse_env_arg("nope").is_err());
    }

    #[test]
    fn a_root_file_system_comes_in_without_the_kernels_file_systems() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("kpulse-vm-rootfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for d in ["lib/aarch64-linux-gnu", "dev", "proc/1", "usr/local/bin"] {
            fs::create_dir_all(dir.join(d))?;
        }
        fs::write(dir.join("lib/aarch64-linux-gnu/libc.so.6"), b"libc")?;
        fs::write(dir.join("dev/null"), b"not a device")?;
        fs::write(dir.join("usr/local/bin/kpulse-agent"), b"agent")?;
        std::os::unix::fs::symlink(
            "aarch64-linux-gnu/libc.so.6",
            dir.join("lib/ld-linux-aarch64.so.1"),
        )?;
        let mut tree = Tree::default();
        tree.insert("/bin", Node::Dir)?;
        let added = tree.insert_root_fs(&dir, "");
        // The VM's own files may not replace the image's.
        let mut clashing = Tree::default();
        fs::create_dir_all(dir.join("bin"))?;
        fs::write(dir.join("bin/sh"), b"a shell")?;
        clashing.insert_root_fs(&dir, "")?;
        let clash = clashing.insert("/bin/sh", Node::Symlink("busybox".into()));
        fs::remove_dir_all(&dir)?;
        added?;
        let names: Vec<&str> = tree.0.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "bin",
                "lib",
                "lib/aarch64-linux-gnu",
                "lib/aarch64-linux-gnu/libc.so.6",
                "lib/ld-linux-aarch64.so.1",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/kpulse-agent",
            ]
        );
        assert_eq!(
            tree.0.get("lib/ld-linux-aarch64.so.1"),
            Some(&Node::Symlink("aarch64-linux-gnu/libc.so.6".into()))
        );
        assert!(clash.is_err());
        Ok(())
    }

    #[test]
    fn run_dirs_are_recognised() {
        assert_eq!(run_dir_pid("run-1234-0"), Some(1234));
        assert_eq!(run_dir_pid("run-1234-x"), None);
        assert_eq!(run_dir_pid("6.12"), None);
        assert_eq!(run_dir_pid("download-6.1-77"), None);
    }

    #[test]
    fn euid_is_the_second_uid() {
        assert_eq!(euid_from_status("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(0));
        assert_eq!(euid_from_status("Name:\tx\n"), None);
    }

    #[test]
    fn elf_detection() {
        let mut elf = vec![0u8; 0x40 + 2 * 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        assert_eq!(elf_is_dynamic(&elf), Some(false));
        elf[0x40 + 56..0x44 + 56].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        assert_eq!(elf_is_dynamic(&elf), Some(true));
        assert_eq!(elf_is_dynamic(b"#!/bin/sh\n"), None);
        // ET_DYN for x86-64, then ET_EXEC for aarch64; a relocatable object (a module) has none.
        elf[0x10..0x12].copy_from_slice(&3u16.to_le_bytes());
        elf[0x12..0x14].copy_from_slice(&62u16.to_le_bytes());
        assert_eq!(
            elf_executable_machine(&elf),
            Some(Arch::Amd64.elf_machine())
        );
        elf[0x10..0x12].copy_from_slice(&2u16.to_le_bytes());
        elf[0x12..0x14].copy_from_slice(&183u16.to_le_bytes());
        assert_eq!(
            elf_executable_machine(&elf),
            Some(Arch::Arm64.elf_machine())
        );
        elf[0x10..0x12].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(elf_executable_machine(&elf), None);
        assert_eq!(elf_executable_machine(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn a_program_of_another_machine_is_refused() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("kpulse-vm-elf-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let exe = dir.join("prog");
        let mut elf = vec![0u8; 0x40];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x10..0x12].copy_from_slice(&2u16.to_le_bytes());
        elf[0x12..0x14].copy_from_slice(&183u16.to_le_bytes());
        fs::write(&exe, &elf)?;
        let mut tree = Tree::default();
        let refused = tree.insert_program(&exe, "/kpulse/prog", Arch::Amd64);
        let accepted = tree.insert_program(&exe, "/kpulse/prog", Arch::Arm64);
        fs::remove_dir_all(&dir)?;
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("ELF machine 183, not amd64"), "{message}");
        assert!(accepted.is_ok());
        Ok(())
    }

    #[test]
    fn init_script_runs_the_test_and_reports() {
        let args = ["--flag".to_owned(), "two words".to_owned()];
        let env = [("RUST_LOG".to_owned(), "debug".to_owned())];
        let run = VmRun {
            kernel: Kernel::V6_12,
            exe: Path::new("/tmp/prog"),
            args: &args,
            env: &env,
            extra_files: &[],
            root_fs: None,
            timeout: Duration::from_secs(1),
            memory_mib: 1024,
            cpus: 2,
            tap: None,
            cancel: None,
            pid_file: None,
        };
        let script = init_script("/kpulse/prog", &run, "tok");
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("'/kpulse/prog' '--flag' 'two words' < /dev/null > $out 2>&1\n"));
        assert!(script.contains("export KPULSE_IN_VM='1'\n"));
        assert!(script.contains("export KPULSE_VM_KERNEL='6.12'\n"));
        assert!(script.contains("out=/dev/ttyS1\n"));
        let arm64 = init_script(
            "/kpulse/prog",
            &VmRun {
                kernel: Kernel::Arm64V6_12,
                ..run.clone()
            },
            "tok",
        );
        assert!(arm64.contains("out=/dev/hvc0\n"));
        assert!(arm64.contains("export KPULSE_VM_KERNEL='6.12-arm64'\n"));
        assert!(script.contains("export RUST_LOG='debug'\n"));
        assert!(script.contains("echo \"KPULSE-EXIT-tok-$code\" > $out\npoweroff -f\n"));
    }

    #[test]
    fn cpio_tree_has_parents_first_and_aligned_entries() {
        let mut tree = Tree::default();
        let added = tree
            .insert("/a/b/c", Node::Symlink("x".into()))
            .and_then(|()| tree.insert("/a/b/c", Node::Symlink("x".into())));
        assert!(added.is_ok());
        assert!(tree.insert("/a/b/c", Node::Dir).is_err());
        assert!(tree.insert("/a/b/c/d", Node::Dir).is_err());
        let names: Vec<&str> = tree.0.keys().map(String::as_str).collect();
        assert_eq!(names, ["a", "a/b", "a/b/c"]);

        let mut bytes = Vec::new();
        assert!(tree.write_cpio(&mut bytes).is_ok());
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        // "a": header 110 + "a\0" = 112, no data; the next header starts right after.
        assert_eq!(&bytes[112..118], b"070701");
        let trailer = b"TRAILER!!!\0";
        assert!(bytes.windows(trailer.len()).any(|w| w == trailer));
    }
}
