//! A real node for the end-to-end tests: containerd and runc (Debian's
//! packages), a kubelet and the upstream DRA test driver (built from the
//! same Kubernetes tree as kube-apiserver and found beside it), and images
//! made here from Debian's `busybox-static` (no registry is reachable).
//!
//! Pods on it really run: the kubelet prepares their claims through the
//! driver, starts their containers, reports their phase and, once they
//! finish, unprepares. Everything the simulated data plane of the other
//! tests sets by hand, this one does for real.
//!
//! The kubelet's cgroups, iptables chains and sysctls belong to the whole
//! machine, so one real node runs at a time ([`RealNode::start`] waits for
//! the previous one to stop), and stopping restores what the kubelet
//! changed. Its directories (kubelet root, containerd root and state,
//! sockets) are the node's own, never `/var/lib/kubelet` or
//! `/var/lib/containerd`. The node's address is on a veth pair into a
//! network namespace the harness makes (the kubelet refuses 127/8); all
//! traffic stays on this machine. Test pods use the host network, so no
//! CNI traffic is needed at all.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::cluster::{Cluster, beside_apiserver, binaries};
use crate::procs::Proc;

/// The DRA driver the upstream test driver registers.
pub const DRIVER: &str = "test-driver.cdi.k8s.io";
/// A DeviceClass selecting the test driver's devices.
pub const DEVICE_CLASS: &str = "real-node.e2e.example.com";
/// The image every test pod runs (busybox, entrypoint `sh`).
pub const BUSYBOX_IMAGE: &str = "dra-e2e.local/busybox:1";
/// The sandbox image containerd starts for each pod (busybox sleeping).
pub const PAUSE_IMAGE: &str = "dra-e2e.local/pause:1";
/// The upstream pause image's name, served here by a local busybox image.
pub const UPSTREAM_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Devices the driver publishes on the node (unless started with more).
pub const DEVICES: u32 = 4;

const NETNS: &str = "dra-e2e-node";
const HOST_VETH: &str = "dra-e2e-h";
const NODE_VETH: &str = "dra-e2e-n";
/// The node's address (host side of the veth pair) and its peer inside the
/// namespace: a /30 of the harness's own, on this machine only.
const NODE_IP: &str = "10.213.77.1";
const PEER_IP: &str = "10.213.77.2";
/// The pod network: a bridge on this machine with pods' addresses from
/// this /24 (CNI bridge + host-local), the host's address on the bridge
/// being the gateway. Pods reach the API server there
/// ([`crate::cluster::ApiserverOptions::serve_pods`]; the serving
/// certificate names it).
pub use crate::pki::POD_GATEWAY_IP;
const POD_SUBNET: &str = "10.213.78.0/24";
const POD_BRIDGE: &str = "dra-e2e-br0";
const SYSCTLS: [&str; 3] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
];

/// Why a real-node test cannot run here, if it cannot.
pub fn missing_piece() -> Option<String> {
    let Some(bins) = binaries() else {
        return Some("no kube-apiserver/etcd (set KUBEBUILDER_ASSETS)".into());
    };
    for binary in ["kubelet", "dra-test-driver"] {
        if beside_apiserver(&bins, binary).is_none() {
            return Some(format!(
                "no {binary} beside kube-apiserver (build it from the same tree; see docs/testing.md)"
            ));
        }
    }
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "busybox",
        "ip",
        "iptables-save",
    ] {
        if which(tool).is_none() {
            return Some(format!(
                "no {tool} on PATH (Debian: containerd, runc, busybox-static, iproute2, iptables)"
            ));
        }
    }
    if !is_root() {
        return Some("a real node needs root (cgroups, mounts, network namespaces)".into());
    }
    None
}

/// Whether this process runs as root (effective uid 0).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            Some(uids.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// One real node at a time in this process.
fn node_lock() -> Arc<Mutex<()>> {
    static LOCK: std::sync::OnceLock<Arc<Mutex<()>>> = std::sync::OnceLock::new();
    LOCK.get_or_init(|| Arc::new(Mutex::new(()))).clone()
}

/// Host state the kubelet changes, recorded before it starts.
struct HostState {
    /// Network namespaces that existed before the node started.
    namespaces: Vec<String>,
    sysctls: Vec<(String, String)>,
    /// `(restore command, saved tables)` for iptables and ip6tables.
    tables: Vec<(&'static str, Vec<u8>)>,
}

impl HostState {
    fn record() -> Self {
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|k| {
                let v = std::fs::read_to_string(format!("/proc/sys/{k}")).ok()?;
                Some((k.to_string(), v.trim().to_string()))
            })
            .collect();
        let tables = [
            ("iptables-save", "iptables-restore"),
            ("ip6tables-save", "ip6tables-restore"),
        ]
        .into_iter()
        .filter_map(|(save, restore)| {
            let out = Command::new(which(save)?).output().ok()?;
            out.status.success().then_some((restore, out.stdout))
        })
        .collect();
        Self {
            namespaces: network_namespaces(),
            sysctls,
            tables,
        }
    }

    fn restore(&self) {
        for (k, v) in &self.sysctls {
            let _ = std::fs::write(format!("/proc/sys/{k}"), v);
        }
        // Each table in a dump replaces the table as it is now: the
        // kubelet's chains and jumps go, whatever was there before stays.
        for (restore, saved) in &self.tables {
            use std::io::Write;
            let Some(restore) = which(restore) else {
                continue;
            };
            if let Ok(mut child) = Command::new(restore)
                .stdin(std::process::Stdio::piped())
                .spawn()
            {
                if let Some(stdin) = child.stdin.as_mut() {
                    let _ = stdin.write_all(saved);
                }
                drop(child.stdin.take());
                let _ = child.wait();
            }
        }
    }
}

/// A running real node. Dropping it stops everything and restores the
/// host.
pub struct RealNode {
    pub name: String,
    pub dir: PathBuf,
    pub kubelet: Option<Proc>,
    pub driver: Option<Proc>,
    containerd: Option<Proc>,
    kubelet_root: PathBuf,
    containerd_sock: PathBuf,
    driver_args: Vec<String>,
    driver_bin: PathBuf,
    host: HostState,
    _turn: OwnedMutexGuard<()>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Brings a node named `name` up against `cluster`: containerd with
    /// the local images, the kubelet registered and Ready, the driver's
    /// ResourceSlice published, and [`DEVICE_CLASS`] created.
    pub async fn start(cluster: &Cluster, name: &str) -> anyhow::Result<Self> {
        Self::start_with_devices(cluster, name, DEVICES).await
    }

    /// [`RealNode::start`] with `devices` devices published by the driver.
    pub async fn start_with_devices(
        cluster: &Cluster,
        name: &str,
        devices: u32,
    ) -> anyhow::Result<Self> {
        let turn = node_lock().lock_owned().await;
        let bins = binaries().context("no kube-apiserver")?;
        let kubelet_bin = beside_apiserver(&bins, "kubelet").context("no kubelet")?;
        let driver_bin = beside_apiserver(&bins, "dra-test-driver").context("no driver")?;
        let dir = cluster.dir.join(format!("node-{name}"));
        let kubelet_root = dir.join("kubelet");
        for d in [&dir, &kubelet_root, &dir.join("cdi")] {
            std::fs::create_dir_all(d)?;
        }
        // Remains of a node a killed test run left behind.
        teardown_network();
        // From here on, dropping `node` (also on an error below) stops
        // whatever was started and restores the host.
        let mut node = Self {
            name: name.to_string(),
            containerd_sock: dir.join("containerd.sock"),
            dir,
            kubelet: None,
            driver: None,
            containerd: None,
            kubelet_root,
            driver_args: Vec::new(),
            driver_bin,
            host: HostState::record(),
            _turn: turn,
        };
        let started = Instant::now();
        setup_network()?;
        let containerd = node
            .containerd
            .insert(start_containerd(&node.dir, &node.containerd_sock)?);
        wait_socket(&node.containerd_sock, containerd, Duration::from_secs(20)).await?;
        import_images(&node.dir, &node.containerd_sock)?;

        let kubelet = node.kubelet.insert(start_kubelet(
            cluster,
            &kubelet_bin,
            &node.dir,
            &node.kubelet_root,
            &node.containerd_sock,
            name,
        )?);
        let client = cluster.admin_client().await?;
        wait_node_ready(&client, name, kubelet).await?;

        // The driver puts its socket in <datadir>/<driver name>/ and creates
        // only <datadir>.
        let datadir = node.kubelet_root.join("plugins");
        std::fs::create_dir_all(datadir.join(DRIVER))?;
        node.driver_args = vec![
            format!(
                "--kubeconfig={}",
                cluster.dir.join("admin.kubeconfig").display()
            ),
            // Its prepare and unprepare calls are logged from level 4 on.
            "--v=5".into(),
            "kubelet-plugin".into(),
            format!("--node-name={name}"),
            format!("--num-devices={devices}"),
            format!(
                "--plugin-registration-path={}",
                node.kubelet_root.join("plugins_registry").display()
            ),
            format!("--datadir={}", datadir.display()),
            format!("--cdi-dir={}", node.dir.join("cdi").display()),
        ];
        node.start_driver()?;
        crate::nodes::create_device_class_for_driver(&client, DEVICE_CLASS, DRIVER).await?;
        wait_slice(&client, name, node.driver.as_ref().context("driver")?).await?;
        eprintln!(
            "e2e: real node {name} up in {:.1}s (kubelet, containerd, {DRIVER} with {devices} devices; dir {})",
            started.elapsed().as_secs_f64(),
            node.dir.display()
        );
        Ok(node)
    }

    /// Stops the DRA driver (the admin guide's drain step done too early).
    pub fn stop_driver(&mut self) {
        if let Some(driver) = self.driver.take() {
            driver.kill();
        }
    }

    /// Starts the DRA driver again.
    pub fn start_driver(&mut self) -> anyhow::Result<()> {
        if self.driver.is_none() {
            self.driver = Some(Proc::spawn(
                "dra-test-driver",
                &self.driver_bin,
                &self.driver_args,
                &self.dir.join("driver.log"),
            )?);
        }
        Ok(())
    }

    /// Lines of the driver's log that contain `needle`.
    pub fn driver_log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("driver.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Some(p) = self.driver.take() {
            p.kill();
        }
        if let Some(p) = self.kubelet.take() {
            p.kill();
        }
        // Containers first (the shims outlive containerd), then containerd.
        kill_matching(&self.containerd_sock.display().to_string());
        if let Some(p) = self.containerd.take() {
            p.kill();
        }
        kill_matching(&self.containerd_sock.display().to_string());
        unmount_below(&self.dir);
        remove_pod_cgroups();
        remove_pod_namespaces(&self.host.namespaces);
        teardown_network();
        self.host.restore();
        let _ = &self.kubelet_root;
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(which("ip").context("no ip")?)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn setup_network() -> anyhow::Result<()> {
    ip(&["netns", "add", NETNS])?;
    ip(&[
        "link", "add", HOST_VETH, "type", "veth", "peer", "name", NODE_VETH,
    ])?;
    ip(&["link", "set", NODE_VETH, "netns", NETNS])?;
    ip(&["addr", "add", &format!("{NODE_IP}/30"), "dev", HOST_VETH])?;
    ip(&["link", "set", HOST_VETH, "up"])?;
    ip(&[
        "-n",
        NETNS,
        "addr",
        "add",
        &format!("{PEER_IP}/30"),
        "dev",
        NODE_VETH,
    ])?;
    ip(&["-n", NETNS, "link", "set", NODE_VETH, "up"])?;
    ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
    Ok(())
}

fn teardown_network() {
    let _ = ip(&["link", "del", HOST_VETH]);
    let _ = ip(&["netns", "del", NETNS]);
    let _ = ip(&["link", "del", POD_BRIDGE]);
}

/// The network namespaces of this node's pods (`cni-…`, made by
/// containerd) that outlived it.
fn remove_pod_namespaces(before: &[String]) {
    for ns in network_namespaces() {
        if ns.starts_with("cni-") && !before.contains(&ns) {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

fn network_namespaces() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn start_containerd(dir: &Path, sock: &Path) -> anyhow::Result<Proc> {
    let config = dir.join("containerd.toml");
    let cni_conf = dir.join("cni-conf");
    std::fs::create_dir_all(&cni_conf)?;
    // A bridge on this machine: pods reach each other and the host (the
    // gateway), nothing else (no masquerading, no route out).
    std::fs::write(
        cni_conf.join("10-dra-e2e.conflist"),
        serde_json::to_string(&json!({
            "cniVersion": "1.0.0", "name": "dra-e2e",
            "plugins": [
                {"type": "bridge", "bridge": POD_BRIDGE, "isGateway": true, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": dir.join("cni-ipam").display().to_string(),
                          "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY_IP}]]}},
                {"type": "loopback"}
            ]
        }))?,
    )?;
    let toml = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
"#,
        root = dir.join("containerd-root").display(),
        state = dir.join("containerd-state").display(),
        sock = sock.display(),
        cdi = dir.join("cdi").display(),
        cni = cni_conf.display(),
    );
    std::fs::write(&config, toml)?;
    let containerd = which("containerd").context("no containerd")?;
    Proc::spawn(
        "containerd",
        &containerd,
        &["--config".into(), config.display().to_string()],
        &dir.join("containerd.log"),
    )
}

async fn wait_socket(sock: &Path, proc: &Proc, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !sock.exists() {
        if let Some(status) = proc.exited() {
            bail!("{} exited ({status}):\n{}", proc.name, proc.log_tail(20));
        }
        ensure!(
            Instant::now() < deadline,
            "{} has no socket after {within:?}",
            proc.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Builds the busybox and pause images as `docker save` archives and
/// imports them into containerd's `k8s.io` namespace.
fn import_images(dir: &Path, sock: &Path) -> anyhow::Result<()> {
    let busybox = which("busybox").context("no busybox")?;
    let rootfs = dir.join("image-rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    std::fs::create_dir_all(rootfs.join("tmp"))?;
    std::fs::copy(&busybox, rootfs.join("bin/busybox"))?;
    for applet in ["sh", "sleep", "cat", "ls", "echo", "true", "env"] {
        let link = rootfs.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link)?;
        }
    }
    let sleeper = json!(["/bin/busybox", "sleep", "2147483647"]);
    let images = [
        (BUSYBOX_IMAGE, json!(["/bin/sh"]), json!([])),
        (PAUSE_IMAGE, sleeper.clone(), json!([])),
        // Under the name headroom placeholders and other manifests use by
        // default, so they run here without a registry.
        (UPSTREAM_PAUSE_IMAGE, sleeper, json!([])),
    ];
    for (i, (name, entrypoint, cmd)) in images.iter().enumerate() {
        let archive = crate::image::write_docker_archive(
            &dir.join(format!("image-{i}")),
            &rootfs,
            name,
            &crate::image::ImageConfig {
                entrypoint: entrypoint.clone(),
                cmd: cmd.clone(),
                user: None,
            },
        )?;
        let out = Command::new(which("ctr").context("no ctr")?)
            .args([
                "--address",
                &sock.display().to_string(),
                "-n",
                "k8s.io",
                "images",
                "import",
            ])
            .arg(&archive)
            .output()?;
        ensure!(
            out.status.success(),
            "ctr images import {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Imports one more image archive (e.g. the controller's own image).
pub fn import_archive(node: &RealNode, archive: &Path) -> anyhow::Result<()> {
    let out = Command::new(which("ctr").context("no ctr")?)
        .args([
            "--address",
            &node.containerd_sock.display().to_string(),
            "-n",
            "k8s.io",
            "images",
            "import",
        ])
        .arg(archive)
        .output()?;
    ensure!(
        out.status.success(),
        "ctr images import {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn start_kubelet(
    cluster: &Cluster,
    kubelet: &Path,
    dir: &Path,
    root: &Path,
    sock: &Path,
    name: &str,
) -> anyhow::Result<Proc> {
    let port = crate::cluster::free_port();
    let healthz = crate::cluster::free_port();
    let config = dir.join("kubelet-config.yaml");
    let cfg = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", sock.display()),
        "authentication": {"anonymous": {"enabled": false}, "webhook": {"enabled": false},
                           "x509": {}},
        "authorization": {"mode": "AlwaysAllow"},
        // Only what the tests' pods need; the machine's disk and memory
        // are not this node's concern.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        "registerNode": true,
        "maxPods": 110,
        "resolvConf": "",
        "protectKernelDefaults": false,
        "localStorageCapacityIsolation": false,
    });
    std::fs::write(&config, serde_yaml::to_string(&cfg)?)?;
    let args: Vec<String> = vec![
        format!("--config={}", config.display()),
        format!(
            "--kubeconfig={}",
            cluster.dir.join("admin.kubeconfig").display()
        ),
        format!("--root-dir={}", root.display()),
        format!("--cert-dir={}", dir.join("kubelet-pki").display()),
        format!("--hostname-override={name}"),
        format!("--node-ip={NODE_IP}"),
        "--v=2".into(),
    ];
    Proc::spawn("kubelet", kubelet, &args, &dir.join("kubelet.log"))
}

async fn wait_node_ready(client: &kube::Client, name: &str, kubelet: &Proc) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = kubelet.exited() {
            bail!("kubelet exited ({status}):\n{}", kubelet.log_tail(30));
        }
        if let Ok(Some(node)) = nodes.get_opt(name).await {
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                // The kubelet registers its node with the not-ready taint;
                // kube-controller-manager's node-lifecycle controller lifts
                // it once the node is Ready. None runs here: the harness
                // plays that part.
                let lifted = json!({"spec": {"taints": null}});
                nodes
                    .patch(
                        name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&lifted),
                    )
                    .await?;
                return Ok(());
            }
        }
        ensure!(
            Instant::now() < deadline,
            "node {name} not Ready after 60s; kubelet log:\n{}",
            kubelet.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_slice(client: &kube::Client, node: &str, driver: &Proc) -> anyhow::Result<()> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = driver.exited() {
            bail!(
                "dra-test-driver exited ({status}):\n{}",
                driver.log_tail(30)
            );
        }
        let list = slices.list(&Default::default()).await?;
        let found = list
            .items
            .iter()
            .any(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node));
        if found {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no ResourceSlice of {DRIVER} for {node} after 60s; driver log:\n{}",
            driver.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGKILLs every process whose command line contains `needle` (the
/// containerd shims of this node carry its socket path).
fn kill_matching(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
        }
    }
}

/// Unmounts everything mounted below `dir` (pod volumes, container root
/// filesystems), deepest first.
fn unmount_below(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", p]).output();
    }
}

/// Removes the `kubepods` cgroups the kubelet made, in every hierarchy.
fn remove_pod_cgroups() {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let kubepods = h.path().join("kubepods");
        if kubepods.is_dir() {
            remove_cgroup_tree(&kubepods);
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for c in children.flatten() {
            if c.path().is_dir() {
                remove_cgroup_tree(&c.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
