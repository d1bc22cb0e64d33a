//! A ResourcePoolStatusRequest's answer (`resource.k8s.io/v1alpha3`,
//! `DRAResourcePoolStatus`), as kube-controller-manager 1.36's
//! `resourcepoolstatusrequest-controller` computes it, and when an answered
//! or forgotten request is cleaned up: pure functions of the slices and
//! claims held in memory and the clock.
//!
//! The counting of the release acted as ([`Counting`]). 1.36: every
//! allocation result counts (admin access and shared devices included,
//! nothing de-duplicated), taints make nothing unavailable. 1.37: each
//! allocated device counts once, admin access not at all, and a device
//! tainted `NoSchedule` or `NoExecute` (by its slice or a DeviceTaintRule)
//! is unavailable. 1.38 counts as 1.37, and compares capacity names with
//! or without the driver's domain (kubernetes #142202; inferred from
//! pre-release source). In all, a pool whose newest generation lacks slices
//! is reported with a validation error and no counts (1.37 and later prefix
//! it `PoolIncomplete:`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use summaries::{Amount, PoolDevices, PoolUse, summaries};
pub use summaries::{PartitionType, ShareableCapacity, ShareableSummary};

use crate::device_taints::TaintRule;
use crate::views::ClaimView;

mod summaries;

/// How devices are counted: as kube-controller-manager 1.36, 1.37 or 1.38
/// counts.
#[derive(Clone, Copy, Debug)]
pub enum Counting<'a> {
    V1_36,
    /// With the DeviceTaintRules in force (none while `DRADeviceTaintRules`
    /// is off).
    V1_37 {
        rules: &'a [TaintRule],
    },
    /// 1.37's counting; capacity names compared with or without the
    /// driver's domain.
    V1_38 {
        rules: &'a [TaintRule],
    },
}

impl<'a> Counting<'a> {
    /// The rules whose taints make devices unavailable, from 1.37 on (1.36
    /// counts no taint).
    fn rules(self) -> Option<&'a [TaintRule]> {
        match self {
            Counting::V1_36 => None,
            Counting::V1_37 { rules } | Counting::V1_38 { rules } => Some(rules),
        }
    }

    /// Whether capacity names are compared with the driver's domain added
    /// where they have none (1.38).
    fn qualifies_capacity_names(self) -> bool {
        matches!(self, Counting::V1_38 { .. })
    }
}

/// 1.37's prefix of an incomplete pool's `validationError`.
const INCOMPLETE_PREFIX: &str = "PoolIncomplete:";

/// Whether a taint effect keeps a device from being allocated.
fn blocks(effect: &str) -> bool {
    effect == "NoSchedule" || effect == "NoExecute"
}

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
/// The reason of the `Failed` condition.
pub const FAILED_REASON: &str = "CalculationFailed";
/// A refusal quoted in a `Failed` condition is cut to this many bytes.
const MAX_REFUSAL: usize = 1024;

/// The `Failed` condition's message when the API server refused to store
/// an answer as invalid (a 422, e.g. an admission policy): written instead
/// of the answer, so the request ends with the reason where its author
/// looks, not pending until it expires. kube-controller-manager retries
/// such a request six times and then drops it unanswered.
pub fn refused_message(refusal: &str) -> String {
    truncate_bytes(
        format!("The API server refused the calculated status: {refusal}"),
        MAX_REFUSAL,
    )
}

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
    /// The newest generation lacks slices (what a request may wait for).
    pub incomplete: bool,
    /// 1.37: the partition types of a complete pool whose devices draw on
    /// shared counters and name a partition type attribute.
    pub partition_summary: Option<Vec<PartitionType>>,
    /// 1.37: the shareable devices of a complete pool that has any.
    pub shareable_summary: Option<ShareableSummary>,
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
        self.pools.iter().any(|p| p.incomplete)
    }
}

#[derive(Default)]
struct Pool<'a> {
    generation: i64,
    slices: i64,
    expected: i64,
    devices: i64,
    /// Not allocatable for a taint (1.37's counting only).
    unavailable: i64,
    node: Option<String>,
    mixed_nodes: bool,
    /// The devices and counters the summaries read (1.37's counting only).
    held: PoolDevices<'a>,
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

/// What a request asks: `driver`, one pool (when given), at most `limit`
/// pools (`None`: [`DEFAULT_LIMIT`]); 1.37: the partition type attribute
/// of pools whose driver names none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Question<'a> {
    pub driver: &'a str,
    pub pool_name: Option<&'a str>,
    pub limit: Option<i32>,
    pub default_partition_type_attribute: Option<&'a str>,
}

/// The answer to `question`, counted as `counting` says.
pub fn answer<'a>(
    question: Question<'_>,
    counting: Counting<'_>,
    slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
    claims: impl IntoIterator<Item = &'a ClaimView>,
) -> Answer {
    let Question {
        driver,
        pool_name,
        limit,
        default_partition_type_attribute,
    } = question;
    let wanted = |s: &ResourceSlice| {
        s.spec.driver == driver && pool_name.is_none_or(|p| p == s.spec.pool.name)
    };
    let mut pools: BTreeMap<String, Pool<'a>> = BTreeMap::new();
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
        let devices = s.devices.as_deref().unwrap_or_default();
        pool.devices += devices.len() as i64;
        if let Some(rules) = counting.rules() {
            let tainted = |device: &k8s_openapi::api::resource::v1::Device| {
                device.taints.iter().flatten().any(|t| blocks(&t.effect))
                    || rules.iter().any(|r| {
                        blocks(&r.taint.effect) && r.selects(driver, &s.pool.name, &device.name)
                    })
            };
            pool.unavailable += devices.iter().filter(|d| tainted(d)).count() as i64;
            let attribute = s.partition_type_attribute.as_deref();
            pool.held
                .devices
                .extend(devices.iter().map(|d| (d, attribute)));
            pool.held
                .shared_counters
                .extend(s.shared_counters.iter().flatten());
        }
    }
    let results = claims
        .into_iter()
        .flat_map(|c| c.status.allocation.iter().flat_map(|a| &a.devices.results))
        .filter(|r| r.driver == driver);
    let mut allocated: BTreeMap<&str, i64> = BTreeMap::new();
    // 1.37: what the claims hold of each pool, for the summaries.
    let mut used: BTreeMap<&str, PoolUse<'_>> = BTreeMap::new();
    match counting {
        Counting::V1_36 => {
            for r in results {
                *allocated.entry(r.pool.as_str()).or_default() += 1;
            }
        }
        Counting::V1_37 { .. } | Counting::V1_38 { .. } => {
            let qualify_with = counting.qualifies_capacity_names().then_some(driver);
            for r in results.filter(|r| r.admin_access != Some(true)) {
                let pool = used.entry(r.pool.as_str()).or_insert_with(|| PoolUse {
                    qualify_with,
                    ..PoolUse::default()
                });
                pool.devices.insert(r.device.as_str());
                for (name, quantity) in &r.consumed_capacity {
                    pool.add_consumed(name, Amount::parse(&quantity.0));
                }
            }
            allocated.extend(used.iter().map(|(p, u)| (*p, u.devices.len() as i64)));
        }
    }
    let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    let nothing_used = PoolUse::default();
    // One driver: by pool name, in byte order (the map's). Every matching
    // pool is counted; only the first `limit` are answered (and summarised).
    let pool_count = count(pools.len() as i64);
    let limit = usize::try_from(limit.unwrap_or(DEFAULT_LIMIT).max(0)).unwrap_or(0);
    let answers: Vec<PoolAnswer> = pools
        .into_iter()
        .take(limit)
        .map(|(name, pool)| {
            let node_name = pool.node.filter(|n| !n.is_empty() && !pool.mixed_nodes);
            if pool.slices < pool.expected {
                let mut error = format!(
                    "pool {driver}/{name} is incomplete: observed {}/{} slices at generation {}",
                    pool.slices, pool.expected, pool.generation
                );
                if counting.rules().is_some() {
                    error = format!("{INCOMPLETE_PREFIX} {error}");
                }
                return PoolAnswer {
                    driver: driver.to_string(),
                    generation: pool.generation,
                    node_name,
                    validation_error: Some(truncate_bytes(error, MAX_VALIDATION_ERROR)),
                    incomplete: true,
                    pool_name: name,
                    ..Default::default()
                };
            }
            let taken = allocated.get(name.as_str()).copied().unwrap_or(0);
            let views = match counting {
                Counting::V1_36 => Default::default(),
                Counting::V1_37 { .. } | Counting::V1_38 { .. } => summaries(
                    driver,
                    &name,
                    &pool.held,
                    default_partition_type_attribute,
                    used.get(name.as_str()).unwrap_or(&nothing_used),
                ),
            };
            PoolAnswer {
                driver: driver.to_string(),
                generation: pool.generation,
                node_name,
                resource_slice_count: Some(count(pool.slices)),
                total_devices: Some(count(pool.devices)),
                allocated_devices: Some(count(taken)),
                // 1.37 subtracts a device both allocated and tainted twice,
                // as written.
                available_devices: Some(count((pool.devices - taken - pool.unavailable).max(0))),
                unavailable_devices: Some(count(pool.unavailable)),
                // A summary's problem is reported beside the counts.
                validation_error: views.error.map(|e| truncate_bytes(e, MAX_VALIDATION_ERROR)),
                incomplete: false,
                partition_summary: views.partitions,
                shareable_summary: views.shareable,
                pool_name: name,
            }
        })
        .collect();
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
mod tests;
