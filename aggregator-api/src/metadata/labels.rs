//! [`Labels`], a pod's labels as the metadata index keeps them, and [`LabelSets`], which
//! keeps each distinct set once.
//!
//! A `BTreeMap<String, String>` per pod cost a B-tree leaf (about half a KiB) and two
//! allocations a label, for every pod, and the pods of one Deployment or DaemonSet carry
//! the same labels: heaptrack found labels to be most of a pod's memory. A [`Labels`] is an
//! immutable sorted slice behind an `Arc`, and [`LabelSets`] hands out the same one for
//! equal labels.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

/// An immutable set of labels, sorted by key, as a `BTreeMap` iterates them. Cloning it
/// shares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Labels(Arc<[(Box<str>, Box<str>)]>);

impl Labels {
    /// A copy of `map`.
    pub(super) fn new(map: &BTreeMap<String, String>) -> Labels {
        Labels(
            map.iter()
                .map(|(k, v)| (Box::from(k.as_str()), Box::from(v.as_str())))
                .collect(),
        )
    }

    /// Whether these are the labels of `map`.
    pub(super) fn matches(&self, map: &BTreeMap<String, String>) -> bool {
        self.0.len() == map.len()
            && self
                .0
                .iter()
                .zip(map)
                .all(|((k, v), (mk, mv))| **k == **mk && **v == **mv)
    }

    /// The labels as a map, as [`crate::metadata::PodMeta`] carries them.
    pub(super) fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Whether `other` is this very set (not only equal labels).
    #[cfg(test)]
    pub(super) fn is_shared_with(&self, other: &Labels) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether anything besides the [`LabelSets`] holding it does.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

/// Fewest sets kept before [`LabelSets`] first drops the unused ones.
const MIN_SWEEP: usize = 64;

/// Each distinct set of labels once: [`LabelSets::get`] gives equal labels the same
/// [`Labels`]. Sets no one holds any more are dropped when the table has doubled since it
/// last dropped them, for an amortized constant cost per new set: right after a sweep it
/// holds the sets in use, and it grows to at most about twice the most sets ever in use
/// (and at least [`MIN_SWEEP`]); unused sets stay until a new set reaches that size.
#[derive(Debug, Default)]
pub(super) struct LabelSets {
    sets: HashSet<Labels>,
    /// The size at which the unused sets are dropped.
    sweep_at: usize,
}

impl LabelSets {
    /// The shared [`Labels`] of `map`.
    pub(super) fn get(&mut self, map: &BTreeMap<String, String>) -> Labels {
        let labels = Labels::new(map);
        if let Some(shared) = self.sets.get(&labels) {
            return shared.clone();
        }
        if self.sets.len() >= self.sweep_at {
            self.sets.retain(Labels::in_use);
            self.sweep_at = (2 * self.sets.len()).max(MIN_SWEEP);
        }
        self.sets.insert(labels.clone());
        labels
    }

    /// Distinct sets held, some of them possibly no longer used.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_round_trip_and_compare_with_maps() {
        let m = map(&[("b", "2"), ("a", "1"), ("app", "web")]);
        let l = Labels::new(&m);
        assert_eq!(l.to_map(), m);
        assert!(l.matches(&m));
        assert!(!l.matches(&map(&[("a", "1"), ("app", "web")])), "fewer");
        assert!(!l.matches(&map(&[("a", "1"), ("app", "web"), ("b", "3")])));
        assert!(!l.matches(&map(&[("a", "1"), ("app", "web"), ("c", "2")])));
        let empty = Labels::new(&BTreeMap::new());
        assert!(empty.matches(&BTreeMap::new()));
        assert!(empty.to_map().is_empty());
        assert!(!empty.matches(&m));
    }

    #[test]
    fn equal_labels_are_shared() {
        let mut sets = LabelSets::default();
        let a = sets.get(&map(&[("app", "web")]));
        let b = sets.get(&map(&[("app", "web")]));
        let c = sets.get(&map(&[("app", "db")]));
        assert!(a.is_shared_with(&b));
        assert!(!a.is_shared_with(&c));
        assert_eq!(sets.len(), 2);
    }

    #[test]
    fn unused_sets_are_dropped_as_the_table_grows() {
        let mut sets = LabelSets::default();
        let kept = sets.get(&map(&[("app", "kept")]));
        for i in 0..10 * MIN_SWEEP {
            // Each one unused as soon as made.
            sets.get(&map(&[("app", &i.to_string())]));
            assert!(sets.len() <= MIN_SWEEP + 1, "{}", sets.len());
        }
        // The one still in use is still shared.
        let again = sets.get(&map(&[("app", "kept")]));
        assert!(kept.is_shared_with(&again));
        // Sets in use are never dropped: the table grows with them.
        let held: Vec<Labels> = (0..3 * MIN_SWEEP)
            .map(|i| sets.get(&map(&[("held", &i.to_string())])))
            .collect();
        assert!(sets.len() >= held.len());
        for (i, l) in held.iter().enumerate() {
            let same = sets.get(&map(&[("held", &i.to_string())]));
            assert!(l.is_shared_with(&same));
        }
    }
}
