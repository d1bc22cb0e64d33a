//! What the process reads from the API server before any work (the
//! release it acts as, where PodGroups are served, the declared nodes),
//! each read retried until answered.

use super::*;
use crate::model::selector::LabelSelector;
use crate::model::views::PodGroupApi;
use crate::runtime::optional_api::{ApiStatus, Discovered};
use crate::runtime::startup::{PER_TRY_DEADLINE, StartupRead, read_until_answered};

/// What start-up must read from the API server before any work.
pub(super) struct StartupReads {
    pub(super) release: Release,
    /// The API server's minor version, when `--reference-release=auto`
    /// read it (for the release metric).
    pub(super) served_minor: Option<u32>,
    pub(super) pod_group_api: Option<crate::model::views::PodGroupApi>,
    pub(super) allocate_on_nodes: Option<(String, LabelSelector)>,
}

/// The start-up reads, each retried until answered; an error is a setting
/// to change (the message says which).
pub(super) async fn startup_reads(
    client: &kube::Client,
    args: &Args,
    gates: crate::model::features::FeatureGates,
    health: &Health,
    apis: &ApiStatus,
) -> anyhow::Result<StartupReads> {
    let ReleaseRead {
        release,
        source,
        served_minor,
    } = reference_release(client, args.reference_release, health).await?;
    info!(release = %release, source, "acting as kube-controller-manager {release}'s DRA controllers");
    if let Some(minor) = served_minor.filter(|m| Release::is_newer_than_known(*m)) {
        warn!(
            release = %release,
            api_server = %format!("1.{minor}"),
            "the API server is Kubernetes 1.{minor}, newer than the newest release whose rules this \
             controller knows: acting as {release}'s kube-controller-manager; upgrade this controller \
             to follow 1.{minor}'s, or pin --reference-release to silence this"
        );
    }
    // PodGroups are read with DRAWorkloadResourceClaims, and in 1.37 also
    // with GenericWorkload (a pod's group is looked up whatever the other
    // gate says).
    let pod_groups_why = if gates.workload_resource_claims {
        Some("--feature-gates DRAWorkloadResourceClaims=true")
    } else if release.is_1_37() && gates.generic_workload {
        Some("--feature-gates GenericWorkload=true (Kubernetes 1.37)")
    } else {
        None
    };
    let pod_group_api = match pod_groups_why {
        Some(why) => Some(discover_pod_group_api(client, health, apis, why).await?),
        None => None,
    };
    let allocate_on_nodes = declared_nodes(client, &args.allocate_on_nodes, health).await?;
    Ok(StartupReads {
        release,
        served_minor,
        pod_group_api,
        allocate_on_nodes,
    })
}

/// Which PodGroup API the API server serves, newest first. Asked once at
/// start-up when PodGroups are read (`why` names the gate that asks); a
/// read that fails is retried, an API server that serves none is a
/// configuration to change.
async fn discover_pod_group_api(
    client: &kube::Client,
    health: &Health,
    apis: &ApiStatus,
    why: &str,
) -> anyhow::Result<PodGroupApi> {
    let served = PodGroupApi::API
        .discover_until_answered(client, health)
        .await;
    let found = served
        .clone()
        .map_or(Discovered::NotServed, Discovered::Served);
    apis.report(&PodGroupApi::API, &found, why);
    if let Some(version) = served {
        info!(api_version = %format!("{}/{version}", PodGroupApi::GROUP), "serving PodGroup claims");
        return Ok(PodGroupApi { version });
    }
    anyhow::bail!(
        "{why} needs PodGroups, but the API server serves none of scheduling.k8s.io/{} \
         podgroups: enable them on kube-apiserver (--runtime-config=scheduling.k8s.io/v1alpha2=true \
         and --feature-gates=GenericWorkload=true,DRAWorkloadResourceClaims=true on Kubernetes \
         1.36), or turn the gate off here",
        PodGroupApi::VERSIONS.join(", ")
    )
}

/// The release whose rules apply, where that came from, and the API
/// server's minor version when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReleaseRead {
    pub(super) release: Release,
    pub(super) source: &'static str,
    pub(super) served_minor: Option<u32>,
}

/// The release whose rules apply: pinned by the flag, or the API server's
/// version (a minor newer than any known is served as the newest known).
pub(super) async fn reference_release(
    client: &kube::Client,
    flag: ReferenceRelease,
    health: &Health,
) -> anyhow::Result<ReleaseRead> {
    match flag {
        ReferenceRelease::Pinned(release) => Ok(ReleaseRead {
            release,
            source: "--reference-release",
            served_minor: None,
        }),
        ReferenceRelease::Auto => {
            let read = StartupRead {
                what: "the API server's version (GET /version) for --reference-release=auto",
                permission: "get on the non-resource URL /version",
            };
            let info = read_until_answered(read, health, PER_TRY_DEADLINE, || {
                client.apiserver_version()
            })
            .await;
            let minor = minor_version(&info.minor).ok_or_else(|| {
                anyhow::anyhow!(
                    "--reference-release=auto: the API server reports minor version {:?}, which \
                     is not a number; pin the release with --reference-release=1.36, 1.37 or 1.38",
                    info.minor
                )
            })?;
            Ok(ReleaseRead {
                release: Release::for_minor(minor),
                source: "the API server's version",
                served_minor: Some(minor),
            })
        }
    }
}

/// The number of a `/version` minor field ("36", or "37+" from some
/// distributions).
pub fn minor_version(minor: &str) -> Option<u32> {
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `dra_claim_controller_reference_release{release,api_server}`: 1 for
/// the release whose rules apply; `api_server` is the API server's release
/// when it was read (`--reference-release=auto`), so that a server newer
/// than any release known shows as `release="1.38",api_server="1.39"`.
pub(super) fn register_release_gauge(
    registry: &prometheus::Registry,
    release: Release,
    served_minor: Option<u32>,
) -> anyhow::Result<()> {
    let gauge = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "dra_claim_controller_reference_release",
            "The kube-controller-manager release whose DRA controllers' rules apply (--reference-release, or the API server's version): 1 for that release; api_server is the API server's release when read.",
        ),
        &["release", "api_server"],
    )?;
    let served = served_minor.map(|m| format!("1.{m}")).unwrap_or_default();
    gauge
        .with_label_values(&[&release.to_string(), &served])
        .set(1);
    registry.register(Box::new(gauge))?;
    Ok(())
}

/// The `--allocate-on-nodes` selector, checked with the API server (which
/// is the judge of label selector syntax); `None` when empty.
pub(super) async fn declared_nodes(
    client: &kube::Client,
    selector: &str,
    health: &Health,
) -> anyhow::Result<Option<(String, LabelSelector)>> {
    let selector = selector.trim();
    if selector.is_empty() {
        return Ok(None);
    }
    // Matched here, against the process's one node watch.
    let parsed = LabelSelector::parse(selector).map_err(|why| {
        anyhow::anyhow!(
            "--allocate-on-nodes={selector:?} is not a valid label selector ({why}): use the syntax \
             of kubectl get nodes -l, e.g. dra.example.com/pre-scheduled=true"
        )
    })?;
    let nodes: kube::Api<crate::model::views::NodeView> = kube::Api::all(client.clone());
    let params = kube::api::ListParams::default().labels(selector).limit(1);
    let read = StartupRead {
        what: "the nodes --allocate-on-nodes selects (GET /api/v1/nodes)",
        permission: "list on nodes",
    };
    // A 400 is the API server judging the selector: an answer, not a failure.
    let listed = read_until_answered(read, health, PER_TRY_DEADLINE, || async {
        match nodes.list_metadata(&params).await {
            Ok(list) => Ok(Ok(list)),
            Err(kube::Error::Api(status)) if status.code == 400 => Ok(Err(status.message)),
            Err(e) => Err(e),
        }
    })
    .await;
    match listed {
        Ok(list) => {
            tracing::info!(
                selector,
                some_node = list
                    .items
                    .first()
                    .and_then(|n| n.metadata.name.as_deref())
                    .unwrap_or("none yet"),
                "allocating devices for pre-scheduled pods on the nodes this selector matches"
            );
            Ok(Some((selector.to_string(), parsed)))
        }
        Err(message) => anyhow::bail!(
            "--allocate-on-nodes={selector:?} is not a valid label selector ({message}): use the syntax of \
             kubectl get nodes -l, e.g. dra.example.com/pre-scheduled=true"
        ),
    }
}
