//! The Kubernetes API double of the integration tests: the two review APIs the servers call
//! (TokenReview, SubjectAccessReview), answered by a function of the test's, on loopback.
//!
//! A real kube-apiserver runs in the cluster tests (`cargo xtask cluster check`); this
//! double is for the tests that run a server alone, where the answers must be chosen (a
//! denied user, an agent's bound token, an API that goes away).

use std::convert::Infallible;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// The service account the agents run as in the tests.
pub const AGENT: &str = "system:serviceaccount:kpulse-system:kpulse-agent";

/// `review(kind, spec)` → `status`; `kind` is `tokenreviews` or `subjectaccessreviews`.
pub type Review = dyn Fn(&str, &Value) -> Value + Send + Sync;

/// A stand-in for the Kubernetes API on `127.0.0.1`: answers every POST with its body and
/// `status` = the review function's answer, and records every `(kind, spec)` it was sent.
/// Stops (closing every connection) when dropped or [`ReviewApi::stop`]ped.
pub struct ReviewApi {
    port: u16,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReviewApi {
    /// Serves `review` on a port of its own, from a thread of its own.
    pub fn start(review: Arc<Review>) -> ReviewApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the review API");
        let port = listener.local_addr().expect("review API address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("review API runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (tcp, _) = tokio::select! {
                        _ = &mut rx => return,
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    };
                    let (review, record) = (review.clone(), record.clone());
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                            let (review, record) = (review.clone(), record.clone());
                            async move { Ok::<_, Infallible>(answer(req, &*review, &record).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), svc)
                            .await;
                    });
                }
            });
        });
        ReviewApi {
            port,
            seen,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// [`ReviewApi::start`] with [`standard_review`].
    pub fn standard() -> ReviewApi {
        ReviewApi::start(Arc::new(standard_review))
    }

    /// A kubeconfig for a server that authenticates to this API with `server-token`,
    /// written as `dir/api-kubeconfig`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        self.kubeconfig_with_token(dir, "server-token")
    }

    /// A kubeconfig for a server that authenticates to this API with `token`.
    pub fn kubeconfig_with_token(&self, dir: &Path, token: &str) -> PathBuf {
        let path = dir.join("api-kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: api\n  cluster:\n    \
                 server: http://127.0.0.1:{}\nusers:\n- name: server\n  user: {{token: \
                 {token}}}\ncontexts:\n- name: api\n  context: {{cluster: api, user: \
                 server}}\ncurrent-context: api\n",
                self.port
            ),
        )
        .expect("api kubeconfig");
        path
    }

    /// Every `(kind, spec)` received so far, in order.
    pub fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// How many reviews of `kind` were received.
    pub fn reviews(&self, kind: &str) -> usize {
        self.seen().iter().filter(|(k, _)| k == kind).count()
    }

    /// The users SubjectAccessReviews were asked about, in order.
    pub fn reviewed_users(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|(k, _)| k == "subjectaccessreviews")
            .map(|(_, spec)| spec["user"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Closes the port and every connection: from now on the API is unreachable.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ReviewApi {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn answer(
    req: http::Request<Incoming>,
    review: &Review,
    record: &Mutex<Vec<(String, Value)>>,
) -> http::Response<Full<Bytes>> {
    let kind = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut v: Value = serde_json::from_slice(&body).unwrap_or_default();
    let status = review(&kind, &v["spec"]);
    if let Ok(mut seen) = record.lock() {
        seen.push((kind, v["spec"].clone()));
    }
    v["status"] = status;
    http::Response::new(Full::new(Bytes::from(v.to_string())))
}

/// The usual answers. Tokens: `kpulse-test` is user `tester` (group `dev`), `denied-token`
/// user `nobody`, and `node-a-token`, for audience `kpulse` only, the agent bound to
/// node-a ([`AGENT`]); anything else does not authenticate. SubjectAccessReviews allow
/// `tester` only, with a reason otherwise.
pub fn standard_review(kind: &str, spec: &Value) -> Value {
    if kind == "tokenreviews" {
        let kpulse = spec["audiences"] == json!(["kpulse"]);
        match spec["token"].as_str().unwrap_or_default() {
            "kpulse-test" => {
                json!({"authenticated": true, "user": {"username": "tester", "groups": ["dev"]}})
            }
            "denied-token" => json!({"authenticated": true, "user": {"username": "nobody"}}),
            "node-a-token" if kpulse => json!({"authenticated": true, "audiences": ["kpulse"],
                "user": {"username": AGENT,
                         "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}}}),
            _ => json!({"authenticated": false}),
        }
    } else if spec["user"] == "tester" {
        json!({"allowed": true})
    } else {
        json!({"allowed": false, "denied": true, "reason": "not in the test's list"})
    }
}
