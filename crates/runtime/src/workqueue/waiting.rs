//! Keys waiting for their `add_after` delay, ordered by the time they are
//! due: the delaying queue's timeline, with no queue logic of its own.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Keys waiting for their `add_after` delay. One entry per key, the earliest
/// ready time wins; ordered by time so the timer only looks at the front.
pub(super) struct Waiting<K> {
    pub(super) by_key: HashMap<K, (tokio::time::Instant, u64)>,
    /// `(ready_at, sequence)`: the sequence number keeps entries with equal
    /// times distinct without requiring `K: Ord`.
    pub(super) timeline: BTreeMap<(tokio::time::Instant, u64), K>,
    pub(super) next_seq: u64,
}

impl<K: Clone + Eq + Hash> Waiting<K> {
    pub(super) fn new() -> Self {
        Self {
            by_key: HashMap::new(),
            timeline: BTreeMap::new(),
            next_seq: 0,
        }
    }

    pub(super) fn insert(&mut self, key: K, ready_at: tokio::time::Instant) {
        if let Some(&(existing, seq)) = self.by_key.get(&key) {
            if existing <= ready_at {
                return;
            }
            self.timeline.remove(&(existing, seq));
        }
        let slot = (ready_at, self.next_seq);
        self.next_seq += 1;
        self.timeline.insert(slot, key.clone());
        self.by_key.insert(key, slot);
    }

    /// Removes and returns the keys whose time has come.
    pub(super) fn pop_due(&mut self, now: tokio::time::Instant) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(entry) = self.timeline.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.by_key.remove(&key);
            due.push(key);
        }
        due
    }

    pub(super) fn next_ready_at(&self) -> Option<tokio::time::Instant> {
        self.timeline.first_key_value().map(|(&(at, _), _)| at)
    }

    pub(super) fn clear(&mut self) {
        self.by_key.clear();
        self.timeline.clear();
    }
}
