//! The binary with absurd flag values: a usage error (exit 3) whose message
//! names the flag, never a panic (exit 101) or a start.

use std::process::Command;

#[test]
fn absurd_flags_exit_with_a_usage_error_naming_the_flag() {
    let rows = [
        ("--min-resync-period", "1e20"),
        ("--kube-api-qps", "NaN"),
        ("--kube-api-burst", "-3"),
        ("--shutdown-timeout", "1e300s"),
        ("--concurrent-resourceclaim-syncs", "0"),
    ];
    for (flag, value) in rows {
        let out = Command::new(env!("CARGO_BIN_EXE_dra-claim-controller"))
            .arg(format!("{flag}={value}"))
            .output()
            .expect("run the controller binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{flag}={value}: {stderr}");
        assert!(stderr.contains(flag), "{flag}={value}: {stderr}");
    }
}
