//! Rendering an error with its causes, for log fields (anyhow's `{:#}` does the same at
//! the binary's edge).

/// `outer: cause: root cause`.
pub fn chain(e: &dyn std::error::Error) -> String {
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

    #[test]
    fn joins_causes() {
        let e = crate::cgroupfs::FsError::Read {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(chain(&e), "cannot read /x: entity not found");
    }
}
