//! The two metrics APIs as the HPA reads them: a PodMetrics list of one namespace with a
//! label selector, as `system:serviceaccount:kube-system:horizontal-pod-autoscaler`.
//!
//! - **kpulse** through kube-apiserver and its APIService, as the cluster's admin
//!   impersonating the HPA's identity (kube-apiserver then proxies with that identity in
//!   `X-Remote-User`, as it does for the HPA itself).
//! - **metrics-server** on its own Service (no APIService points at it while kpulse holds
//!   `metrics.k8s.io`), with what kube-apiserver's proxy would send: the front-proxy client
//!   certificate and the `X-Remote-User`/`X-Remote-Group` headers. Its serving certificate is
//!   self-signed, so it is not verified, as its release APIService does
//!   (`insecureSkipTLSVerify: true`).
//!
//! Both use one `kube::Client` per API with keep-alive, so that polling every 100 ms costs
//! one request, not a process.

use std::{path::Path, time::Duration};

use anyhow::{ensure, Context, Result};
use http::{HeaderName, HeaderValue};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// The identity the HPA's resource-metrics client has.
pub const HPA_USER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";
const HPA_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:kube-system",
    "system:authenticated",
];
const TIMEOUT: Duration = Duration::from_secs(5);

/// Which system answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Kpulse,
    MetricsServer,
}

impl Source {
    pub const ALL: [Source; 2] = [Source::Kpulse, Source::MetricsServer];

    pub fn name(self) -> &'static str {
        match self {
            Source::Kpulse => "kpulse",
            Source::MetricsServer => "metrics-server",
        }
    }
}

/// One container of a served PodMetrics.
#[derive(Clone, Debug)]
pub struct Usage {
    /// Cores.
    pub cpu: f64,
    /// Bytes (working set).
    pub memory: f64,
}

/// One served PodMetrics.
#[derive(Clone, Debug)]
pub struct PodPoint {
    pub pod: String,
    /// Whole seconds since the epoch, as both APIs serve it (`metav1.Time` drops the
    /// fraction in JSON and in protobuf): the true end of the window is in `[t, t + 1)`.
    pub timestamp: i64,
    pub window: Duration,
    pub containers: Vec<Usage>,
}

/// A metrics API, read as the HPA reads it.
#[derive(Clone)]
pub struct Api {
    pub source: Source,
    host: String,
    client: kube::Client,
    version: &'static str,
}

impl Api {
    /// kpulse through kube-apiserver, impersonating the HPA.
    pub async fn kpulse(kubeconfig: &Path) -> Result<Api> {
        let kc = Kubeconfig::read_from(kubeconfig)?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .context("admin kubeconfig")?;
        config.auth_info.impersonate = Some(HPA_USER.to_string());
        config.auth_info.impersonate_groups =
            Some(HPA_GROUPS.iter().map(|g| g.to_string()).collect());
        Self::with(Source::Kpulse, config)
    }

    /// metrics-server on its Service's ClusterIP, as the aggregation layer calls it for the
    /// HPA.
    pub fn metrics_server(service_ip: &str, cert: &Path, key: &Path) -> Result<Api> {
        Self::metrics_server_as(service_ip, cert, key, HPA_USER, &HPA_GROUPS)
    }

    /// The same for any user and groups (its `/metrics` needs `system:masters`).
    pub fn metrics_server_as(
        service_ip: &str,
        cert: &Path,
        key: &Path,
        user: &str,
        groups: &[&str],
    ) -> Result<Api> {
        let mut config = kube::Config::new(
            format!("https://{service_ip}:443")
                .parse()
                .context("metrics-server URL")?,
        );
        config.accept_invalid_certs = true;
        config.auth_info.client_certificate = Some(cert.display().to_string());
        config.auth_info.client_key = Some(key.display().to_string());
        config.headers.push((
            HeaderName::from_static("x-remote-user"),
            HeaderValue::from_str(user)?,
        ));
        for g in groups {
            config.headers.push((
                HeaderName::from_static("x-remote-group"),
                HeaderValue::from_str(g)?,
            ));
        }
        Self::with(Source::MetricsServer, config)
    }

    /// The host the API is reached at.
    pub fn host(&self) -> String {
        self.host.clone()
    }

    fn with(source: Source, mut config: kube::Config) -> Result<Api> {
        let host = config.cluster_url.host().unwrap_or_default().to_string();
        config.connect_timeout = Some(TIMEOUT);
        config.read_timeout = Some(TIMEOUT);
        config.write_timeout = Some(TIMEOUT);
        Ok(Api {
            source,
            host,
            client: kube::Client::try_from(config).context("metrics API client")?,
            // metrics-server v0.8.0 serves v1beta1 only; kpulse serves both, and the HPA
            // reads v1beta1 (see cluster check).
            version: "v1beta1",
        })
    }

    /// `GET …/namespaces/<ns>/pods?labelSelector=<selector>`.
    pub async fn pod_metrics(&self, namespace: &str, selector: &str) -> Result<Vec<PodPoint>> {
        let path = format!(
            "/apis/metrics.k8s.io/{}/namespaces/{namespace}/pods?labelSelector={}",
            self.version,
            selector.replace('=', "%3D").replace(',', "%2C")
        );
        let text = self.get(&path).await?;
        parse_list(&text)
    }

    /// A path of the API as text (e.g. metrics-server's `/metrics`).
    pub async fn get(&self, path: &str) -> Result<String> {
        let req = http::Request::get(path).body(Vec::new())?;
        tokio::time::timeout(TIMEOUT, self.client.request_text(req))
            .await
            .with_context(|| {
                format!(
                    "{}: GET {path}: no answer in {TIMEOUT:?}",
                    self.source.name()
                )
            })?
            .with_context(|| format!("{}: GET {path}", self.source.name()))
    }
}

/// A PodMetricsList's items.
pub fn parse_list(text: &str) -> Result<Vec<PodPoint>> {
    let v: Value = serde_json::from_str(text).context("PodMetricsList: not JSON")?;
    ensure!(
        v["kind"] == "PodMetricsList",
        "not a PodMetricsList: {}",
        &text[..text.len().min(200)]
    );
    let mut out = Vec::new();
    for item in v["items"].as_array().into_iter().flatten() {
        let pod = item["metadata"]["name"]
            .as_str()
            .context("PodMetrics without a name")?
            .to_string();
        let timestamp = item["timestamp"]
            .as_str()
            .and_then(rfc3339_seconds)
            .with_context(|| format!("{pod}: bad timestamp {}", item["timestamp"]))?;
        let window = item["window"]
            .as_str()
            .and_then(go_duration)
            .with_context(|| format!("{pod}: bad window {}", item["window"]))?;
        let mut containers = Vec::new();
        for c in item["containers"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().context("container without a name")?;
            let q = |r: &str| {
                c["usage"][r]
                    .as_str()
                    .and_then(quantity)
                    .with_context(|| format!("{pod}/{name}: bad {r} {}", c["usage"][r]))
            };
            containers.push(Usage {
                cpu: q("cpu")?,
                memory: q("memory")?,
            });
        }
        out.push(PodPoint {
            pod,
            timestamp,
            window,
            containers,
        });
    }
    Ok(out)
}

/// `2026-12-01T22:03:18Z` → seconds since the epoch.
pub fn rfc3339_seconds(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// A Go `time.Duration` string as metrics.k8s.io serves windows: `15.001s`, `999.65ms`,
/// `1m0.5s`, `0s`.
pub fn go_duration(s: &str) -> Option<Duration> {
    if s == "0" || s == "0s" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&e| e > 0)?;
        let value: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3.6e12,
            "m" => 6e10,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" => 1e3,
            "ns" => 1.0,
            _ => return None,
        };
        nanos += value * scale;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_nanos(nanos.round() as u64))
}

/// A resource quantity as the metrics APIs serve usage: `2294481n`, `14032Ki`, `1m`, `0`.
pub fn quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let value: f64 = s[..split].parse().ok()?;
    let scale = match &s[split..] {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(value * scale)
}

/// A Prometheus text exposition's samples of `name` (with any labels): `(labels, value)`.
pub fn prometheus_samples(text: &str, name: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once("} ") {
                Some((l, v)) => (l.to_string(), v),
                None => continue,
            }
        } else if let Some(v) = rest.strip_prefix(' ') {
            (String::new(), v)
        } else {
            continue;
        };
        if let Ok(v) = value.trim().parse() {
            out.push((labels, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_as_served() {
        assert_eq!(go_duration("15.001s"), Some(Duration::from_millis(15_001)));
        assert_eq!(
            go_duration("999.650059ms"),
            Some(Duration::from_nanos(999_650_059))
        );
        assert_eq!(go_duration("1m0.5s"), Some(Duration::from_millis(60_500)));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("12"), None);
        assert_eq!(go_duration("s"), None);
        assert_eq!(go_duration("1x"), None);
    }

    #[test]
    fn quantities_as_served() {
        assert_eq!(quantity("2294481n"), Some(0.002294481));
        assert_eq!(quantity("14032Ki"), Some(14032.0 * 1024.0));
        assert_eq!(quantity("1m"), Some(0.001));
        assert_eq!(quantity("0"), Some(0.0));
        assert_eq!(quantity("3Qi"), None);
    }

    #[test]
    fn a_served_list() {
        let text = r#"{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},
          "items":[{"metadata":{"name":"p","namespace":"n"},"timestamp":"2026-12-01T22:03:18Z",
          "window":"15.001s","containers":[{"name":"c","usage":{"cpu":"500m","memory":"1Mi"}}]}]}"#;
        let l = parse_list(text).expect("test input");
        assert_eq!(l[0].pod, "p");
        assert_eq!(l[0].timestamp, 1_796_162_598);
        assert_eq!(l[0].window, Duration::from_millis(15_001));
        assert_eq!(l[0].containers[0].cpu, 0.5);
        assert_eq!(l[0].containers[0].memory, 1048576.0);
        assert!(parse_list(r#"{"kind":"Status"}"#).is_err());
    }

    #[test]
    fn prometheus_lines() {
        let text = "# HELP x\nm_total{success=\"true\"} 12\nm_total{success=\"false\"} 1\nm_totalx 3\nm 4\n";
        assert_eq!(
            prometheus_samples(text, "m_total"),
            vec![
                ("success=\"true\"".to_string(), 12.0),
                ("success=\"false\"".to_string(), 1.0)
            ]
        );
        assert_eq!(prometheus_samples(text, "m"), vec![(String::new(), 4.0)]);
    }
}
