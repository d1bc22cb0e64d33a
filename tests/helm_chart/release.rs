//! The chart's release metadata: Artifact Hub annotations, the helm test hook.

use super::*;

/// Artifact Hub's image list names the image of this chart version, and its
/// CRD list every CRD the chart ships.
#[test]
fn artifact_hub_annotations_follow_the_chart() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(helm::chart_dir().join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    let app_version = chart["appVersion"].as_str().unwrap();
    let images = chart["annotations"]["artifacthub.io/images"]
        .as_str()
        .unwrap();
    assert!(
        images.contains(&format!("dra-claim-controller:{app_version}")),
        "{images}"
    );
    let crds = chart["annotations"]["artifacthub.io/crds"]
        .as_str()
        .unwrap();
    for entry in std::fs::read_dir(helm::chart_dir().join("crds")).unwrap() {
        let crd: Value =
            serde_yaml::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap()).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap();
        assert!(crds.contains(name), "artifacthub.io/crds lacks {name}");
    }
}

#[test]
fn the_helm_test_hook_checks_the_release_with_rights_of_its_own() {
    let off = render_or_skip!(&[]);
    assert!(all_of_kind(&off, "Pod").is_empty(), "opt-in");
    let docs = render_or_skip!(&[("helmTest.enabled", "true")]);
    let pod = one_of_kind(&docs, "Pod");
    assert_eq!(
        str_of(&pod["metadata"]["annotations"]["helm.sh/hook"]),
        "test"
    );
    let c = &pod["spec"]["containers"][0];
    let args = strings(&c["args"]);
    assert_eq!(args[0], "check-release");
    assert!(
        args.iter()
            .any(|a| a.starts_with("--metrics-url=https://") && a.ends_with(":8080/metrics")),
        "{args:?}"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    // Its own service account, with only what the checks read.
    let sa = str_of(&pod["spec"]["serviceAccountName"]);
    let role = all_of_kind(&docs, "Role")
        .into_iter()
        .find(|r| str_of(&r["metadata"]["name"]) == sa)
        .expect("the hook's Role");
    let verbs: Vec<String> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| strings(&r["verbs"]))
        .collect();
    assert_eq!(verbs, ["list", "get"]);
    let metrics = all_of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .any(|b| {
            str_of(&b["roleRef"]["name"]).ends_with("-metrics-reader")
                && str_of(&b["subjects"][0]["name"]) == sa
        });
    assert!(metrics, "the hook may read /metrics");
}
