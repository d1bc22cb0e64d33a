//! `pools`: what every DRA pool offers and what of it is used, as the
//! controller's `dra_claim_controller_pool_devices` gauge reports it (the
//! same computation, from the API server instead of memory). Read-only.

use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};
use kube::api::{Api, ListParams};

use dra_model::capacity::{PoolCapacity, pool_capacity};
use dra_model::device_taints::{RulesVersion, TaintRule};
use dra_model::views::ClaimView;

use super::report::table::{align, row};

/// Every pool, narrowed to a driver and a node when given.
pub(crate) async fn read_pools(
    client: &kube::Client,
    driver: Option<&str>,
    node: Option<&str>,
) -> Result<Vec<PoolCapacity>, String> {
    let slices: Vec<ResourceSlice> = Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing ResourceSlices: {e}"))?
        .items;
    let claims: Vec<ClaimView> = Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing ResourceClaims: {e}"))?
        .items;
    let rules = match super::device_drain::rules_version(client).await {
        Ok(RulesVersion::V1) => Api::<DeviceTaintRule>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(TaintRule::from_v1).collect())
            .map_err(|e| format!("listing DeviceTaintRules: {e}"))?,
        Ok(RulesVersion::V1beta2) => {
            Api::<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map(|l| l.items.iter().map(TaintRule::from_v1beta2).collect())
                .map_err(|e| format!("listing DeviceTaintRules: {e}"))?
        }
        // Not served: no rule taints anything.
        Err(_) => Vec::new(),
    };
    Ok(pool_capacity(&slices, &claims, &rules)
        .into_iter()
        .filter(|p| driver.is_none_or(|d| d == p.driver))
        .filter(|p| node.is_none_or(|n| n == p.node))
        .collect())
}

/// The table people read.
pub(crate) fn pools_table(pools: &[PoolCapacity]) -> String {
    let mut rows = vec![row(&[
        "DRIVER",
        "POOL",
        "NODE",
        "TOTAL",
        "ALLOCATED",
        "ADMIN-ACCESS",
        "UNAVAILABLE",
        "FREE",
    ])];
    for p in pools {
        let [total, allocated, admin, unavailable, free] = p.values().map(|v| v.to_string());
        let node = if p.node.is_empty() { "<none>" } else { &p.node };
        rows.push(row(&[
            &p.driver,
            &p.pool,
            node,
            &total,
            &allocated,
            &admin,
            &unavailable,
            &free,
        ]));
    }
    align(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_pool_under_a_header() {
        let pools = [PoolCapacity {
            driver: "gpu.example.com".into(),
            pool: "node-1".into(),
            node: "node-1".into(),
            total: 8,
            allocated: 5,
            admin_access: 0,
            unavailable: 1,
            free: 2,
        }];
        let table = pools_table(&pools);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("DRIVER"));
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "gpu.example.com",
                "node-1",
                "node-1",
                "8",
                "5",
                "0",
                "1",
                "2"
            ]
        );
    }
}
