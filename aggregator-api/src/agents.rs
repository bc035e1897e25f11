//! Which nodes should be reporting: the nodes that run a Ready agent pod, from a watch of the
//! agent DaemonSet's pods (`--agent-namespace`, `--agent-selector`; `get, list, watch` on
//! pods is already granted). Readiness compares this with what the store holds
//! ([`crate::health::Completeness`]), so that a replica joins the Service only once it has
//! (nearly) the whole cluster, not as soon as one node has reported.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};

use crate::watched::{follow_into, Mirror, Narration};

/// Agent pods by name → the node each runs on, if the pod is Ready there.
pub type AgentPods = Mirror<Option<String>>;

impl AgentPods {
    /// The nodes that run a Ready agent.
    pub fn ready_nodes(&self) -> BTreeSet<String> {
        self.collect::<_, Vec<_>>(|(_, node)| node.clone())
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The node a pod is Ready on: `spec.nodeName` when the pod's `Ready` condition is `True`
/// and it is not being deleted (a pod being deleted is about to stop streaming; its node
/// falls back to the kubelet at once rather than when its data expires).
pub fn ready_node(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return None;
    }
    pod.spec.as_ref()?.node_name.clone()
}

/// Watches the agent pods (with [`crate::watched::backoff`]) and keeps `agents` current.
/// Never returns. API errors are logged at WARN and retried.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    selector: String,
    agents: Arc<AgentPods>,
) {
    let api = kube::Api::<Pod>::namespaced(client, &namespace);
    let stream = watcher(api, watcher::Config::default().labels(&selector))
        .backoff(crate::watched::backoff());
    let say = Narration {
        what: "agent pods",
        failing: &|error| {
            tracing::warn!(
                %error,
                %namespace,
                %selector,
                "cannot watch the agent pods (needs list, watch on pods); readiness \
                 waits for them; retrying"
            );
        },
        listed: &|all| {
            tracing::info!(
                pods = all.len(),
                ready = all.values().flatten().count(),
                "agent pods listed"
            );
        },
    };
    let kept = |p: Pod| (p.metadata.name.clone().unwrap_or_default(), ready_node(&p));
    follow_into(stream, &agents, kept, say).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watched::Change;
    use std::collections::BTreeMap;

    fn pod(node: Option<&str>, ready: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kpulse-agent-x"},
            "spec": {"containers": [], "nodeName": node},
            "status": {"conditions": ready.map(|r| vec![
                serde_json::json!({"type": "PodScheduled", "status": "True"}),
                serde_json::json!({"type": "Ready", "status": r}),
            ])},
        }))
        .expect("pod")
    }

    #[test]
    fn only_ready_pods_count() {
        assert_eq!(
            ready_node(&pod(Some("n1"), Some("True"))).as_deref(),
            Some("n1")
        );
        assert_eq!(ready_node(&pod(Some("n1"), Some("False"))), None);
        assert_eq!(ready_node(&pod(Some("n1"), None)), None);
        assert_eq!(ready_node(&pod(None, Some("True"))), None, "not scheduled");
    }

    #[test]
    fn nodes_of_ready_agents() {
        let agents = AgentPods::new();
        assert!(!agents.listed());
        agents.apply(Change::Replace(BTreeMap::from([
            ("a1".to_string(), Some("n1".to_string())),
            ("a2".to_string(), None),
        ])));
        assert!(agents.listed());
        assert_eq!(agents.ready_nodes(), BTreeSet::from(["n1".to_string()]));
        agents.apply(Change::Upsert {
            name: "a2".into(),
            value: Some("n2".into()),
        });
        agents.apply(Change::Delete { name: "a1".into() });
        assert_eq!(agents.ready_nodes(), BTreeSet::from(["n2".to_string()]));
    }
}
