//! The chart's API priority and fairness: the FlowSchema.

use super::*;

/// API Priority and Fairness: by default a FlowSchema sends every request
/// of the controller's service account to `workload-high`, one flow per
/// user, matched before the built-in `service-accounts` schema (9000);
/// a value turns it off or picks the level; a precedence that would lose
/// to the built-in schema is refused.
#[test]
fn a_flow_schema_puts_the_controller_beside_kube_controller_manager() {
    let docs = render_or_skip!(&[]);
    let schema = one_of_kind(&docs, "FlowSchema");
    assert_eq!(schema["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    let spec = &schema["spec"];
    assert_eq!(spec["priorityLevelConfiguration"]["name"], "workload-high");
    let precedence = spec["matchingPrecedence"].as_u64().unwrap();
    assert!(precedence < 9000, "{precedence}");
    assert_eq!(spec["distinguisherMethod"]["type"], "ByUser");
    let sa = one_of_kind(&docs, "ServiceAccount");
    let subject = &spec["rules"][0]["subjects"][0];
    assert_eq!(subject["kind"], "ServiceAccount");
    assert_eq!(subject["serviceAccount"]["name"], sa["metadata"]["name"]);
    assert_eq!(subject["serviceAccount"]["namespace"], NAMESPACE);
    assert_eq!(spec["rules"][0]["resourceRules"][0]["clusterScope"], true);
    assert_eq!(
        strings(&spec["rules"][0]["nonResourceRules"][0]["nonResourceURLs"]),
        ["*"]
    );

    let off = render_or_skip!(&[("kubeAPI.flowSchema.enabled", "false")]);
    assert!(all_of_kind(&off, "FlowSchema").is_empty());
    let chosen = render_or_skip!(&[("kubeAPI.flowSchema.priorityLevel", "global-default")]);
    assert_eq!(
        one_of_kind(&chosen, "FlowSchema")["spec"]["priorityLevelConfiguration"]["name"],
        "global-default"
    );
    let err = render_err_or_skip!(&[("kubeAPI.flowSchema.matchingPrecedence", "9000")]);
    assert!(err.to_string().contains("matchingPrecedence"), "{err}");
}
