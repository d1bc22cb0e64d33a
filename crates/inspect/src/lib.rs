//! The admin commands, read-only but for `drain` and `uncordon`, which
//! write DeviceTaintRules: may a node's DRA driver go (`drain-check`),
//! where do claims leak (`audit`), what does every pool offer (`pools`),
//! does an installed controller work (`check-release`), and taking a
//! node's devices out of service and back (`drain`, `uncordon`).
//!
//! - `model::classify`: what is wrong with one claim (shared with the
//!   controller's `dra_claim_controller_claims` gauge);
//! - [`placement`]: which node a claim's devices serve;
//! - [`drain`] and [`audit`]: the two checks, pure, over a [`snapshot`];
//! - `device_drain`: `drain` and `uncordon`, the DeviceTaintRules they
//!   plan and write; `pools`: every pool's devices by state;
//! - [`read`]: the API reads; [`report`]: table, JSON and exit codes;
//! - [`release`]: whether an installed controller works (`check-release`,
//!   the chart's `helm test`);
//! - [`commands`]: the subcommands of both binaries: their flags, the one
//!   client and the one output they share, and each command's steps.

mod audit;
mod commands;
mod device_drain;
mod drain;
mod placement;
mod pools;
mod read;
mod release;
mod report;
mod snapshot;

pub use commands::{Tool, run};

/// Runs an admin command as `program` (read-only, but for `drain` and
/// `uncordon`, which write DeviceTaintRules): warnings and errors only, as
/// text on stderr (stdout carries the report; RUST_LOG overrides the
/// level).
pub fn run_tool(program: &str, tool: Tool) -> std::process::ExitCode {
    dra_runtime::process::init_logging("warn", "warn", false);
    dra_runtime::process::block_on_exit(program, async { Ok(run(tool).await) })
}
