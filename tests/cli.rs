//! End-to-end tests of the `dfgrad` command-line tool.

mod common;

use std::path::Path;

use common::{dfgrad, dfgrad_ok};

/// Runs `dfgrad` with `args`, asserts failure and returns its (stdout, stderr).
fn dfgrad_err(args: &[&str]) -> (String, String) {
    let output = dfgrad(args);
    assert!(
        !output.status.success(),
        "dfgrad {args:?} unexpectedly succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp path is not UTF-8")
}

#[test]
fn command_grad_as_csv() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-c",
        "SELECT grad(x*x, x) AS d FROM (VALUES (3.0)) t(x)",
    ]);
    assert_eq!(out, "d\n6.0\n");
}

#[test]
fn command_grad_as_table() {
    let out = dfgrad_ok(&[
        "-q",
        "-c",
        "SELECT grad(x*x, x) AS d FROM (VALUES (3.0)) t(x)",
    ]);
    assert!(out.contains("| d   |"), "{out}");
    assert!(out.contains("| 6.0 |"), "{out}");
}

#[test]
fn commands_run_in_order() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-c",
        "CREATE TABLE t AS SELECT * FROM (VALUES (1.0), (2.0)) v(x)",
        "-c",
        "SELECT x, grad(x*x*x, x) AS d FROM t ORDER BY x",
    ]);
    // CREATE TABLE prints nothing in csv mode.
    assert_eq!(out, "x,d\n1.0,3.0\n2.0,12.0\n");

    // The other way round, the table does not exist yet.
    let (_, err) = dfgrad_err(&[
        "-c",
        "SELECT * FROM t",
        "-c",
        "CREATE TABLE t AS SELECT 1.0 AS x",
    ]);
    assert!(err.contains("Error"), "{err}");
}

#[test]
fn file_with_two_statements() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("script.sql");
    std::fs::write(
        &file,
        "-- a table; with a comment\n\
         CREATE TABLE t AS SELECT * FROM (VALUES (2.0, 'a;b')) v(x, s);\n\
         \n\
         SELECT s, grad(x*x, x) AS d FROM t; -- trailing comment;\n",
    )
    .unwrap();
    let out = dfgrad_ok(&["--format", "csv", "-f", path_str(&file)]);
    assert_eq!(out, "s,d\na;b,4.0\n");
}

#[test]
fn table_from_csv_file() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("points.csv");
    std::fs::write(&csv, "x,y\n1.0,2.0\n3.0,4.0\n").unwrap();
    let table = format!("points={}", path_str(&csv));
    let sql = "SELECT x, grad(x*y, x) AS dx FROM points ORDER BY x";

    let out = dfgrad_ok(&["--table", &table, "--format", "csv", "-c", sql]);
    assert_eq!(out, "x,dx\n1.0,2.0\n3.0,4.0\n");

    let out = dfgrad_ok(&["--table", &table, "--format", "json", "-c", sql]);
    assert_eq!(out.trim_end(), r#"[{"x":1.0,"dx":2.0},{"x":3.0,"dx":4.0}]"#);

    let out = dfgrad_ok(&["--table", &table, "--format", "ndjson", "-c", sql]);
    assert_eq!(out, "{\"x\":1.0,\"dx\":2.0}\n{\"x\":3.0,\"dx\":4.0}\n");
}

#[test]
fn table_from_a_directory_of_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("part-0.csv"), "x,y\n1.0,2.0\n").unwrap();
    std::fs::write(dir.path().join("part-1.csv"), "x,y\n3.0,4.0\n").unwrap();
    let table = format!("points={}", path_str(dir.path()));
    let sql = "SELECT x, grad(x*y, x) AS dx FROM points ORDER BY x";
    let out = dfgrad_ok(&["--table", &table, "--format", "csv", "-c", sql]);
    assert_eq!(out, "x,dx\n1.0,2.0\n3.0,4.0\n");

    // a directory without a file of a known format is refused
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("notes.txt"), "x\n").unwrap();
    let table = format!("points={}", path_str(empty.path()));
    let (_, err) = dfgrad_err(&["--table", &table, "-c", "SELECT 1"]);
    assert!(err.contains("unsupported file extension ''"), "{err}");
}

#[test]
fn ballista_errors_are_clear() {
    let (_, err) = dfgrad_err(&["--ballista", "df://127.0.0.1:1", "-c", "SELECT 1"]);
    assert!(err.starts_with("Error: "), "{err}");
    if cfg!(feature = "ballista") {
        // nothing listens on port 1
        assert!(err.contains("127.0.0.1:1"), "{err}");
    } else {
        assert!(
            err.contains("--ballista needs dfgrad built with the `ballista` cargo feature"),
            "{err}"
        );
    }
}

#[test]
fn table_with_unknown_extension_fails() {
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("points.txt");
    std::fs::write(&txt, "x\n1\n").unwrap();
    let table = format!("points={}", path_str(&txt));
    let (_, err) = dfgrad_err(&["--table", &table, "-c", "SELECT 1"]);
    assert!(err.starts_with("Error: "), "{err}");
    assert!(err.contains("extension"), "{err}");
}

#[test]
fn invalid_sql_fails_and_stops() {
    let (out, err) = dfgrad_err(&[
        "--format",
        "csv",
        "-c",
        "SELECT 1 AS first",
        "-c",
        "SELEC 1",
        "-c",
        "SELECT 2 AS after",
    ]);
    assert!(err.contains("Error"), "{err}");
    assert!(out.contains("first"), "{out}");
    assert!(
        !out.contains("after"),
        "statements after the error ran: {out}"
    );
}

#[test]
fn invalid_wrt_fails() {
    let (_, err) = dfgrad_err(&["-c", "SELECT grad(x, 'a') FROM (VALUES (1.0)) t(x)"]);
    assert!(err.contains("Error"), "{err}");
    assert!(err.contains("invalid_wrt"), "{err}");
}

/// The README's main job: the training loop reaches the least-squares fit of
/// the data it generates (solved here in closed form).
#[test]
fn main_job_reaches_least_squares() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/linear_regression.sql"
    );
    let out = dfgrad_ok(&["--format", "csv", "-q", "-f", file]);
    let last = out.lines().last().expect("rows");
    let cols: Vec<f64> = last.split(',').map(|v| v.parse().unwrap()).collect();
    assert_eq!(cols[0], 200.0, "{out}");

    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    let n = 10_000.0;
    for i in 1..=10_000i64 {
        let x = (i % 200) as f64 / 100.0 - 1.0;
        let y = 3.0 * x - 2.0 + 0.1 * (i as f64 * 12.9898).sin();
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let w = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let b = (sy - w * sx) / n;
    assert!((cols[1] - w).abs() < 1e-9, "w = {} vs {w}", cols[1]);
    assert!((cols[2] - b).abs() < 1e-9, "b = {} vs {b}", cols[2]);
}

/// Logistic regression (examples/logistic_regression.sql) reaches the
/// optimum that Newton's method finds on the same data, computed here.
#[test]
fn logistic_regression_reaches_newton_optimum() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/logistic_regression.sql"
    );
    let out = dfgrad_ok(&["--format", "csv", "-q", "-f", file]);
    let last = out.lines().last().expect("rows");
    let cols: Vec<f64> = last.split(',').map(|v| v.parse().unwrap()).collect();
    assert_eq!(cols[0], 600.0, "{out}");

    let data: Vec<(f64, f64)> = (1..=2000i64)
        .map(|i| {
            let x = (i % 200) as f64 / 100.0 - 1.0;
            let label = if 2.0 * x - 0.5 + (i as f64 * 12.9898).sin() > 0.0 {
                1.0
            } else {
                0.0
            };
            (x, label)
        })
        .collect();
    let (mut w, mut b) = (0.0f64, 0.0f64);
    for _ in 0..50 {
        let (mut gw, mut gb, mut hww, mut hwb, mut hbb) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(x, t) in &data {
            let p = 1.0 / (1.0 + (-(w * x + b)).exp());
            gw += (p - t) * x;
            gb += p - t;
            let s = p * (1.0 - p);
            hww += s * x * x;
            hwb += s * x;
            hbb += s;
        }
        let det = hww * hbb - hwb * hwb;
        w -= (hbb * gw - hwb * gb) / det;
        b -= (hww * gb - hwb * gw) / det;
    }
    assert!((cols[1] - w).abs() < 1e-4, "w = {} vs Newton {w}", cols[1]);
    assert!((cols[2] - b).abs() < 1e-4, "b = {} vs Newton {b}", cols[2]);
}
