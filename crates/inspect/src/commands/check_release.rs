//! `check-release`: reads the controller's pods and Lease (and its
//! `/metrics`, when given) and prints each check's verdict.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use super::{CheckReleaseArgs, connect};
use crate::release;
use crate::report::exit;
use dra_runtime::client::ConnectionOverrides;

/// Runs `check-release`; its exit code.
pub(super) async fn run(args: CheckReleaseArgs) -> u8 {
    let client = match connect(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let pods = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&args.selector))
        .await;
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get(&args.lease)
        .await;
    let (pods, lease) = match (pods, lease) {
        (Ok(pods), Ok(lease)) => (pods.items, lease),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: the checks could not be made in namespace {ns}: {e}");
            return exit::INCOMPLETE;
        }
    };
    let mut verdicts = vec![
        release::pods_ready(&pods, &args.selector),
        release::lease_held(&lease, Timestamp::now()),
    ];
    if !args.metrics_url.is_empty() {
        let token = std::fs::read_to_string(&args.token_file)
            .ok()
            .map(|t| t.trim().to_string());
        let answer = fetch_metrics(&args.metrics_url, token).await;
        verdicts.push(release::metrics_answer(&args.metrics_url, answer));
    }
    for v in &verdicts {
        println!("{} {}", if v.ok { "ok:  " } else { "FAIL:" }, v.what);
    }
    if verdicts.iter().all(|v| v.ok) {
        exit::CLEAN
    } else {
        exit::BLOCKED
    }
}

/// GET `url` with `token` as bearer, the certificate not verified. Not
/// [`connect`]'s client: this one talks to the controller, not to the API
/// server, so none of kubectl's connection flags apply to it.
async fn fetch_metrics(url: &str, token: Option<String>) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let base = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("https"),
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    );
    let mut config = kube::Config::new(base.parse().map_err(|e| format!("not a URL: {e}"))?);
    ConnectionOverrides {
        token,
        insecure_skip_tls_verify: true,
        ..ConnectionOverrides::default()
    }
    .apply(&mut config)
    .map_err(|e| format!("{e:#}"))?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let request = http::Request::get(uri.path())
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())
}
