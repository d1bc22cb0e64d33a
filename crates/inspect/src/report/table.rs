//! Tables for people: rows of findings and counts, columns aligned.

use std::collections::BTreeMap;

use super::*;

pub(super) fn counts_table(
    first: &str,
    counts: &BTreeMap<String, BTreeMap<String, usize>>,
) -> String {
    let mut rows = vec![row(&[first, "FINDINGS"])];
    for (key, by_type) in counts {
        let cells: Vec<String> = by_type.iter().map(|(k, v)| format!("{k}={v}")).collect();
        rows.push(vec![key.clone(), cells.join(", ")]);
    }
    align(&rows)
}

pub(crate) fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// The columns `-o wide` adds: where the pod (or other consumer) runs, and
/// its UID (which tells a pod from another of the same name).
pub(super) const WIDE_COLUMNS: [&str; 2] = ["POD NODE", "POD UID"];

/// `resourceclaim.resource.k8s.io/<name>` of each claim, once, in order.
pub(super) fn object_names<'a>(findings: impl Iterator<Item = &'a Finding>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for f in findings {
        let name = format!("resourceclaim.resource.k8s.io/{}", f.claim.name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

pub(super) fn finding_row(
    f: &Finding,
    with_type: bool,
    node: Option<&str>,
    wide: bool,
) -> Vec<String> {
    let mut cells = Vec::new();
    if with_type {
        cells.push(f.kind.clone());
    }
    cells.push(f.claim.namespace.clone());
    cells.push(f.claim.name.clone());
    if let Some(node) = node {
        cells.push(node.to_string());
    }
    cells.push(if f.devices.is_empty() {
        "-".into()
    } else {
        f.devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    });
    match &f.subject {
        Some(s) if s.kind == "Pod" => {
            cells.push(match &s.placeholder_of {
                Some(w) => format!("{} (placeholder of {w})", s.name),
                None => s.name.clone(),
            });
            cells.push(s.state.clone());
        }
        Some(s) => {
            cells.push(format!("{}/{}", s.kind, s.name));
            cells.push(s.state.clone());
        }
        None => {
            cells.push("-".into());
            cells.push(
                f.deleting_for_seconds
                    .map(|s| format!("Deleting {}", human_duration(s)))
                    .unwrap_or_else(|| "-".into()),
            );
        }
    }
    cells.push(f.action.clone());
    if wide {
        let subject = f.subject.as_ref();
        cells.push(
            subject
                .and_then(|s| s.node.clone())
                .unwrap_or_else(|| "-".into()),
        );
        cells.push(
            subject
                .map(|s| s.uid.clone())
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "-".into()),
        );
    }
    cells
}

pub(super) fn findings_table(findings: &[Finding], with_type: bool, wide: bool) -> String {
    let mut header = Vec::new();
    if with_type {
        header.push("PROBLEM");
    }
    header.extend(["NAMESPACE", "CLAIM", "DEVICES", "POD", "STATE", "ACTION"]);
    if wide {
        header.extend(WIDE_COLUMNS);
    }
    let mut rows = vec![row(&header)];
    rows.extend(
        findings
            .iter()
            .map(|f| finding_row(f, with_type, None, wide)),
    );
    align(&rows)
}

/// Left-aligned columns separated by three spaces, as kubectl prints; the
/// last column is not padded.
pub(crate) fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
