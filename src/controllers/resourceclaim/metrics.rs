//! The claim metrics of kube-controller-manager's controller, same names,
//! labels and HELP texts, under both spellings: 1.36's
//! `resourceclaim_controller_creates_total{status,admin_access}` and
//! `resourceclaim_controller_resource_claims{allocated,admin_access,source}`,
//! and 1.37's `dynamic_resource_allocation_resourceclaim_creates_total`
//! (plus `owner_api_group`, `owner_api_kind`) and
//! `dynamic_resource_allocation_resource_claims` (`--metrics-naming`);
//! and our own `dra_claim_controller_claims{state}`, the claims that need
//! attention, judged by the classifier `drain-check` and `audit` use.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::cache::Caches;
use crate::model::classify::{ClaimFacts, ProblemKind, problems};
use crate::model::views::ClaimView;
use crate::naming::{EXTENDED_RESOURCE_CLAIM_ANNOTATION, POD_CLAIM_NAME_ANNOTATION};
use crate::runtime::store::object_key;

/// kube-controller-manager marks these ALPHA, and says so in the HELP text.
const CLAIMS_HELP: &str = "[ALPHA] Number of ResourceClaims, categorized by allocation status, admin access, and source. \
Source can be 'resource_claim_template' (created from a template), 'extended_resource' (extended resources), \
or empty (manually created by a user).";
const CREATES_HELP: &str = "[ALPHA] Number of ResourceClaims creation requests, categorized by creation status and admin access";

const CREATES_1_36: &str = "resourceclaim_controller_creates_total";
const CREATES_1_37: &str = "dynamic_resource_allocation_resourceclaim_creates_total";
const CLAIMS_1_36: &str = "resourceclaim_controller_resource_claims";
const CLAIMS_1_37: &str = "dynamic_resource_allocation_resource_claims";

/// `--metrics-naming`: which release's names the claim metrics carry.
/// Kubernetes 1.37 renamed them; `both` (the default) serves dashboards
/// written for either release, with the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsNaming {
    #[value(name = "1.36")]
    V1_36,
    #[value(name = "1.37")]
    V1_37,
    Both,
}

impl MetricsNaming {
    fn with_1_36(self) -> bool {
        matches!(self, MetricsNaming::V1_36 | MetricsNaming::Both)
    }
    fn with_1_37(self) -> bool {
        matches!(self, MetricsNaming::V1_37 | MetricsNaming::Both)
    }
}

/// The kind of object a generated claim belongs to (1.37's
/// `owner_api_group`, `owner_api_kind` labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOwner {
    pub api_group: &'static str,
    pub kind: &'static str,
}

impl ClaimOwner {
    /// A core/v1 Pod (API group "").
    pub const POD: ClaimOwner = ClaimOwner {
        api_group: "",
        kind: "Pod",
    };
}

/// Counters updated by pod work.
#[derive(Clone)]
pub struct ControllerMetrics {
    creates_1_36: Option<IntCounterVec>,
    creates_1_37: Option<IntCounterVec>,
}

const DOUBLE_NAME: &str = "dra_claim_controller_device_double_allocations";
const DOUBLE_HELP: &str = "Devices allocated to more than one ResourceClaim without admin access, from the claim cache at \
scrape time. Must be 0; anything else means two allocators handed out the same device.";

impl ControllerMetrics {
    /// Registers the counters, and collectors that count cached claims at
    /// scrape time (no bookkeeping on every watch event).
    pub fn register(
        registry: &Registry,
        caches: Arc<Caches>,
        naming: MetricsNaming,
    ) -> prometheus::Result<Self> {
        let mut metrics = ControllerMetrics {
            creates_1_36: None,
            creates_1_37: None,
        };
        registry.register(Box::new(CacheGauge::new(
            caches.clone(),
            DOUBLE_NAME,
            DOUBLE_HELP,
            None,
            double_allocation_count,
        )?))?;
        if naming.with_1_36() {
            let c = IntCounterVec::new(
                Opts::new(CREATES_1_36, CREATES_HELP),
                &["status", "admin_access"],
            )?;
            registry.register(Box::new(c.clone()))?;
            metrics.creates_1_36 = Some(c);
        }
        if naming.with_1_37() {
            let c = IntCounterVec::new(
                Opts::new(CREATES_1_37, CREATES_HELP),
                &[
                    "status",
                    "admin_access",
                    "owner_api_group",
                    "owner_api_kind",
                ],
            )?;
            registry.register(Box::new(c.clone()))?;
            metrics.creates_1_37 = Some(c);
        }
        let names: Vec<&'static str> = [
            (naming.with_1_36(), CLAIMS_1_36),
            (naming.with_1_37(), CLAIMS_1_37),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        registry.register(Box::new(ClaimGauge::new(caches.clone(), names)?))?;
        registry.register(Box::new(CacheGauge::new(
            caches,
            PROBLEMS_NAME,
            PROBLEMS_HELP,
            Some("state"),
            problem_counts,
        )?))?;
        Ok(metrics)
    }

    /// Metrics that go nowhere (for decisions tested without a registry).
    pub fn unregistered() -> Self {
        ControllerMetrics {
            creates_1_36: None,
            creates_1_37: None,
        }
    }

    pub(crate) fn record_create(&self, success: bool, admin_access: bool, owner: ClaimOwner) {
        let status = if success { "success" } else { "failure" };
        let admin = if admin_access { "true" } else { "false" };
        if let Some(c) = &self.creates_1_36 {
            c.with_label_values(&[status, admin]).inc();
        }
        if let Some(c) = &self.creates_1_37 {
            c.with_label_values(&[status, admin, owner.api_group, owner.kind])
                .inc();
        }
    }
}

/// The labels a claim is counted under.
pub(crate) fn claim_labels(claim: &ClaimView) -> [&'static str; 3] {
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
    /// The names it is exported under (one per spelling).
    names: Vec<&'static str>,
    desc: Vec<Desc>,
}

const CLAIM_LABELS: [&str; 3] = ["allocated", "admin_access", "source"];

impl ClaimGauge {
    fn new(caches: Arc<Caches>, names: Vec<&'static str>) -> prometheus::Result<Self> {
        let desc = names
            .iter()
            .map(|name| {
                Desc::new(
                    name.to_string(),
                    CLAIMS_HELP.into(),
                    CLAIM_LABELS.iter().map(|l| l.to_string()).collect(),
                    Default::default(),
                )
            })
            .collect::<prometheus::Result<_>>()?;
        Ok(ClaimGauge {
            caches,
            names,
            desc,
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
        let mut families = Vec::new();
        for name in &self.names {
            let gauge = IntGaugeVec::new(Opts::new(*name, CLAIMS_HELP), &CLAIM_LABELS)
                .expect("static metric definition");
            for (labels, n) in &counts {
                gauge.with_label_values(labels).set(*n);
            }
            families.extend(gauge.collect());
        }
        families
    }
}

const PROBLEMS_NAME: &str = "dra_claim_controller_claims";
const PROBLEMS_HELP: &str = "ResourceClaims that need attention, by state: stale_reservation (reserved for a pod that is gone, \
replaced or done), leaked_allocation (allocated, reserved for nobody, no live owner), orphaned_generated (generated for a \
pod that is done or gone), stuck_deleting (deleted over a minute ago, finalizer still set). A claim may be in several \
states. Computed from the caches at scrape time; absent until they are loaded.";

/// A gauge computed from the caches at scrape time (no API calls), by one
/// label or none. Nothing is exported before the caches are loaded: a pod
/// not cached yet is not a pod that is gone.
struct CacheGauge {
    caches: Arc<Caches>,
    name: &'static str,
    help: &'static str,
    /// The label the values are by; `None`: a single value.
    label: Option<&'static str>,
    /// `(label value, value)` pairs (the label value is ignored without a label).
    values: fn(&Caches) -> Vec<(&'static str, i64)>,
    desc: Vec<Desc>,
}

impl CacheGauge {
    fn new(
        caches: Arc<Caches>,
        name: &'static str,
        help: &'static str,
        label: Option<&'static str>,
        values: fn(&Caches) -> Vec<(&'static str, i64)>,
    ) -> prometheus::Result<Self> {
        let labels = label.iter().map(|l| l.to_string()).collect();
        let desc = Desc::new(name.into(), help.into(), labels, Default::default())?;
        Ok(CacheGauge {
            caches,
            name,
            help,
            label,
            values,
            desc: vec![desc],
        })
    }
}

impl Collector for CacheGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if !self.caches.is_synced() {
            return Vec::new();
        }
        let values = (self.values)(&self.caches);
        match self.label {
            Some(label) => {
                let gauge = IntGaugeVec::new(Opts::new(self.name, self.help), &[label])
                    .expect("static metric definition");
                for (value, n) in values {
                    gauge.with_label_values(&[value]).set(n);
                }
                gauge.collect()
            }
            None => {
                let gauge = prometheus::IntGauge::new(self.name, self.help)
                    .expect("static metric definition");
                gauge.set(values.iter().map(|(_, n)| n).sum());
                gauge.collect()
            }
        }
    }
}

/// `dra_claim_controller_claims{state}`: claims per problem state, every
/// state present.
fn problem_counts(caches: &Caches) -> Vec<(&'static str, i64)> {
    let mut counts: BTreeMap<ProblemKind, i64> =
        ProblemKind::GAUGE_STATES.iter().map(|k| (*k, 0)).collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    for claim in caches.claims.list() {
        let facts = ClaimFacts::from(&*claim);
        let lookup = |name: &str| caches.pods.get(&object_key(facts.namespace, name));
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
    counts.into_iter().map(|(k, n)| (k.label(), n)).collect()
}

/// `dra_claim_controller_device_double_allocations`.
fn double_allocation_count(caches: &Caches) -> Vec<(&'static str, i64)> {
    let claims = caches.claims.list();
    let doubles = crate::model::device::double_allocations(claims.iter().map(|c| &**c));
    vec![("", i64::try_from(doubles).unwrap_or(i64::MAX))]
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;
    use serde_json::json;

    /// What `/metrics` would serve from `registry`.
    fn exposition(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

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
        let metrics = ControllerMetrics::register(&registry, caches, MetricsNaming::Both).unwrap();
        metrics.record_create(true, false, ClaimOwner::POD);
        metrics.record_create(false, true, ClaimOwner::POD);
        let text = exposition(&registry);
        for line in [
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="true",source="resource_claim_template"} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="false",source="extended_resource"} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="true",allocated="false",source=""} 1"#,
            r#"resourceclaim_controller_resource_claims{admin_access="false",allocated="false",source=""} 1"#,
            r#"resourceclaim_controller_creates_total{admin_access="false",status="success"} 1"#,
            r#"resourceclaim_controller_creates_total{admin_access="true",status="failure"} 1"#,
            r#"dynamic_resource_allocation_resource_claims{admin_access="false",allocated="true",source="resource_claim_template"} 1"#,
            r#"dynamic_resource_allocation_resourceclaim_creates_total{admin_access="false",owner_api_group="",owner_api_kind="Pod",status="success"} 1"#,
            "# HELP resourceclaim_controller_creates_total [ALPHA] Number of ResourceClaims creation requests",
            "# HELP dynamic_resource_allocation_resource_claims [ALPHA] Number of ResourceClaims, categorized",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn one_spelling_only() {
        for (naming, present, absent) in [
            (
                MetricsNaming::V1_36,
                "resourceclaim_controller_",
                "dynamic_resource_allocation_",
            ),
            (
                MetricsNaming::V1_37,
                "dynamic_resource_allocation_",
                "resourceclaim_controller_",
            ),
        ] {
            let caches = Arc::new(Caches::new());
            let claim: ClaimView =
                serde_json::from_value(json!({"metadata": {"name": "a", "namespace": "ns"}}))
                    .unwrap();
            caches.claims.apply("ns/a".into(), Arc::new(claim));
            let registry = Registry::new();
            let metrics = ControllerMetrics::register(&registry, caches, naming).unwrap();
            metrics.record_create(true, false, ClaimOwner::POD);
            let text = exposition(&registry);
            let series = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
            assert_eq!(
                series(present),
                2,
                "{naming:?}: a creates and a claims series\n{text}"
            );
            assert_eq!(series(absent), 0, "{naming:?}\n{text}");
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
        let pod: crate::model::views::PodView = serde_json::from_value(json!({
            "metadata": {"name": "runs", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": "n", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running"}}))
        .unwrap();
        caches.pods.apply("ns/runs".into(), Arc::new(pod));
        let registry = Registry::new();
        ControllerMetrics::register(&registry, caches.clone(), MetricsNaming::Both).unwrap();
        let text = || exposition(&registry);
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

    #[test]
    fn double_allocation_gauge_counts_shared_devices_once_loaded() {
        let caches = Arc::new(Caches::new());
        for name in ["a", "b"] {
            let claim: ClaimView = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": "gpu", "pool": "n", "device": "gpu-0"}]}}}}))
            .unwrap();
            caches.claims.apply(format!("ns/{name}"), Arc::new(claim));
        }
        let registry = Registry::new();
        ControllerMetrics::register(&registry, caches.clone(), MetricsNaming::Both).unwrap();
        let text = || exposition(&registry);
        assert!(
            !text().contains(DOUBLE_NAME),
            "nothing before the caches are loaded"
        );
        caches.mark_synced();
        let text = text();
        assert!(
            text.contains("\ndra_claim_controller_device_double_allocations 1\n"),
            "{text}"
        );
    }
}
