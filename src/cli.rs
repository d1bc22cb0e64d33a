//! Command-line flags. Names follow kube-controller-manager's where one
//! exists, so an admin can carry settings over.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::runtime::client::{DEFAULT_BURST, DEFAULT_QPS};
pub use crate::runtime::duration::{FlagDuration, parse_duration};
use crate::runtime::http::BindAddress;
use crate::runtime::leader::{
    DEFAULT_LEASE_DURATION, DEFAULT_LEASE_NAME, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
};

use crate::controllers::resourceclaim::metrics::MetricsNaming;
use crate::model::features::{FeatureGateFlag, Release};

mod parse;

pub(crate) use parse::parse_controllers;
use parse::{
    parse_device_taint_syncs, parse_gates, parse_qps, parse_rate, parse_reference_release,
    parse_resync_period, parse_share, parse_shutdown_timeout,
};

/// `--reference-release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceRelease {
    /// Follow the API server's version.
    Auto,
    Pinned(Release),
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "dra-claim-controller",
    version,
    about = "Runs kube-controller-manager's DRA controllers (resourceclaim-controller, device-taint-eviction-controller, resourcepoolstatusrequest-controller) as a process of their own.",
    long_about = "Runs kube-controller-manager's DRA controllers (resourceclaim-controller, device-taint-eviction-controller, resourcepoolstatusrequest-controller) as a process of their own, with allocation on declared nodes (--allocate-on-nodes) and headroom placeholders (--controllers=*,headroom) besides.\n\nWithout a subcommand it runs the controllers with the flags below. The subcommands are admin commands (also installed as the kubectl plugin kubectl-dra): drain-check, audit, pools and check-release only read; drain and uncordon write DeviceTaintRules.",
    args_conflicts_with_subcommands = true,
    // A flag given twice takes its last value, as kube-controller-manager's
    // flags do: the chart's extraArgs then override its own flags.
    args_override_self = true
)]
pub struct Args {
    /// An admin command instead of the controllers (read-only but for drain and uncordon, which write DeviceTaintRules).
    #[command(subcommand)]
    pub tool: Option<crate::inspect::Tool>,

    /// Kubeconfig file. Default: $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Sustained requests per second to the API server, shared by every request of the process (0 = unlimited).
    #[arg(long, default_value_t = DEFAULT_QPS, value_parser = parse_qps, env = "DRA_KUBE_API_QPS")]
    pub kube_api_qps: f32,

    /// Requests that may be sent back to back before the QPS pacing applies.
    #[arg(long, default_value_t = DEFAULT_BURST, env = "DRA_KUBE_API_BURST")]
    pub kube_api_burst: u32,

    /// Number of workers syncing pods and claims concurrently (kube-controller-manager's spelling; --concurrent-syncs is the same setting).
    #[arg(
        long = "concurrent-resourceclaim-syncs",
        visible_alias = "concurrent-syncs",
        env = "DRA_CONCURRENT_RESOURCECLAIM_SYNCS",
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..=10_000)
    )]
    pub concurrent_syncs: u32,

    /// Number of workers of the device-taint eviction controller (kube-controller-manager's flag and default).
    #[arg(
        long = "concurrent-device-taint-eviction-syncs",
        default_value_t = 8,
        value_parser = parse_device_taint_syncs
    )]
    pub concurrent_device_taint_eviction_syncs: u32,

    /// Device-taint evictions per second at most, across all taints (0: unpaced, as kube-controller-manager). The wait shows in dra_claim_controller_device_taint_eviction_pacing_wait_seconds.
    #[arg(long, default_value_t = 10.0, value_parser = parse_rate)]
    pub device_taint_evictions_per_second: f64,

    /// Device-taint evictions per second at most for one DeviceTaintRule (0: unpaced).
    #[arg(long, default_value_t = 5.0, value_parser = parse_rate)]
    pub device_taint_evictions_per_rule_per_second: f64,

    /// A NoExecute DeviceTaintRule selecting more than this share of the allocated devices evicts nothing until annotated dra-claim-controller.io/confirm-eviction=true (1: no such guard).
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub device_taint_eviction_max_share: f64,

    /// Devices of each DRA pool by state as dra_claim_controller_pool_devices, from memory: pool (one series per pool and state), driver (summed per driver) or off.
    #[arg(long, value_enum, default_value = "pool")]
    pub pool_metrics: crate::controllers::poolstatus::PoolMetrics,

    /// Feature gates, as Name=true|false pairs, with Kubernetes 1.36's defaults. Acted on: DRAAdminAccess and DRAPrioritizedList (on), DRADeviceTaints (on; GA in 1.37), DRADeviceTaintRules (off in 1.36; GA in 1.37), DRAResourcePoolStatus (alpha, off: ResourcePoolStatusRequests are answered), DRAWorkloadResourceClaims, also spelled WorkloadResourceClaims (alpha, off: PodGroup claims; needs scheduling.k8s.io v1alpha2 or v1alpha3 served) and GenericWorkload (off: pods in PodGroups, with 1.37's rules). DRAExtendedResource (on) is accepted and changes nothing: claims made for extended resources are cleaned up either way. kube-controller-manager's other gates (1.36's and 1.37's) are accepted and ignored, so its flag value can be copied; any other name is an error.
    #[arg(long, default_value = "", value_parser = parse_gates)]
    pub feature_gates: FeatureGateFlag,

    /// Every cached pod and claim is re-examined at a random period between this and twice this (as kube-controller-manager's informers), from the caches: a missed event heals by itself.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_MIN_RESYNC_PERIOD), value_parser = parse_resync_period)]
    pub min_resync_period: FlagDuration,

    /// Elect a leader through a Lease before doing any work (turn off only with a single replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// How long a lease is valid; a standby takes over this long after the leader stops renewing.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_LEASE_DURATION))]
    pub leader_elect_lease_duration: FlagDuration,

    /// How long the leader may fail to renew before it stops working and exits.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_RENEW_DEADLINE))]
    pub leader_elect_renew_deadline: FlagDuration,

    /// Pause between attempts to acquire or renew the lease.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_RETRY_PERIOD))]
    pub leader_elect_retry_period: FlagDuration,

    /// Name of the Lease object.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub leader_elect_resource_name: String,

    /// Namespace of the Lease. Default: the service account's namespace, else $POD_NAMESPACE, else kube-system.
    #[arg(long)]
    pub leader_elect_resource_namespace: Option<String>,

    /// Controllers to run, comma separated, in kube-controller-manager's syntax ("*" for the default ones, "-name" to turn one off, a "-controller" suffix optional): resourceclaim (always on), device-taint-eviction (on with "*"; runs while DRADeviceTaints is on), resourcepoolstatusrequest (on with "*"; runs while DRAResourcePoolStatus is on) and headroom (NodeScalingWatermark placeholders; off unless named; needs the chart's CRD). The allocator is turned on by --allocate-on-nodes instead.
    #[arg(long, default_value = "*", value_parser = parse_controllers)]
    pub controllers: Controllers,

    /// With the headroom controller: release device placeholders so that a higher-priority pod waiting for devices binds (kube-scheduler cannot preempt pods for devices). false for a scheduler that can.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub headroom_yield: bool,

    /// With the headroom controller: also serve the seed operator's NodeScalingWatermarks (redhatcop.redhat.io/v1alpha1, proactive-node-scaling-operator) with its semantics. Needs its CRD (the chart's headroom.seedOperator.enabled).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub headroom_seed_watermarks: bool,

    /// With the headroom controller: serve the cluster-autoscaler's CapacityBuffers (autoscaling.x-k8s.io) whose provisioningStrategy is dra-claim-controller.io/placeholder-pods with real placeholder pods (claims included). Needs the autoscaler's CRD.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub headroom_capacity_buffers: bool,

    /// Address for /metrics (":8080" = all interfaces, "0" = off).
    #[arg(long, default_value_t = BindAddress::all_interfaces(8080))]
    pub metrics_bind_address: BindAddress,

    /// Serve /metrics over HTTPS to bearer tokens whose user may get the URL (TokenReview and SubjectAccessReview against the API server), as kube-controller-manager's secure port does. false: plain HTTP for anyone who can connect (loopback, or a mesh that authenticates).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_secure: bool,

    /// PEM certificate (chain) for the HTTPS /metrics; re-read when it changes. Without it (and --tls-private-key-file) a self-signed certificate is made at start.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<std::path::PathBuf>,

    /// Address for /healthz and /readyz ("0" = off).
    #[arg(long, default_value_t = BindAddress::all_interfaces(8081))]
    pub health_probe_bind_address: BindAddress,

    /// On SIGTERM, how long in-flight syncs may take to finish before the lease is released.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_SHUTDOWN_TIMEOUT), value_parser = parse_shutdown_timeout)]
    pub shutdown_timeout: FlagDuration,

    /// Names of the claim metrics: 1.36 (resourceclaim_controller_*), 1.37 (dynamic_resource_allocation_*, with owner_api_group/owner_api_kind on the creates counter) or both (same values), so dashboards written for either release work.
    #[arg(long, value_enum, default_value_t = MetricsNaming::Both)]
    pub metrics_naming: MetricsNaming,

    /// Which kube-controller-manager release the controllers act as where releases differ: 1.36, 1.37, 1.38, or auto (the API server's version, read at start and again when this replica takes the lead; a server newer than 1.38 is served with 1.38's rules, and the start-up log and dra_claim_controller_reference_release{api_server} say so).
    #[arg(long, default_value = "auto", value_parser = parse_reference_release)]
    pub reference_release: ReferenceRelease,

    /// Label selector of the nodes where this controller allocates devices for pods created with spec.nodeName (which bypass kube-scheduler): nodes kube-scheduler does not allocate on, e.g. reserved for pre-scheduled workloads. Empty (the default) turns allocation off.
    #[arg(long, default_value = "")]
    pub allocate_on_nodes: String,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "DRA_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter (tracing env-filter syntax), e.g. "info" or "info,dra_claim_controller=debug". RUST_LOG overrides it; so does -v when this is left at its default.
    #[arg(long, default_value = "info", env = "DRA_LOG_LEVEL")]
    pub log_level: String,

    /// klog verbosity, as kube-controller-manager takes it (--v=2 copied from its manifest works): 0 to 2 log at info, 3 and 4 at debug, 5 and more at trace. An explicit --log-level wins.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", value_parser = clap::value_parser!(u8).range(0..=10))]
    pub verbosity: Option<u8>,
}

impl Args {
    /// The log filter in effect: `--log-level`, or the level `-v` maps to
    /// when `--log-level` is left at its default.
    pub(crate) fn effective_log_level(&self) -> String {
        match self.verbosity {
            Some(v) if self.log_level == "info" => log_level_for_verbosity(v).to_string(),
            _ => self.log_level.clone(),
        }
    }
}

/// klog's verbosity as a tracing level: kube-controller-manager runs at
/// `--v=2` for the information an admin reads, `--v=4` for debugging.
pub(crate) fn log_level_for_verbosity(v: u8) -> &'static str {
    match v {
        0..=2 => "info",
        3 | 4 => "debug",
        _ => "trace",
    }
}

/// kube-controller-manager's `--min-resync-period` default.
pub(crate) const DEFAULT_MIN_RESYNC_PERIOD: Duration = Duration::from_secs(12 * 3600);
/// How long requests already sent may take on SIGTERM.
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which controllers `--controllers` turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controllers {
    pub headroom: bool,
    /// kube-controller-manager's `device-taint-eviction-controller`.
    pub device_taint_eviction: bool,
    /// kube-controller-manager's `resourcepoolstatusrequest-controller`.
    pub resource_pool_status_request: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("15s", 15_000),
            ("500ms", 500),
            ("2m", 120_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            ("1.5s", 1_500),
            ("0", 0),
        ];
        for (input, ms) in ok {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(ms)),
                "{input}"
            );
        }
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in [
            "",
            "3",
            "s",
            "10x",
            "-1",
            "1.2.3s",
            "1e20",
            "NaN",
            "inf",
            "9999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kube_controller_manager_spellings() {
        let rows = [
            (vec!["x", "--concurrent-resourceclaim-syncs=12"], 12),
            (vec!["x", "--concurrent-syncs=7"], 7),
            (
                vec![
                    "x",
                    "--concurrent-syncs=7",
                    "--concurrent-resourceclaim-syncs=9",
                ],
                9,
            ),
        ];
        for (argv, want) in rows {
            let args = Args::try_parse_from(&argv).unwrap();
            assert_eq!(args.concurrent_syncs, want, "{argv:?}");
        }
        let verbosity = [
            (vec!["x", "--v=2"], "info"),
            (vec!["x", "-v", "4"], "debug"),
            (vec!["x", "--v=6"], "trace"),
            (vec!["x", "--v=4", "--log-level=warn"], "warn"),
            (vec!["x"], "info"),
        ];
        for (argv, want) in verbosity {
            let args = Args::try_parse_from(&argv).unwrap();
            assert_eq!(args.effective_log_level(), want, "{argv:?}");
        }
        assert!(Args::try_parse_from(["x", "--v=11"]).is_err());
        assert!(
            Args::try_parse_from(["x", "--leader-elect-lease-duration=15"]).is_err(),
            "a bare number is not a Go duration"
        );
    }

    /// Absurd values are refused by the parser, with the flag named, never
    /// accepted to panic later (a duration overflowing a sleep, a NaN rate).
    #[test]
    fn absurd_flag_values_name_the_flag() {
        let rows = [
            ("--min-resync-period", "1e20"),
            ("--min-resync-period", "NaN"),
            ("--min-resync-period", "0"),
            ("--min-resync-period", "-5s"),
            ("--min-resync-period", "400d"),
            ("--min-resync-period", "30000h"),
            ("--kube-api-qps", "NaN"),
            ("--kube-api-qps", "-1"),
            ("--kube-api-qps", "inf"),
            ("--kube-api-qps", "1e30"),
            ("--kube-api-qps", "0.0000001"),
            ("--kube-api-burst", "-1"),
            ("--kube-api-burst", "99999999999"),
            ("--concurrent-resourceclaim-syncs", "0"),
            ("--concurrent-resourceclaim-syncs", "1000000"),
            ("--shutdown-timeout", "2h"),
            ("--leader-elect-lease-duration", "1e300"),
            ("--leader-elect-retry-period", "-1s"),
            ("--metrics-bind-address", "nowhere:99999"),
            ("--feature-gates", "DRAAdminAccess=maybe"),
            ("--controllers", "headroom"),
            ("--controllers", "resourceclaim,garbagecollector"),
            ("--concurrent-device-taint-eviction-syncs", "0"),
            ("--concurrent-device-taint-eviction-syncs", "-3"),
            ("--device-taint-evictions-per-second", "-1"),
            ("--device-taint-evictions-per-rule-per-second", "NaN"),
            ("--device-taint-eviction-max-share", "0"),
            ("--device-taint-eviction-max-share", "1.5"),
        ];
        for (flag, value) in rows {
            // `--flag=value`, so that a leading '-' reaches the value parser.
            let arg = format!("{flag}={value}");
            let err = Args::try_parse_from(["dra-claim-controller", arg.as_str()])
                .err()
                .unwrap_or_else(|| panic!("{flag}={value} was accepted"));
            let text = err.to_string();
            assert!(text.contains(flag), "{flag}={value}: {text}");
        }
        for (flag, value) in [
            ("--kube-api-qps", "0"),
            ("--kube-api-qps", "0.5"),
            ("--min-resync-period", "1s"),
            ("--shutdown-timeout", "0"),
            ("--controllers", "resourceclaim,headroom"),
            ("--controllers", "*,-device-taint-eviction-controller"),
            ("--device-taint-evictions-per-second", "0"),
            ("--device-taint-eviction-max-share", "1"),
        ] {
            assert!(
                Args::try_parse_from(["dra-claim-controller", flag, value]).is_ok(),
                "{flag}={value}"
            );
        }
    }

    #[test]
    fn controllers_take_kube_controller_manager_syntax() {
        // (headroom, device-taint-eviction); None: refused.
        let rows: [(&str, Option<(bool, bool)>); 16] = [
            ("resourceclaim", Some((false, false))),
            ("*", Some((false, true))),
            ("*,headroom", Some((true, true))),
            ("resourceclaim,headroom", Some((true, false))),
            (
                "resourceclaim-controller,headroom-controller",
                Some((true, false)),
            ),
            ("*,-headroom", Some((false, true))),
            ("*,headroom,-headroom", Some((false, true))),
            (" * , headroom ", Some((true, true))),
            ("*,-device-taint-eviction-controller", Some((false, false))),
            ("resourceclaim,device-taint-eviction", Some((false, true))),
            (
                "resourceclaim-controller,device-taint-eviction-controller",
                Some((false, true)),
            ),
            ("headroom", None),
            ("device-taint-eviction", None),
            ("*,-resourceclaim", None),
            ("-*", None),
            ("*,garbagecollector", None),
        ];
        for (value, want) in rows {
            let pool_status = parse_controllers(value)
                .ok()
                .map(|c| c.resource_pool_status_request);
            let want_pool_status = want.map(|_| value.contains('*'));
            assert_eq!(pool_status, want_pool_status, "--controllers={value}");
            let got = parse_controllers(value)
                .ok()
                .map(|c| (c.headroom, c.device_taint_eviction));
            assert_eq!(got, want, "--controllers={value}");
        }
    }

    #[test]
    fn pool_status_requests_are_named_as_kube_controller_manager_names_them() {
        for (value, on) in [
            ("*,-resourcepoolstatusrequest-controller", false),
            ("resourceclaim,resourcepoolstatusrequest", true),
            ("resourceclaim,resourcepoolstatusrequest-controller", true),
        ] {
            let got = parse_controllers(value).map(|c| c.resource_pool_status_request);
            assert_eq!(got, Ok(on), "--controllers={value}");
        }
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let args = Args::try_parse_from([
            "dra-claim-controller",
            "--log-level=info",
            "--kube-api-qps=20",
            "--log-level=debug",
            "--kube-api-qps=50",
        ])
        .expect("a repeated flag is accepted");
        assert_eq!(args.log_level, "debug");
        assert_eq!(args.kube_api_qps, 50.0);
    }

    #[test]
    fn defaults_match_the_contract() {
        let args = Args::try_parse_from(["dra-claim-controller"]).unwrap();
        assert_eq!(args.kube_api_qps, 20.0);
        assert_eq!(args.kube_api_burst, 30);
        assert_eq!(args.concurrent_syncs, 50);
        assert!(args.leader_elect);
        assert_eq!(args.leader_elect_lease_duration.0, Duration::from_secs(15));
        assert_eq!(args.leader_elect_renew_deadline.0, Duration::from_secs(10));
        assert_eq!(args.leader_elect_retry_period.0, Duration::from_secs(2));
        assert_eq!(args.min_resync_period.0, Duration::from_secs(12 * 3600));
        assert_eq!(args.feature_gates, FeatureGateFlag::default());
        assert_eq!(args.metrics_bind_address.to_string(), "0.0.0.0:8080");
        assert_eq!(args.health_probe_bind_address.to_string(), "0.0.0.0:8081");
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.metrics_naming, MetricsNaming::Both);
        assert_eq!(args.reference_release, ReferenceRelease::Auto);
    }

    #[test]
    fn durations_print_as_they_are_written() {
        for text in ["15s", "10s", "2s", "12h", "2m", "500ms", "0s"] {
            assert_eq!(text.parse::<FlagDuration>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn flags_parse() {
        let args = Args::try_parse_from([
            "dra-claim-controller",
            "--leader-elect=false",
            "--kube-api-qps=0.5",
            "--feature-gates=DRAAdminAccess=false",
            "--shutdown-timeout=5s",
        ])
        .unwrap();
        assert!(!args.leader_elect);
        assert_eq!(args.kube_api_qps, 0.5);
        assert!(!args.feature_gates.gates.admin_access);
        assert_eq!(args.shutdown_timeout.0, Duration::from_secs(5));
        assert!(Args::try_parse_from(["x", "--log-format=yaml"]).is_err());
        let kcm = Args::try_parse_from(["x", "--concurrent-resourceclaim-syncs=12"]).unwrap();
        assert_eq!(
            kcm.concurrent_syncs, 12,
            "kube-controller-manager's spelling"
        );
        assert!(Args::try_parse_from(["x", "--metrics-bind-address=nowhere"]).is_err());
        let off = Args::try_parse_from(["x", "--metrics-bind-address=0"]).unwrap();
        assert_eq!(off.metrics_bind_address.0, None);
        assert!(Args::try_parse_from(["x", "--feature-gates=Nope=true"]).is_err());
        assert!(Args::try_parse_from(["x", "--concurrent-syncs=0"]).is_err());
        let pinned = Args::try_parse_from(["x", "--reference-release=1.37"]).unwrap();
        assert_eq!(
            pinned.reference_release,
            ReferenceRelease::Pinned(Release::V1_37)
        );
        assert_eq!(
            Args::try_parse_from(["x", "--reference-release=1.38"])
                .unwrap()
                .reference_release,
            ReferenceRelease::Pinned(Release::V1_38)
        );
        assert!(Args::try_parse_from(["x", "--reference-release=1.39"]).is_err());
        let named = Args::try_parse_from(["x", "--metrics-naming=1.37"]).unwrap();
        assert_eq!(named.metrics_naming, MetricsNaming::V1_37);
        assert!(Args::try_parse_from(["x", "--metrics-naming=1.38"]).is_err());
    }
}
