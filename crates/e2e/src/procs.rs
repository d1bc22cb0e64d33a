//! Child processes (etcd, kube-apiserver, the controller) that never outlive
//! the test binary.
//!
//! Every child is started with `PR_SET_PDEATHSIG = SIGKILL`. The kernel sends
//! that signal when the *thread* that forked the child exits, not the
//! process, and libtest ends a test's thread as soon as the test returns. So
//! all children are forked by one spawner thread that lives as long as the
//! test binary: a server shared by many tests survives the test that started
//! it, and dies with the binary however the binary ends (even SIGKILL).

// Signals and PR_SET_PDEATHSIG go through libc: the only unsafe code of the
// project, in its test harness; the controller itself has none.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                for SpawnRequest { mut cmd, reply } in rx {
                    let parent = std::process::id();
                    // SAFETY: only async-signal-safe calls (prctl, getppid,
                    // _exit) run between fork and exec.
                    unsafe {
                        cmd.pre_exec(move || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            // The parent may have died before prctl took effect.
                            if libc::getppid() as u32 != parent {
                                libc::_exit(1);
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the e2e spawner thread");
        Mutex::new(tx)
    })
}

/// A running child process whose stdout and stderr go to `log`.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Mutex<Child>,
    pid: u32,
    /// How it was started, so [`Proc::spawn_again`] can start it the same way.
    command: Launch,
}

/// The command line and environment a [`Proc`] was started with.
#[derive(Debug, Clone)]
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Proc {
    /// Starts `program args…` with its output appended to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> anyhow::Result<Self> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(SpawnRequest { cmd, reply: tx })
            .map_err(|_| anyhow::anyhow!("spawner thread is gone"))?;
        let child = rx
            .recv()
            .context("spawner thread dropped the request")?
            .with_context(|| format!("spawn {name} ({})", program.display()))?;
        let pid = child.id();
        Ok(Self {
            name: name.to_string(),
            log: log.to_path_buf(),
            child: Mutex::new(child),
            pid,
            command: Launch {
                program: program.to_path_buf(),
                args: args.to_vec(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        })
    }

    /// Starts the same command again (same flags, so the same ports and data
    /// directory), appending to the same log. The caller stops this one
    /// first; a restart is "kill, maybe wait, `spawn_again`".
    pub fn spawn_again(&self) -> anyhow::Result<Self> {
        use std::io::Write;
        if let Ok(mut f) = File::options().append(true).open(&self.log) {
            let _ = writeln!(f, "==== e2e: {} started again ====", self.name);
        }
        let env: Vec<(&str, &str)> = self
            .command
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Self::spawn_with_env(
            &self.name,
            &self.command.program,
            &self.command.args,
            &env,
            &self.log,
        )
    }

    /// The value of the `--flag=value` the process was started with.
    pub fn flag(&self, flag: &str) -> Option<&str> {
        let prefix = format!("{flag}=");
        self.command
            .args
            .iter()
            .find_map(|a| a.strip_prefix(prefix.as_str()))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.try_wait().ok().flatten()
    }

    /// SIGKILL and reap: the crash case.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: a clean shutdown request. Returns at once; see [`Proc::wait_exit`].
    pub fn terminate(&self) {
        if self.exited().is_none() {
            // SAFETY: plain kill(2) on a child we have not reaped yet, so the
            // pid cannot have been reused.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file (reads at most the last 256 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("<no log at {}>", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(256 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Lines of a log that contain `needle`, the last `max` of them.
pub fn grep(path: &Path, needle: &str, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let hits: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    hits[hits.len().saturating_sub(max)..].join("\n")
}

/// Runs a short helper command to completion; its stderr becomes the error.
pub fn run(program: &str, args: &[&str], cwd: &Path) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Processes and directories of the shared server, cleaned up when the test
/// binary exits: statics are never dropped, so an `atexit` hook does it.
static AT_EXIT: Mutex<(Vec<u32>, Vec<PathBuf>)> = Mutex::new((Vec::new(), Vec::new()));

extern "C" fn cleanup_at_exit() {
    let (pids, dirs) = &*AT_EXIT.lock().unwrap_or_else(|e| e.into_inner());
    for pid in pids {
        // SAFETY: these children are never reaped before exit, so the pids
        // are still ours.
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(*pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Kills `pids` and removes `dirs` when the test binary exits.
pub fn cleanup_on_exit(pids: &[u32], dirs: &[PathBuf]) {
    static REGISTER: OnceLock<()> = OnceLock::new();
    REGISTER.get_or_init(|| {
        // SAFETY: registering a plain extern "C" function.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
    let mut state = AT_EXIT.lock().unwrap_or_else(|e| e.into_inner());
    state.0.extend_from_slice(pids);
    state.1.extend_from_slice(dirs);
}

/// Sends `signal` (e.g. `libc::SIGINT`) to a child the test started and
/// has not waited for yet (a `tokio::process::Child` before its `wait`).
pub fn signal_child(child: &tokio::process::Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: plain kill(2) on a child not reaped yet, so the pid cannot
        // have been reused.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}
