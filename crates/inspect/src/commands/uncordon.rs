//! `uncordon`: deletes the DeviceTaintRules `drain` made for a node and
//! names each one deleted, as `kubectl delete` does.

use super::{UncordonArgs, connect};
use crate::device_drain::{rules_version, uncordon};
use crate::report::exit;

/// Runs `uncordon`; its exit code.
pub(super) async fn run(args: UncordonArgs) -> u8 {
    let client = match connect(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let version = match rules_version(&client).await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::INCOMPLETE;
        }
    };
    match uncordon(&client, version, &args.node, args.driver.as_deref()).await {
        Ok(deleted) => {
            for name in &deleted {
                println!("devicetaintrule.resource.k8s.io/{name} deleted");
            }
            if deleted.is_empty() {
                eprintln!("node {} has no drain rules", args.node);
            }
            exit::CLEAN
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::INCOMPLETE
        }
    }
}
