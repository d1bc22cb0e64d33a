//! `--feature-gates`: the DRA gates that change what this controller does,
//! with Kubernetes 1.36's defaults; and the reference release whose
//! kube-controller-manager the claim controller acts as (`--reference-release`).

use std::fmt;
use std::str::FromStr;

/// The gates this controller knows, with Kubernetes 1.36's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// `DRAAdminAccess`: templates may request `adminAccess`.
    pub admin_access: bool,
    /// `DRAPrioritizedList`: templates may use `firstAvailable`.
    pub prioritized_list: bool,
    /// `DRAExtendedResource`: the scheduler creates claims for extended
    /// resources. Cleanup of such claims happens whatever the gate says (a
    /// claim made while it was on still needs cleanup), so today the gate is
    /// accepted for compatibility with kube-controller-manager's flag.
    pub extended_resource: bool,
    /// `DRAWorkloadResourceClaims` (alpha, off): PodGroups
    /// (`scheduling.k8s.io`) get claims of their own from templates, member
    /// pods use them, and `reservedFor` may name a PodGroup.
    pub workload_resource_claims: bool,
    /// `GenericWorkload` (off): pods may belong to PodGroups
    /// (`spec.schedulingGroup`). From 1.37 on, the claim controller refuses
    /// a pod in a PodGroup while it is off, and looks PodGroups up while it
    /// is on, whatever `DRAWorkloadResourceClaims` says.
    pub generic_workload: bool,
    /// `DRADeviceTaints` (beta, on in 1.36; GA and locked on in 1.37): the
    /// device-taint eviction controller runs, and taints on devices count.
    pub device_taints: bool,
    /// `DRADeviceTaintRules` (beta, **off** in 1.36 with its
    /// `resource.k8s.io/v1beta2` API; GA with `v1` in 1.37): DeviceTaintRules
    /// taint devices, and their status is written.
    pub device_taint_rules: bool,
    /// `DRAResourcePoolStatus` (alpha, off in 1.36 and 1.37, with the
    /// `resource.k8s.io/v1alpha3` API): ResourcePoolStatusRequests are
    /// answered.
    pub resource_pool_status: bool,
    /// Which release's rules apply where 1.36 and 1.37 differ (not a gate:
    /// set from `--reference-release` or the API server's version).
    pub release: Release,
}

/// The kube-controller-manager release whose claim controller this one
/// acts as, where releases differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Release {
    #[default]
    V1_36,
    V1_37,
    V1_38,
}

impl Release {
    /// The newest release whose rules this controller knows: a newer API
    /// server is served with these.
    pub const NEWEST: Release = Release::V1_38;
    /// Its minor version.
    const NEWEST_MINOR: u32 = 38;

    /// The rules for an API server of Kubernetes `1.<minor>`: 1.36's up to
    /// 1.36 (1.34 and 1.35 differ in ways `docs/differences.md` lists),
    /// 1.37's for 1.37, 1.38's from 1.38 on (a newer minor than
    /// [`Self::NEWEST`] is told apart by [`Self::is_newer_than_known`]).
    pub fn for_minor(minor: u32) -> Self {
        match minor {
            ..=36 => Release::V1_36,
            37 => Release::V1_37,
            _ => Release::V1_38,
        }
    }

    /// Whether Kubernetes `1.<minor>` is newer than every release whose
    /// rules are known (it is served as [`Self::NEWEST`]).
    pub fn is_newer_than_known(minor: u32) -> bool {
        minor > Self::NEWEST_MINOR
    }

    /// Whether 1.37's rules apply (1.37 and later).
    pub fn is_1_37(self) -> bool {
        self >= Release::V1_37
    }

    /// Whether 1.38's rules apply (1.38 and later).
    pub fn is_1_38(self) -> bool {
        self >= Release::V1_38
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Release::V1_36 => "1.36",
            Release::V1_37 => "1.37",
            Release::V1_38 => "1.38",
        })
    }
}

impl FromStr for Release {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "1.36" => Ok(Release::V1_36),
            "1.37" => Ok(Release::V1_37),
            "1.38" => Ok(Release::V1_38),
            other => Err(format!(
                "{other:?} is not a release this controller follows: use 1.36, 1.37, 1.38 or auto"
            )),
        }
    }
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            admin_access: true,
            prioritized_list: true,
            extended_resource: true,
            workload_resource_claims: false,
            generic_workload: false,
            device_taints: true,
            device_taint_rules: false,
            resource_pool_status: false,
            release: Release::V1_36,
        }
    }
}

impl FeatureGates {
    /// `DRADeviceTaints` as the release serving decides it: GA and locked
    /// on from 1.37.
    pub fn device_taints_on(&self) -> bool {
        self.device_taints || self.release.is_1_37()
    }

    /// `DRADeviceTaintRules` as the release serving decides it: GA from
    /// 1.37, and only with `DRADeviceTaints`.
    pub fn device_taint_rules_on(&self) -> bool {
        self.device_taints_on() && (self.device_taint_rules || self.release.is_1_37())
    }
}

const KNOWN: [&str; 8] = [
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAExtendedResource",
    "DRAWorkloadResourceClaims",
    "GenericWorkload",
    "DRADeviceTaints",
    "DRADeviceTaintRules",
    "DRAResourcePoolStatus",
];

/// PodGroup claims (KEP-5729). 1.36 spells the gate
/// `DRAWorkloadResourceClaims`; the KEP's shorter name is taken too.
const WORKLOAD_RESOURCE_CLAIMS: [&str; 2] = ["DRAWorkloadResourceClaims", "WorkloadResourceClaims"];

/// Every gate name kube-controller-manager 1.36, 1.37 and 1.38 accept
/// (their registered gates, one per line): a flag string of any of them
/// must work here unchanged, with the gates that do not concern this
/// controller ignored. 1.37's list is that of its development line after
/// v1.37.0-beta.0; 1.38's that of its development line between
/// v1.38.0-alpha.1 and alpha.2 (pre-release: gates added later are still
/// refused as unknown).
const KUBE_CONTROLLER_MANAGER_GATES: [&str; 3] = [
    include_str!("kcm_feature_gates_1_36.txt"),
    include_str!("kcm_feature_gates_1_37.txt"),
    include_str!("kcm_feature_gates_1_38.txt"),
];

fn is_kube_controller_manager_gate(name: &str) -> bool {
    KUBE_CONTROLLER_MANAGER_GATES
        .iter()
        .flat_map(|list| list.lines())
        .map(str::trim)
        .any(|known| known == name)
}

/// `--feature-gates` as given: the gates this controller acts on, and the
/// names of kube-controller-manager's gates that were set but do not
/// concern it (logged once at start).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureGateFlag {
    pub gates: FeatureGates,
    pub ignored: Vec<String>,
}

impl FromStr for FeatureGateFlag {
    type Err = String;

    /// Parses `Name=bool,Name=bool`, as Kubernetes components do. Names
    /// kube-controller-manager does not know either are an error: a typo
    /// must not silently leave a gate at its default.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut flag = FeatureGateFlag::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                format!("--feature-gates: {item:?} is not of the form Name=true|false")
            })?;
            let name = name.trim();
            let value: bool = value
                .trim()
                .parse()
                .map_err(|_| format!("--feature-gates: {name}: {value:?} is not true or false"))?;
            match name {
                "DRAAdminAccess" => flag.gates.admin_access = value,
                "DRAPrioritizedList" => flag.gates.prioritized_list = value,
                "DRAExtendedResource" => flag.gates.extended_resource = value,
                "GenericWorkload" => flag.gates.generic_workload = value,
                "DRADeviceTaints" => flag.gates.device_taints = value,
                "DRADeviceTaintRules" => flag.gates.device_taint_rules = value,
                "DRAResourcePoolStatus" => flag.gates.resource_pool_status = value,
                _ if WORKLOAD_RESOURCE_CLAIMS.contains(&name) => {
                    flag.gates.workload_resource_claims = value
                }
                other if is_kube_controller_manager_gate(other) => {
                    if !flag.ignored.iter().any(|n| n == other) {
                        flag.ignored.push(other.to_string());
                    }
                }
                other => {
                    return Err(format!(
                        "--feature-gates: unknown gate {other:?}: neither this controller nor \
                         kube-controller-manager 1.36 or 1.37 knows it (check the spelling); gates that \
                         change what this controller does: {}",
                        KNOWN.join(", ")
                    ));
                }
            }
        }
        Ok(flag)
    }
}

impl FromStr for FeatureGates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<FeatureGateFlag>().map(|f| f.gates)
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DRAAdminAccess={},DRAPrioritizedList={},DRAExtendedResource={},DRAWorkloadResourceClaims={},GenericWorkload={},DRADeviceTaints={},DRADeviceTaintRules={},DRAResourcePoolStatus={}",
            self.admin_access,
            self.prioritized_list,
            self.extended_resource,
            self.workload_resource_claims,
            self.generic_workload,
            self.device_taints,
            self.device_taint_rules,
            self.resource_pool_status
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        let all_on = FeatureGates::default();
        let cases: [(&str, Result<FeatureGates, ()>); 7] = [
            ("", Ok(all_on)),
            (
                "DRAAdminAccess=false",
                Ok(FeatureGates {
                    admin_access: false,
                    ..all_on
                }),
            ),
            (
                " DRAPrioritizedList=false , DRAExtendedResource=false ",
                Ok(FeatureGates {
                    prioritized_list: false,
                    extended_resource: false,
                    ..all_on
                }),
            ),
            (
                "DRAAdminAccess=true,DRAAdminAccess=false",
                Ok(FeatureGates {
                    admin_access: false,
                    ..all_on
                }),
            ),
            ("DRAAdminAccess", Err(())),
            ("DRAAdminAccess=yes", Err(())),
            ("NoSuchGate=true", Err(())),
        ];
        for (input, want) in cases {
            let got = input.parse::<FeatureGates>().map_err(|_| ());
            assert_eq!(got, want, "input {input:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        let gates = FeatureGates {
            admin_access: false,
            prioritized_list: true,
            extended_resource: false,
            workload_resource_claims: true,
            generic_workload: true,
            device_taints: false,
            device_taint_rules: true,
            resource_pool_status: true,
            release: Release::V1_36,
        };
        assert_eq!(gates.to_string().parse::<FeatureGates>(), Ok(gates));
    }

    #[test]
    fn kube_controller_manager_flag_strings_are_accepted() {
        let flag: FeatureGateFlag =
            "DRAAdminAccess=false,JobPodReplacementPolicy=true,AllAlpha=false,JobPodReplacementPolicy=false"
                .parse()
                .unwrap();
        assert!(!flag.gates.admin_access);
        assert_eq!(flag.ignored, ["JobPodReplacementPolicy", "AllAlpha"]);
        for name in WORKLOAD_RESOURCE_CLAIMS {
            let off: FeatureGateFlag = format!("{name}=false").parse().unwrap();
            assert!(!off.gates.workload_resource_claims && off.ignored.is_empty());
            let on: FeatureGateFlag = format!("{name}=true").parse().unwrap();
            assert!(on.gates.workload_resource_claims, "{name}");
        }
        assert!(
            !FeatureGates::default().workload_resource_claims,
            "alpha: off by default"
        );
    }

    #[test]
    fn gate_list_is_kube_controller_managers() {
        for list in KUBE_CONTROLLER_MANAGER_GATES {
            let names: Vec<&str> = list.lines().map(str::trim).collect();
            for gate in KNOWN.iter().chain(&["AllAlpha", "AllBeta"]) {
                assert!(names.contains(gate), "{gate} missing from a list");
            }
            assert!(
                names
                    .iter()
                    .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
            );
            assert!(names.is_sorted(), "kept sorted, one name per line");
        }
    }

    #[test]
    fn releases() {
        assert_eq!(Release::for_minor(35), Release::V1_36);
        assert_eq!(Release::for_minor(36), Release::V1_36);
        assert_eq!(Release::for_minor(37), Release::V1_37);
        assert_eq!(Release::for_minor(38), Release::V1_38);
        assert_eq!(Release::for_minor(40), Release::V1_38);
        assert!(!Release::is_newer_than_known(38));
        assert!(Release::is_newer_than_known(39));
        assert_eq!("1.37".parse::<Release>(), Ok(Release::V1_37));
        assert_eq!("1.38".parse::<Release>(), Ok(Release::V1_38));
        assert!("1.39".parse::<Release>().is_err());
        assert_eq!(Release::V1_36.to_string(), "1.36");
        assert_eq!(Release::V1_38.to_string(), "1.38");
        assert!(Release::V1_38.is_1_37() && Release::V1_38.is_1_38());
        assert!(!Release::V1_37.is_1_38());
    }

    #[test]
    fn gates_of_any_release_are_accepted_and_ignored() {
        // Only 1.36 knows the first, only 1.37 the second, only 1.38 the
        // third.
        let flag: FeatureGateFlag =
            "SidecarContainers=true,EtcdRangeStream=true,PodCertificateMLDSA=true,DRAAdminAccess=false"
                .parse()
                .unwrap();
        assert_eq!(
            flag.ignored,
            [
                "SidecarContainers",
                "EtcdRangeStream",
                "PodCertificateMLDSA"
            ]
        );
        assert!(!flag.gates.admin_access);
    }

    #[test]
    fn unknown_gate_error_names_known_gates() {
        let err = "Typo=true".parse::<FeatureGates>().unwrap_err();
        assert!(
            err.contains("Typo") && err.contains("DRAAdminAccess"),
            "{err}"
        );
    }
}
