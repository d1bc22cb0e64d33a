//! Why a claim does not fit a node, in words an admin can act on.

use super::*;

/// What was tried and why it failed, per request.
pub(super) fn explain(
    input: &AllocationInput,
    requests: &[Request],
    constraints: &[MatchConstraint],
) -> String {
    let node = input.node;
    let mut parts = Vec::new();
    let mut each_alone_fits = true;
    for request in requests {
        for alt in &request.alternatives {
            let t = &alt.tally;
            let needed = match alt.mode {
                Mode::Count(n) => n.to_string(),
                Mode::All => format!("all {}", alt.matching.len()),
            };
            let fits = match alt.mode {
                Mode::Count(n) => t.free >= n,
                Mode::All => !alt.matching.is_empty() && alt.matching.len() == alt.candidates.len(),
            };
            if !fits {
                each_alone_fits = false;
            }
            let mut counts = vec![format!("{} devices on node {node}", t.total)];
            for (n, what) in [
                (
                    t.class_rejected,
                    format!("rejected by class {}", alt.class_name),
                ),
                (
                    t.request_rejected,
                    "rejected by the request's selectors".to_string(),
                ),
                (
                    t.unsupported,
                    "use features this allocator does not support".to_string(),
                ),
                (t.tainted, "tainted and not tolerated".to_string()),
                (t.in_use, "allocated to other claims".to_string()),
            ] {
                if n > 0 {
                    counts.push(format!("{n} {what}"));
                }
            }
            counts.push(format!("{} free", t.free));
            counts.push(format!("{needed} needed"));
            parts.push(format!("request {}: {}", alt.name, counts.join(", ")));
        }
    }
    let mut message = parts.join("; ");
    if each_alone_fits && !requests.is_empty() {
        let attrs: Vec<&str> = constraints.iter().map(|c| c.attribute.as_str()).collect();
        if attrs.is_empty() {
            message.push_str("; not enough devices for all requests together");
        } else {
            message.push_str(&format!(
                "; no set of free devices has equal values of {}",
                attrs.join(", ")
            ));
        }
    }
    let problems: Vec<String> = input
        .inventory
        .pool_problems()
        .map(|(pool, state)| format!("pool {pool} {state} and was not used"))
        .collect();
    if !problems.is_empty() {
        message.push_str(&format!("; {}", problems.join(", ")));
    }
    let unsupported: Vec<String> = input
        .inventory
        .devices
        .iter()
        .filter_map(|d| d.unsupported.as_ref().map(|why| format!("{} {why}", d.id)))
        .take(3)
        .collect();
    if !unsupported.is_empty() {
        message.push_str(&format!("; not supported: {}", unsupported.join(", ")));
    }
    if input.inventory.devices.is_empty() && problems.is_empty() {
        message.push_str(&format!(
            " (node {node} publishes no node-local ResourceSlices; network-attached and allNodes \
             devices are never used by this allocator)"
        ));
    }
    message
}
