//! The swap check of `cargo xtask cluster check` (issue 16): on a node with swap (the
//! machine's own, or the file `cluster up` adds, [`host::swap_up`]), kpulse serves
//! `usage.swap` as kubelet means it, and the cluster's kubectl shows it with `--show-swap`.
//!
//! 1. The node publishes `status.nodeInfo.swap.capacity` (kubelet does when it sees swap;
//!    without it `kubectl top node --show-swap` prints `<unknown>` whatever is served).
//! 2. A BestEffort busybox pod writes 48 MiB to its `/dev/shm` (shared memory, which only
//!    swap can take out of memory), then sleeps. The kubelet's default swap behaviour keeps
//!    containers with a memory limit out of swap; this one has none, so the check pushes its
//!    memory out from outside, as memory pressure would: on cgroup v1 by lowering its
//!    `memory.limit_in_bytes` to 16 MiB, on v2 by lifting `memory.swap.max` and asking
//!    `memory.reclaim` for 40 MiB.
//! 3. What the container's own files say (`total_swap` of `memory.stat` on v1,
//!    `memory.swap.current` on v2, read just before and after) is compared with the served
//!    PodMetrics' `usage.swap` (±2 %), with `kubectl top pod --show-swap` (which prints
//!    whole MiB) and the node's `SwapTotal - SwapFree` with `kubectl top node --show-swap`.
//! 4. Every container of the node carries the key (CoreDNS's, which has nothing in swap,
//!    too): that is what the checks after this one read with older kubectls and the HPA.

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use super::{
    check::{container_inspect, in_fresh_namespace, Ctx},
    daemons, host, images,
    versus::{api::quantity, truth::CgroupFiles},
};

const NS: &str = "kpulse-swap";
const POD: &str = "swapper";
/// What the pod writes to `/dev/shm`.
const FILL_MIB: u64 = 48;
/// v1: the memory limit the check sets; the rest of the fill goes to swap.
const LIMIT_MIB: u64 = 16;
const MIB: f64 = 1024.0 * 1024.0;
const TOLERANCE: f64 = 0.02;

pub(super) fn swap(ctx: &Ctx<'_>) -> Result<String> {
    in_fresh_namespace(ctx, NS, || swap_in_namespace(ctx))
}

fn swap_in_namespace(ctx: &Ctx<'_>) -> Result<String> {
    let node = ctx.json(&["get", "node", daemons::NODE_NAME])?;
    let capacity = node["status"]["nodeInfo"]["swap"]["capacity"]
        .as_u64()
        .filter(|c| *c > 0)
        .with_context(|| {
            format!(
                "the node publishes no swap capacity (nodeInfo: {}); the machine has {} kB of swap",
                node["status"]["nodeInfo"],
                host::swap_total_kb().unwrap_or_default()
            )
        })?;

    let file = ctx.dirs.etc.join("check-swapper.json");
    std::fs::write(&file, manifest())?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    let container = running_container(ctx)?;
    let inspect = container_inspect(ctx, &container)?;
    let cgroups_path = inspect["info"]["runtimeSpec"]["linux"]["cgroupsPath"]
        .as_str()
        .with_context(|| format!("container {container}: no cgroupsPath"))?;
    let files = CgroupFiles::for_path(cgroups_path)?;
    wait_for_fill(&files)?;
    push_to_swap(&files)?;
    let in_swap = files.swap()?;
    ensure!(
        in_swap >= 16 << 20,
        "only {in_swap} B of the pod's memory went to swap"
    );

    // The served value, against the files read around it; the agent reads every second.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (served, lo, hi) = loop {
        let before = files.swap()?;
        // NotFound until the pod's second sample.
        let v = ctx
            .json(&["get", "podmetrics", "-n", NS, POD])
            .unwrap_or_default();
        let after = files.swap()?;
        let served = v["containers"][0]["usage"]["swap"]
            .as_str()
            .and_then(quantity);
        let (lo, hi) = (before.min(after) as f64, before.max(after) as f64);
        if let Some(s) = served {
            if s >= lo * (1.0 - TOLERANCE) && s <= hi * (1.0 + TOLERANCE) {
                break (s, lo, hi);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "PodMetrics {NS}/{POD} serves swap {:?}, its cgroup has {lo} … {hi} B",
                v["containers"][0]["usage"]
            );
        }
        thread::sleep(Duration::from_millis(500));
    };

    // kubectl prints whole MiB.
    let top_pod =
        crate::exec::output(
            ctx.kubectl()
                .args(["top", "pod", POD, "-n", NS, "--show-swap"]),
        )?;
    let pod_mib = column(&top_pod, POD, "SWAP(bytes)")
        .and_then(|s| quantity(&s))
        .with_context(|| format!("no SWAP(bytes) of {POD} in\n{top_pod}"))?
        / MIB;
    let file_mib = files.swap()? as f64 / MIB;
    ensure!(
        (pod_mib - file_mib).abs() <= 1.0 + file_mib * TOLERANCE,
        "kubectl top pod --show-swap: {pod_mib} Mi, the cgroup {file_mib:.1} Mi\n{top_pod}"
    );

    let top_node = crate::exec::output(ctx.kubectl().args([
        "top",
        "node",
        daemons::NODE_NAME,
        "--show-swap",
    ]))?;
    let node_before = host::swap_used()? as f64 / MIB;
    let node_mib = column(&top_node, daemons::NODE_NAME, "SWAP(bytes)")
        .and_then(|s| quantity(&s))
        .with_context(|| format!("no SWAP(bytes) of the node in\n{top_node}"))?
        / MIB;
    let node_after = host::swap_used()? as f64 / MIB;
    let percent = column(&top_node, daemons::NODE_NAME, "SWAP(%)").unwrap_or_default();
    ensure!(
        percent.ends_with('%'),
        "kubectl top node --show-swap: SWAP(%) is {percent:?}\n{top_node}"
    );
    let (nlo, nhi) = (node_before.min(node_after), node_before.max(node_after));
    ensure!(
        node_mib >= nlo * (1.0 - TOLERANCE) - 1.0 && node_mib <= nhi * (1.0 + TOLERANCE) + 1.0,
        "kubectl top node --show-swap: {node_mib} Mi, /proc/meminfo {nlo:.1} … {nhi:.1} Mi\n{top_node}"
    );

    let dns = ctx.json(&["get", "podmetrics", "-n", "kube-system"])?;
    let without_key: Vec<String> = dns["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["containers"].as_array().into_iter().flatten())
        .filter(|c| c["usage"]["swap"].as_str().is_none())
        .map(|c| c["name"].as_str().unwrap_or("?").to_string())
        .collect();
    ensure!(
        without_key.is_empty(),
        "containers without usage.swap on a node with swap: {without_key:?}"
    );

    Ok(format!(
        "node swap capacity {} Mi; {POD}: its cgroup {:.1} … {:.1} Mi in swap, served {:.1} Mi, \
         kubectl top pod {pod_mib} Mi; top node {node_mib} Mi ({percent}) against /proc/meminfo \
         {nlo:.1} … {nhi:.1} Mi; every kube-system container has the key",
        capacity >> 20,
        lo / MIB,
        hi / MIB,
        served / MIB
    ))
}

fn manifest() -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{POD}","namespace":"{NS}"}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"fill","image":"{}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","dd if=/dev/zero of=/dev/shm/fill bs=1M count={FILL_MIB} 2>/dev/null; trap 'exit 0' TERM; while :; do sleep 1; done"]}}]}}}}"#,
        images::BUSYBOX_IMAGE
    )
}

/// The pod's running container's id, once it runs (120 s at most).
fn running_container(ctx: &Ctx<'_>) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = ctx.json(&["get", "pod", POD, "-n", NS])?;
        let status = &p["status"]["containerStatuses"][0];
        if status["state"]["running"].is_object() {
            return status["containerID"]
                .as_str()
                .and_then(|s| s.split_once("://"))
                .map(|(_, id)| id.to_string())
                .context("running container without a containerID");
        }
        ensure!(
            Instant::now() < deadline,
            "pod {NS}/{POD} not running within 120 s: {}",
            p["status"]
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until the pod's fill is in memory or in swap (60 s at most).
fn wait_for_fill(files: &CgroupFiles) -> Result<()> {
    let want = (FILL_MIB - 4) << 20;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let have = files.memory_usage()? + files.swap()?;
        if have >= want {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the pod's cgroup holds {have} B, not the {want} B it writes"
        );
        thread::sleep(Duration::from_millis(250));
    }
}

/// Moves most of the fill to swap, as memory pressure on the container would.
fn push_to_swap(files: &CgroupFiles) -> Result<()> {
    let write = |file: &str, value: String| {
        let path = files.memory_control(file);
        std::fs::write(&path, &value)
            .with_context(|| format!("cannot write {value} to {}", path.display()))
    };
    if !files.is_v2() {
        // The kernel reclaims down to the new limit, or refuses (EBUSY) and keeps the old.
        let mut last = Ok(());
        for _ in 0..5 {
            last = write("memory.limit_in_bytes", (LIMIT_MIB << 20).to_string());
            if last.is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        last
    } else {
        write("memory.swap.max", "max".to_string())?;
        // Reclaim stops short of the amount asked for when it cannot find more (EAGAIN).
        let _ = write("memory.reclaim", format!("{}M", FILL_MIB - 8));
        Ok(())
    }
}

/// The cell of column `header` in the row whose first cell is `row`, in kubectl's table.
fn column(table: &str, row: &str, header: &str) -> Option<String> {
    let mut lines = table.lines();
    let headers: Vec<&str> = lines.next()?.split_whitespace().collect();
    let i = headers.iter().position(|h| *h == header)?;
    lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&row))
        .and_then(|cells| cells.get(i).map(|c| c.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_columns_by_header() {
        let t = "NAME      CPU(cores)   MEMORY(bytes)   SWAP(bytes)\nswapper   0m           16Mi            33Mi\n";
        assert_eq!(column(t, "swapper", "SWAP(bytes)").as_deref(), Some("33Mi"));
        assert_eq!(column(t, "other", "SWAP(bytes)"), None);
        assert_eq!(column(t, "swapper", "SWAP(%)"), None);
    }
}
