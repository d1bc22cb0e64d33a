use super::*;
use prometheus::Registry;
use std::time::Duration;

fn bind(s: &str) -> BindAddress {
    s.parse().unwrap()
}
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Minimal HTTP/1.1 GET; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    (status, body.to_owned())
}

#[test]
fn parses_bind_addresses() {
    let p = |s| parse_bind_address(s).unwrap();
    assert_eq!(p("0"), None);
    assert_eq!(p(":8080"), Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(p(" :8081 "), Some("0.0.0.0:8081".parse().unwrap()));
    assert_eq!(p("127.0.0.1:9090"), Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(p("localhost:9090"), Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(p("[::1]:8080"), Some("[::1]:8080".parse().unwrap()));
    assert_eq!(p("[::]:8080"), Some("[::]:8080".parse().unwrap()));
    assert_eq!(p("127.0.0.1:0"), Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(p(":0"), Some("0.0.0.0:0".parse().unwrap()));
}

#[test]
fn rejects_bad_bind_addresses() {
    for bad in [
        "",
        "8080",
        ":",
        ":99999",
        ":http",
        "example.com:80",
        "::1:8080",
        "1.2.3:80",
    ] {
        assert!(
            parse_bind_address(bad).is_err(),
            "{bad:?} should be rejected"
        );
    }
}

#[test]
fn liveness_tracks_renewal_staleness_only_while_leading() {
    let health = Health::default();
    let now = Instant::now();
    assert!(health.liveness_at(now).is_ok(), "no election: live");

    let (lease, reports) = watch::channel(LeaseHealth::standby(Duration::from_secs(10)));
    health.follow_lease(reports);
    assert!(health.liveness_at(now).is_ok(), "standby is live");

    lease.send_modify(|h| {
        h.leading = true;
        h.last_renewal = Some(now);
    });
    assert!(health.liveness_at(now + Duration::from_secs(9)).is_ok());
    let err = health
        .liveness_at(now + Duration::from_secs(11))
        .unwrap_err();
    assert!(err.contains("renewed"), "{err}");

    lease.send_modify(|h| h.last_renewal = Some(now + Duration::from_secs(8)));
    assert!(health.liveness_at(now + Duration::from_secs(11)).is_ok());

    lease.send_modify(|h| h.leading = false);
    assert!(health.liveness_at(now + Duration::from_secs(100)).is_ok());
}

#[test]
fn readiness_follows_set_ready() {
    let health = Health::default();
    assert!(health.readiness().is_err());
    health.clone().set_ready(true);
    assert_eq!(
        health.readiness().as_deref(),
        Ok("ok"),
        "clones share state"
    );
    // A part that does not work is listed, and the process stays ready.
    health.set_note(
        "headroom door capacitybuffers",
        Some("CRD not installed".into()),
    );
    assert_eq!(
        health.readiness().as_deref(),
        Ok("ok\nheadroom door capacitybuffers: CRD not installed")
    );
    health.set_note("headroom door capacitybuffers", None);
    assert_eq!(health.readiness().as_deref(), Ok("ok"));
}

#[tokio::test]
async fn serves_metrics_and_probes() {
    let registry = Registry::new();
    let counter = prometheus::IntCounter::new("test_things_total", "Things.").unwrap();
    registry.register(Box::new(counter.clone())).unwrap();
    counter.inc_by(3);
    let health = Health::default();

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let servers = start_servers(
        bind("127.0.0.1:0"),
        bind("127.0.0.1:0"),
        registry,
        health.clone(),
        MetricsAccess::Open,
        async {
            let _ = stop_rx.await;
        },
    )
    .await
    .unwrap();
    let metrics_addr = servers.metrics_addr.unwrap();
    let health_addr = servers.health_addr.unwrap();
    assert_ne!(metrics_addr, health_addr, "port 0 binds two listeners");

    let (status, body) = get(metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("test_things_total 3"), "{body}");
    assert_eq!(
        get(metrics_addr, "/readyz").await.0,
        404,
        "probes live elsewhere"
    );

    let (status, body) = get(health_addr, "/readyz").await;
    assert_eq!(status, 500);
    assert!(body.contains("not synced"), "{body}");
    health.set_ready(true);
    assert_eq!(get(health_addr, "/readyz").await, (200, "ok".to_owned()));
    assert_eq!(get(health_addr, "/healthz").await, (200, "ok".to_owned()));

    let (_lease, reports) = watch::channel(LeaseHealth {
        leading: true,
        // Renewed a second ago, with no staleness allowed: overdue.
        last_renewal: Instant::now().checked_sub(Duration::from_secs(1)),
        max_staleness: Duration::ZERO,
    });
    health.follow_lease(reports);
    assert_eq!(get(health_addr, "/healthz").await.0, 500);

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), servers.wait())
        .await
        .expect("servers stop on shutdown")
        .unwrap();
}

#[tokio::test]
async fn same_address_shares_one_listener_and_zero_disables() {
    // Find a free port, release it, then ask for it on both flags.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let servers = start_servers(
        bind(&addr),
        bind(&addr),
        Registry::new(),
        Health::default(),
        MetricsAccess::Open,
        async {
            let _ = stop_rx.await;
        },
    )
    .await
    .unwrap();
    let a = servers.metrics_addr.unwrap();
    assert_eq!(Some(a), servers.health_addr);
    assert_eq!(get(a, "/metrics").await.0, 200);
    assert_eq!(get(a, "/healthz").await.0, 200);
    stop_tx.send(()).unwrap();
    servers.wait().await.unwrap();

    let servers = start_servers(
        bind("0"),
        bind("0"),
        Registry::new(),
        Health::default(),
        MetricsAccess::Open,
        async {},
    )
    .await
    .unwrap();
    assert_eq!((servers.metrics_addr, servers.health_addr), (None, None));
    servers.wait().await.unwrap();
}

#[tokio::test]
async fn serve_returns_for_disabled_address() {
    serve("0", Router::new(), std::future::pending())
        .await
        .unwrap();
}
