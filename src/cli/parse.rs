//! Parsers of flag values: each refuses an absurd value with a message
//! naming what is accepted, so that clap reports it against its flag
//! instead of the value panicking later (a duration overflowing a sleep, a
//! NaN rate).

use std::time::Duration;

use super::{Controllers, FlagDuration, ReferenceRelease, parse_duration};
use crate::model::features::FeatureGateFlag;

pub(super) fn parse_reference_release(s: &str) -> Result<ReferenceRelease, String> {
    match s.trim() {
        "auto" => Ok(ReferenceRelease::Auto),
        other => other.parse().map(ReferenceRelease::Pinned),
    }
}

pub(super) fn parse_gates(s: &str) -> Result<FeatureGateFlag, String> {
    s.parse()
}

/// The least QPS that is not 0 (unlimited): one request every 1,000 s.
const MIN_QPS: f32 = 0.001;
/// More than any API server serves one client.
const MAX_QPS: f32 = 1_000_000.0;

/// `--kube-api-qps`: 0 (unlimited) or a finite rate the token bucket can
/// pace.
pub(super) fn parse_qps(s: &str) -> Result<f32, String> {
    let qps: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !qps.is_finite() || qps < 0.0 {
        return Err(format!("{s:?}: must be 0 (unlimited) or a positive number"));
    }
    if qps != 0.0 && !(MIN_QPS..=MAX_QPS).contains(&qps) {
        return Err(format!(
            "{s:?}: must be 0 (unlimited) or between {MIN_QPS} and {MAX_QPS}"
        ));
    }
    Ok(qps)
}

/// `--min-resync-period`: at least a second (a shorter one would spin), at
/// most a week (past that the "missed events heal" promise means nothing).
pub(super) fn parse_resync_period(s: &str) -> Result<FlagDuration, String> {
    bounded(
        s,
        Duration::from_secs(1),
        Duration::from_secs(7 * 24 * 3600),
    )
}

/// `--shutdown-timeout`: at most an hour (a kubelet's grace period is far
/// shorter; a longer wait only delays the next leader).
pub(super) fn parse_shutdown_timeout(s: &str) -> Result<FlagDuration, String> {
    bounded(s, Duration::ZERO, Duration::from_secs(3600))
}

fn bounded(s: &str, min: Duration, max: Duration) -> Result<FlagDuration, String> {
    let d = parse_duration(s)?;
    if d < min || d > max {
        return Err(format!(
            "{s:?}: must be between {} and {}",
            FlagDuration(min),
            FlagDuration(max)
        ));
    }
    Ok(FlagDuration(d))
}

/// `--concurrent-device-taint-eviction-syncs`, worded as
/// kube-controller-manager words it.
pub(super) fn parse_device_taint_syncs(s: &str) -> Result<u32, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if n <= 0 {
        return Err(format!(
            "concurrent-device-taint-eviction-syncs must be greater than zero, got {n}"
        ));
    }
    u32::try_from(n.min(10_000)).map_err(|e| e.to_string())
}

/// A rate per second: 0 (off) or more.
pub(super) fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a rate per second (0 or more; 0 turns pacing off)"
        )),
    }
}

/// A share of the allocated devices: above 0, at most 1 (no guard).
pub(super) fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a share: use a number above 0 and at most 1 (1 turns the guard off)"
        )),
    }
}

/// Parses `--controllers` with kube-controller-manager's syntax: `*` turns
/// on the controllers that are on by default (the claim controller,
/// `device-taint-eviction` and `resourcepoolstatusrequest`, the last two
/// still subject to their gates), a name turns one on, `-name` turns it off
/// (later entries win); `-controller` suffixes are accepted
/// (`resourceclaim-controller`). The claim controller cannot be turned off;
/// `headroom` is off unless named.
pub(crate) fn parse_controllers(s: &str) -> Result<Controllers, String> {
    const KNOWN: &str = "known: *, resourceclaim, device-taint-eviction, resourcepoolstatusrequest, headroom (a leading '-' turns one off)";
    let mut controllers = Controllers {
        headroom: false,
        device_taint_eviction: false,
        resource_pool_status_request: false,
    };
    let mut claim = false;
    for entry in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (on, name) = match entry.strip_prefix('-') {
            Some(name) => (false, name),
            None => (true, entry),
        };
        match name.strip_suffix("-controller").unwrap_or(name) {
            "*" if on => {
                claim = true;
                controllers.device_taint_eviction = true;
                controllers.resource_pool_status_request = true;
            }
            "device-taint-eviction" => controllers.device_taint_eviction = on,
            "resourcepoolstatusrequest" => controllers.resource_pool_status_request = on,
            "resourceclaim" => claim = on,
            "headroom" => controllers.headroom = on,
            _ => return Err(format!("unknown controller {entry:?}; {KNOWN}")),
        }
    }
    if !claim {
        return Err(
            "resourceclaim must be among the controllers (it cannot be turned off; '*' includes it)"
                .into(),
        );
    }
    Ok(controllers)
}
