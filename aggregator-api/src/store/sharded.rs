//! Copy-on-write sharded maps keyed by strings: the store's node table and pod index.
//! Readers load one shard's `ArcSwap` pointer; a writer copies one shard and swaps it in.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};

use arc_swap::ArcSwap;

pub(super) struct ShardedMap<K, V> {
    hasher: RandomState,
    pub(super) shards: Box<[ArcSwap<HashMap<K, V>>]>,
}

impl<K, V> ShardedMap<K, V>
where
    K: Borrow<str> + Hash + Eq + Clone,
    V: Clone,
{
    /// `count` must be a power of two.
    pub(super) fn new(count: usize) -> Self {
        ShardedMap {
            hasher: RandomState::new(),
            shards: (0..count).map(|_| ArcSwap::default()).collect(),
        }
    }

    pub(super) fn index(&self, key: &str) -> usize {
        // Truncating the hash is fine: only the low bits pick the shard.
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    pub(super) fn shard(&self, key: &str) -> &ArcSwap<HashMap<K, V>> {
        &self.shards[self.index(key)]
    }

    /// Applies `edit` to a copy of shard `index` and publishes it; retried if another
    /// writer published first.
    pub(super) fn edit(&self, index: usize, mut edit: impl FnMut(&mut HashMap<K, V>)) {
        if let Some(shard) = self.shards.get(index) {
            shard.rcu(|current| {
                let mut next = HashMap::clone(current);
                edit(&mut next);
                next
            });
        }
    }
}
