//! Every pinned version of `cargo xtask cluster`, in one place.
//!
//! The Go components are built from their published modules through wrapper modules that
//! [`super::gobuild`] writes from these pins; Go's minimal version selection makes each
//! build list a function of the pins alone. Debian packages (runc, iptables, conntrack,
//! buildah, debootstrap) come from the machine's Debian release.

/// One Kubernetes release and the node components paired with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// `k8s.io/kubernetes` version, without the `v`: the control plane, kubelet, kube-proxy
    /// and kubectl. Its staging modules (`k8s.io/api`, …) are replaced by `v0.<minor>.<patch>`.
    pub kubernetes: &'static str,
    /// `go.etcd.io/etcd/server/v3`: the etcd this Kubernetes release is tested with.
    pub etcd: &'static str,
    /// `github.com/containerd/containerd/v2`: a containerd release that supports this
    /// Kubernetes release (containerd's RELEASES.md).
    pub containerd: &'static str,
    /// `github.com/opencontainers/runc`: the one this containerd release tests with (its
    /// `script/setup/runc-version`). Debian 12's runc 1.1.5 cannot start containerd 2.x's
    /// pod sandboxes ("can't get final child's PID from pipe: EOF").
    pub runc: &'static str,
}

impl Release {
    /// `1.37` of `1.37.2`.
    pub fn minor(&self) -> &'static str {
        match self.kubernetes.rfind('.') {
            Some(i) => &self.kubernetes[..i],
            None => self.kubernetes,
        }
    }
}

/// The releases `cargo xtask cluster` can run: the newest served (the default, whose
/// kubectl and HPA use `metrics.k8s.io/v1`) and an older one (v1beta1 only).
pub const RELEASES: [Release; 2] = [
    Release {
        kubernetes: "1.37.2",
        etcd: "3.7.3",
        containerd: "2.4.2",
        runc: "1.5.2",
    },
    Release {
        kubernetes: "1.34.4",
        etcd: "3.6.16",
        containerd: "2.2.9",
        runc: "1.3.6",
    },
];

/// `github.com/containernetworking/plugins`: bridge, host-local, loopback.
pub const CNI_PLUGINS: &str = "1.10.0";
/// `sigs.k8s.io/cri-tools` (`crictl`): a CRI client the checks and benchmarks use, not a part
/// of the cluster. It speaks CRI v1, which every pinned containerd serves, so one build
/// serves both releases (a second one cost 65 s of a cold CI run).
pub const CRI_TOOLS: &str = "1.37.0";
/// `github.com/coredns/coredns`: the cluster's DNS.
pub const COREDNS: &str = "1.15.0";
/// `sigs.k8s.io/metrics-server`: what kpulse replaces, for the migration and comparisons.
pub const METRICS_SERVER: &str = "0.8.0";
/// `sigs.k8s.io/kwok`: the Nodes and Pods of `cluster fleet` (thousands of nodes with no
/// kubelet, their `/metrics/resource` emulated). v0.8.0 builds with Go 1.26 (`new(expr)`).
pub const KWOK: &str = "0.8.0";
/// The Debian release the local base images are made from (the kpulse images build on
/// `debian:bookworm` and run on distroless Debian 12).
pub const DEBIAN_SUITE: &str = "bookworm";
/// The tag of the pause (sandbox) image this repository builds.
pub const PAUSE_TAG: &str = "3.10";

/// The release whose Kubernetes version starts with `want` (`1.37`, `1.37.2`).
pub fn release(want: &str) -> Option<Release> {
    RELEASES.iter().copied().find(|r| {
        r.kubernetes == want
            || r.kubernetes
                .strip_prefix(want)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_by_minor_or_full_version() {
        assert_eq!(release("1.37").map(|r| r.kubernetes), Some("1.37.2"));
        assert_eq!(release("1.37.2").map(|r| r.kubernetes), Some("1.37.2"));
        assert_eq!(release("1.34").map(|r| r.minor()), Some("1.34"));
        assert_eq!(release("1.3"), None);
        assert_eq!(release("1.36"), None);
    }
}
