//! Which nodes should be reporting: the nodes that run a Ready agent pod, from a watch of the
//! agent DaemonSet's pods (`--agent-namespace`, `--agent-selector`; `get, list, watch` on
//! pods is already granted). Readiness compares this with what the store holds
//! ([`crate::health::Completeness`]), so that a replica joins the Service only once it has
//! (nearly) the whole cluster, not as soon as one node has reported.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::RwLock;

use crate::nodes::{map_event, next, Change, Relist};

/// Agent pods by name → the node each runs on, if the pod is Ready there.
#[derive(Debug, Default)]
pub struct AgentPods {
    pods: RwLock<BTreeMap<String, Option<String>>>,
    listed: AtomicBool,
    refused: AtomicBool,
}

impl AgentPods {
    /// Empty, not listed.
    pub fn new() -> Arc<AgentPods> {
        Arc::new(AgentPods::default())
    }

    /// Whether a complete list has been seen.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Whether the API refused the list for good (see [`crate::nodes::refused`]) and none
    /// has come since.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    /// Records whether the last list attempt was refused for good.
    pub fn set_refused(&self, refused: bool) {
        self.refused.store(refused, Ordering::Release);
    }

    /// Applies one change (value: the node of a Ready pod, `None` for a pod not Ready).
    pub fn apply(&self, change: Change<Option<String>>) {
        match change {
            Change::Upsert { name, value } => {
                self.pods.write().insert(name, value);
            }
            Change::Delete { name } => {
                self.pods.write().remove(&name);
            }
            Change::Replace(all) => {
                *self.pods.write() = all;
                self.listed.store(true, Ordering::Release);
            }
        }
    }

    /// The nodes that run a Ready agent.
    pub fn nodes(&self) -> BTreeSet<String> {
        self.pods.read().values().flatten().cloned().collect()
    }
}

/// The node a pod is Ready on: `spec.nodeName` when the pod's `Ready` condition is `True`.
pub fn ready_node(pod: &Pod) -> Option<String> {
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

/// Watches the agent pods (with the watcher's default backoff) and keeps `agents` current.
/// Never returns. API errors are logged at WARN and retried.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    selector: String,
    agents: Arc<AgentPods>,
) {
    let api = kube::Api::<Pod>::namespaced(client, &namespace);
    let stream = watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relist = Relist::default();
    let mut failing = false;
    while let Some(event) = next(stream.as_mut()).await {
        let event = match event {
            Ok(e) => e,
            Err(error) => {
                if !failing {
                    tracing::warn!(
                        %error,
                        %namespace,
                        %selector,
                        "cannot watch the agent pods (needs list, watch on pods); readiness \
                         waits for them; retrying"
                    );
                }
                if !agents.listed() {
                    agents.set_refused(crate::nodes::refused(&error));
                }
                failing = true;
                continue;
            }
        };
        failing = false;
        agents.set_refused(false);
        let event = map_event(event, |p: Pod| {
            (p.metadata.name.clone().unwrap_or_default(), ready_node(&p))
        });
        if let Some(change) = relist.on(event) {
            if let Change::Replace(all) = &change {
                if !agents.listed() {
                    tracing::info!(
                        pods = all.len(),
                        ready = all.values().flatten().count(),
                        "agent pods listed"
                    );
                }
            }
            agents.apply(change);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(agents.nodes(), BTreeSet::from(["n1".to_string()]));
        agents.apply(Change::Upsert {
            name: "a2".into(),
            value: Some("n2".into()),
        });
        agents.apply(Change::Delete { name: "a1".into() });
        assert_eq!(agents.nodes(), BTreeSet::from(["n2".to_string()]));
    }
}
