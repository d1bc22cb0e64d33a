//! A controller replica with Deployment semantics: when its process exits
//! without the test having stopped it (a crash, or the deliberate exit on a
//! lost lease), it is started again, as the kubelet would. Each restart is
//! printed and counted, so tests can report it; only stops the test asks
//! for (SIGKILL, SIGTERM) are final.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::cluster::{Controller, ControllerSpec};
use crate::procs;

#[derive(Debug)]
pub struct Replica {
    spec: ControllerSpec,
    current: Mutex<Arc<Controller>>,
    stopped: AtomicBool,
    restarts: AtomicUsize,
}

impl Replica {
    /// Starts the first process (waiting for /healthz) and its supervisor.
    pub async fn start(spec: ControllerSpec) -> anyhow::Result<Arc<Self>> {
        let first = Controller::start(&spec).await?;
        let replica = Arc::new(Self {
            spec,
            current: Mutex::new(Arc::new(first)),
            stopped: AtomicBool::new(false),
            restarts: AtomicUsize::new(0),
        });
        let weak = Arc::downgrade(&replica);
        std::thread::Builder::new()
            .name(format!("e2e-supervise-{}", replica.spec.label))
            .spawn(move || supervise(weak))?;
        Ok(replica)
    }

    /// The process running now.
    pub fn current(&self) -> Arc<Controller> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// SIGKILL, for good: the supervisor does not restart it.
    pub fn kill(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.current().proc.kill();
    }

    /// SIGTERM, for good; see `Proc::wait_exit` on [`Replica::current`].
    pub fn terminate(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.current().proc.terminate();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// How often the supervisor had to restart the process.
    pub fn restarts(&self) -> usize {
        self.restarts.load(Ordering::SeqCst)
    }
}

fn supervise(replica: Weak<Replica>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Some(r) = replica.upgrade() else { return };
        if r.is_stopped() {
            return;
        }
        let current = r.current();
        let Some(status) = current.proc.exited() else {
            continue;
        };
        if r.is_stopped() {
            return;
        }
        let last = procs::tail(&current.proc.log, 1);
        eprintln!(
            "e2e: controller {} exited on its own ({status}), last log line: {last}; restarting it as a Deployment would",
            r.spec.label
        );
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(&current.proc.log)
            .and_then(|mut f| {
                use std::io::Write;
                writeln!(f, "==== e2e: process exited ({status}); restarted ====")
            });
        match rt.block_on(Controller::start(&r.spec)) {
            Ok(next) => {
                *r.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
                r.restarts.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                eprintln!("e2e: restarting controller {} failed: {e:#}", r.spec.label);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
