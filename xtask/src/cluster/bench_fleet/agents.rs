//! The fleet's agents: `loadgen --fleet` processes, as many as their connections need under
//! the hard open-file limit each inherits, and their summaries added up.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::{
    bench_restart::{counts_lines, errors_between, unix_ns},
    harness::{self, Proc},
};

/// Open files each load generator process keeps below its hard limit for what is not a
/// fleet connection (a stream a node and replica, a pod watch a node).
const LOADGEN_FILE_ROOM: u64 = 1_000;

/// The fleet's agents: as many load generator processes (`--shard I/N`) as their
/// connections need under the hard open-file limit each inherits.
pub(super) struct Agents {
    procs: Vec<(Proc, PathBuf)>,
}

impl Agents {
    /// `nodes` agents streaming to `replicas` replicas, over at least `at_least`
    /// processes.
    pub(super) fn spawn(
        loadgen: &Path,
        args: &[String],
        (nodes, replicas): (usize, usize),
        at_least: usize,
        dir: &Path,
    ) -> Result<Agents> {
        let limit = harness::open_file_limit()?;
        let count = processes(nodes, replicas, limit)?
            .max(at_least)
            .min(nodes.max(1));
        // Each start's logs kept: `loadgen-<start>-<process>.log`.
        let start = (1..)
            .find(|n| !dir.join(format!("loadgen-{n}-0.log")).exists())
            .unwrap_or(0);
        let mut procs = Vec::with_capacity(count);
        for i in 0..count {
            let summary = dir.join(format!("loadgen-{start}-{i}.out"));
            let mut args = args.to_vec();
            args.extend(["--shard".to_owned(), format!("{i}/{count}")]);
            let proc = Proc::spawn_with_env(
                &format!("the fleet's agents (loadgen {i}/{count})"),
                loadgen,
                &args,
                false,
                &dir.join(format!("loadgen-{start}-{i}.log")),
                Some(&summary),
                // Its counts every second (streams up, errors by reason): a restart's.
                &[("RUST_LOG", "warn,loadgen=info")],
            )?;
            procs.push((proc, summary));
        }
        Ok(Agents { procs })
    }

    pub(super) fn check_running(&mut self) -> Result<()> {
        self.procs
            .iter_mut()
            .try_for_each(|(p, _)| p.check_running())
    }

    /// What the load generators counted from `from` on: the seconds after `from` until every
    /// process had as many streams up as at `from` again, and the stream errors by reason
    /// from `from` to then; NaN and none when a process has not (or has no counts).
    pub(super) fn since(&self, from: SystemTime) -> Result<(f64, BTreeMap<String, u64>)> {
        let from = unix_ns(from);
        let mut logs = Vec::with_capacity(self.procs.len());
        let mut back = from;
        for (p, _) in &self.procs {
            let lines = counts_lines(&p.log)?;
            let Some(at) = back_again(&lines, from) else {
                return Ok((f64::NAN, BTreeMap::new()));
            };
            back = back.max(at);
            logs.push(lines);
        }
        // Every process's errors up to the last one's return.
        let mut errors = BTreeMap::new();
        for lines in &logs {
            let counted = errors_between(lines, from, back.saturating_sub(1))
                .or_else(|| errors_between(lines, from, lines.last()?.0.saturating_sub(1)))
                .unwrap_or_default();
            for (k, n) in counted {
                *errors.entry(k).or_default() += n;
            }
        }
        Ok(((back - from) as f64 / 1e9, errors))
    }

    /// Stops every process and returns their summaries added up.
    pub(super) fn stop(mut self) -> Result<Value> {
        for (p, _) in &self.procs {
            p.signal("TERM")?;
        }
        let mut summaries = Vec::with_capacity(self.procs.len());
        for (p, summary) in &mut self.procs {
            p.wait_for(Duration::from_secs(120))?
                .context("the fleet's agents did not stop within 120 s")?;
            summaries.push(harness::read_summary(summary)?);
        }
        Ok(add_up(&summaries))
    }
}

/// In one load generator's counts lines: the first count after `from` (ns) with as many
/// streams up as the last one at or before `from`, once fewer were (`None`: none such).
fn back_again(lines: &[(u128, Value)], from: u128) -> Option<u128> {
    let up = |v: &Value| v["streams_up"].as_i64().unwrap_or(0);
    let (_, before) = lines.iter().rev().find(|(at, _)| *at <= from)?;
    let target = up(before);
    let fell = lines
        .iter()
        .position(|(at, v)| *at > from && up(v) < target)?;
    let (at, _) = lines[fell..].iter().find(|(_, v)| up(v) >= target)?;
    Some(*at)
}

/// Load generator processes for `nodes` agents streaming to `replicas` replicas and each
/// watching its pods, under a hard open-file limit of `limit`.
fn processes(nodes: usize, replicas: usize, limit: u64) -> Result<usize> {
    let room = limit.saturating_sub(LOADGEN_FILE_ROOM);
    ensure!(
        room >= 1_000,
        "the hard open-file limit ({limit}) leaves the load generator no room for a fleet"
    );
    let files = nodes as u64 * (replicas as u64 + 1);
    Ok(usize::try_from(files.div_ceil(room).max(1))?)
}

/// The load generator summary's fields that are each process's setting, not a count: the
/// first process's kept (every process has the same).
const SUMMARY_SETTINGS: [&str; 2] = ["replicas", "spread"];

/// Summaries of several load generators as one: counts added (objects key by key), lists
/// joined, settings ([`SUMMARY_SETTINGS`]) and anything else the first's.
fn add_up(summaries: &[Value]) -> Value {
    fn add(into: &mut Value, from: &Value) {
        match (into, from) {
            (Value::Number(a), Value::Number(b)) => {
                if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                    *a = x.saturating_add(y).into();
                }
            }
            (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    if SUMMARY_SETTINGS.contains(&k.as_str()) {
                        continue;
                    }
                    match a.get_mut(k) {
                        Some(mine) => add(mine, v),
                        None => {
                            a.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut total = summaries.first().cloned().unwrap_or(Value::Null);
    for s in summaries.iter().skip(1) {
        add(&mut total, s);
    }
    total
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_agents_are_split_over_processes_by_the_open_file_limit() -> Result<()> {
        // 1,000 nodes to two replicas with a watch each: 3,000 files, one process.
        assert_eq!(processes(1_000, 2, 20_000)?, 1);
        // 10,000 nodes: 30,000 files, 19,000 a process.
        assert_eq!(processes(10_000, 2, 20_000)?, 2);
        assert_eq!(processes(10_000, 1, 20_000)?, 2);
        assert_eq!(processes(10_000, 2, 524_288)?, 1);
        assert_eq!(processes(1, 1, 4_096)?, 1);
        assert!(processes(10, 2, 1_024).is_err());
        Ok(())
    }

    #[test]
    fn a_restart_is_counted_from_the_load_generators_counts() {
        let line = |at: u128, up: i64, connect: u64| {
            (
                at,
                json!({"streams_up": up, "stream_errors": {"http": 10, "connect": connect}}),
            )
        };
        let lines = [
            line(1, 100, 0),
            line(2, 100, 0),
            line(3, 60, 40),
            line(4, 90, 70),
            line(5, 100, 75),
            line(6, 100, 75),
        ];
        // Killed at 2.5: back at 5, with 75 refusals meanwhile.
        assert_eq!(back_again(&lines, 2), Some(5));
        assert_eq!(
            errors_between(&lines, 2, 4),
            Some(BTreeMap::from([("connect".to_owned(), 75)]))
        );
        // Nothing fell after 5: not a restart.
        assert_eq!(back_again(&lines, 5), None);
        // Not back yet.
        assert_eq!(back_again(&lines[..4], 2), None);
        // No count before the kill.
        assert_eq!(back_again(&lines, 0), None);
    }

    #[test]
    fn summaries_add_up_key_by_key() {
        let a = json!({"replicas": 2, "spread": false, "produced": 10, "sent": 9,
                       "stream_errors": {"reset": 1}, "first_unsent": ["n1"]});
        let b = json!({"replicas": 2, "spread": false, "produced": 5, "sent": 5,
                       "stream_errors": {"reset": 2, "eof": 1}, "first_unsent": []});
        let c = json!({"replicas": 2, "spread": false, "produced": 1, "sent": 0,
                       "stream_errors": {}, "first_unsent": ["n7", "n9"]});
        assert_eq!(
            add_up(&[a.clone(), b, c]),
            json!({"replicas": 2, "spread": false, "produced": 16, "sent": 14,
                   "stream_errors": {"reset": 3, "eof": 1},
                   "first_unsent": ["n1", "n7", "n9"]})
        );
        assert_eq!(add_up(std::slice::from_ref(&a)), a);
        assert_eq!(add_up(&[]), Value::Null);
    }
}
