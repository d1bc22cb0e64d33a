//! Durations as Kubernetes components take them on the command line (Go's
//! `time.ParseDuration` syntax: "15s", "500ms", "2m", "1h30m"), for every
//! flag of the controller and the admin commands.

use std::time::Duration;

/// A duration flag, written and read as Kubernetes flags are ("15s", "2m",
/// "12h", "500ms"), so defaults are shown from the constants they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagDuration(pub Duration);

impl std::str::FromStr for FlagDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(FlagDuration)
    }
}

impl std::fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        let secs = d.as_secs();
        match (secs, d.subsec_millis(), d.subsec_nanos() % 1_000_000) {
            (s, 0, 0) if s > 0 && s % 3600 == 0 => write!(f, "{}h", s / 3600),
            (s, 0, 0) if s > 0 && s % 60 == 0 => write!(f, "{}m", s / 60),
            (s, 0, 0) => write!(f, "{s}s"),
            (s, ms, 0) => write!(f, "{}ms", s * 1000 + u64::from(ms)),
            _ => write!(f, "{}s", d.as_secs_f64()),
        }
    }
}

/// Parses Go durations as Kubernetes flags take them: "15s", "500ms",
/// "2m", "1h", "1m30s", "0". A bare number other than 0 is refused, as Go's
/// time.ParseDuration refuses it: "15" could mean seconds or minutes.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.parse::<f64>().is_ok() {
        return Err(format!(
            "{s:?}: missing unit (Go duration syntax: 15s, 500ms, 2m, 1h30m)"
        ));
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
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?} (use ns, us, ms, s, m or h)"
                ));
            }
        };
        total += value * factor;
        rest = next;
    }
    secs_to_duration(total, s)
}

/// The longest duration any flag takes: longer settings are typos.
const MAX_FLAG_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

fn secs_to_duration(secs: f64, input: &str) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{input:?}: duration must be a non-negative number"));
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_FLAG_DURATION => Ok(d),
        _ => Err(format!(
            "{input:?}: longer than a year, not a meaningful setting"
        )),
    }
}
