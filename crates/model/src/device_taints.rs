//! Which taints a device carries, as kube-controller-manager and
//! kube-scheduler read them: the taints its ResourceSlice publishes (the
//! pool's current generation only) and those of every DeviceTaintRule whose
//! selector matches it, published or not. One index for every room that
//! asks (eviction, allocation, placement, drain).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration, ResourceSlice};

/// The annotation with which a DeviceTaintRule asks that its `NoExecute`
/// evictions go through the Eviction API, so that PodDisruptionBudgets hold
/// them (value `true`); kube-controller-manager ignores it and deletes.
pub const EVICTION_API_ANNOTATION: &str = "dra-claim-controller.io/respect-disruption-budgets";

/// The annotation with which a DeviceTaintRule sets the seconds each of its
/// `NoExecute` evictions gives the pod to terminate (`kubectl drain
/// --grace-period`); without it, the pod's own grace period.
pub const GRACE_PERIOD_ANNOTATION: &str = "dra-claim-controller.io/eviction-grace-period-seconds";

/// The grace period a rule's annotation asks for, if it asks for a valid one
/// (a whole number of seconds, not negative). 0 is read as 1: a grace period
/// of 0 makes the API server remove a running pod's object at once, before
/// its containers stop, and its devices could be handed to another pod
/// while still in use (`kubectl delete` refuses 0 without `--force`).
pub fn grace_period_of(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<i64> {
    annotations?
        .get(GRACE_PERIOD_ANNOTATION)?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|s| *s >= 0)
        .map(|s| s.max(1))
}

/// A DeviceTaintRule as the index reads it, whatever API version served it
/// (`resource.k8s.io/v1beta2` on 1.36, `v1` on 1.37): each selector field
/// left out matches every device.
#[derive(Clone, Debug, PartialEq)]
pub struct TaintRule {
    pub name: String,
    pub uid: String,
    /// `spec.deviceSelector` was set (a rule without one selects nothing).
    pub has_selector: bool,
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub device: Option<String>,
    pub taint: DeviceTaint,
}

impl TaintRule {
    /// A `resource.k8s.io/v1` rule (1.37).
    pub fn from_v1(rule: &k8s_openapi::api::resource::v1::DeviceTaintRule) -> Self {
        let selector = rule.spec.device_selector.as_ref();
        Self::of(
            &rule.metadata,
            selector.map(|s| [&s.driver, &s.pool, &s.device]),
            rule.spec.taint.clone(),
        )
    }

    /// A `resource.k8s.io/v1beta2` rule (1.36): the same fields.
    pub fn from_v1beta2(rule: &k8s_openapi::api::resource::v1beta2::DeviceTaintRule) -> Self {
        let selector = rule.spec.device_selector.as_ref();
        let taint = &rule.spec.taint;
        Self::of(
            &rule.metadata,
            selector.map(|s| [&s.driver, &s.pool, &s.device]),
            DeviceTaint {
                key: taint.key.clone(),
                value: taint.value.clone(),
                effect: taint.effect.clone(),
                time_added: taint.time_added.clone(),
            },
        )
    }

    fn of(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        selector: Option<[&Option<String>; 3]>,
        taint: DeviceTaint,
    ) -> Self {
        let [driver, pool, device] = selector.map_or([None, None, None], |s| s.map(Clone::clone));
        Self {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            has_selector: selector.is_some(),
            driver,
            pool,
            device,
            taint,
        }
    }

    /// Whether the rule selects this device.
    pub fn selects(&self, driver: &str, pool: &str, device: &str) -> bool {
        let field = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        self.has_selector
            && field(&self.driver, driver)
            && field(&self.pool, pool)
            && field(&self.device, device)
    }
}

/// The version DeviceTaintRules are served in: `v1` (1.37) or `v1beta2`
/// (1.36, behind the API server's `--runtime-config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulesVersion {
    V1,
    V1beta2,
}

impl RulesVersion {
    /// The API as discovery asks for it: `v1` first, then `v1beta2`.
    pub const API: dra_runtime::optional_api::OptionalApi =
        dra_runtime::optional_api::OptionalApi {
            group: "resource.k8s.io",
            versions: &["v1", "v1beta2"],
            plural: "devicetaintrules",
        };

    /// The version discovery found served (one of [`Self::API`]'s).
    pub fn from_served(version: &str) -> RulesVersion {
        if version == "v1" {
            RulesVersion::V1
        } else {
            RulesVersion::V1beta2
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            RulesVersion::V1 => "resource.k8s.io/v1",
            RulesVersion::V1beta2 => "resource.k8s.io/v1beta2",
        }
    }

    /// The resource, for dynamic requests in this version.
    pub fn api_resource(self) -> kube::api::ApiResource {
        let version = match self {
            RulesVersion::V1 => "v1",
            RulesVersion::V1beta2 => "v1beta2",
        };
        kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("resource.k8s.io", version, "DeviceTaintRule"),
            "devicetaintrules",
        )
    }
}

/// The rules of a store, as the index reads them.
pub fn rules_of(
    rules: &[std::sync::Arc<k8s_openapi::api::resource::v1::DeviceTaintRule>],
) -> Vec<TaintRule> {
    rules.iter().map(|r| TaintRule::from_v1(r)).collect()
}

/// Where a taint comes from, in the order kube-controller-manager lists
/// them: rules by name, then slices by driver, pool, device, taint index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaintSource {
    Rule {
        name: String,
        uid: String,
    },
    Slice {
        driver: String,
        pool: String,
        device: String,
        index: usize,
    },
}

/// The taints of every published device (current pool generations) and
/// the rules, indexed by device.
#[derive(Clone, Debug, Default)]
pub struct DeviceTaints {
    published: BTreeMap<(String, String, String), Vec<DeviceTaint>>,
    rules: Vec<TaintRule>,
}

impl DeviceTaints {
    /// The index of these slices and rules. Of each pool only the slices
    /// of its highest generation count: an older one is being replaced.
    pub fn new<'a>(
        slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
        rules: Vec<TaintRule>,
    ) -> Self {
        let mut published = BTreeMap::new();
        for slice in current_slices(slices) {
            let s = &slice.spec;
            for device in s.devices.iter().flatten() {
                let taints = device.taints.clone().unwrap_or_default();
                if !taints.is_empty() {
                    published.insert(
                        (s.driver.clone(), s.pool.name.clone(), device.name.clone()),
                        taints,
                    );
                }
            }
        }
        let mut rules = rules;
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        Self { published, rules }
    }

    /// Every taint of the device, rules first (by name), then the slice's
    /// (in its order).
    pub fn of(&self, driver: &str, pool: &str, device: &str) -> Vec<(TaintSource, &DeviceTaint)> {
        let mut out: Vec<(TaintSource, &DeviceTaint)> = self
            .rules
            .iter()
            .filter(|r| r.selects(driver, pool, device))
            .map(|r| {
                let source = TaintSource::Rule {
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                };
                (source, &r.taint)
            })
            .collect();
        let key = (driver.to_owned(), pool.to_owned(), device.to_owned());
        for (index, taint) in self.published.get(&key).into_iter().flatten().enumerate() {
            let source = TaintSource::Slice {
                driver: driver.to_owned(),
                pool: pool.to_owned(),
                device: device.to_owned(),
                index,
            };
            out.push((source, taint));
        }
        out
    }
}

/// The slices of each pool's highest generation: an older one is being
/// replaced, and its devices and taints no longer count.
pub fn current_slices<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
) -> impl Iterator<Item = &'a ResourceSlice> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for slice in slices.clone() {
        let s = &slice.spec;
        let at = newest.entry((&s.driver, &s.pool.name)).or_insert(i64::MIN);
        *at = (*at).max(s.pool.generation);
    }
    slices.into_iter().filter(move |slice| {
        let s = &slice.spec;
        newest.get(&(s.driver.as_str(), s.pool.name.as_str())) == Some(&s.pool.generation)
    })
}

/// How many published devices (current pool generations) `rule` selects.
pub fn published_devices_selected<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
    rule: &TaintRule,
) -> usize {
    current_slices(slices)
        .map(|slice| {
            let s = &slice.spec;
            s.devices
                .iter()
                .flatten()
                .filter(|d| rule.selects(&s.driver, &s.pool.name, &d.name))
                .count()
        })
        .sum()
}

/// Whether `toleration` tolerates the `NoExecute` `taint` for eviction, as
/// kube-controller-manager's eviction reads it: the toleration must name
/// the `NoExecute` effect (an empty effect does not count here) and match
/// the taint's key and value ([`matches_key_and_value`]).
pub fn tolerates_no_execute(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    toleration.effect.as_deref() == Some("NoExecute") && matches_key_and_value(toleration, taint)
}

/// The key (if the toleration sets one) is the taint's, and `Exists`
/// matches any value while `Equal` (or no operator) needs the same value:
/// the part of toleration matching every reader shares.
pub(crate) fn matches_key_and_value(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if toleration
        .key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "Exists" => true,
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rules_grace_period_is_whole_seconds_never_zero() {
        let asked = |value: &str| {
            grace_period_of(Some(&std::collections::BTreeMap::from([(
                GRACE_PERIOD_ANNOTATION.to_string(),
                value.to_string(),
            )])))
        };
        assert_eq!(asked("30"), Some(30));
        assert_eq!(asked(" 5 "), Some(5));
        assert_eq!(asked("0"), Some(1), "0 would remove a running pod at once");
        assert_eq!(asked("-1"), None, "the pod's own");
        assert_eq!(asked("soon"), None);
        assert_eq!(grace_period_of(None), None);
    }

    fn rule(selector: serde_json::Value) -> TaintRule {
        let v1: k8s_openapi::api::resource::v1::DeviceTaintRule = serde_json::from_value(json!({
            "metadata": {"name": "r", "uid": "u"},
            "spec": {"deviceSelector": selector,
                     "taint": {"key": "k", "effect": "NoExecute", "timeAdded": "2026-11-27T10:00:00Z"}},
        }))
        .unwrap();
        let mut as_v1beta2 = serde_json::to_value(&v1).unwrap();
        as_v1beta2["apiVersion"] = json!("resource.k8s.io/v1beta2");
        let v1beta2: k8s_openapi::api::resource::v1beta2::DeviceTaintRule =
            serde_json::from_value(as_v1beta2).unwrap();
        assert_eq!(
            TaintRule::from_v1(&v1),
            TaintRule::from_v1beta2(&v1beta2),
            "both versions read alike"
        );
        TaintRule::from_v1(&v1)
    }

    /// As every release's eviction controller, and 1.38's scheduler side
    /// too (kubernetes #141648): no selector selects nothing, `{}` every
    /// device.
    #[test]
    fn a_selector_field_left_out_matches_every_device() {
        assert!(
            rule(json!({})).selects("d", "p", "x"),
            "an empty selector selects all"
        );
        assert!(rule(json!({"driver": "d"})).selects("d", "p", "x"));
        assert!(!rule(json!({"driver": "d"})).selects("e", "p", "x"));
        assert!(rule(json!({"driver": "d", "pool": "p", "device": "x"})).selects("d", "p", "x"));
        assert!(!rule(json!({"driver": "d", "pool": "p", "device": "x"})).selects("d", "p", "y"));
        assert!(
            !rule(serde_json::Value::Null).selects("d", "p", "x"),
            "no selector selects none"
        );
    }
}
