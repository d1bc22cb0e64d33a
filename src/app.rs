//! The controller process in four phases: start-up reads (the client, the
//! HTTP endpoints, the release acting), build (the controllers on the
//! shared watches, from one table), lead (the runtime runs every
//! controller's workers while this replica holds the Lease), and shut down
//! (a clean hand-over). `main.rs` only parses flags and sets up logging;
//! the development runner reuses this.

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::cli::{Args, ReferenceRelease};
use crate::model::features::{FeatureGates, Release};
use crate::runtime::client::{ClientOptions, Drain, build_client};
use crate::runtime::controller::Lead;
use crate::runtime::delegated::Gate;
use crate::runtime::http::{Health, MetricsAccess, Servers, start_servers};
use crate::runtime::leader::{LeaderElection, LeaderElectionOptions, LeadershipLost};
use crate::runtime::optional_api::ApiStatus;
use crate::runtime::tls::{CertFiles, CertSource, server_config};
use crate::shared::{Endpoints, Shared};
use crate::watches::claims::ClaimWatches;

mod controllers;
mod startup_reads;
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
    // 1. Start-up: endpoints, client, and the reads nothing is done without.
    let Some(process) = start_up(&args).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    // 2. Build: every controller that runs, on the process's shared watches.
    let shared = Shared::new(
        process.client.clone(),
        process.identity.clone(),
        process.gates,
        process.endpoints.clone(),
        ClaimWatches::new(process.reads.pod_group_api.clone()),
    );
    let rooms = controllers::build(&shared, &args, process.reads.allocate_on_nodes.clone())?;
    let ready = start_watches(&shared);
    // 3. Lead: stand by until leading with warm caches, then every
    // controller's workers until told to stop (or the Lease is lost).
    let leader = process
        .election
        .spawn(process.client.clone(), &process.endpoints.registry)?;
    process.endpoints.health.follow_lease(leader.lease_health());
    let mut lost = std::pin::pin!(leader.lost());
    let stop = process.stop.clone();
    tokio::select! {
        _ = async { leader.wait_until_leader().await; ready.wait().await } => {}
        _ = stopped(stop.clone()) => {
            info!("stopping before ever leading");
            leader.release().await;
            process.servers.wait().await?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    // Leadership may have come and gone while the caches loaded.
    if !leader.is_leader() {
        error!("lost leadership before starting work; exiting");
        return Ok(ExitCode::from(1));
    }
    let release = process.reads.release;
    tokio::select! {
        keep = release_still_serving(&args, &process.client, release, &process.endpoints.health) => {
            if !keep {
                leader.release().await;
                return Ok(ExitCode::from(1));
            }
        }
        reason = &mut lost => {
            error!(reason = %reason, "lost leadership while reading the release; exiting");
            return Ok(ExitCode::from(1));
        }
        _ = stopped(stop.clone()) => {
            leader.release().await;
            process.servers.wait().await?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    let workers: Vec<tokio::task::JoinHandle<()>> =
        rooms.iter().map(|room| tokio::spawn(room.lead())).collect();
    tokio::select! {
        reason = &mut lost => {
            // Never two leaders writing: stop at once and let the Deployment restart us.
            error!(reason = %reason, "lost leadership; exiting");
            process.drain.start();
            rooms.iter().for_each(|room| room.stop_taking_work());
            return Ok(ExitCode::from(1));
        }
        _ = stopped(stop) => {}
    }
    // 4. Shut down: a clean hand-over.
    let handed_over = shut_down(&args, &rooms, &process.drain, lost).await;
    workers.iter().for_each(|w| w.abort());
    match handed_over {
        HandOver::Release => {
            leader.release().await;
            info!("lease released");
        }
        HandOver::LetExpire => {}
        HandOver::Lost => return Ok(ExitCode::from(1)),
    }
    process.servers.wait().await?;
    Ok(ExitCode::SUCCESS)
}

/// What start-up made and read.
struct Process {
    client: kube::Client,
    /// Abandons requests not yet sent, at shut-down.
    drain: Drain,
    servers: Servers,
    stop: watch::Receiver<bool>,
    election: LeaderElection,
    identity: String,
    /// The gates, with the release acting.
    gates: FeatureGates,
    endpoints: Endpoints,
    reads: StartupReads,
}

/// The endpoints, the client, the election's settings and the start-up
/// reads, each retried until answered (the process live, `/readyz` saying
/// what it waits for); `None`: told to stop before they were.
async fn start_up(args: &Args) -> anyhow::Result<Option<Process>> {
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

    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(forward_signals(stop_tx));
    let servers = start_servers(
        args.metrics_bind_address,
        args.health_probe_bind_address,
        exposition.clone(),
        health.clone(),
        metrics_access(args, &client)?,
        stopped(stop.clone()),
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
    // Nothing is done under an unknown release.
    let reads = tokio::select! {
        reads = startup_reads(&client, args, gates, &health, &apis) => reads?,
        _ = stopped(stop.clone()) => {
            info!("stopping before start-up reads were answered");
            servers.wait().await?;
            return Ok(None);
        }
    };
    gates.release = reads.release;
    register_release_gauge(&registry, reads.release, reads.served_minor)?;
    Ok(Some(Process {
        client,
        drain,
        servers,
        stop,
        election,
        identity,
        gates,
        endpoints: Endpoints {
            registry,
            exposition,
            health,
            apis,
        },
        reads,
    }))
}

/// At takeover, whether the release read at start still serves: a standby
/// may take the lead long after it started, on an upgraded cluster, and
/// its rules must be those of the release serving now (`false`: it
/// changed, restart to follow it). The read is retried within the renew
/// deadline at most: a leader must not hold the Lease doing nothing while
/// `/version` stays unanswered, so past it the release read at start
/// stands.
async fn release_still_serving(
    args: &Args,
    client: &kube::Client,
    release: Release,
    health: &Health,
) -> bool {
    if args.reference_release != ReferenceRelease::Auto {
        return true;
    }
    let bound = args.leader_elect_renew_deadline.0;
    let reread = tokio::time::timeout(
        bound,
        reference_release(client, ReferenceRelease::Auto, health),
    );
    match reread.await {
        Ok(Ok(now)) if now.release != release => {
            let now = now.release;
            warn!(started_as = %release, serving = %now, "the API server's release changed since start; restarting to follow it");
            false
        }
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            warn!(release = %release, error = %format!("{e:#}"), "reading the release again at takeover failed; acting under the release read at start");
            true
        }
        Err(_) => {
            health.set_waiting_for(None);
            warn!(release = %release, bound_s = bound.as_secs_f64(), "the release was not read again within the renew deadline at takeover; acting under the release read at start");
            true
        }
    }
}

/// How a shut-down ended.
enum HandOver {
    /// Every request in flight finished: release the Lease.
    Release,
    /// Some did not within `--shutdown-timeout`: one cut off now might
    /// still reach the server after a successor started, so the Lease is
    /// left to expire.
    LetExpire,
    /// Someone else leads already: nothing to release.
    Lost,
}

/// Hands over fast: whatever has not been sent yet is abandoned (the next
/// leader redoes it: claims are adopted before any is created, writes are
/// guarded), and the requests on the wire are awaited.
async fn shut_down(
    args: &Args,
    rooms: &[Box<dyn Lead>],
    drain: &Drain,
    lost: std::pin::Pin<&mut (impl Future<Output = LeadershipLost> + ?Sized)>,
) -> HandOver {
    info!(
        timeout_s = args.shutdown_timeout.0.as_secs_f64(),
        "shutting down: abandoning requests not yet sent, waiting for those in flight"
    );
    // No new work first, so that refused requests are not mistaken for an
    // unreachable API server.
    rooms.iter().for_each(|room| room.stop_taking_work());
    drain.start();
    let in_flight = futures::future::join_all(rooms.iter().map(|room| room.finish_in_flight()));
    tokio::select! {
        finished = tokio::time::timeout(args.shutdown_timeout.0, in_flight) => {
            if finished.is_err() {
                warn!("requests in flight did not finish within --shutdown-timeout; not releasing the lease, it will expire");
                HandOver::LetExpire
            } else {
                HandOver::Release
            }
        }
        reason = lost => {
            error!(reason = %reason, "lost leadership while shutting down; exiting");
            HandOver::Lost
        }
    }
}

/// Runs the shared watches with every subscriber, the API server's probe
/// and the controllers' own watches; the returned flag is set once every
/// store is loaded (and the controllers' own stores too): the process is
/// ready, a standby too, and may lead.
fn start_watches(shared: &Shared) -> crate::runtime::shared::WatchesSynced {
    let subscriptions = shared.subscriptions();
    let reads_devices = shared.devices.kinds().any();
    if reads_devices {
        let (watches, client, apis) = (
            shared.devices.clone(),
            shared.client.clone(),
            shared.apis.clone(),
        );
        let observers = subscriptions.devices;
        tokio::spawn(async move { watches.run(client, observers, apis).await });
    }
    {
        let (watches, client) = (shared.claims.clone(), shared.client.clone());
        let observers = subscriptions.claims;
        tokio::spawn(async move { watches.run(client, observers).await });
    }
    {
        let (reachability, client) = (shared.reachability.clone(), shared.client.clone());
        tokio::spawn(async move { reachability.probe(client).await });
    }
    for task in subscriptions.tasks {
        tokio::spawn(task);
    }
    let ready = crate::runtime::shared::WatchesSynced::default();
    {
        let (claims, devices, synced) = (
            shared.claims.clone(),
            shared.devices.clone(),
            shared.synced.clone(),
        );
        let (ready, health) = (ready.clone(), shared.health.clone());
        let synced_too = subscriptions.synced_too;
        tokio::spawn(async move {
            claims.wait_synced().await;
            if reads_devices {
                devices.wait_synced().await;
            }
            synced.set();
            futures::future::join_all(synced_too).await;
            ready.set();
            health.set_ready(true);
            info!("caches synced");
        });
    }
    ready
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
