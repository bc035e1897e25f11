//! [`PodKey`], a pod's `namespace/name`: what the pod index and each node's pod map are
//! keyed by, and what the API layer looks pods up with.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A pod's `namespace/name`, the key the Metrics API serves pods by. Cheap to clone.
#[derive(Clone)]
pub struct PodKey {
    /// `namespace/name`; the namespace contains no `/`.
    pub(super) full: Arc<str>,
    ns_len: usize,
}

impl PodKey {
    /// The key of a pod, or `None` if the namespace or name is empty or the namespace
    /// contains `/` (Kubernetes allows neither).
    pub fn new(namespace: &str, name: &str) -> Option<PodKey> {
        let mut buf = String::new();
        write_key(&mut buf, namespace, name).then(|| PodKey::from_key_str(&buf))
    }

    pub(super) fn from_key_str(full: &str) -> PodKey {
        PodKey {
            ns_len: full.find('/').unwrap_or(full.len()),
            full: Arc::from(full),
        }
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> &str {
        self.full.get(..self.ns_len).unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.full.get(self.ns_len + 1..).unwrap_or_default()
    }
}

impl PartialEq for PodKey {
    fn eq(&self, other: &PodKey) -> bool {
        self.full == other.full
    }
}

impl Eq for PodKey {}

impl Hash for PodKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must hash as the `str` it borrows as.
        (*self.full).hash(state);
    }
}

impl Borrow<str> for PodKey {
    fn borrow(&self) -> &str {
        &self.full
    }
}

impl fmt::Debug for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.full, f)
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

/// Writes `namespace/name` into `buf`; false if that would not be a valid [`PodKey`].
pub(super) fn write_key(buf: &mut String, namespace: &str, name: &str) -> bool {
    buf.clear();
    if namespace.is_empty() || name.is_empty() || namespace.contains('/') {
        return false;
    }
    buf.push_str(namespace);
    buf.push('/');
    buf.push_str(name);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_key_splits_namespace_and_name() {
        let k = PodKey::new("kube-system", "coredns-1").expect("valid");
        assert_eq!((k.namespace(), k.name()), ("kube-system", "coredns-1"));
        assert_eq!(k.to_string(), "kube-system/coredns-1");
        assert_eq!(PodKey::new("a/b", "c"), None);
        assert_eq!(PodKey::new("", "c"), None);
        assert_eq!(PodKey::new("a", ""), None);
    }
}
