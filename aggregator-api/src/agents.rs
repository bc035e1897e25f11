//! The agent pods, from a watch of the agent DaemonSet's pods (`--agent-namespace`,
//! `--agent-selector`; `get, list, watch` on pods is already granted), for two things:
//!
//! - which nodes should be reporting: the nodes that run a Ready agent pod. Readiness
//!   compares this with what the store holds ([`crate::health::Completeness`]), so that a
//!   replica joins the Service only once it has (nearly) the whole cluster, not as soon as
//!   one node has reported;
//! - which pods an agent's token may belong to: a token verified locally
//!   ([`crate::auth::issuer`]) must be bound to one of these pods, by name and uid, on the
//!   node the pod runs on.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};

use crate::watched::{follow_into, Mirror, Narration};

/// What the server keeps of an agent pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentPod {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`, once scheduled.
    pub node: Option<String>,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

impl AgentPod {
    /// The node this pod is Ready on: `spec.nodeName` when the pod is Ready and not being
    /// deleted (a pod being deleted is about to stop streaming; its node falls back to the
    /// kubelet at once rather than when its data expires).
    pub fn ready_node(&self) -> Option<&str> {
        (self.ready && !self.deleting)
            .then_some(self.node.as_deref())
            .flatten()
    }

    /// A Ready pod on `node` (tests).
    #[cfg(test)]
    pub(crate) fn ready_on(node: Option<&str>) -> AgentPod {
        AgentPod {
            uid: "uid".into(),
            node: node.map(str::to_string),
            service_account: "kpulse-agent".into(),
            ready: node.is_some(),
            deleting: false,
        }
    }
}

impl From<&Pod> for AgentPod {
    fn from(pod: &Pod) -> AgentPod {
        let spec = pod.spec.as_ref();
        AgentPod {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            ready: pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            deleting: pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// Agent pods by name (in `--agent-namespace`).
pub type AgentPods = Mirror<AgentPod>;

impl AgentPods {
    /// The nodes that run a Ready agent.
    pub fn ready_nodes(&self) -> BTreeSet<String> {
        self.collect::<_, Vec<_>>(|(_, pod)| pod.ready_node().map(str::to_string))
            .into_iter()
            .flatten()
            .collect()
    }
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
                ready = all
                    .values()
                    .filter(|p: &&AgentPod| p.ready_node().is_some())
                    .count(),
                "agent pods listed"
            );
        },
    };
    let kept = |p: Pod| {
        (
            p.metadata.name.clone().unwrap_or_default(),
            AgentPod::from(&p),
        )
    };
    follow_into(stream, &agents, kept, say).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watched::Change;
    use std::collections::BTreeMap;

    fn pod(node: Option<&str>, ready: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kpulse-agent-x", "uid": "u-1"},
            "spec": {"containers": [], "nodeName": node, "serviceAccountName": "kpulse-agent"},
            "status": {"conditions": ready.map(|r| vec![
                serde_json::json!({"type": "PodScheduled", "status": "True"}),
                serde_json::json!({"type": "Ready", "status": r}),
            ])},
        }))
        .expect("pod")
    }

    fn ready_node(pod: &Pod) -> Option<String> {
        AgentPod::from(pod).ready_node().map(str::to_string)
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
        let mut deleting = pod(Some("n1"), Some("True"));
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert_eq!(ready_node(&deleting), None, "being deleted");
        let kept = AgentPod::from(&deleting);
        assert_eq!(
            (
                kept.uid.as_str(),
                kept.node.as_deref(),
                kept.service_account.as_str()
            ),
            ("u-1", Some("n1"), "kpulse-agent")
        );
        assert!(kept.deleting && kept.ready);
    }

    #[test]
    fn nodes_of_ready_agents() {
        let agents = AgentPods::new();
        assert!(!agents.listed());
        agents.apply(Change::Replace(BTreeMap::from([
            ("a1".to_string(), AgentPod::ready_on(Some("n1"))),
            ("a2".to_string(), AgentPod::ready_on(None)),
        ])));
        assert!(agents.listed());
        assert_eq!(agents.ready_nodes(), BTreeSet::from(["n1".to_string()]));
        agents.apply(Change::Upsert {
            name: "a2".into(),
            value: AgentPod::ready_on(Some("n2")),
        });
        agents.apply(Change::Delete { name: "a1".into() });
        assert_eq!(agents.ready_nodes(), BTreeSet::from(["n2".to_string()]));
    }
}
