//! The layout's rules, checked on the sources (see README "Layout"): the
//! runtime crate depends on no crate of ours and names no DRA type, no controller imports another, the admin
//! tools import no controller, and no two source files import each other,
//! directly or in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `root` (`a/b/mod.rs` and `a/b.rs` are
/// both `a::b`; `lib.rs` is the crate root).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its trailing unit test
/// module (tests may reach anywhere).
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path the code names that starts with `crate`, `super` or `self`,
/// with `use a::{b, c::d}` groups expanded one level.
fn paths_in(code: &str) -> Vec<(String, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| starts_word && bytes[i..].starts_with(h.as_bytes()));
        let Some(head) = head else {
            i += 1;
            continue;
        };
        let kind = head.trim_end_matches("::").to_string();
        let mut j = i + head.len();
        let mut segments = Vec::new();
        loop {
            let start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            if j > start {
                segments.push(code[start..j].to_string());
                if !bytes[j.min(bytes.len())..].starts_with(b"::") {
                    break;
                }
                j += 2;
            }
            if bytes.get(j) != Some(&b'{') {
                if j == start {
                    break;
                }
                continue;
            }
            {
                let close = code[j..].find('}').map_or(bytes.len(), |p| p + j);
                for item in code[j + 1..close].split(',') {
                    let mut full = segments.clone();
                    full.extend(
                        item.trim()
                            .split("::")
                            .map(|s| s.split(' ').next().unwrap_or("").to_string())
                            .filter(|s| !s.is_empty() && s.bytes().all(is_ident)),
                    );
                    out.push((kind.clone(), full));
                }
                j = close;
                break;
            }
        }
        out.push((kind, segments));
        i = j.max(i + 1);
    }
    out
}

/// File-level imports: module -> the modules (files) it names.
fn import_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let files: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| !f.ends_with("main.rs") && !f.components().any(|c| c.as_os_str() == "bin"))
        .collect();
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let is_dir_module = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        for (kind, segments) in paths_in(&code_of(file)) {
            let mut base: Vec<String> = match kind.as_str() {
                "crate" => Vec::new(),
                "self" if is_dir_module => module.clone(),
                "self" => module.clone(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let mut segments = segments.as_slice();
            while kind == "super" && segments.first().is_some_and(|s| s == "super") {
                base.pop();
                segments = &segments[1..];
            }
            let mut full = base;
            full.extend(segments.iter().cloned());
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|prefix| modules.contains_key(prefix));
            if let Some(target) = target
                && target != *module
                && !module.starts_with(&target)
            {
                graph.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// The import circles of `graph` (strongly connected groups of two or more).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    let nodes: Vec<&Vec<String>> = graph.keys().collect();
    let reaches = |from: &Vec<String>, to: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if next == to {
                    return true;
                }
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        false
    };
    let mut found = Vec::new();
    for a in &nodes {
        for b in graph.get(*a).into_iter().flatten() {
            if reaches(b, a) {
                found.push(vec![a.join("::"), b.join("::")]);
            }
        }
    }
    found
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_two_files_import_each_other() {
    for root in [
        "src",
        "crates/runtime/src",
        "crates/model/src",
        "crates/inspect/src",
        "crates/e2e/src",
    ] {
        let graph = import_graph(&repo().join(root));
        assert!(graph.len() > 2, "{root}: the import graph was not read");
        let found = circles(&graph);
        assert!(
            found.is_empty(),
            "{root}: files that import each other: {found:?}"
        );
    }
}

#[test]
fn the_checker_sees_a_circle() {
    let graph = BTreeMap::from([
        (
            vec!["a".to_string()],
            BTreeSet::from([vec!["b".to_string()]]),
        ),
        (
            vec!["b".to_string()],
            BTreeSet::from([vec!["c".to_string()]]),
        ),
        (
            vec!["c".to_string()],
            BTreeSet::from([vec!["a".to_string()]]),
        ),
    ]);
    assert_eq!(circles(&graph).len(), 3);
    let paths = paths_in(
        "use super::{cache::Caches, views};\nlet x = crate::model::views::PodView::new();",
    );
    assert!(paths.contains(&("super".into(), vec!["cache".into(), "Caches".into()])));
    assert!(paths.contains(&("super".into(), vec!["views".into()])));
    assert!(paths.contains(&(
        "crate".into(),
        vec![
            "model".into(),
            "views".into(),
            "PodView".into(),
            "new".into()
        ]
    )));
}

/// The crates of this workspace a crate's manifest depends on (its
/// `path =` dependencies, by directory name).
fn workspace_dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut section = String::new();
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[dependencies]"
            && let Some(at) = line.find("path = \"")
        {
            let path = &line[at + 8..];
            let path = &path[..path.find('"').unwrap()];
            found.push(path.rsplit('/').next().unwrap().to_string());
        }
    }
    found
}

/// Each crate depends only on the layers below it: the plugin links the
/// admin commands, never a controller (they live in the controller's own
/// crate, which nothing depends on).
#[test]
fn crates_depend_only_downwards() {
    let rows: [(&str, &[&str]); 5] = [
        ("crates/runtime", &[]),
        ("crates/model", &["runtime"]),
        ("crates/inspect", &["model", "runtime"]),
        ("crates/kubectl-dra", &["inspect", "runtime"]),
        (".", &["runtime", "model", "inspect"]),
    ];
    for (krate, allowed) in rows {
        let found = workspace_dependencies(&repo().join(krate).join("Cargo.toml"));
        let mut sorted = found.clone();
        sorted.sort();
        let mut want: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(sorted, want, "{krate} depends on {found:?}");
    }
}

/// The compiler keeps the runtime from naming the model or a controller
/// (it does not depend on them); what it cannot see: a DRA type from
/// k8s-openapi, which the runtime does depend on.
#[test]
fn the_runtime_knows_no_dra_type() {
    let runtime = repo().join("crates/runtime");
    assert_eq!(
        workspace_dependencies(&runtime.join("Cargo.toml")),
        Vec::<String>::new(),
        "the runtime is the bottom layer: it depends on no crate of ours"
    );
    let mut files = Vec::new();
    rust_files(&runtime.join("src"), &mut files);
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in [
            "k8s_openapi::api::resource",
            "ResourceClaim",
            "ResourceSlice",
        ] {
            assert!(!text.contains(word), "{} names {word}", file.display());
        }
    }
}

#[test]
fn rooms_do_not_reach_into_each_other() {
    let controllers = repo().join("src/controllers");
    let rooms: Vec<String> = std::fs::read_dir(&controllers)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(rooms.len() >= 2, "{rooms:?}");
    let mut checked = Vec::new();
    for room in &rooms {
        let mut files = Vec::new();
        rust_files(&controllers.join(room), &mut files);
        checked.push((room.clone(), files));
    }
    for (room, files) in checked {
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for other in rooms.iter().filter(|other| **other != room) {
                let reach = format!("controllers::{other}");
                assert!(
                    !text.contains(&reach),
                    "{} (room {room}) reaches into {reach}",
                    file.display()
                );
            }
        }
    }
}
