//! What a pod requests, as kube-scheduler adds it up: the container
//! requests of a pod kept in the pod view, and the effective request
//! computed from them. Any resource name counts (`cpu`, `memory`,
//! `nvidia.com/gpu` of a device plugin, `ephemeral-storage`, hugepages).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::allocate::quantity::Quantity;

/// Resource name → quantity (a `ResourceList`).
pub type ResourceList = BTreeMap<String, Quantity>;

/// The requests a pod view keeps (borrowed from it): the sum over its main
/// containers, each init container's own, the overhead and pod-level
/// requests. Pods that request nothing (most pods of a batch or a
/// benchmark) hold empty maps, which allocate nothing.
#[derive(Clone, Copy, Debug)]
pub struct PodRequests<'a> {
    /// Summed over `spec.containers`.
    pub containers: &'a ResourceList,
    /// `spec.initContainers` in order, with whether each is a sidecar
    /// (`restartPolicy: Always`, which keeps running beside the rest).
    pub init_containers: &'a [InitRequests],
    /// `spec.overhead` (from the RuntimeClass).
    pub overhead: &'a ResourceList,
    /// `spec.resources.requests` (pod-level resources): where present, it
    /// replaces the containers' sum for the resources it names.
    pub pod_level: &'a ResourceList,
}

/// One init container's requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitRequests {
    pub sidecar: bool,
    pub requests: ResourceList,
}

/// Adds `b` into `a`, per resource (an overflow keeps the larger value).
pub fn add_into(a: &mut ResourceList, b: &ResourceList) {
    for (name, q) in b {
        let slot = a.entry(name.clone()).or_insert(Quantity::from_units(0));
        *slot = slot.checked_add(*q).unwrap_or(*slot);
    }
}

/// The larger of `a` and `b`, per resource, into `a`.
fn max_into(a: &mut ResourceList, b: &ResourceList) {
    for (name, q) in b {
        let slot = a.entry(name.clone()).or_insert(*q);
        *slot = (*slot).max(*q);
    }
}

impl PodRequests<'_> {
    /// The pod's effective request, as kube-scheduler computes it: the
    /// larger of what its init phase and its running phase need, per
    /// resource, plus the overhead. A regular init container runs beside
    /// the sidecars started before it; the main containers run beside
    /// every sidecar. Pod-level requests replace the containers' figure for
    /// the resources they name.
    pub fn effective(&self) -> ResourceList {
        let mut sidecars = ResourceList::new();
        let mut init_peak = ResourceList::new();
        for init in self.init_containers {
            if init.sidecar {
                add_into(&mut sidecars, &init.requests);
                max_into(&mut init_peak, &sidecars);
            } else {
                let mut beside = sidecars.clone();
                add_into(&mut beside, &init.requests);
                max_into(&mut init_peak, &beside);
            }
        }
        let mut running = sidecars;
        add_into(&mut running, self.containers);
        max_into(&mut running, &init_peak);
        for (name, q) in self.pod_level {
            running.insert(name.clone(), *q);
        }
        add_into(&mut running, self.overhead);
        running
    }
}

/// A `ResourceList` from its wire form. A quantity that does not parse
/// cannot be in an object the API server admitted; it counts as nothing,
/// which keeps a view of a future API harmless.
pub fn parse_list(raw: impl IntoIterator<Item = (String, String)>) -> ResourceList {
    raw.into_iter()
        .filter_map(|(name, q)| Some((name, Quantity::parse(&q).ok()?)))
        .collect()
}

/// A resource list as a custom resource writes it (`pausePodSize`,
/// `limits`: quantities as strings or numbers, any resource name), checked:
/// the texts as written; a value that is no quantity is refused, naming
/// `field.<name>`.
pub fn written_list(
    field: &str,
    raw: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, String>, String> {
    let mut texts = BTreeMap::new();
    for (name, value) in raw {
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            other => return Err(format!("{field}.{name}: {other} is not a quantity")),
        };
        Quantity::parse(&text).map_err(|e| format!("{field}.{name}: {e}"))?;
        texts.insert(name.clone(), text);
    }
    Ok(texts)
}

/// A container as the requests need it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireContainer {
    #[serde(default)]
    resources: Option<WireResources>,
    #[serde(default)]
    restart_policy: Option<String>,
}

#[derive(Deserialize)]
struct WireResources {
    #[serde(default)]
    requests: Option<BTreeMap<String, String>>,
}

impl WireContainer {
    fn requests(self) -> ResourceList {
        parse_list(self.resources.and_then(|r| r.requests).unwrap_or_default())
    }
}

/// `spec.containers`, summed.
pub(crate) fn containers_sum<'de, D: Deserializer<'de>>(d: D) -> Result<ResourceList, D::Error> {
    let containers = Option::<Vec<WireContainer>>::deserialize(d)?.unwrap_or_default();
    let mut sum = ResourceList::new();
    for c in containers {
        add_into(&mut sum, &c.requests());
    }
    Ok(sum)
}

/// `spec.initContainers`, each kept.
pub(crate) fn init_containers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<InitRequests>, D::Error> {
    let containers = Option::<Vec<WireContainer>>::deserialize(d)?.unwrap_or_default();
    Ok(containers
        .into_iter()
        .map(|c| InitRequests {
            sidecar: c.restart_policy.as_deref() == Some("Always"),
            requests: c.requests(),
        })
        .collect())
}

/// A `ResourceList` field (`spec.overhead`).
pub(crate) fn resource_list<'de, D: Deserializer<'de>>(d: D) -> Result<ResourceList, D::Error> {
    Ok(parse_list(
        Option::<BTreeMap<String, String>>::deserialize(d)?.unwrap_or_default(),
    ))
}

/// `spec.resources` of a pod: its requests.
pub(crate) fn pod_level<'de, D: Deserializer<'de>>(d: D) -> Result<ResourceList, D::Error> {
    let resources = Option::<WireResources>::deserialize(d)?;
    Ok(parse_list(
        resources.and_then(|r| r.requests).unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        parse_list(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn init(sidecar: bool, pairs: &[(&str, &str)]) -> InitRequests {
        InitRequests {
            sidecar,
            requests: list(pairs),
        }
    }

    /// The owned parts of a [`PodRequests`].
    #[derive(Default)]
    struct Parts {
        containers: ResourceList,
        init: Vec<InitRequests>,
        overhead: ResourceList,
        pod_level: ResourceList,
    }

    impl Parts {
        fn effective(&self) -> ResourceList {
            PodRequests {
                containers: &self.containers,
                init_containers: &self.init,
                overhead: &self.overhead,
                pod_level: &self.pod_level,
            }
            .effective()
        }
    }

    #[test]
    fn effective_requests() {
        let rows = [
            (
                "containers add up",
                Parts {
                    containers: list(&[("cpu", "1500m"), ("memory", "2Gi")]),
                    ..Parts::default()
                },
                list(&[("cpu", "1500m"), ("memory", "2Gi")]),
            ),
            (
                "a big init container dominates",
                Parts {
                    containers: list(&[("cpu", "1"), ("memory", "1Gi")]),
                    init: vec![init(false, &[("cpu", "4"), ("memory", "100Mi")])],
                    ..Parts::default()
                },
                list(&[("cpu", "4"), ("memory", "1Gi")]),
            ),
            (
                "sidecars run beside later init containers and the main ones",
                Parts {
                    containers: list(&[("cpu", "500m"), ("memory", "1Gi")]),
                    init: vec![
                        init(true, &[("cpu", "1"), ("memory", "1Gi")]),
                        init(false, &[("cpu", "2"), ("memory", "0")]),
                    ],
                    ..Parts::default()
                },
                list(&[("cpu", "3"), ("memory", "2Gi")]),
            ),
            (
                "overhead on top",
                Parts {
                    containers: list(&[("cpu", "1"), ("memory", "1Gi")]),
                    overhead: list(&[("cpu", "250m"), ("memory", "64Mi")]),
                    ..Parts::default()
                },
                list(&[("cpu", "1250m"), ("memory", "1088Mi")]),
            ),
            (
                "pod-level requests replace the containers' for what they name",
                Parts {
                    containers: list(&[("cpu", "1"), ("memory", "1Gi")]),
                    pod_level: list(&[("cpu", "3")]),
                    ..Parts::default()
                },
                list(&[("cpu", "3"), ("memory", "1Gi")]),
            ),
            (
                "extended resources count like any other",
                Parts {
                    containers: list(&[("nvidia.com/gpu", "2")]),
                    ..Parts::default()
                },
                list(&[("nvidia.com/gpu", "2")]),
            ),
            ("no requests", Parts::default(), ResourceList::new()),
        ];
        for (name, parts, want) in rows {
            assert_eq!(parts.effective(), want, "{name}");
        }
    }

    #[test]
    fn an_unparsable_quantity_counts_as_nothing() {
        assert_eq!(
            list(&[("cpu", "lots"), ("memory", "1Gi")]),
            list(&[("memory", "1Gi")])
        );
    }
}
