//! The PodGroup view (DRAWorkloadResourceClaims) and where its API is served.

use super::*;

/// The API version PodGroups are served at (`scheduling.k8s.io/v1alpha2`
/// in Kubernetes 1.36, `v1alpha3` in 1.37), found at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGroupApi {
    pub version: String,
}

impl PodGroupApi {
    pub const GROUP: &'static str = "scheduling.k8s.io";
    pub const PLURAL: &'static str = "podgroups";
    /// Newest first: the one a start-up picks when several are served
    /// (1.36 serves v1alpha2; 1.37 v1beta1 and v1alpha3; the fields read
    /// are the same in all three).
    pub const VERSIONS: [&'static str; 3] = ["v1beta1", "v1alpha3", "v1alpha2"];
    /// The API as discovery asks for it.
    pub const API: dra_runtime::optional_api::OptionalApi =
        dra_runtime::optional_api::OptionalApi {
            group: Self::GROUP,
            versions: &Self::VERSIONS,
            plural: Self::PLURAL,
        };

    pub fn api_version(&self) -> String {
        format!("{}/{}", Self::GROUP, self.version)
    }
}

impl Default for PodGroupApi {
    fn default() -> Self {
        PodGroupApi {
            version: "v1alpha2".into(),
        }
    }
}

/// The fields of a PodGroup this controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodGroupView {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: PodGroupViewSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: PodGroupViewStatus,
}

/// `spec.resourceClaims` has the shape of a pod's entries.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claims: Vec<PodResourceClaim>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupViewStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claim_statuses: Vec<PodResourceClaimStatus>,
}

impl kube::Resource for PodGroupView {
    type DynamicType = PodGroupApi;
    // Namespaced, but the version is only known at run time, which kube
    // expresses with the dynamic scope.
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed("PodGroup")
    }
    fn group(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed(PodGroupApi::GROUP)
    }
    fn version(api: &PodGroupApi) -> Cow<'_, str> {
        Cow::Owned(api.version.clone())
    }
    fn plural(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed(PodGroupApi::PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

view_accessors!(PodGroupView);

impl PodGroupView {
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    /// The group's entry the pod's `entry` refers to: same name and same
    /// claim or template name. Only such an exact match binds a pod's entry
    /// to the group's claim.
    pub fn matching_entry(&self, entry: &PodResourceClaim) -> Option<&PodResourceClaim> {
        self.spec.resource_claims.iter().find(|g| {
            g.name == entry.name
                && g.resource_claim_name == entry.resource_claim_name
                && g.resource_claim_template_name == entry.resource_claim_template_name
        })
    }
    /// The claim name recorded in the group's status for `entry`.
    pub fn recorded(&self, entry: &str) -> Option<&str> {
        self.status
            .resource_claim_statuses
            .iter()
            .find(|s| s.name == entry)
            .and_then(|s| s.resource_claim_name.as_deref())
    }
}
