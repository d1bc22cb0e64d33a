//! Tables of `buffer.rs`.

use serde_json::json;

use super::*;
use crate::controllers::headroom::watermarks::watermark::{
    DEFAULT_PAUSE_IMAGE, DEFAULT_PRIORITY_CLASS,
};
use crate::model::requests::ResourceList;
use crate::model::requests::parse_list;
use crate::naming::{PLACEHOLDER_GATE, WATERMARK_ENTRY_LABEL, WATERMARK_LABEL};

fn list(pairs: &[(&str, &str)]) -> ResourceList {
    parse_list(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

/// Rows named after the autoscaler's `replicas_test.go` cases.
#[test]
fn the_autoscalers_count() {
    let pod = list(&[("cpu", "500m"), ("memory", "1Gi")]);
    let limits = list(&[("cpu", "2"), ("memory", "100Gi")]);
    type Row<'a> = (
        &'a str,
        Option<i32>,
        Option<i32>,
        Option<i32>,
        Option<&'a ResourceList>,
        Result<u32, ()>,
    );
    let rows: Vec<Row> = vec![
        ("Only Replicas", Some(3), None, None, None, Ok(3)),
        ("Only Percentage", None, Some(50), Some(10), None, Ok(5)),
        (
            "Only Percentage Rounding Up",
            None,
            Some(33),
            Some(10),
            None,
            Ok(4),
        ),
        (
            "Percentage of zero replicas",
            None,
            Some(50),
            Some(0),
            None,
            Ok(0),
        ),
        (
            "Replicas and Percentage: the larger",
            Some(2),
            Some(50),
            Some(10),
            None,
            Ok(5),
        ),
        (
            "Replicas above Percentage",
            Some(7),
            Some(10),
            Some(10),
            None,
            Ok(7),
        ),
        (
            "Percentage without a scalable is ignored",
            Some(2),
            Some(50),
            None,
            None,
            Ok(2),
        ),
        ("Only Limits", None, None, None, Some(&limits), Ok(4)),
        (
            "Replicas capped by Limits",
            Some(10),
            None,
            None,
            Some(&limits),
            Ok(4),
        ),
        (
            "Replicas under Limits",
            Some(3),
            None,
            None,
            Some(&limits),
            Ok(3),
        ),
        (
            "Negative replicas count as zero",
            Some(-2),
            None,
            None,
            None,
            Ok(0),
        ),
        ("Nothing defined", None, None, None, None, Err(())),
    ];
    for (name, replicas, pct, of, lim, want) in rows {
        let got = buffer_replicas(replicas, pct, of, lim, &pod).map_err(|_| ());
        assert_eq!(got, want, "{name}");
    }
    let gpus = list(&[("nvidia.com/gpu", "1")]);
    assert_eq!(
        buffer_replicas(None, None, None, Some(&list(&[("cpu", "4")])), &gpus),
        Err("resources in configured limits not found in the pod template".into()),
        "limits naming nothing the pod requests"
    );
}

#[test]
fn placeholders_keep_requests_claims_and_placement_only() {
    let template = json!({
        "serviceAccountName": "trainer",
        "volumes": [{"name": "data", "emptyDir": {}}],
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "initContainers": [{"name": "fetch", "image": "busybox"}],
        "containers": [{"name": "train", "image": "trainer:1", "command": ["train"],
                        "resources": {"requests": {"cpu": "2"}, "claims": [{"name": "gpu"}]}}],
    });
    let pod = placeholder_pod(&template, "training");
    let spec = &pod["spec"];
    assert_eq!(spec["containers"][0]["image"], DEFAULT_PAUSE_IMAGE);
    assert!(spec["containers"][0].get("command").is_none());
    assert_eq!(
        spec["containers"][0]["resources"]["claims"][0]["name"],
        "gpu"
    );
    assert_eq!(
        spec["resourceClaims"][0]["resourceClaimTemplateName"],
        "one-gpu"
    );
    assert_eq!(spec["nodeSelector"]["pool"], "gpu");
    assert!(spec.get("volumes").is_none() && spec.get("initContainers").is_none());
    assert!(spec.get("serviceAccountName").is_none());
    assert_eq!(spec["priorityClassName"], DEFAULT_PRIORITY_CLASS);
    assert_eq!(spec["schedulingGates"][0]["name"], PLACEHOLDER_GATE);
    assert_eq!(pod["metadata"]["labels"][WATERMARK_LABEL], "cb.training");
    assert_eq!(
        pod["metadata"]["labels"][WATERMARK_ENTRY_LABEL],
        BUFFER_ENTRY
    );
}

#[test]
fn status_speaks_the_autoscalers_conditions() {
    let ok = status_patch(&[], Ok(2), Some(1), "t1");
    let types: Vec<(&str, &str, &str)> = ok["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap(),
                c["status"].as_str().unwrap(),
                c["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("ReadyForProvisioning", "True", "AttributesSetSuccessfully"),
            ("Provisioning", "True", "PlaceholderPodsCreated")
        ]
    );
    assert_eq!(ok["status"]["replicas"], 2);
    assert_eq!(ok["status"]["provisioningStrategy"], STRATEGY);
    let bad = status_patch(&[], Err("no template"), Some(1), "t2");
    assert_eq!(bad["status"]["conditions"][0]["reason"], "error");
    assert!(bad["status"]["replicas"].is_null());
}

#[test]
fn label_values_stay_valid() {
    assert_eq!(placeholder_label("gpus"), "cb.gpus");
    let long = "a".repeat(100);
    assert_eq!(placeholder_label(&long).len(), 63);
    assert_eq!(
        placeholder_label(&format!("{}-b", "a".repeat(59))),
        format!("cb.{}", "a".repeat(59))
    );
}
