//! The check that kpulse's reviews reach kube-apiserver at a priority level of their own
//! (deploy/base/flowcontrol.yaml): the FlowSchema is bound to an existing level (not
//! `Dangling`), and a read that makes the aggregator-api ask for a SubjectAccessReview is
//! dispatched under that schema, by kube-apiserver's own API Priority and Fairness counters.

use std::time::SystemTime;

use anyhow::{ensure, Context, Result};

use super::check::Ctx;
use crate::harness;

/// The FlowSchema and priority level deploy/ installs.
const FLOW: &str = "kpulse-reviews";

/// A user that kube-apiserver lets list PodMetrics (the bootstrap role of the HPA
/// controller grants it), so that the request reaches kpulse, which then reviews it. Not
/// `system:masters`: those are allowed without a review.
const READER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";

/// `apiserver_flowcontrol_<counter>` for kpulse's FlowSchema, from kube-apiserver's metrics.
fn counted(metrics: &harness::Metrics, counter: &str) -> f64 {
    let name = format!("apiserver_flowcontrol_{counter}");
    let schema = format!("flow_schema=\"{FLOW}\"");
    harness::sum(metrics, &name, |labels| labels.contains(&schema))
}

fn apiserver_metrics(ctx: &Ctx<'_>) -> Result<harness::Metrics> {
    let text = crate::exec::output(ctx.kubectl().args(["get", "--raw", "/metrics"]))
        .context("kube-apiserver's /metrics")?;
    Ok(harness::parse_metrics(&text))
}

pub(super) fn reviews_have_their_own_level(ctx: &Ctx<'_>) -> Result<String> {
    let schema = ctx.json(&["get", "flowschema", FLOW])?;
    let dangling = schema["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Dangling")
        .with_context(|| format!("FlowSchema {FLOW} has no Dangling condition yet"))?;
    ensure!(
        dangling["status"] == "False",
        "FlowSchema {FLOW} is dangling: {dangling}"
    );
    let before = apiserver_metrics(ctx)?;
    // A namespace no one has read, so that the replica's review cache cannot answer.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = format!("/apis/metrics.k8s.io/v1beta1/namespaces/kpulse-apf-{nanos}/pods");
    let out = crate::exec::output(ctx.kubectl().args(["get", "--raw", &path, "--as", READER]))
        .with_context(|| format!("{path} as {READER}"))?;
    ensure!(
        out.contains("PodMetricsList"),
        "{path} as {READER}: not a PodMetricsList: {out}"
    );
    let after = apiserver_metrics(ctx)?;
    let dispatched = counted(&after, "dispatched_requests_total")
        - counted(&before, "dispatched_requests_total");
    ensure!(
        dispatched >= 1.0,
        "a read as {READER} dispatched no request under FlowSchema {FLOW} \
         (kpulse's SubjectAccessReview went elsewhere, or was not made)"
    );
    let rejected =
        counted(&after, "rejected_requests_total") - counted(&before, "rejected_requests_total");
    ensure!(
        rejected == 0.0,
        "{rejected} of kpulse's reviews rejected under FlowSchema {FLOW} during the read"
    );
    Ok(format!(
        "{dispatched} review(s) dispatched under {FLOW} during a read as {READER} (its \
         SubjectAccessReview, and any other of kpulse's meanwhile), none rejected; {} \
         dispatched and {} rejected since kube-apiserver started",
        counted(&after, "dispatched_requests_total"),
        counted(&after, "rejected_requests_total"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kpulse_schema_is_counted() {
        let m = harness::parse_metrics(
            "apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"kpulse-reviews\",priority_level=\"kpulse-reviews\"} 7\n\
             apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"service-accounts\",priority_level=\"workload-low\"} 90\n\
             apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"kpulse-reviews-other\",priority_level=\"x\"} 5\n",
        );
        assert_eq!(counted(&m, "dispatched_requests_total"), 7.0);
        assert_eq!(counted(&m, "rejected_requests_total"), 0.0);
    }
}
