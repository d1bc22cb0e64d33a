//! What a stranger on the pod network or a tenant with create rights can
//! do to the cluster-wide controller, tried against the real API server:
//! read its metrics without the right (refused: the secure port), flood the
//! metrics port (it keeps working), bloat the objects it caches (its memory
//! does not follow).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::StreamExt;
use serde_json::json;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::Source;
use crate::k8s::wait_for;
use crate::rawhttp::metric_sum;
use crate::rbac;

/// `GET https://addr/metrics` with `token` as bearer (none: no header),
/// trusting any certificate (the controller's is self-signed); returns the
/// status and the body.
pub async fn scrape_https(addr: SocketAddr, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let mut config = kube::Config::new(format!("https://{addr}").parse()?);
    config.accept_invalid_certs = true;
    config.read_timeout = Some(Duration::from_secs(20));
    let client = kube::Client::try_from(config)?;
    let mut request = http::Request::get("/metrics");
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    match client.request_text(request.body(Vec::new())?).await {
        Ok(body) => Ok((200, body)),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(err) => Err(err.into()),
    }
}

/// A controller serving the secure port, and the token of a service
/// account bound to the chart's metrics-reader role.
async fn secure_with_reader(name: &'static str) -> Option<(TestCtx, String)> {
    let opts = ControllerOpts {
        metrics_secure: true,
        ..ControllerOpts::default()
    };
    let mut t = TestCtx::isolated(name, opts, 1).await?;
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    let reader =
        rbac::service_account_with_role(&admin, "scraper", Some(rbac::METRICS_READER_ROLE))
            .await
            .unwrap();
    Some((t, reader))
}

/// The secure port with the chart's RBAC: no token 401, a token of a
/// service account without the chart's metrics-reader role 403, with it
/// 200; the probes stay open; plain HTTP gets no metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_allowed_to_read_them() {
    const NAME: &str = "metrics_need_a_token_allowed_to_read_them";
    let Some((mut t, reader)) = secure_with_reader(NAME).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    let stranger = rbac::service_account_with_role(&admin, "stranger", None)
        .await
        .unwrap();
    let controller = t.controller();
    let metrics = controller.metrics;

    let (code, body) = scrape_https(metrics, None).await.unwrap();
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = scrape_https(metrics, Some("made-up-token")).await.unwrap();
    assert_eq!(code, 401, "unknown token: {body}");
    let (code, body) = scrape_https(metrics, Some(&stranger)).await.unwrap();
    assert_eq!(code, 403, "token without the role: {body}");
    assert!(
        body.contains("metrics-reader"),
        "the refusal says what to bind: {body}"
    );
    let (code, body) = scrape_https(metrics, Some(&reader)).await.unwrap();
    assert_eq!(code, 200, "token bound to the metrics-reader role: {body}");
    assert!(body.contains("workqueue_depth"), "{body}");
    // Cached verdicts: the same answers again.
    assert_eq!(scrape_https(metrics, Some(&reader)).await.unwrap().0, 200);
    assert_eq!(scrape_https(metrics, Some(&stranger)).await.unwrap().0, 403);

    assert_eq!(
        controller.healthz().await.unwrap(),
        200,
        "probes need no token"
    );
    let plain = crate::rawhttp::get(metrics, "/metrics").await;
    assert!(
        !matches!(plain, Ok((200, _))),
        "plain HTTP on the secure port served metrics"
    );
    t.finish();
}

/// Thousands of scrapes (no token, a wrong token, the right one) from many
/// connections at once: the probes stay green and a new pod still gets its
/// claim while it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_flood_leaves_the_controller_working() {
    const NAME: &str = "scrape_flood_leaves_the_controller_working";
    const FLOOD_FOR: Duration = Duration::from_secs(15);
    const SCRAPERS: usize = 96;
    let Some((t, reader)) = secure_with_reader(NAME).await else {
        return;
    };
    let controller = t.controller();
    let until = Instant::now() + FLOOD_FOR;
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|i| {
            let token = match i % 3 {
                0 => None,
                1 => Some(format!("made-up-{i}")),
                _ => Some(reader.clone()),
            };
            let addr = controller.metrics;
            tokio::spawn(async move {
                let mut answered = 0u64;
                while Instant::now() < until {
                    if scrape_https(addr, token.as_deref()).await.is_ok() {
                        answered += 1;
                    }
                }
                answered
            })
        })
        .collect();

    t.create_template("tmpl").await;
    t.create_pod("during-flood", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("during-flood", &["gpu"]).await;
    let mut probes = 0;
    while Instant::now() < until {
        assert_eq!(
            controller.healthz().await.unwrap(),
            200,
            "/healthz during the flood"
        );
        probes += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut answered = 0;
    for scraper in scrapers {
        answered += scraper.await.unwrap();
    }
    println!(
        "e2e: {NAME}: {answered} scrapes answered in {}s, {probes} probes green",
        FLOOD_FOR.as_secs()
    );
    assert!(answered > 0, "the flood reached the controller");
    let (code, _) = scrape_https(controller.metrics, Some(&reader))
        .await
        .unwrap();
    assert_eq!(code, 200, "a scrape is answered after the flood");
    t.finish();
}

/// Resident memory of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

/// 300 claims carrying 100 KiB of annotations each (30 MB a tenant may
/// write): the controller caches only what it reads, so its memory grows by
/// a few MB at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_bloat_does_not_grow_memory() {
    const NAME: &str = "annotation_bloat_does_not_grow_memory";
    const CLAIMS: usize = 300;
    const GROWTH_BOUND: u64 = 10 * 1024 * 1024;
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 1).await else {
        return;
    };
    let claims_cached = async |at_least: f64| {
        wait_for(
            "the controller to cache the claims",
            Duration::from_secs(120),
            async || {
                let text = t.controller().metrics_text().await?;
                let cached = metric_sum(&text, "resourceclaim_controller_resource_claims");
                ensure!(cached >= at_least, "{cached} claims cached");
                Ok(())
            },
        )
        .await
    };
    t.create_claim(json!({"name": "first"})).await;
    claims_cached(1.0).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = t.controller().proc.pid();
    let before = rss_bytes(pid);

    let bloat = "x".repeat(100 * 1024);
    for i in 0..CLAIMS {
        t.create_claim(json!({
            "name": format!("bloated-{i}"),
            "annotations": {"example.com/blob": bloat, "resource.kubernetes.io/pod-claim-name": "gpu"},
        }))
        .await;
    }
    claims_cached((CLAIMS + 1) as f64).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(pid);
    let growth = after.saturating_sub(before);
    println!(
        "e2e: {NAME}: RSS {:.1} MiB -> {:.1} MiB with {CLAIMS} claims of 100 KiB annotations",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert!(
        growth <= GROWTH_BOUND,
        "RSS grew by {:.1} MiB (bound {} MiB)",
        growth as f64 / 1048576.0,
        GROWTH_BOUND / 1048576
    );
    t.finish();
}

/// The memory the chart's request and limit are sized from: the RSS of a
/// controller caching 10,000 claims (and 10,000 pods using them), printed.
/// Run by hand (`cargo test --test e2e -- --ignored --nocapture
/// rss_per_10k_claims`): creating them takes minutes on two cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of several minutes, run by hand"]
async fn rss_per_10k_claims() {
    const NAME: &str = "rss_per_10k_claims";
    const CLAIMS: usize = 10_000;
    // Generous: what the chart's 256 MiB limit must stay well above.
    const BOUND: u64 = 160 * 1024 * 1024;
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 1).await else {
        return;
    };
    let pid = t.controller().proc.pid();
    let idle = rss_bytes(pid);
    t.create_template("tmpl").await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(t.client.clone(), &t.ns);
    let created = Instant::now();
    futures::stream::iter(0..CLAIMS)
        .for_each_concurrent(32, |i| {
            let pods = pods.clone();
            async move {
                let pod: k8s_openapi::api::core::v1::Pod =
                    serde_json::from_value(crate::k8s::pod_manifest(
                        &format!("p-{i}"),
                        &[("gpu", Source::Template("tmpl"))],
                        None,
                    ))
                    .unwrap();
                pods.create(&Default::default(), &pod).await.unwrap();
            }
        })
        .await;
    wait_for(
        "every claim created and cached",
        Duration::from_secs(900),
        async || {
            let text = t.controller().metrics_text().await?;
            let cached = metric_sum(&text, "resourceclaim_controller_resource_claims");
            ensure!(cached >= CLAIMS as f64, "{cached} claims cached");
            Ok(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let loaded = rss_bytes(pid);
    println!(
        "e2e: {NAME}: RSS {:.1} MiB idle, {:.1} MiB with {CLAIMS} pods and their claims cached ({:.0} s to create)",
        idle as f64 / 1048576.0,
        loaded as f64 / 1048576.0,
        created.elapsed().as_secs_f64()
    );
    assert!(loaded <= BOUND, "RSS {:.1} MiB", loaded as f64 / 1048576.0);
}
