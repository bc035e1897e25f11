//! The check that each aggregator-api replica verifies an agent's token itself
//! (`--agent-token-verification=local`, aggregator-api/src/auth/issuer.rs), without a
//! TokenReview: a token of the agents' ServiceAccount bound to a running agent pod is
//! presented to every replica's ingest port with a Hello for another node. The replica must
//! refuse it with 403 naming the pod's node (so it authenticated the token and knew the
//! node it is bound to), and its `kpulse_aggregator_ingest_local_token_checks_total
//! {outcome="accepted"}` must have grown: the token passed the local checks, so no review
//! was asked for. The stream never starts, so the agent's own session is left alone.

use std::os::unix::fs::PermissionsExt as _;

use anyhow::{ensure, Context, Result};
use kpulse_wire::stream::{self, AgentMessage, Hello, STREAM_PATH, VERSION, VERSION_HEADER};

use super::check::{self, Ctx};
use crate::harness;

/// The node the Hello names: none of the cluster's, so the stream is refused whatever the
/// token (`.invalid` cannot be a node of any cluster).
const OTHER_NODE: &str = "kpulse-token-check.invalid";

/// Probes of one replica at most (see the loop).
const PROBES: u32 = 3;

/// The aggregator-api's `--ingest-port` in deploy/.
const INGEST_PORT: u16 = 8444;

/// The local token checks a replica's metrics count: (accepted, left to a review).
fn checks(metrics_text: &str) -> (f64, f64) {
    let m = harness::parse_metrics(metrics_text);
    let name = "kpulse_aggregator_ingest_local_token_checks_total";
    let accepted = |labels: &str| labels.contains("outcome=\"accepted\"");
    (
        harness::sum(&m, name, accepted),
        harness::sum(&m, name, |l| !accepted(l)),
    )
}

/// A running agent pod (not being deleted) and its node.
fn agent_pod(ctx: &Ctx<'_>) -> Result<(String, String)> {
    check::kpulse_pods(ctx, super::fallback::AGENTS, Some("status.phase=Running"))?
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .find_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["spec"]["nodeName"].as_str()?.to_string(),
            ))
        })
        .context("no running agent pod")
}

pub(super) fn agent_tokens_verified_locally(ctx: &Ctx<'_>) -> Result<String> {
    let (pod, node) = agent_pod(ctx)?;
    let token = crate::exec::output(ctx.kubectl().args([
        "create",
        "token",
        "kpulse-agent",
        "-n",
        "kpulse-system",
        "--audience",
        "kpulse",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &pod,
        "--duration",
        "10m",
    ]))
    .with_context(|| format!("a token bound to the agent pod {pod}"))?;
    // The token in a header file (mode 0600), not on a command line.
    let headers = ctx.dirs.etc.join("check-agent-token.headers");
    std::fs::write(
        &headers,
        format!(
            "Authorization: Bearer {}\n{VERSION_HEADER}: {VERSION}\nContent-Type: {}\n",
            token.trim(),
            stream::CONTENT_TYPE
        ),
    )?;
    std::fs::set_permissions(&headers, std::fs::Permissions::from_mode(0o600))?;
    let hello = ctx.dirs.etc.join("check-agent-hello.frame");
    std::fs::write(
        &hello,
        stream::encode(&AgentMessage::Hello(Hello {
            version: VERSION,
            node_name: OTHER_NODE.into(),
            node_labels: Default::default(),
            agent: "cargo xtask cluster check".into(),
        }))?,
    )?;
    let admin = check::admin_identity(ctx)?;
    let host = check::SERVER_HOST;
    let mut replicas = 0;
    for pid in check::replica_pids(ctx)? {
        // A deferral of someone else's token at the same moment (an agent reconnecting)
        // makes a probe undecidable: tried again, at most PROBES times.
        let mut tries = 0;
        loop {
            tries += 1;
            let before = checks(&check::get_from_replica(&admin, &pid, "/metrics")?);
            let answer = crate::exec::output(
                check::curl_in(&pid)?
                    .args(["-X", "POST", "-w", "\n%{http_code}", "-H"])
                    .arg(format!("@{}", headers.display()))
                    .arg("--data-binary")
                    .arg(format!("@{}", hello.display()))
                    .args([
                        "--resolve",
                        &format!("{host}:{INGEST_PORT}:127.0.0.1"),
                        &format!("https://{host}:{INGEST_PORT}{STREAM_PATH}"),
                    ]),
            )?;
            let after = checks(&check::get_from_replica(&admin, &pid, "/metrics")?);
            let (body, status) = answer.trim_end().rsplit_once('\n').unwrap_or(("", &answer));
            // The refusal's body is the wire's Error message, in JSON.
            let message = serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            ensure!(
                status.trim() == "403" && message.contains(&format!("bound to node {node:?}")),
                "replica (pid {pid}): a token bound to {pod} on {node}, with a Hello for \
                 {OTHER_NODE}: HTTP {status} {body} (want 403 naming {node})"
            );
            // Accepted once more, and nothing left to a review meanwhile (another token
            // accepted at the same moment cannot stand in for a deferred probe).
            if after.0 > before.0 && after.1 == before.1 {
                break;
            }
            ensure!(
                after.1 > before.1 && tries < PROBES,
                "replica (pid {pid}) authenticated the token, but not by its own checks: \
                 local token checks accepted {} → {}, left to a TokenReview {} → {}, at try \
                 {tries} (see the replica's log and \
                 kpulse_aggregator_ingest_local_token_checks_total{{outcome}})",
                before.0,
                after.0,
                before.1,
                after.1
            );
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        replicas += 1;
    }
    Ok(format!(
        "{replicas} replica(s) each verified a token bound to {pod} without a TokenReview \
         (accepted locally, bound to {node}) and refused its Hello for another node with 403"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_and_deferred_apart() {
        let text = "kpulse_aggregator_ingest_local_token_checks_total{outcome=\"accepted\"} 3\n\
                    kpulse_aggregator_ingest_local_token_checks_total{outcome=\"no_keys\"} 9\n\
                    kpulse_aggregator_ingest_local_token_checks_total{outcome=\"invalid\"} 1\n";
        assert_eq!(checks(text), (3.0, 10.0));
        assert_eq!(checks(""), (0.0, 0.0));
    }
}
