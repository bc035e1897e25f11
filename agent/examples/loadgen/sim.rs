//! What the simulated cluster looks like: node and pod names, namespaces, labels and every
//! container's CPU rate. The agents ([`super::Node`]) send it and the reader
//! ([`super::read`]) expects exactly it, so both take it from here.

/// The shape of the simulated cluster.
#[derive(Clone, Debug)]
pub struct Sim {
    /// Node names are `<prefix><index>`.
    pub prefix: String,
    /// Nodes.
    pub nodes: usize,
    /// Pods per node.
    pub pods: usize,
    /// Containers per pod.
    pub containers: usize,
}

/// Namespaces the pods are spread over (`ns-0` … `ns-9`).
pub const NAMESPACES: usize = 10;
/// Values of the `app` label (`app-0` … `app-6`).
pub const APPS: usize = 7;
/// Every container's working set.
pub const CONTAINER_MEMORY: u64 = 64 << 20;
/// Every node's working set.
pub const NODE_MEMORY: u64 = 8 << 30;
/// Every node's CPU rate, in nanocores: its counter is the time since it started.
pub const NODE_NANOCORES: u64 = 1_000_000_000;

impl Sim {
    /// The name of node `i`.
    pub fn node(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// The name (and uid) of pod `p` of node `node`.
    pub fn pod_name(node: &str, p: usize) -> String {
        format!("{node}-pod-{p}")
    }

    /// The namespace of pod `p` (of any node).
    pub fn namespace(p: usize) -> String {
        format!("ns-{}", p % NAMESPACES)
    }

    /// The `app` label of pod `p` (of any node).
    pub fn app(p: usize) -> String {
        format!("app-{}", p % APPS)
    }

    /// The name of container `c`.
    pub fn container(c: usize) -> String {
        format!("c{c}")
    }

    /// The CPU rate of container `c` of pod `p`, in nanocores (10m to 500m).
    pub fn rate(p: usize, c: usize) -> u64 {
        10_000_000 * (1 + ((p * 7 + c * 13) % 50) as u64)
    }

    /// `(node index, pod index)` of a pod name this simulation made.
    pub fn parse_pod(&self, name: &str) -> Option<(usize, usize)> {
        let rest = name.strip_prefix(&self.prefix)?;
        let (node, pod) = rest.split_once("-pod-")?;
        let (node, pod): (usize, usize) = (node.parse().ok()?, pod.parse().ok()?);
        (node < self.nodes && pod < self.pods && Sim::pod_name(&self.node(node), pod) == name)
            .then_some((node, pod))
    }

    /// The node index of a node name this simulation made.
    pub fn parse_node(&self, name: &str) -> Option<usize> {
        let i: usize = name.strip_prefix(&self.prefix)?.parse().ok()?;
        (i < self.nodes && self.node(i) == name).then_some(i)
    }

    /// How many pods the cluster has.
    pub fn all_pods(&self) -> usize {
        self.nodes * self.pods
    }

    /// How many pods `labelSelector=app=<app>` in namespace `ns-<ns>` lists.
    pub fn selected(&self, ns: usize, app: usize) -> usize {
        self.nodes
            * (0..self.pods)
                .filter(|p| p % NAMESPACES == ns && p % APPS == app)
                .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let sim = Sim {
            prefix: "sim-".into(),
            nodes: 12,
            pods: 30,
            containers: 2,
        };
        assert_eq!(sim.parse_pod("sim-11-pod-29"), Some((11, 29)));
        assert_eq!(sim.parse_pod("sim-12-pod-0"), None);
        assert_eq!(sim.parse_pod("sim-01-pod-0"), None);
        assert_eq!(sim.parse_node("sim-3"), Some(3));
        assert_eq!(sim.parse_node("sim-03"), None);
        assert_eq!(sim.selected(3, 3), 12);
    }
}
