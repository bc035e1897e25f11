//! An arm64 node in the local cluster: a qemu VM (TCG) booting Debian's arm64 kernel, pure
//! cgroup v2, with containerd, runc and the kubelet of the cluster's release built for
//! arm64 here, joined to this machine's kube-apiserver as node [`NODE`]. The kpulse agent
//! DaemonSet, installed as the README says, schedules its pod there like on any node; its
//! image is the arm64 half of the same manifest list.
//!
//! - **Built** ([`build`]): the kubelet, containerd (with its runc shim and `ctr`) and the
//!   CNI plugins the node uses, pure Go for `GOARCH=arm64`; runc with cgo, linked
//!   statically against Debian's arm64 libseccomp (the agent's pod asks for the runtime's
//!   default seccomp profile, which a runc without seccomp refuses to apply).
//! - **The VM's root** is the initramfs of `vm::run_in_vm`: busybox, those binaries, the
//!   kernel modules the node needs (virtio-net, bridge, veth, overlay; Debian builds them as
//!   modules), the agent's and the pause image's OCI archives, and the node's configuration.
//!   An initramfs root cannot be `pivot_root`ed, so runc is told not to (`NoPivotRoot`);
//!   everything else is configured as on this machine's node (`daemons.rs`).
//! - **Credentials** are minted from the cluster CA (`pki::node`), as for the first node:
//!   a client certificate of `system:node:kpulse-arm64` and a serving certificate for its
//!   address, which kube-apiserver and kpulse's kubelet fallback check.
//! - **Network** (`host::vm_network_up`): a bridge of its own on this side and a tap for the
//!   VM's card; the node routes the cluster's pod range and the Service range to this host,
//!   which has kube-proxy's rules for Services (the node runs no kube-proxy) and a route to
//!   the node's pods. The node has no default route, and this host's guard drops whatever of
//!   the pod range would leave by another interface: nothing leaves the machine.
//! - **Taint** [`TAINT`]: only what tolerates every taint (the agent) lands on an emulated
//!   node, not the cluster's add-ons or the checks' workloads, which are built for this
//!   machine's architecture.
//!
//! [`check`] is the last cluster check: the node must become Ready, the agent's pod run
//! there, every aggregator-api replica serve the node from its agent, and `kubectl top`
//! show it; the node's CPU and memory are compared with its own kubelet's
//! `/metrics/resource`. Then the VM is stopped and the Node deleted.

use std::{
    fs,
    io::Write as _,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, ensure, Context, Result};

use super::{
    check::Ctx,
    daemons,
    gobuild::{self, Component, Cross},
    host, images, pki, versions,
};
use crate::vm::{self, Arch, Kernel};

/// The node's name.
pub const NODE: &str = "kpulse-arm64";
/// The taint the kubelet registers the node with.
pub const TAINT: &str = "kpulse.local/emulated-arm64";
/// The guest's memory: kernel, initramfs, containerd, the kubelet, the agent, with room
/// above the kubelet's `memory.available` eviction threshold (100 MiB).
const MEMORY_MIB: u32 = 1536;
/// The port the guest listens on for the host's word to stop.
const STOP_PORT: u16 = 7777;
/// The card's MAC address (locally administered, qemu's prefix).
const MAC: &str = "52:54:00:6b:70:02";
/// The modules the node loads, in dependency order (no modules.dep in the initramfs).
const MODULES: [&str; 8] = [
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
    "net/llc/llc",
    "net/802/stp",
    "net/bridge/bridge",
    "drivers/net/veth",
    "fs/overlayfs/overlay",
];
/// containerd's socket in the guest (its default).
const GUEST_SOCKET: &str = "/run/containerd/containerd.sock";
/// The CNI plugins the node's network uses.
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];
/// Boot, containerd, image import and kubelet registration; then the agent's start (its
/// image unpacked, its eBPF object loaded), under TCG on two host cores that the cluster
/// also uses. The first runs took 27 s and 7 s more.
const READY_WITHIN: Duration = Duration::from_secs(600);
const AGENT_WITHIN: Duration = Duration::from_secs(300);
/// The aggregator-api's replicas take the agent's stream, `kubectl top` answers.
const SERVED_WITHIN: Duration = Duration::from_secs(120);
const TOP_WITHIN: Duration = Duration::from_secs(60);
/// How long the node's figures are compared with its kubelet's.
const COMPARE_FOR: Duration = Duration::from_secs(90);
/// From the word on [`STOP_PORT`] to the VM's end (log tails, power-off).
const STOP_WITHIN: Duration = Duration::from_secs(60);
/// The VM's own limit: every wait above, the time their `kubectl` calls may add (10 s
/// each, a few dozen), and the way down. The host stops it sooner.
const VM_TIMEOUT: Duration = Duration::from_secs(
    READY_WITHIN.as_secs()
        + AGENT_WITHIN.as_secs()
        + SERVED_WITHIN.as_secs()
        + 2 * TOP_WITHIN.as_secs()
        + COMPARE_FOR.as_secs()
        + STOP_WITHIN.as_secs()
        + 600,
);

/// The arm64 builds of the node's components of `release`.
fn components(root: &Path, release: &versions::Release) -> Result<Vec<Component>> {
    let cross = |sysroot: Option<PathBuf>| Cross {
        goarch: Arch::Arm64.debian(),
        cc: crate::cross::GCC,
        sysroot,
        triplet: "aarch64-linux-gnu",
    };
    let mut kubelet = gobuild::kubernetes(release);
    kubelet.commands = vec!["k8s.io/kubernetes/cmd/kubelet".to_string()];
    kubelet.cross = Some(cross(None));
    let mut out = vec![kubelet];
    for mut c in gobuild::node_components(release) {
        match c.name {
            "containerd" => c.cross = Some(cross(None)),
            "runc" => {
                let lib = crate::cross::arm64_file(
                    root,
                    "libseccomp-dev",
                    "usr/lib/aarch64-linux-gnu/libseccomp.a",
                )?;
                // <sysroot>/usr/lib/aarch64-linux-gnu/libseccomp.a
                let sysroot = lib
                    .ancestors()
                    .nth(4)
                    .context("libseccomp.a lies too shallow")?
                    .to_path_buf();
                c.cross = Some(cross(Some(sysroot)));
            }
            "cni-plugins" => {
                c.commands
                    .retain(|p| CNI_PLUGINS.contains(&gobuild::command_name(p)));
                c.cross = Some(cross(None));
            }
            _ => continue,
        }
        out.push(c);
    }
    Ok(out)
}

/// Builds the node's arm64 components (each once: Go's stamps), and returns the guest's
/// binaries as (host path, guest path).
pub fn build(
    root: &Path,
    build_root: &Path,
    release: &versions::Release,
) -> Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    for c in components(root, release)? {
        gobuild::build(&c, build_root)?;
        let dir = if c.name == "cni-plugins" {
            "/opt/cni/bin"
        } else {
            "/usr/local/bin"
        };
        for b in c.binaries() {
            files.push((c.bin(build_root, &b), format!("{dir}/{b}")));
        }
    }
    Ok(files)
}

/// The images the guest imports: (archive on this host, path in the guest, the repository
/// `ctr images import --base-name` gives it: OCI archives name only the tag).
struct Image {
    archive: PathBuf,
    guest: &'static str,
    repository: String,
}

/// The agent's and the pause image's archives, as the image builder wrote them.
fn images(root: &Path) -> Result<[Image; 2]> {
    let image = |name: &str, guest| -> Result<Image> {
        let (archive, repository) = images::manifest_archive(root, name)?;
        Ok(Image {
            archive,
            guest,
            repository,
        })
    };
    Ok([
        image(images::AGENT_IMAGE, "/root/images/agent.tar")?,
        image(&images::pause_image(), "/root/images/pause.tar")?,
    ])
}

/// The guest's program: modules, cgroup controllers, network, containerd, the images, the
/// kubelet; then it waits for the host's word on [`STOP_PORT`] and prints the logs' tails.
fn script(images: &[Image]) -> String {
    let modules: Vec<String> = MODULES
        .iter()
        .map(|m| format!("/root/ko/{}.ko", module_file(m)))
        .collect();
    let modules = modules.join(" ");
    let (node_ip, host_ip) = (host::VM_NODE_IP, host::VM_HOST_IP);
    let (cluster, services) = (host::CLUSTER_CIDR, host::SERVICE_CIDR);
    let imports: String = images
        .iter()
        .map(|i| {
            format!(
                "ctr -n k8s.io images import --base-name {} {} > /dev/null || fail \"import {}\"\n",
                i.repository, i.guest, i.guest
            )
        })
        .collect();
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask cluster check` (xtask/src/cluster/arm64_node.rs).
set -u
export PATH=/usr/local/bin:$PATH
say() {{ echo "[$(cut -d' ' -f1 /proc/uptime) s] $*"; }}
fail() {{ say "FAILED: $*"; for f in /var/log/containerd.log /var/log/kubelet.log; do [ -f $f ] && tail -40 $f; done; exit 1; }}
for m in {modules}; do insmod $m || fail "insmod $m"; done
# What the kubelet asks of the root cgroup on cgroup v2 (cpu and memory are already on).
for c in cpuset io pids hugetlb; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || fail "cgroup controller $c"; done
hostname {NODE}
echo {NODE} > /etc/hostname
ip link set eth0 up && ip addr add {node_ip}/24 dev eth0 || fail "eth0"
ip route add {cluster} via {host_ip} && ip route add {services} via {host_ip} || fail "routes"
echo 1 > /proc/sys/net/ipv4/ip_forward
# The node's disk: containerd's and the kubelet's state, pod logs.
mkdir -p /var && mount -t tmpfs -o size=768m tmpfs /var || fail "/var"
mkdir -p /var/lib/containerd /var/lib/kubelet /var/log/pods && ln -s /run /var/run
say "network up; kube-apiserver at {}:6443: $(nc -w 10 {} 6443 < /dev/null && echo reachable || echo NOT reachable)"
containerd --config /etc/containerd/config.toml > /var/log/containerd.log 2>&1 &
i=0; until ctr --address {GUEST_SOCKET} version > /dev/null 2>&1; do i=$((i+1)); [ $i -lt 600 ] || fail "containerd did not start"; sleep 0.2; done
say "containerd up"
{imports}say "images imported: $(ctr -n k8s.io images ls -q | grep -v sha256 | tr '\n' ' ')"
kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubelet.kubeconfig \
    --node-ip={node_ip} --hostname-override={NODE} --v=1 > /var/log/kubelet.log 2>&1 &
say "kubelet started"
nc -l -p {STOP_PORT} > /tmp/stop
say "stop: $(cat /tmp/stop); memory: $(free -m | sed -n 2p)"
say "kubelet's last lines:"; tail -15 /var/log/kubelet.log
say "containerd's errors:"; grep -E 'level=(error|fatal)' /var/log/containerd.log | tail -10
kill $(pidof kubelet) 2> /dev/null
exit 0
"#,
        host::NODE_IP,
        host::NODE_IP,
    )
}

/// The last path element of a module (`net/bridge/bridge` → `bridge`).
fn module_file(module: &str) -> &str {
    module.rsplit('/').next().unwrap_or(module)
}

/// containerd's configuration in the guest: as this machine's node's, with the guest's
/// paths, and runc told not to `pivot_root` (the initramfs root cannot be).
fn containerd_config() -> String {
    daemons::containerd_text(&daemons::ContainerdNode {
        root: "/var/lib/containerd".into(),
        state: "/run/containerd".into(),
        socket: GUEST_SOCKET.into(),
        runc: "/usr/local/bin/runc".into(),
        cni_bin: "/opt/cni/bin".into(),
        cni_conf: "/etc/cni/net.d".into(),
        no_pivot_root: true,
    })
}

/// The node's pod network: a bridge inside the VM, the node's pod subnet.
fn cni_config() -> Result<String> {
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kpulse",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "kpcni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": host::VM_POD_SUBNET, "gateway": host::VM_POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                }
            },
            {"type": "loopback"}
        ]
    }))?)
}

/// The kubelet's configuration: as this machine's node's, on the VM's address and paths,
/// registered with [`TAINT`].
fn kubelet_config() -> String {
    daemons::kubelet_text(&daemons::KubeletNode {
        address: host::VM_NODE_IP.into(),
        client_ca: "/etc/kubernetes/ca.crt".into(),
        cert: "/etc/kubernetes/kubelet-serving.crt".into(),
        key: "/etc/kubernetes/kubelet-serving.key".into(),
        cgroup_root: None,
        socket: GUEST_SOCKET.into(),
        resolv_conf: "/etc/kubernetes/resolv.conf".into(),
        pod_logs: "/var/log/pods".into(),
        taint: Some(TAINT.into()),
    })
}

/// Writes the node's configuration and credentials into `dir`, and returns every file the
/// guest needs but its binaries, as (host path, guest path).
fn guest_files(root: &Path, dirs: &host::Dirs, dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    let server = format!("https://{}:6443", host::NODE_IP);
    pki::node(&dirs.pki, dir, NODE, host::VM_NODE_IP, &server)?;
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    };
    let images = images(root)?;
    let script = write("node.sh", &script(&images))?;
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("cannot chmod {}", script.display()))?;
    let mut files = vec![
        // The kubelet reads the users and groups (its user-namespace mappings), and names
        // the node's machine ID.
        (
            write("passwd", "root:x:0:0:root:/root:/bin/sh\n")?,
            "/etc/passwd".to_string(),
        ),
        (write("group", "root:x:0:\n")?, "/etc/group".into()),
        // What containerd copies into every pod's /etc/hosts.
        (
            write(
                "hosts",
                &format!(
                    "127.0.0.1\tlocalhost\n::1\tlocalhost\n{}\t{NODE}\n",
                    host::VM_NODE_IP
                ),
            )?,
            "/etc/hosts".into(),
        ),
        (
            write("machine-id", "6b70756c73652d61726d36342d6e6f64\n")?,
            "/etc/machine-id".into(),
        ),
        (dir.join("ca.crt"), "/etc/kubernetes/ca.crt".into()),
        (
            dir.join("kubelet-serving.crt"),
            "/etc/kubernetes/kubelet-serving.crt".into(),
        ),
        (
            dir.join("kubelet-serving.key"),
            "/etc/kubernetes/kubelet-serving.key".into(),
        ),
        (
            dir.join("kubelet.kubeconfig"),
            "/etc/kubernetes/kubelet.kubeconfig".into(),
        ),
        (
            write("kubelet.yaml", &kubelet_config())?,
            "/etc/kubernetes/kubelet.yaml".into(),
        ),
        (
            write("resolv.conf", daemons::RESOLV_CONF)?,
            "/etc/kubernetes/resolv.conf".into(),
        ),
        (
            write("containerd.toml", &containerd_config())?,
            "/etc/containerd/config.toml".into(),
        ),
        (
            write("10-kpulse.conflist", &cni_config()?)?,
            "/etc/cni/net.d/10-kpulse.conflist".into(),
        ),
    ];
    let kernel = kernel()?;
    for m in MODULES {
        files.push((
            vm::kernel_module(root, kernel, m)?,
            format!("/root/ko/{}.ko", module_file(m)),
        ));
    }
    for i in images {
        files.push((i.archive.clone(), i.guest.to_string()));
    }
    Ok(files)
}

fn kernel() -> Result<Kernel> {
    Kernel::newest(Arch::Arm64).context("no arm64 VM kernel")
}

/// The cluster check: the node joins, the agent runs there, kpulse serves it; then the VM
/// stops and the Node goes, whatever happened.
pub(super) fn check(ctx: &Ctx<'_>) -> Result<String> {
    let root = vm::workspace_root()?;
    let dirs = ctx.dirs;
    let version = fs::read_to_string(dirs.state.join("release"))
        .context("no cluster is up (no release recorded)")?;
    let release = super::release(version.trim())?;
    let mut files = build(&root, &dirs.build, &release)?;
    let dir = dirs.etc.join("arm64-node");
    files.extend(guest_files(&root, dirs, &dir)?);
    let stop_at = SocketAddr::new(host::VM_NODE_IP.parse()?, STOP_PORT);
    // A Node left by an interrupted run would carry its old agent pod (which tolerates
    // every taint, so nothing evicts it): the waits below must see this run's.
    delete_node(ctx)?;
    host::vm_network_up()?;
    let kernel = kernel()?;
    println!(
        "check: arm64 node: booting Debian's {kernel} kernel under qemu (TCG) with containerd, \
         runc and the kubelet {} for arm64",
        release.kubernetes
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let boot = Instant::now();
    let vm_thread = {
        let (root, cancel) = (root.clone(), Arc::clone(&cancel));
        let (script, pid_file) = (dir.join("node.sh"), dirs.state.join("arm64-node-qemu.pid"));
        thread::Builder::new()
            .name("arm64-node".into())
            .spawn(move || {
                // Not retried after a guest panic: a node that rebooted would not be the
                // one the waits timed.
                vm::run_in_vm(
                    &root,
                    &vm::VmRun {
                        kernel,
                        exe: &script,
                        args: &[],
                        env: &[],
                        extra_files: &files,
                        root_fs: None,
                        timeout: VM_TIMEOUT,
                        memory_mib: MEMORY_MIB,
                        cpus: 2,
                        tap: Some((host::VM_TAP, MAC)),
                        cancel: Some(&cancel),
                        // `down` ends a qemu whose caller was killed.
                        pid_file: Some(&pid_file),
                    },
                )
            })
    };
    let (result, outcome) = match vm_thread {
        Ok(vm_thread) => {
            let result = on_the_node(ctx, &vm_thread, boot);
            stop(&vm_thread, stop_at, &cancel);
            let outcome = vm_thread
                .join()
                .unwrap_or_else(|_| Err(anyhow!("the arm64 node's thread panicked")));
            (result, outcome)
        }
        Err(e) => (
            Err(anyhow!("cannot start the arm64 node's thread: {e}")),
            Err(anyhow!("no VM")),
        ),
    };
    let deleted = delete_node(ctx);
    let network = host::vm_network_down();
    let guest = match &outcome {
        Ok(o) => o.output.clone(),
        Err(e) => format!("{e:#}"),
    };
    let text = result.with_context(|| format!("the node's own output:\n{guest}"))?;
    let outcome = outcome.context("the arm64 node's VM")?;
    ensure!(
        outcome.exit_code == 0,
        "the arm64 node's script exited with {}:\n{}",
        outcome.exit_code,
        outcome.output
    );
    deleted.context("deleting the arm64 Node")?;
    network?;
    // The guest's own timeline (boot, containerd, images, kubelet, stop).
    for line in outcome.output.lines().filter(|l| l.starts_with('[')) {
        println!("check: arm64 node: guest {line}");
    }
    Ok(text)
}

/// Tells the guest to stop (a word on [`STOP_PORT`]); cancels the VM if the word cannot be
/// delivered or the VM has not ended [`STOP_WITHIN`] later.
fn stop<T>(vm: &thread::JoinHandle<T>, at: SocketAddr, cancel: &AtomicBool) {
    if vm.is_finished() {
        return;
    }
    let told = TcpStream::connect_timeout(&at, Duration::from_secs(5))
        .and_then(|mut s| s.write_all(b"stop\n"));
    if let Err(e) = told {
        println!("check: arm64 node: cannot tell the guest to stop ({e}); killing the VM");
        cancel.store(true, Ordering::Relaxed);
        return;
    }
    let t = Instant::now();
    while !vm.is_finished() && t.elapsed() < STOP_WITHIN {
        thread::sleep(Duration::from_millis(200));
    }
    if !vm.is_finished() {
        println!(
            "check: arm64 node: the guest did not power off within {} s of the word; killing \
             the VM",
            STOP_WITHIN.as_secs()
        );
        cancel.store(true, Ordering::Relaxed);
    }
}

/// `kubectl delete node` [`NODE`], waiting until it is gone (there may be none).
fn delete_node(ctx: &Ctx<'_>) -> Result<()> {
    crate::exec::output(ctx.kubectl().args([
        "delete",
        "node",
        NODE,
        "--ignore-not-found",
        "--wait=true",
    ]))
    .map(|_| ())
}

/// Polls `f` every 2 s (errors count as "not yet") until it gives a value, the VM ends or
/// `within` passes.
fn wait<T, R>(
    vm: &thread::JoinHandle<R>,
    within: Duration,
    what: &str,
    f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    super::check::poll(
        what,
        within,
        Duration::from_secs(2),
        || {
            ensure!(!vm.is_finished(), "the arm64 node's VM ended");
            Ok(())
        },
        f,
    )
}

/// What the check asks of the node once its VM runs (`boot`: when it was started).
fn on_the_node<R>(ctx: &Ctx<'_>, vm: &thread::JoinHandle<R>, boot: Instant) -> Result<String> {
    let node = wait(vm, READY_WITHIN, "the arm64 Node Ready", || {
        let v = ctx.json(&["get", "node", NODE])?;
        let ready = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Ok(ready.then_some(v))
    })?;
    let ready = boot.elapsed();
    let labels = &node["metadata"]["labels"];
    ensure!(
        labels["kubernetes.io/arch"] == "arm64" && labels["kubernetes.io/os"] == "linux",
        "the node's labels: {labels}"
    );
    let tainted = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == TAINT && t["effect"] == "NoSchedule");
    ensure!(tainted, "the node lacks its taint: {}", node["spec"]);
    let info = &node["status"]["nodeInfo"];
    let pod = wait(vm, AGENT_WITHIN, "the agent's pod ready there", || {
        let v = ctx.json(&[
            "get",
            "pods",
            "-n",
            "kpulse-system",
            "-l",
            super::fallback::AGENTS,
            &format!("--field-selector=spec.nodeName={NODE}"),
        ])?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"][0]["ready"] == true
            })
            .cloned())
    })?;
    let running = boot.elapsed();
    let pod_name = pod["metadata"]["name"]
        .as_str()
        .context("the agent's pod has no name")?
        .to_string();
    let image_id = pod["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    wait(vm, SERVED_WITHIN, "served from its agent", || {
        Ok((super::fallback::node_source(ctx, NODE)?.as_deref() == Some("agent")).then_some(()))
    })?;
    let served = boot.elapsed();
    let top = wait(vm, TOP_WITHIN, "kubectl top node", || {
        let out = crate::exec::output(ctx.kubectl().args(["top", "node", NODE, "--no-headers"]))?;
        Ok((!out.contains("<unknown>")).then(|| out.trim().to_string()))
    })?;
    let pod_top = wait(vm, TOP_WITHIN, "the agent's PodMetrics", || {
        let v = ctx.json(&["get", "podmetrics", "-n", "kpulse-system", &pod_name])?;
        Ok(v["containers"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
            .then(|| v["containers"][0]["usage"].to_string()))
    })?;
    let figures = super::fallback::node_figures_of(ctx, NODE, COMPARE_FOR)?;
    Ok(format!(
        "{NODE} ({}, kernel {}, {}, kubelet {}): from the VM's start, Ready at {:.0} s, the \
         agent's pod {pod_name} ({image_id}) ready at {:.0} s, every replica serving the \
         node from its agent at {:.0} s; kubectl top node: {top}; the agent's own pod: \
         {pod_top}; {figures}",
        info["architecture"].as_str().unwrap_or("?"),
        info["kernelVersion"].as_str().unwrap_or("?"),
        info["containerRuntimeVersion"].as_str().unwrap_or("?"),
        info["kubeletVersion"].as_str().unwrap_or("?"),
        ready.as_secs_f64(),
        running.as_secs_f64(),
        served.as_secs_f64(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_loads_every_module_and_stops_on_the_port() {
        let images = [Image {
            archive: PathBuf::from("/a.tar"),
            guest: "/root/images/agent.tar",
            repository: "ghcr.io/kpulse/kpulse-agent".into(),
        }];
        let s = script(&images);
        for m in MODULES {
            assert!(
                s.contains(&format!("/root/ko/{}.ko", module_file(m))),
                "{m}"
            );
        }
        assert!(s.contains(&format!("nc -l -p {STOP_PORT}")), "{s}");
        assert!(
            s.contains("--base-name ghcr.io/kpulse/kpulse-agent /root/images/agent.tar "),
            "{s}"
        );
    }

    #[test]
    fn the_node_is_tainted_and_on_its_own_address() {
        let k = kubelet_config();
        assert!(
            k.contains(&format!("address: {}\n", host::VM_NODE_IP)),
            "{k}"
        );
        assert!(
            k.contains(&format!("- key: {TAINT}\n    effect: NoSchedule")),
            "{k}"
        );
        let c = cni_config().expect("JSON");
        assert!(c.contains(host::VM_POD_SUBNET), "{c}");
    }
}
