//! The kubelet's `/metrics/resource` answer: Prometheus text exposition, of which the
//! fallback uses the series metrics-server uses and nothing else.
//!
//! ```text
//! node_cpu_usage_seconds_total 2.5e+03 1764950400123
//! node_memory_working_set_bytes 2.3e+09 1764950400123
//! container_cpu_usage_seconds_total{container="app",namespace="web",pod="web-1"} 12.5 1764950399871
//! container_memory_working_set_bytes{container="app",namespace="web",pod="web-1"} 5.2e+07 1764950399871
//! ```
//!
//! The kubelet stamps every sample (milliseconds), and that timestamp is what is served;
//! a sample without one (an endpoint standing in for the kubelet, such as kwok's) takes the
//! time the request was sent, as in metrics-server. As in metrics-server, a text that does
//! not parse is refused whole (the node is skipped for that scrape); a container that
//! lacks either figure or has one that is not a finite, non-negative number is left out,
//! and so is its pod (the store serves a pod only with all of its containers). A
//! container's `container_start_time_seconds` is kept as its instance's start (one not
//! before the last point is a restart, as in metrics-server). Comment lines, other metrics
//! (`pod_*`, `scrape_error`, swap) and labels other than these three are ignored. Windows
//! nodes and sandboxed (VM) pods answer in the same format: the kubelet fills it from the
//! CRI runtime's stats instead of cgroups.

use std::collections::BTreeMap;

use kpulse_wire::{Bytes, CpuNanos, UnixNanos};

/// Why an answer was refused whole.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// A line that is not a sample of the exposition format.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// More samples than a node can have.
    #[error("more than {0} samples")]
    TooMany(usize),
}

/// At most this many samples are read from one answer: 110 pods × a few containers × a
/// handful of series is a few thousand; the body bound (`client::MAX_BODY`) comes first.
pub const MAX_SAMPLES: usize = 200_000;

/// One cumulative reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The kubelet's timestamp of the reading (the request's, for a sample without one).
    pub timestamp: UnixNanos,
    /// Cumulative CPU time.
    pub cpu: CpuNanos,
    /// Working set.
    pub memory_working_set: Bytes,
    /// When the container started (`container_start_time_seconds`), if the kubelet says:
    /// constant for one instance, so a change is a restart. `None` for the node.
    pub started_at: Option<UnixNanos>,
}

/// What one answer holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resource {
    /// The node's figures; `None` if either is missing or invalid.
    pub node: Option<Reading>,
    /// `(namespace, pod)` → container name → its reading, for pods whose every container
    /// has both figures.
    pub pods: BTreeMap<(String, String), BTreeMap<String, Reading>>,
    /// Pods left out because a container lacked a figure or had an invalid one.
    pub incomplete_pods: usize,
}

/// A figure of one series, before the pair is checked.
#[derive(Default)]
struct Half {
    cpu: Option<(u64, UnixNanos)>,
    memory: Option<(u64, UnixNanos)>,
    started_at: Option<UnixNanos>,
    invalid: bool,
}

impl Half {
    fn set(&mut self, cpu: bool, value: Option<u64>, ts: UnixNanos) {
        match value {
            None => self.invalid = true,
            Some(v) if cpu => self.cpu = Some((v, ts)),
            Some(v) => self.memory = Some((v, ts)),
        }
    }

    fn reading(&self) -> Option<Reading> {
        if self.invalid {
            return None;
        }
        let ((cpu, t_cpu), (mem, t_mem)) = (self.cpu?, self.memory?);
        Some(Reading {
            // The CPU counter's timestamp: the rate is taken between two of them.
            timestamp: if t_cpu.0 == 0 { t_mem } else { t_cpu },
            cpu: CpuNanos(cpu),
            memory_working_set: Bytes(mem),
            started_at: self.started_at,
        })
    }
}

/// Parses one `/metrics/resource` answer, fetched at `scraped_at`: a resource sample
/// without a timestamp takes that time (to the millisecond), as metrics-server gives it the
/// time its request was sent; the kubelet stamps every sample, but endpoints that stand in
/// for it may not.
pub fn parse(text: &str, scraped_at: UnixNanos) -> Result<Resource, ParseError> {
    let default_timestamp = UnixNanos(scraped_at.0 / 1_000_000 * 1_000_000);
    let mut node = Half::default();
    let mut containers: BTreeMap<(String, String, String), Half> = BTreeMap::new();
    let mut samples = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |reason| ParseError::Line {
            line: i + 1,
            reason,
        };
        samples += 1;
        if samples > MAX_SAMPLES {
            return Err(ParseError::TooMany(MAX_SAMPLES));
        }
        let sample = sample(line).map_err(fail)?;
        let (cpu, seconds) = match sample.name {
            "node_cpu_usage_seconds_total" | "container_cpu_usage_seconds_total" => (true, true),
            "node_memory_working_set_bytes" | "container_memory_working_set_bytes" => {
                (false, false)
            }
            // Optional: without it a restart is seen only when the counter goes down.
            "container_start_time_seconds" => (false, true),
            _ => continue,
        };
        let ts = match sample.timestamp_ms {
            Some(ts) => ts,
            // A start time is a time in itself.
            None if sample.name == "container_start_time_seconds" => UnixNanos(0),
            None => default_timestamp,
        };
        let value = figure(sample.value, seconds);
        if sample.name.starts_with("node_") {
            node.set(cpu, value, ts);
            continue;
        }
        let label = |k: &str| {
            sample
                .labels
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
        };
        let (Some(namespace), Some(pod), Some(container)) =
            (label("namespace"), label("pod"), label("container"))
        else {
            return Err(fail(
                "a container sample without namespace, pod and container",
            ));
        };
        let half = containers.entry((namespace, pod, container)).or_default();
        if sample.name == "container_start_time_seconds" {
            half.started_at = value.map(UnixNanos);
        } else {
            half.set(cpu, value, ts);
        }
    }
    let mut out = Resource {
        node: node.reading(),
        ..Resource::default()
    };
    let mut incomplete = std::collections::BTreeSet::new();
    for ((namespace, pod, container), half) in containers {
        // A start time alone is no container's figures.
        if half.cpu.is_none() && half.memory.is_none() && !half.invalid {
            continue;
        }
        let key = (namespace, pod);
        match half.reading() {
            Some(r) if !incomplete.contains(&key) => {
                out.pods.entry(key).or_default().insert(container, r);
            }
            Some(_) => {}
            None => {
                out.pods.remove(&key);
                incomplete.insert(key);
            }
        }
    }
    out.incomplete_pods = incomplete.len();
    Ok(out)
}

/// A finite, non-negative value as an integer: nanoseconds of seconds (`seconds`) or bytes.
fn figure(value: f64, seconds: bool) -> Option<u64> {
    let scaled = if seconds { value * 1e9 } else { value };
    // `as` saturates; 2^64 itself is out of range.
    (0.0..18_446_744_073_709_551_616.0)
        .contains(&scaled)
        .then(|| scaled.round() as u64)
}

/// One sample line, split.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
    timestamp_ms: Option<UnixNanos>,
}

/// `name{label="value",...} value [timestamp_ms]`, with the format's escapes (`\\`, `\"`,
/// `\n`) in label values.
fn sample(line: &str) -> Result<Sample<'_>, &'static str> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        rest = body;
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or("a label without a value")?;
            let key = rest[..eq].trim();
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err("a bad label name");
            }
            let quoted = rest[eq + 1..]
                .trim_start()
                .strip_prefix('"')
                .ok_or("a label value without quotes")?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("an unterminated label value"),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        _ => return Err("a bad escape in a label value"),
                    },
                    Some((_, c)) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = quoted[end + 1..].trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err("labels not separated by commas");
            }
        }
    }
    let mut fields = rest.split_whitespace();
    let value = match fields.next().ok_or("no value")? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .map_err(|_| "a value that is not a number")?,
    };
    let timestamp_ms = match fields.next() {
        None => None,
        Some(t) => {
            let ms: i64 = t
                .parse()
                .map_err(|_| "a timestamp that is not an integer")?;
            let ns = u64::try_from(ms)
                .ok()
                .and_then(|ms| ms.checked_mul(1_000_000))
                .ok_or("a timestamp out of range")?;
            Some(UnixNanos(ns))
        }
    };
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A Linux node running containerd, in the shape the kubelet's resource collector
    /// writes (HELP and TYPE lines, start times, pod and swap series the fallback ignores).
    const LINUX: &str = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"api\",namespace=\"shop\",pod=\"api-7d9f-x2x\"} 41.25 1764950400500
container_cpu_usage_seconds_total{container=\"proxy\",namespace=\"shop\",pod=\"api-7d9f-x2x\"} 3.5e-01 1764950400510
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"api\",namespace=\"shop\",pod=\"api-7d9f-x2x\"} 1.2582912e+08 1764950400500
container_memory_working_set_bytes{container=\"proxy\",namespace=\"shop\",pod=\"api-7d9f-x2x\"} 9437184 1764950400510
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"api\",namespace=\"shop\",pod=\"api-7d9f-x2x\"} 1.7649e+09 1764900000000
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 86412.75 1764950400125
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 2.39e+09 1764950400125
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"shop\",pod=\"api-7d9f-x2x\"} 41.6 1764950400505
# TYPE resource_scrape_error gauge
resource_scrape_error 0
";

    /// When the tests' answers were fetched.
    const AT: UnixNanos = UnixNanos(1_764_950_460_123_456_789);

    #[test]
    fn a_linux_node_and_its_pod() {
        let r = parse(LINUX, AT).expect("parses");
        assert_eq!(
            r.node,
            Some(Reading {
                timestamp: UnixNanos(1_764_950_400_125 * MS),
                cpu: CpuNanos(86_412_750_000_000),
                memory_working_set: Bytes(2_390_000_000),
                started_at: None,
            })
        );
        let pod = &r.pods[&("shop".to_string(), "api-7d9f-x2x".to_string())];
        assert_eq!(pod.len(), 2);
        assert_eq!(pod["api"].cpu, CpuNanos(41_250_000_000));
        assert_eq!(pod["api"].memory_working_set, Bytes(125_829_120));
        assert_eq!(pod["proxy"].cpu, CpuNanos(350_000_000));
        assert_eq!(pod["proxy"].timestamp, UnixNanos(1_764_950_400_510 * MS));
        // The start time marks the instance (the store tells a restart by it).
        assert_eq!(
            pod["api"].started_at,
            Some(UnixNanos(1_764_900_000 * 1_000_000_000))
        );
        assert_eq!(pod["proxy"].started_at, None);
        assert_eq!(r.incomplete_pods, 0);
    }

    /// A Windows node (containerd with HCS): the kubelet reports the node's CPU and
    /// working set from Windows performance counters and containers from the runtime's
    /// CRI stats, with no start times and with whole-number values.
    #[test]
    fn a_windows_node() {
        let text = "\
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 5123 1764950401000
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 3.1457e+09 1764950401000
container_cpu_usage_seconds_total{container=\"iis\",namespace=\"win-web\",pod=\"iis-0\"} 77 1764950400000
container_memory_working_set_bytes{container=\"iis\",namespace=\"win-web\",pod=\"iis-0\"} 201326592 1764950400000
container_cpu_usage_seconds_total{container=\"log-monitor\",namespace=\"win-web\",pod=\"iis-0\"} 0 1764950400000
container_memory_working_set_bytes{container=\"log-monitor\",namespace=\"win-web\",pod=\"iis-0\"} 15728640 1764950400000
";
        let r = parse(text, AT).expect("parses");
        let node = r.node.expect("node figures");
        assert_eq!(node.cpu, CpuNanos(5_123_000_000_000));
        assert_eq!(node.memory_working_set, Bytes(3_145_700_000));
        let pod = &r.pods[&("win-web".to_string(), "iis-0".to_string())];
        // A container that used no CPU yet is served (0), as metrics-server serves it.
        assert_eq!(pod["log-monitor"].cpu, CpuNanos(0));
        assert_eq!(pod["iis"].memory_working_set, Bytes(201_326_592));
    }

    /// A pod in a VM sandbox (Kata): its containers run in the guest, so the node's
    /// cgroups hold only the sandbox; the runtime reports each container's stats through
    /// CRI and the kubelet writes them like any other. One container's memory is missing
    /// (the runtime had no figure yet): that pod is left out whole, the other is served.
    #[test]
    fn a_sandboxed_pod_with_one_figure_missing_is_left_out_whole() {
        let text = "\
container_cpu_usage_seconds_total{container=\"db\",namespace=\"secure\",pod=\"db-0\"} 120.5 1764950400000
container_memory_working_set_bytes{container=\"db\",namespace=\"secure\",pod=\"db-0\"} 536870912 1764950400000
container_cpu_usage_seconds_total{container=\"agent\",namespace=\"secure\",pod=\"vm-1\"} 1.5 1764950400000
container_cpu_usage_seconds_total{container=\"main\",namespace=\"secure\",pod=\"vm-1\"} 9.5 1764950400000
container_memory_working_set_bytes{container=\"main\",namespace=\"secure\",pod=\"vm-1\"} 1048576 1764950400000
node_cpu_usage_seconds_total 10 1764950400000
";
        let r = parse(text, AT).expect("parses");
        assert_eq!(r.node, None, "no node memory: no node figures");
        assert!(r
            .pods
            .contains_key(&("secure".to_string(), "db-0".to_string())));
        assert!(!r
            .pods
            .contains_key(&("secure".to_string(), "vm-1".to_string())));
        assert_eq!(r.incomplete_pods, 1);
    }

    #[test]
    fn invalid_figures_leave_the_pod_out() {
        for bad in ["NaN", "-1", "+Inf", "1e30"] {
            let text = format!(
                "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"n\",pod=\"p\"}} {bad} 1000\n\
                 container_memory_working_set_bytes{{container=\"c\",namespace=\"n\",pod=\"p\"}} 5 1000\n"
            );
            let r = parse(&text, AT).expect("parses");
            assert!(r.pods.is_empty(), "{bad}: {r:?}");
            assert_eq!(r.incomplete_pods, 1, "{bad}");
        }
    }

    #[test]
    fn escapes_and_spacing_in_labels() {
        let text = "container_cpu_usage_seconds_total{ pod=\"a\\\"b\" , namespace=\"n\\\\s\",container=\"c\\nd\",} 1 2\n\
                    container_memory_working_set_bytes{container=\"c\\nd\",namespace=\"n\\\\s\",pod=\"a\\\"b\"} 3 2\n";
        let r = parse(text, AT).expect("parses");
        let pod = &r.pods[&("n\\s".to_string(), "a\"b".to_string())];
        assert_eq!(pod["c\nd"].cpu, CpuNanos(1_000_000_000));
        assert_eq!(pod["c\nd"].timestamp, UnixNanos(2 * MS));
    }

    /// Garbage and truncation inside a line refuse the answer whole (metrics-server skips
    /// the node's scrape likewise).
    #[test]
    fn malformed_answers_are_refused_whole() {
        let cases = [
            "<html>502 Bad Gateway</html>",
            "node_cpu_usage_seconds_total",
            "node_cpu_usage_seconds_total twelve 1000",
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"n\",pod=\"p",
            "container_cpu_usage_seconds_total{container=\"c\" namespace=\"n\"} 1 1",
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"n\"} 1 1",
            "container_cpu_usage_seconds_total{container=\"c\\q\"} 1 1",
            "node_cpu_usage_seconds_total 1 -5",
            "node_cpu_usage_seconds_total 1 99999999999999999",
            "node_cpu_usage_seconds_total 1 1 extra",
        ];
        for text in cases {
            assert!(
                matches!(parse(text, AT), Err(ParseError::Line { line: 1, .. })),
                "{text:?} was accepted"
            );
        }
        assert!(parse("scrape_error 0\nresource_scrape_error 0\n", AT).is_ok());
        let truncated = &LINUX[..LINUX.rfind("node_memory_working_set_bytes").expect("there") + 29];
        assert!(parse(truncated, AT).is_err());
    }

    /// kwok's stand-in for `/metrics/resource` (and any endpoint built on Prometheus's Go
    /// client with plain gauges) stamps nothing: metrics-server gives such samples the time
    /// it sent the request, and so does the fallback, to the millisecond. A sample that has
    /// a timestamp keeps it.
    #[test]
    fn samples_without_timestamps_take_the_time_of_the_request() {
        let text = "\
# HELP node_cpu_usage_seconds_total Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 12.5
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1.048576e+06
container_cpu_usage_seconds_total{container=\"app\",namespace=\"web\",pod=\"web-1\"} 0.25
container_memory_working_set_bytes{container=\"app\",namespace=\"web\",pod=\"web-1\"} 524288 1764950400500
scrape_error 0
";
        let r = parse(text, AT).expect("parses");
        let at_ms = UnixNanos(1_764_950_460_123_000_000);
        let node = r.node.expect("the node");
        assert_eq!(node.timestamp, at_ms);
        assert_eq!(node.cpu, CpuNanos(12_500_000_000));
        assert_eq!(node.memory_working_set, Bytes(1 << 20));
        let app = &r.pods[&("web".to_string(), "web-1".to_string())]["app"];
        // The CPU counter's timestamp is the reading's: here the request's.
        assert_eq!(app.timestamp, at_ms);
        assert_eq!(app.memory_working_set, Bytes(524_288));
        let stamped = text.replace("0.25\n", "0.25 1764950400500\n");
        let app = parse(&stamped, AT).expect("parses").pods
            [&("web".to_string(), "web-1".to_string())]["app"];
        assert_eq!(app.timestamp, UnixNanos(1_764_950_400_500_000_000));
    }

    #[test]
    fn samples_are_bounded() {
        let text = "x 1\n".repeat(MAX_SAMPLES + 1);
        assert_eq!(parse(&text, AT), Err(ParseError::TooMany(MAX_SAMPLES)));
    }
}
