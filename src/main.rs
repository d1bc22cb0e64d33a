//! dra-claim-controller: flags and logging. The process itself is
//! `dra_claim_controller::app::run`; the read-only subcommands are
//! `dra_claim_controller::inspect`.

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::cli::Args;

fn main() -> ExitCode {
    // A usage error exits 3 rather than clap's 2: for drain-check and
    // audit, 2 means "warnings", and a script must not mistake a typo for it.
    let mut args = Args::try_parse().unwrap_or_else(|e| exit_usage(e));
    if let Some(tool) = args.tool.take() {
        app::init_tool_logging();
        return app::block_on_exit("dra-claim-controller", async {
            Ok(dra_claim_controller::inspect::run(tool).await)
        });
    }
    app::init_logging(&args);
    app::block_on_exit("dra-claim-controller", app::run(args))
}

/// Prints clap's message; help and version exit 0, usage errors 3.
fn exit_usage(e: clap::Error) -> ! {
    let _ = e.print();
    std::process::exit(if e.exit_code() == 0 { 0 } else { 3 })
}
