//! A ResourcePoolStatusRequest's answer (`resource.k8s.io/v1alpha3`,
//! `DRAResourcePoolStatus`), as kube-controller-manager 1.36's
//! `resourcepoolstatusrequest-controller` computes it, and when an answered
//! or forgotten request is cleaned up: pure functions of the slices and
//! claims held in memory and the clock.
//!
//! 1.36's counting, kept for a drop-in: every allocation result counts
//! (admin access and shared devices included, nothing de-duplicated),
//! taints make nothing unavailable, a pool whose newest generation lacks
//! slices is reported with a validation error and no counts.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::views::ClaimView;

/// `spec.limit` when unset (the API server defaults it too).
pub const DEFAULT_LIMIT: i32 = 100;
/// `validationError` is cut to this many bytes.
const MAX_VALIDATION_ERROR: usize = 256;
/// An answered request is deleted this long after its condition.
pub const COMPLETED_TTL: Duration = Duration::from_secs(3600);
/// A request never answered is deleted this long after its creation.
pub const PENDING_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a request whose answer would hold an incomplete pool waits for
/// the driver to publish the rest (counted from the request's creation);
/// then it is answered with the pool's `validationError`.
pub const INCOMPLETE_GRACE: Duration = Duration::from_secs(30);
/// While it waits, the answer is computed again this often.
const INCOMPLETE_RECHECK: Duration = Duration::from_secs(2);

/// The reason of the `Complete` condition.
pub const COMPLETE_REASON: &str = "CalculationComplete";

/// Whether to write the answer now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Write,
    /// A returned pool is incomplete and the grace is not over: compute
    /// again after this long.
    WaitForSlices(Duration),
}

/// Whether `answer` is written now. kube-controller-manager 1.36 never
/// writes an answer holding an incomplete pool: it retries six times within
/// about 155 ms, then drops the request until something else queues it.
/// Here such a request waits up to [`INCOMPLETE_GRACE`] after its creation
/// for the pool to complete, then gets the answer the API documents: the
/// pool with its `validationError` and no counts.
pub fn when_to_reply(answer: &Answer, created: Option<Timestamp>, now: Timestamp) -> Reply {
    if !answer.has_incomplete_pool() {
        return Reply::Write;
    }
    let Some(created) = created else {
        return Reply::Write;
    };
    let waited = now.duration_since(created);
    let grace = SignedDuration::try_from(INCOMPLETE_GRACE).unwrap_or(SignedDuration::MAX);
    if waited >= grace {
        return Reply::Write;
    }
    let left = Duration::try_from(grace - waited).unwrap_or(INCOMPLETE_GRACE);
    Reply::WaitForSlices(left.min(INCOMPLETE_RECHECK))
}

/// One pool of the answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolAnswer {
    pub driver: String,
    pub pool_name: String,
    pub generation: i64,
    /// Set when every slice of the newest generation names the same node.
    pub node_name: Option<String>,
    /// `None` (with the counts) for an incomplete pool.
    pub resource_slice_count: Option<i32>,
    pub total_devices: Option<i32>,
    pub allocated_devices: Option<i32>,
    pub available_devices: Option<i32>,
    pub unavailable_devices: Option<i32>,
    pub validation_error: Option<String>,
}

/// The whole answer: every matching pool counted, the first `limit`
/// returned (by driver, then pool name, byte order), and the condition's
/// message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub pool_count: i32,
    pub pools: Vec<PoolAnswer>,
    pub message: String,
}

impl Answer {
    /// Whether a returned pool is incomplete: kube-controller-manager then
    /// writes nothing and tries again later.
    pub fn has_incomplete_pool(&self) -> bool {
        self.pools.iter().any(|p| p.validation_error.is_some())
    }
}

#[derive(Default)]
struct Pool {
    generation: i64,
    slices: i64,
    expected: i64,
    devices: i64,
    node: Option<String>,
    mixed_nodes: bool,
}

fn truncate_bytes(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The answer to a request for `driver` (and `pool_name`, when given),
/// at most `limit` pools (`None`: [`DEFAULT_LIMIT`]).
pub fn answer<'a>(
    driver: &str,
    pool_name: Option<&str>,
    limit: Option<i32>,
    slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
    claims: impl IntoIterator<Item = &'a ClaimView>,
) -> Answer {
    let wanted = |s: &ResourceSlice| {
        s.spec.driver == driver && pool_name.is_none_or(|p| p == s.spec.pool.name)
    };
    let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
    for slice in slices.clone().into_iter().filter(|s| wanted(s)) {
        let pool = pools.entry(slice.spec.pool.name.clone()).or_default();
        pool.generation = pool.generation.max(slice.spec.pool.generation);
    }
    for slice in slices.into_iter().filter(|s| wanted(s)) {
        let s = &slice.spec;
        let pool = pools.get_mut(&s.pool.name).expect("pool seen above");
        if s.pool.generation < pool.generation {
            continue;
        }
        let node = s.node_name.clone().unwrap_or_default();
        if pool.slices == 0 {
            pool.expected = s.pool.resource_slice_count;
            pool.node = Some(node);
        } else if pool.node.as_deref() != Some(node.as_str()) {
            pool.mixed_nodes = true;
        }
        pool.slices += 1;
        pool.devices += s.devices.as_ref().map_or(0, |d| d.len()) as i64;
    }
    let mut allocated: BTreeMap<&str, i64> = BTreeMap::new();
    let claims: Vec<&ClaimView> = claims.into_iter().collect();
    for claim in &claims {
        for r in claim
            .status
            .allocation
            .iter()
            .flat_map(|a| &a.devices.results)
        {
            if r.driver == driver {
                *allocated.entry(r.pool.as_str()).or_default() += 1;
            }
        }
    }
    let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    let mut answers: Vec<PoolAnswer> = pools
        .into_iter()
        .map(|(name, pool)| {
            let node_name = pool.node.filter(|n| !n.is_empty() && !pool.mixed_nodes);
            if pool.slices < pool.expected {
                let error = format!(
                    "pool {driver}/{name} is incomplete: observed {}/{} slices at generation {}",
                    pool.slices, pool.expected, pool.generation
                );
                return PoolAnswer {
                    driver: driver.to_string(),
                    generation: pool.generation,
                    node_name,
                    validation_error: Some(truncate_bytes(error, MAX_VALIDATION_ERROR)),
                    pool_name: name,
                    ..Default::default()
                };
            }
            let taken = allocated.get(name.as_str()).copied().unwrap_or(0);
            PoolAnswer {
                driver: driver.to_string(),
                generation: pool.generation,
                node_name,
                resource_slice_count: Some(count(pool.slices)),
                total_devices: Some(count(pool.devices)),
                allocated_devices: Some(count(taken)),
                available_devices: Some(count((pool.devices - taken).max(0))),
                unavailable_devices: Some(0),
                validation_error: None,
                pool_name: name,
            }
        })
        .collect();
    // One driver: by pool name, in byte order (the map's).
    let pool_count = count(answers.len() as i64);
    let limit = usize::try_from(limit.unwrap_or(DEFAULT_LIMIT).max(0)).unwrap_or(0);
    answers.truncate(limit);
    let incomplete = answers
        .iter()
        .filter(|p| p.validation_error.is_some())
        .count();
    let message = if incomplete > 0 {
        format!(
            "Calculated status for {} pools ({incomplete} incomplete)",
            answers.len()
        )
    } else {
        format!("Calculated status for {} pools", answers.len())
    };
    Answer {
        pool_count,
        pools: answers,
        message,
    }
}

/// Whether `at` is more than `ttl` before `now` (a time never set is
/// never old).
pub fn is_older_than(at: Option<Timestamp>, ttl: Duration, now: Timestamp) -> bool {
    let Some(at) = at else {
        return false;
    };
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
    now.duration_since(at) > ttl
}

/// Whether a request is to be deleted now: answered (its first `Complete`
/// or `Failed` condition) more than an hour ago, or never answered and
/// created more than a day ago. `answered_at`: `Some(None)` for a status
/// without such a condition (then its creation counts, with the hour).
pub fn should_delete(
    created: Option<Timestamp>,
    answered: Option<Option<Timestamp>>,
    now: Timestamp,
) -> bool {
    match answered {
        Some(Some(at)) => is_older_than(Some(at), COMPLETED_TTL, now),
        Some(None) => is_older_than(created, COMPLETED_TTL, now),
        None => is_older_than(created, PENDING_TTL, now),
    }
}

/// When a request was answered, for [`should_delete`]: `None` while it has
/// no status; `Some(None)` for a status without a `Complete` or `Failed`
/// condition; else the first such condition's time.
pub fn answered_at(
    status: Option<&k8s_openapi::api::resource::v1alpha3::ResourcePoolStatusRequestStatus>,
) -> Option<Option<Timestamp>> {
    let status = status?;
    let first = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Complete" || c.type_ == "Failed");
    Some(first.map(|c| c.last_transition_time.0))
}

#[cfg(test)]
#[path = "pool_status_tests.rs"]
mod tests;
