//! The controller process: client, HTTP endpoints, caches, leader
//! election, workers and a clean shutdown, wired together. `main.rs` only
//! parses flags and sets up logging; the development runner reuses this.

use std::process::ExitCode;

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::cli::{Args, ReferenceRelease};
use crate::model::features::Release;
use crate::model::selector::LabelSelector;
use std::sync::Arc;

use crate::controllers::allocator::{Controller as Allocator, SharedStores};
use crate::controllers::devicetaint::{
    Controller as DeviceTaintEviction, Settings as DeviceTaintSettings, Stores as DeviceTaintStores,
};
use crate::controllers::headroom::{
    Controller as Headroom, Settings as HeadroomSettings, Stores as HeadroomStores,
};
use crate::controllers::poolstatus::{
    PoolGauge, PoolMetrics, PoolStatusRequestStores, PoolStatusRequests,
};
use crate::controllers::resourceclaim::Controller;
use crate::model::views::{ClaimView, PodView};
use crate::runtime::informer::{Handler, Observer};
use crate::runtime::shared::WatchesSynced;
use crate::runtime::startup::{PER_TRY_DEADLINE, StartupRead, read_until_answered};
use watches::{DeviceObservers, DeviceWatches, Kinds};

mod startup_reads;
pub(crate) mod watches;
use crate::runtime::client::{ClientOptions, build_client};
use crate::runtime::controller::Lead;
use crate::runtime::delegated::Gate;
use crate::runtime::http::{Health, MetricsAccess, start_servers};
use crate::runtime::leader::{LeaderElection, LeaderElectionOptions};
use crate::runtime::optional_api::ApiStatus;
use crate::runtime::tls::{CertFiles, CertSource, server_config};
pub use startup_reads::minor_version;
use startup_reads::{StartupReads, reference_release, register_release_gauge, startup_reads};

use crate::runtime::process;
pub use crate::runtime::process::{
    PANIC_EXIT_CODE, block_on_exit, exit_on_panic, exit_usage, log_filter,
};

/// Logs to stderr, as text or JSON, filtered by RUST_LOG or --log-level.
pub fn init_logging(args: &Args) {
    process::init_logging(
        &args.effective_log_level(),
        "info",
        args.log_format == crate::cli::LogFormat::Json,
    );
}

/// How `/metrics` is served, from `--metrics-secure` and the TLS flags.
fn metrics_access(args: &Args, client: &kube::Client) -> anyhow::Result<MetricsAccess> {
    if !args.metrics_secure {
        return Ok(MetricsAccess::Open);
    }
    let source = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => CertSource::Files(CertFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        // Made in memory for this process; Prometheus skips verification
        // (the chart's default) or is given a real certificate instead.
        _ => CertSource::SelfSigned(vec![
            "localhost".into(),
            hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "dra-claim-controller".into()),
        ]),
    };
    Ok(MetricsAccess::Secure {
        tls: server_config(source)?,
        gate: Arc::new(Gate::new(client.clone())),
    })
}

/// Runs until SIGTERM/SIGINT (exit 0 after a clean hand-over) or until
/// leadership is lost (exit 1, so the Deployment restarts the pod).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let registry = prometheus::Registry::new();
    let exposition = crate::runtime::exposition::Exposition::from(registry.clone());
    let health = Health::default();
    let apis = ApiStatus::register(&registry, health.clone())?;

    let client_opts = ClientOptions {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        kubeconfig: args.kubeconfig.clone(),
        context: None,
        overrides: Default::default(),
    };
    let (client, drain) = build_client(&client_opts, &registry).await?;

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(forward_signals(stop_tx));
    let servers = start_servers(
        args.metrics_bind_address,
        args.health_probe_bind_address,
        exposition.clone(),
        health.clone(),
        metrics_access(&args, &client)?,
        stopped(stop_rx.clone()),
    )
    .await?;

    let election = LeaderElection::resolve(&LeaderElectionOptions {
        enabled: args.leader_elect,
        lease_name: args.leader_elect_resource_name.clone(),
        lease_namespace: args.leader_elect_resource_namespace.clone(),
        identity: None,
        lease_duration: args.leader_elect_lease_duration.0,
        renew_deadline: args.leader_elect_renew_deadline.0,
        retry_period: args.leader_elect_retry_period.0,
    })?;
    let identity = election.identity().to_string();
    info!(
        identity = %identity,
        qps = args.kube_api_qps,
        burst = args.kube_api_burst,
        workers = args.concurrent_syncs,
        feature_gates = %args.feature_gates.gates,
        "starting dra-claim-controller"
    );

    if !args.feature_gates.ignored.is_empty() {
        info!(
            gates = %args.feature_gates.ignored.join(","),
            "--feature-gates: ignoring kube-controller-manager gates that do not concern the claim controller"
        );
    }
    let mut gates = args.feature_gates.gates;
    // Nothing is done under an unknown release: the reads below are retried
    // until answered (the process live, `/readyz` saying what it waits for),
    // or until told to stop.
    let StartupReads {
        release,
        served_minor,
        pod_group_api,
        allocate_on_nodes,
    } = tokio::select! {
        reads = startup_reads(&client, &args, gates, &health, &apis) => reads?,
        _ = stopped(stop_rx.clone()) => {
            info!("stopping before start-up reads were answered");
            servers.wait().await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    gates.release = release;
    register_release_gauge(&registry, release, served_minor)?;
    // The allocator's declared nodes are created first: the claim
    // controller reads them to know whose claims are allocated here.
    let declared = allocate_on_nodes
        .as_ref()
        .map(|_| Arc::new(crate::runtime::store::Store::new(Vec::new())));
    let controller = Controller::new(
        client.clone(),
        gates,
        &registry,
        &identity,
        args.metrics_naming,
        pod_group_api,
        declared.clone(),
    )?;
    // One watch per kind for the whole process: the claim controller's
    // watches (pods, claims, templates, PodGroups) and, when a room reads
    // devices, one of slices, classes and nodes.
    let synced = WatchesSynced::default();
    let device_watches = Arc::new(DeviceWatches::new());
    let mut device_observers = DeviceObservers::default();
    let (mut pod_observers, mut claim_observers) = (Vec::new(), Vec::new());
    // The allocator and headroom's yield read rules' taints as
    // kube-scheduler does.
    let device_kinds = Kinds {
        slices: true,
        classes: true,
        nodes: true,
        rules: gates.device_taint_rules_on(),
    };
    let allocator = match (allocate_on_nodes, declared) {
        (Some(selector), Some(nodes)) => {
            device_watches.read(device_kinds);
            let caches = controller.caches();
            let allocator = Allocator::new(
                client.clone(),
                selector,
                nodes,
                SharedStores {
                    pods: caches.pods.clone(),
                    claims: caches.claims.clone(),
                    pod_groups: caches
                        .group_claims_enabled()
                        .then(|| caches.pod_groups.clone()),
                    devices: device_watches.stores().clone(),
                    synced: synced.clone(),
                },
                gates,
                &registry,
                &identity,
                crate::controllers::resourceclaim::EVENT_COMPONENT,
                controller.reachability().clone(),
            )?;
            pod_observers.push(allocator.clone() as Arc<dyn Observer<PodView>>);
            claim_observers.push(allocator.clone() as Arc<dyn Observer<ClaimView>>);
            device_observers.slices.push(allocator.clone() as _);
            device_observers.classes.push(allocator.clone() as _);
            device_observers.nodes.push(allocator.clone() as _);
            Some(allocator)
        }
        _ => None,
    };
    let headroom = if args.controllers.headroom {
        device_watches.read(device_kinds);
        let headroom = Headroom::new(
            client.clone(),
            &registry,
            HeadroomSettings {
                yield_enabled: args.headroom_yield,
                seed_watermarks: args.headroom_seed_watermarks,
                capacity_buffers: args.headroom_capacity_buffers,
                health: health.clone(),
                gates,
            },
            HeadroomStores {
                devices: device_watches.stores().clone(),
                claims: controller.caches().claims.clone(),
                claim_pods: controller.caches().pods.clone(),
                synced: synced.clone(),
            },
            &identity,
            controller.reachability().clone(),
        )?;
        claim_observers.push(headroom.clone() as Arc<dyn Observer<ClaimView>>);
        device_observers.slices.push(headroom.clone() as _);
        device_observers.classes.push(headroom.clone() as _);
        device_observers.nodes.push(headroom.clone() as _);
        tokio::spawn(headroom.clone().run_watch());
        Some(headroom)
    } else {
        None
    };
    let device_taints = if args.controllers.device_taint_eviction && gates.device_taints_on() {
        device_watches.read(Kinds {
            slices: true,
            rules: gates.device_taint_rules_on(),
            ..Kinds::default()
        });
        let caches = controller.caches();
        let eviction = DeviceTaintEviction::new(
            client.clone(),
            DeviceTaintSettings {
                workers: args.concurrent_device_taint_eviction_syncs as usize,
                gates,
                evictions_per_second: args.device_taint_evictions_per_second,
                evictions_per_rule_per_second: args.device_taint_evictions_per_rule_per_second,
                max_share: args.device_taint_eviction_max_share,
            },
            DeviceTaintStores {
                pods: caches.pods.clone(),
                claims: caches.claims.clone(),
                devices: device_watches.stores().clone(),
                synced: synced.clone(),
                rules_version: device_watches.rules_version(),
            },
            &registry,
            &identity,
            controller.reachability().clone(),
        )?;
        pod_observers.push(eviction.clone() as Arc<dyn Observer<PodView>>);
        claim_observers.push(eviction.clone() as Arc<dyn Observer<ClaimView>>);
        device_observers.slices.push(eviction.clone() as _);
        device_observers.rules.push(eviction.clone() as _);
        info!(
            workers = args.concurrent_device_taint_eviction_syncs,
            per_second = args.device_taint_evictions_per_second,
            per_rule_per_second = args.device_taint_evictions_per_rule_per_second,
            max_share = args.device_taint_eviction_max_share,
            rules = gates.device_taint_rules_on(),
            "device-taint eviction on"
        );
        Some(eviction)
    } else {
        if args.controllers.device_taint_eviction {
            info!("DRADeviceTaints is off: the device-taint eviction controller does not run");
        }
        None
    };
    let pool_status_requests =
        if args.controllers.resource_pool_status_request && gates.resource_pool_status {
            // 1.37 counts devices tainted by rules as unavailable.
            device_watches.read(Kinds {
                slices: true,
                rules: gates.release.is_1_37() && gates.device_taint_rules_on(),
                ..Kinds::default()
            });
            let requests = PoolStatusRequests::new(
                client.clone(),
                gates.release,
                PoolStatusRequestStores {
                    slices: device_watches.stores().slices.clone(),
                    claims: controller.caches().claims.clone(),
                    rules: device_watches.stores().rules.clone(),
                },
                &registry,
                controller.reachability().clone(),
            )?;
            tokio::spawn(requests.clone().run_watch(client.clone(), apis.clone()));
            info!("ResourcePoolStatusRequests are answered (DRAResourcePoolStatus is on)");
            Some(requests)
        } else {
            None
        };
    if args.pool_metrics != PoolMetrics::Off {
        device_watches.read(Kinds {
            slices: true,
            rules: gates.device_taint_rules_on(),
            ..Kinds::default()
        });
        exposition.add_text(Arc::new(PoolGauge::new(
            device_watches.stores().clone(),
            controller.caches().claims.clone(),
            synced.clone(),
            args.pool_metrics,
        )));
    }
    controller.observe(pod_observers, claim_observers);
    let reads_devices = device_watches.kinds().any();
    if reads_devices {
        let watches = device_watches.clone();
        let client = client.clone();
        let apis = apis.clone();
        tokio::spawn(async move { watches.run(client, device_observers, apis).await });
    }
    let also_pods: Vec<Arc<dyn Handler<PodView>>> = headroom
        .iter()
        .map(|h| h.clone() as Arc<dyn Handler<PodView>>)
        .collect();
    tokio::spawn(controller.clone().run_watches(also_pods));
    tokio::spawn(controller.clone().run_reachability_probe());
    {
        let (controller, watches, synced) =
            (controller.clone(), device_watches.clone(), synced.clone());
        tokio::spawn(async move {
            controller.wait_synced().await;
            if reads_devices {
                watches.wait_synced().await;
            }
            synced.set();
        });
    }
    let synced = {
        let headroom = headroom.clone();
        let synced = synced.clone();
        move || {
            let headroom = headroom.clone();
            let synced = synced.clone();
            async move {
                synced.wait().await;
                if let Some(headroom) = &headroom {
                    headroom.wait_synced().await;
                }
            }
        }
    };
    {
        // Ready once the caches are loaded; a standby is ready too.
        let health = health.clone();
        let synced = synced();
        tokio::spawn(async move {
            synced.await;
            health.set_ready(true);
            info!("caches synced");
        });
    }

    let client_for_version = client.clone();
    let leader = election.spawn(client, &registry)?;
    health.follow_lease(leader.lease_health());
    let mut lost = std::pin::pin!(leader.lost());

    // Stand by until leading (caches warm), or until told to stop.
    tokio::select! {
        _ = async { leader.wait_until_leader().await; synced().await } => {}
        _ = stopped(stop_rx.clone()) => {
            info!("stopping before ever leading");
            leader.release().await;
            servers.wait().await?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    // Leadership may have come and gone while the caches loaded.
    if !leader.is_leader() {
        error!("lost leadership before starting work; exiting");
        return Ok(ExitCode::from(1));
    }
    // A standby may take the lead long after it started, on an upgraded
    // cluster: its rules must be those of the release serving now.
    // The read is retried within the renew deadline at most: a leader must
    // not hold the Lease doing nothing while /version stays unanswered, so
    // past it the release read at start stands.
    if args.reference_release == ReferenceRelease::Auto {
        let bound = args.leader_elect_renew_deadline.0;
        let reread = tokio::time::timeout(
            bound,
            reference_release(&client_for_version, ReferenceRelease::Auto, &health),
        );
        let now = tokio::select! {
            now = reread => now,
            reason = &mut lost => {
                error!(reason = %reason, "lost leadership while reading the release; exiting");
                return Ok(ExitCode::from(1));
            }
            _ = stopped(stop_rx.clone()) => {
                leader.release().await;
                servers.wait().await?;
                return Ok(ExitCode::SUCCESS);
            }
        };
        match now {
            Ok(Ok(now)) if now.release != release => {
                let now = now.release;
                warn!(started_as = %release, serving = %now, "the API server's release changed since start; restarting to follow it");
                leader.release().await;
                return Ok(ExitCode::from(1));
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                warn!(release = %release, error = %format!("{e:#}"), "reading the release again at takeover failed; acting under the release read at start");
            }
            Err(_) => {
                health.set_waiting_for(None);
                warn!(release = %release, bound_s = bound.as_secs_f64(), "the release was not read again within the renew deadline at takeover; acting under the release read at start");
            }
        }
    }
    // Every controller alike, run by the runtime: lead, work, and on the
    // way out no new work, then the requests in flight.
    let mut rooms: Vec<Box<dyn Lead>> = vec![Box::new(
        controller.run(args.concurrent_syncs as usize, args.min_resync_period.0),
    )];
    if let Some(allocator) = &allocator {
        rooms.push(Box::new(allocator.run(args.min_resync_period.0)));
    }
    if let Some(headroom) = &headroom {
        rooms.push(Box::new(headroom.run()));
    }
    if let Some(eviction) = &device_taints {
        rooms.push(Box::new(eviction.run()));
    }
    if let Some(requests) = &pool_status_requests {
        rooms.push(Box::new(requests.run()));
    }
    let workers: Vec<tokio::task::JoinHandle<()>> =
        rooms.iter().map(|room| tokio::spawn(room.lead())).collect();
    let abort_workers =
        |workers: &[tokio::task::JoinHandle<()>]| workers.iter().for_each(|w| w.abort());
    let shut_queues = || rooms.iter().for_each(|room| room.stop_taking_work());

    tokio::select! {
        reason = &mut lost => {
            // Never two leaders writing: stop at once and let the Deployment restart us.
            error!(reason = %reason, "lost leadership; exiting");
            drain.start();
            shut_queues();
            return Ok(ExitCode::from(1));
        }
        _ = stopped(stop_rx.clone()) => {}
    }

    // Hand over fast: whatever has not been sent yet is abandoned (the next
    // leader redoes it: claims are adopted before any is created, writes
    // are guarded), requests on the wire are awaited, then the lease goes.
    info!(
        timeout_s = args.shutdown_timeout.0.as_secs_f64(),
        "shutting down: abandoning requests not yet sent, waiting for those in flight"
    );
    // No new work first, so that refused requests are not mistaken for an
    // unreachable API server.
    shut_queues();
    drain.start();
    let in_flight = futures::future::join_all(rooms.iter().map(|room| room.finish_in_flight()));
    tokio::select! {
        finished = tokio::time::timeout(args.shutdown_timeout.0, in_flight) => {
            if finished.is_err() {
                // A request cut off now might still reach the server after a
                // successor started: let the Lease expire instead.
                warn!("requests in flight did not finish within --shutdown-timeout; not releasing the lease, it will expire");
                abort_workers(&workers);
                servers.wait().await?;
                return Ok(ExitCode::SUCCESS);
            }
        }
        reason = &mut lost => {
            // Someone else leads already: nothing to release, stop writing now.
            error!(reason = %reason, "lost leadership while shutting down; exiting");
            abort_workers(&workers);
            return Ok(ExitCode::from(1));
        }
    }
    abort_workers(&workers);
    leader.release().await;
    info!("lease released");
    servers.wait().await?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves once the stop flag is set.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// SIGTERM (kubelet) and SIGINT (a terminal) both start a clean shutdown.
async fn forward_signals(stop: watch::Sender<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; SIGTERM will not shut down cleanly");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!(signal = "SIGTERM", "shutdown requested"),
        _ = int.recv() => info!(signal = "SIGINT", "shutdown requested"),
    }
    let _ = stop.send(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read a standby makes when it takes the lead: through a 503 and
    /// a lost answer, it comes back with the release served now.
    #[tokio::test(start_paused = true)]
    async fn the_release_is_read_again_through_faults() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let health = Health::default();
        let read = tokio::spawn({
            let health = health.clone();
            async move { reference_release(&client, ReferenceRelease::Auto, &health).await }
        });
        let respond = |status: u16, body: serde_json::Value| {
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(respond(
            503,
            serde_json::json!({"kind": "Status", "code": 503, "message": "unavailable"}),
        ));
        // Never answered: the try's deadline ends it.
        let (_, lost) = handle.next_request().await.unwrap();
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/version");
        send.send_response(respond(
            200,
            serde_json::json!({"major": "1", "minor": "36+", "gitVersion": "v1.36.2", "gitCommit": "",
                               "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "",
                               "platform": "linux/amd64"}),
        ));
        let read = read.await.unwrap().unwrap();
        assert_eq!(read.release, Release::V1_36);
        assert_eq!(read.source, "the API server's version");
        assert_eq!(read.served_minor, Some(36));
        drop(lost);
    }

    #[test]
    fn minor_versions() {
        assert_eq!(minor_version("36"), Some(36));
        assert_eq!(minor_version("37+"), Some(37));
        assert_eq!(minor_version(""), None);
        assert_eq!(minor_version("x"), None);
    }
}
