//! `--feature-gates`: the DRA gates that change what this controller does,
//! with Kubernetes 1.36's defaults.

use std::fmt;
use std::str::FromStr;

/// The gates this controller knows. All three are on by default in 1.36.
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
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            admin_access: true,
            prioritized_list: true,
            extended_resource: true,
        }
    }
}

const KNOWN: [&str; 3] = [
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAExtendedResource",
];

impl FromStr for FeatureGates {
    type Err = String;

    /// Parses `Name=bool,Name=bool`, as Kubernetes components do. Unknown
    /// names are an error: a typo must not silently leave a gate at default.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                format!("--feature-gates: {item:?} is not of the form Name=true|false")
            })?;
            let value: bool = value
                .trim()
                .parse()
                .map_err(|_| format!("--feature-gates: {name}: {value:?} is not true or false"))?;
            match name.trim() {
                "DRAAdminAccess" => gates.admin_access = value,
                "DRAPrioritizedList" => gates.prioritized_list = value,
                "DRAExtendedResource" => gates.extended_resource = value,
                other => {
                    return Err(format!(
                        "--feature-gates: unknown gate {other:?}; known gates: {}",
                        KNOWN.join(", ")
                    ));
                }
            }
        }
        Ok(gates)
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DRAAdminAccess={},DRAPrioritizedList={},DRAExtendedResource={}",
            self.admin_access, self.prioritized_list, self.extended_resource
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
        };
        assert_eq!(gates.to_string().parse::<FeatureGates>(), Ok(gates));
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
