//! The claim metrics of kube-controller-manager's controller, same names and
//! labels: `resourceclaim_controller_creates_total{status,admin_access}` and
//! `resourceclaim_controller_resource_claims{allocated,admin_access,source}`;
//! and our own `dra_claim_controller_claims{state}`, the claims that need
//! attention, judged by the classifier `drain-check` and `audit` use.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::cache::{Caches, object_key};
use super::views::ClaimView;
use crate::inspect::classify::{ClaimFacts, ProblemKind, problems};
use crate::naming::{EXTENDED_RESOURCE_CLAIM_ANNOTATION, POD_CLAIM_NAME_ANNOTATION};

const CLAIMS_HELP: &str = "Number of ResourceClaims, categorized by allocation status, admin access, and source. \
Source can be 'resource_claim_template' (created from a template), 'extended_resource' (extended resources), \
or empty (manually created by a user).";

/// Counters updated by pod work.
#[derive(Clone)]
pub struct ControllerMetrics {
    creates: IntCounterVec,
}

impl ControllerMetrics {
    /// Registers the counters, and a collector that counts cached claims at
    /// scrape time (no bookkeeping on every watch event).
    pub fn register(registry: &Registry, caches: Arc<Caches>) -> prometheus::Result<Self> {
        let creates = IntCounterVec::new(
            Opts::new(
                "resourceclaim_controller_creates_total",
                "Number of ResourceClaims creation requests, categorized by creation status and admin access",
            ),
            &["status", "admin_access"],
        )?;
        registry.register(Box::new(creates.clone()))?;
        registry.register(Box::new(ClaimGauge::new(caches.clone())?))?;
        registry.register(Box::new(ProblemGauge::new(caches)?))?;
        Ok(ControllerMetrics { creates })
    }

    /// Metrics that go nowhere (for decisions tested without a registry).
    pub fn unregistered() -> Self {
        let creates = IntCounterVec::new(
            Opts::new("unregistered_creates_total", "-"),
            &["status", "admin_access"],
        )
        .expect("static metric definition");
        ControllerMetrics { creates }
    }

    pub fn record_create(&self, success: bool, admin_access: bool) {
        let status = if success { "success" } else { "failure" };
        self.creates
            .with_label_values(&[status, if admin_access { "true" } else { "false" }])
            .inc();
    }
}

/// The labels a claim is counted under.
pub fn claim_labels(claim: &ClaimView) -> [&'static str; 3] {
    let allocated = if claim.is_allocated() {
        "true"
    } else {
        "false"
    };
    let admin = if claim.admin_access() {
        "true"
    } else {
        "false"
    };
    let source = if claim.annotation(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == Some("true") {
        "extended_resource"
    } else if claim
        .annotation(POD_CLAIM_NAME_ANNOTATION)
        .is_some_and(|v| !v.is_empty())
    {
        "resource_claim_template"
    } else {
        ""
    };
    [allocated, admin, source]
}

struct ClaimGauge {
    caches: Arc<Caches>,
    desc: Vec<Desc>,
}

impl ClaimGauge {
    fn new(caches: Arc<Caches>) -> prometheus::Result<Self> {
        let desc = Desc::new(
            "resourceclaim_controller_resource_claims".into(),
            CLAIMS_HELP.into(),
            vec!["allocated".into(), "admin_access".into(), "source".into()],
            Default::default(),
        )?;
        Ok(ClaimGauge {
            caches,
            desc: vec![desc],
        })
    }
}

impl Collector for ClaimGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut counts: BTreeMap<[&'static str; 3], i64> = BTreeMap::new();
        for claim in self.caches.claims.list() {
            *counts.entry(claim_labels(&claim)).or_default() += 1;
        }
        let gauge = IntGaugeVec::new(
            Opts::new("resourceclaim_controller_resource_claims", CLAIMS_HELP),
            &["allocated", "admin_access", "source"],
        )
        .expect("static metric definition");
        for (labels, n) in counts {
            gauge.with_label_values(&labels).set(n);
        }
        gauge.collect()
    }
}

const PROBLEMS_NAME: &str = "dra_claim_controller_claims";
const PROBLEMS_HELP: &str = "ResourceClaims that need attention, by state: stale_reservation (reserved for a pod that is gone, \
replaced or done), leaked_allocation (allocated, reserved for nobody, no live owner), orphaned_generated (generated for a \
pod that is done or gone), stuck_deleting (deleted over a minute ago, finalizer still set). A claim may be in several \
states. Computed from the caches at scrape time; absent until they are loaded.";

/// `dra_claim_controller_claims{state}`, computed from the caches at
/// scrape time (no API calls). Nothing is exported before the caches are
/// loaded: a pod not cached yet is not a pod that is gone.
struct ProblemGauge {
    caches: Arc<Caches>,
    desc: Vec<Desc>,
}

impl ProblemGauge {
    fn new(caches: Arc<Caches>) -> prometheus::Result<Self> {
        let desc = Desc::new(
            PROBLEMS_NAME.into(),
            PROBLEMS_HELP.into(),
            vec!["state".into()],
            Default::default(),
        )?;
        Ok(ProblemGauge {
            caches,
            desc: vec![desc],
        })
    }

    /// Claims per state, every state present.
    fn counts(&self) -> BTreeMap<ProblemKind, i64> {
        let mut counts: BTreeMap<ProblemKind, i64> =
            ProblemKind::GAUGE_STATES.iter().map(|k| (*k, 0)).collect();
        let now = k8s_openapi::jiff::Timestamp::now();
        for claim in self.caches.claims.list() {
            let facts = ClaimFacts::from(&*claim);
            let lookup = |name: &str| self.caches.pods.get(&object_key(facts.namespace, name));
            let mut kinds: Vec<ProblemKind> = problems(&facts, &lookup, now)
                .iter()
                .map(|p| p.kind())
                .collect();
            kinds.dedup();
            for kind in kinds {
                if let Some(n) = counts.get_mut(&kind) {
                    *n += 1;
                }
            }
        }
        counts
    }
}

impl Collector for ProblemGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if !self.caches.is_synced() {
            return Vec::new();
        }
        let gauge = IntGaugeVec::new(Opts::new(PROBLEMS_NAME, PROBLEMS_HELP), &["state"])
            .expect("static metric definition");
        for (kind, n) in self.counts() {
            gauge.with_label_values(&[kind.label()]).set(n);
        }
        gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;
    use serde_json::json;

    #[test]
    fn gauge_counts_claims_by_labels() {
        let caches = Arc::new(Caches::new());
        let claims = [
            json!({"metadata": {"name": "a", "namespace": "ns", "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
                   "status": {"allocation": {}}}),
            json!({"metadata": {"name": "b", "namespace": "ns", "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}}}),
            json!({"metadata": {"name": "c", "namespace": "ns"},
                   "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x", "adminAccess": true}}]}}}),
            json!({"metadata": {"name": "d", "namespace": "ns"}}),
        ];
        for c in claims {
            let claim: ClaimView = serde_json::from_value(c).unwrap();
            caches
                .claims
                .apply(format!("ns/{}", claim.name()), Arc::new(claim));
        }
        let registry = Registry::new();
        let metrics = ControllerMetrics::register(&registry, caches).unwrap();
        metrics.record_create(true, false);
        metrics.record_create(false, true);
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="true",source="resource_claim_template"} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="false",source="extended_resource"} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="true",allocated="false",source=""} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="false",source=""} 1"#,
            r#"resourceclaim_controller_creates_total{admin_access="false",status="success"} 1"#,
            r#"resourceclaim_controller_creates_total{admin_access="true",status="failure"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn problem_gauge_counts_claims_once_loaded() {
        let caches = Arc::new(Caches::new());
        let claims = [
            // Reserved for a pod that is not there, and allocated: stale.
            json!({"metadata": {"name": "stale", "namespace": "ns"},
                   "status": {"allocation": {}, "reservedFor": [{"resource": "pods", "name": "gone", "uid": "u0"}]}}),
            // Allocated for nobody: leaked.
            json!({"metadata": {"name": "leaked", "namespace": "ns"}, "status": {"allocation": {}}}),
            // Generated for a running pod and reserved: fine.
            json!({"metadata": {"name": "fine", "namespace": "ns",
                                "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "runs", "uid": "u1", "controller": true}]},
                   "status": {"allocation": {}, "reservedFor": [{"resource": "pods", "name": "runs", "uid": "u1"}]}}),
        ];
        for c in claims {
            let claim: ClaimView = serde_json::from_value(c).unwrap();
            caches
                .claims
                .apply(format!("ns/{}", claim.name()), Arc::new(claim));
        }
        let pod: super::super::views::PodView = serde_json::from_value(json!({
            "metadata": {"name": "runs", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": "n", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running"}}))
        .unwrap();
        caches.pods.apply("ns/runs".into(), Arc::new(pod));
        let registry = Registry::new();
        ControllerMetrics::register(&registry, caches.clone()).unwrap();
        let text = || {
            let mut out = Vec::new();
            prometheus::TextEncoder::new()
                .encode(&registry.gather(), &mut out)
                .unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(
            !text().contains("dra_claim_controller_claims"),
            "nothing before the caches are loaded"
        );
        caches.mark_synced();
        let text = text();
        for line in [
            r#"dra_claim_controller_claims{state="stale_reservation"} 1"#,
            r#"dra_claim_controller_claims{state="leaked_allocation"} 1"#,
            r#"dra_claim_controller_claims{state="orphaned_generated"} 0"#,
            r#"dra_claim_controller_claims{state="stuck_deleting"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
