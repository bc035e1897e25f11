//! The `deploy/` manifests, as a cluster would get them: `cargo xtask certs` writes the TLS
//! material into a copy of `deploy/`, real `kubectl kustomize` renders the base and the HA
//! overlay, and every object is parsed into its Kubernetes type (nothing may be dropped:
//! a misspelt field fails). Then the objects are checked against each other and against the
//! binaries: APIService → Service → Deployment → container port; the agents' headless
//! Service, flags, tokens and CA; the serving certificate for every Service name; RBAC
//! granting exactly what the binaries call (the table [`CALLS`]); the pods' security;
//! NetworkPolicies; the flags parsed by the binaries' own clap definitions; the
//! Containerfiles.
//!
//! No cluster is needed. `kubectl` (with its built-in kustomize) must be on PATH, or named
//! by `KPULSE_KUBECTL`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use base64::Engine as _;
use clap::CommandFactory as _;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::{
            ConfigMap, Container, Namespace, PodSpec, ResourceQuota, Secret, Service,
            ServiceAccount, Volume,
        },
        flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use rustls::client::danger::ServerCertVerifier as _;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Names shared by the manifests, the binaries and the certificate tool.

const NS: &str = "kpulse-system";
const SERVER: &str = "kpulse-aggregator-api";
const AGENT: &str = "kpulse-agent";
const AGENTS_SERVICE: &str = "kpulse-aggregator-agents";
const SECRET: &str = "kpulse-serving-cert";
const CA_CONFIGMAP: &str = "kpulse-ca";
const AUDIENCE: &str = "kpulse";
/// The FlowSchema and priority level of the server's reviews (deploy/base/flowcontrol.yaml).
const REVIEWS_FLOW: &str = "kpulse-reviews";

// ---------------------------------------------------------------------------------------------
// Every call the binaries make to the Kubernetes API.

/// Why an API right is in [`CALLS`].
#[derive(Clone, Copy, Debug)]
enum Why {
    /// The code makes this call today (where).
    Called(&'static str),
    /// Granted for a call being written (what and where).
    Planned(&'static str),
    /// Comes with a bootstrap role we bind as a whole; not called.
    Bundled(&'static str),
}

/// One right: `verb` on `group`/`resource`, in `namespace` (`None`: cluster-wide, i.e.
/// `Api::all`), for the object `name` only (when the call names it, directly or by a
/// `metadata.name` field selector, which RBAC's `resourceNames` then matches).
#[derive(Clone, Copy, Debug)]
struct Call {
    sa: &'static str,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: Option<&'static str>,
    name: Option<&'static str>,
    why: Why,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Called(at) => write!(f, "called: {at}"),
            Why::Planned(at) => write!(f, "planned: {at}"),
            Why::Bundled(role) => write!(f, "bundled with {role}"),
        }
    }
}

const fn call(
    sa: &'static str,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: Option<&'static str>,
    name: Option<&'static str>,
    why: Why,
) -> Call {
    Call {
        sa,
        verb,
        group,
        resource,
        namespace,
        name,
        why,
    }
}

/// `kube-system/extension-apiserver-authentication`, as the server's code names it.
const AUTH_CM_NS: &str = kpulse_aggregator_api::auth::authconfig::NAMESPACE;
const AUTH_CM: &str = kpulse_aggregator_api::auth::authconfig::NAME;

/// The "group" of a non-resource URL in [`CALLS`] (its path is the resource).
const URL: &str = "(non-resource URL)";

/// The table: each call the binaries make, and where. RBAC must grant each `Called` and
/// `Planned` one to that ServiceAccount, and nothing that is not in this table.
const CALLS: &[Call] = &[
    // aggregator-api/src/auth/delegated.rs, `TokenAuthenticator` (`Api::all`,
    // `review_token`: `api.create`): bearer tokens of API clients, and of agents (audience
    // `kpulse`) on the ingest port.
    call(
        SERVER,
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        None,
        None,
        Why::Called("auth/delegated.rs TokenAuthenticator"),
    ),
    // aggregator-api/src/auth/delegated.rs, `Authorizer` (`Api::all`, `api.create`): every
    // request that is not to a health path.
    call(
        SERVER,
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        None,
        None,
        Why::Called("auth/delegated.rs Authorizer"),
    ),
    // aggregator-api/src/auth/issuer.rs, `fetch` (`client.send` of a GET): the service
    // account issuer's discovery document and keys, to verify agents' tokens without a
    // TokenReview. The bootstrap role also grants both paths with a trailing slash.
    call(
        SERVER,
        "get",
        URL,
        kpulse_aggregator_api::auth::issuer::DISCOVERY_PATH,
        None,
        None,
        Why::Called("auth/issuer.rs fetch"),
    ),
    call(
        SERVER,
        "get",
        URL,
        kpulse_aggregator_api::auth::issuer::JWKS_PATH,
        None,
        None,
        Why::Called("auth/issuer.rs fetch"),
    ),
    call(
        SERVER,
        "get",
        URL,
        "/.well-known/openid-configuration/",
        None,
        None,
        Why::Bundled("ClusterRole system:service-account-issuer-discovery"),
    ),
    call(
        SERVER,
        "get",
        URL,
        "/openid/v1/jwks/",
        None,
        None,
        Why::Bundled("ClusterRole system:service-account-issuer-discovery"),
    ),
    // aggregator-api/src/auth/authconfig.rs, `follow`: `watcher` on
    // `Api::<ConfigMap>::namespaced("kube-system")` with the field selector
    // `metadata.name=extension-apiserver-authentication` — a list, then watches.
    call(
        SERVER,
        "list",
        "",
        "configmaps",
        Some(AUTH_CM_NS),
        Some(AUTH_CM),
        Why::Called("auth/authconfig.rs follow (watcher: list)"),
    ),
    call(
        SERVER,
        "watch",
        "",
        "configmaps",
        Some(AUTH_CM_NS),
        Some(AUTH_CM),
        Why::Called("auth/authconfig.rs follow (watcher: watch)"),
    ),
    // The bootstrap Role extension-apiserver-authentication-reader also grants get.
    call(
        SERVER,
        "get",
        "",
        "configmaps",
        Some(AUTH_CM_NS),
        Some(AUTH_CM),
        Why::Bundled("Role kube-system/extension-apiserver-authentication-reader"),
    ),
    // aggregator-api/src/nodes.rs, `follow`: `watcher` on
    // `Api::<PartialObjectMeta<Node>>::all` — which nodes exist, and their labels.
    call(
        SERVER,
        "list",
        "",
        "nodes",
        None,
        None,
        Why::Called("nodes.rs follow (watcher: list)"),
    ),
    call(
        SERVER,
        "watch",
        "",
        "nodes",
        None,
        None,
        Why::Called("nodes.rs follow (watcher: watch)"),
    ),
    // aggregator-api/src/kubelet/: for nodes without an agent streaming, the Node (its
    // addresses and kubelet port), the node's pods' metadata (a list with the field
    // selector spec.nodeName) and the kubelet's /metrics/resource (nodes/metrics).
    call(
        SERVER,
        "get",
        "",
        "nodes",
        None,
        None,
        Why::Called("kubelet/mod.rs Scrape::target: the Node's addresses"),
    ),
    call(
        SERVER,
        "get",
        "",
        "nodes/metrics",
        None,
        None,
        Why::Called("kubelet/client.rs Client::get: GET /metrics/resource (or the Node's path)"),
    ),
    call(
        SERVER,
        "list",
        "",
        "pods",
        None,
        None,
        Why::Called("kubelet/mod.rs Scrape::scrape: list_metadata spec.nodeName"),
    ),
    // Pod metadata (names, labels, containers) for the objects served, replacing the
    // agents' reports (aggregator-api/src/metadata.rs): a reflector of pods, and single
    // gets.
    call(
        SERVER,
        "get",
        "",
        "pods",
        None,
        None,
        Why::Planned("metadata.rs: pod metadata"),
    ),
    call(
        SERVER,
        "watch",
        "",
        "pods",
        None,
        None,
        Why::Planned("metadata.rs: pod reflector"),
    ),
    // agent/src/attribute.rs (being written): a `watcher` of `Api::<Pod>::all` with the
    // field selector `spec.nodeName=$NODE_NAME`: cgroup → pod/container. A watcher lists and
    // watches; it never gets, so `get` is not granted. RBAC cannot limit the list to the
    // node (field selectors are not part of RBAC rules), hence cluster-wide.
    call(
        AGENT,
        "list",
        "",
        "pods",
        None,
        None,
        Why::Planned("agent/src/attribute.rs: pod watcher (list)"),
    ),
    call(
        AGENT,
        "watch",
        "",
        "pods",
        None,
        None,
        Why::Planned("agent/src/attribute.rs: pod watcher (watch)"),
    ),
];

/// Roles every cluster has, which the manifests bind but do not define
/// (kubernetes `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`: `policy.go` and
/// `namespace_policy.go`).
fn bootstrap_roles() -> Vec<(Option<&'static str>, &'static str, Vec<PolicyRule>)> {
    let rule = |verbs: &[&str], group: &str, resource: &str, names: &[&str]| PolicyRule {
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        resource_names: (!names.is_empty()).then(|| names.iter().map(|s| s.to_string()).collect()),
        non_resource_urls: None,
    };
    vec![
        (
            None,
            "system:auth-delegator",
            vec![
                rule(&["create"], "authentication.k8s.io", "tokenreviews", &[]),
                rule(
                    &["create"],
                    "authorization.k8s.io",
                    "subjectaccessreviews",
                    &[],
                ),
            ],
        ),
        (
            None,
            "system:service-account-issuer-discovery",
            vec![PolicyRule {
                verbs: vec!["get".into()],
                non_resource_urls: Some(
                    [
                        "/.well-known/openid-configuration",
                        "/.well-known/openid-configuration/",
                        "/openid/v1/jwks",
                        "/openid/v1/jwks/",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                ..PolicyRule::default()
            }],
        ),
        (
            Some("kube-system"),
            "extension-apiserver-authentication-reader",
            vec![rule(
                &["get", "list", "watch"],
                "",
                "configmaps",
                &["extension-apiserver-authentication"],
            )],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// The fixture: generated certificates, both renders, parsed once per test process.

struct Fixture {
    base: Vec<Value>,
    ha: Vec<Value>,
    custom: Vec<Value>,
    ca_pem: String,
    tls_crt: String,
    tls_key: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn kubectl() -> String {
    std::env::var("KPULSE_KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("kpulse-manifests-{}-{tag}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Copies `from` to `to`, leaving out `generated/` (an operator's own certificates).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let path = entry.path();
        if entry.file_name() == "generated" {
            continue;
        }
        if path.is_dir() {
            copy_tree(&path, &to.join(entry.file_name()));
        } else {
            fs::copy(&path, to.join(entry.file_name())).expect("copy");
        }
    }
}

fn xtask_certs(out: &Path, extra: &[&str]) {
    let status = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("certs")
        .arg("--out")
        .arg(out)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run xtask certs");
    assert!(status.success(), "xtask certs failed: {status}");
}

fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (set KPULSE_KUBECTL to a kubectl with kustomize): {e}",
                kubectl()
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("kustomize output is not YAML: {e}\n{text}"))
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = temp_dir("render");
        let deploy = tmp.join("deploy");
        copy_tree(&repo().join("deploy"), &deploy);
        let generated = deploy.join("generated");
        xtask_certs(&generated, &[]);
        let read = |name: &str| fs::read_to_string(generated.join(name)).expect(name);
        let f = Fixture {
            base: render(&deploy),
            ha: render(&deploy.join("overlays/ha")),
            custom: render(&deploy.join("overlays/custom-metrics")),
            ca_pem: read("ca.crt"),
            tls_crt: read("tls.crt"),
            tls_key: read("tls.key"),
        };
        let _ = fs::remove_dir_all(&tmp);
        f
    })
}

// ---------------------------------------------------------------------------------------------
// Typed access.

/// kube-aggregator's APIService (`apiregistration.k8s.io/v1`), which k8s-openapi does not
/// have: every field of its spec, unknown ones refused.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApiService {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ApiServiceSpec,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApiServiceSpec {
    group: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<ServiceReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_bundle: Option<String>,
    group_priority_minimum: i32,
    version_priority: i32,
    // kube-aggregator's JSON name; camelCase would make it `insecureSkipTlsVerify`.
    #[serde(
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "Option::is_none"
    )]
    insecure_skip_tls_verify: Option<bool>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceReference {
    name: String,
    namespace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<i32>,
}

/// `v` as a `T`, which must serialize back to exactly `v`: a field the type does not know
/// (a typo, a wrong level) would be dropped and fail here.
fn typed<T: DeserializeOwned + Serialize>(v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", describe(v)));
    let back = serde_json::to_value(&t).expect("serialize");
    if let Some(diff) = first_difference(v, &back, String::new()) {
        panic!(
            "{}: not all of it is understood by {}: {diff}",
            describe(v),
            std::any::type_name::<T>()
        );
    }
    t
}

fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let here = format!("{at}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => {
                        if let Some(d) = first_difference(p, q, here) {
                            return Some(d);
                        }
                    }
                    (Some(p), None) => return Some(format!("{here} = {p} was dropped")),
                    (None, Some(q)) => return Some(format!("{here} = {q} was added")),
                    (None, None) => {}
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} became {b}")),
    }
}

fn describe(v: &Value) -> String {
    format!(
        "{} {}/{}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["namespace"].as_str().unwrap_or("-"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn all<T: DeserializeOwned + Serialize>(docs: &[Value], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(typed)
        .collect()
}

fn one<T: DeserializeOwned + Serialize>(docs: &[Value], kind: &str, name: &str) -> T {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} {name}, found {}",
        found.len()
    );
    typed(found[0])
}

fn server(docs: &[Value]) -> Deployment {
    one(docs, "Deployment", SERVER)
}

fn agent(docs: &[Value]) -> DaemonSet {
    one(docs, "DaemonSet", AGENT)
}

fn pod_spec_of_deployment(d: &Deployment) -> &PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn pod_spec_of_daemonset(d: &DaemonSet) -> &PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn only_container(spec: &PodSpec) -> &Container {
    assert_eq!(spec.containers.len(), 1, "one container");
    assert!(spec.init_containers.is_none(), "no init containers");
    &spec.containers[0]
}

/// `--name=value` flags of a container (a bare word such as a subcommand is skipped).
fn flags(c: &Container) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for a in c.args.iter().flatten() {
        if let Some(rest) = a.strip_prefix("--") {
            let (k, v) = rest
                .split_once('=')
                .unwrap_or_else(|| panic!("{a}: write flags as --name=value"));
            assert!(
                out.insert(k.to_string(), v.to_string()).is_none(),
                "--{k} given twice"
            );
        }
    }
    out
}

fn flag<'a>(f: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    f.get(name)
        .unwrap_or_else(|| panic!("--{name} missing"))
        .as_str()
}

/// The container port a Service's or probe's port refers to (by name or number).
fn container_port(c: &Container, port: &IntOrString) -> i32 {
    let ports = c.ports.as_deref().unwrap_or_default();
    let found = ports.iter().find(|p| match port {
        IntOrString::Int(n) => p.container_port == *n,
        IntOrString::String(name) => p.name.as_deref() == Some(name.as_str()),
    });
    found
        .unwrap_or_else(|| panic!("container {} declares no port {port:?}", c.name))
        .container_port
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels_of_deployment(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod labels")
}

fn pod_labels_of_daemonset(d: &DaemonSet) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod labels")
}

fn volume<'a>(spec: &'a PodSpec, c: &Container, mount_path: &str) -> &'a Volume {
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == mount_path)
        .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("no volume {}", mount.name))
}

fn pem_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn every_object_is_typed_and_namespaced_on_purpose() {
    let f = fixture();
    for (render, docs) in [("base", &f.base), ("ha", &f.ha)] {
        let mut seen = BTreeSet::new();
        for d in docs.iter() {
            let kind = d["kind"].as_str().expect("kind");
            let api_version = d["apiVersion"].as_str().expect("apiVersion");
            match (api_version, kind) {
                ("v1", "Namespace") => {
                    typed::<Namespace>(d);
                }
                ("v1", "ServiceAccount") => {
                    typed::<ServiceAccount>(d);
                }
                ("v1", "ResourceQuota") => {
                    typed::<ResourceQuota>(d);
                }
                ("v1", "ConfigMap") => {
                    typed::<ConfigMap>(d);
                }
                ("v1", "Secret") => {
                    typed::<Secret>(d);
                }
                ("v1", "Service") => {
                    typed::<Service>(d);
                }
                ("apps/v1", "Deployment") => {
                    typed::<Deployment>(d);
                }
                ("apps/v1", "DaemonSet") => {
                    typed::<DaemonSet>(d);
                }
                ("policy/v1", "PodDisruptionBudget") => {
                    typed::<PodDisruptionBudget>(d);
                }
                ("networking.k8s.io/v1", "NetworkPolicy") => {
                    typed::<NetworkPolicy>(d);
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    typed::<ClusterRole>(d);
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    typed::<ClusterRoleBinding>(d);
                }
                ("rbac.authorization.k8s.io/v1", "Role") => {
                    typed::<Role>(d);
                }
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                    typed::<RoleBinding>(d);
                }
                ("apiregistration.k8s.io/v1", "APIService") => {
                    typed::<ApiService>(d);
                }
                ("flowcontrol.apiserver.k8s.io/v1", "FlowSchema") => {
                    typed::<FlowSchema>(d);
                }
                ("flowcontrol.apiserver.k8s.io/v1", "PriorityLevelConfiguration") => {
                    typed::<PriorityLevelConfiguration>(d);
                }
                other => panic!("{render}: unexpected object {other:?}"),
            }
            let ns = d["metadata"]["namespace"].as_str();
            let cluster_scoped = matches!(
                kind,
                "Namespace"
                    | "ClusterRole"
                    | "ClusterRoleBinding"
                    | "APIService"
                    | "FlowSchema"
                    | "PriorityLevelConfiguration"
            );
            match (cluster_scoped, ns) {
                (true, None) => {}
                (false, Some(NS)) => {}
                // The one object outside our namespace: the Role binding the bootstrap
                // Role of the authentication ConfigMap.
                (false, Some("kube-system")) if kind == "RoleBinding" => {}
                _ => panic!("{render}: {} has namespace {ns:?}", describe(d)),
            }
            assert!(seen.insert(describe(d)), "{render}: {} twice", describe(d));
            assert_eq!(
                d["metadata"]["labels"]["app.kubernetes.io/part-of"],
                "kpulse",
                "{render}: {}",
                describe(d)
            );
        }
    }
    // What the base must contain.
    let base = &f.base;
    for (kind, name) in [
        ("Namespace", NS),
        ("ServiceAccount", SERVER),
        ("ServiceAccount", AGENT),
        ("Deployment", SERVER),
        ("DaemonSet", AGENT),
        ("Service", SERVER),
        ("Service", AGENTS_SERVICE),
        ("PodDisruptionBudget", SERVER),
        ("APIService", "v1beta1.metrics.k8s.io"),
        ("APIService", "v1.metrics.k8s.io"),
        ("Secret", SECRET),
        ("ConfigMap", CA_CONFIGMAP),
        ("ClusterRole", "system:aggregated-metrics-reader"),
        ("NetworkPolicy", SERVER),
        ("NetworkPolicy", AGENT),
        ("FlowSchema", REVIEWS_FLOW),
        ("PriorityLevelConfiguration", REVIEWS_FLOW),
    ] {
        assert!(
            base.iter()
                .any(|d| d["kind"] == kind && d["metadata"]["name"] == name),
            "no {kind} {name}"
        );
    }
}

#[test]
fn apiservices_reach_the_server_through_its_service() {
    let f = fixture();
    let docs = &f.base;
    let deployment = server(docs);
    let spec = pod_spec_of_deployment(&deployment);
    let c = only_container(spec);
    let secure_port: i32 = flag(&flags(c), "secure-port").parse().expect("port");
    let raw: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "APIService").collect();
    assert_eq!(raw.len(), 2, "v1beta1 and v1");
    for d in raw {
        // Written out as false: applied over metrics-server's APIService (true), it must
        // turn verification on, or the API server rejects caBundle + insecureSkipTLSVerify.
        assert_eq!(
            d["spec"].get("insecureSkipTLSVerify"),
            Some(&Value::Bool(false)),
            "{}: insecureSkipTLSVerify",
            describe(d)
        );
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/component"],
            "apiservice",
            "{}: the label the migration selects on",
            describe(d)
        );
        let a: ApiService = typed(d);
        let name = a.metadata.name.clone().expect("name");
        assert_eq!(a.spec.group, "metrics.k8s.io");
        assert_eq!(name, format!("{}.metrics.k8s.io", a.spec.version));
        let expected_priority = match a.spec.version.as_str() {
            "v1beta1" => 100,
            "v1" => 200,
            v => panic!("unexpected version {v}"),
        };
        assert_eq!(a.spec.version_priority, expected_priority, "{name}");
        assert_eq!(a.spec.group_priority_minimum, 100, "{name}");
        assert_eq!(a.spec.insecure_skip_tls_verify, Some(false), "{name}");
        let bundle = a.spec.ca_bundle.as_deref().expect("caBundle");
        assert_eq!(
            bundle,
            b64(f.ca_pem.as_bytes()),
            "{name}: caBundle is not the generated CA"
        );

        let svc_ref = a.spec.service.as_ref().expect("service");
        assert_eq!(
            (svc_ref.namespace.as_str(), svc_ref.name.as_str()),
            (NS, SERVER)
        );
        let port = svc_ref.port.unwrap_or(443);
        assert_eq!(port, 443);
        let svc: Service = one(docs, "Service", &svc_ref.name);
        assert_eq!(svc.metadata.namespace.as_deref(), Some(NS));
        let sspec = svc.spec.as_ref().expect("spec");
        assert_eq!(sspec.type_.as_deref(), Some("ClusterIP"));
        assert_ne!(sspec.cluster_ip.as_deref(), Some("None"), "not headless");
        let sp = sspec
            .ports
            .iter()
            .flatten()
            .find(|p| p.port == port)
            .unwrap_or_else(|| panic!("Service {} has no port {port}", svc_ref.name));
        assert_eq!(sp.protocol.as_deref(), Some("TCP"));
        let target = sp.target_port.clone().expect("targetPort");
        assert_eq!(container_port(c, &target), secure_port);
        assert!(
            selects(
                sspec.selector.as_ref().expect("selector"),
                &pod_labels_of_deployment(&deployment)
            ),
            "Service {} does not select the server's pods",
            svc_ref.name
        );
        // Ready replicas only: the aggregator must not be sent to a starting one.
        assert_ne!(sspec.publish_not_ready_addresses, Some(true));
    }
    // The Deployment's own selector selects its pods, and nothing of the agent's.
    let sel = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .expect("matchLabels");
    assert!(selects(&sel, &pod_labels_of_deployment(&deployment)));
    assert!(!selects(&sel, &pod_labels_of_daemonset(&agent(docs))));
}

/// `overlays/custom-metrics`: the base, plus the `v1beta1.custom.metrics.k8s.io` APIService
/// (same Service, same verified caBundle as `metrics.k8s.io`), `--custom-metrics=true` on
/// both binaries (which parse it), and a reader role aggregated like metrics.k8s.io's;
/// nothing else differs from the base.
#[test]
fn custom_metrics_overlay_adds_the_group_and_nothing_else() {
    let f = fixture();
    let is_custom_apiservice =
        |d: &Value| d["kind"] == "APIService" && d["spec"]["group"] == "custom.metrics.k8s.io";
    let metrics: ApiService = typed(
        f.custom
            .iter()
            .find(|d| d["kind"] == "APIService" && d["metadata"]["name"] == "v1.metrics.k8s.io")
            .expect("v1.metrics.k8s.io"),
    );
    let bundle = metrics.spec.ca_bundle.clone().expect("caBundle");
    assert_eq!(
        bundle,
        b64(f.ca_pem.as_bytes()),
        "the CA of `cargo xtask certs`"
    );
    let mut versions = Vec::new();
    for d in f.custom.iter().filter(|d| is_custom_apiservice(d)) {
        assert_eq!(
            d["spec"].get("insecureSkipTLSVerify"),
            Some(&Value::Bool(false)),
            "{}",
            describe(d)
        );
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/component"],
            "apiservice"
        );
        let a: ApiService = typed(d);
        assert_eq!(
            a.metadata.name.as_deref(),
            Some(format!("{}.custom.metrics.k8s.io", a.spec.version).as_str())
        );
        assert_eq!(a.spec.ca_bundle.as_deref(), Some(bundle.as_str()));
        let (svc, want) = (a.spec.service.as_ref(), metrics.spec.service.as_ref());
        assert_eq!(
            svc.map(|s| (&s.name, &s.namespace, s.port)),
            want.map(|s| (&s.name, &s.namespace, s.port)),
            "the same Service as metrics.k8s.io"
        );
        versions.push((a.spec.version.clone(), a.spec.version_priority));
    }
    // v1beta1 only: beside another adapter's v1beta2 it never takes the HPAs' preferred
    // version, and over another adapter's v1beta1 a server-side apply conflicts.
    assert_eq!(versions, [("v1beta1".to_string(), 100)]);

    // Both binaries get the switch, and parse it.
    let server_flags = flags(only_container(pod_spec_of_deployment(&server(&f.custom))));
    assert_eq!(flag(&server_flags, "custom-metrics"), "true");
    let mut args = vec!["kpulse-aggregator-api".to_string()];
    args.extend(server_flags.iter().map(|(k, v)| format!("--{k}={v}")));
    let cfg = <kpulse_aggregator_api::config::Config as clap::Parser>::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(cfg.custom_metrics);
    let ds = agent(&f.custom);
    let agent_args: Vec<String> = std::iter::once("kpulse-agent".to_string())
        .chain(
            only_container(pod_spec_of_daemonset(&ds))
                .args
                .iter()
                .flatten()
                .map(|a| a.replace("$(NODE_NAME)", "node-1")),
        )
        .collect();
    assert!(agent_args.iter().any(|a| a == "--custom-metrics=true"));
    match <kpulse_agent::config::Cli as clap::Parser>::try_parse_from(&agent_args) {
        Ok(kpulse_agent::config::Cli {
            command: kpulse_agent::config::Command::Run(run),
        }) => assert!(run.collect.custom_metrics),
        other => panic!("{agent_args:?}: {other:?}"),
    }

    // Who may read them: view, edit and admin, as for metrics.k8s.io.
    let reader: ClusterRole = one(&f.custom, "ClusterRole", "kpulse:custom-metrics-reader");
    let labels = reader.metadata.labels.clone().unwrap_or_default();
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            labels
                .get(&format!("rbac.authorization.k8s.io/aggregate-to-{role}"))
                .map(String::as_str),
            Some("true")
        );
    }
    let rules = reader.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["custom.metrics.k8s.io".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["pods/*".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["get"]);

    // Nothing else.
    let without: Vec<Value> = f
        .custom
        .iter()
        .filter(|d| {
            !is_custom_apiservice(d) && d["metadata"]["name"] != "kpulse:custom-metrics-reader"
        })
        .cloned()
        .map(|mut d| {
            if let Some(args) = d
                .pointer_mut("/spec/template/spec/containers/0/args")
                .and_then(Value::as_array_mut)
            {
                args.retain(|a| a != "--custom-metrics=true");
            }
            d
        })
        .collect();
    assert_eq!(without.len(), f.base.len());
    for (a, b) in without.iter().zip(&f.base) {
        assert!(
            first_difference(a, b, String::new()).is_none(),
            "{}: {:?}",
            describe(a),
            first_difference(a, b, String::new())
        );
    }
}

#[test]
fn an_agents_token_review_ends_while_the_agent_still_waits() {
    use kpulse_aggregator_api::{auth::delegated::TokenConfig, ingest::AGENT_TOKEN_REVIEW_TIMEOUT};
    let agent_waits = kpulse_agent::ship::Timeouts::default().handshake;
    // Room left for the TLS and HTTP/2 handshakes after the longest review.
    assert!(
        AGENT_TOKEN_REVIEW_TIMEOUT + std::time::Duration::from_secs(2) <= agent_waits,
        "review {AGENT_TOKEN_REVIEW_TIMEOUT:?}, agent {agent_waits:?}"
    );
    assert!(TokenConfig::default().queue_wait < AGENT_TOKEN_REVIEW_TIMEOUT);
}

/// Whether `rule` of a FlowSchema matches `call` (k8s.io/apiserver's flowcontrol matching:
/// a subject, then a resource rule with the verb, group, resource, and the scope).
fn flow_rule_matches(
    rule: &k8s_openapi::api::flowcontrol::v1::PolicyRulesWithSubjects,
    c: &Call,
) -> bool {
    let user = format!("system:serviceaccount:{NS}:{}", c.sa);
    let groups = [
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{NS}"),
        "system:authenticated".to_owned(),
    ];
    let subject = rule.subjects.iter().any(|s| match s.kind.as_str() {
        "ServiceAccount" => s
            .service_account
            .as_ref()
            .is_some_and(|sa| sa.namespace == NS && (sa.name == c.sa || sa.name == "*")),
        "User" => s
            .user
            .as_ref()
            .is_some_and(|u| u.name == user || u.name == "*"),
        "Group" => s
            .group
            .as_ref()
            .is_some_and(|g| g.name == "*" || groups.contains(&g.name)),
        other => panic!("FlowSchema subject kind {other}"),
    });
    let listed = |list: &[String], v: &str| list.iter().any(|x| x == v || x == "*");
    let resource = rule.resource_rules.iter().flatten().any(|r| {
        listed(&r.verbs, c.verb)
            && listed(&r.api_groups, c.group)
            && listed(&r.resources, c.resource)
            && match c.namespace {
                None => r.cluster_scope == Some(true),
                Some(ns) => r.namespaces.iter().flatten().any(|n| n == ns || n == "*"),
            }
    });
    subject && resource
}

#[test]
fn the_servers_reviews_have_a_priority_level_of_their_own() {
    let docs = &fixture().base;
    let schema: FlowSchema = one(docs, "FlowSchema", REVIEWS_FLOW);
    let spec = schema.spec.as_ref().expect("spec");
    // Ahead of the built-in `service-accounts` schema (9000) that would take them otherwise.
    let precedence = spec.matching_precedence.expect("matchingPrecedence");
    assert!(
        (1..9000).contains(&precedence),
        "matchingPrecedence {precedence}"
    );
    assert_eq!(spec.priority_level_configuration.name, REVIEWS_FLOW);
    let level: PriorityLevelConfiguration = one(docs, "PriorityLevelConfiguration", REVIEWS_FLOW);
    let level = level.spec.as_ref().expect("spec");
    assert_eq!(level.type_, "Limited");
    let limited = level.limited.as_ref().expect("limited");
    assert!(limited.nominal_concurrency_shares.unwrap_or(0) > 0);
    let queuing = limited
        .limit_response
        .as_ref()
        .and_then(|r| r.queuing.as_ref())
        .expect("requests queue rather than being rejected at once");
    // Room for every replica's reviews in flight (aggregator-api's default 32 each, the
    // `ha` overlay's 3 replicas).
    let room = queuing.queue_length_limit.unwrap_or(50) * queuing.queues.unwrap_or(64);
    let in_flight = kpulse_aggregator_api::auth::delegated::TokenConfig::default().max_in_flight;
    assert!(
        room >= 3 * i32::try_from(in_flight).expect("small"),
        "queues hold {room}"
    );
    // Exactly the review calls of the server's table: every one matched, nothing else.
    let rules = &spec.rules.as_deref().expect("rules");
    for c in CALLS {
        let review = c.sa == SERVER && c.resource.ends_with("reviews");
        let matched = rules.iter().any(|r| flow_rule_matches(r, c));
        assert_eq!(matched, review, "{c:?} matched: {matched}");
    }
    assert!(CALLS
        .iter()
        .any(|c| c.sa == SERVER && c.resource == "tokenreviews"));
    assert!(CALLS
        .iter()
        .any(|c| c.sa == SERVER && c.resource == "subjectaccessreviews"));
}

#[test]
fn probes_ask_the_health_paths_over_https() {
    let docs = &fixture().base;
    let deployment = server(docs);
    let c = only_container(pod_spec_of_deployment(&deployment));
    let secure_port: i32 = flag(&flags(c), "secure-port").parse().expect("port");
    for (probe, path) in [
        (c.liveness_probe.as_ref(), "/livez"),
        (c.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("no httpGet probe for {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(container_port(c, &get.port), secure_port);
        // Served without authorization by default (aggregator-api/src/auth/delegated.rs).
        assert!(
            kpulse_aggregator_api::auth::delegated::DEFAULT_ALWAYS_ALLOW_PATHS.contains(&path),
            "{path} is not an always-allowed path"
        );
    }
    assert!(c.startup_probe.is_none());
    // A replica busy with a reconnect storm must not be restarted for answering late.
    let liveness = c.liveness_probe.as_ref().expect("liveness");
    assert!(liveness.timeout_seconds.unwrap_or(1) >= 5);
}

#[test]
fn agents_reach_every_replica_on_the_ingest_port() {
    let docs = &fixture().base;
    let deployment = server(docs);
    let sc = only_container(pod_spec_of_deployment(&deployment));
    let server_flags = flags(sc);
    let ingest_port: i32 = flag(&server_flags, "ingest-port").parse().expect("port");

    let svc: Service = one(docs, "Service", AGENTS_SERVICE);
    let spec = svc.spec.as_ref().expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
    assert_eq!(
        spec.publish_not_ready_addresses,
        Some(true),
        "a replica is ready only once agents reach it"
    );
    assert!(selects(
        spec.selector.as_ref().expect("selector"),
        &pod_labels_of_deployment(&deployment)
    ));
    let ports = spec.ports.as_deref().unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, ingest_port);
    assert_eq!(ports[0].name.as_deref(), Some("ingest"));
    assert_eq!(
        container_port(sc, ports[0].target_port.as_ref().expect("targetPort")),
        ingest_port
    );

    let ds = agent(docs);
    let ac = only_container(pod_spec_of_daemonset(&ds));
    let args = ac.args.as_deref().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"), "subcommand");
    let agent_flags = flags(ac);
    assert_eq!(
        flag(&agent_flags, "server-service"),
        format!("{AGENTS_SERVICE}.{NS}.svc:{ingest_port}")
    );
    assert_eq!(flag(&agent_flags, "resolution"), "1s");
    // The node name comes from the downward API.
    assert_eq!(flag(&agent_flags, "node-name"), "$(NODE_NAME)");
    let env = ac
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    let field = env
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .expect("fieldRef");
    assert_eq!(field.field_path, "spec.nodeName");
}

#[test]
fn tokens_identities_and_cas_agree() {
    let f = fixture();
    let docs = &f.base;
    let server_flags = flags(only_container(pod_spec_of_deployment(&server(docs))));
    let ds = agent(docs);
    let spec = pod_spec_of_daemonset(&ds);
    let ac = only_container(spec);
    let agent_flags = flags(ac);

    // The token the agent sends: projected, audience = the server's.
    assert_eq!(flag(&server_flags, "agent-token-audience"), AUDIENCE);
    let token_file = Path::new(flag(&agent_flags, "token-file"));
    let dir = token_file.parent().expect("dir").to_str().expect("UTF-8");
    let v = volume(spec, ac, dir);
    let sources = &v.projected.as_ref().expect("projected").sources;
    let sources = sources.as_deref().unwrap_or_default();
    assert_eq!(
        sources.len(),
        1,
        "the kpulse token volume holds the token only"
    );
    let sat = sources[0]
        .service_account_token
        .as_ref()
        .expect("serviceAccountToken");
    assert_eq!(sat.audience.as_deref(), Some(AUDIENCE));
    assert_eq!(sat.expiration_seconds, Some(3600));
    assert_eq!(
        Path::new(dir).join(&sat.path),
        token_file,
        "--token-file is the projected token"
    );

    // Whose token the server accepts: exactly the agent's ServiceAccount.
    let sa_name = spec
        .service_account_name
        .as_deref()
        .expect("serviceAccountName");
    assert_eq!(sa_name, AGENT);
    let sa: ServiceAccount = one(docs, "ServiceAccount", sa_name);
    let user = format!(
        "system:serviceaccount:{}:{}",
        sa.metadata.namespace.as_deref().expect("namespace"),
        sa_name
    );
    let accepted: Vec<&str> = flag(&server_flags, "agent-service-accounts")
        .split(',')
        .collect();
    assert_eq!(accepted, [user.as_str()]);

    // No default token mount; the API token is the explicit, standard projection.
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(sa.automount_service_account_token, Some(false));
    let api = volume(spec, ac, "/var/run/secrets/kubernetes.io/serviceaccount");
    let api_sources = api
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .expect("projected");
    let api_token = api_sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref())
        .expect("API token");
    assert_eq!(api_token.audience, None, "the API server's own audience");
    assert_eq!(api_token.path, "token");
    assert!(api_sources.iter().any(|s| s
        .config_map
        .as_ref()
        .is_some_and(|c| c.name == "kube-root-ca.crt")));
    assert!(api_sources.iter().any(|s| s.downward_api.is_some()));

    // The agent's CA: the ConfigMap, equal to the generated CA; no Secret on agent nodes.
    let ca_file = Path::new(flag(&agent_flags, "server-ca-file"));
    let ca_dir = ca_file.parent().expect("dir").to_str().expect("UTF-8");
    let cav = volume(spec, ac, ca_dir);
    let cm_ref = cav.config_map.as_ref().expect("a ConfigMap volume");
    assert_eq!(cm_ref.name, CA_CONFIGMAP);
    let item = cm_ref
        .items
        .iter()
        .flatten()
        .find(|i| Path::new(ca_dir).join(&i.path) == ca_file)
        .expect("--server-ca-file is a key of the ConfigMap");
    let cm: ConfigMap = one(docs, "ConfigMap", CA_CONFIGMAP);
    assert_eq!(
        cm.data.as_ref().and_then(|d| d.get(&item.key)),
        Some(&f.ca_pem)
    );
    for v in spec.volumes.iter().flatten() {
        assert!(v.secret.is_none(), "agent volume {} is a Secret", v.name);
        for s in v
            .projected
            .as_ref()
            .and_then(|p| p.sources.as_ref())
            .into_iter()
            .flatten()
        {
            assert!(
                s.secret.is_none(),
                "agent volume {} projects a Secret",
                v.name
            );
        }
    }
    assert!(ac.env_from.is_none());
    for e in ac.env.iter().flatten() {
        assert!(
            e.value_from
                .as_ref()
                .is_none_or(|v| v.secret_key_ref.is_none()),
            "agent env {} from a Secret",
            e.name
        );
    }
}

#[test]
fn serving_certificate_is_valid_for_every_service_and_mounted_where_the_flags_say() {
    let f = fixture();
    let docs = &f.base;
    let secret: Secret = one(docs, "Secret", SECRET);
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.as_ref().expect("data");
    let get = |k: &str| String::from_utf8(data.get(k).expect(k).0.clone()).expect("UTF-8");
    assert_eq!(get("tls.crt"), f.tls_crt);
    assert_eq!(get("tls.key"), f.tls_key);
    assert_eq!(get("ca.crt"), f.ca_pem);

    // The key belongs to the certificate.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    use rustls::pki_types::pem::PemObject as _;
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(f.tls_key.as_bytes()).expect("a PEM key");
    rustls::sign::CertifiedKey::from_der(pem_certs(&f.tls_crt), key, &provider)
        .expect("tls.key matches tls.crt");

    // Verified as the kube-apiserver (`<service>.<namespace>.svc`) and agents do, for every
    // Service of the server.
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(&f.ca_pem) {
        roots.add(c).expect("CA");
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .expect("verifier");
    let chain = pem_certs(&f.tls_crt);
    let services: Vec<Service> = all(docs, "Service");
    assert_eq!(services.len(), 2);
    for svc in &services {
        let name = format!(
            "{}.{}.svc",
            svc.metadata.name.as_deref().expect("name"),
            svc.metadata.namespace.as_deref().expect("namespace")
        );
        let server_name = rustls::pki_types::ServerName::try_from(name.clone()).expect("DNS name");
        verifier
            .verify_server_cert(
                &chain[0],
                &chain[1..],
                &server_name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .unwrap_or_else(|e| panic!("the serving certificate is not valid for {name}: {e}"));
    }

    // The flags name files of the Secret's volume.
    let deployment = server(docs);
    let spec = pod_spec_of_deployment(&deployment);
    let c = only_container(spec);
    let fl = flags(c);
    assert!(
        !fl.contains_key("cert-dir"),
        "a self-signed cert-dir would fail caBundle"
    );
    for (flag_name, key) in [
        ("tls-cert-file", "tls.crt"),
        ("tls-private-key-file", "tls.key"),
    ] {
        let file = Path::new(flag(&fl, flag_name));
        let dir = file.parent().expect("dir").to_str().expect("UTF-8");
        let v = volume(spec, c, dir);
        let s = v.secret.as_ref().expect("a Secret volume");
        assert_eq!(s.secret_name.as_deref(), Some(SECRET));
        let item = s
            .items
            .iter()
            .flatten()
            .find(|i| Path::new(dir).join(&i.path) == file)
            .unwrap_or_else(|| panic!("--{flag_name} is not a file of the volume"));
        assert_eq!(item.key, key);
        // Readable by the pod's group (fsGroup), not by others.
        let mode = item.mode.or(s.default_mode).expect("mode");
        assert_eq!(mode & 0o007, 0, "--{flag_name} readable by others");
        assert_ne!(mode & 0o040, 0, "--{flag_name} not readable by the group");
        let psc = spec.security_context.as_ref().expect("securityContext");
        assert_eq!(psc.fs_group, psc.run_as_group);
    }
}

/// One granted right, expanded from a rule and its binding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    sa: String,
    verb: String,
    group: String,
    resource: String,
    /// `None`: cluster-wide (a ClusterRoleBinding).
    namespace: Option<String>,
    /// Empty: every object.
    names: Vec<String>,
    via: String,
}

fn check_rule_is_tame(role: &str, r: &PolicyRule) {
    let lists = [
        ("verbs", Some(&r.verbs)),
        ("apiGroups", r.api_groups.as_ref()),
        ("resources", r.resources.as_ref()),
    ];
    for (what, list) in lists {
        let list = list.unwrap_or_else(|| panic!("{role}: a rule without {what}"));
        assert!(!list.is_empty(), "{role}: empty {what}");
        assert!(
            !list.iter().any(|s| s.contains('*')),
            "{role}: wildcard in {what}"
        );
    }
    assert!(r.non_resource_urls.is_none(), "{role}: nonResourceURLs");
    // The one subresource: the kubelets' resource metrics (read-only, what metrics-server's
    // ClusterRole grants), for the kubelet fallback.
    for res in r.resources.iter().flatten() {
        assert!(
            !res.starts_with("secrets") && (!res.contains('/') || res == "nodes/metrics"),
            "{role}: grants {res}"
        );
    }
    for v in &r.verbs {
        assert!(
            ["get", "list", "watch", "create"].contains(&v.as_str()),
            "{role}: verb {v}"
        );
    }
}

fn grants(docs: &[Value]) -> Vec<Grant> {
    // Roles by (namespace, name); ours first, then the cluster's bootstrap ones.
    let mut roles: BTreeMap<(Option<String>, String), Vec<PolicyRule>> = BTreeMap::new();
    for cr in all::<ClusterRole>(docs, "ClusterRole") {
        let name = cr.metadata.name.expect("name");
        assert!(cr.aggregation_rule.is_none(), "{name}: aggregationRule");
        let rules = cr.rules.unwrap_or_default();
        for r in &rules {
            check_rule_is_tame(&name, r);
        }
        roles.insert((None, name), rules);
    }
    for role in all::<Role>(docs, "Role") {
        let name = role.metadata.name.expect("name");
        let rules = role.rules.unwrap_or_default();
        for r in &rules {
            check_rule_is_tame(&name, r);
        }
        roles.insert((role.metadata.namespace, name), rules);
    }
    for (ns, name, rules) in bootstrap_roles() {
        let key = (ns.map(String::from), name.to_string());
        assert!(!roles.contains_key(&key), "{name} redefined");
        roles.insert(key, rules);
    }

    let mut out = Vec::new();
    let mut bind = |binding: &str,
                    namespace: Option<String>,
                    role_ref: &k8s_openapi::api::rbac::v1::RoleRef,
                    subjects: &[Subject]| {
        assert_eq!(role_ref.api_group, "rbac.authorization.k8s.io", "{binding}");
        let role_ns = match role_ref.kind.as_str() {
            "ClusterRole" => None,
            "Role" => {
                assert!(
                    namespace.is_some(),
                    "{binding}: a ClusterRoleBinding to a Role"
                );
                namespace.clone()
            }
            k => panic!("{binding}: roleRef kind {k}"),
        };
        let rules = roles
            .get(&(role_ns, role_ref.name.clone()))
            .unwrap_or_else(|| panic!("{binding}: no role {}", role_ref.name));
        for s in subjects {
            assert_eq!(s.kind, "ServiceAccount", "{binding}: subject {s:?}");
            assert_eq!(s.namespace.as_deref(), Some(NS), "{binding}: subject {s:?}");
            assert!(
                [SERVER, AGENT].contains(&s.name.as_str()),
                "{binding}: subject {}",
                s.name
            );
            for r in rules {
                for verb in &r.verbs {
                    for group in r.api_groups.iter().flatten() {
                        for resource in r.resources.iter().flatten() {
                            out.push(Grant {
                                sa: s.name.clone(),
                                verb: verb.clone(),
                                group: group.clone(),
                                resource: resource.clone(),
                                namespace: namespace.clone(),
                                names: r.resource_names.clone().unwrap_or_default(),
                                via: format!("{binding} → {}", role_ref.name),
                            });
                        }
                    }
                    for url in r.non_resource_urls.iter().flatten() {
                        assert!(namespace.is_none(), "{binding}: a URL in a Role");
                        out.push(Grant {
                            sa: s.name.clone(),
                            verb: verb.clone(),
                            group: URL.into(),
                            resource: url.clone(),
                            namespace: None,
                            names: Vec::new(),
                            via: format!("{binding} → {}", role_ref.name),
                        });
                    }
                }
            }
        }
    };
    for b in all::<ClusterRoleBinding>(docs, "ClusterRoleBinding") {
        let name = b.metadata.name.clone().expect("name");
        bind(
            &name,
            None,
            &b.role_ref,
            b.subjects.as_deref().unwrap_or_default(),
        );
    }
    for b in all::<RoleBinding>(docs, "RoleBinding") {
        let name = b.metadata.name.clone().expect("name");
        bind(
            &name,
            Some(b.metadata.namespace.clone().expect("namespace")),
            &b.role_ref,
            b.subjects.as_deref().unwrap_or_default(),
        );
    }
    out
}

fn allows(g: &Grant, c: &Call) -> bool {
    g.sa == c.sa
        && g.verb == c.verb
        && g.group == c.group
        && g.resource == c.resource
        && (g.namespace.is_none() || g.namespace.as_deref() == c.namespace)
        && (g.names.is_empty() || c.name.is_some_and(|n| g.names.iter().any(|x| x == n)))
}

/// Whether a grant is no wider than the table entry: same scope, same objects.
fn within(g: &Grant, c: &Call) -> bool {
    g.sa == c.sa
        && g.verb == c.verb
        && g.group == c.group
        && g.resource == c.resource
        && g.namespace.as_deref() == c.namespace
        && match c.name {
            None => true,
            Some(n) => g.names == [n],
        }
}

#[test]
fn rbac_grants_exactly_what_the_binaries_call() {
    let f = fixture();
    for (i, docs) in [&f.base, &f.ha].into_iter().enumerate() {
        let grants = grants(docs);
        for c in CALLS {
            let needed = !matches!(c.why, Why::Bundled(_));
            let via: Vec<&str> = grants
                .iter()
                .filter(|g| allows(g, c))
                .map(|g| g.via.as_str())
                .collect();
            assert!(
                !needed || !via.is_empty(),
                "not granted: {} {} {}/{} in {:?} ({})",
                c.sa,
                c.verb,
                c.group,
                c.resource,
                c.namespace,
                c.why
            );
            // The table as granted (visible with --nocapture).
            if i > 0 {
                continue;
            }
            println!(
                "{:<22} {:<6} {:<22} {:<20} {:<12} {:<34} {} [{}]",
                c.sa,
                c.verb,
                if c.group.is_empty() { "\"\"" } else { c.group },
                c.resource,
                c.namespace.unwrap_or("(cluster)"),
                c.name.unwrap_or("*"),
                c.why,
                via.join("; ")
            );
        }
        for g in &grants {
            assert!(
                CALLS.iter().any(|c| within(g, c)),
                "granted but called by nothing in the table: {g:?}"
            );
        }
        // The agent: pods, list and watch, nothing else at all.
        let agent: BTreeSet<(&str, &str)> = grants
            .iter()
            .filter(|g| g.sa == AGENT)
            .map(|g| (g.resource.as_str(), g.verb.as_str()))
            .collect();
        assert_eq!(agent, BTreeSet::from([("pods", "list"), ("pods", "watch")]));
    }
}

#[test]
fn metrics_readers_are_aggregated_as_metrics_server_does() {
    let docs = &fixture().base;
    let cr: ClusterRole = one(docs, "ClusterRole", "system:aggregated-metrics-reader");
    let labels = cr.metadata.labels.clone().unwrap_or_default();
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            labels
                .get(&format!("rbac.authorization.k8s.io/aggregate-to-{role}"))
                .map(String::as_str),
            Some("true")
        );
    }
    let rules = cr.rules.expect("rules");
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert_eq!(
        r.api_groups.as_deref(),
        Some(&["metrics.k8s.io".to_string()][..])
    );
    let resources: BTreeSet<&str> = r.resources.iter().flatten().map(String::as_str).collect();
    assert_eq!(resources, BTreeSet::from(["pods", "nodes"]));
    let verbs: BTreeSet<&str> = r.verbs.iter().map(String::as_str).collect();
    assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]));
    assert!(r.resource_names.is_none());
}

#[test]
fn agent_pod_has_only_what_it_needs() {
    let docs = &fixture().base;
    let ds = agent(docs);
    let spec = pod_spec_of_daemonset(&ds);
    let c = only_container(spec);

    // Every node, whatever its taints.
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    assert_eq!(tolerations.len(), 1);
    let t = &tolerations[0];
    assert_eq!(t.operator.as_deref(), Some("Exists"));
    assert!(t.key.is_none() && t.effect.is_none() && t.value.is_none());
    assert!(t.toleration_seconds.is_none());
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );

    for (what, v) in [
        ("hostPID", spec.host_pid),
        ("hostNetwork", spec.host_network),
        ("hostIPC", spec.host_ipc),
    ] {
        assert_ne!(v, Some(true), "{what}");
    }
    let psc = spec.security_context.as_ref().expect("pod securityContext");
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );

    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    // uid 0: without ambient capabilities a non-root process loses added ones at exec.
    assert_eq!(sc.run_as_user, Some(0));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(added, BTreeSet::from(["BPF", "PERFMON"]));

    // Host paths: the cgroup hierarchy, read-only; nothing else of the host (BTF is in the
    // container's own sysfs, so that a node without it still starts the agent).
    let mut host_paths = BTreeMap::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(hp) = &v.host_path {
            host_paths.insert(v.name.clone(), hp.path.clone());
        }
    }
    assert_eq!(
        host_paths
            .values()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["/sys/fs/cgroup"])
    );
    for m in c.volume_mounts.iter().flatten() {
        assert_eq!(m.read_only, Some(true), "{} is writable", m.mount_path);
        assert!(m.mount_propagation.is_none(), "{}", m.mount_path);
        if let Some(p) = host_paths.get(&m.name) {
            assert_eq!(&m.mount_path, p, "host path mounted at its own place");
        }
        if m.mount_path == "/sys/fs/cgroup" {
            assert_eq!(m.recursive_read_only.as_deref(), Some("IfPossible"));
        }
    }
    assert!(c.ports.is_none(), "the agent listens on nothing");

    let res = c.resources.as_ref().expect("resources");
    for (what, q) in [("requests", &res.requests), ("limits", &res.limits)] {
        let q = q.as_ref().unwrap_or_else(|| panic!("no {what}"));
        assert!(q.contains_key("cpu") && q.contains_key("memory"), "{what}");
    }
}

#[test]
fn server_pod_meets_the_restricted_pod_security_level() {
    let f = fixture();
    for docs in [&f.base, &f.ha] {
        let d = server(docs);
        let spec = pod_spec_of_deployment(&d);
        let c = only_container(spec);
        let psc = spec.security_context.as_ref().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(65534));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_ne!(sc.privileged, Some(true));
        assert_ne!(sc.run_as_user, Some(0));
        let caps = sc.capabilities.as_ref().expect("capabilities");
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(caps.add.is_none());
        for (what, v) in [
            ("hostPID", spec.host_pid),
            ("hostNetwork", spec.host_network),
            ("hostIPC", spec.host_ipc),
        ] {
            assert_ne!(v, Some(true), "{what}");
        }
        for v in spec.volumes.iter().flatten() {
            assert!(v.host_path.is_none(), "{}: hostPath", v.name);
        }
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-cluster-critical")
        );
        assert_eq!(spec.service_account_name.as_deref(), Some(SERVER));
        let res = c.resources.as_ref().expect("resources");
        assert!(res.requests.as_ref().is_some_and(|r| r.contains_key("cpu")));
        assert!(res
            .limits
            .as_ref()
            .is_some_and(|r| r.contains_key("memory")));
    }
}

#[test]
fn base_spreads_two_replicas_and_ha_three_on_distinct_nodes() {
    let f = fixture();
    let labels = pod_labels_of_deployment(&server(&f.base));

    let base = server(&f.base);
    assert_eq!(base.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let anti = pod_spec_of_deployment(&base)
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("podAntiAffinity");
    assert!(anti
        .required_during_scheduling_ignored_during_execution
        .is_none());
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .as_deref()
        .expect("preferred");
    assert_eq!(preferred.len(), 1);
    let term = &preferred[0].pod_affinity_term;
    assert_eq!(term.topology_key, "kubernetes.io/hostname");
    assert!(selects(
        term.label_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("matchLabels"),
        &labels
    ));
    let pdb: PodDisruptionBudget = one(&f.base, "PodDisruptionBudget", SERVER);
    let pspec = pdb.spec.as_ref().expect("spec");
    assert_eq!(pspec.min_available, Some(IntOrString::Int(1)));
    // Unready replicas never block a drain.
    assert_eq!(
        pspec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    assert!(pspec.max_unavailable.is_none());
    assert!(selects(
        pspec
            .selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("matchLabels"),
        &labels
    ));

    let ha = server(&f.ha);
    assert_eq!(ha.spec.as_ref().and_then(|s| s.replicas), Some(3));
    let hspec = pod_spec_of_deployment(&ha);
    let anti = hspec
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("podAntiAffinity");
    assert!(anti
        .preferred_during_scheduling_ignored_during_execution
        .is_none());
    let required = anti
        .required_during_scheduling_ignored_during_execution
        .as_deref()
        .expect("required");
    assert_eq!(required.len(), 1);
    assert_eq!(required[0].topology_key, "kubernetes.io/hostname");
    assert!(selects(
        required[0]
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("matchLabels"),
        &labels
    ));
    let spread = hspec
        .topology_spread_constraints
        .as_deref()
        .expect("topologySpreadConstraints");
    assert!(spread
        .iter()
        .any(|t| t.topology_key == "topology.kubernetes.io/zone"));
    let pdb: PodDisruptionBudget = one(&f.ha, "PodDisruptionBudget", SERVER);
    let pspec = pdb.spec.as_ref().expect("spec");
    assert!(pspec.min_available.is_none());
    assert_eq!(pspec.max_unavailable, Some(IntOrString::Int(1)));

    // The overlay changes the Deployment and the PDB, nothing else.
    let others = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                !(d["metadata"]["name"] == SERVER
                    && (d["kind"] == "Deployment" || d["kind"] == "PodDisruptionBudget"))
            })
            .cloned()
            .collect()
    };
    assert_eq!(others(&f.base), others(&f.ha));
}

fn peer_selects(peers: Option<&Vec<NetworkPolicyPeer>>, labels: &BTreeMap<String, String>) -> bool {
    peers.is_some_and(|peers| {
        peers.len() == 1
            && peers[0].namespace_selector.is_none()
            && peers[0].ip_block.is_none()
            && peers[0]
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .is_some_and(|m| selects(m, labels))
    })
}

fn port_set(ports: Option<&Vec<NetworkPolicyPort>>) -> BTreeSet<(String, i32)> {
    ports
        .expect("ports")
        .iter()
        .map(|p| {
            let n = match p.port.as_ref().expect("port") {
                IntOrString::Int(n) => *n,
                IntOrString::String(s) => panic!("name the port number, not {s}"),
            };
            assert!(p.end_port.is_none());
            (p.protocol.clone().expect("protocol"), n)
        })
        .collect()
}

#[test]
fn network_policies_open_only_the_api_and_ingest_paths() {
    let docs = &fixture().base;
    let server_d = server(docs);
    let server_labels = pod_labels_of_deployment(&server_d);
    let sflags = flags(only_container(pod_spec_of_deployment(&server_d)));
    let secure: i32 = flag(&sflags, "secure-port").parse().expect("port");
    let ingest: i32 = flag(&sflags, "ingest-port").parse().expect("port");
    let agent_labels = pod_labels_of_daemonset(&agent(docs));
    let tcp = |n: i32| ("TCP".to_string(), n);

    let np: NetworkPolicy = one(docs, "NetworkPolicy", SERVER);
    let spec = np.spec.as_ref().expect("spec");
    assert!(selects(
        spec.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("podSelector"),
        &server_labels
    ));
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_string()][..])
    );
    let ingress = spec.ingress.as_deref().expect("ingress");
    assert_eq!(ingress.len(), 2);
    // The API port from anywhere (the kube-apiserver is not selectable).
    assert!(ingress[0].from.is_none());
    assert_eq!(
        port_set(ingress[0].ports.as_ref()),
        BTreeSet::from([tcp(secure)])
    );
    // The ingest port from the agents only.
    assert!(peer_selects(ingress[1].from.as_ref(), &agent_labels));
    assert_eq!(
        port_set(ingress[1].ports.as_ref()),
        BTreeSet::from([tcp(ingest)])
    );

    let np: NetworkPolicy = one(docs, "NetworkPolicy", AGENT);
    let spec = np.spec.as_ref().expect("spec");
    assert!(selects(
        spec.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("podSelector"),
        &agent_labels
    ));
    let types: BTreeSet<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    // Egress is left open in the base: API and DNS ports differ between distributions
    // (deploy/components/agent-egress restricts it where they are known).
    assert_eq!(types, BTreeSet::from(["Ingress"]));
    assert!(
        spec.ingress.as_deref().unwrap_or_default().is_empty(),
        "nothing in"
    );
    assert!(spec.egress.is_none(), "egress rules in the base");
}

/// The opt-in egress restriction, rendered over the base as an operator's overlay would.
#[test]
fn agent_egress_component_restricts_the_agent() {
    let tmp = temp_dir("egress");
    let deploy = tmp.join("deploy");
    copy_tree(&repo().join("deploy"), &deploy);
    let overlay = tmp.join("overlay");
    fs::create_dir_all(&overlay).expect("mkdir");
    fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/base\ncomponents:\n  - ../deploy/components/agent-egress\n",
    )
    .expect("write");
    let docs = render(&overlay);
    let _ = fs::remove_dir_all(&tmp);
    let d = server(&docs);
    let ingest: i32 = flag(
        &flags(only_container(pod_spec_of_deployment(&d))),
        "ingest-port",
    )
    .parse()
    .expect("port");
    let server_labels = pod_labels_of_deployment(&d);
    let tcp = |n: i32| ("TCP".to_string(), n);
    let udp = |n: i32| ("UDP".to_string(), n);
    let np: NetworkPolicy = one(&docs, "NetworkPolicy", AGENT);
    let spec = np.spec.as_ref().expect("spec");
    let types: BTreeSet<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    assert_eq!(types, BTreeSet::from(["Ingress", "Egress"]));
    let egress = spec.egress.as_deref().expect("egress");
    assert_eq!(egress.len(), 3);
    assert!(peer_selects(egress[0].to.as_ref(), &server_labels));
    assert_eq!(
        port_set(egress[0].ports.as_ref()),
        BTreeSet::from([tcp(ingest)])
    );
    assert!(egress[1].to.is_none());
    assert_eq!(
        port_set(egress[1].ports.as_ref()),
        BTreeSet::from([tcp(443), tcp(6443)])
    );
    assert!(egress[2].to.is_none());
    assert_eq!(
        port_set(egress[2].ports.as_ref()),
        BTreeSet::from([udp(53), tcp(53)])
    );
}

#[test]
fn images_are_named_in_one_place() {
    let docs = &fixture().base;
    let d = server(docs);
    let ds = agent(docs);
    let images = [
        only_container(pod_spec_of_deployment(&d)).image.clone(),
        only_container(pod_spec_of_daemonset(&ds)).image.clone(),
    ];
    assert_eq!(
        images,
        [
            Some("ghcr.io/kpulse/kpulse-aggregator-api:0.1.0".to_string()),
            Some("ghcr.io/kpulse/kpulse-agent:0.1.0".to_string())
        ]
    );
    // Only deploy/base/kustomization.yaml names the registry.
    fn walk(dir: &Path, hits: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if e.file_name() == "generated" {
                continue;
            }
            if p.is_dir() {
                walk(&p, hits);
            } else if fs::read_to_string(&p).is_ok_and(|t| t.contains("ghcr.io")) {
                hits.push(p);
            }
        }
    }
    let mut hits = Vec::new();
    walk(&repo().join("deploy"), &mut hits);
    hits.retain(|p| !p.ends_with("README.md"));
    assert_eq!(hits, [repo().join("deploy/base/kustomization.yaml")]);
}

fn known_longs(cmd: &clap::Command) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(String::from))
        .collect();
    for sub in cmd.get_subcommands() {
        out.extend(known_longs(sub));
    }
    out
}

#[test]
fn flags_are_the_binaries_own() {
    let docs = &fixture().base;

    // The server: every flag it knows parses and validates; the rest must be pending.
    let c = only_container(pod_spec_of_deployment(&server(docs))).clone();
    assert!(
        c.command.is_none(),
        "the image's ENTRYPOINT runs the binary"
    );
    let cmd = kpulse_aggregator_api::config::Config::command();
    let known = known_longs(&cmd);
    let mut args = vec!["kpulse-aggregator-api".to_string()];
    for (k, v) in flags(&c) {
        assert!(
            known.contains(&k),
            "kpulse-aggregator-api has no flag --{k}"
        );
        args.push(format!("--{k}={v}"));
    }
    let cfg = <kpulse_aggregator_api::config::Config as clap::Parser>::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("kpulse-aggregator-api {args:?}: {e}"));
    cfg.validate().expect("valid server flags");
    assert_eq!(cfg.secure_port, 10250);
    assert_eq!(cfg.metric_expiry, std::time::Duration::from_secs(10));
    assert!(cfg
        .authorization_always_allow_paths
        .iter()
        .any(|p| p == "/livez"));
    assert!(cfg
        .authorization_always_allow_paths
        .iter()
        .any(|p| p == "/readyz"));

    // The agent: once `run` exists, the whole command line parses.
    let ds = agent(docs);
    let c = only_container(pod_spec_of_daemonset(&ds)).clone();
    assert!(
        c.command.is_none(),
        "the image's ENTRYPOINT runs the binary"
    );
    let cmd = kpulse_agent::config::Cli::command();
    let args: Vec<String> = std::iter::once("kpulse-agent".to_string())
        .chain(
            c.args
                .iter()
                .flatten()
                .map(|a| a.replace("$(NODE_NAME)", "node-1")),
        )
        .collect();
    assert!(cmd.find_subcommand("run").is_some(), "kpulse-agent run");
    <kpulse_agent::config::Cli as clap::Parser>::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("kpulse-agent {args:?}: {e}"));
}

/// One stage of the Containerfile: its `FROM` line (after `FROM `), `USER`s and `ENTRYPOINT`.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    users: Vec<String>,
    entrypoint: String,
}

/// The Containerfile's stages by name (`AS <name>`).
fn containerfile_stages() -> BTreeMap<String, Stage> {
    let text = fs::read_to_string(repo().join("Containerfile")).expect("Containerfile");
    let mut stages = BTreeMap::new();
    let mut current: Option<(String, Stage)> = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("FROM ") {
            if let Some((name, stage)) = current.take() {
                stages.insert(name, stage);
            }
            let (from, name) = rest.rsplit_once(" AS ").expect("every stage is named");
            current = Some((
                name.trim().to_string(),
                Stage {
                    from: from.trim().to_string(),
                    ..Stage::default()
                },
            ));
        } else if let Some((_, stage)) = current.as_mut() {
            if let Some(rest) = line.strip_prefix("USER ") {
                stage.users.push(rest.to_string());
            } else if let Some(rest) = line.strip_prefix("ENTRYPOINT ") {
                stage.entrypoint = rest.to_string();
            }
        }
    }
    if let Some((name, stage)) = current {
        stages.insert(name, stage);
    }
    stages
}

#[test]
fn the_containerfile_builds_both_images_from_the_repository_alone() {
    let stages = containerfile_stages();
    assert_eq!(
        stages.keys().map(String::as_str).collect::<Vec<_>>(),
        ["agent", "aggregator-api", "build", "toolchain"]
    );
    // The toolchain runs on the build machine and cross-compiles: one toolchain, every target.
    assert_eq!(
        stages["toolchain"].from,
        "--platform=$BUILDPLATFORM docker.io/library/debian:bookworm"
    );
    assert_eq!(stages["build"].from, "toolchain");
    let docs = &fixture().base;
    let server_uid = pod_spec_of_deployment(&server(docs))
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .expect("uid");
    for (stage, runtime, user) in [
        (
            "aggregator-api",
            "--platform=$TARGETPLATFORM gcr.io/distroless/cc-debian12:nonroot",
            Some(format!("{server_uid}:{server_uid}")),
        ),
        (
            "agent",
            "--platform=$TARGETPLATFORM gcr.io/distroless/cc-debian12",
            None,
        ),
    ] {
        let s = &stages[stage];
        assert_eq!(s.from, runtime, "{stage}: runtime image");
        assert_eq!(s.users.last().cloned(), user, "{stage}: USER");
        assert_eq!(
            s.entrypoint,
            format!("[\"/usr/local/bin/kpulse-{stage}\"]"),
            "{stage}: ENTRYPOINT"
        );
    }
    // Nothing of the host: no target/ in the context, and nothing copied from it.
    let text = fs::read_to_string(repo().join("Containerfile")).expect("Containerfile");
    assert!(
        !text.contains("COPY target"),
        "a host artefact is copied in"
    );
    let ignore = fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    assert!(ignore.lines().any(|l| l == "target/"));
    assert!(
        !ignore.lines().any(|l| l.starts_with('!')),
        "nothing is re-included: {ignore}"
    );
    // The build script the build stage runs is in the context.
    assert!(text.contains("sh images/build.sh \"$TARGETARCH\" /out"));
    assert!(repo().join("images/build.sh").is_file());
}

/// The images are manifest lists for amd64 and arm64: both workloads select Linux nodes of
/// any architecture; and the critical PriorityClasses they use are covered by a
/// ResourceQuota in their namespace.
#[test]
fn workloads_select_what_the_images_run_on_and_their_priority_is_admitted() {
    let docs = &fixture().base;
    for spec in [
        pod_spec_of_deployment(&server(docs)),
        pod_spec_of_daemonset(&agent(docs)),
    ] {
        let sel = spec.node_selector.as_ref().expect("nodeSelector");
        assert_eq!(
            sel.get("kubernetes.io/os").map(String::as_str),
            Some("linux")
        );
        assert_eq!(
            sel.get("kubernetes.io/arch"),
            None,
            "both architectures' nodes run the images"
        );
        let class = spec
            .priority_class_name
            .as_deref()
            .expect("priorityClassName");
        let quota: ResourceQuota = one(docs, "ResourceQuota", "kpulse-critical-pods");
        let expr = &quota
            .spec
            .as_ref()
            .and_then(|s| s.scope_selector.as_ref())
            .and_then(|s| s.match_expressions.as_ref())
            .expect("scopeSelector")[0];
        assert_eq!(expr.scope_name, "PriorityClass");
        assert_eq!(expr.operator, "In");
        assert!(
            expr.values.iter().flatten().any(|v| v == class),
            "{class} not covered by the quota"
        );
    }
}

/// A fresh clone has no deploy/generated: the base must still render (GitOps tools and
/// cert-manager overlays use it), with no certificate material in it.
#[test]
fn the_base_renders_on_a_fresh_clone() {
    let tmp = temp_dir("fresh");
    let deploy = tmp.join("deploy");
    copy_tree(&repo().join("deploy"), &deploy);
    assert!(!deploy.join("generated").exists());
    let docs = render(&deploy.join("base"));
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert!(
        kinds.contains(&"Deployment") && kinds.contains(&"DaemonSet"),
        "{kinds:?}"
    );
    assert!(
        !kinds.contains(&"Secret"),
        "certificate material in the base: {kinds:?}"
    );
    for d in docs.iter().filter(|d| d["kind"] == "APIService") {
        assert!(d["spec"].get("caBundle").is_none(), "{}", describe(d));
    }
    let _ = fs::remove_dir_all(&tmp);
}

#[test]
fn generated_material_stays_out_of_git() {
    let out = Command::new("git")
        .args(["check-ignore", "-q", "deploy/generated/tls.key"])
        .current_dir(repo())
        .status()
        .expect("git");
    assert!(out.success(), "deploy/generated is not ignored");
}

#[test]
fn certs_keeps_the_ca_and_renews_the_serving_certificate() {
    let dir = temp_dir("certs");
    xtask_certs(&dir, &[]);
    let read = |n: &str| fs::read_to_string(dir.join(n)).expect(n);
    let (ca1, tls1) = (read("ca.crt"), read("tls.crt"));
    for secret in ["ca.key", "tls.key", "serving-cert.yaml"] {
        let mode = fs::metadata(dir.join(secret))
            .expect(secret)
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{secret} is readable by others: {mode:o}");
    }
    xtask_certs(&dir, &[]);
    assert_eq!(read("ca.crt"), ca1, "the CA is reused");
    assert_ne!(read("tls.crt"), tls1, "a new serving certificate");
    assert!(read("apiservice-cabundle.yaml").contains(&b64(ca1.as_bytes())));
    xtask_certs(&dir, &["--new-ca"]);
    assert_ne!(read("ca.crt"), ca1, "--new-ca");
    // A CA key that does not match its certificate is refused.
    fs::write(dir.join("ca.crt"), &ca1).expect("write");
    let status = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("certs")
        .arg("--out")
        .arg(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run");
    assert!(!status.success(), "a mismatched CA key must be refused");
    let _ = fs::remove_dir_all(&dir);
}
