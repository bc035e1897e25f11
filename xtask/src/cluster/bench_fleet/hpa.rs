//! The HPA phase of `cluster bench-fleet`: a HorizontalPodAutoscaler in every fleet
//! namespace reading its pods' CPU from kpulse, as the hundreds of HPAs of a big cluster
//! do, and kube-controller-manager's own time for them.
//!
//! An HPA scales something with the scale subresource and a selector; the fleet's pods
//! belong to no controller, so each namespace gets a `FleetGroup` (a custom resource of this
//! benchmark's, [`crd`]) whose scale selects the namespace's fleet pods and whose replicas
//! are their number. Each HPA holds its `FleetGroup` at that number (min = max): every sync
//! reads the namespace's PodMetrics through kube-apiserver and computes a proposal, as any
//! HPA does, but never rescales (nothing would act on it).
//!
//! Measured over `--window-secs`, once every HPA has a current metric and one more sync
//! period has passed: the controller's reconciliations
//! (`horizontal_pod_autoscaler_controller_reconciliations_total`, by outcome), their
//! duration and the metric computation's, how long an HPA waits in the controller's queue
//! (`workqueue_queue_duration_seconds`: whether the controller keeps up), how long its
//! requests wait in its own client-side rate limiter (`--kube-api-qps`), and
//! kube-apiserver's CPU. At the end every HPA is checked again: one without a current
//! metric is counted, and reported.
//!
//! The HPAs and the custom resources are removed at the end, also after a failure.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use k8s_openapi::{
    api::autoscaling::v2::HorizontalPodAutoscaler,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    api::{
        Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    },
    Client,
};
use serde_json::json;

use super::{agents::Agents, fleet, Bench};
use crate::harness::{self, Metrics};

/// The custom resource's group, kind and plural.
const GROUP: &str = "kpulse.local";
const KIND: &str = "FleetGroup";
const PLURAL: &str = "fleetgroups";
/// The name of each namespace's `FleetGroup` and HPA.
const NAME: &str = "fleet";
/// kube-controller-manager's secure port (`/metrics` for an authorized client).
const CONTROLLER_MANAGER_PORT: u16 = 10257;
/// kube-controller-manager's default `--horizontal-pod-autoscaler-sync-period`.
const SYNC_PERIOD: Duration = Duration::from_secs(15);
/// Longest wait for every HPA to have a metric (kube-controller-manager learns a new
/// kind's scale from discovery, which it refreshes every 30 s).
const ACTIVE_LIMIT: Duration = Duration::from_secs(300);
/// Requests in flight while the HPAs are made or removed.
const CONCURRENCY: usize = 16;
/// The HPA controller's queue, in the workqueue metrics' `name` label.
const QUEUE: &str = "name=\"horizontalpodautoscaler\"";
const RECONCILIATIONS: &str = "horizontal_pod_autoscaler_controller_reconciliations_total";
const RECONCILIATION_SECONDS: &str =
    "horizontal_pod_autoscaler_controller_reconciliation_duration_seconds";
const COMPUTATION_SECONDS: &str =
    "horizontal_pod_autoscaler_controller_metric_computation_duration_seconds";

/// What the phase measured.
#[derive(Debug)]
pub(super) struct Phase {
    hpas: usize,
    /// From the start of the phase (the kind made, then the HPAs) to every HPA with a
    /// current metric.
    to_active: f64,
    window: f64,
    reconciliations: f64,
    /// Reconciliations that ended in an error (label `error` other than `none`).
    errors: f64,
    reconciliation_p50: Option<f64>,
    reconciliation_p99: Option<f64>,
    computation_p50: Option<f64>,
    computation_p99: Option<f64>,
    /// The mean wait in the controller's queue (its histogram tops out at 10 s, which a
    /// controller that falls behind passes).
    queue_mean: Option<f64>,
    /// The mean wait of kube-controller-manager's requests in its own client-side rate
    /// limiter (`--kube-api-qps`), every controller's.
    throttled_mean: Option<f64>,
    apiserver_cores: f64,
    /// HPAs with a current metric at the end of the window.
    active_at_end: usize,
}

/// Removes what a killed run may have left, makes the HPAs, measures them, removes them.
/// The outer error ends the run (the HPAs could not be removed); the inner one is the
/// phase's own failure (a stop signal during it too), which the report gives in its place.
pub(super) fn run(bench: &Bench<'_>, agents: &mut Agents) -> Result<Result<Phase>> {
    let rt = fleet::runtime()?;
    let client = rt.block_on(fleet::client(&bench.ctx.dirs.kubeconfig()))?;
    let shape = &bench.opts.shape;
    rt.block_on(remove(&client, shape))
        .context("removing the HPAs a previous run left")?;
    let measured = measure(bench, agents, &rt, &client);
    if let Ok(phase) = &measured {
        print!("bench-fleet: {}", phase.report());
    }
    rt.block_on(remove(&client, shape))
        .context("removing the HPAs")?;
    bench.stop.check()?;
    Ok(measured)
}

fn measure(
    bench: &Bench<'_>,
    agents: &mut Agents,
    rt: &tokio::runtime::Runtime,
    client: &Client,
) -> Result<Phase> {
    let started = Instant::now();
    let hpas = rt.block_on(create(client, &bench.opts.shape))?;
    ensure!(hpas > 0, "no fleet namespace has a pod to scale");
    loop {
        bench.stop.check()?;
        agents.check_running()?;
        let (active, problem) = rt.block_on(active(client))?;
        if active >= hpas {
            break;
        }
        ensure!(
            started.elapsed() < ACTIVE_LIMIT,
            "{active} of {hpas} HPAs with a current metric {ACTIVE_LIMIT:?} after they were \
             made; one of the others: {}",
            problem.unwrap_or_default()
        );
        bench.stop.sleep(Duration::from_secs(2))?;
    }
    let to_active = started.elapsed().as_secs_f64();
    bench.stop.sleep(SYNC_PERIOD)?;
    let (a, a_cpu, a_at) = sample(bench)?;
    bench
        .stop
        .sleep(Duration::from_secs(bench.opts.window_secs))?;
    agents.check_running()?;
    let (b, b_cpu, b_at) = sample(bench)?;
    let (active_at_end, _) = rt.block_on(active(client))?;
    let window = b_at.duration_since(a_at).as_secs_f64();
    let reconciliations =
        harness::sum(&b, RECONCILIATIONS, |_| true) - harness::sum(&a, RECONCILIATIONS, |_| true);
    let failed = |m: &Metrics| harness::sum(m, RECONCILIATIONS, |l| !l.contains("error=\"none\""));
    Ok(Phase {
        hpas,
        to_active,
        window,
        reconciliations,
        errors: failed(&b) - failed(&a),
        reconciliation_p50: harness::quantile(&a, &b, RECONCILIATION_SECONDS, "", 0.5),
        reconciliation_p99: harness::quantile(&a, &b, RECONCILIATION_SECONDS, "", 0.99),
        computation_p50: harness::quantile(&a, &b, COMPUTATION_SECONDS, "", 0.5),
        computation_p99: harness::quantile(&a, &b, COMPUTATION_SECONDS, "", 0.99),
        queue_mean: mean(&a, &b, "workqueue_queue_duration_seconds", QUEUE),
        throttled_mean: mean(&a, &b, "rest_client_rate_limiter_duration_seconds", ""),
        apiserver_cores: (b_cpu - a_cpu) / window,
        active_at_end,
    })
}

/// kube-controller-manager's metrics (as the admin), kube-apiserver's CPU seconds, and when.
fn sample(bench: &Bench<'_>) -> Result<(Metrics, f64, Instant)> {
    let pki = &bench.ctx.dirs.pki;
    let admin = (pki.join("admin.crt"), pki.join("admin.key"));
    let metrics = harness::scrape(CONTROLLER_MANAGER_PORT, Some(&admin))
        .context("kube-controller-manager's /metrics")?;
    ensure!(
        metrics.keys().any(|k| k.starts_with(RECONCILIATIONS)),
        "kube-controller-manager's /metrics has no {RECONCILIATIONS}"
    );
    let cpu = harness::cpu_seconds(bench.pid("kube-apiserver")?)?;
    Ok((metrics, cpu, Instant::now()))
}

impl Phase {
    pub(super) fn report(&self) -> String {
        let ms = |s: Option<f64>| s.map_or("n/a".to_owned(), |s| format!("{:.0}", s * 1e3));
        let per_sec = self.reconciliations / self.window;
        let per_minute = per_sec / self.hpas as f64 * 60.0;
        format!(
            "\nAn HPA in each fleet namespace ({} HPAs), each reading the CPU of its \
             namespace's fleet pods from kpulse (target AverageValue, min = max: it computes \
             but never rescales); kube-controller-manager over {:.0} s, one sync period after \
             every HPA had a current metric (its own `/metrics`, as the admin; its default \
             15 s sync is 4 reconciliations a minute an HPA when it keeps up; the metric \
             computation is the part that reads kpulse; the controller's requests wait in \
             its client-side rate limiter, `--kube-api-qps`, 20 a second by default):\n\n\
             | HPAs | made → each with a metric (s) | reconciliations a second (a minute an \
             HPA) | errors | reconciliation p50 / p99 (ms) | metric computation p50 / p99 \
             (ms) | wait in the queue, mean (ms) | wait in the client's rate limiter, mean (ms) | \
             kube-apiserver (mCPU) | with a metric at the end |\n\
             |---|---|---|---|---|---|---|---|---|---|\n\
             | {} | {:.0} | {per_sec:.1} ({per_minute:.1}) | {:.0} | {} / {} | {} / {} | {} | \
             {} | {:.0} | {} of {} |\n",
            self.hpas,
            self.window,
            self.hpas,
            self.to_active,
            self.errors,
            ms(self.reconciliation_p50),
            ms(self.reconciliation_p99),
            ms(self.computation_p50),
            ms(self.computation_p99),
            ms(self.queue_mean),
            ms(self.throttled_mean),
            self.apiserver_cores * 1e3,
            self.active_at_end,
            self.hpas,
        )
    }
}

/// The mean of histogram `name` (series whose labels contain `labels`) over the window
/// from `a` to `b`: none if nothing was observed.
fn mean(a: &Metrics, b: &Metrics, name: &str, labels: &str) -> Option<f64> {
    let delta = |suffix: &str| {
        let series = format!("{name}_{suffix}");
        harness::sum(b, &series, |l| l.contains(labels))
            - harness::sum(a, &series, |l| l.contains(labels))
    };
    let count = delta("count");
    (count > 0.0).then(|| delta("sum") / count)
}

/// The fleet pods of namespace `j`: pod k of node i is in namespace (i × pods + k) mod
/// namespaces.
fn pods_in(shape: &fleet::Shape, j: usize) -> usize {
    let total = shape.nodes * shape.pods;
    total / shape.namespaces + usize::from(j < total % shape.namespaces)
}

fn resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: "v1".to_owned(),
        api_version: format!("{GROUP}/v1"),
        kind: KIND.to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// The `FleetGroup` kind: replicas, and a selector in its status, behind the scale
/// subresource.
fn crd() -> Result<CustomResourceDefinition> {
    let int = json!({"type": "integer", "format": "int32", "minimum": 0});
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{PLURAL}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": "fleetgroup", "listKind": "FleetGroupList"},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"replicas": int}},
                    "status": {"type": "object", "properties": {
                        "replicas": int,
                        "selector": {"type": "string"},
                    }},
                }}},
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
            }],
        },
    }))
    .context("the FleetGroup CustomResourceDefinition")
}

/// Namespace `ns`'s HPA: its `FleetGroup` held at `pods`, on its pods' CPU.
fn hpa(ns: &str, pods: usize) -> Result<HorizontalPodAutoscaler> {
    serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": NAME, "namespace": ns, "labels": {(fleet::POD_LABEL.0): fleet::POD_LABEL.1}},
        "spec": {
            "scaleTargetRef": {"apiVersion": format!("{GROUP}/v1"), "kind": KIND, "name": NAME},
            "minReplicas": pods,
            "maxReplicas": pods,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu",
                "target": {"type": "AverageValue", "averageValue": "1"},
            }}],
        },
    }))
    .context("a fleet HPA")
}

/// Makes the kind, then a `FleetGroup` and an HPA in each fleet namespace with pods;
/// returns the number of HPAs.
async fn create(client: &Client, shape: &fleet::Shape) -> Result<usize> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crd()?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    fleet::created(crds.create(&PostParams::default(), &crd).await)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let established = crds.get_opt(&name).await?.is_some_and(|c| {
            c.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{name} not Established after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let groups: Vec<(String, usize)> = (0..shape.namespaces)
        .map(|j| (fleet::namespace(j), pods_in(shape, j)))
        .filter(|(_, pods)| *pods > 0)
        .collect();
    let selector = format!("{}={}", fleet::POD_LABEL.0, fleet::POD_LABEL.1);
    let ar = resource();
    stream::iter(groups)
        .map(|(ns, pods)| {
            let (client, ar, selector) = (client.clone(), &ar, &selector);
            async move {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, ar);
                let group = DynamicObject::new(NAME, ar)
                    .within(&ns)
                    .data(json!({"spec": {"replicas": pods}}));
                fleet::created(api.create(&PostParams::default(), &group).await)?;
                let status = json!({"status": {"replicas": pods, "selector": selector}});
                api.patch_status(NAME, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("{ns}'s FleetGroup status"))?;
                let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client, &ns);
                fleet::created(hpas.create(&PostParams::default(), &hpa(&ns, pods)?).await)?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_fold(0, |n, ()| async move { Ok(n + 1) })
        .await
}

/// The fleet's HPAs with a current metric (`ScalingActive` True and a current value), and
/// what one of the others says.
async fn active(client: &Client) -> Result<(usize, Option<String>)> {
    let api: Api<HorizontalPodAutoscaler> = Api::all(client.clone());
    let params =
        ListParams::default().labels(&format!("{}={}", fleet::POD_LABEL.0, fleet::POD_LABEL.1));
    let mut active = 0;
    let mut problem = None;
    for h in api.list(&params).await?.items {
        let status = h.status.unwrap_or_default();
        let scaling_active = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "ScalingActive");
        let has_value = status.current_metrics.iter().flatten().any(|m| {
            m.resource
                .as_ref()
                .is_some_and(|r| r.current.average_value.is_some())
        });
        if scaling_active.is_some_and(|c| c.status == "True") && has_value {
            active += 1;
        } else if problem.is_none() {
            problem = Some(format!(
                "{}: {}",
                h.metadata.namespace.unwrap_or_default(),
                scaling_active
                    .map(|c| format!(
                        "{} {}",
                        c.reason.clone().unwrap_or_default(),
                        c.message.clone().unwrap_or_default()
                    ))
                    .unwrap_or_else(|| "no ScalingActive condition yet".to_owned())
            ));
        }
    }
    Ok((active, problem))
}

/// Deletes the HPAs, then the kind (and with it every `FleetGroup`), and waits for it to go.
async fn remove(client: &Client, shape: &fleet::Shape) -> Result<()> {
    stream::iter(0..shape.namespaces)
        .map(|j| {
            let client = client.clone();
            async move {
                let api: Api<HorizontalPodAutoscaler> =
                    Api::namespaced(client, &fleet::namespace(j));
                fleet::ignore_gone(api.delete(NAME, &DeleteParams::default()).await)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = format!("{PLURAL}.{GROUP}");
    fleet::ignore_gone(crds.delete(&name, &DeleteParams::default()).await)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while crds.get_opt(&name).await?.is_some() {
        ensure!(
            Instant::now() < deadline,
            "{name} still there 120 s after its deletion"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(nodes: usize, pods: usize, namespaces: usize) -> fleet::Shape {
        fleet::Shape {
            nodes,
            pods,
            containers: 1,
            namespaces,
            seed: 1,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn each_namespace_scales_exactly_its_own_fleet_pods() {
        // 7 nodes × 3 pods over 4 namespaces: pods 0..21, pod t in namespace t mod 4.
        let s = shape(7, 3, 4);
        let counts: Vec<usize> = (0..4).map(|j| pods_in(&s, j)).collect();
        assert_eq!(counts, vec![6, 5, 5, 5]);
        let mut by_hand = [0; 4];
        for i in 0..7 {
            for k in 0..3 {
                by_hand[(i * 3 + k) % 4] += 1;
            }
        }
        assert_eq!(counts, by_hand);
        // More namespaces than pods: the rest have none (and get no HPA).
        assert_eq!(pods_in(&shape(1, 2, 5), 4), 0);
    }

    #[test]
    fn a_mean_is_the_windows_sum_over_its_count() {
        let m = |sum: f64, count: f64| -> Metrics {
            [
                (format!("q_sum{{{QUEUE}}}"), sum),
                (format!("q_count{{{QUEUE}}}"), count),
                ("q_sum{name=\"other\"}".to_owned(), 100.0),
                ("q_count{name=\"other\"}".to_owned(), 1.0),
            ]
            .into_iter()
            .collect()
        };
        assert_eq!(mean(&m(1.0, 10.0), &m(4.0, 16.0), "q", QUEUE), Some(0.5));
        assert_eq!(mean(&m(1.0, 10.0), &m(1.0, 10.0), "q", QUEUE), None);
    }

    #[test]
    fn the_kind_has_the_scale_an_hpa_needs() -> Result<()> {
        let crd = crd()?;
        let scale = crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .context("a scale subresource")?;
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let h = hpa("fleet-001", 12)?;
        let spec = h.spec.context("a spec")?;
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(12), 12));
        assert_eq!(spec.scale_target_ref.kind, crd.spec.names.kind);
        Ok(())
    }
}
