//! The binary's flags: an absurd value is a usage error (exit 3) whose
//! message names the flag, never a panic (exit 101) or a start; and
//! `docs/flags.md` is what `--help` prints.

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

/// The opening of `docs/flags.md`, before the `--help` output it holds.
const FLAGS_DOC_HEADER: &str = "# Flags

Every flag of `dra-claim-controller`, as `dra-claim-controller --help` prints it. This file is
generated: `tests/flags.rs` fails when it and `--help` differ, and
`UPDATE_DOCS=1 cargo test --test flags` writes it anew. The README's
[Flags](../README.md#flags) sums them up in a table and tells how kube-controller-manager's
flags carry over.

";

/// `docs/flags.md` is the binary's `--help`, word for word: a flag added,
/// renamed or explained anew changes the reference in the same change.
/// `UPDATE_DOCS=1` writes the file instead of comparing.
#[test]
fn flags_reference_matches_help() {
    // A clean environment: clap shows the values of the flags' environment
    // variables (DRA_KUBE_API_QPS, ...) in the help, and colours it when
    // told to.
    let out = Command::new(env!("CARGO_BIN_EXE_dra-claim-controller"))
        .arg("--help")
        .env_clear()
        .output()
        .expect("run the controller binary");
    assert!(
        out.status.success(),
        "--help exited with {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let help = String::from_utf8(out.stdout).expect("--help prints UTF-8");
    let mut expected = format!("{FLAGS_DOC_HEADER}```text\n{help}");
    if !expected.ends_with('\n') {
        expected.push('\n');
    }
    expected.push_str("```\n");

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &expected).unwrap_or_else(|e| panic!("write {path}: {e}"));
        return;
    }
    let actual = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    if actual != expected {
        let line = actual
            .lines()
            .zip(expected.lines())
            .position(|(a, e)| a != e)
            .unwrap_or_else(|| actual.lines().count().min(expected.lines().count()))
            + 1;
        panic!(
            "docs/flags.md differs from `dra-claim-controller --help` (first at line {line}); \
             run `UPDATE_DOCS=1 cargo test --test flags` and commit the result"
        );
    }
}
