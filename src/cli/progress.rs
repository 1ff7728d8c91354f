//! The progress line of a running recursive query: `iteration N, R rows,
//! T s` (R: the rows its iterations produced so far) on
//! stderr while it runs, when stderr is a terminal (nothing otherwise),
//! cleared when the statement ends.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::exec::iterations::{Iteration, IterationProgress};
use datafusion::prelude::SessionConfig;

/// How often the line is redrawn.
const EVERY: Duration = Duration::from_millis(200);

/// The statement running now: when it started, when the line was last
/// drawn (`None`: not yet).
struct Running {
    start: Instant,
    drawn: Option<Instant>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// `config` with the progress line installed, if stderr is a terminal.
pub(crate) fn install(config: SessionConfig) -> SessionConfig {
    if !std::io::stderr().is_terminal() {
        return config;
    }
    config.with_extension(Arc::new(IterationProgress(Arc::new(draw))))
}

/// A statement starts.
pub(crate) fn start() {
    *RUNNING.lock().expect("progress lock") = Some(Running {
        start: Instant::now(),
        drawn: None,
    });
}

/// The statement ended: its line (if drawn) is cleared.
pub(crate) fn finish() {
    if let Some(Running { drawn: Some(_), .. }) = RUNNING.lock().expect("progress lock").take() {
        let mut err = std::io::stderr();
        let _ = write!(err, "\r\x1b[K");
        let _ = err.flush();
    }
}

/// An iteration of a recursive query starts.
fn draw(iteration: Iteration) {
    let mut running = RUNNING.lock().expect("progress lock");
    let Some(r) = running.as_mut() else {
        return;
    };
    let now = Instant::now();
    let due = match r.drawn {
        Some(last) => now - last >= EVERY,
        None => now - r.start >= EVERY,
    };
    if due {
        r.drawn = Some(now);
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r\x1b[Krecursive query: iteration {}, {} rows, {:.1} s",
            iteration.number,
            iteration.rows,
            (now - r.start).as_secs_f64()
        );
        let _ = err.flush();
    }
}
