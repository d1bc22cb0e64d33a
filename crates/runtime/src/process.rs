//! What every process of ours does at its edges, the controller and the
//! admin commands alike: logging to stderr, exit codes (a panic, a usage
//! error), and running its work on a multi-threaded runtime.

use std::process::ExitCode;

use tracing::error;
use tracing_subscriber::EnvFilter;

/// kube's HTTP layer logs every non-2xx answer at ERROR, expected ones
/// included (a 404 on a lookup, a 409 on a guarded patch, the API server
/// still starting). Our own lines say what happened at the right level, so
/// the client's are off unless the filter names `kube_client` itself.
const KUBE_CLIENT_HTTP_LOGS_OFF: &str = "kube_client::client::builder=off";

/// The tracing filter for a `--log-level` / `RUST_LOG` value.
pub fn log_filter(spec: &str) -> String {
    if spec.contains("kube_client") {
        spec.to_string()
    } else if spec.trim().is_empty() {
        format!("info,{KUBE_CLIENT_HTTP_LOGS_OFF}")
    } else {
        format!("{spec},{KUBE_CLIENT_HTTP_LOGS_OFF}")
    }
}

/// Logs to stderr at `level` (RUST_LOG overrides it; `fallback` when the
/// filter does not parse), as JSON or as text.
pub fn init_logging(level: &str, fallback: &str, json: bool) {
    let spec = std::env::var(EnvFilter::DEFAULT_ENV).unwrap_or_else(|_| level.to_string());
    let filter = EnvFilter::try_new(log_filter(&spec)).unwrap_or_else(|_| EnvFilter::new(fallback));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a terminal; log files and collectors get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// The exit code of a process that panicked (BSD's EX_SOFTWARE).
pub const PANIC_EXIT_CODE: i32 = 70;

/// A panic anywhere ends the process with [`PANIC_EXIT_CODE`], so that the
/// Deployment restarts it: a worker task that died on its own would leave
/// its key "processing" forever and the process quietly smaller. (Release
/// builds also abort on panic; this covers every build.)
pub fn exit_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        error!(panic = %info, "panicked; exiting so that the process is restarted");
        std::process::exit(PANIC_EXIT_CODE);
    }));
}

/// Prints clap's message; help and version exit 0, usage errors 3 ("not
/// completed"): for drain-check and audit, clap's 2 would read as
/// "warnings", and a script must not mistake a typo for it.
pub fn exit_usage(e: clap::Error) -> ! {
    let _ = e.print();
    std::process::exit(if e.exit_code() == 0 { 0 } else { 3 })
}

/// Runs `work` on a multi-threaded runtime and turns its outcome into the
/// process exit code, reporting errors the same way for every entry point.
pub fn block_on_exit(
    program: &str,
    work: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{program}: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            error!(error = %format!("{e:#}"), "exiting");
            eprintln!("{program}: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_http_logs_are_off_unless_asked_for() {
        let rows = [
            ("info", "info,kube_client::client::builder=off"),
            (
                "info,dra_claim_controller=debug",
                "info,dra_claim_controller=debug,kube_client::client::builder=off",
            ),
            ("", "info,kube_client::client::builder=off"),
            ("debug,kube_client=debug", "debug,kube_client=debug"),
        ];
        for (spec, want) in rows {
            assert_eq!(log_filter(spec), want, "{spec:?}");
            assert!(EnvFilter::try_new(log_filter(spec)).is_ok());
        }
    }
}
