//! How the controller reads its first lists: streaming lists where the API
//! server serves them (one request per resource, no whole list held at
//! once on either side), pages where it does not, and ready either way.

use crate::cluster::{ControllerOpts, etcd_serves_progress_requests};
use crate::ctx::TestCtx;
use crate::fault_proxy::FaultPlan;
use crate::faults_api::controller_behind_proxy;
use crate::k8s::Source;

/// The claim controller's three watches, by the path of their requests.
const CLAIM_WATCHES: [&str; 3] = [
    "/api/v1/pods",
    "/apis/resource.k8s.io/v1/resourceclaims",
    "/apis/resource.k8s.io/v1/resourceclaimtemplates",
];

/// A pod waiting before the controller starts gets its claim once the
/// first lists are in, whichever way they were read; the way is the one
/// the server serves: streaming on an etcd that answers watch progress
/// requests (kube-apiserver needs them for `sendInitialEvents`), otherwise
/// one refused streaming attempt per watch and pages from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_lists_stream_where_the_server_serves_them() {
    const NAME: &str = "first_lists_stream_where_the_server_serves_them";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let etcd = t.isolated_env().cluster.etcd_version().await.unwrap();
    let streams = etcd_serves_progress_requests(&etcd);
    t.create_template("gpu-template").await;
    t.create_pod("early", &[("gpu", Source::Template("gpu-template"))], None)
        .await;

    let proxy = controller_behind_proxy(&mut t, FaultPlan::default()).await;
    t.wait_recorded("early", &["gpu"]).await;

    let reads = proxy.list_reads();
    println!("START-UP: {NAME}: etcd {etcd}, list reads {reads:?}");
    for path in CLAIM_WATCHES {
        let of_path: Vec<bool> = reads
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.streaming)
            .collect();
        if streams {
            assert_eq!(
                of_path,
                [true],
                "{path}: one streaming list, no pages (etcd {etcd})"
            );
        } else {
            assert!(
                of_path.first() == Some(&true)
                    && of_path[1..].iter().all(|s| !s)
                    && of_path.len() >= 2,
                "{path}: one streaming attempt, then pages (etcd {etcd}): {of_path:?}"
            );
        }
    }
    t.finish();
}
