//! 1.37's two summaries of a complete pool: partitions (devices that draw
//! on shared counters, grouped by a partition type attribute: how many of
//! each type exist and how many more would fit) and shareable devices
//! (devices that allow multiple allocations: how many are untouched, and
//! each capacity's total, consumed and available amounts).
//!
//! A structural problem (a partition without its type, types of one name
//! costing differently, more than 32 entries) is reported as the pool's
//! `validationError` with a machine-readable prefix; the pool's counts stay.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceCounterConsumption};

use crate::allocate::quantity::{Format, Quantity};

/// The API's cap on `partitionSummary` and `shareableSummary.capacity`: a
/// longer list would be refused, so the view is reported as an error.
const MAX_ENTRIES: usize = 32;

const PARTITION_TYPE_MISSING: &str = "PartitionTypeMissing:";
const PARTITION_COST_MISMATCH: &str = "PartitionCostMismatch:";
const PARTITION_SUMMARY_OVER_CAP: &str = "PartitionSummaryOverCap:";
const SHAREABLE_SUMMARY_OVER_CAP: &str = "ShareableSummaryOverCap:";

/// One `partitionSummary` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionType {
    pub attribute: String,
    pub type_: String,
    pub total: i32,
    /// How many more of this type fit on what the devices in use leave of
    /// the shared counters (each type measured on its own).
    pub allocatable: i32,
}

/// One `shareableSummary.capacity` entry, quantities in canonical text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareableCapacity {
    pub name: String,
    pub total: String,
    pub consumed: String,
    pub available: String,
}

/// `shareableSummary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareableSummary {
    /// Shareable devices no claim holds.
    pub fully_available: i32,
    /// Shareable devices held by at least one claim (however much is left).
    pub partially_available: i32,
    pub capacity: Vec<ShareableCapacity>,
}

/// A quantity with the format it is written back in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Amount {
    pub(super) value: Quantity,
    pub(super) format: Format,
}

impl Amount {
    /// A quantity's text; one that does not parse counts as zero (the API
    /// server validated it).
    pub(super) fn parse(text: &str) -> Amount {
        Amount {
            value: Quantity::parse(text).unwrap_or(Quantity::from_units(0)),
            format: Format::of(text),
        }
    }

    /// The sum; a zero sum takes the format of what is added, as the API's
    /// quantities do.
    pub(super) fn add(self, other: Amount) -> Amount {
        Amount {
            value: self.value.checked_add(other.value).unwrap_or(self.value),
            format: if self.value.sign() == 0 {
                other.format
            } else {
                self.format
            },
        }
    }

    /// `self - other`, never below zero, in `self`'s format.
    fn minus_at_least_zero(self, other: Amount) -> Amount {
        let value = self
            .value
            .checked_sub(other.value)
            .filter(|v| v.sign() >= 0)
            .unwrap_or(Quantity::from_units(0));
        Amount {
            value,
            format: self.format,
        }
    }

    fn text(&self) -> String {
        self.value.canonical(self.format)
    }
}

/// What a complete pool holds for the summaries.
#[derive(Default)]
pub(super) struct PoolDevices<'a> {
    /// Every device of the newest generation, with its own slice's
    /// `partitionTypeAttribute`.
    pub(super) devices: Vec<(&'a Device, Option<&'a str>)>,
    /// The shared counter sets of all those slices (a counter a later set
    /// of the same name repeats takes the later value).
    pub(super) shared_counters: Vec<&'a CounterSet>,
}

/// What the claims hold of one pool (allocation results without admin
/// access).
#[derive(Default)]
pub(super) struct PoolUse<'a> {
    /// The devices held by at least one claim.
    pub(super) devices: BTreeSet<&'a str>,
    /// Per capacity name (as [`Self::qualify_with`] spells it), the sum of
    /// what the results consumed.
    pub(super) consumed: BTreeMap<Cow<'a, str>, Amount>,
    /// 1.38 (kubernetes #142202, inferred): capacity names compare with the
    /// driver's domain added where a name has none (`memory` is
    /// `gpu.example.com/memory` for the driver `gpu.example.com`), so that a
    /// claim's `consumedCapacity` and a slice's `capacity` match whichever
    /// spelling each uses; the summary keeps the slice's spelling. `None`:
    /// names compare as written (1.37).
    pub(super) qualify_with: Option<&'a str>,
}

impl<'a> PoolUse<'a> {
    /// Adds what one result consumed of the capacity `name`.
    pub(super) fn add_consumed(&mut self, name: &'a str, amount: Amount) {
        let sum = self
            .consumed
            .entry(capacity_key(name, self.qualify_with))
            .or_default();
        *sum = sum.add(amount);
    }

    /// What the results consumed of the capacity a device publishes as
    /// `name`.
    fn consumed_of(&self, name: &str) -> Amount {
        self.consumed
            .get(&capacity_key(name, self.qualify_with))
            .copied()
            .unwrap_or_default()
    }
}

/// `name` as capacities are compared: qualified with `driver` when one is
/// given and the name has no domain of its own.
fn capacity_key<'n>(name: &'n str, driver: Option<&str>) -> Cow<'n, str> {
    match driver {
        Some(driver) if !name.contains('/') => Cow::Owned(format!("{driver}/{name}")),
        _ => Cow::Borrowed(name),
    }
}

/// The summaries of a pool, and the first structural problem found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Summaries {
    pub(super) partitions: Option<Vec<PartitionType>>,
    pub(super) shareable: Option<ShareableSummary>,
    pub(super) error: Option<String>,
}

/// A device ready for grouping: the attribute that names its partition
/// type (when one applies) and the type it carries there (`None`: it does
/// not carry that attribute as a string).
struct Partition<'a> {
    device: &'a Device,
    attribute: Option<&'a str>,
    type_: Option<&'a str>,
}

/// Both summaries of the complete pool `driver`/`pool`.
/// `default_attribute`: the request's `defaultPartitionTypeAttribute`,
/// which applies only when no slice of the pool names one.
pub(super) fn summaries(
    driver: &str,
    pool: &str,
    held: &PoolDevices<'_>,
    default_attribute: Option<&str>,
    used: &PoolUse<'_>,
) -> Summaries {
    let partitions = partition_types(driver, &held.devices, default_attribute);
    let grouped = partitions.iter().any(|p| p.attribute.is_some());
    let mut error = None;
    let mut partition_summary = None;
    if grouped && held.shared_counters.is_empty() {
        error = Some(format!(
            "{PARTITION_TYPE_MISSING} pool {driver}/{pool} declares partitionTypeAttribute but publishes no sharedCounters"
        ));
    } else if grouped {
        match partition_summary_of(driver, pool, &partitions, &held.shared_counters, used) {
            Ok(summary) => partition_summary = Some(summary),
            Err(e) => error = Some(e),
        }
    }
    // The shareable view stands apart: kept whenever it is itself sound,
    // even beside a partition error (which wins as the pool's error).
    let (shareable, shareable_error) = match shareable_summary_of(driver, pool, held, used) {
        Ok(summary) => (summary, None),
        Err(e) => (None, Some(e)),
    };
    let error = error.or(shareable_error);
    Summaries {
        partitions: partition_summary.filter(|_| error.is_none()),
        shareable,
        error,
    }
}

/// Each device's partition attribute and type. A slice's own attribute
/// wins; the request's default applies to the whole pool, and only when no
/// device's slice names one.
fn partition_types<'a>(
    driver: &str,
    devices: &[(&'a Device, Option<&'a str>)],
    default_attribute: Option<&'a str>,
) -> Vec<Partition<'a>> {
    let named = |attribute: Option<&'a str>| attribute.filter(|a| !a.is_empty());
    let pool_names_one = devices.iter().any(|(_, a)| named(*a).is_some());
    devices
        .iter()
        .map(|&(device, own)| {
            let attribute = named(own).or(if pool_names_one {
                None
            } else {
                named(default_attribute)
            });
            Partition {
                device,
                attribute,
                type_: attribute.and_then(|a| string_attribute(driver, device, a)),
            }
        })
        .collect()
}

/// A device's string attribute `name`. An attribute in the driver's domain
/// may be published bare (as selectors read it); the qualified key wins
/// when both are there. Other kinds of values count as absent.
fn string_attribute<'a>(driver: &str, device: &'a Device, name: &str) -> Option<&'a str> {
    let attributes = device.attributes.as_ref()?;
    let attribute = attributes.get(name).or_else(|| {
        let bare = name.strip_prefix(driver)?.strip_prefix('/')?;
        attributes.get(bare)
    })?;
    attribute.string.as_deref()
}

fn costs(device: &Device) -> &[DeviceCounterConsumption] {
    device.consumes_counters.as_deref().unwrap_or_default()
}

/// Counter set → counter → what is left.
type Counters = BTreeMap<String, BTreeMap<String, Quantity>>;

fn partition_summary_of(
    driver: &str,
    pool: &str,
    partitions: &[Partition<'_>],
    shared_counters: &[&CounterSet],
    used: &PoolUse<'_>,
) -> Result<Vec<PartitionType>, String> {
    struct Group<'a> {
        cost: String,
        total: i32,
        fresh: Vec<&'a Device>,
    }
    let mut groups: BTreeMap<(&str, &str), Group<'_>> = BTreeMap::new();
    // Devices drawing on no counter are not partitions.
    for partition in partitions.iter().filter(|p| !costs(p.device).is_empty()) {
        let Some(attribute) = partition.attribute else {
            continue;
        };
        let name = &partition.device.name;
        let Some(type_) = partition.type_ else {
            return Err(format!(
                "{PARTITION_TYPE_MISSING} device {name:?} in pool {driver}/{pool} does not carry partition type attribute {attribute:?}"
            ));
        };
        let cost = cost_key(costs(partition.device));
        let group = groups.entry((attribute, type_)).or_insert_with(|| Group {
            cost: cost.clone(),
            total: 0,
            fresh: Vec::new(),
        });
        if group.cost != cost {
            return Err(format!(
                "{PARTITION_COST_MISMATCH} devices of partition type {type_:?} in pool {driver}/{pool} consume different counters"
            ));
        }
        group.total += 1;
        if !used.devices.contains(name.as_str()) {
            group.fresh.push(partition.device);
        }
    }
    if groups.len() > MAX_ENTRIES {
        return Err(format!(
            "{PARTITION_SUMMARY_OVER_CAP} pool {driver}/{pool} has {} partition types, exceeding the maximum of {MAX_ENTRIES}",
            groups.len()
        ));
    }
    // What the devices in use leave: each drains its cost once, however
    // many claims share it. Every type is then measured on this alone.
    let mut left: Counters = BTreeMap::new();
    for set in shared_counters {
        let counters = left.entry(set.name.clone()).or_default();
        for (name, counter) in &set.counters {
            counters.insert(name.clone(), Amount::parse(&counter.value.0).value);
        }
    }
    for partition in partitions {
        if used.devices.contains(partition.device.name.as_str()) {
            draw(&mut left, costs(partition.device));
        }
    }
    Ok(groups
        .into_iter()
        .map(|((attribute, type_), group)| {
            let mut left = left.clone();
            let mut allocatable = 0;
            for device in group.fresh {
                if fits(&left, costs(device)) {
                    allocatable += 1;
                    draw(&mut left, costs(device));
                }
            }
            PartitionType {
                attribute: attribute.to_string(),
                type_: type_.to_string(),
                total: group.total,
                allocatable,
            }
        })
        .collect())
}

/// A device's cost as one comparable text: `set/counter=quantity`, sorted.
/// Quantities compare as written canonically, so one amount spelt in two
/// formats differs.
fn cost_key(costs: &[DeviceCounterConsumption]) -> String {
    let mut parts: Vec<String> = costs
        .iter()
        .flat_map(|c| {
            c.counters.iter().map(move |(name, counter)| {
                let amount = Amount::parse(&counter.value.0);
                format!("{}/{name}={}", c.counter_set, amount.text())
            })
        })
        .collect();
    parts.sort();
    parts.join(",")
}

/// Whether every counter the device draws on exists and has enough left.
fn fits(left: &Counters, costs: &[DeviceCounterConsumption]) -> bool {
    costs.iter().all(|c| {
        c.counters.iter().all(|(name, counter)| {
            left.get(&c.counter_set)
                .and_then(|set| set.get(name))
                .is_some_and(|have| *have >= Amount::parse(&counter.value.0).value)
        })
    })
}

/// Takes the device's cost from the counters (unknown ones are skipped; a
/// counter may go below zero).
fn draw(left: &mut Counters, costs: &[DeviceCounterConsumption]) {
    for c in costs {
        let Some(set) = left.get_mut(&c.counter_set) else {
            continue;
        };
        for (name, counter) in &c.counters {
            if let Some(have) = set.get_mut(name) {
                let cost = Amount::parse(&counter.value.0).value;
                *have = have.checked_sub(cost).unwrap_or(*have);
            }
        }
    }
}

fn shareable_summary_of(
    driver: &str,
    pool: &str,
    held: &PoolDevices<'_>,
    used: &PoolUse<'_>,
) -> Result<Option<ShareableSummary>, String> {
    let shareable = || {
        held.devices
            .iter()
            .map(|(d, _)| *d)
            .filter(|d| d.allow_multiple_allocations == Some(true))
    };
    if shareable().next().is_none() {
        return Ok(None);
    }
    let (mut fully, mut partially) = (0, 0);
    let mut totals: BTreeMap<&str, Amount> = BTreeMap::new();
    for device in shareable() {
        if used.devices.contains(device.name.as_str()) {
            partially += 1;
        } else {
            fully += 1;
        }
        for (name, capacity) in device.capacity.iter().flatten() {
            let total = totals.entry(name.as_str()).or_default();
            *total = total.add(Amount::parse(&capacity.value.0));
        }
    }
    if totals.len() > MAX_ENTRIES {
        return Err(format!(
            "{SHAREABLE_SUMMARY_OVER_CAP} pool {driver}/{pool} has {} shareable capacity keys, exceeding the maximum of {MAX_ENTRIES}",
            totals.len()
        ));
    }
    // Consumption counts from every result in the pool; a capacity no
    // shareable device publishes is not reported.
    let capacity = totals
        .into_iter()
        .map(|(name, total)| {
            let consumed = used.consumed_of(name);
            ShareableCapacity {
                name: name.to_string(),
                total: total.text(),
                consumed: consumed.text(),
                available: total.minus_at_least_zero(consumed).text(),
            }
        })
        .collect();
    Ok(Some(ShareableSummary {
        fully_available: fully,
        partially_available: partially,
        capacity,
    }))
}

#[cfg(test)]
mod tests;
