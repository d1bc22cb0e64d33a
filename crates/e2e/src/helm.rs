//! Renders `charts/dra-claim-controller` with a real Helm.
//!
//! Helm's Go SDK is reached through the PyPI package `helm-python-sdk`, which
//! ships it as a shared library (`libhelm_c.so`) behind a ctypes binding, so
//! neither a `helm` binary nor a Go toolchain is needed. `tests/helm/venv.sh`
//! installs it in a virtualenv under `<target dir>/helm-venv` (`.ci/run`
//! calls it first); no test installs anything.
//!
//! Without that venv the helpers return `Ok(None)` after printing one
//! `SKIP: helm-python-sdk unavailable (<reason>)` line;
//! `DRA_HELM_TESTS_REQUIRED=1` (set by `.ci/run`) turns that into an error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The helm-python-sdk release these tests were written against (Helm SDK v4.2.3).
pub const HELM_PYTHON_SDK_VERSION: &str = "0.2.2";

/// Set to `1` to make an unavailable Helm a test failure rather than a skip.
pub const REQUIRED_ENV: &str = "DRA_HELM_TESTS_REQUIRED";

/// Repository root: two levels above this crate (`crates/e2e`).
pub fn repo_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")))
}

/// The chart directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts").join("dra-claim-controller")
}

/// The lint-and-template helper script.
pub fn render_script() -> PathBuf {
    repo_root().join("tests").join("helm").join("render.py")
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (at run or build time) or
/// `<repo>/target`.
pub fn target_dir() -> PathBuf {
    let configured = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_TARGET_DIR").map(PathBuf::from));
    match configured {
        Some(dir) if dir.is_absolute() => dir,
        Some(dir) => repo_root().join(dir),
        None => repo_root().join("target"),
    }
}

/// The virtualenv that holds helm-python-sdk.
pub fn venv_dir() -> PathBuf {
    target_dir().join("helm-venv")
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn marker_file(venv: &Path) -> PathBuf {
    venv.join(format!(".helm-python-sdk-{HELM_PYTHON_SDK_VERSION}.ok"))
}

/// The venv's python (made by `tests/helm/venv.sh`). `Ok(None)`: Helm is
/// unavailable and the caller should skip (the SKIP line is printed once per
/// process).
pub fn helm_python() -> Result<Option<PathBuf>, String> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let outcome = PYTHON.get_or_init(|| {
        let outcome = ensure_venv();
        if let Err(reason) = &outcome {
            let line = format!("SKIP: helm-python-sdk unavailable ({reason})\n");
            let _ = std::io::stdout().write_all(line.as_bytes());
            let _ = std::io::stdout().flush();
        }
        outcome
    });
    match outcome {
        Ok(python) => Ok(Some(python.clone())),
        Err(reason) if std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1") => Err(format!(
            "helm-python-sdk unavailable ({reason}) and {REQUIRED_ENV}=1"
        )),
        Err(_) => Ok(None),
    }
}

fn ensure_venv() -> Result<PathBuf, String> {
    let venv = venv_dir();
    let python = venv_python(&venv);
    if marker_file(&venv).is_file() && python.exists() {
        return Ok(python);
    }
    Err(format!(
        "no finished venv at {}: run tests/helm/venv.sh (.ci/run does)",
        venv.display()
    ))
}

/// Lints the chart (`helm lint --strict`) and renders it (`helm template`)
/// with `--set key=value` for each pair (Helm `--set` syntax: escape commas
/// in a value as `\,`). Values are validated against values.schema.json.
///
/// `Ok(Some(yaml))`: the manifests as one multi-document YAML stream.
/// `Ok(None)`: Helm is unavailable here; skip.
/// `Err(msg)`: lint, schema validation or rendering failed; `msg` is Helm's
/// message.
pub fn render_chart(
    release: &str,
    namespace: &str,
    extra_set: &[(&str, &str)],
) -> Result<Option<String>, String> {
    run_render(release, namespace, extra_set, &[])
}

/// Like [`render_chart`], with `values_yaml` passed as a values file
/// (`helm template -f`) before the `--set` pairs, for values `--set` cannot
/// express (floats, lists of objects, strings that look like numbers).
pub fn render_chart_with_values(
    release: &str,
    namespace: &str,
    values_yaml: &str,
    extra_set: &[(&str, &str)],
) -> Result<Option<String>, String> {
    let mut file = tempfile::Builder::new()
        .prefix("dra-values-")
        .suffix(".yaml")
        .tempfile()
        .map_err(|e| format!("temporary values file: {e}"))?;
    file.write_all(values_yaml.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("write values file: {e}"))?;
    let path = file.path().to_string_lossy().into_owned();
    run_render(release, namespace, extra_set, &["--values", path.as_str()])
}

/// Like [`render_chart`], for a cluster of Kubernetes `kube_version`
/// (e.g. `v1.35.0`) that serves `api_versions` (`group/version/Kind`)
/// besides Helm's defaults: what `helm install` learns from discovery.
pub fn render_chart_for_cluster(
    release: &str,
    namespace: &str,
    extra_set: &[(&str, &str)],
    kube_version: Option<&str>,
    api_versions: &[&str],
) -> Result<Option<String>, String> {
    let mut args: Vec<&str> = Vec::new();
    if let Some(v) = kube_version {
        args.extend(["--kube-version", v]);
    }
    for v in api_versions {
        args.extend(["--api-versions", v]);
    }
    run_render(release, namespace, extra_set, &args)
}

/// Like [`render_chart`], but returns the rendered NOTES.txt.
pub fn render_notes(
    release: &str,
    namespace: &str,
    extra_set: &[(&str, &str)],
) -> Result<Option<String>, String> {
    run_render(release, namespace, extra_set, &["--notes"])
}

/// The RBAC objects (ServiceAccount, ClusterRole, ClusterRoleBinding, Role,
/// RoleBinding) of a rendered release, as a multi-document YAML stream ready
/// for `kubectl apply -f -` or a kube client.
pub fn render_rbac(
    release: &str,
    namespace: &str,
    extra_set: &[(&str, &str)],
) -> Result<Option<String>, String> {
    const RBAC_KINDS: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let Some(rendered) = render_chart(release, namespace, extra_set)? else {
        return Ok(None);
    };
    let mut out = String::new();
    for doc in parse_documents(&rendered)? {
        let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        if RBAC_KINDS.contains(&kind) {
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(&doc).map_err(|e| e.to_string())?);
        }
    }
    Ok(Some(out))
}

/// Splits a multi-document YAML stream into its non-empty documents.
pub fn parse_documents(yaml: &str) -> Result<Vec<serde_yaml::Value>, String> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(de).map_err(|e| format!("bad YAML: {e}"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

fn run_render(
    release: &str,
    namespace: &str,
    extra_set: &[(&str, &str)],
    extra_args: &[&str],
) -> Result<Option<String>, String> {
    let Some(python) = helm_python()? else {
        return Ok(None);
    };
    let mut cmd = Command::new(&python);
    cmd.arg(render_script())
        .arg(chart_dir())
        .args(["--name", release, "--namespace", namespace])
        .args(extra_args);
    for (key, value) in extra_set {
        cmd.arg("--set").arg(format!("{key}={value}"));
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", python.display()))?;
    if out.status.success() {
        String::from_utf8(out.stdout)
            .map(Some)
            .map_err(|e| format!("render output is not UTF-8: {e}"))
    } else {
        Err(format!(
            "helm lint/template failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Applies every document of a rendered chart to the API server, as
/// `kubectl apply --server-side` would (kinds found by discovery, so CRDs,
/// Deployments, PodDisruptionBudgets and the rest go as they are).
pub async fn apply_rendered(client: &kube::Client, yaml: &str) -> anyhow::Result<usize> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::discovery::{Discovery, Scope};
    let docs = parse_documents(yaml).map_err(|e| anyhow::anyhow!(e))?;
    let discovery = Discovery::new(client.clone()).run().await?;
    let params = PatchParams::apply("dra-e2e").force();
    let mut applied = 0;
    for doc in docs {
        let obj: DynamicObject = serde_yaml::from_value(doc.clone())?;
        let types = obj
            .types
            .clone()
            .ok_or_else(|| anyhow::anyhow!("a document without apiVersion/kind"))?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| anyhow::anyhow!("the API server does not serve {gvk:?}"))?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|e| anyhow::anyhow!("apply {} {name}: {e}", types.kind))?;
        applied += 1;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_install_script_pins_the_version_the_harness_expects() {
        let script =
            std::fs::read_to_string(super::repo_root().join("tests/helm/venv.sh")).unwrap();
        let pin = format!(
            "\nHELM_PYTHON_SDK_VERSION={}\n",
            super::HELM_PYTHON_SDK_VERSION
        );
        assert!(script.contains(&pin), "tests/helm/venv.sh must pin {pin:?}");
    }
}
