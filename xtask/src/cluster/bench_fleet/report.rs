//! The report of `cluster bench-fleet`: the tables docs/benchmarks.md takes.

use std::process::Command;

use super::{Bench, Cost, OnArm, Reads};
use crate::stats;

impl Bench<'_> {
    pub(super) fn report(
        &self,
        off: &[Cost],
        on: &[Cost],
        arms: &[OnArm],
        reads: &[Reads],
    ) -> String {
        let opts = self.opts;
        let shape = &opts.shape;
        // The commit, `-dirty` when the tree has changes to tracked files not committed
        // (at report time: the images were built from the tree at the run's start).
        let commit = crate::exec::output(Command::new("git").args([
            "describe",
            "--always",
            "--dirty",
            "--abbrev=7",
            "--exclude=*",
        ]))
        .unwrap_or_default();
        let mut out = format!(
            "### {} kwok nodes × {} pods × {} containers, {} namespaces (`cargo xtask cluster \
             bench-fleet --nodes {} --pods {} --containers {} --namespaces {} --rounds {} \
             --window-secs {} --settle-secs {} --ramp-secs {} --resolution-ms {} \
             --agent-processes {}{}{}{}`, commit {})\n\n",
            shape.nodes,
            shape.pods,
            shape.containers,
            shape.namespaces,
            shape.nodes,
            shape.pods,
            shape.containers,
            shape.namespaces,
            opts.rounds,
            opts.window_secs,
            opts.settle_secs,
            opts.ramp_secs,
            opts.resolution_ms,
            opts.agent_processes,
            opts.replicas
                .map(|r| format!(" --replicas {r}"))
                .unwrap_or_default(),
            if opts.flowschema_every_other_round {
                " --flowschema-every-other-round"
            } else {
                ""
            },
            if opts.review_tokens_every_other_round {
                " --review-tokens-every-other-round"
            } else {
                ""
            },
            commit.trim(),
        );
        let cell = |v: Vec<f64>, scale: f64, digits: usize| {
            let v: Vec<f64> = v.into_iter().map(|x| x * scale).collect();
            let (lo, hi) = stats::range(&v);
            format!(
                "{:.digits$} ({:.digits$}–{:.digits$})",
                stats::median(&v),
                lo,
                hi
            )
        };
        out.push_str(
            "Control plane over each arm's window, median (min–max) of the rounds:\n\n\
             | arm | kube-apiserver CPU (mCPU) | etcd CPU (mCPU) | kube-apiserver RSS (MiB) | \
             etcd RSS (MiB) | requests/s | watches open |\n|---|---|---|---|---|---|---|\n",
        );
        for (name, arm) in [("off (no kpulse)", off), ("on", on)] {
            let col = |f: fn(&Cost) -> f64| arm.iter().map(f).collect::<Vec<_>>();
            out.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} |\n",
                cell(col(|c| c.apiserver_cores), 1e3, 0),
                cell(col(|c| c.etcd_cores), 1e3, 0),
                cell(col(|c| c.apiserver_rss), 1.0, 0),
                cell(col(|c| c.etcd_rss), 1.0, 0),
                cell(col(|c| c.requests_per_sec), 1.0, 1),
                cell(col(|c| c.watches), 1.0, 0),
            ));
        }
        let diffs = |f: fn(&Cost) -> f64| -> Vec<f64> {
            on.iter().zip(off).map(|(a, b)| f(a) - f(b)).collect()
        };
        let per_1000 = 1000.0 / shape.nodes as f64;
        for (what, f) in [
            (
                "kube-apiserver CPU",
                (|c: &Cost| c.apiserver_cores) as fn(&Cost) -> f64,
            ),
            ("etcd CPU", |c: &Cost| c.etcd_cores),
        ] {
            let (m, lo, hi) = stats::paired(&diffs(f));
            out.push_str(&format!(
                "\n{what}, on − off (paired by round): {:.0} mCPU, 95 % CI {:.0} … {:.0}; per \
                 1,000 nodes {:.1} mCPU ({:.1} … {:.1}).",
                m * 1e3,
                lo * 1e3,
                hi * 1e3,
                m * 1e3 * per_1000,
                lo * 1e3 * per_1000,
                hi * 1e3 * per_1000,
            ));
        }
        out.push_str(
            "\n\nEach \"on\" arm: new replicas, then the fleet's agents started (ramp) until \
             every replica's Pod is Ready, and until every fleet node is served from its agent \
             on every replica (at most 60 s more; the steady window comes after that); then \
             one replica's process killed and timed back: \
             its first answer, its readyz 200 (every node with a Ready agent Pod served, from \
             its agent or the kubelet fallback, for 3 s; or 60 s after its start whatever is \
             missing: a figure near 60 s is that timeout), and every fleet node served from its \
             agent on every replica. TokenReviews, APF rejections and kube-apiserver's CPU from \
             just before the kill to then:\n\n\
             | round | kpulse FlowSchema | agents' tokens | start → every Pod Ready (s) | \
             start → all from agents (s) | TokenReviews | APF rejected | kill → \
             answering (s) | kill → readyz 200 (s) | kill → all from agents (s) | TokenReviews | \
             APF rejected | kube-apiserver during (mCPU) | ticks sent / unsent | pod-watch \
             events / errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for (i, a) in arms.iter().enumerate() {
            let r = &a.restart;
            out.push_str(&format!(
                "| {} | {} | {} | {:.1} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {} | {:.0} \
                 | {:.0} | {:.0} | {} / {} | {} / {} |\n",
                i + 1,
                if a.flowschema { "yes" } else { "no" },
                a.verification,
                a.start_to_ready,
                within_limit(a.start_to_agents),
                a.start_tokenreviews,
                a.start_rejected,
                r.kill_to_answer,
                r.kill_to_ready,
                within_limit(r.kill_to_agents),
                r.tokenreviews,
                r.rejected,
                r.apiserver_cores * 1e3,
                a.summary["sent"],
                a.summary["unsent"],
                a.summary["pod_watch_events"],
                a.summary["pod_watch_errors"],
            ));
        }
        out.push_str(
            "\nThe restarted process's own account (its log: seconds from its first line to its \
             first lists and to its agents' port opening; its local token checks by outcome, \
             all but `accepted` then reviewed):\n\n",
        );
        for (i, a) in arms.iter().enumerate() {
            let r = &a.restart.restarted;
            let checks: Vec<String> = r
                .local_checks
                .iter()
                .map(|(outcome, n)| format!("{outcome} {n:.0}"))
                .collect();
            let errors: Vec<String> = a
                .restart
                .agent_errors
                .iter()
                .map(|(reason, n)| format!("{reason} {n}"))
                .collect();
            out.push_str(&format!(
                "- round {}: Nodes listed after {:.1} s, agent pods after {:.1} s, agents' port \
                 open after {:.1} s; local token checks: {}; its container started {} \
                 time(s) meanwhile; SYNs its pod's kernel dropped at a listening socket \
                 (ListenDrops, from the kill): {}; \
                 the load generators' streams all up again {} s after the kill, their stream \
                 errors meanwhile: {}\n",
                i + 1,
                r.nodes_listed,
                r.agent_pods_listed,
                r.port_opened,
                if checks.is_empty() {
                    "none counted (review mode, or its metrics unread)".to_owned()
                } else {
                    checks.join(", ")
                },
                a.restart
                    .starts
                    .map_or_else(|| "(not read)".to_owned(), |n| n.to_string()),
                a.restart
                    .listen_drops
                    .map_or_else(|| "(not read)".to_owned(), |n| n.to_string()),
                if a.restart.agents_back.is_finite() {
                    format!("{:.1}", a.restart.agents_back)
                } else {
                    "(not counted)".to_owned()
                },
                if errors.is_empty() {
                    "none counted".to_owned()
                } else {
                    errors.join(", ")
                },
            ));
        }
        out.push_str(&format!(
            "\nReads through kube-apiserver with kpulse on, {} of each, interleaved (the \
             cluster's own kubectl, its wall time; GETs by curl as the admin, `Accept: \
             application/json`; 60 s timeout each; an answer without every fleet node or pod \
             it should list counts as an error):\n\n\
             | read | errors | p50 (ms) | p90 (ms) | max (ms) | bytes (median) | fleet items \
             (min) |\n|---|---|---|---|---|---|---|\n",
            opts.reads,
        ));
        for r in reads {
            out.push_str(&r.row());
        }
        out
    }
}

/// Seconds to every fleet node served from its agent, or that it did not happen within the
/// 60 s the run waits after readiness ([`super::COMPLETE_LIMIT`]).
fn within_limit(secs: f64) -> String {
    if secs.is_finite() {
        format!("{secs:.1}")
    } else {
        format!("not within {} s more", super::COMPLETE_LIMIT.as_secs())
    }
}
