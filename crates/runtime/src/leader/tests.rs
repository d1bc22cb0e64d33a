use super::*;
use http::Request;

#[test]
fn namespace_resolution_order() {
    assert_eq!(
        resolve_namespace(Some("explicit"), Some("sa"), Some("env")),
        "explicit"
    );
    assert_eq!(resolve_namespace(None, Some("sa\n"), Some("env")), "sa");
    assert_eq!(resolve_namespace(None, Some("  "), Some("env")), "env");
    assert_eq!(resolve_namespace(None, None, Some("env")), "env");
    assert_eq!(resolve_namespace(Some(""), None, None), "kube-system");
    assert_eq!(resolve_namespace(None, None, None), "kube-system");
}

#[test]
fn identity_is_hostname_underscore_uuid() {
    assert_eq!(identity_from("node-a", "x"), "node-a_x");
    let rows = [
        (Some("ctl-7d9f-abcde"), Some("node-a"), "ctl-7d9f-abcde"),
        (None, Some("node-a"), "node-a"),
        (Some(""), Some("node-a"), "node-a"),
        (Some(" "), None, "unknown"),
        (None, None, "unknown"),
    ];
    for (pod, host, want) in rows {
        assert_eq!(holder_name(pod, host), want, "{pod:?} {host:?}");
    }

    let id = default_identity();
    let (host, uuid) = id.rsplit_once('_').expect("underscore separator");
    assert!(!host.is_empty());
    let groups: Vec<_> = uuid.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
    assert!(uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    assert_eq!(&uuid[14..15], "4", "version 4");
    assert_ne!(default_identity(), id, "random suffix");
}

#[test]
fn invalid_options_are_rejected() {
    let base = LeaderElectionOptions::default();
    let bad = [
        LeaderElectionOptions {
            renew_deadline: Duration::from_secs(15),
            ..base.clone()
        },
        LeaderElectionOptions {
            retry_period: Duration::from_secs(9),
            ..base.clone()
        },
        LeaderElectionOptions {
            retry_period: Duration::ZERO,
            ..base.clone()
        },
        LeaderElectionOptions {
            lease_name: String::new(),
            ..base.clone()
        },
        LeaderElectionOptions {
            identity: Some(String::new()),
            ..base.clone()
        },
    ];
    for opts in bad {
        assert!(opts.validate().is_err(), "{opts:?}");
    }
}

#[test]
fn resolve_uses_explicit_namespace_and_identity() {
    let le = LeaderElection::resolve(&LeaderElectionOptions {
        lease_namespace: Some("ns1".into()),
        identity: Some("me".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        (le.namespace(), le.identity(), le.lease_name()),
        ("ns1", "me", "dra-claim-controller")
    );
}

#[tokio::test]
async fn disabled_election_is_always_leader() {
    let registry = Registry::new();
    // Never contacted: no lease is used when disabled.
    let client = kube::Client::new(
        tower::service_fn(|_req: Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(
                "unexpected request",
            ))
        }),
        "default",
    );
    let handle = LeaderElection::start(
        client,
        LeaderElectionOptions {
            enabled: false,
            lease_namespace: Some("ns".into()),
            ..Default::default()
        },
        &registry,
    )
    .await
    .unwrap();
    assert!(handle.is_leader());
    tokio::time::timeout(Duration::from_secs(1), handle.wait_until_leader())
        .await
        .unwrap();
    // No lease held: nothing to renew, liveness does not track it.
    assert!(!handle.lease_health().borrow().leading);

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains(r#"leader_election_master_status{name="dra-claim-controller"} 1"#),
        "{text}"
    );

    let lost = handle.lost();
    handle.release().await;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), lost)
            .await
            .unwrap(),
        LeadershipLost::Released
    );
}
