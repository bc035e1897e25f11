//! What `cluster bench-fleet` changes in the cluster and puts back: the aggregator-api
//! Deployment (replicas, arguments, memory limit), kpulse's APIServices (removed in the off
//! arms) and its FlowSchema (`--flowschema-every-other-round`), each kept in the cluster's
//! state while away, so that a run killed meanwhile is undone by the next.

use std::fs;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

use super::{Bench, DEPLOYMENT, NAMESPACE};

/// Where, in the cluster's state, kpulse's APIServices are kept while the benchmark runs.
const APISERVICES_KEPT: &str = "bench-fleet-apiservices.json";
/// Where, in the cluster's state, kpulse's FlowSchema is kept while the benchmark runs
/// (`--flowschema-every-other-round`).
const FLOWSCHEMA_KEPT: &str = "bench-fleet-flowschema.json";
/// kpulse's FlowSchema for its reviews, as deploy/ names it.
const FLOWSCHEMA: &str = "kpulse-reviews";
/// Where, in the cluster's state, the Deployment's replicas are kept while the benchmark
/// runs (it scales them to 0 for the off arms and while it makes the fleet).
const REPLICAS_KEPT: &str = "bench-fleet-replicas";
/// Where, in the cluster's state, the Deployment's container arguments are kept while the
/// benchmark runs (it adds the fleet's per-address limit, and sets
/// `--agent-token-verification` with `--review-tokens-every-other-round`).
const ARGS_KEPT: &str = "bench-fleet-args.json";

/// The Deployment's fields the benchmark changes, as they were, and kpulse's APIServices
/// and FlowSchema.
pub(super) struct Saved {
    replicas: u64,
    /// `--replicas`, if given.
    on_replicas: Option<u64>,
    args: Value,
    /// Null when it had none.
    memory_limit: Value,
    /// Every APIService whose service is in kpulse's namespace, as `kubectl create` takes
    /// it back.
    apiservices: Vec<Value>,
    /// kpulse's FlowSchema, likewise, when `--flowschema-every-other-round` takes it away
    /// (or an earlier run that did left it kept).
    flowschema: Option<Value>,
}

impl Saved {
    /// The replicas of an "on" arm: `--replicas`, or the Deployment's own; at least one.
    pub(super) fn on_replicas(&self) -> u64 {
        self.on_replicas.unwrap_or(self.replicas).max(1)
    }
}

impl Bench<'_> {
    /// What the Deployment is before the benchmark changes it.
    pub(super) fn saved(&self) -> Result<Saved> {
        let d: Value = serde_json::from_str(
            &self.kubectl(&["-n", NAMESPACE, "get", DEPLOYMENT, "-o", "json"])?,
        )
        .context("kubectl printed no JSON")?;
        let container = &d["spec"]["template"]["spec"]["containers"][0];
        ensure!(
            container["args"].is_array(),
            "the aggregator-api Deployment has no args"
        );
        // Kept in the cluster's state too: a run killed during an off arm leaves them
        // removed, and the next run puts them back from there.
        let kept = self.ctx.dirs.state.join(APISERVICES_KEPT);
        let mut apiservices = kpulse_apiservices(&self.ctx.json(&["get", "apiservices"])?);
        if apiservices.is_empty() {
            if let Ok(text) = fs::read_to_string(&kept) {
                apiservices = serde_json::from_str(&text)
                    .with_context(|| format!("{}: not a list of APIServices", kept.display()))?;
                println!(
                    "bench-fleet: kpulse's APIServices are missing (an earlier run stopped in \
                     an off arm): put back from {}",
                    kept.display()
                );
            }
        }
        ensure!(
            !apiservices.is_empty(),
            "no APIService of kpulse's (service in {NAMESPACE}): is kpulse installed? \
             (`kubectl apply -k deploy/` puts them back)"
        );
        fs::write(&kept, Value::from(apiservices.clone()).to_string())
            .with_context(|| format!("cannot write {}", kept.display()))?;
        // Likewise the replicas: a run killed while they were at 0 leaves them there.
        let kept_replicas = self.ctx.dirs.state.join(REPLICAS_KEPT);
        let mut replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
        if replicas == 0 {
            if let Some(n) = fs::read_to_string(&kept_replicas)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
            {
                println!(
                    "bench-fleet: the aggregator-api Deployment is at 0 replicas (an earlier run \
                     stopped while it was): {n} put back from {}",
                    kept_replicas.display()
                );
                replicas = n;
            }
        }
        fs::write(&kept_replicas, replicas.to_string())
            .with_context(|| format!("cannot write {}", kept_replicas.display()))?;
        // And the arguments: a run killed before it put them back leaves its own.
        let kept_args = self.ctx.dirs.state.join(ARGS_KEPT);
        let args = match fs::read_to_string(&kept_args) {
            Ok(text) => {
                println!(
                    "bench-fleet: the aggregator-api's arguments as an earlier run found them, \
                     from {}",
                    kept_args.display()
                );
                serde_json::from_str(&text)
                    .with_context(|| format!("{}: not a list of arguments", kept_args.display()))?
            }
            Err(_) => container["args"].clone(),
        };
        fs::write(&kept_args, args.to_string())
            .with_context(|| format!("cannot write {}", kept_args.display()))?;
        // Also without the flag when an earlier run left it kept: then it may be away.
        let kept = self.ctx.dirs.state.join(FLOWSCHEMA_KEPT).exists();
        let flowschema = if self.opts.flowschema_every_other_round || kept {
            Some(self.saved_flowschema()?)
        } else {
            None
        };
        Ok(Saved {
            replicas,
            on_replicas: self.opts.replicas,
            args,
            memory_limit: container["resources"]["limits"]["memory"].clone(),
            apiservices,
            flowschema,
        })
    }

    /// kpulse's FlowSchema as applied; from the cluster's state when an earlier run stopped
    /// while it was away.
    pub(super) fn saved_flowschema(&self) -> Result<Value> {
        let kept = self.ctx.dirs.state.join(FLOWSCHEMA_KEPT);
        let found = self.flowschema("json")?;
        let schema = if found.trim().is_empty() {
            let text = fs::read_to_string(&kept).with_context(|| {
                format!(
                    "no FlowSchema {FLOWSCHEMA} (deploy/base/flowcontrol.yaml) in the cluster \
                     nor in {}: `kubectl apply -k deploy/` puts it back",
                    kept.display()
                )
            })?;
            println!(
                "bench-fleet: FlowSchema {FLOWSCHEMA} is missing (an earlier run stopped while \
                 it was away): put back from {}",
                kept.display()
            );
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not a FlowSchema", kept.display()))?
        } else {
            as_applied(serde_json::from_str(&found).context("kubectl printed no JSON")?)
        };
        fs::write(&kept, schema.to_string())
            .with_context(|| format!("cannot write {}", kept.display()))?;
        Ok(schema)
    }

    /// `kubectl get` of kpulse's FlowSchema as `output`; empty when there is none.
    pub(super) fn flowschema(&self, output: &str) -> Result<String> {
        self.kubectl(&[
            "get",
            "flowschema",
            FLOWSCHEMA,
            "--ignore-not-found",
            "-o",
            output,
        ])
    }

    /// Takes kpulse's FlowSchema away (`present` false) or puts it back, if the run changes it.
    pub(super) fn set_flowschema(&self, saved: &Saved, present: bool) -> Result<()> {
        let Some(schema) = &saved.flowschema else {
            return Ok(());
        };
        if !present {
            return self
                .kubectl(&["delete", "flowschema", FLOWSCHEMA, "--ignore-not-found"])
                .map(drop);
        }
        if self.flowschema("name")?.trim().is_empty() {
            let file = self.dir.join("flowschema.json");
            fs::write(&file, schema.to_string())
                .with_context(|| format!("cannot write {}", file.display()))?;
            self.kubectl(&["create", "-f", &file.display().to_string()])?;
        }
        Ok(())
    }

    /// Removes kpulse's APIServices (the "off" arm).
    pub(super) fn remove_apiservices(&self, saved: &Saved) -> Result<()> {
        for a in &saved.apiservices {
            let name = a["metadata"]["name"].as_str().unwrap_or_default();
            self.kubectl(&["delete", "apiservice", name, "--ignore-not-found"])?;
        }
        Ok(())
    }

    /// Creates those of kpulse's APIServices that are missing.
    pub(super) fn ensure_apiservices(&self, saved: &Saved) -> Result<()> {
        for a in &saved.apiservices {
            let name = a["metadata"]["name"].as_str().unwrap_or_default();
            let found = self.kubectl(&[
                "get",
                "apiservice",
                name,
                "--ignore-not-found",
                "-o",
                "name",
            ])?;
            if found.trim().is_empty() {
                let file = self.dir.join(format!("{name}.json"));
                fs::write(&file, a.to_string())
                    .with_context(|| format!("cannot write {}", file.display()))?;
                self.kubectl(&["create", "-f", &file.display().to_string()])?;
            }
        }
        Ok(())
    }

    /// Changes the Deployment for the fleet and waits for the rollout.
    pub(super) fn patch_deployment(&self, saved: &Saved) -> Result<()> {
        // The Deployment's own limits are dropped: the per-address one is set below for the
        // fleet, and the streams' default is above any fleet.
        let limits = ["--max-connections-per-ip=", "--max-agent-streams="];
        let mut args: Vec<Value> = saved
            .args
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| {
                !a.as_str()
                    .is_some_and(|a| limits.iter().any(|l| a.starts_with(l)))
            })
            .cloned()
            .collect();
        // Every fleet agent connects from this machine's address (real agents each have
        // their pod's): the default limit of 1,024 per address would refuse the rest.
        let room = self.opts.shape.nodes + 64;
        args.push(json!(format!("--max-connections-per-ip={room}")));
        self.patch(&json!([
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args},
            {"op": "add", "path": "/spec/template/spec/containers/0/resources/limits/memory",
             "value": self.opts.server_memory_limit},
        ]))?;
        self.rollout()
    }

    /// Sets the replicas' `--agent-token-verification` in the Deployment's template
    /// (`local` is the server's default and is set as such); the saved arguments are put
    /// back by [`Self::restore_deployment`].
    pub(super) fn set_token_verification(&self, mode: &str) -> Result<()> {
        const FLAG: &str = "--agent-token-verification=";
        let current = self.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            DEPLOYMENT,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].args}",
        ])?;
        let current: Vec<String> = serde_json::from_str(&current)
            .with_context(|| format!("the Deployment's args: {current}"))?;
        let mut args: Vec<String> = current
            .iter()
            .filter(|a| !a.starts_with(FLAG))
            .cloned()
            .collect();
        args.push(format!("{FLAG}{mode}"));
        if args == current {
            return Ok(());
        }
        self.patch(&json!([
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args},
        ]))
    }

    /// Puts the Deployment, the APIServices and the FlowSchema back, trying each whatever
    /// the others' errors; what was put back is no longer kept in the cluster's state.
    pub(super) fn restore(&self, saved: &Saved) -> Result<()> {
        let state = &self.ctx.dirs.state;
        let apiservices = self
            .ensure_apiservices(saved)
            .context("kpulse's APIServices were not put back");
        let flowschema = self
            .set_flowschema(saved, true)
            .context("kpulse's FlowSchema was not put back");
        let deployment = self
            .restore_deployment(saved)
            .context("the aggregator-api Deployment was not put back");
        let mut failed = Vec::new();
        for (result, kept) in [
            (apiservices, APISERVICES_KEPT),
            (flowschema, FLOWSCHEMA_KEPT),
            (deployment, REPLICAS_KEPT),
        ] {
            match result {
                Ok(()) => {
                    let _ = fs::remove_file(state.join(kept));
                    if kept == REPLICAS_KEPT {
                        let _ = fs::remove_file(state.join(ARGS_KEPT));
                    }
                }
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        ensure!(failed.is_empty(), "{}", failed.join("; "));
        Ok(())
    }

    pub(super) fn restore_deployment(&self, saved: &Saved) -> Result<()> {
        let memory = "/spec/template/spec/containers/0/resources/limits/memory";
        let ops = json!([
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": saved.args},
            {"op": "replace", "path": "/spec/replicas", "value": saved.replicas},
            if saved.memory_limit.is_null() {
                json!({"op": "remove", "path": memory})
            } else {
                json!({"op": "replace", "path": memory, "value": saved.memory_limit})
            },
        ]);
        self.patch(&ops)?;
        self.rollout()
    }

    pub(super) fn patch(&self, ops: &Value) -> Result<()> {
        self.kubectl(&[
            "-n",
            NAMESPACE,
            "patch",
            DEPLOYMENT,
            "--type=json",
            "-p",
            &ops.to_string(),
        ])
        .map(drop)
    }
}

/// The APIServices of `list` whose service is in kpulse's namespace, without what the
/// server sets (status, uid, resourceVersion, timestamps, managed fields), so that `kubectl
/// create` takes them back as they were applied.
fn kpulse_apiservices(list: &Value) -> Vec<Value> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["spec"]["service"]["namespace"] == NAMESPACE)
        .map(|a| as_applied(a.clone()))
        .collect()
}

/// `object` without what the server sets (status, uid, resourceVersion, timestamps,
/// managed fields), as `kubectl create` takes it back.
fn as_applied(mut object: Value) -> Value {
    if let Some(o) = object.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = object["metadata"].as_object_mut() {
        m.retain(|k, _| matches!(k.as_str(), "name" | "labels" | "annotations"));
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kpulses_apiservices_are_saved_without_what_the_server_set() {
        let list = json!({"items": [
            {"metadata": {"name": "v1beta1.metrics.k8s.io", "uid": "u", "resourceVersion": "7",
                          "labels": {"app": "kpulse"}, "managedFields": []},
             "spec": {"service": {"namespace": "kpulse-system", "name": "kpulse-aggregator-api"},
                      "group": "metrics.k8s.io"},
             "status": {"conditions": []}},
            {"metadata": {"name": "v1.apps"}, "spec": {"service": null}},
            {"metadata": {"name": "v1beta1.custom.metrics.k8s.io"},
             "spec": {"service": {"namespace": "monitoring", "name": "prometheus-adapter"}}},
        ]});
        let saved = kpulse_apiservices(&list);
        assert_eq!(
            saved,
            vec![json!({
                "metadata": {"name": "v1beta1.metrics.k8s.io", "labels": {"app": "kpulse"}},
                "spec": {"service": {"namespace": "kpulse-system", "name": "kpulse-aggregator-api"},
                         "group": "metrics.k8s.io"},
            })]
        );
    }
}
