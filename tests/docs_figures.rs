//! The figures the README and docs/reliability.md restate from code
//! constants (deadlines, keepalive, health checks) match the constants: a
//! changed timeout fails here until the documents say the new value.

use std::time::Duration;

use dra_claim_controller::runtime::transport::*;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The table row of `doc` whose first cell starts with `label`.
fn row<'a>(doc: &'a str, label: &str) -> &'a str {
    doc.lines()
        .find(|l| l.starts_with(&format!("| {label}")))
        .unwrap_or_else(|| panic!("no table row starting with {label:?}"))
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

fn assert_says(doc_name: &str, row_text: &str, figures: &[String]) {
    for figure in figures {
        assert!(
            row_text.contains(figure.as_str()),
            "{doc_name}: the row {row_text:?} should say {figure:?} (the code's value)"
        );
    }
}

#[test]
fn reliability_doc_states_the_transport_constants() {
    let doc = read("docs/reliability.md");
    let name = "docs/reliability.md";
    assert_says(
        name,
        row(&doc, "TCP connect timeout"),
        &[secs(CONNECT_TIMEOUT)],
    );
    assert_says(
        name,
        row(&doc, "TCP keepalive"),
        &[
            format!("after {} idle", secs(TCP_KEEPALIVE_IDLE)),
            format!("every {}", secs(TCP_KEEPALIVE_INTERVAL)),
            format!("{TCP_KEEPALIVE_RETRIES} probes"),
        ],
    );
    assert_says(
        name,
        row(&doc, "`TCP_USER_TIMEOUT`"),
        &[secs(TCP_USER_TIMEOUT)],
    );
    assert_says(
        name,
        row(&doc, "HTTP/2 health check"),
        &[
            format!("PING after {} without a frame", secs(H2_READ_IDLE)),
            format!("within {}", secs(H2_PING_TIMEOUT)),
            format!("at most {}", secs(H2_READ_IDLE + H2_PING_TIMEOUT)),
        ],
    );
    assert_says(
        name,
        row(&doc, "response headers of a write"),
        &[secs(WRITE_HEADERS)],
    );
    assert_says(
        name,
        row(&doc, "response headers of a read"),
        &[secs(READ_HEADERS)],
    );
    assert_says(
        name,
        row(&doc, "first byte (response headers) of a watch"),
        &[secs(WATCH_FIRST_BYTE)],
    );
    assert_says(
        name,
        row(&doc, "whole answer of anything but a watch"),
        &[secs(WHOLE_ANSWER)],
    );
    assert_says(
        name,
        row(&doc, "idle HTTP/1.1 connections"),
        &[secs(POOL_IDLE_TIMEOUT)],
    );
}

#[test]
fn readme_states_the_transport_constants() {
    let doc = read("README.md");
    let name = "README.md";
    assert_says(
        name,
        row(&doc, "TCP |"),
        &[
            format!("connect timeout {}", secs(CONNECT_TIMEOUT)),
            format!("keepalive after {} idle", secs(TCP_KEEPALIVE_IDLE)),
            format!("every {}", secs(TCP_KEEPALIVE_INTERVAL)),
            format!("{TCP_KEEPALIVE_RETRIES} probes"),
            format!("`TCP_USER_TIMEOUT` {}", secs(TCP_USER_TIMEOUT)),
        ],
    );
    assert_says(
        name,
        row(&doc, "HTTP/2 health check"),
        &[
            format!("PING after {} without a frame", secs(H2_READ_IDLE)),
            format!("within {}:", secs(H2_PING_TIMEOUT)),
            format!("found within {}", secs(H2_READ_IDLE + H2_PING_TIMEOUT)),
        ],
    );
    assert_says(
        name,
        row(&doc, "response headers"),
        &[
            format!("writes {}", secs(WRITE_HEADERS)),
            format!("reads {}", secs(READ_HEADERS)),
            format!("first byte {}", secs(WATCH_FIRST_BYTE)),
            format!("whole answer {}", secs(WHOLE_ANSWER)),
        ],
    );
}

/// The README stays a front door: under 25,000 characters, with a table of
/// contents whose links name its own sections; the rest lives in docs/.
#[test]
fn readme_is_a_front_door() {
    let readme = read("README.md");
    let chars = readme.chars().count();
    assert!(
        chars < 25_000,
        "README.md has {chars} characters; move reference material to docs/"
    );
    let headings: Vec<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .collect::<String>()
                .replace(' ', "-")
        })
        .collect();
    let anchors: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- [")?.split_once("](#"))
        .filter_map(|(_, rest)| rest.split_once(')').map(|(a, _)| a))
        .collect();
    assert!(anchors.len() >= 6, "no table of contents: {anchors:?}");
    for anchor in anchors {
        assert!(
            headings.iter().any(|h| h == anchor),
            "the contents link #{anchor} names no section"
        );
    }
}

#[test]
fn reliability_doc_states_the_start_up_read_constants() {
    use dra_claim_controller::runtime::retry::BACKOFF_MAX;
    use dra_claim_controller::runtime::startup::PER_TRY_DEADLINE;
    let doc = read("docs/reliability.md");
    assert_says(
        "docs/reliability.md",
        row(&doc, "reads start-up needs"),
        &[
            format!("{} a try", secs(PER_TRY_DEADLINE)),
            format!("doubling to {}", secs(BACKOFF_MAX)),
        ],
    );
}

/// `n` with a comma between thousands, as the documents write numbers.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Every figure the README and docs restate from a limit of the code,
/// beyond the transport's: solver bounds, listener limits, review and
/// event budgets, the silent-watch bound, lease renewal retries, the
/// not-allocated grace.
#[test]
fn documents_state_the_limits_of_the_code() {
    use dra_claim_controller::allocate::SOLVER_STACK_BYTES;
    use dra_claim_controller::allocate::allocator::{MAX_SEARCH_STEPS, MAX_SEARCH_TIME};
    use dra_claim_controller::controllers::resourceclaim::pod::NOT_ALLOCATED_GRACE;
    use dra_claim_controller::runtime::delegated::{REVIEWS_PER_SECOND, VERDICT_TTL};
    use dra_claim_controller::runtime::events::{OBJECT_BURST, OBJECT_REFILL, WRITES_PER_SECOND};
    use dra_claim_controller::runtime::http::serve::{
        HANDLER_TIMEOUT, HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTIONS,
    };
    use dra_claim_controller::runtime::informer::SILENT_STREAM_BOUND_SECS;
    use dra_claim_controller::runtime::leader::DEFAULT_RENEW_DEADLINE;
    use dra_claim_controller::runtime::leader::rules::RENEW_RETRY_AFTER_FAILURE;

    assert_eq!(
        HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT,
        "the README gives one figure for both"
    );
    let readme = read("README.md");
    let says = |figure: String| {
        let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(&figure),
            "README.md should say {figure:?} (the code's value)"
        );
    };
    says(format!(
        "bounded at {} search steps and {} per pod",
        thousands(MAX_SEARCH_STEPS),
        secs(MAX_SEARCH_TIME)
    ));
    says(format!(
        "{} MiB of reserved stack",
        SOLVER_STACK_BYTES >> 20
    ));
    says(format!(
        "at most {MAX_CONNECTIONS} connections at once; {} for a TLS handshake and for request headers; {} per handler",
        secs(HANDSHAKE_TIMEOUT),
        secs(HANDLER_TIMEOUT)
    ));
    says(format!(
        "Verdicts are cached {}; reviews have their own budget ({REVIEWS_PER_SECOND}/s)",
        secs(VERDICT_TTL)
    ));
    says(format!(
        "spam filter per object ({OBJECT_BURST}, then one per {} minutes, as client-go's) and a budget of their own ({WRITES_PER_SECOND}/s)",
        OBJECT_REFILL.as_secs() / 60
    ));
    says(format!(
        "silent watches replaced within {SILENT_STREAM_BOUND_SECS} s"
    ));
    says(format!(
        "retried after {} ms, well within the default {} renew deadline",
        RENEW_RETRY_AFTER_FAILURE.as_millis(),
        secs(DEFAULT_RENEW_DEADLINE)
    ));
    let differences = read("docs/differences.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let grace = format!("still unallocated {} later", secs(NOT_ALLOCATED_GRACE));
    assert!(
        differences.contains(&grace),
        "docs/differences.md should say {grace:?}"
    );
}
