//! End-to-end tests of the `dfgrad` command-line tool.

use crate::common::{
    assert_one_error_line, dfgrad_ok, interactive, path_str, piped, piped_in, run,
};

/// Runs `dfgrad` with `args`, asserts failure and returns its (stdout, stderr).
fn dfgrad_err(args: &[&str]) -> (String, String) {
    let run = run(args);
    run.fails();
    (run.stdout, run.stderr)
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
    let run = piped(&["--table", &table], "SELECT sum(x) FROM points");
    let err = run.fails();
    assert!(err.contains("1 .json, 1 .ndjson"), "{err}");
}

/// Issue 45: a directory of Hive-style partitions (`k=1/`, `k=2/`) keeps
/// its partition columns, as `SELECT * FROM 'DIR/'` does; partitions of
/// different keys are refused; a URL table over a directory mixing data
/// files of several extensions is refused as `--table` refuses it.
#[test]
fn partition_directories_are_columns() {
    let dir = tempfile::tempdir().unwrap();
    for (k, x) in [(1, "1.0"), (2, "3.0")] {
        let partition = dir.path().join(format!("k={k}"));
        std::fs::create_dir_all(&partition).unwrap();
        std::fs::write(partition.join("part.csv"), format!("x\n{x}\n")).unwrap();
    }
    let table = format!("points={}", path_str(dir.path()));
    let sql = "SELECT k, x, grad(x * x, x) AS dx FROM points ORDER BY k";
    let out = dfgrad_ok(&["--table", &table, "--format", "csv", "-c", sql]);
    assert_eq!(out, "k,x,dx\n1,1.0,2.0\n2,3.0,6.0\n");
    let url = format!("SELECT k, x FROM '{}/' ORDER BY k", path_str(dir.path()));
    let out = dfgrad_ok(&["--format", "csv", "-c", &url]);
    assert_eq!(out, "k,x\n1,1.0\n2,3.0\n");

    let other = dir.path().join("j=3");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("part.csv"), "x\n5.0\n").unwrap();
    let err = run(&["--table", &table, "-c", "SELECT 1"])
        .fails()
        .to_string();
    assert!(
        err.contains("partition directories of different keys (j, k)"),
        "{err}"
    );

    let mixed = tempfile::tempdir().unwrap();
    std::fs::write(mixed.path().join("a.csv"), "x\n1.0\n").unwrap();
    std::fs::write(mixed.path().join("b.json"), "{\"x\": 2.0}\n").unwrap();
    let sql = format!("SELECT count(*) FROM '{}/'", path_str(mixed.path()));
    let err = run(&["-c", &sql]).fails().to_string();
    assert!(err.contains("1 .csv, 1 .json"), "{err}");
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
    let out = piped(&["--format", "ndjson"], sql);
    assert_eq!(out.ok(), format!("{row}\n"));
}

/// Issue 21 (8): a corrupt Parquet file makes the Parquet reader panic; that
/// is an error (one line, non-zero exit), not a crash with Rust's panic report.
#[test]
fn panic_in_a_reader_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("b.parquet");
    std::fs::write(&parquet, "PAR1garbagePAR1").unwrap();
    let table = format!("p={}", path_str(&parquet));
    // `--table` checks the footer before the reader trusts it (issue 45):
    // no panic at all
    let refused = run(&["--table", &table, "-c", "SELECT 1"]);
    let err = refused.fails();
    assert!(err.contains("cannot register table 'p'"), "{err}");
    assert!(
        err.contains("a corrupt Parquet file: its footer gives 1701273954 bytes of metadata, but the file has 15 bytes"),
        "{err}"
    );
    for (bytes, expected) in [
        (&b"PAR1"[..], "not a Parquet file (4 bytes"),
        (b"garbage-garbage-garbage", "not a Parquet file (23 bytes"),
    ] {
        std::fs::write(dir.path().join("c.parquet"), bytes).unwrap();
        let table = format!("c={}", path_str(&dir.path().join("c.parquet")));
        let err = run(&["--table", &table, "-c", "SELECT 1"])
            .fails()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
    std::fs::remove_file(dir.path().join("c.parquet")).unwrap();

    // in a statement read from stdin: the statements before it ran
    let script = format!(
        "SELECT 1 AS before;\n\
         CREATE EXTERNAL TABLE p STORED AS PARQUET LOCATION '{}';\n\
         SELECT 2 AS after;\n",
        path_str(&parquet)
    );
    let run = piped(&["--format", "csv"], &script);
    let err = run.fails();
    assert_eq!(run.stdout, "before\n1\n");
    assert!(err.contains("panic"), "{err}");

    // the interactive shell reports it and takes the next statement
    let lines: Vec<&str> = script.lines().collect();
    let shown = interactive(
        &["--format", "csv"],
        &[
            (lines[0], "before\r\n1\r\n"),
            (lines[1], "Error: "),
            (lines[2], "after\r\n2\r\n"),
        ],
    );
    // (where the reader panics depends on the build: the dependencies'
    // overflow checks are off in the dev profile, as in a release build)
    assert!(
        shown.contains("Error: Internal error: a panic at "),
        "{shown}"
    );
    assert!(!shown.contains("panicked at"), "{shown}");
}

/// Issue 21 (12): statements piped into stdin run like a `-f` file: the
/// last one needs no `;`, and a failing one stops the run with a non-zero
/// exit status.
#[test]
fn piped_statements_run_like_a_file() {
    let run = piped(
        &["--format", "csv"],
        "SELECT 'a;' AS first; -- a comment; with a semicolon\nSELECT\n  2 AS last",
    );
    assert_eq!(run.ok(), "first\na;\nlast\n2\n");

    for script in [
        "SELECT 1 AS first;\nSELEC 2;\nSELECT 3 AS after;\n",
        "SELECT 1 AS first;\nSELECT * FROM missing",
    ] {
        let run = piped(&["--format", "csv"], script);
        run.fails();
        assert_eq!(run.stdout, "first\n1\n", "{script}");
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
        let piped = piped(&[], sql).fails().to_string();
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

/// Issue 26: the README's 30-second query, which reads `VALUES`.
const THIRTY_SECONDS: &str =
    "SELECT x, grad(x * x * y, x) AS dx, grad(x * x * y, x, y)['y'] AS dy, \
     grad(grad(sin(x), x), x) AS d2 FROM (VALUES (3.0, 2.0), (1.0, -1.0)) AS t(x, y)";

/// Issue 26: a query reading `VALUES` is exported for every dialect, as a
/// `VALUES` list; the DataFusion export runs to the same numbers.
#[test]
fn rewrite_exports_values_for_every_dialect() {
    for dialect in ["datafusion", "duckdb", "postgres", "sqlite", "generic"] {
        let out = dfgrad_ok(&["--rewrite", dialect, "-c", THIRTY_SECONDS]);
        assert!(out.contains("(VALUES ("), "{dialect}: {out}");
        assert!(!out.contains("grad("), "{dialect}: {out}");
        // the placeholder the unparser printed is replaced by the list
        assert!(!out.contains("FROM __dfgrad_values"), "{dialect}: {out}");
    }
    let exported = dfgrad_ok(&["--rewrite", "datafusion", "-c", THIRTY_SECONDS]);
    let original = dfgrad_ok(&["--format", "csv", "-c", THIRTY_SECONDS]);
    assert_eq!(
        dfgrad_ok(&["--format", "csv", "-c", &exported]),
        original,
        "{exported}"
    );
    assert_eq!(
        original,
        "x,dx,dy,d2\n3.0,12.0,9.0,-0.1411200080598672\n1.0,-2.0,1.0,-0.8414709848078965\n"
    );

    // INSERT … SELECT over a VALUES list
    let out = dfgrad_ok(&[
        "--rewrite",
        "postgres",
        "-c",
        "CREATE TABLE t (x DOUBLE, d DOUBLE); INSERT INTO t \
         SELECT v.x, grad(v.x * v.x, v.x) FROM (VALUES (1.0, 0.0), (2.0, 0.0)) v(x, z)",
    ]);
    assert!(
        out.contains(
            "(VALUES (CAST(1.0 AS DOUBLE PRECISION), CAST(0.0 AS DOUBLE PRECISION)), \
             (CAST(2.0 AS DOUBLE PRECISION), CAST(0.0 AS DOUBLE PRECISION)))"
        ),
        "{out}"
    );
}

/// Issue 45: statements given as separate `-c` arguments rewrite to one
/// runnable script: each ends with `;`, and the script runs as piped input
/// (also after a trailing comment).
#[test]
fn rewrite_of_several_commands_is_one_script() {
    let out = dfgrad_ok(&[
        "--rewrite",
        "duckdb",
        "-c",
        "CREATE TABLE t (x DOUBLE)",
        "-c",
        "INSERT INTO t VALUES (3.0)",
        "-c",
        "SELECT grad(x * x, x) AS d FROM t -- the derivative",
        "-c",
        "SELECT grad(x * x * x, x) AS e FROM t",
    ]);
    assert_eq!(out.matches(";\n").count(), 4, "{out}");
    let ran = piped(&["--format", "csv", "-q"], &out);
    assert!(
        ran.ok().ends_with("d\n6.0\ne\n27.0\n"),
        "{out}\n{}",
        ran.stdout
    );
}

/// Issue 26: what cannot be exported is refused in one readable sentence,
/// as are the flag's misuses.
#[test]
fn rewrite_refusals_are_one_readable_sentence() {
    for (args, expected) in [
        (
            vec![
                "--rewrite",
                "sqlite",
                "-c",
                "SELECT grad(x * y, x, y) AS g FROM (VALUES (1.0, 2.0)) t(x, y)",
            ],
            "Error: [unexportable] ",
        ),
        (
            vec!["--rewrite", "oracle", "-c", "SELECT 1"],
            "unknown SQL dialect `oracle`",
        ),
        (vec!["--rewrite", "duckdb"], "--rewrite needs -c or -f"),
    ] {
        let err = run(&args).fails().to_string();
        assert!(err.contains(expected), "{args:?}: {err}");
        for dump in [" { ", "Some(", "Column {", "LogicalPlan"] {
            assert!(!err.contains(dump), "{args:?}: {err}");
        }
    }
}

/// Issue 26: CSV and TSV cells of struct (several-variable `grad`) and
/// tensor columns hold their values as JSON text.
#[test]
fn csv_and_tsv_write_structs_and_tensors_as_json() {
    let sql = "SELECT grad(x * x * y, x, y) AS g, tensor([x, y], 2) AS t, \
               CAST(NULL AS DOUBLE) AS n FROM (VALUES (3.0, 2.0)) v(x, y)";
    assert_eq!(
        dfgrad_ok(&["--format", "csv", "-c", sql]),
        "g,t,n\n\"{\"\"x\"\":12.0,\"\"y\"\":9.0}\",\"[3.0,2.0]\",\n"
    );
    assert_eq!(
        dfgrad_ok(&["--format", "tsv", "-c", sql]),
        "g\tt\tn\n\"{\"\"x\"\":12.0,\"\"y\"\":9.0}\"\t[3.0,2.0]\t\n"
    );
    // a matrix, with NaN written as JSON writes it
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-c",
        "SELECT tensor([1.0, CAST('NaN' AS DOUBLE), 3.0, 4.0], 2, 2) AS m",
    ]);
    assert_eq!(out, "m\n\"[[1.0,\"\"NaN\"\"],[3.0,4.0]]\"\n");
}

/// Issue 26: `automatic` (the default) prints a table; a source marked
/// unbounded has its rows streamed as CSV as they arrive.
#[test]
fn automatic_format_prints_tables_and_streams_unbounded_sources() {
    let out = dfgrad_ok(&["-q", "-c", "SELECT 1 AS one"]);
    assert_eq!(out, "+-----+\n| one |\n+-----+\n| 1   |\n+-----+\n");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("s.csv");
    std::fs::write(&csv, "x\n1.0\n3.0\n").unwrap();
    let create = format!(
        "CREATE UNBOUNDED EXTERNAL TABLE s (x DOUBLE) STORED AS CSV LOCATION '{}' \
         OPTIONS ('format.has_header' 'true')",
        path_str(&csv)
    );
    let out = dfgrad_ok(&["-c", &create, "-c", "SELECT x, grad(x * x, x) AS d FROM s"]);
    assert_eq!(out, "x,d\n1.0,2.0\n3.0,6.0\n");
}

/// Issue 26: a table shows at most `--maxrows` rows (40 by default, `inf`
/// for all), and says how many were fetched; other formats print all.
#[test]
fn maxrows_limits_the_rows_a_table_shows() {
    let sql = "SELECT value FROM generate_series(1, 100)";
    let run_with = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-c", sql]);
        let run = run(&all);
        run.ok();
        run
    };
    let rows = |out: &str| out.lines().filter(|l| l.starts_with("| ")).count();
    let default = run_with(&[]);
    // the header, 40 rows and three rows of dots
    assert_eq!(rows(&default.stdout), 44, "{}", default.stdout);
    assert!(default
        .stdout
        .contains("| 40    |\n| .     |\n| .     |\n| .     |\n+-------+"));
    assert!(
        default
            .stderr
            .starts_with("100 row(s) fetched. (First 40 displayed. Use --maxrows to adjust.)"),
        "{}",
        default.stderr
    );
    assert_eq!(rows(&run_with(&["--maxrows", "3"]).stdout), 7);
    let all = run_with(&["--maxrows", "inf"]);
    assert_eq!(rows(&all.stdout), 101);
    assert!(
        all.stderr.starts_with("100 row(s) fetched. Elapsed"),
        "{}",
        all.stderr
    );
    let none = run_with(&["--maxrows", "0"]);
    assert_eq!(none.stdout, "");
    assert_eq!(
        run_with(&["--maxrows", "3", "--format", "csv"])
            .stdout
            .lines()
            .count(),
        101
    );
    let err = run(&["--maxrows", "some", "-c", sql]).fails().to_string();
    assert!(err.contains("expected a number of rows or inf"), "{err}");
}

/// Issue 26: `-b` sets DataFusion's batch size; 0 is refused.
#[test]
fn batch_size_sets_the_execution_batch_size() {
    let out = dfgrad_ok(&[
        "-b",
        "7",
        "--format",
        "csv",
        "-c",
        "SHOW datafusion.execution.batch_size",
        "-c",
        "SELECT count(*) AS n, max(grad(value * value, value)) AS d FROM generate_series(1, 20)",
    ]);
    assert_eq!(
        out,
        "name,value\ndatafusion.execution.batch_size,7\nn,d\n20,40.0\n"
    );
    let err = run(&["--batch-size", "0", "-c", "SELECT 1"])
        .fails()
        .to_string();
    assert!(
        err.contains("expected a positive number of rows, got '0'"),
        "{err}"
    );
}

/// Issue 26: `-m` bounds DataFusion's memory pool and the results held for
/// printing; exhausting it is one error line with a hint.
#[test]
fn memory_limit_bounds_queries() {
    let sql = "SELECT value, grad(value * value, value) AS d FROM generate_series(1, 200000)";
    let out = dfgrad_ok(&[
        "-m",
        "64m",
        "--format",
        "csv",
        "-c",
        &format!("SELECT count(*) AS n FROM ({sql})"),
    ]);
    assert_eq!(out, "n\n200000\n");
    let err = run(&["-m", "64k", "--format", "csv", "-c", sql])
        .fails()
        .to_string();
    assert!(err.contains("Resources exhausted"), "{err}");
    assert!(
        err.contains("hint: raise dfgrad's memory limit (-m/--memory-limit)"),
        "{err}"
    );
    for (args, expected) in [
        (
            vec!["-m", "10x", "-c", "SELECT 1"],
            "expected a size such as 512m or 2g",
        ),
        (
            vec!["--memory-limit", "0", "-c", "SELECT 1"],
            "is zero or too large",
        ),
        (
            vec![
                "--ballista",
                "df://127.0.0.1:1",
                "-m",
                "1g",
                "-c",
                "SELECT 1",
            ],
            "with --ballista the queries run on the cluster's executors",
        ),
    ] {
        let err = run(&args).fails().to_string();
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// Issue 45 (7): a relational gradient over a 300k-row parameter table
/// under a memory limit is DataFusion's `Resources exhausted` where the
/// limit is too small, never an internal error, and the right sum where it
/// is enough (d/dval Σ val² = 2·val, and for the float group keys of
/// Σ key·count(*) each row's key counts once: 1 per row).
#[test]
fn relational_gradients_under_a_memory_limit() {
    let table = "CREATE TABLE p AS SELECT value AS g, CAST(value % 9973 AS DOUBLE) / 10 AS val \
                 FROM generate_series(1, 300000)";
    let losses = [
        (
            "(SELECT sum(val * val) FROM p)",
            "SELECT 2 * sum(val) FROM p",
        ),
        (
            "(SELECT sum(key * n) FROM (SELECT p.val AS key, count(*) AS n FROM p GROUP BY p.val))",
            "SELECT CAST(count(*) AS DOUBLE) FROM p",
        ),
    ];
    for (loss, right) in losses {
        let check = format!(
            "{table}; SELECT abs(sum(d) - ({right})) < 1e-6 * ({right}) AS ok \
             FROM (SELECT grad({loss}, val) AS d FROM p)"
        );
        let out = dfgrad_ok(&["-m", "64m", "--format", "csv", "-c", &check]);
        assert_eq!(out, "ok\ntrue\n", "{loss}");
        let err = run(&["-m", "4m", "--format", "csv", "-c", &check])
            .fails()
            .to_string();
        assert!(err.contains("Resources exhausted"), "{loss}: {err}");
        assert!(!err.contains("Internal error"), "{loss}: {err}");
    }
}

/// Issue 26: `-p` runs in a directory, and files are queried directly
/// (`FROM 'points.csv'`, DataFusion's dynamic file catalog).
#[test]
fn data_path_and_querying_files_directly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("points.csv"), "x,y\n1.0,2.0\n3.0,4.0\n").unwrap();
    let out = dfgrad_ok(&[
        "-p",
        path_str(dir.path()),
        "--format",
        "csv",
        "-c",
        "SELECT x, grad(x * x * y, x) AS d FROM 'points.csv' ORDER BY x",
    ]);
    assert_eq!(out, "x,d\n1.0,4.0\n3.0,24.0\n");
    // --table paths and -f files are read from there too
    std::fs::write(dir.path().join("q.sql"), "SELECT sum(y) AS s FROM p;").unwrap();
    let out = dfgrad_ok(&[
        "--data-path",
        path_str(dir.path()),
        "--table",
        "p=points.csv",
        "--format",
        "csv",
        "-f",
        "q.sql",
    ]);
    assert_eq!(out, "s\n6.0\n");
    // a query of a file from the shell's working directory
    let out = piped_in(
        Some(dir.path()),
        &["--format", "csv"],
        "SELECT count(*) AS n FROM 'points.csv';",
    );
    assert_eq!(out.ok(), "n\n2\n");

    let err = run(&["-p", "/no/such/dir", "-c", "SELECT 1"])
        .fails()
        .to_string();
    assert!(err.contains("'/no/such/dir' is not a directory"), "{err}");
    let err = run(&[
        "-p",
        path_str(dir.path()),
        "-c",
        "SELECT * FROM 'missing.csv'",
    ])
    .fails()
    .to_string();
    assert!(err.contains("missing.csv"), "{err}");
}

/// Issue 26: `SHOW TABLES`, `SHOW COLUMNS` and `information_schema` work
/// without configuring anything.
#[test]
fn information_schema_is_on() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-c",
        "CREATE TABLE points (x DOUBLE, y DOUBLE)",
        "-c",
        "SHOW TABLES",
        "-c",
        "SHOW COLUMNS FROM points",
        "-c",
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'points' ORDER BY column_name",
    ]);
    assert!(out.contains("datafusion,public,points,BASE TABLE"), "{out}");
    assert!(out.contains("datafusion,public,points,x,"), "{out}");
    assert!(out.ends_with("column_name\nx\ny\n"), "{out}");
}

/// Issue 26: `-r` files run first (statements and meta-commands); without
/// `-r`, `~/.dfgradrc` runs before piped input or the shell (not before
/// `-c`/`-f`).
#[test]
fn rc_files_run_first() {
    let dir = tempfile::tempdir().unwrap();
    let rc = dir.path().join("setup.sql");
    std::fs::write(&rc, "CREATE TABLE t AS VALUES (2.0);\n\\pset format csv\n").unwrap();
    // stdout holds the data only (issue 45): the setting's confirmation is
    // a status line on stderr, and none in quiet mode
    let query = "SELECT grad(column1 * column1, column1) AS d FROM t";
    let out = run(&["-r", path_str(&rc), "-c", query]);
    assert_eq!(out.ok(), "d\n4.0\n");
    assert!(
        out.stderr.contains("Output format is csv."),
        "{}",
        out.stderr
    );
    let out = run(&["-q", "-r", path_str(&rc), "-c", query]);
    assert_eq!(out.ok(), "d\n4.0\n");
    assert_eq!(out.stderr, "");

    std::fs::copy(&rc, dir.path().join(".dfgradrc")).unwrap();
    let out = piped_in(Some(dir.path()), &[], "SELECT column1 AS x FROM t;");
    assert_eq!(out.ok(), "x\n2.0\n");
    let err = piped_in(Some(dir.path()), &["-c", "SELECT column1 FROM t"], "");
    assert!(err.fails().contains("t"), "{}", err.stderr);

    let err = run(&["-r", "/no/such.rc", "-c", "SELECT 1"])
        .fails()
        .to_string();
    assert!(err.contains("cannot read '/no/such.rc'"), "{err}");
    std::fs::write(&rc, "\\bogus\n").unwrap();
    let err = run(&["-r", path_str(&rc), "-c", "SELECT 1"])
        .fails()
        .to_string();
    assert!(err.contains("unknown meta-command '\\bogus'"), "{err}");
}

/// Issue 26: meta-commands in piped input, datafusion-cli's: `\?`, `\d`,
/// `\d NAME`, `\h`, `\h NAME`, `\quiet`, `\pset format`, `\q`.
#[test]
fn meta_commands_through_a_pipe() {
    let input = "\\?\n\
                 CREATE TABLE points (x DOUBLE, y DOUBLE);\n\
                 \\d\n\
                 \\d points\n\
                 \\h\n\
                 \\h grad\n\
                 \\h matmul\n\
                 \\h sqrt\n\
                 \\quiet\n\
                 \\pset format json\n\
                 SELECT 1 AS one; -- a comment after the statement\n\
                 \\q\n\
                 SELECT 2 AS never;\n";
    let run = piped(&["--format", "csv"], input);
    let out = run.ok();
    for expected in [
        "command,description\n",
        "\\d NAME,describe table NAME (SHOW COLUMNS FROM NAME)\n",
        "datafusion,public,points,BASE TABLE\n",
        "datafusion,public,points,y,",
        "function,kind,description\ngrad,scalar,",
        "\ntensor_avg,aggregate,",
        "grad(f, x) | grad(f, x1, x2, …) (scalar function)\n",
        "matmul(",
        "sqrt(",
        "Quiet mode is false.\n",
        "[{\"one\":1}]\n",
    ] {
        assert!(out.contains(expected), "{expected:?} not in {out}");
    }
    assert!(
        run.stderr.contains("Output format is json.\n"),
        "{}",
        run.stderr
    );
    assert!(!out.contains("Output format"), "{out}");
    assert!(!out.contains("never"), "{out}");

    // each refused meta-command: one error line, and the run stops
    for (line, expected) in [
        ("\\x", "Error: unknown meta-command '\\x': \\? lists the meta-commands"),
        ("\\h nosuch", "Error: there is no function named 'nosuch'"),
        ("\\pset format xml", "Error: unknown output format 'xml': expected one of automatic, table, csv, tsv, json, ndjson"),
        ("\\pset border 2", "Error: \\pset takes `format FORMAT`, not 'border 2'"),
        ("\\quiet maybe", "Error: \\quiet takes true or false, not 'maybe'"),
        ("\\q now", "Error: \\q takes no argument, not 'now'"),
        ("\\d missing", "Error: "),
    ] {
        let run = piped(&["--format", "csv"], &format!("{line}\nSELECT 1 AS after;\n"));
        let err = run.fails();
        assert!(err.starts_with(expected), "{line}: {err}");
        assert_eq!(run.stdout, "", "{line}");
    }
}

/// Issue 26: the same meta-commands in the interactive shell (on a
/// terminal), where a refused one is reported and the shell goes on.
#[test]
fn meta_commands_in_the_shell() {
    let shown = interactive(
        &["--format", "csv"],
        &[
            ("\\?", "\\q,quit dfgrad"),
            (
                "CREATE TABLE points (x DOUBLE); SELECT 'made' AS status;",
                "status\r\nmade\r\n",
            ),
            ("\\d", "points,BASE TABLE"),
            ("\\d points", "points,x,"),
            ("\\h", "tensor_avg,aggregate,"),
            ("\\h vjp", "vjp(f, x1, u [, x2 …])"),
            ("\\x", "Error: unknown meta-command '\\x'"),
            ("\\pset format tsv", "Output format is tsv."),
            ("SELECT 1 AS a, 2 AS b;", "a\tb\r\n1\t2\r\n"),
        ],
    );
    assert!(!shown.contains("panicked"), "{shown}");
}

/// Issue 26: every refused flag value is one `Error: ` line (clap's usage
/// text folded), with exit status 2.
#[test]
fn refused_flags_are_one_line() {
    for (args, expected) in [
        (
            vec!["--format", "xml"],
            "invalid value 'xml' for '--format <FORMAT>'",
        ),
        (vec!["--bogus"], "unexpected argument '--bogus'"),
        (
            vec!["--table", "nopath"],
            "expected NAME=PATH, got 'nopath'",
        ),
        (vec!["-b"], "a value is required for '--batch-size <N>'"),
    ] {
        let run = run(&args);
        let err = run.fails();
        assert_eq!(run.status.code(), Some(2), "{args:?}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(err.ends_with("(dfgrad --help lists the options)"), "{err}");
    }
    assert!(dfgrad_ok(&["--help"]).contains("--memory-limit <SIZE>"));
}
