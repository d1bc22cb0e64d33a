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
