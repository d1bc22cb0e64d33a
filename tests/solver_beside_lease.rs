//! A maximal solve does not stop the rest of the process. On a runtime with
//! one async worker (what the chart's one CPU gives), hostile claims whose
//! searches run to their bounds are solved one after another from a task while this process
//! leads: the lease is renewed on its rhythm throughout, and a work queue
//! served by another task keeps draining.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use dra_claim_controller::allocate::{self, AllocationInput, Outcome, node_inventory};
use dra_claim_controller::runtime::leader::fake_api::FakeLeaseApi;
use dra_claim_controller::runtime::leader::{LeaderElection, LeaderElectionOptions};
use dra_claim_controller::workqueue::WorkQueue;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;

const NODE: &str = "node-1";
const RETRY_PERIOD: Duration = Duration::from_millis(150);
/// Hostile claims solved one after the other.
const HOSTILE_IN_A_ROW: usize = 5;

/// 48 devices of driver-a on the node, none of driver-b.
fn node_slices() -> Vec<ResourceSlice> {
    let devices: Vec<_> = (0..48)
        .map(|i| json!({"name": format!("gpu-{i}")}))
        .collect();
    vec![
        serde_json::from_value(json!({
            "metadata": {"name": "slice-1"},
            "spec": {"driver": "driver-a", "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap(),
    ]
}

fn class(name: &str, driver: &str) -> (String, Arc<DeviceClass>) {
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}
    }))
    .unwrap();
    (name.to_owned(), Arc::new(class))
}

/// Eight of the 48 devices, then one device nobody offers: every choice of
/// eight is tried before the claim is found unsatisfiable, far more than
/// any bound allows (C(48, 8) ≈ 377 million).
fn hostile_claim() -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "hostile", "namespace": "tenant"},
        "spec": {"devices": {"requests": [
            {"name": "eight", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 8}},
            {"name": "absent", "exactly": {"deviceClassName": "fpga", "allocationMode": "ExactCount", "count": 1}},
        ]}}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn lease_renewals_and_queue_work_go_on_during_a_maximal_solve() {
    let api = FakeLeaseApi::new();
    let opts = LeaderElectionOptions {
        lease_namespace: Some("dra-system".into()),
        identity: Some("replica-a".into()),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: RETRY_PERIOD,
        ..LeaderElectionOptions::default()
    };
    let handle = LeaderElection::resolve(&opts)
        .unwrap()
        .spawn(api.client(), &prometheus::Registry::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), handle.wait_until_leader())
        .await
        .expect("became leader");

    // Other work of the process: a queue drained by a worker task, fed
    // every 10 ms.
    let queue: WorkQueue<String> = WorkQueue::new("solver_beside_lease", None);
    let handled = Arc::new(AtomicUsize::new(0));
    let worker = tokio::spawn({
        let (queue, handled) = (queue.clone(), handled.clone());
        async move {
            while let Some(key) = queue.get().await {
                handled.fetch_add(1, Ordering::Relaxed);
                queue.done(&key);
            }
        }
    });
    let feeder = tokio::spawn({
        let queue = queue.clone();
        async move {
            for i in 0.. {
                queue.add(format!("pod-{i}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });

    let slices = node_slices();
    let inventory = node_inventory(NODE, &slices);
    let classes: BTreeMap<_, _> = [class("gpu", "driver-a"), class("fpga", "driver-b")].into();
    let claim = hostile_claim();
    let (writes_before, handled_before) = (api.writes().len(), handled.load(Ordering::Relaxed));
    let started = Instant::now();
    // Solved from a task, as the controllers do: several hostile claims in
    // a row, each to its bound.
    let outcomes = tokio::spawn(async move {
        (0..HOSTILE_IN_A_ROW)
            .map(|_| {
                allocate::allocate(&AllocationInput {
                    claim: &claim,
                    classes: &classes,
                    node: NODE,
                    inventory: &inventory,
                    in_use: &HashSet::new(),
                    admin_access_enabled: false,
                    prioritized_list_enabled: false,
                })
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let solving = started.elapsed();
    let renewals: Vec<Instant> = api.writes()[writes_before..].iter().map(|w| w.at).collect();
    let handled_during = handled.load(Ordering::Relaxed) - handled_before;
    feeder.abort();
    queue.shut_down();
    let _ = worker.await;

    for outcome in &outcomes {
        // Whichever bound comes first: the steps (refused: the claim must
        // be simplified) or the clock (unsatisfiable for now).
        assert!(
            matches!(outcome, Outcome::Refused(why) | Outcome::Unsatisfiable(why) if why.contains("search")),
            "each search gave up at a bound: {outcome:?}"
        );
    }
    assert!(
        solving >= 4 * RETRY_PERIOD,
        "solving took several retry periods: {solving:?}"
    );
    let mut gaps: Vec<Duration> = renewals.windows(2).map(|w| w[1] - w[0]).collect();
    if let Some(first) = renewals.first() {
        gaps.push(*first - started);
    }
    let longest = gaps.iter().max().copied().unwrap_or(solving);
    println!(
        "solve {solving:?}: {} renewals, longest gap {longest:?}; {handled_during} queue items handled",
        renewals.len()
    );
    assert!(
        renewals.len() as u128 >= solving.as_millis() / (2 * RETRY_PERIOD.as_millis()),
        "the lease was renewed about every retry period while solving: {} in {solving:?}",
        renewals.len()
    );
    assert!(
        longest < 3 * RETRY_PERIOD,
        "no renewal waited on the solve: longest gap {longest:?}"
    );
    assert!(handle.is_leader(), "still leading after the solve");
    assert!(
        handled_during as u128 >= solving.as_millis() / 40,
        "the queue kept draining while solving: {handled_during} items in {solving:?}"
    );
}
