//! What kpulse's binaries (the agent and the aggregator-api) share at their edges: the one
//! shutdown signal ([`shutdown`]), errors rendered with their causes for log fields
//! ([`error_chain`]) and certificates and keys read from PEM files ([`pem`]).

pub mod pem;
pub mod shutdown;

/// `outer: cause: root cause`, for log fields (anyhow's `{:#}` does the same at a binary's
/// edge).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_in_order() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "entity not found",
        ));
        assert_eq!(error_chain(&e), "cannot read /x: entity not found");
        assert_eq!(error_chain(&e.0), "entity not found");
    }
}
