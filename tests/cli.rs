//! End-to-end tests of the `dfgrad` command-line tool.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{dfgrad, dfgrad_ok};

/// Runs `dfgrad` with `args` and `input` piped into its stdin. Without
/// `RUST_BACKTRACE`, with which dfgrad also prints Rust's panic report.
fn dfgrad_piped(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dfgrad"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to run dfgrad");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // dfgrad stops reading at a failing statement, which may close the pipe.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    child.wait_with_output().expect("failed to wait for dfgrad")
}

/// The (stdout, stderr) of `output`.
fn streams(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `dfgrad` with `args` in its interactive shell, on a terminal that
/// util-linux's `script` provides. Types each line of `steps` and waits
/// until the terminal shows its text (a line is typed only once the one
/// before has run: the line editor may drop input typed ahead), then `\q`.
/// Returns what the terminal showed.
fn dfgrad_interactive(args: &[&str], steps: &[(&str, &str)]) -> String {
    let command = format!("'{}' {}", env!("CARGO_BIN_EXE_dfgrad"), args.join(" "));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env_remove("RUST_BACKTRACE")
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

/// Asserts that `stderr` is one `Error: ` line, without Rust's panic report.
fn assert_one_error_line(stderr: &str) {
    assert!(stderr.starts_with("Error: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked at"), "{stderr}");
}

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

    // files of other extensions are not data files, and subdirectories
    // other than partitions (KEY=VALUE) are not read: ignored
    std::fs::write(dir.path().join("_SUCCESS"), "").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x,y\n9.0,9.0\n").unwrap();
    std::fs::create_dir(dir.path().join("old")).unwrap();
    std::fs::write(dir.path().join("old/a.json"), "{\"x\": 9.0}\n").unwrap();
    let out = dfgrad_ok(&["--table", &table, "--format", "csv", "-c", sql]);
    assert_eq!(out, "x,dx\n1.0,2.0\n3.0,4.0\n");
}

/// Issue 21 (6, 13): a directory without data files, or with data files of
/// several extensions (of which a table would read only one), is refused
/// with a message naming what was found.
#[test]
fn directory_without_data_or_with_mixed_extensions_is_refused() {
    for other in [None, Some("notes.txt")] {
        let empty = tempfile::tempdir().unwrap();
        if let Some(name) = other {
            std::fs::write(empty.path().join(name), "x\n").unwrap();
        }
        let table = format!("points={}", path_str(empty.path()));
        let (_, err) = dfgrad_err(&["--table", &table, "-c", "SELECT 1"]);
        assert_one_error_line(&err);
        assert!(err.contains("cannot register table 'points'"), "{err}");
        assert!(err.contains("has no data files"), "{err}");
    }

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), "x\n1.0\n").unwrap();
    std::fs::write(dir.path().join("b.csv"), "x\n2.0\n").unwrap();
    std::fs::write(dir.path().join("c.json"), "{\"x\": 3.0}\n").unwrap();
    let table = format!("points={}", path_str(dir.path()));
    let (out, err) = dfgrad_err(&["--table", &table, "-c", "SELECT sum(x) FROM points"]);
    assert_eq!(out, "");
    assert_one_error_line(&err);
    assert!(err.contains("2 .csv, 1 .json"), "{err}");
    assert!(err.contains("directory of their own"), "{err}");

    // files in partition directories are read, so they count too
    let partitioned = tempfile::tempdir().unwrap();
    std::fs::write(partitioned.path().join("a.csv"), "x\n1.0\n").unwrap();
    let partition = partitioned.path().join("day=2/hour=3");
    std::fs::create_dir_all(&partition).unwrap();
    std::fs::write(partition.join("b.parquet"), "").unwrap();
    let table = format!("points={}", path_str(partitioned.path()));
    let (_, err) = dfgrad_err(&["--table", &table, "-c", "SELECT 1"]);
    assert!(err.contains("1 .csv, 1 .parquet"), "{err}");
    std::fs::remove_file(partitioned.path().join("a.csv")).unwrap();
    std::fs::remove_file(partition.join("b.parquet")).unwrap();
    std::fs::write(partition.join("b.csv"), "x\n5.0\n").unwrap();
    let out = dfgrad_ok(&[
        "--table",
        &table,
        "--format",
        "csv",
        "-c",
        "SELECT x FROM points",
    ]);
    assert_eq!(out, "x\n5.0\n");

    // .json and .ndjson are one format but two extensions: also refused
    let table = format!("points={}", path_str(dir.path()));
    std::fs::remove_file(dir.path().join("a.csv")).unwrap();
    std::fs::remove_file(dir.path().join("b.csv")).unwrap();
    std::fs::write(dir.path().join("d.ndjson"), "{\"x\": 4.0}\n").unwrap();
    let output = dfgrad_piped(&["--table", &table], "SELECT sum(x) FROM points");
    let (_, err) = streams(&output);
    assert!(!output.status.success(), "{err}");
    assert!(err.contains("1 .json, 1 .ndjson"), "{err}");
}

/// Issue 21 (7): NaN and infinities are not written as `null`, which reads
/// as SQL NULL, but as the strings the table and CSV formats print.
#[test]
fn json_writes_nan_and_infinities_as_strings() {
    let sql = "SELECT grad(sqrt(x), x) AS d, CAST('NaN' AS DOUBLE) AS n, \
               CAST('-inf' AS REAL) AS m, CAST(NULL AS DOUBLE) AS z, \
               make_array(x, CAST('inf' AS DOUBLE)) AS l FROM (VALUES (0.0)) t(x)";
    let row = r#"{"d":"inf","n":"NaN","m":"-inf","z":null,"l":[0.0,"inf"]}"#;
    let out = dfgrad_ok(&["--format", "json", "-c", sql]);
    assert_eq!(out, format!("[{row}]\n"));
    let output = dfgrad_piped(&["--format", "ndjson"], sql);
    let (out, err) = streams(&output);
    assert!(output.status.success(), "{err}");
    assert_eq!(out, format!("{row}\n"));
}

/// Issue 21 (8): a corrupt Parquet file makes the Parquet reader panic; that
/// is an error (one line, non-zero exit), not a crash with Rust's panic report.
#[test]
fn panic_in_a_reader_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("b.parquet");
    std::fs::write(&parquet, "PAR1garbagePAR1").unwrap();
    let table = format!("p={}", path_str(&parquet));
    let output = dfgrad_piped(&["--table", &table, "-c", "SELECT 1"], "");
    let (_, err) = streams(&output);
    assert!(!output.status.success(), "{err}");
    assert_one_error_line(&err);
    assert!(err.contains("cannot register table 'p'"), "{err}");
    assert!(err.contains("panic"), "{err}");

    // in a statement read from stdin: the statements before it ran
    let script = format!(
        "SELECT 1 AS before;\n\
         CREATE EXTERNAL TABLE p STORED AS PARQUET LOCATION '{}';\n\
         SELECT 2 AS after;\n",
        path_str(&parquet)
    );
    let output = dfgrad_piped(&["--format", "csv"], &script);
    let (out, err) = streams(&output);
    assert!(!output.status.success(), "{out}");
    assert_eq!(out, "before\n1\n");
    assert_one_error_line(&err);
    assert!(err.contains("panic"), "{err}");

    // the interactive shell reports it and takes the next statement
    let lines: Vec<&str> = script.lines().collect();
    let shown = dfgrad_interactive(
        &["--format", "csv"],
        &[
            (lines[0], "before\r\n1\r\n"),
            (lines[1], "Error: "),
            (lines[2], "after\r\n2\r\n"),
        ],
    );
    assert!(
        shown.contains("Error: Internal error: a panic at parquet-"),
        "{shown}"
    );
    assert!(!shown.contains("panicked at"), "{shown}");
}

/// Issue 21 (12): statements piped into stdin run like a `-f` file: the
/// last one needs no `;`, and a failing one stops the run with a non-zero
/// exit status.
#[test]
fn piped_statements_run_like_a_file() {
    let output = dfgrad_piped(
        &["--format", "csv"],
        "SELECT 'a;' AS first; -- a comment; with a semicolon\nSELECT\n  2 AS last",
    );
    let (out, err) = streams(&output);
    assert!(output.status.success(), "{err}");
    assert_eq!(out, "first\na;\nlast\n2\n");

    for script in [
        "SELECT 1 AS first;\nSELEC 2;\nSELECT 3 AS after;\n",
        "SELECT 1 AS first;\nSELECT * FROM missing",
    ] {
        let output = dfgrad_piped(&["--format", "csv"], script);
        let (out, err) = streams(&output);
        assert!(!output.status.success(), "{script}: {out}");
        assert_eq!(out, "first\n1\n", "{script}");
        assert_one_error_line(&err);
    }
}

/// Issue 21 (13): a refusal of datafusion-grad is printed as one line that
/// starts with its bracketed kind, not behind the analyzer's
/// `datafusion_grad` / `caused by` / `External error:` wrappers.
#[test]
fn grad_errors_are_one_line_starting_with_their_kind() {
    for (sql, start, names) in [
        (
            "SELECT grad(x, 'a') FROM (VALUES (1.0)) t(x)",
            "Error: [invalid_wrt] ",
            "argument 2",
        ),
        (
            "SELECT grad(random() * x, x) FROM (VALUES (1.0)) t(x)",
            "Error: [non_differentiable] ",
            "`random`",
        ),
    ] {
        let (_, err) = dfgrad_err(&["-c", sql]);
        let output = dfgrad_piped(&[], sql);
        let (_, piped) = streams(&output);
        assert!(!output.status.success(), "{piped}");
        for err in [err, piped] {
            assert_one_error_line(&err);
            assert!(err.starts_with(start), "{err}");
            assert!(err.contains(names), "{err}");
            assert!(!err.contains("caused by"), "{err}");
            assert!(!err.contains("External error"), "{err}");
        }
    }
}

/// Issue 21 (13): DataFusion's own errors that users of grad meet carry a
/// hint naming the fix: the parser's recursion limit names its setting (and
/// the setting works), a non-key variable of an aggregate says so.
#[test]
fn datafusion_errors_carry_a_hint() {
    let deep = format!(
        "SELECT grad({}x{}, x) AS d FROM (VALUES (0.5)) t(x)",
        "sin(".repeat(60),
        ")".repeat(60)
    );
    let (_, err) = dfgrad_err(&["-c", &deep]);
    assert_one_error_line(&err);
    assert!(err.contains("RecursionLimitExceeded"), "{err}");
    assert!(
        err.contains("SET datafusion.sql_parser.recursion_limit = 500"),
        "{err}"
    );
    let out = dfgrad_ok(&[
        "-q",
        "--format",
        "csv",
        "-c",
        "SET datafusion.sql_parser.recursion_limit = 500",
        "-c",
        &deep,
    ]);
    assert!(out.starts_with("d\n0.0635971145637"), "{out}");

    let (_, err) = dfgrad_err(&[
        "-c",
        "SELECT g, grad(sum(x * x), x) FROM (VALUES (1, 2.0)) t(g, x) GROUP BY g",
    ]);
    assert_one_error_line(&err);
    assert!(
        err.contains("hint: a column read outside an aggregate must be a GROUP BY key"),
        "{err}"
    );
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
