//! Reading the state a check needs from the API server: read-only, paged,
//! through the process's rate-limited client, with a few quick retries on
//! errors that pass (and none on a refusal, which only a person can fix).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

use k8s_openapi::jiff::Timestamp;

use super::drain::{DrainScope, claims_to_look_up, pods_to_look_up};
use super::placement::NodeFacts;
use super::snapshot::Snapshot;
use dra_model::views::PodView;

/// Objects per page of a list: large clusters are read in pieces, so that
/// neither the API server nor this process holds one huge answer.
const PAGE_SIZE: u32 = 500;
/// Attempts per request for errors that may pass (5xx, 429, connection).
const ATTEMPTS: u32 = 4;

/// Why the state could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(
        "permission denied: cannot {verb} {resource}{scope} ({message}). Bind the read-only ClusterRole \
         the chart creates (<release>-inspector, value inspectorRole.create) to this user or service account"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        scope: String,
        message: String,
    },
    #[error(
        "the API server did not accept the credentials ({message}): check the kubeconfig's user, token or certificate"
    )]
    Unauthorized { message: String },
    #[error("{verb} {resource}{scope}: {message}")]
    Failed {
        verb: &'static str,
        resource: &'static str,
        scope: String,
        message: String,
        /// The HTTP status, 0 when no answer came.
        code: u16,
        /// May succeed when tried again later.
        transient: bool,
    },
}

impl ReadError {
    /// Whether waiting could help (`--wait` keeps trying those).
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            ReadError::Failed {
                transient: true,
                ..
            }
        )
    }
}

/// What a request was, for error messages.
#[derive(Clone, Copy)]
struct What<'a> {
    verb: &'static str,
    resource: &'static str,
    scope: &'a str,
}

fn read_error(what: What<'_>, err: &kube::Error) -> ReadError {
    let scope = what.scope.to_string();
    match err {
        kube::Error::Api(status) if status.code == 403 => ReadError::Forbidden {
            verb: what.verb,
            resource: what.resource,
            scope,
            message: status.message.clone(),
        },
        kube::Error::Api(status) if status.code == 401 => ReadError::Unauthorized {
            message: status.message.clone(),
        },
        kube::Error::Api(status) => ReadError::Failed {
            verb: what.verb,
            resource: what.resource,
            scope,
            message: format!("{} ({})", status.message, status.code),
            code: status.code,
            transient: status.code == 429 || status.code >= 500,
        },
        other => ReadError::Failed {
            verb: what.verb,
            resource: what.resource,
            scope,
            message: other.to_string(),
            code: 0,
            // Connection refused, timeouts, TLS hiccups while the server restarts.
            transient: true,
        },
    }
}

async fn with_retries<T, F, Fut>(what: What<'_>, mut attempt: F) -> Result<T, ReadError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut delay = Duration::from_millis(500);
    for n in 1..=ATTEMPTS {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let err = read_error(what, &e);
                if !err.is_transient() || n == ATTEMPTS {
                    return Err(err);
                }
                tracing::warn!(error = %err, attempt = n, "read failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// Every object of a list, page by page. A continue token that expired
/// (410) restarts the list once from the beginning.
async fn list_all<K>(api: &Api<K>, params: ListParams, what: What<'_>) -> Result<Vec<K>, ReadError>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut restarted = false;
    'start: loop {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut page_params = params.clone().limit(PAGE_SIZE);
            if let Some(t) = &token {
                page_params = page_params.continue_token(t);
            }
            let page = match with_retries(what, || api.list(&page_params)).await {
                Ok(page) => page,
                Err(ReadError::Failed { code: 410, .. }) if token.is_some() && !restarted => {
                    restarted = true;
                    continue 'start;
                }
                Err(e) => return Err(e),
            };
            out.extend(page.items);
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }
}

fn scope_of(namespace: Option<&str>) -> String {
    namespace
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_else(|| " in all namespaces".into())
}

/// Reads the cluster for the checks.
pub(crate) struct Reader {
    client: kube::Client,
}

impl Reader {
    pub(crate) fn new(client: kube::Client) -> Self {
        Reader { client }
    }

    /// The node's name and labels; `None` when there is no such Node.
    async fn node(&self, name: &str) -> Result<Option<NodeFacts>, ReadError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let scope = format!(" {name}");
        let what = What {
            verb: "get",
            resource: "nodes",
            scope: &scope,
        };
        let node = with_retries(what, || api.get_opt(name)).await?;
        Ok(node.map(|n| NodeFacts {
            name: name.to_string(),
            labels: n.metadata.labels.unwrap_or_default(),
        }))
    }

    async fn claims(&self, namespace: Option<&str>) -> Result<Vec<ResourceClaim>, ReadError> {
        let api: Api<ResourceClaim> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let scope = scope_of(namespace);
        let what = What {
            verb: "list",
            resource: "resourceclaims.resource.k8s.io",
            scope: &scope,
        };
        list_all(&api, ListParams::default(), what).await
    }

    async fn pods(
        &self,
        namespace: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<PodView>, ReadError> {
        let api: Api<PodView> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut params = ListParams::default();
        let mut scope = scope_of(namespace);
        if let Some(node) = node {
            params = params.fields(&format!("spec.nodeName={node}"));
            scope.push_str(&format!(" on node {node}"));
        }
        let what = What {
            verb: "list",
            resource: "pods",
            scope: &scope,
        };
        list_all(&api, params, what).await
    }

    /// The UIDs of the pods, in every namespace, that the label `selector`
    /// selects (the API server parses it, as for `kubectl drain
    /// --pod-selector`).
    async fn selected_pods(&self, selector: &str) -> Result<BTreeSet<String>, ReadError> {
        let api: Api<PodView> = Api::all(self.client.clone());
        let scope = format!(" selected by {selector:?}");
        let what = What {
            verb: "list",
            resource: "pods",
            scope: &scope,
        };
        let pods = list_all(&api, ListParams::default().labels(selector), what).await?;
        Ok(pods.iter().map(|p| p.uid().to_string()).collect())
    }

    /// [`Reader::for_node`], with the pods `selector` selects read just
    /// before and just after it: a selected pod that went (or came) while
    /// the node was read is still known as selected.
    pub(crate) async fn for_node_selected(
        &self,
        scope: DrainScope<'_>,
        now: Timestamp,
        selector: &str,
    ) -> Result<(Snapshot, BTreeSet<String>), ReadError> {
        let mut selected = self.selected_pods(selector).await?;
        let snapshot = self.for_node(scope, now).await?;
        selected.extend(self.selected_pods(selector).await?);
        Ok((snapshot, selected))
    }

    async fn slices(&self) -> Result<Vec<ResourceSlice>, ReadError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let what = What {
            verb: "list",
            resource: "resourceslices.resource.k8s.io",
            scope: "",
        };
        list_all(&api, ListParams::default(), what).await
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodView>, ReadError> {
        let api: Api<PodView> = Api::namespaced(self.client.clone(), namespace);
        let scope = format!(" {namespace}/{name}");
        let what = What {
            verb: "get",
            resource: "pods",
            scope: &scope,
        };
        with_retries(what, || api.get_opt(name)).await
    }

    async fn claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, ReadError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let scope = format!(" {namespace}/{name}");
        let what = What {
            verb: "get",
            resource: "resourceclaims.resource.k8s.io",
            scope: &scope,
        };
        with_retries(what, || api.get_opt(name)).await
    }

    /// What `drain-check` needs: the node (when it exists), its pods, all
    /// slices and claims, every other pod those claims name and every claim
    /// the node's pods name. Pods are read before claims, and claims the
    /// pods name but the list lacks are fetched one by one, so a claim
    /// reserved while the lists were read is not missed.
    pub(crate) async fn for_node(
        &self,
        scope: DrainScope<'_>,
        now: Timestamp,
    ) -> Result<Snapshot, ReadError> {
        let mut snapshot = Snapshot::default();
        if let Some(node) = self.node(scope.node).await? {
            snapshot.nodes.insert(node.name.clone(), node);
        }
        for pod in self.pods(None, Some(scope.node)).await? {
            snapshot.add_pod(pod);
        }
        snapshot.claims = self.claims(None).await?;
        snapshot.slices = self.slices().await?;
        let missing = pods_to_look_up(&snapshot, scope);
        self.look_up(&mut snapshot, missing).await?;
        for (namespace, name) in claims_to_look_up(&snapshot, scope, now) {
            if let Some(claim) = self.claim(&namespace, &name).await? {
                snapshot.claims.push(claim);
            }
        }
        Ok(snapshot)
    }

    /// What `audit` needs: claims and pods of the namespace (or all), all
    /// slices, and the node when the audit is narrowed to one.
    pub(crate) async fn for_audit(
        &self,
        namespace: Option<&str>,
        node: Option<&str>,
    ) -> Result<Snapshot, ReadError> {
        let mut snapshot = Snapshot {
            claims: self.claims(namespace).await?,
            slices: self.slices().await?,
            ..Default::default()
        };
        if let Some(node) = node
            && let Some(facts) = self.node(node).await?
        {
            snapshot.nodes.insert(facts.name.clone(), facts);
        }
        for pod in self.pods(namespace, None).await? {
            snapshot.add_pod(pod);
        }
        Ok(snapshot)
    }

    async fn look_up(
        &self,
        snapshot: &mut Snapshot,
        keys: BTreeSet<(String, String)>,
    ) -> Result<(), ReadError> {
        for (namespace, name) in keys {
            if let Some(pod) = self.pod(&namespace, &name).await? {
                snapshot.add_pod(pod);
            }
        }
        Ok(())
    }
}
