//! A batch through a faulty API: the controller talks to the API server
//! through the fault proxy, which answers a share of its requests with
//! 409/429/500/503 or holds them, cuts or stalls its watches and answers
//! some with `410 Gone`. Nothing may be lost or doubled.

use std::time::{Duration, Instant};

use anyhow::ensure;
use serde_json::json;

use crate::blackhole::{BlackholeProxy, Policy};
use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::fault_proxy::{FaultPlan, FaultProxy};
use crate::faults::{Batch, BatchRun, Tally, check_quiet, relists};
use crate::faults_restarts::{Victim, kill_repeatedly, restart};
use crate::invariants::{Expect, Ledger, Report};
use crate::k8s::{Source, pod_ref, wait_for};

const PODS: usize = 100;

fn plan() -> FaultPlan {
    FaultPlan {
        conflict: 40,
        too_many: 30,
        internal: 40,
        unavailable: 30,
        hold: 2,
        hold_for: Duration::from_secs(30),
        gone_event: 150,
        gone_http: 50,
        // Every watch stream is cut or stalls sooner or later.
        cut: 850,
        cut_after: (Duration::from_secs(1), Duration::from_secs(5)),
        stall: 1000,
        stall_after: (Duration::from_secs(1), Duration::from_secs(5)),
        // A held lease renewal ends leadership by design (the process exits
        // and is restarted); that path has tests of its own, this one is
        // about claim work under faults.
        spare: vec!["/apis/coordination.k8s.io/".into()],
        ..FaultPlan::default()
    }
}

/// Starts the fault proxy in front of the isolated API server and one
/// controller that talks only to the proxy, with its own token.
pub async fn controller_behind_proxy(t: &mut TestCtx, plan: FaultPlan) -> FaultProxy {
    let (proxy, kubeconfig) = fault_proxy_kubeconfig(t, plan).await;
    t.isolated_env()
        .start_controller_with_kubeconfig(&kubeconfig)
        .await
        .expect("start the controller behind the proxy");
    proxy
}

/// The fault proxy in front of the isolated API server, and a kubeconfig
/// for it with the controller's token.
pub(crate) async fn fault_proxy_kubeconfig(
    t: &mut TestCtx,
    plan: FaultPlan,
) -> (FaultProxy, std::path::PathBuf) {
    let cluster = &t.isolated_env().cluster;
    let url = cluster.url().expect("API server URL");
    let kubeconfig = cluster.dir.join("controller-via-proxy.kubeconfig");
    let (ca, original) = (cluster.ca_file(), cluster.controller_kubeconfig.clone());
    let proxy = FaultProxy::start(&url, &ca, plan)
        .await
        .expect("start the fault proxy");
    proxy
        .write_kubeconfig(&original, &kubeconfig)
        .expect("write the proxy kubeconfig");
    (proxy, kubeconfig)
}

/// [`controller_behind_proxy`] with a blackholing TCP proxy in front of
/// the fault proxy: the controller's connections also go dark as `policy`
/// says (plain HTTP/1.1 to the fault proxy, so this covers the transport's
/// HTTP/1.1 side: deadlines and poisoned connections, no pings).
async fn controller_behind_proxy_and_blackhole(
    t: &mut TestCtx,
    plan: FaultPlan,
    policy: Policy,
) -> (FaultProxy, BlackholeProxy) {
    let (proxy, via_proxy) = fault_proxy_kubeconfig(t, plan).await;
    let blackhole = BlackholeProxy::start(proxy.addr, policy)
        .await
        .expect("start the blackhole proxy");
    let kubeconfig = t
        .isolated_env()
        .cluster
        .dir
        .join("controller-via-blackhole-and-proxy.kubeconfig");
    blackhole
        .write_kubeconfig(&via_proxy, &kubeconfig)
        .expect("write the blackhole kubeconfig");
    t.isolated_env()
        .start_controller_with_kubeconfig(&kubeconfig)
        .await
        .expect("start the controller behind both proxies");
    (proxy, blackhole)
}

/// 100 pods × 2 template entries (a quarter pre-scheduled), allocated,
/// reserved, then all done, with about one ordinary request in seven
/// failing and every watch cut or refused sooner or later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_through_faulty_api() {
    const NAME: &str = "batch_through_faulty_api";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let proxy = controller_behind_proxy(&mut t, plan()).await;

    let run = BatchRun::start(&t, NAME, PODS).await;
    run.batch.create_pods(&t).await;
    let created = run.check_created(&t).await;

    let expect = run.allocate(&t).await;
    run.phases.done("claims allocated and reserved");
    run.batch.mark_done(&t).await;
    let done = run.check_released(&t, &expect).await;

    finish_proxied_batch(
        t,
        NAME,
        &proxy,
        &run,
        &expect,
        [&created, &done],
        Tally::default(),
        1,
    )
    .await;
}

/// Claim creations that succeed on the server but whose answer the
/// controller never sees (`code` instead), with watch events arriving
/// `watch_lag` late: a retry must adopt the claim already made, not create
/// a second one.
async fn lost_create_answers(name: &'static str, code: u16, watch_lag: Duration) {
    let Some(mut t) = TestCtx::isolated(name, ControllerOpts::default(), 0).await else {
        return;
    };
    let plan = FaultPlan {
        lost_create: 300,
        lost_create_code: code,
        watch_lag,
        ..FaultPlan::default()
    };
    let proxy = controller_behind_proxy(&mut t, plan).await;

    let ledger = Ledger::start(&t).await;
    let batch = Batch {
        pods: 50,
        prescheduled_every: 0,
    };
    batch.create_templates(&t).await;
    batch.create_pods(&t).await;
    batch.wait_all_recorded(&t).await;
    let report = check_quiet(&t, "after creation", &Expect::default(), &ledger).await;
    let counts = proxy.counts();
    Tally {
        violations: report.violations.len(),
        ..Tally::default()
    }
    .with("lost_create", counts.lost_create)
    .with("answered", code)
    .with("watch_lag_ms", watch_lag.as_millis())
    .with("claims_seen", ledger.claims_seen())
    .print(name);
    assert!(report.ok(), "{report}");
    t.finish();
}

/// The retry after a lost create comes after a warning event and a 5 ms
/// backoff; whether the watch has shown the claim by then is a race, which
/// a loaded API server loses (here made certain with watch events a second
/// late). Adoption looks only at the cache, so the retry creates a second
/// claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_answer_with_lagging_watch_makes_no_duplicate() {
    lost_create_answers(
        "lost_create_answer_with_lagging_watch_makes_no_duplicate",
        500,
        Duration::from_secs(1),
    )
    .await;
}

/// kube-apiserver answers 504 when a request outlives its timeout, even
/// though the write may still commit; so do load balancers. kube's client
/// retries 504 for every method, POST included, and each retry of a
/// `generateName` create makes another claim that nobody records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_answer_504_makes_no_duplicate() {
    lost_create_answers(
        "lost_create_answer_504_makes_no_duplicate",
        504,
        Duration::ZERO,
    )
    .await;
}

/// Every watch stream goes silent while 20 pods run (the proxy stops
/// forwarding bytes and keeps the connections open, as an overloaded proxy
/// or a half-open connection does); then 10 of the pods finish. Their
/// claims must be released and deleted once the silent streams are
/// replaced: within the watch timeout plus kube-runtime's 5 s margin (at
/// most 55 s), not the five minutes a default watch trusts a silent stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_watches_are_replaced() {
    const NAME: &str = "silent_watches_are_replaced";
    /// Liveness bound of the check (not a speed target): twice the
    /// controller's worst case.
    const BOUND: Duration = Duration::from_secs(30);
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let proxy = controller_behind_proxy(&mut t, FaultPlan::default()).await;
    t.create_template("tmpl").await;
    let mut claims = Vec::new();
    for i in 0..20 {
        let name = format!("runner-{i}");
        t.create_pod(&name, &[("gpu", Source::Template("tmpl"))], None)
            .await;
    }
    for i in 0..20 {
        let name = format!("runner-{i}");
        let claim = t.wait_recorded(&name, &["gpu"]).await["gpu"]
            .metadata
            .name
            .clone()
            .unwrap();
        let pod = t.pod(&name).await;
        t.set_pod_phase(&name, "Running").await;
        t.allocate(&claim, json!([pod_ref(&pod)])).await;
        claims.push(claim);
    }
    // The controller has seen every allocation before its streams go quiet
    // (its claim gauge counts them from its cache).
    wait_for(
        "the controller to cache the 20 allocated claims",
        BOUND,
        async || {
            let text = t.controller().metrics_text().await?;
            let allocated = crate::rawhttp::metric_value(
                &text,
                "resourceclaim_controller_resource_claims",
                &["allocated=\"true\""],
            )
            .unwrap_or_default();
            anyhow::ensure!(allocated >= 20.0, "{allocated} allocated claims cached");
            Ok(())
        },
    )
    .await;
    proxy.stall_open_watches();
    let silent_since = Instant::now();
    for i in 0..10 {
        t.set_pod_phase(&format!("runner-{i}"), "Succeeded").await;
    }
    wait_for(
        "the finished pods' claims to be deleted after the watches went silent",
        BOUND,
        async || {
            let left: Vec<String> = t
                .all_claims()
                .await?
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .filter(|n| claims[..10].contains(n))
                .collect();
            ensure!(left.is_empty(), "{} still there", left.len());
            Ok(())
        },
    )
    .await;
    let resumed = silent_since.elapsed();
    let counts = proxy.counts();
    println!(
        "STALL: {NAME}: work resumed {:.1}s after every watch went silent ({} streams stalled)",
        resumed.as_secs_f64(),
        counts.stall
    );
    assert!(counts.stall >= 3, "the proxy stalled no watch: {counts:?}");
    // Every request, watches and lease renewals included, says who sends it.
    let agents = proxy.user_agents();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        agents.len() == 1 && agents[0].starts_with(&format!("dra-claim-controller/v{version} (")),
        "User-Agent headers seen: {agents:?}"
    );
    let running = t.all_claims().await.expect("list claims").len();
    assert_eq!(running, 10, "the running pods keep their claims");
    t.finish();
}

/// Every kind of fault in one run: through the proxy, a quarter of the
/// ordinary requests answered 409/429/500/503 or held, every watch stream
/// cut, stalled (connection open, no bytes) or refused with `410 Gone`,
/// every TCP connection blackholed once it is 30 s old; meanwhile the API
/// server and etcd restarted and the controller SIGKILLed, twice each
/// across creation and release. At least 1,000 faults; nothing lost,
/// nothing doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_mixed_in_one_run() {
    const NAME: &str = "every_fault_mixed_in_one_run";
    const PODS: usize = 250;
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let plan = FaultPlan {
        // A little more than before the blackhole joined: connections it
        // kills cost requests their deadline, so fewer requests are sent,
        // and the run should still inject well over 1,000 faults.
        conflict: 95,
        too_many: 70,
        internal: 70,
        unavailable: 60,
        hold: 2,
        hold_for: Duration::from_secs(10),
        gone_event: 100,
        gone_http: 30,
        cut: 500,
        cut_after: (Duration::from_secs(1), Duration::from_secs(8)),
        stall: 1000,
        stall_after: (Duration::from_secs(1), Duration::from_secs(8)),
        spare: vec!["/apis/coordination.k8s.io/".into()],
        ..FaultPlan::default()
    };
    let (proxy, blackhole) = controller_behind_proxy_and_blackhole(
        &mut t,
        plan,
        Policy::OlderThan(Duration::from_secs(30)),
    )
    .await;

    let run = BatchRun::start(&t, NAME, PODS).await;
    run.batch.create_pods(&t).await;
    restart(&mut t, Victim::Apiserver, "pods created").await;
    let mut kills = kill_repeatedly(&t, 1).await;
    let created = run.check_created(&t).await;

    let expect = run.allocate(&t).await;
    run.batch.mark_done(&t).await;
    restart(&mut t, Victim::Etcd, "pods marked done").await;
    kills += kill_repeatedly(&t, 1).await;
    let done = run.check_released(&t, &expect).await;

    blackhole.set_policy(Policy::Forward);
    let tally = Tally {
        restart: 2,
        kill: kills as u64,
        blackholed: blackhole.counts().blackholed,
        ..Tally::default()
    };
    assert!(tally.blackholed > 0, "no connection was blackholed");
    finish_proxied_batch(
        t,
        NAME,
        &proxy,
        &run,
        &expect,
        [&created, &done],
        tally,
        // Runs inject 1,150-1,400; half of that still exercises every
        // kind, and leaves machine speed out of the verdict.
        500,
    )
    .await;
}

/// The end of a batch run behind the fault proxy: faults off, one more
/// check that whatever converged stays put, the `FAULTS:` line (the
/// proxy's counts plus `tally`'s restarts and kills), and the assertions
/// every such batch makes: no violation, at least `min_faults` faults
/// injected, exactly one claim per (pod, entry) ever.
#[allow(clippy::too_many_arguments)]
async fn finish_proxied_batch(
    t: TestCtx,
    name: &str,
    proxy: &FaultProxy,
    run: &BatchRun,
    expect: &Expect,
    [created, done]: [&Report; 2],
    tally: Tally,
    min_faults: u64,
) {
    proxy.set_enabled(false);
    let after = check_quiet(&t, "with faults off", expect, &run.ledger).await;

    let counts = proxy.counts();
    let injected = counts.faults() + tally.restart + tally.kill + tally.blackholed;
    let violations = created.violations.len() + done.violations.len() + after.violations.len();
    Tally {
        violations,
        restart: tally.restart,
        kill: tally.kill,
        blackholed: tally.blackholed,
        ..Tally::from_proxy(&counts)
    }
    .with("gone_event", counts.gone_event)
    .with("gone_http", counts.gone_http)
    .with("stall", counts.stall)
    .with("injected", injected)
    .with("requests", counts.requests)
    .with("watches", counts.watches)
    .with("upstream_errors", counts.upstream_errors)
    .with("relists", relists(&t))
    .with("claims_seen", run.ledger.claims_seen())
    .with("ctl_restarts", t.restarts())
    .print(name);

    assert!(created.ok(), "after creation: {created}");
    assert!(done.ok(), "after all pods are done: {done}");
    assert!(after.ok(), "with faults off: {after}");
    assert!(
        injected >= min_faults,
        "only {injected} faults injected (at least {min_faults} wanted): {counts:?}"
    );
    assert_eq!(
        run.ledger.claims_seen(),
        run.batch.pods * 2,
        "every (pod, entry) got exactly one claim over the whole scenario"
    );
    t.finish();
}

/// The reads start-up cannot do without are retried, not fatal: with every
/// `GET /version` answered 503, then one held until its deadline, the
/// process stays up (no restart), records no claim under an unknown
/// release, and records the waiting pod's claim once `/version` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_waits_out_a_failing_version_read() {
    const NAME: &str = "start_up_waits_out_a_failing_version_read";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    t.create_template("gpu-template").await;
    t.create_pod("early", &[("gpu", Source::Template("gpu-template"))], None)
        .await;
    let plan = FaultPlan {
        unavailable: 1000,
        only: vec!["/version".into()],
        ..FaultPlan::default()
    };
    let started = Instant::now();
    let proxy = controller_behind_proxy(&mut t, plan).await;
    wait_for(
        "three refused /version reads",
        Duration::from_secs(30),
        async || {
            let refused = proxy.counts().unavailable;
            ensure!(refused >= 3, "{refused} so far");
            Ok(())
        },
    )
    .await;
    let pod = t.pods().get("early").await.unwrap();
    assert!(
        pod.status
            .and_then(|s| s.resource_claim_statuses)
            .unwrap_or_default()
            .is_empty(),
        "no work is done before the release is known"
    );
    // One try held without an answer: it ends at its deadline.
    proxy.block(http::Method::GET, "/version");
    proxy.set_enabled(false);
    wait_for(
        "a held /version read",
        Duration::from_secs(30),
        async || {
            ensure!(proxy.blocked_requests() >= 1);
            Ok(())
        },
    )
    .await;
    proxy.unblock();
    t.wait_recorded("early", &["gpu"]).await;
    let took = started.elapsed();
    let restarts = t.restarts();
    println!(
        "START-UP: {NAME}: {} refused and 1 held /version read(s), claim recorded {:.1} s after start, {restarts} restart(s)",
        proxy.counts().unavailable,
        took.as_secs_f64()
    );
    assert_eq!(restarts, 0, "the process never exited");
    t.finish();
}
