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

/// containerd's configuration (version 3): CRI with runc (cgroupfs driver), the pause
/// image built here pinned as the sandbox, CNI from the plugins built here.
pub fn containerd_config(dirs: &Dirs, cni_bin: &Path, runc: &Path) -> Result<std::path::PathBuf> {
    let sock = dirs.containerd_socket();
    let text = format!(
        r#"# Written by `cargo xtask cluster up`.
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

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"#,
        root = p(&dirs.data.join("containerd")),
        state = p(&dirs.run.join("containerd")),
        sock = p(&sock),
        pause = images::pause_image(),
        runc = p(runc),
        cni_bin = p(cni_bin),
        cni_conf = p(&dirs.etc.join("cni")),
    );
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

/// The kubelet: cgroupfs driver (as containerd's runc), pods below
/// [`host::PODS_CGROUP`], cgroup v1 allowed (this machine's hybrid layout; kubelet 1.35+
/// refuses v1 unless told), x509 and webhook authentication,
/// webhook authorization, no image garbage collection (images cannot be pulled again), and
/// a resolv.conf without upstream servers (DNS never leaves the cluster).
pub fn kubelet_config(dirs: &Dirs, pki: &Pki) -> Result<std::path::PathBuf> {
    let resolv = dirs.etc.join("resolv.conf");
    write(
        &resolv,
        "# No upstream resolvers: names outside the cluster do not resolve.\noptions ndots:5\n",
    )?;
    let endpoint = format!("unix://{}", p(&dirs.containerd_socket()));
    let text = format!(
        r#"# Written by `cargo xtask cluster up`.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
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
cgroupRoot: /{pods_cgroup}
failCgroupV1: false
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
"#,
        node_ip = host::NODE_IP,
        ca = p(&pki.ca.cert),
        cert = p(&pki.kubelet.cert),
        key = p(&pki.kubelet.key),
        dns = host::DNS_SERVICE_IP,
        pods_cgroup = host::PODS_CGROUP,
        resolv = p(&resolv),
        logs = p(&dirs.data.join("pod-logs")),
    );
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
