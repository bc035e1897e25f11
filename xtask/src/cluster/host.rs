//! What `cargo xtask cluster` changes on this machine, and how it is undone: the bridge
//! and routes, sysctls, the guard in iptables, cgroups, mounts, a swap file when the machine
//! has no swap ([`swap_up`]), and the processes it starts.
//!
//! Everything it starts runs in cgroup `kpulse-cluster/<name>` of the cgroup2 hierarchy
//! (`/sys/fs/cgroup/unified` on systemd's hybrid layout), joined before exec, so that every
//! descendant (containerd's shims too) can be found and ended; the kubelet's pods live in
//! `kpulse-cluster-pods/kubepods` (its `cgroupRoot`), in every hierarchy. All addresses are on the bridge this module creates
//! ([`BRIDGE`]), the service range routed onto it, loopback, or, while the arm64 node of
//! `cluster check` runs, its own bridge ([`VM_BRIDGE`]). A rule at the top of iptables'
//! FORWARD chain drops anything from the pod range that would leave by another interface
//! than those two bridges, so nothing a pod sends reaches another machine.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use anyhow::{bail, Context, Result};

/// The bridge pods are attached to; its address is the node's.
pub const BRIDGE: &str = "kpcl0";
/// The node's address (kube-apiserver, kubelet), the pods' gateway.
pub const NODE_IP: &str = "10.244.0.1";
/// The pods' subnet on this node (host-local IPAM).
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The cluster's pod range (kube-proxy's `clusterCIDR`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Service ClusterIPs; routed onto the bridge so that nothing addressed to one leaves it.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// The emulated arm64 node (`arm64_node`): a bridge of its own with this host's address on
/// it, a tap device for the VM's card, and a route to the node's pods through it. Not on
/// [`BRIDGE`]: a router that sends a packet back out of the interface it came in by would
/// tell the pods there to go direct (ICMP redirects), and a reply that takes another path
/// than its request is one that kube-proxy's conntrack rules may drop.
pub const VM_BRIDGE: &str = "kpvm0";
pub const VM_TAP: &str = "kpvmtap0";
/// This host's address on [`VM_BRIDGE`]: the node's gateway to the cluster.
pub const VM_HOST_IP: &str = "10.244.255.1";
/// The arm64 node's address (its kubelet's, kpulse's fallback reads it there).
pub const VM_NODE_IP: &str = "10.244.255.2";
/// The arm64 node's pods (its own bridge inside the VM, host-local IPAM).
pub const VM_POD_SUBNET: &str = "10.244.1.0/24";
pub const VM_POD_GATEWAY: &str = "10.244.1.1";
/// The iptables chain of the guard (filter table, jumped to first from FORWARD).
const GUARD_CHAIN: &str = "KPULSE-CLUSTER-GUARD";
/// Name of the cgroup holding everything started here.
pub const CGROUP: &str = "kpulse-cluster";
/// The kubelet's `cgroupRoot`: its `kubepods` tree goes below it, in every hierarchy, so that
/// `down` ends the pods of this cluster only, never those of another kubelet on the machine.
pub const PODS_CGROUP: &str = "kpulse-cluster-pods";
/// Sockets and containerd's state: short paths (sockets are limited to 108 bytes).
pub const RUN_DIR: &str = "/run/kpulse-cluster";
/// sysctls set for the cluster, restored by `down`.
pub const SYSCTLS: [(&str, &str); 2] = [
    ("net/ipv4/ip_forward", "1"),
    ("net/bridge/bridge-nf-call-iptables", "1"),
];

/// Directories of one cluster.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `target/cluster`
    pub top: PathBuf,
    /// Go builds (kept by `down`).
    pub build: PathBuf,
    /// Certificates and kubeconfigs.
    pub pki: PathBuf,
    /// Configuration files.
    pub etc: PathBuf,
    /// etcd, containerd's root, the kubelet's root, IPAM state, pod logs.
    pub data: PathBuf,
    /// One log per process.
    pub logs: PathBuf,
    /// PID files and the record of changed sysctls.
    pub state: PathBuf,
    /// `/run/kpulse-cluster`.
    pub run: PathBuf,
}

impl Dirs {
    pub fn new(workspace: &Path) -> Dirs {
        let top = workspace.join("target/cluster");
        Dirs {
            build: top.join("build"),
            pki: top.join("pki"),
            etc: top.join("etc"),
            data: top.join("data"),
            logs: top.join("logs"),
            state: top.join("state"),
            run: PathBuf::from(RUN_DIR),
            top,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.top.join("kubeconfig")
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd.sock")
    }

    pub fn create(&self) -> Result<()> {
        for d in [
            &self.build,
            &self.pki,
            &self.etc,
            &self.data,
            &self.logs,
            &self.state,
            &self.run,
        ] {
            fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        Ok(())
    }
}

/// The cgroup2 mount: `/sys/fs/cgroup` on pure v2, `/sys/fs/cgroup/unified` on hybrid.
pub fn cgroup2_root() -> Result<PathBuf> {
    mounts()?
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.point)
        .context("no cgroup2 hierarchy is mounted")
}

/// Unmounts (lazily, deepest first, a few rounds) every mount point under `prefixes`;
/// those still mounted after that.
pub fn unmount_under(prefixes: &[PathBuf]) -> Vec<PathBuf> {
    let under = |p: &PathBuf| prefixes.iter().any(|pre| p.starts_with(pre));
    for _ in 0..5 {
        let Ok(all) = mounts() else { break };
        let mut points: Vec<PathBuf> = all.into_iter().map(|m| m.point).filter(under).collect();
        if points.is_empty() {
            break;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = run_quiet(Command::new("umount").arg("-l").arg(&p));
        }
    }
    mounts()
        .map(|all| all.into_iter().map(|m| m.point).filter(under).collect())
        .unwrap_or_default()
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct Mount {
    pub point: PathBuf,
    pub fstype: String,
}

pub fn mounts() -> Result<Vec<Mount>> {
    let text = fs::read_to_string("/proc/self/mountinfo").context("cannot read mountinfo")?;
    Ok(parse_mountinfo(&text))
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(Mount {
                point: PathBuf::from(unescape_octal(fields.get(4)?)),
                fstype: (*fields.get(sep + 1)?).to_string(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every cgroup hierarchy's mount point (v1 controllers and v2).
fn hierarchies() -> Result<Vec<PathBuf>> {
    Ok(mounts()?
        .into_iter()
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .map(|m| m.point)
        .collect())
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key)
}

/// Creates the bridge, the service route, the sysctls and the guard. Records the sysctls'
/// old values in `dirs.state` first.
pub fn network_up(dirs: &Dirs) -> Result<()> {
    for (key, value) in SYSCTLS {
        let path = sysctl_path(key);
        let old = fs::read_to_string(&path)
            .with_context(|| format!("cannot read {} (is br_netfilter there?)", path.display()))?;
        let record = dirs.state.join(format!("sysctl.{}", key.replace('/', ".")));
        if !record.exists() {
            fs::write(&record, old.trim())?;
        }
        fs::write(&path, value).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !Path::new("/sys/class/net").join(BRIDGE).exists() {
        run_quiet(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
    }
    let _ = run_quiet(Command::new("ip").args([
        "addr",
        "add",
        &format!("{NODE_IP}/24"),
        "dev",
        BRIDGE,
    ]));
    run_quiet(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
    run_quiet(Command::new("ip").args([
        "route",
        "replace",
        SERVICE_CIDR,
        "dev",
        BRIDGE,
        "src",
        NODE_IP,
    ]))?;
    guard_up()
}

/// The arm64 node's network on this side: [`VM_BRIDGE`] with [`VM_HOST_IP`], [`VM_TAP`] on
/// it (qemu opens it by name), and [`VM_POD_SUBNET`] routed to [`VM_NODE_IP`]. Everything
/// is inside the cluster's range, so the guard covers it; `teardown` removes it.
pub fn vm_network_up() -> Result<()> {
    vm_network_down()?;
    // A cluster brought up by an older xtask has no rule for the VM's bridge: add it in
    // front (flushing the chain would lift the DROP for a moment).
    let rule = ["-s", CLUSTER_CIDR, "-o", VM_BRIDGE, "-j", "RETURN"];
    if iptables(&[&["-t", "filter", "-C", GUARD_CHAIN][..], &rule].concat()).is_err() {
        iptables(&[&["-t", "filter", "-I", GUARD_CHAIN, "1"][..], &rule].concat())?;
    }
    let ip = |args: &[&str]| run_quiet(Command::new("ip").args(args));
    ip(&["link", "add", VM_BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{VM_HOST_IP}/24"), "dev", VM_BRIDGE])?;
    ip(&["link", "set", VM_BRIDGE, "up"])?;
    ip(&["tuntap", "add", "dev", VM_TAP, "mode", "tap"])?;
    ip(&["link", "set", VM_TAP, "master", VM_BRIDGE, "up"])?;
    ip(&[
        "route",
        "replace",
        VM_POD_SUBNET,
        "via",
        VM_NODE_IP,
        "dev",
        VM_BRIDGE,
    ])
}

/// The pod addresses of `cluster fleet`'s nodes, which kwok hands out and nothing answers:
/// a /24 for each of up to 16,384 nodes, outside [`CLUSTER_CIDR`] and [`SERVICE_CIDR`].
pub const FLEET_POD_RANGE: &str = "10.128.0.0/10";

/// Routes [`FLEET_POD_RANGE`] to a blackhole, so that nothing addressed to a fleet pod
/// leaves this machine; `teardown` removes it.
pub fn fleet_route_up() -> Result<()> {
    run_quiet(Command::new("ip").args(["route", "replace", "blackhole", FLEET_POD_RANGE]))
}

fn fleet_route_exists() -> bool {
    crate::exec::output(Command::new("ip").args([
        "route",
        "show",
        "type",
        "blackhole",
        FLEET_POD_RANGE,
    ]))
    .is_ok_and(|out| !out.trim().is_empty())
}

/// Removes what [`fleet_route_up`] made, if it is there.
pub fn fleet_route_down() -> Result<()> {
    if fleet_route_exists() {
        run_quiet(Command::new("ip").args(["route", "del", "blackhole", FLEET_POD_RANGE]))?;
    }
    Ok(())
}

/// Removes what [`vm_network_up`] made (the route goes with the bridge).
pub fn vm_network_down() -> Result<()> {
    for link in [VM_TAP, VM_BRIDGE] {
        if Path::new("/sys/class/net").join(link).exists() {
            run_quiet(Command::new("ip").args(["link", "del", link]))?;
        }
    }
    Ok(())
}

/// Size of the swap file [`swap_up`] adds.
pub const SWAP_MIB: u64 = 256;

/// The swap file [`swap_up`] adds (under `target/cluster`, kept out of the removed trees so
/// that it is switched off before it is deleted).
pub fn swap_file(dirs: &Dirs) -> PathBuf {
    dirs.top.join("kpulse-cluster.swap")
}

/// `key` (`SwapTotal`, …) of `/proc/meminfo`, kB.
fn meminfo_kb(key: &str) -> Result<u64> {
    let text = fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo")?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("/proc/meminfo has no {key}"))
}

/// `SwapTotal` of `/proc/meminfo`, kB.
pub fn swap_total_kb() -> Result<u64> {
    meminfo_kb("SwapTotal")
}

/// `SwapTotal - SwapFree` of `/proc/meminfo`, bytes.
pub fn swap_used() -> Result<u64> {
    Ok(swap_total_kb()?.saturating_sub(meminfo_kb("SwapFree")?) * 1024)
}

/// Whether `file` is an active swap area (`/proc/swaps`).
fn swap_active(file: &Path) -> bool {
    fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| Path::new(name) == file)
}

/// Gives the node swap when the machine has none: a [`SWAP_MIB`] MiB file, before the
/// kubelet starts (it reads the machine's swap once, and publishes
/// `status.nodeInfo.swap.capacity`, without which `kubectl top node --show-swap` prints
/// `<unknown>`). The kubelet runs with `failSwapOn: false`; its default swap behaviour
/// (`NoSwap`) keeps containers with a memory limit out of swap, so only what a check pushes
/// there goes there.
pub fn swap_up(dirs: &Dirs) -> Result<()> {
    if swap_total_kb()? > 0 {
        return Ok(());
    }
    let file = swap_file(dirs);
    let path = file.to_string_lossy().into_owned();
    // Written, not fallocated: a file without holes suits every file system.
    run_quiet(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={path}"),
        "bs=1M",
        &format!("count={SWAP_MIB}"),
        "status=none",
    ]))?;
    fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("cannot chmod {path}"))?;
    run_quiet(Command::new("mkswap").arg(&file))?;
    run_quiet(Command::new("swapon").arg(&file))
}

/// Switches off and removes the file of [`swap_up`], if there is one.
fn swap_down(dirs: &Dirs) -> Vec<String> {
    let mut problems = Vec::new();
    let file = swap_file(dirs);
    if swap_active(&file) {
        if let Err(e) = run_quiet(Command::new("swapoff").arg(&file)) {
            problems.push(format!("{e:#}"));
        }
    }
    if file.exists() && !swap_active(&file) {
        if let Err(e) = fs::remove_file(&file) {
            problems.push(format!("cannot remove {}: {e}", file.display()));
        }
    }
    problems
}

fn iptables(args: &[&str]) -> Result<()> {
    run_quiet(Command::new("iptables").args(["-w", "5"]).args(args))
}

fn guard_up() -> Result<()> {
    let _ = iptables(&["-t", "filter", "-N", GUARD_CHAIN]);
    iptables(&["-t", "filter", "-F", GUARD_CHAIN])?;
    // Pod traffic that stays on the bridges (pod to pod, pod to service after DNAT, to and
    // from the arm64 node) passes; anything else from the pod range is dropped.
    for rule in [
        ["-o", BRIDGE, "-j", "RETURN"].as_slice(),
        ["-o", VM_BRIDGE, "-j", "RETURN"].as_slice(),
        ["-j", "DROP"].as_slice(),
    ] {
        let mut args = vec!["-t", "filter", "-A", GUARD_CHAIN, "-s", CLUSTER_CIDR];
        args.extend_from_slice(rule);
        iptables(&args)?;
    }
    if iptables(&["-t", "filter", "-C", "FORWARD", "-j", GUARD_CHAIN]).is_err() {
        iptables(&["-t", "filter", "-I", "FORWARD", "1", "-j", GUARD_CHAIN])?;
    }
    Ok(())
}

/// The guard stays first in FORWARD: kube-proxy inserts its own jumps at the top.
pub fn guard_first() -> Result<()> {
    let rules = crate::exec::output(Command::new("iptables").args(["-w", "5", "-S", "FORWARD"]))?;
    let first = rules.lines().find(|l| l.starts_with("-A FORWARD"));
    if first != Some(&format!("-A FORWARD -j {GUARD_CHAIN}")[..]) {
        let _ = iptables(&["-t", "filter", "-D", "FORWARD", "-j", GUARD_CHAIN]);
        iptables(&["-t", "filter", "-I", "FORWARD", "1", "-j", GUARD_CHAIN])?;
    }
    Ok(())
}

/// Removes every chain named `KUBE-*` (kube-proxy's, the kubelet's) or ours, in every
/// table, for IPv4 and IPv6, with the rules that jump to them.
fn iptables_down() -> Vec<String> {
    let mut problems = Vec::new();
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(rules) =
                crate::exec::output(Command::new(tool).args(["-w", "5", "-t", table, "-S"]))
            else {
                continue;
            };
            let ours = |chain: &str| chain.starts_with("KUBE-") || chain == GUARD_CHAIN;
            let chains: BTreeSet<String> = rules
                .lines()
                .filter_map(|l| l.strip_prefix("-N "))
                .filter(|c| ours(c))
                .map(str::to_string)
                .collect();
            // Rules in the built-in chains that jump to ours.
            for line in rules.lines() {
                let Some(rule) = line.strip_prefix("-A ") else {
                    continue;
                };
                let chain = rule.split(' ').next().unwrap_or_default();
                if ours(chain) {
                    continue;
                }
                let target = rule.split(" -j ").nth(1).and_then(|t| t.split(' ').next());
                if target.is_some_and(ours) {
                    let mut args: Vec<String> =
                        ["-w", "5", "-t", table, "-D"].map(String::from).to_vec();
                    args.extend(split_rule(rule));
                    if let Err(e) = run_quiet(Command::new(tool).args(&args)) {
                        problems.push(e.to_string());
                    }
                }
            }
            for c in &chains {
                let _ = run_quiet(Command::new(tool).args(["-w", "5", "-t", table, "-F", c]));
            }
            for c in &chains {
                if let Err(e) =
                    run_quiet(Command::new(tool).args(["-w", "5", "-t", table, "-X", c]))
                {
                    problems.push(e.to_string());
                }
            }
        }
    }
    problems
}

/// Creates the kubelet's `cgroupRoot` ([`PODS_CGROUP`]) in every hierarchy (the kubelet
/// requires it to exist); in a v1 cpuset hierarchy it gets its parent's CPUs and memory
/// nodes, without which no task could join it.
pub fn pod_cgroups_up() -> Result<()> {
    for m in mounts()?
        .into_iter()
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
    {
        let dir = m.point.join(PODS_CGROUP);
        fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create cgroup {}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = m.point.join(file);
            if m.fstype == "cgroup" && parent.exists() {
                let value = fs::read_to_string(&parent)
                    .with_context(|| format!("cannot read {}", parent.display()))?;
                fs::write(dir.join(file), value.trim())
                    .with_context(|| format!("cannot write {}", dir.join(file).display()))?;
            }
        }
    }
    Ok(())
}

/// The words of a rule as `iptables -S` prints it: space-separated, with double-quoted
/// words (comments) kept whole and unquoted.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Starts `bin args` in the background: its own process group, cgroup
/// `kpulse-cluster/<name>` (joined before exec), output appended to `logs/<name>.log`,
/// PID in `state/<name>.pid`.
pub fn start(
    dirs: &Dirs,
    name: &str,
    bin: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> Result<u32> {
    let cgroup = cgroup2_root()?.join(CGROUP).join(name);
    fs::create_dir_all(&cgroup)
        .with_context(|| format!("cannot create cgroup {}", cgroup.display()))?;
    let log_path = dirs.logs.join(format!("{name}.log"));
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(cgroup.join("cgroup.procs"))
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let pid = child.id();
    fs::write(dirs.state.join(format!("{name}.pid")), pid.to_string())?;
    Ok(pid)
}

/// Restarts a process [`start`] started, with its command line (as the kernel has it)
/// edited by `edit`: same binary, cgroup, log and PID file. SIGTERM, then SIGKILL after
/// 30 s. Returns the new PID.
pub fn restart(
    dirs: &Dirs,
    name: &str,
    edit: impl FnOnce(Vec<String>) -> Vec<String>,
) -> Result<u32> {
    let pid_file = dirs.state.join(format!("{name}.pid"));
    let pid: u32 = fs::read_to_string(&pid_file)
        .with_context(|| format!("cannot read {}", pid_file.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{}: not a PID", pid_file.display()))?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("{name} (PID {pid}) is not running"))?;
    let mut argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if argv.is_empty() {
        bail!("{name} (PID {pid}) has no command line");
    }
    let bin = PathBuf::from(argv.remove(0));
    let args = edit(argv);
    for (signal, wait) in [("-TERM", 30), ("-KILL", 10)] {
        let _ = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
        let t = Instant::now();
        while alive(pid) && t.elapsed() < Duration::from_secs(wait) {
            thread::sleep(Duration::from_millis(100));
        }
        if !alive(pid) {
            return start(dirs, name, &bin, &args, &[]);
        }
    }
    bail!("{name} (PID {pid}) did not exit")
}

/// Whether process `pid` is alive (not a zombie).
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// The last `n` lines of a process's log, for errors.
pub fn log_tail(dirs: &Dirs, name: &str, n: usize) -> String {
    let text = fs::read_to_string(dirs.logs.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `ready` every 500 ms until it says yes, `timeout` passes, or the process `name`
/// (PID `pid`) exits; prints a line every 15 s.
pub fn wait_for(
    dirs: &Dirs,
    what: &str,
    process: Option<(&str, u32)>,
    timeout: Duration,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let started = Instant::now();
    let mut last_note = Instant::now();
    let mut last_error = String::new();
    loop {
        match ready() {
            Ok(true) => return Ok(started.elapsed()),
            Ok(false) => {}
            Err(e) => last_error = format!("{e:#}"),
        }
        if let Some((name, pid)) = process {
            if !alive(pid) {
                bail!(
                    "{name} exited while waiting for {what}; the end of {}:\n{}",
                    dirs.logs.join(format!("{name}.log")).display(),
                    log_tail(dirs, name, 30)
                );
            }
        }
        if started.elapsed() > timeout {
            let log = process
                .map(|(name, _)| format!("\nthe end of {name}.log:\n{}", log_tail(dirs, name, 30)))
                .unwrap_or_default();
            bail!(
                "timed out after {} s waiting for {what}{}{log}",
                timeout.as_secs(),
                if last_error.is_empty() {
                    String::new()
                } else {
                    format!(" (last error: {last_error})")
                }
            );
        }
        if last_note.elapsed() > Duration::from_secs(15) {
            println!(
                "cluster:   still waiting for {what} ({} s)",
                started.elapsed().as_secs()
            );
            last_note = Instant::now();
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// Cgroup `dir` and every cgroup below it (nothing when it does not exist).
fn cgroup_tree(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        stack.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
        all.push(d);
    }
    all
}

/// PIDs in cgroup `dir` and below.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    cgroup_tree(dir)
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(|p| p.to_string()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes cgroup `dir` and everything below it, deepest first.
fn remove_cgroup_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut dirs = cgroup_tree(dir);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        fs::remove_dir(&d).with_context(|| format!("cannot remove cgroup {}", d.display()))?;
    }
    Ok(())
}

/// Everything `up` made on this machine outside `target/`, undone: processes (ours by
/// cgroup and PID file, and every pod's), mounts under our directories, cgroups, the
/// bridge and route, iptables chains, sysctls, `/run/kpulse-cluster`. Then the cluster's
/// data under `target/cluster` (not its builds, images or logs). Safe to run when nothing
/// or only part is up. Returns what could not be undone.
pub fn teardown(dirs: &Dirs) -> Vec<String> {
    let mut problems = Vec::new();
    let mut ours: Vec<PathBuf> = Vec::new();
    let mut pods: Vec<PathBuf> = Vec::new();
    match hierarchies() {
        Ok(hs) => {
            for h in hs {
                ours.push(h.join(CGROUP));
                pods.push(h.join(PODS_CGROUP));
            }
        }
        Err(e) => problems.push(format!("{e:#}")),
    }
    // Ask nicely first (etcd and containerd flush their state), then kill.
    let pid_files: Vec<u32> = fs::read_dir(&dirs.state)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
        .filter_map(|e| fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .collect();
    let collect = |trees: &[PathBuf]| -> Vec<u32> {
        let mut v: Vec<u32> = trees.iter().flat_map(|t| cgroup_pids(t)).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut daemons = collect(&ours);
    daemons.extend(pid_files.iter().copied().filter(|p| alive(*p)));
    signal(&daemons, "TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && daemons.iter().any(|p| alive(*p)) {
        thread::sleep(Duration::from_millis(200));
    }
    for round in 0..50 {
        let mut left = collect(&ours);
        left.extend(collect(&pods));
        left.extend(pid_files.iter().copied().filter(|p| alive(*p)));
        left.retain(|p| alive(*p));
        if left.is_empty() {
            break;
        }
        signal(&left, "KILL");
        thread::sleep(Duration::from_millis(100));
        if round == 49 {
            problems.push(format!("processes still alive: {left:?}"));
        }
    }

    // Mounts under our directories (pod volumes, rootfs overlays, shm, netns).
    for point in unmount_under(&[dirs.data.clone(), dirs.run.clone()]) {
        problems.push(format!("still mounted: {}", point.display()));
    }

    // A cgroup whose last process has just been killed can stay busy for a moment.
    for tree in ours.iter().chain(pods.iter()) {
        let mut last = Ok(());
        for _ in 0..50 {
            last = remove_cgroup_tree(tree);
            if last.is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        if let Err(e) = last {
            problems.push(format!("{e:#}"));
        }
    }

    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        if let Err(e) = run_quiet(Command::new("ip").args(["link", "del", BRIDGE])) {
            problems.push(format!("{e:#}"));
        }
    }
    if let Err(e) = vm_network_down() {
        problems.push(format!("{e:#}"));
    }
    if let Err(e) = fleet_route_down() {
        problems.push(format!("{e:#}"));
    }
    // The veths of pods whose network namespaces are gone went with them.
    problems.extend(iptables_down());
    // After every process: what they had in swap comes back to memory, or is freed.
    problems.extend(swap_down(dirs));
    for (key, _) in SYSCTLS {
        let record = dirs.state.join(format!("sysctl.{}", key.replace('/', ".")));
        if let Ok(old) = fs::read_to_string(&record) {
            if let Err(e) = fs::write(sysctl_path(key), old.trim()) {
                problems.push(format!("cannot restore {key}: {e}"));
            } else {
                let _ = fs::remove_file(&record);
            }
        }
    }
    for d in [&dirs.run, &dirs.data, &dirs.state, &dirs.pki, &dirs.etc] {
        if d.exists() {
            if let Err(e) = fs::remove_dir_all(d) {
                problems.push(format!("cannot remove {}: {e}", d.display()));
            }
        }
    }
    let _ = fs::remove_file(dirs.kubeconfig());
    problems
}

/// What of a cluster is still on this machine, checked independently of how it was
/// removed: processes in our or the kubelet's cgroups, those cgroups, mounts under our
/// directories, the bridge, iptables chains, `/run/kpulse-cluster`, unrestored sysctls.
pub fn leftovers(dirs: &Dirs) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(hs) = hierarchies() {
        for h in hs {
            for name in [CGROUP, PODS_CGROUP] {
                let dir = h.join(name);
                if dir.exists() {
                    let pids = cgroup_pids(&dir);
                    found.push(format!("cgroup {} (processes {pids:?})", dir.display()));
                }
            }
        }
    }
    if let Ok(all) = mounts() {
        for m in all {
            if m.point.starts_with(&dirs.data) || m.point.starts_with(&dirs.run) {
                found.push(format!("mount {}", m.point.display()));
            }
        }
    }
    for link in [BRIDGE, VM_BRIDGE, VM_TAP] {
        if Path::new("/sys/class/net").join(link).exists() {
            found.push(format!("network interface {link}"));
        }
    }
    if fleet_route_exists() {
        found.push(format!("route blackhole {FLEET_POD_RANGE}"));
    }
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            if let Ok(rules) =
                crate::exec::output(Command::new(tool).args(["-w", "5", "-t", table, "-S"]))
            {
                for chain in rules.lines().filter_map(|l| l.strip_prefix("-N ")) {
                    if chain.starts_with("KUBE-") || chain == GUARD_CHAIN {
                        found.push(format!("{tool} -t {table} chain {chain}"));
                    }
                }
            }
        }
    }
    if dirs.run.exists() {
        found.push(format!("directory {}", dirs.run.display()));
    }
    let swap = swap_file(dirs);
    if swap_active(&swap) || swap.exists() {
        found.push(format!("swap file {}", swap.display()));
    }
    for (key, _) in SYSCTLS {
        if dirs
            .state
            .join(format!("sysctl.{}", key.replace('/', ".")))
            .exists()
        {
            found.push(format!("sysctl {key} not restored"));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_points_and_types() {
        let text = "36 35 98:0 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                    40 35 0:5 / /run/a\\040b rw - overlay overlay rw,lowerdir=x\n";
        let m = parse_mountinfo(text);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m[0].fstype, "cgroup2");
        assert_eq!(m[1].point, PathBuf::from("/run/a b"));
        assert_eq!(m[1].fstype, "overlay");
    }

    #[test]
    fn iptables_rules_split_like_a_shell() {
        assert_eq!(
            split_rule(
                r#"POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#
            ),
            [
                "POSTROUTING",
                "-m",
                "comment",
                "--comment",
                "kubernetes postrouting rules",
                "-j",
                "KUBE-POSTROUTING"
            ]
        );
    }
}
