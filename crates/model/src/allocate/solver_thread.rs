//! Where solving runs: never on an async worker, on a thread with a stack
//! deep enough for tenant CEL, and no more of them at once than the process
//! has CPUs.
//!
//! Solving a claim (and compiling or evaluating its CEL) is CPU work of up
//! to [`super::MAX_SEARCH_TIME`]. Run on an async worker it would stop
//! everything else of the process meanwhile: lease renewals, HTTP/2 pings,
//! `/healthz`, the claim controller. With one CPU (the chart's limit) the
//! runtime has one worker, so one claim would be enough.

use std::cell::Cell;
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard};

/// The stack of a solver thread. Parsing and evaluating a CEL selector
/// recurse once per nesting level, with frames of up to 130 KiB in a debug
/// build (16 parentheses overflow a tokio worker's 2 MiB); a tenant may
/// nest [`super::selector::MAX_NESTING`] levels. The size is reserved
/// address space: only the pages touched become memory.
pub const SOLVER_STACK_BYTES: usize = 64 << 20;

thread_local! {
    /// Set on solver threads: work started from one runs where it is, so a
    /// plan of several claims takes one thread and one slot, not one each
    /// (and cannot wait on a slot it holds itself).
    static ON_SOLVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Solver threads allowed at once: one per CPU the process may use, so a
/// burst of hostile claims takes CPU time from the async workers at most in
/// proportion, never all of it.
fn concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A counting semaphore for blocking threads (tokio's is for tasks; the
/// wait for a slot happens off the async workers, like the solve itself).
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn new(n: usize) -> Self {
        Self {
            free: Mutex::new(n.max(1)),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        // The count stays right whatever panicked while it was held.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Slot<'_> {
        let mut free = self.lock();
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

/// A slot held; given back when dropped (also on a panic).
struct Slot<'a>(&'a Slots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.lock() += 1;
        self.0.freed.notify_one();
    }
}

static SLOTS: LazyLock<Slots> = LazyLock::new(|| Slots::new(concurrency()));

/// Runs `work` on a solver thread: a scoped thread with
/// [`SOLVER_STACK_BYTES`] of stack, once one of the process's solver slots
/// is free. Anything that compiles or evaluates tenant CEL goes through
/// here. From a solver thread, `work` runs at once where it is. A panic in
/// `work` ends the process (see `app::exit_on_panic`).
///
/// From an async task on a multi-threaded runtime, the worker hands its
/// other tasks to a new worker first (`block_in_place`), so the wait for a
/// slot and the solve hold no async worker.
pub fn on_solver_stack<T: Send>(work: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    if ON_SOLVER_THREAD.get() {
        return Ok(work());
    }
    let solve = || {
        let _slot = SLOTS.take();
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("solver".into())
                .stack_size(SOLVER_STACK_BYTES)
                .spawn_scoped(scope, || {
                    ON_SOLVER_THREAD.set(true);
                    work()
                })
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
        })
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(solve),
        // No runtime (a tool's thread) or a single-threaded one (tests):
        // nothing else could run meanwhile anyway.
        _ => solve(),
    }
}

/// Whether the calling thread is a solver thread.
pub(super) fn on_solver_thread() -> bool {
    ON_SOLVER_THREAD.get()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn work_started_on_a_solver_thread_stays_there() {
        let outer = on_solver_stack(|| {
            let name = std::thread::current().name().map(str::to_owned);
            let inner = on_solver_stack(|| std::thread::current().name().map(str::to_owned));
            (name, inner.unwrap())
        })
        .unwrap();
        assert_eq!(outer.0.as_deref(), Some("solver"));
        assert_eq!(outer.0, outer.1, "the nested work ran on the same thread");
        assert!(!on_solver_thread(), "the caller is not a solver thread");
    }

    #[test]
    fn no_more_solves_at_once_than_slots() {
        let slots = Arc::new(Slots::new(2));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let (slots, running, most) = (slots.clone(), running.clone(), most.clone());
                std::thread::spawn(move || {
                    let _slot = slots.take();
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    // Hold the slot until both slots were seen taken at
                    // once (or a bound passes), so the count is tested,
                    // not the machine's timing.
                    let bound = std::time::Instant::now() + Duration::from_secs(5);
                    while most.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < bound {
                        std::thread::yield_now();
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "two slots, six solvers");
        assert_eq!(*slots.lock(), 2, "every slot given back");
    }

    #[test]
    fn a_panicking_solve_gives_its_slot_back() {
        let slots = Slots::new(1);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _slot = slots.take();
            panic!("solver failed");
        }));
        assert_eq!(*slots.lock(), 1);
    }
}
