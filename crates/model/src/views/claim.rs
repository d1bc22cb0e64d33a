//! The claim view: what the controllers read of a ResourceClaim.

use super::*;

/// The fields of a ResourceClaim this controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ClaimView {
    #[serde(deserialize_with = "claim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: ClaimViewSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: ClaimViewStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ClaimViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: DevicesView,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct DevicesView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub requests: Vec<RequestView>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView {
    pub exactly: Option<ExactView>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub first_available: Vec<serde::de::IgnoredAny>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactView {
    pub admin_access: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimViewStatus {
    /// Which devices it holds (for the allocator and the double
    /// allocation check); the rest stays on the server.
    pub allocation: Option<AllocationView>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub reserved_for: ReservedFor,
}

/// `status.allocation`: the devices only.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AllocationView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: AllocatedDevicesView,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AllocatedDevicesView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub results: Vec<AllocatedDevice>,
}

/// One `status.allocation.devices.results[]` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub admin_access: Option<bool>,
    /// Set for a share of a device that allows multiple allocations
    /// (consumable capacity): such shares are not double allocations.
    #[serde(rename = "shareID")]
    pub share_id: Option<String>,
    /// The request's tolerations of device taints, as allocated (what the
    /// eviction of `NoExecute` taints reads).
    #[serde(default, deserialize_with = "null_as_default")]
    pub tolerations: Vec<k8s_openapi::api::resource::v1::DeviceToleration>,
    /// What a share of a device took of its capacities (what 1.37's pool
    /// status requests sum); empty for whole devices.
    #[serde(default, deserialize_with = "null_as_default")]
    pub consumed_capacity:
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// `status.reservedFor`, typed for decisions and kept as read for the
/// `test` operations of JSON patches: a field a newer API server adds to an
/// entry must not make every guard fail.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReservedFor {
    entries: Vec<ResourceClaimConsumerReference>,
    raw: Vec<serde_json::Value>,
}

impl ReservedFor {
    /// The entries exactly as the API server sent them.
    pub fn raw(&self) -> &[serde_json::Value] {
        &self.raw
    }

    /// The entries as read of those in `keep`, in their order.
    pub fn raw_of(&self, keep: &[ResourceClaimConsumerReference]) -> Vec<serde_json::Value> {
        self.entries
            .iter()
            .zip(&self.raw)
            .filter(|(typed, _)| keep.contains(typed))
            .map(|(_, raw)| raw.clone())
            .collect()
    }
}

impl Deref for ReservedFor {
    type Target = [ResourceClaimConsumerReference];
    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

impl<'de> Deserialize<'de> for ReservedFor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Vec::<serde_json::Value>::deserialize(d)?;
        let entries = raw
            .iter()
            .map(|v| serde_json::from_value(v.clone()).map_err(serde::de::Error::custom))
            .collect::<Result<_, _>>()?;
        Ok(ReservedFor { entries, raw })
    }
}

namespaced_resource!(
    ClaimView,
    "resource.k8s.io",
    "v1",
    "ResourceClaim",
    "resourceclaims"
);

impl ClaimView {
    pub fn is_allocated(&self) -> bool {
        self.status.allocation.is_some()
    }

    /// The devices this claim takes from others: every allocated device
    /// except those held with admin access (which share a device).
    pub fn held_devices(&self) -> impl Iterator<Item = crate::DeviceId> + '_ {
        self.status
            .allocation
            .iter()
            .flat_map(|a| &a.devices.results)
            .filter_map(|r| {
                crate::DeviceId::taken_by(
                    &r.driver,
                    &r.pool,
                    &r.device,
                    r.admin_access,
                    r.share_id.as_deref(),
                )
            })
    }
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    pub fn owner_references(&self) -> &[OwnerReference] {
        self.metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
    }
    pub fn finalizers(&self) -> &[String] {
        self.metadata.finalizers.as_deref().unwrap_or_default()
    }
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    /// Whether any request asks for admin access (sub-requests of a
    /// prioritized list cannot).
    pub fn admin_access(&self) -> bool {
        self.spec
            .devices
            .requests
            .iter()
            .any(|r| r.exactly.as_ref().and_then(|e| e.admin_access) == Some(true))
    }
    /// Whether the pod with this UID holds a reservation.
    pub fn is_reserved_for(&self, uid: &str) -> bool {
        self.status.reserved_for.iter().any(|r| r.uid == uid)
    }
}
