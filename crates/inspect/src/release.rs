//! `check-release`: is an installed controller working? Its pods are Ready,
//! its Lease is held and renewed, its `/metrics` answers (with a token
//! where it is served over HTTPS). The chart's `helm test` runs it; an
//! admin can too. Verdicts are pure functions of what was read.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// One check's outcome, as printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub ok: bool,
    pub what: String,
}

impl Verdict {
    fn ok(what: String) -> Self {
        Verdict { ok: true, what }
    }
    fn fail(what: String) -> Self {
        Verdict { ok: false, what }
    }
}

/// Whether some of `pods` are Ready, and how many of how many.
pub(crate) fn pods_ready(pods: &[Pod], selector: &str) -> Verdict {
    let ready = pods
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    let what = format!("{ready} of {} pod(s) ({selector}) Ready", pods.len());
    if ready > 0 {
        Verdict::ok(what)
    } else {
        Verdict::fail(what)
    }
}

/// Whether the Lease is held and was renewed within its duration.
pub(crate) fn lease_held(lease: &Lease, now: Timestamp) -> Verdict {
    let name = format!(
        "{}/{}",
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.metadata.name.as_deref().unwrap_or_default()
    );
    let Some(spec) = &lease.spec else {
        return Verdict::fail(format!("Lease {name} has no spec"));
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Verdict::fail(format!("Lease {name} is held by nobody: no replica leads"));
    }
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15));
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return Verdict::fail(format!("Lease {name}, held by {holder}, was never renewed"));
    };
    let age = now.duration_since(renewed);
    let age = Duration::try_from(age).unwrap_or_default();
    if age > duration {
        Verdict::fail(format!(
            "Lease {name}, held by {holder}, was last renewed {}s ago, more than its {}s: the leader is stuck or gone",
            age.as_secs(),
            duration.as_secs()
        ))
    } else {
        Verdict::ok(format!(
            "Lease {name} held by {holder}, renewed {}s ago",
            age.as_secs()
        ))
    }
}

/// Whether a `/metrics` answer is the controller's.
pub(crate) fn metrics_answer(url: &str, answer: Result<String, String>) -> Verdict {
    match answer {
        Ok(text) if text.contains("workqueue_depth") => {
            Verdict::ok(format!("{url} answers ({} bytes of metrics)", text.len()))
        }
        Ok(_) => Verdict::fail(format!(
            "{url} answers, but not with the controller's metrics (no workqueue_depth)"
        )),
        Err(e) => Verdict::fail(format!("{url}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(holder: Option<&str>, renewed: Option<&str>) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "dra", "namespace": "dra-system"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
        }))
        .unwrap()
    }

    #[test]
    fn lease_verdicts() {
        let now: Timestamp = "2026-11-26T10:00:30Z".parse().unwrap();
        let rows = [
            (
                "held and fresh",
                lease(Some("pod-a"), Some("2026-11-26T10:00:28.000000Z")),
                true,
            ),
            (
                "held but stale",
                lease(Some("pod-a"), Some("2026-11-26T09:59:00.000000Z")),
                false,
            ),
            ("held by nobody", lease(None, None), false),
            ("never renewed", lease(Some("pod-a"), None), false),
        ];
        for (name, l, want) in rows {
            assert_eq!(lease_held(&l, now).ok, want, "{name}");
        }
    }

    #[test]
    fn pod_and_metrics_verdicts() {
        let pod = |ready: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
            .unwrap()
        };
        assert!(pods_ready(&[pod("False"), pod("True")], "app=x").ok);
        assert!(!pods_ready(&[pod("False")], "app=x").ok);
        assert!(!pods_ready(&[], "app=x").ok);
        assert!(metrics_answer("u", Ok("workqueue_depth{name=\"x\"} 0".into())).ok);
        assert!(!metrics_answer("u", Ok("hello".into())).ok);
        assert!(!metrics_answer("u", Err("401 Unauthorized".into())).ok);
    }
}
