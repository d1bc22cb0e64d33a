//! Nodes with devices, as a real cluster has them: Node objects kube-scheduler
//! can place pods on, node-local ResourceSlices, a DeviceClass for their
//! driver. Shared by the e2e tests and the scale benchmark.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A Ready Node the scheduler can use (no taints, room for 110 pods),
/// labelled `kubernetes.io/hostname=<name>`.
pub async fn create_schedulable_node(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
            )?,
        )
        .await?;
    report_ready(client, name).await
}

/// What the kubelet of node `name` would do once up: report it Ready with
/// room for 110 pods, and (playing the node lifecycle controller) lift the
/// not-ready taint the TaintNodesByCondition admission plugin put on it.
pub async fn report_ready(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let capacity = json!({"cpu": "64", "memory": "256Gi", "pods": "110"});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "e2e", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            }})),
        )
        .await?;
    // The TaintNodesByCondition admission plugin gives every new Node the
    // not-ready taint; the node lifecycle controller, which is not running
    // here, would lift it once the node reports Ready.
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await?;
    Ok(())
}

/// A DeviceClass `name` selecting the devices of the driver of that name.
pub async fn create_device_class(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    create_device_class_for_driver(client, name, name).await
}

/// A DeviceClass `name` selecting the devices of `driver`.
pub async fn create_device_class_for_driver(
    client: &kube::Client,
    name: &str,
    driver: &str,
) -> anyhow::Result<()> {
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": [
                {"cel": {"expression": format!("device.driver == '{driver}'")}}]}}))?,
        )
        .await?;
    Ok(())
}

/// A node-local slice (pool named after the node) of `devices` devices
/// `dev-0`, `dev-1`, … of `driver` on `node`.
pub async fn create_devices(
    client: &kube::Client,
    driver: &str,
    node: &str,
    devices: usize,
) -> anyhow::Result<()> {
    let devices: Vec<Value> = (0..devices)
        .map(|i| json!({"name": format!("dev-{i}")}))
        .collect();
    Api::<ResourceSlice>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": node}, "spec": {
                "driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices}}))?,
        )
        .await?;
    Ok(())
}
