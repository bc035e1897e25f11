//! The reads phase's reads: `kubectl top` and the same lists through kube-apiserver, each
//! timed, sized, and checked for every fleet node or pod it should list.

use std::{fs, path::Path, time::Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::super::{check::Ctx, daemons, versus};
use crate::stats;

/// One kind of read and its samples.
pub(super) struct Reads {
    name: String,
    how: How,
    /// What a complete answer lists: at least `n` items of the fleet (none: not counted).
    want: Option<Want>,
    /// Seconds of the successful ones.
    times: Vec<f64>,
    bytes: Vec<f64>,
    items: Vec<usize>,
    errors: usize,
}

enum How {
    Kubectl(Vec<String>),
    Raw(String),
}

/// The fleet's items an answer must list: those whose name (or namespace) starts with
/// `prefix` — for kubectl, whose first column does, with figures (not `<unknown>`).
pub(super) struct Want {
    n: usize,
    prefix: String,
    by_namespace: bool,
}

impl Want {
    pub(super) fn names(n: usize, prefix: &str) -> Option<Want> {
        Some(Want {
            n,
            prefix: prefix.to_owned(),
            by_namespace: false,
        })
    }

    pub(super) fn namespaces(n: usize, prefix: &str) -> Option<Want> {
        Some(Want {
            n,
            prefix: prefix.to_owned(),
            by_namespace: true,
        })
    }

    /// The fleet's rows of kubectl's table.
    fn rows(&self, table: &str) -> usize {
        table
            .lines()
            .skip(1)
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|c| c.starts_with(&self.prefix))
                    && !l.contains("<unknown>")
            })
            .count()
    }

    /// The fleet's items of a JSON list.
    fn items(&self, list: &Value) -> usize {
        let field = if self.by_namespace {
            "namespace"
        } else {
            "name"
        };
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| {
                i["metadata"][field]
                    .as_str()
                    .is_some_and(|v| v.starts_with(&self.prefix))
            })
            .count()
    }
}

impl Reads {
    pub(super) fn kubectl(name: &str, args: &[&str], want: Option<Want>) -> Reads {
        let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        // As the GETs' curl: a list may take long; the goal is what is measured.
        args.push("--request-timeout=60s".to_owned());
        Reads::new(name, How::Kubectl(args), want)
    }

    pub(super) fn raw(name: &str, path: &str, want: Option<Want>) -> Reads {
        Reads::new(name, How::Raw(path.to_owned()), want)
    }

    fn new(name: &str, how: How, want: Option<Want>) -> Reads {
        Reads {
            name: name.to_owned(),
            how,
            want,
            times: Vec::new(),
            bytes: Vec::new(),
            items: Vec::new(),
            errors: 0,
        }
    }

    /// Counts one answer: its time, bytes and fleet items, or an error (a failure, or an
    /// answer short of the fleet).
    fn count(&mut self, ok: bool, secs: f64, bytes: f64, items: usize) {
        let complete = self.want.as_ref().is_none_or(|w| items >= w.n);
        if ok && complete {
            self.times.push(secs);
            self.bytes.push(bytes);
            self.items.push(items);
        } else {
            self.errors += 1;
        }
    }

    /// One read, as the admin: kubectl with `ctx`'s kubeconfig, curl with its certificate
    /// (the body kept in `dir`).
    pub(super) fn once(&mut self, ctx: &Ctx<'_>, dir: &Path) -> Result<()> {
        match &self.how {
            How::Kubectl(args) => {
                let t = Instant::now();
                let out = ctx
                    .kubectl()
                    .args(args)
                    .stderr(std::process::Stdio::null())
                    .output()
                    .context("cannot run kubectl")?;
                let secs = t.elapsed().as_secs_f64();
                let text = String::from_utf8_lossy(&out.stdout);
                let items = self.want.as_ref().map_or(0, |w| w.rows(&text));
                self.count(out.status.success(), secs, out.stdout.len() as f64, items);
            }
            How::Raw(path) => {
                let dirs = ctx.dirs;
                let body = dir.join("read.json");
                let _ = fs::remove_file(&body);
                let out = daemons::admin_curl(&dirs.pki)
                    .args(["-sS", "--max-time", "60", "-H", "Accept: application/json"])
                    .arg("-o")
                    .arg(&body)
                    .args(["-w", "%{http_code} %{time_total} %{size_download}"])
                    .arg(format!("{}{path}", daemons::apiserver_url()))
                    .output()
                    .context("cannot run curl")?;
                let text = String::from_utf8_lossy(&out.stdout);
                let mut parts = text.split_whitespace();
                let code = parts.next().unwrap_or_default();
                let secs: f64 = parts
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                let size: f64 = parts
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                let items = match &self.want {
                    Some(w) => {
                        let text = fs::read(&body).unwrap_or_default();
                        serde_json::from_slice::<Value>(&text)
                            .map(|v| w.items(&v))
                            .unwrap_or(0)
                    }
                    None => 0,
                };
                self.count(out.status.success() && code == "200", secs, size, items);
            }
        }
        Ok(())
    }

    pub(super) fn row(&self) -> String {
        let mut ms: Vec<f64> = self.times.iter().map(|t| t * 1e3).collect();
        let p50 = versus::percentile(&mut ms, 0.5);
        let p90 = versus::percentile(&mut ms, 0.9);
        let max = stats::range(&ms).1;
        let items = match (&self.want, self.items.iter().min()) {
            (Some(_), Some(n)) => n.to_string(),
            _ => "–".to_owned(),
        };
        format!(
            "| {} | {} of {} | {p50:.0} | {p90:.0} | {max:.0} | {:.0} | {items} |\n",
            self.name,
            self.errors,
            self.errors + self.times.len(),
            stats::median(&self.bytes),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::super::fleet;
    use super::*;

    #[test]
    fn a_read_counts_errors_and_reports_percentiles_of_the_rest() {
        let mut r = Reads::raw("x", "/x", Want::names(3, "p-"));
        r.times = (1..=10).map(|i| f64::from(i) / 1e3).collect();
        r.bytes = vec![100.0; 10];
        r.items = vec![3; 10];
        r.errors = 2;
        assert_eq!(r.row(), "| x | 2 of 12 | 5 | 9 | 10 | 100 | 3 |\n");
    }

    #[test]
    fn only_the_fleets_rows_with_figures_count() {
        let table = "NAME               CPU(cores)   MEMORY(bytes)\n\
                     fleet-node-00000   120m         300Mi\n\
                     fleet-node-00001   <unknown>    <unknown>\n\
                     kpulse-node        300m         2Gi\n";
        let want = Want::names(2, fleet::NODE_PREFIX).expect("a want");
        assert_eq!(want.rows(table), 1);
        let list = json!({"items": [
            {"metadata": {"name": "p-00000-000", "namespace": "fleet-000"}},
            {"metadata": {"name": "coredns-1", "namespace": "kube-system"}},
        ]});
        let by_ns = Want::namespaces(1, "fleet-").expect("a want");
        assert_eq!(by_ns.items(&list), 1);
        assert_eq!(Want::names(1, "p-").expect("a want").items(&list), 1);
    }

    #[test]
    fn an_answer_short_of_the_fleet_is_an_error() {
        let mut r = Reads::kubectl("top", &["top", "node"], Want::names(2, "fleet-node-"));
        r.count(true, 0.1, 10.0, 1);
        r.count(false, 0.1, 10.0, 2);
        r.count(true, 0.2, 10.0, 2);
        assert_eq!((r.errors, r.items.clone()), (2, vec![2]));
        let mut discovery = Reads::raw("d", "/apis", None);
        discovery.count(true, 0.1, 10.0, 0);
        assert_eq!(discovery.errors, 0);
    }
}
