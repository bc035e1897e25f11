//! The cluster's processes: their flags and configuration files, one function each, in
//! the order `up` starts them. Flags follow kubeadm's static pods where kubeadm sets them.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use super::{
    host::{self, Dirs},
    images,
    pki::Pki,
};

/// The node's name (kubelet, kube-proxy; the kubelet certificate's CN).
pub const NODE_NAME: &str = "kpulse-node";
pub const ETCD_CLIENT: &str = "http://127.0.0.1:2379";
pub const APISERVER_PORT: u16 = 6443;

pub fn apiserver_url() -> String {
    format!("https://{}:{APISERVER_PORT}", host::NODE_IP)
}

/// curl as the cluster's admin (its client certificate, the cluster CA trusted): a request
/// to kube-apiserver without kubectl, when its bytes or timing are what is measured.
pub fn admin_curl(pki: &Path) -> std::process::Command {
    let mut curl = std::process::Command::new("curl");
    curl.arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"));
    curl
}

fn s(v: &str) -> String {
    v.to_string()
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// etcd on loopback, plain HTTP (it is reachable from this machine only).
pub fn etcd(dirs: &Dirs) -> Vec<String> {
    vec![
        s("--name=kpulse"),
        format!("--data-dir={}", p(&dirs.data.join("etcd"))),
        format!("--listen-client-urls={ETCD_CLIENT}"),
        format!("--advertise-client-urls={ETCD_CLIENT}"),
        s("--listen-peer-urls=http://127.0.0.1:2380"),
        s("--initial-advertise-peer-urls=http://127.0.0.1:2380"),
        s("--initial-cluster=kpulse=http://127.0.0.1:2380"),
        s("--listen-metrics-urls=http://127.0.0.1:2381"),
        s("--log-level=warn"),
    ]
}

/// kube-apiserver with the aggregation layer as kubeadm sets it up, plus
/// `--enable-aggregator-routing` (it calls extension API servers at their endpoints).
pub fn apiserver(pki: &Pki) -> Vec<String> {
    let f = |flag: &str, path: &Path| format!("--{flag}={}", p(path));
    vec![
        format!("--advertise-address={}", host::NODE_IP),
        format!("--bind-address={}", host::NODE_IP),
        format!("--secure-port={APISERVER_PORT}"),
        format!("--etcd-servers={ETCD_CLIENT}"),
        s("--allow-privileged=true"),
        s("--authorization-mode=Node,RBAC"),
        s("--enable-admission-plugins=NodeRestriction"),
        f("client-ca-file", &pki.ca.cert),
        f("tls-cert-file", &pki.apiserver.cert),
        f("tls-private-key-file", &pki.apiserver.key),
        f(
            "kubelet-client-certificate",
            &pki.apiserver_kubelet_client.cert,
        ),
        f("kubelet-client-key", &pki.apiserver_kubelet_client.key),
        s("--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname"),
        // The aggregation layer (kubeadm's flags).
        f("proxy-client-cert-file", &pki.front_proxy_client.cert),
        f("proxy-client-key-file", &pki.front_proxy_client.key),
        f("requestheader-client-ca-file", &pki.front_proxy_ca.cert),
        s("--requestheader-allowed-names=front-proxy-client"),
        s("--requestheader-username-headers=X-Remote-User"),
        s("--requestheader-group-headers=X-Remote-Group"),
        s("--requestheader-uid-headers=X-Remote-Uid"),
        s("--requestheader-extra-headers-prefix=X-Remote-Extra-"),
        s("--enable-aggregator-routing=true"),
        format!("--service-cluster-ip-range={}", host::SERVICE_CIDR),
        s("--service-account-issuer=https://kubernetes.default.svc.cluster.local"),
        f("service-account-key-file", &pki.sa_pub),
        f("service-account-signing-key-file", &pki.sa_key),
        s("--profiling=false"),
    ]
}

/// The flags kube-controller-manager and kube-scheduler share: one kubeconfig for the API,
/// for delegated authentication and authorization; loopback serving; no leader election.
fn control_plane_client(pki: &Pki, file: &str) -> Vec<String> {
    let kubeconfig = p(&pki.dir.join(file));
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        s("--bind-address=127.0.0.1"),
        s("--leader-elect=false"),
    ]
}

pub fn controller_manager(pki: &Pki) -> Vec<String> {
    let mut flags = control_plane_client(pki, "controller-manager.kubeconfig");
    flags.extend([
        // Every default controller: HPA, deployment, replicaset, garbage collector,
        // namespace, node lifecycle, service accounts, endpoints, …
        s("--controllers=*"),
        s("--use-service-account-credentials=true"),
        format!("--root-ca-file={}", p(&pki.ca.cert)),
        format!("--service-account-private-key-file={}", p(&pki.sa_key)),
        format!("--cluster-signing-cert-file={}", p(&pki.ca.cert)),
        format!("--cluster-signing-key-file={}", p(&pki.ca.key)),
        format!("--service-cluster-ip-range={}", host::SERVICE_CIDR),
        format!(
            "--requestheader-client-ca-file={}",
            p(&pki.front_proxy_ca.cert)
        ),
        format!("--client-ca-file={}", p(&pki.ca.cert)),
    ]);
    flags
}

pub fn scheduler(pki: &Pki) -> Vec<String> {
    control_plane_client(pki, "scheduler.kubeconfig")
}

/// Where one node's containerd keeps its state and finds its helpers (this machine's node,
/// or the arm64 node's, `arm64_node.rs`).
pub struct ContainerdNode {
    pub root: String,
    pub state: String,
    pub socket: String,
    pub runc: String,
    pub cni_bin: String,
    pub cni_conf: String,
    /// runc is told not to `pivot_root`: the arm64 node's root file system is an
    /// initramfs, which pivot_root(2) refuses (EINVAL).
    pub no_pivot_root: bool,
}

/// containerd's configuration (version 3): CRI with runc (cgroupfs driver), the pause
/// image built here pinned as the sandbox, CNI from the plugins built here.
pub fn containerd_text(node: &ContainerdNode) -> String {
    let no_pivot = if node.no_pivot_root {
        "  # The root file system is an initramfs, which pivot_root(2) refuses.\n  NoPivotRoot = true\n"
    } else {
        ""
    };
    format!(
        r#"# Written by `cargo xtask cluster`.
version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[metrics]
  address = ""

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # This machine withholds CAP_SYS_RESOURCE even from root, so no process may lower its
  # oom_score_adj (containerd gives sandboxes -998, kubelet Guaranteed pods -997): runc
  # would fail with "failed to update /proc/self/oom_score_adj: Permission denied". With
  # this, containerd raises any lower value to its own (0).
  restrict_oom_score_adj = true
  # Pod network namespaces under containerd's state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
{no_pivot}
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"#,
        root = node.root,
        state = node.state,
        sock = node.socket,
        pause = images::pause_image(),
        runc = node.runc,
        cni_bin = node.cni_bin,
        cni_conf = node.cni_conf,
    )
}

/// This machine's node's containerd configuration, written under `dirs.etc`.
pub fn containerd_config(dirs: &Dirs, cni_bin: &Path, runc: &Path) -> Result<std::path::PathBuf> {
    let text = containerd_text(&ContainerdNode {
        root: p(&dirs.data.join("containerd")),
        state: p(&dirs.run.join("containerd")),
        socket: p(&dirs.containerd_socket()),
        runc: p(runc),
        cni_bin: p(cni_bin),
        cni_conf: p(&dirs.etc.join("cni")),
        no_pivot_root: false,
    });
    write(&dirs.etc.join("containerd.toml"), &text)
}

/// The CNI network: one bridge ([`host::BRIDGE`], already made, with the node's address as
/// the pods' gateway), host-local addresses, no masquerading (nothing leaves this machine).
pub fn cni_config(dirs: &Dirs) -> Result<std::path::PathBuf> {
    let text = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kpulse",
        "plugins": [
            {
                "type": "bridge",
                "bridge": host::BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": host::POD_SUBNET, "gateway": host::NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": p(&dirs.data.join("cni-ipam")),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    let dir = dirs.etc.join("cni");
    fs::create_dir_all(&dir)?;
    write(
        &dir.join("10-kpulse.conflist"),
        &serde_json::to_string_pretty(&text)?,
    )
}

/// What differs between one node's kubelet and another's (this machine's node, or the
/// arm64 node's, `arm64_node.rs`).
pub struct KubeletNode {
    /// The node's address: where the kubelet serves.
    pub address: String,
    pub client_ca: String,
    pub cert: String,
    pub key: String,
    /// The cgroup its `kubepods` tree goes below; `None`: the root.
    pub cgroup_root: Option<String>,
    /// containerd's socket.
    pub socket: String,
    pub resolv_conf: String,
    pub pod_logs: String,
    /// Registered with this `NoSchedule` taint.
    pub taint: Option<String>,
}

/// The kubelet: cgroupfs driver (as containerd's runc), cgroup v1 allowed (this machine's
/// hybrid layout; kubelet 1.35+ refuses v1 unless told), x509 and webhook authentication,
/// webhook authorization, no image garbage collection (images cannot be pulled again), and
/// a resolv.conf without upstream servers (DNS never leaves the cluster).
pub fn kubelet_text(node: &KubeletNode) -> String {
    let endpoint = format!("unix://{}", node.socket);
    let cgroup_root = node
        .cgroup_root
        .as_ref()
        .map_or(String::new(), |c| format!("cgroupRoot: {c}\n"));
    let taints = node.taint.as_ref().map_or(String::new(), |t| {
        format!("registerWithTaints:\n  - key: {t}\n    effect: NoSchedule\n")
    });
    format!(
        r#"# Written by `cargo xtask cluster`.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
rotateCertificates: false
serverTLSBootstrap: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
{cgroup_root}failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: {endpoint}
imageServiceEndpoint: {endpoint}
clusterDNS:
  - {dns}
clusterDomain: cluster.local
resolvConf: {resolv}
podLogsDir: {logs}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
serializeImagePulls: false
{taints}"#,
        address = node.address,
        ca = node.client_ca,
        cert = node.cert,
        key = node.key,
        dns = host::DNS_SERVICE_IP,
        resolv = node.resolv_conf,
        logs = node.pod_logs,
    )
}

/// A resolv.conf without upstream servers: names outside the cluster do not resolve.
pub const RESOLV_CONF: &str =
    "# No upstream resolvers: names outside the cluster do not resolve.\noptions ndots:5\n";

/// This machine's node's kubelet configuration: pods below [`host::PODS_CGROUP`]; written
/// under `dirs.etc`.
pub fn kubelet_config(dirs: &Dirs, pki: &Pki) -> Result<std::path::PathBuf> {
    let resolv = dirs.etc.join("resolv.conf");
    write(&resolv, RESOLV_CONF)?;
    let text = kubelet_text(&KubeletNode {
        address: host::NODE_IP.to_string(),
        client_ca: p(&pki.ca.cert),
        cert: p(&pki.kubelet.cert),
        key: p(&pki.kubelet.key),
        cgroup_root: Some(format!("/{}", host::PODS_CGROUP)),
        socket: p(&dirs.containerd_socket()),
        resolv_conf: p(&resolv),
        pod_logs: p(&dirs.data.join("pod-logs")),
        taint: None,
    });
    write(&dirs.etc.join("kubelet.yaml"), &text)
}

pub fn kubelet(dirs: &Dirs, pki: &Pki, config: &Path) -> Vec<String> {
    vec![
        format!("--config={}", p(config)),
        format!("--kubeconfig={}", p(&pki.dir.join("kubelet.kubeconfig"))),
        format!("--root-dir={}", p(&dirs.data.join("kubelet"))),
        format!("--node-ip={}", host::NODE_IP),
        format!("--hostname-override={NODE_NAME}"),
        s("--v=1"),
    ]
}

/// kube-proxy in iptables mode; NodePorts only on the node's address; conntrack sysctls
/// left as they are.
pub fn kube_proxy_config(dirs: &Dirs, pki: &Pki) -> Result<std::path::PathBuf> {
    let text = format!(
        r#"# Written by `cargo xtask cluster up`.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
mode: iptables
clusterCIDR: {cidr}
bindAddress: {node_ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses:
  - {node_ip}/32
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        kubeconfig = p(&pki.dir.join("kube-proxy.kubeconfig")),
        cidr = host::CLUSTER_CIDR,
        node_ip = host::NODE_IP,
    );
    write(&dirs.etc.join("kube-proxy.yaml"), &text)
}

/// CoreDNS: the cluster's DNS, with no forwarding (names outside the cluster fail).
pub fn coredns_manifest(dirs: &Dirs) -> Result<std::path::PathBuf> {
    let text = include_str!("coredns.yaml")
        .replace("${IMAGE}", &images::coredns_image())
        .replace("${DNS_IP}", host::DNS_SERVICE_IP);
    write(&dirs.etc.join("coredns.yaml"), &text)
}

fn write(path: &Path, text: &str) -> Result<std::path::PathBuf> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_path_buf())
}
