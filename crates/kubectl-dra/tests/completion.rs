//! The plugin binary as a user runs it.

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
