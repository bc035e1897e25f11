//! Response bodies, shared by the HTTP server ([`crate::serve`]) and everything that answers
//! through it (the API, health, the agents' port), so that none of them depends on the
//! server itself.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// A response body: whole (most answers) or streamed (watches).
pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A whole response body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    r
}
