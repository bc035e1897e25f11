//! `/healthz`, `/livez`, `/readyz` with named checks and `?verbose` / `?exclude=` output
//! in the format of k8s.io/apiserver's healthz package, so probes and humans read them
//! the same way as metrics-server's.

use std::sync::Arc;

/// One named check.
pub trait Check: Send + Sync {
    /// The check's name (`metric-storage-ready`, ...).
    fn name(&self) -> &str;
    /// `Err(reason)` when unhealthy. The reason is logged, not sent to clients.
    fn check(&self) -> Result<(), String>;
}

/// A check from a closure.
pub struct FnCheck<F> {
    name: String,
    f: F,
}

impl<F: Fn() -> Result<(), String> + Send + Sync> FnCheck<F> {
    /// A named check.
    pub fn arc(name: &str, f: F) -> Arc<dyn Check>
    where
        F: 'static,
    {
        Arc::new(FnCheck {
            name: name.to_string(),
            f,
        })
    }
}

impl<F: Fn() -> Result<(), String> + Send + Sync> Check for FnCheck<F> {
    fn name(&self) -> &str {
        &self.name
    }
    fn check(&self) -> Result<(), String> {
        (self.f)()
    }
}

/// The always-passing `ping` check every endpoint has.
pub fn ping() -> Arc<dyn Check> {
    FnCheck::arc("ping", || Ok(()))
}

/// A health endpoint's answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// 200, 404 (unknown check name) or 500.
    pub status: u16,
    /// `text/plain` body.
    pub body: String,
}

/// Evaluates `checks` for endpoint `endpoint` (`healthz`, `livez`, `readyz`).
/// `sub` selects one check (`/readyz/<name>`); `query` is the raw query string.
pub fn evaluate(
    endpoint: &str,
    checks: &[Arc<dyn Check>],
    sub: Option<&str>,
    query: &str,
) -> Answer {
    let mut verbose = false;
    let mut exclude: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "verbose" => verbose = v.is_empty() || v == "true" || v == "1",
            "exclude" => exclude.push(v.to_string()),
            _ => {}
        }
    }
    if let Some(name) = sub {
        let Some(c) = checks.iter().find(|c| c.name() == name) else {
            return Answer {
                status: 404,
                body: "404 page not found\n".into(),
            };
        };
        return match c.check() {
            Ok(()) => Answer {
                status: 200,
                body: "ok".into(),
            },
            Err(reason) => {
                tracing::debug!(check = name, %reason, "{endpoint} check failed");
                Answer {
                    status: 500,
                    body: "internal server error: reason withheld\n".into(),
                }
            }
        };
    }
    let mut lines = String::new();
    let mut failed = false;
    for c in checks {
        if exclude.iter().any(|e| e == c.name()) {
            lines.push_str(&format!("[+]{} excluded: ok\n", c.name()));
            continue;
        }
        match c.check() {
            Ok(()) => lines.push_str(&format!("[+]{} ok\n", c.name())),
            Err(reason) => {
                failed = true;
                tracing::debug!(check = c.name(), %reason, "{endpoint} check failed");
                lines.push_str(&format!("[-]{} failed: reason withheld\n", c.name()));
            }
        }
    }
    if failed {
        Answer {
            status: 500,
            body: format!("{lines}{endpoint} check failed\n"),
        }
    } else if verbose {
        Answer {
            status: 200,
            body: format!("{lines}{endpoint} check passed\n"),
        }
    } else {
        Answer {
            status: 200,
            body: "ok".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(ready: bool) -> Vec<Arc<dyn Check>> {
        vec![
            ping(),
            FnCheck::arc("metric-storage-ready", move || {
                if ready {
                    Ok(())
                } else {
                    Err("no metrics to serve".into())
                }
            }),
        ]
    }

    #[test]
    fn passing() {
        assert_eq!(
            evaluate("readyz", &checks(true), None, ""),
            Answer {
                status: 200,
                body: "ok".into()
            }
        );
        assert_eq!(
            evaluate("readyz", &checks(true), None, "verbose").body,
            "[+]ping ok\n[+]metric-storage-ready ok\nreadyz check passed\n"
        );
    }

    #[test]
    fn failing_lists_every_check_and_withholds_reasons() {
        let a = evaluate("readyz", &checks(false), None, "");
        assert_eq!(a.status, 500);
        assert_eq!(
            a.body,
            "[+]ping ok\n[-]metric-storage-ready failed: reason withheld\nreadyz check failed\n"
        );
        assert!(!a.body.contains("no metrics"));
    }

    #[test]
    fn exclude_and_single_checks() {
        let a = evaluate(
            "readyz",
            &checks(false),
            None,
            "exclude=metric-storage-ready&verbose",
        );
        assert_eq!(a.status, 200);
        assert!(
            a.body.contains("[+]metric-storage-ready excluded: ok\n"),
            "{}",
            a.body
        );
        assert_eq!(
            evaluate("readyz", &checks(true), Some("ping"), "").status,
            200
        );
        assert_eq!(
            evaluate("readyz", &checks(false), Some("metric-storage-ready"), "").status,
            500
        );
        assert_eq!(
            evaluate("readyz", &checks(true), Some("nope"), "").status,
            404
        );
    }
}
