//! The tokio runtime queries run on, and waiting for them with the GIL
//! released and Ctrl-C honoured.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// How often a waiting call looks for a pending signal (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The process-wide multi-threaded runtime.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("datafusion-grad")
            .build()
            .expect("tokio runtime")
    })
}

/// Runs `future` to completion on [`runtime`] with the GIL released.
///
/// Every [`SIGNAL_POLL`] the waiting thread takes the GIL back to run
/// Python's signal handlers: a `KeyboardInterrupt` (or any exception a
/// handler raises) drops the future — which cancels the query — and is
/// raised to the caller. The ticks come from a thread of their own, not
/// from a tokio timer: a timer fires only when a worker thread of the
/// runtime drives the timer wheel, and while every worker is busy in a long
/// computation none does, so Ctrl-C would wait for the query to end.
pub fn wait<F, T>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = T> + Send,
    T: Send,
{
    py.allow_threads(|| {
        let (tick, mut ticks) = tokio::sync::mpsc::channel::<()>(1);
        // Ends at its first tick after the wait is over (the receiver gone).
        std::thread::Builder::new()
            .name("datafusion-grad-signals".to_string())
            .spawn(move || {
                while tick.blocking_send(()).is_ok() {
                    std::thread::sleep(SIGNAL_POLL);
                }
            })
            .expect("spawning the signal-poll thread");
        runtime().block_on(async {
            tokio::pin!(future);
            loop {
                tokio::select! {
                    out = &mut future => return Ok(out),
                    _ = ticks.recv() => {
                        Python::with_gil(|py| py.check_signals())?;
                    }
                }
            }
        })
    })
}

/// Runs `future` to completion on [`runtime`] from code that may itself be
/// running inside another library's tokio runtime (an FFI callback), where
/// `block_on` on the current thread would panic: the future runs on a
/// scoped thread of its own.
pub fn block_on_detached<F, T>(future: F) -> T
where
    F: Future<Output = T> + Send,
    T: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime().block_on(future))
            .join()
            .expect("datafusion-grad planning thread panicked")
    })
}
