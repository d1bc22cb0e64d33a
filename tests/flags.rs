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

/// `kubectl-dra completion SHELL` prints a completion script that knows the
/// commands and kubectl's flags.
#[test]
fn the_plugin_prints_shell_completion() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["drain-check", "audit", "all-namespaces", "as-group"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
        .args(["completion", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(3), "a usage error");
}
