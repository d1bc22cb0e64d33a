//! Command-line flags. Names follow kube-controller-manager's where one
//! exists, so an admin can carry settings over.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::features::FeatureGateFlag;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "dra-claim-controller",
    version,
    about = "Runs the DRA ResourceClaim lifecycle (kube-controller-manager's resourceclaim-controller) as its own process."
)]
pub struct Args {
    /// Kubeconfig file. Default: $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Sustained requests per second to the API server, shared by every request of the process (0 = unlimited).
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,

    /// Requests that may be sent back to back before the QPS pacing applies.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,

    /// Number of workers syncing pods and claims concurrently.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrent_syncs: u32,

    /// Feature gates, as Name=true|false pairs. Acted on: DRAAdminAccess, DRAPrioritizedList, DRAExtendedResource (all on by default, as in Kubernetes 1.36). kube-controller-manager's other gates are accepted and ignored, so its flag value can be copied; WorkloadResourceClaims=true is refused (PodGroup claims are not supported yet).
    #[arg(long, default_value = "", value_parser = parse_gates)]
    pub feature_gates: FeatureGateFlag,

    /// Every cached pod and claim is re-examined at a random period between this and twice this (as kube-controller-manager's informers), from the caches: a missed event heals by itself.
    #[arg(long, default_value = "12h", value_parser = parse_duration)]
    pub min_resync_period: Duration,

    /// Elect a leader through a Lease before doing any work (turn off only with a single replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// How long a lease is valid; a standby takes over this long after the leader stops renewing.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader may fail to renew before it stops working and exits.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// Pause between attempts to acquire or renew the lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Name of the Lease object.
    #[arg(long, default_value = "dra-claim-controller")]
    pub leader_elect_resource_name: String,

    /// Namespace of the Lease. Default: the service account's namespace, else $POD_NAMESPACE, else kube-system.
    #[arg(long)]
    pub leader_elect_resource_namespace: Option<String>,

    /// Address for /metrics (":8080" = all interfaces, "0" = off).
    #[arg(long, default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Address for /healthz and /readyz ("0" = off).
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// On SIGTERM, how long in-flight syncs may take to finish before the lease is released.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Log filter (tracing env-filter syntax), e.g. "info" or "info,dra_claim_controller=debug". RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

fn parse_gates(s: &str) -> Result<FeatureGateFlag, String> {
    s.parse()
}

/// Parses Go-style durations as Kubernetes flags take them: "15s", "500ms",
/// "2m", "1h", "1m30s". A bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return secs_to_duration(secs, s);
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: missing unit (ms, s, m, h)"))?;
        let (num, tail) = rest.split_at(num_end);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("{s:?}: bad number {num:?}"))?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let factor = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("{s:?}: unknown unit {other:?} (use ms, s, m or h)")),
        };
        total += value * factor;
        rest = next;
    }
    secs_to_duration(total, s)
}

fn secs_to_duration(secs: f64, input: &str) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{input:?}: duration must be a non-negative number"));
    }
    Ok(Duration::from_secs_f64(secs))
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
            ("3", 3_000),
            ("1.5s", 1_500),
        ];
        for (input, ms) in ok {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(ms)),
                "{input}"
            );
        }
        for bad in ["", "s", "10x", "-1", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let args = Args::try_parse_from(["dra-claim-controller"]).unwrap();
        assert_eq!(args.kube_api_qps, 20.0);
        assert_eq!(args.kube_api_burst, 30);
        assert_eq!(args.concurrent_syncs, 50);
        assert!(args.leader_elect);
        assert_eq!(args.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(args.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(args.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(args.feature_gates, FeatureGateFlag::default());
        assert_eq!(args.metrics_bind_address, ":8080");
        assert_eq!(args.health_probe_bind_address, ":8081");
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
        assert_eq!(args.shutdown_timeout, Duration::from_secs(5));
        assert!(Args::try_parse_from(["x", "--feature-gates=Nope=true"]).is_err());
        assert!(Args::try_parse_from(["x", "--concurrent-syncs=0"]).is_err());
    }
}
