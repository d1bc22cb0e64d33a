//! What a watermark wants now, decided from a snapshot of the stores
//! (pure; table-tested in `plan/tests.rs`): the status it observes, and
//! the objects that keep its placeholders.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::Value;
use tracing::{debug, warn};

use super::desired::{
    CPU_MEMORY_ENTRY, Owner, cpu_memory_deployment, device_claim_template, device_deployment,
};
use super::devices::{Consumer, DeviceCount, count_devices, device_consumers, entry_devices};
use super::sizing::{Bounds, placeholders, resource_placeholders};
use super::status::{EntryObserved, Observed};
use super::usage::{is_workload, workload_requests};
use super::watermark::{WatermarkView, selects};
use crate::allocate::on_solver_stack;
use crate::allocate::quantity::Quantity;
use crate::model::views::{ClaimView, NodeView, PodView};
use crate::runtime::error::SyncError;
use crate::runtime::store::object_key;

/// The stores as one sync reads them.
#[derive(Default)]
pub(crate) struct Snapshot {
    pub nodes: Vec<Arc<NodeView>>,
    pub pods: Vec<Arc<PodView>>,
    pub classes: Vec<Arc<DeviceClass>>,
    pub slices: Vec<Arc<ResourceSlice>>,
    pub claims: Vec<Arc<ClaimView>>,
}

/// What a watermark wants.
#[derive(Debug)]
pub(crate) struct Plan {
    pub observed: Observed,
    /// Server-side apply bodies, templates before the Deployments that
    /// name them.
    pub objects: Vec<Value>,
}

impl Snapshot {
    /// What the watermark `key` wants now: the status and the objects
    /// (templates before the Deployments that name them).
    pub(crate) fn plan(&self, key: &str, wm: &WatermarkView) -> Result<Plan, SyncError> {
        let settled = wm.spec.settle();
        let mut nodes: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| selects(&settled.placement.node_selector, n.labels()))
            .map(|n| n.name().to_string())
            .collect();
        nodes.sort();
        let selected: HashSet<&str> = nodes.iter().map(String::as_str).collect();
        let pods = &self.pods;
        let usage = workload_requests(pods.iter().map(|p| &**p), |n| selected.contains(n));
        let placeholders_of = |entry: &str| {
            let mine = pods.iter().filter(|p| {
                p.namespace() == wm.namespace()
                    && p.placeholder_of() == Some(wm.name())
                    && p.placeholder_entry() == Some(entry)
                    && !p.is_terminal()
                    && !p.is_deleting()
            });
            let (bound, unbound): (Vec<_>, Vec<_>) = mine.partition(|p| p.node_name().is_some());
            (count(bound.len()), count(unbound.len()))
        };
        let owner = Owner {
            namespace: wm.namespace(),
            name: wm.name(),
            uid: wm.uid(),
        };
        let mut observed = Observed {
            generation: wm.metadata.generation,
            entries: Vec::new(),
            // Counted by `sync`, from the status and the yields since.
            yields: 0,
        };
        let mut objects = Vec::new();

        let (ready, pending) = placeholders_of(CPU_MEMORY_ENTRY);
        let mut cpu = EntryObserved {
            name: CPU_MEMORY_ENTRY.into(),
            ready,
            pending,
            ..EntryObserved::default()
        };
        match &settled.cpu_memory {
            Ok(entry) => {
                cpu.desired =
                    resource_placeholders(&usage, entry.percentage, &entry.pause, entry.bounds);
                objects.push(cpu_memory_deployment(
                    owner,
                    &settled.placement,
                    entry,
                    cpu.desired,
                ));
                debug!(in_use = ?usage, desired = cpu.desired, "resource placeholders sized");
            }
            Err(why) => cpu.invalid = Some(why.clone()),
        }
        observed.entries.push(cpu);

        if !wm.spec.devices.is_empty() {
            let counts = self.count_entry_devices(key, wm, &nodes, &selected)?;
            for (entry, counted) in wm.spec.devices.iter().zip(counts) {
                let (ready, pending) = placeholders_of(&entry.name);
                let mut e = EntryObserved {
                    name: entry.name.clone(),
                    ready,
                    pending,
                    ..EntryObserved::default()
                };
                match counted {
                    Ok(devices) => {
                        let percentage = entry
                            .watermark_percentage
                            .unwrap_or(wm.spec.watermark_percentage);
                        let bounds = Bounds {
                            min: entry.min_placeholders,
                            max: entry.max_placeholders,
                        };
                        let per = i64::from(entry.count.unwrap_or(1));
                        e.desired = placeholders(
                            Quantity::from_units(i64::from(devices.in_use)),
                            percentage,
                            Quantity::from_units(per),
                            bounds,
                        );
                        e.devices = Some(devices);
                        objects.push(device_claim_template(owner, entry));
                        objects.push(device_deployment(
                            owner,
                            &settled.placement,
                            entry,
                            e.desired,
                        ));
                        debug!(entry = %entry.name, total = devices.total, in_use = devices.in_use, held = devices.held, desired = e.desired, "device placeholders sized");
                    }
                    Err(why) => {
                        warn!(entry = %entry.name, reason = %why, "device entry is invalid; no placeholders for it");
                        e.invalid = Some(why);
                    }
                }
                observed.entries.push(e);
            }
        }
        Ok(Plan { observed, objects })
    }

    /// Each device entry's count, or why it is invalid. Compiling and
    /// evaluating CEL happens on the solver's stack (tenant expressions).
    fn count_entry_devices(
        &self,
        key: &str,
        wm: &WatermarkView,
        nodes: &[String],
        selected: &HashSet<&str>,
    ) -> Result<Vec<Result<DeviceCount, String>>, SyncError> {
        let classes: BTreeMap<String, Arc<DeviceClass>> = self
            .classes
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c.clone()))
            .collect();
        let (slices, claims) = (&self.slices, &self.claims);
        let by_uid: HashMap<&str, &PodView> = self
            .pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, &**p)))
            .collect();
        let consumers = device_consumers(claims, |uid| {
            let pod = by_uid.get(uid)?;
            match (pod.placeholder_of(), pod.placeholder_entry()) {
                (Some(w), Some(e)) => Some(Consumer::Placeholder(
                    object_key(pod.namespace(), w),
                    e.to_string(),
                )),
                _ if is_workload(pod, |n| selected.contains(n)) => Some(Consumer::Workload),
                _ => None,
            }
        });
        on_solver_stack(|| {
            wm.spec
                .devices
                .iter()
                .enumerate()
                .map(|(i, entry)| {
                    let devices = entry_devices(i, entry, &classes)?;
                    let mine = Consumer::Placeholder(key.to_string(), entry.name.clone());
                    Ok(count_devices(&devices, &mine, nodes, slices, &consumers))
                })
                .collect()
        })
        .map_err(|err| SyncError::Invalid(format!("cannot start the CEL thread: {err}")))
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
