//! Helpers shared by the integration tests: running the `dfgrad` binary,
//! and comparing numbers ([`numbers`]).

pub mod numbers;

use std::process::{Command, Output};

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
