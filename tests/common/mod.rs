//! Helpers shared by the integration tests: running the `dfgrad` binary,
//! and comparing numbers ([`numbers`]).

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod numbers;

/// Runs `f` on a thread with a stack of `bytes`: DataFusion recurses over
/// expressions, so deep ones need a big stack (as `dfgrad` has).
pub fn on_big_stack(bytes: usize, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(bytes)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs `dfgrad` with `args`.
pub fn dfgrad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dfgrad"))
        .args(args)
        .output()
        .expect("failed to run dfgrad")
}

/// Runs `dfgrad` with `args`, asserts success and returns its stdout.
pub fn dfgrad_ok(args: &[&str]) -> String {
    let output = dfgrad(args);
    assert!(
        output.status.success(),
        "dfgrad {args:?} failed with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("stdout is not UTF-8")
}

/// What a run of `dfgrad` printed, and how it ended.
#[derive(Debug)]
pub struct Run {
    /// What the run was (its arguments), for messages.
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn of(what: String, output: Output) -> Self {
        Run {
            what,
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Asserts that the run succeeded; its stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert!(
            self.status.success(),
            "{} failed with {}: {}",
            self.what,
            self.status,
            self.stderr
        );
        &self.stdout
    }

    /// Asserts that the run failed with one `Error: ` line on stderr
    /// (without Rust's panic report); that line.
    #[track_caller]
    pub fn fails(&self) -> &str {
        assert!(
            !self.status.success(),
            "{} unexpectedly succeeded: {}",
            self.what,
            self.stdout
        );
        assert_one_error_line(&self.stderr);
        self.stderr.trim_end()
    }
}

/// Runs `dfgrad` with `args` and `input` piped into its stdin, in `dir` if
/// given. Without `RUST_BACKTRACE`, with which dfgrad also prints Rust's
/// panic report, and with `HOME` set to `dir` (or a directory without
/// `.dfgradrc`), so that no rc file of the user runs.
pub fn piped_in(dir: Option<&Path>, args: &[&str], input: &str) -> Run {
    let home = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_dfgrad"));
    command
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env("HOME", dir.unwrap_or(home.path()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().expect("failed to run dfgrad");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // dfgrad stops reading at a failing statement, which may close the pipe.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let output = child.wait_with_output().expect("failed to wait for dfgrad");
    Run::of(format!("dfgrad {args:?} < {input:?}"), output)
}

/// Runs `dfgrad` with `args` and `input` piped into its stdin.
pub fn piped(args: &[&str], input: &str) -> Run {
    piped_in(None, args, input)
}

/// Runs `dfgrad` with `args` (and nothing on stdin).
pub fn run(args: &[&str]) -> Run {
    piped(args, "")
}

/// Asserts that `stderr` is one `Error: ` line, without Rust's panic report.
#[track_caller]
pub fn assert_one_error_line(stderr: &str) {
    assert!(stderr.starts_with("Error: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked at"), "{stderr}");
}

/// `path` as text.
pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp path is not UTF-8")
}

/// Runs `dfgrad` with `args` in its interactive shell, on a terminal that
/// util-linux's `script` provides. Types each line of `steps` and waits
/// until the terminal shows its text (a line is typed only once the one
/// before has run: the line editor may drop input typed ahead), then `\q`.
/// Returns what the terminal showed.
pub fn interactive(args: &[&str], steps: &[(&str, &str)]) -> String {
    let home = tempfile::tempdir().expect("temp dir");
    let command = format!("'{}' {}", env!("CARGO_BIN_EXE_dfgrad"), args.join(" "));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env_remove("RUST_BACKTRACE")
        .env("HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("failed to run script (util-linux)");
    let shown = Arc::new(Mutex::new(String::new()));
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let reader = {
        let shown = Arc::clone(&shown);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]);
                shown.lock().unwrap().push_str(&text);
            }
        })
    };
    let mut stdin = child.stdin.take().expect("stdin is piped");
    for (line, expected) in steps {
        let before = shown.lock().unwrap().len();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !shown.lock().unwrap()[before..].contains(expected) {
            let now = shown.lock().unwrap().clone();
            assert!(child.try_wait().unwrap().is_none(), "dfgrad exited: {now}");
            assert!(
                Instant::now() < deadline,
                "no {expected:?} after {line:?}: {now}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stdin.write_all(b"\\q\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let shown = shown.lock().unwrap().clone();
    assert!(status.success(), "{shown}");
    shown
}
