//! `metav1.Status` error bodies as k8s.io/apimachinery's `errors` package and
//! k8s.io/apiserver's `responsewriters` word them, and Go's `strconv.Quote`, which their
//! messages use. Below both the API ([`crate::api`]) and authentication ([`crate::auth`]);
//! the errors only the metrics API sends are in [`crate::api::types`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::go;
use crate::json::{non_empty, non_empty_vec, Adapted, GoListMeta, GoSeq};

/// A `metav1.Status` error body, serialized in Go's order:
/// `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":…,
/// "reason":…,"details":{"name":…,"group":…,"kind":…},"code":…}`.
///
/// `k8s_openapi`'s own `Status` serializes alphabetically (`apiVersion`, `kind`, `code`, …),
/// hence this wrapper. The constructors reproduce `k8s.io/apimachinery/pkg/api/errors` and
/// `k8s.io/apiserver` (`responsewriters.ErrorToAPIStatus`, which always sets
/// `kind: Status`, `apiVersion: v1` and a non-zero code).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status(pub Box<meta::Status>);

/// The request attributes an authorization denial is worded from
/// (`k8s.io/apiserver` `authorizer.Attributes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestAttributes<'a> {
    /// The user's name.
    pub user: &'a str,
    /// The verb (`get`, `list`, `watch`, …).
    pub verb: &'a str,
    /// Whether this is a resource request (`/apis/<group>/<version>/…`) rather than a path.
    pub resource_request: bool,
    /// The request path, for non-resource requests.
    pub path: &'a str,
    /// The API group, e.g. `metrics.k8s.io`.
    pub api_group: &'a str,
    /// The resource as in the URL, e.g. `nodes`, `pods`.
    pub resource: &'a str,
    /// The subresource, or empty.
    pub subresource: &'a str,
    /// The namespace, or empty.
    pub namespace: &'a str,
    /// The object's name, or empty for collections.
    pub name: &'a str,
}

impl Status {
    pub(crate) fn failure(
        code: i32,
        reason: &str,
        message: String,
        details: Option<meta::StatusDetails>,
    ) -> Self {
        Self(Box::new(meta::Status {
            code: Some(code),
            details,
            message: Some(message),
            metadata: ListMeta::default(),
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            status: Some("Failure".to_owned()),
        }))
    }

    /// The HTTP status code to send with this body (500 when unset, as the apiserver does).
    pub fn code(&self) -> u16 {
        self.0
            .code
            .and_then(|code| u16::try_from(code).ok())
            .filter(|code| *code != 0)
            .unwrap_or(500)
    }

    /// `errors.NewNotFound(schema.GroupResource{group, resource}, name)`:
    /// 404, `<resource>[.<group>] "<name>" not found`, details `name`, `group`, `kind`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let message = format!(
            "{} {} not found",
            group_resource(group, resource),
            go::quote(name)
        );
        Self::failure(
            404,
            "NotFound",
            message,
            Some(meta::StatusDetails {
                name: Some(name.to_owned()),
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewBadRequest(message)`: 400, reason `BadRequest`, no details.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::failure(400, "BadRequest", message.into(), None)
    }

    /// What the apiserver sends for an error that is not a `StatusError` (e.g.
    /// metrics-server's `failed reading nodes metrics: …`): 500, no reason, the error text as
    /// the message (`responsewriters.ErrorToAPIStatus`).
    pub fn plain_error(message: impl Into<String>) -> Self {
        Self::failure(500, "", message.into(), None)
    }

    /// `errors.NewInternalError(err)`: 500, reason `InternalError`,
    /// `Internal error occurred: <err>`, the error text also as the one cause.
    pub fn internal_error(error: &str) -> Self {
        Self::failure(
            500,
            "InternalError",
            format!("Internal error occurred: {error}"),
            Some(meta::StatusDetails {
                causes: Some(vec![meta::StatusCause {
                    message: Some(error.to_owned()),
                    ..meta::StatusCause::default()
                }]),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewServiceUnavailable(message)`: 503, reason `ServiceUnavailable`.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::failure(503, "ServiceUnavailable", message.into(), None)
    }

    /// `errors.NewUnauthorized(reason)`: 401; the authentication filter uses
    /// `"Unauthorized"`, an empty reason becomes `"not authorized"`.
    pub fn unauthorized(reason: &str) -> Self {
        let message = if reason.is_empty() {
            "not authorized"
        } else {
            reason
        };
        Self::failure(401, "Unauthorized", message.to_owned(), None)
    }

    /// An authorization denial as `responsewriters.ForbiddenStatusError` words it, e.g.
    /// `nodes.metrics.k8s.io is forbidden: User "bob" cannot list resource "nodes" in API
    /// group "metrics.k8s.io" at the cluster scope`; `reason` (the authorizer's, possibly
    /// empty) is appended after `": "`.
    pub fn forbidden(attributes: &RequestAttributes<'_>, reason: &str) -> Self {
        let mut error = sanitize_html(&forbidden_message(attributes));
        if !reason.is_empty() {
            error.push_str(": ");
            error.push_str(reason);
        }
        let (group, resource, name) = (attributes.api_group, attributes.resource, attributes.name);
        let message = if group.is_empty() && resource.is_empty() {
            format!("forbidden: {error}")
        } else if name.is_empty() {
            format!("{} is forbidden: {error}", group_resource(group, resource))
        } else {
            format!(
                "{} {} is forbidden: {error}",
                group_resource(group, resource),
                go::quote(name)
            )
        };
        Self::failure(
            403,
            "Forbidden",
            message,
            Some(meta::StatusDetails {
                name: Some(name.to_owned()),
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewMethodNotSupported(gr, action)`: 405, reason `MethodNotAllowed`,
    /// `<action> is not supported on resources of kind "<resource>[.<group>]"`.
    pub fn method_not_supported(group: &str, resource: &str, action: &str) -> Self {
        Self::failure(
            405,
            "MethodNotAllowed",
            format!(
                "{action} is not supported on resources of kind {}",
                go::quote(&group_resource(group, resource))
            ),
            Some(meta::StatusDetails {
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewTooManyRequests(message, retryAfterSeconds)`: 429, reason
    /// `TooManyRequests`, the retry delay in the details.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: i32) -> Self {
        Self::failure(
            429,
            "TooManyRequests",
            message.into(),
            Some(meta::StatusDetails {
                retry_after_seconds: Some(retry_after_seconds),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// The apiserver's `errNotAcceptable` (e.g. a Table asked for in another group version):
    /// 406, reason `NotAcceptable`.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::failure(406, "NotAcceptable", message.into(), None)
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = &self.0;
        let mut state = serializer.serialize_struct("Status", 8)?;
        state.serialize_field("kind", "Status")?;
        state.serialize_field("apiVersion", "v1")?;
        state.serialize_field("metadata", &GoListMeta(&s.metadata))?;
        if let Some(v) = non_empty(&s.status) {
            state.serialize_field("status", v)?;
        }
        if let Some(v) = non_empty(&s.message) {
            state.serialize_field("message", v)?;
        }
        if let Some(v) = non_empty(&s.reason) {
            state.serialize_field("reason", v)?;
        }
        if let Some(v) = &s.details {
            state.serialize_field("details", &Adapted(v))?;
        }
        if let Some(v) = s.code.filter(|code| *code != 0) {
            state.serialize_field("code", &v)?;
        }
        state.end()
    }
}

impl Serialize for Adapted<'_, meta::StatusDetails> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let mut state = serializer.serialize_struct("StatusDetails", 6)?;
        if let Some(v) = non_empty(&d.name) {
            state.serialize_field("name", v)?;
        }
        if let Some(v) = non_empty(&d.group) {
            state.serialize_field("group", v)?;
        }
        if let Some(v) = non_empty(&d.kind) {
            state.serialize_field("kind", v)?;
        }
        if let Some(v) = non_empty(&d.uid) {
            state.serialize_field("uid", v)?;
        }
        if let Some(v) = non_empty_vec(&d.causes) {
            state.serialize_field("causes", &GoSeq(v))?;
        }
        if let Some(v) = d.retry_after_seconds.filter(|v| *v != 0) {
            state.serialize_field("retryAfterSeconds", &v)?;
        }
        state.end()
    }
}

impl Serialize for Adapted<'_, meta::StatusCause> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut state = serializer.serialize_struct("StatusCause", 3)?;
        if let Some(v) = non_empty(&c.reason) {
            state.serialize_field("reason", v)?;
        }
        if let Some(v) = non_empty(&c.message) {
            state.serialize_field("message", v)?;
        }
        if let Some(v) = non_empty(&c.field) {
            state.serialize_field("field", v)?;
        }
        state.end()
    }
}

/// `schema.GroupResource.String()`: `resource` or `resource.group`.
fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// `responsewriters.forbiddenMessage`.
fn forbidden_message(a: &RequestAttributes<'_>) -> String {
    let user = go::quote(a.user);
    if !a.resource_request {
        return format!("User {user} cannot {} path {}", a.verb, go::quote(a.path));
    }
    let resource = if a.subresource.is_empty() {
        a.resource.to_owned()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let (resource, group) = (go::quote(&resource), go::quote(a.api_group));
    if a.namespace.is_empty() {
        format!(
            "User {user} cannot {} resource {resource} in API group {group} at the cluster scope",
            a.verb
        )
    } else {
        format!(
            "User {user} cannot {} resource {resource} in API group {group} in the namespace {}",
            a.verb,
            go::quote(a.namespace)
        )
    }
}

/// The apiserver's HTML sanitizer for denial messages: `&`, `<`, `>` become entities.
fn sanitize_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::GROUP;

    fn json<T: Serialize + ?Sized>(value: &T) -> String {
        let bytes = crate::json::encode_json(value).expect("encode");
        String::from_utf8(bytes).expect("UTF-8")
    }

    #[test]
    fn status_bad_request_and_plain_errors() {
        assert_eq!(
            json(&Status::bad_request("unable to parse requirement: bad")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"unable to parse requirement: bad","reason":"BadRequest","code":400}"#,
                "\n"
            )
        );
        let plain = Status::plain_error("failed reading nodes metrics: boom");
        assert_eq!(plain.code(), 500);
        assert_eq!(
            json(&plain),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"failed reading nodes metrics: boom","code":500}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::internal_error("boom")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"Internal error occurred: boom","reason":"InternalError","#,
                r#""details":{"causes":[{"message":"boom"}]},"code":500}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::service_unavailable("not ready")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"not ready","reason":"ServiceUnavailable","code":503}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::unauthorized("Unauthorized")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"Unauthorized","reason":"Unauthorized","code":401}"#,
                "\n"
            )
        );
        assert_eq!(
            Status::unauthorized("").0.message.as_deref(),
            Some("not authorized")
        );
        assert_eq!(
            json(&Status::not_acceptable(
                "no Table exists in group version metrics.k8s.io/v1beta1"
            )),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"no Table exists in group version metrics.k8s.io/v1beta1","#,
                r#""reason":"NotAcceptable","code":406}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::method_not_supported(GROUP, "nodes", "create")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"create is not supported on resources of kind \"nodes.metrics.k8s.io\"","#,
                r#""reason":"MethodNotAllowed","#,
                r#""details":{"group":"metrics.k8s.io","kind":"nodes"},"code":405}"#,
                "\n"
            )
        );
    }

    #[test]
    fn status_forbidden() {
        let list_nodes = RequestAttributes {
            user: "system:serviceaccount:default:viewer",
            verb: "list",
            resource_request: true,
            api_group: GROUP,
            resource: "nodes",
            ..RequestAttributes::default()
        };
        assert_eq!(
            json(&Status::forbidden(&list_nodes, "")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"nodes.metrics.k8s.io is forbidden: User \"system:serviceaccount:default:viewer\" "#,
                r#"cannot list resource \"nodes\" in API group \"metrics.k8s.io\" at the cluster scope","#,
                r#""reason":"Forbidden","details":{"group":"metrics.k8s.io","kind":"nodes"},"code":403}"#,
                "\n"
            )
        );
        let get_pod = RequestAttributes {
            user: "bob",
            verb: "get",
            resource_request: true,
            api_group: GROUP,
            resource: "pods",
            namespace: "team-a",
            name: "web-0",
            ..RequestAttributes::default()
        };
        assert_eq!(
            Status::forbidden(&get_pod, "no RBAC policy matched")
                .0
                .message
                .as_deref(),
            Some(
                "pods.metrics.k8s.io \"web-0\" is forbidden: User \"bob\" cannot get resource \
                 \"pods\" in API group \"metrics.k8s.io\" in the namespace \"team-a\": no RBAC \
                 policy matched"
            )
        );
        let path = RequestAttributes {
            user: "<eve>",
            verb: "get",
            path: "/metrics",
            ..RequestAttributes::default()
        };
        let status = Status::forbidden(&path, "");
        assert_eq!(
            status.0.message.as_deref(),
            Some("forbidden: User \"&lt;eve&gt;\" cannot get path \"/metrics\"")
        );
        assert_eq!(
            json(&status),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"forbidden: User \"\u0026lt;eve\u0026gt;\" cannot get path \"/metrics\"","#,
                r#""reason":"Forbidden","details":{},"code":403}"#,
                "\n"
            )
        );
    }

    #[test]
    fn status_code_defaults_to_500() {
        assert_eq!(Status::default().code(), 500);
        assert_eq!(
            json(&Status::default()),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{}}\n"
        );
    }
}
