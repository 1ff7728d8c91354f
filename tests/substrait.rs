//! Substrait export and import: differentiated plans written as Substrait,
//! read back into a fresh session and run, must give the numbers the SQL
//! gives directly; plans that call `grad` by name are differentiated on
//! import; what cannot be exported is refused with a typed error.
#![cfg(feature = "substrait")]

use std::path::Path;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion_grad::substrait::{
    from_substrait, logical_to_substrait, plan_from_bytes_or_json, plan_to_bytes, plan_to_json,
    to_substrait, Profile,
};
use datafusion_grad::{ErrorKind, GradError};

use crate::common::{dfgrad, dfgrad_ok};

/// Tables `t(x, y, g)` (x has a NULL; g is an integer group) and
/// `pts(w, x, y)` (points of a regression, grouped by the weight `w`).
const TABLES: &str = "
CREATE TABLE t(x DOUBLE, y DOUBLE, g BIGINT) AS VALUES
  (0.5, 1.0, 1), (1.0, -2.0, 1), (2.0, 3.0, 2), (NULL, 4.0, 2), (4.0, 0.25, 2),
  (-3.0, 0.5, 3), (2.5, 1.5, 3), (-0.5, -1.0, 3), (1.5, 2.0, 1), (-1.5, 0.75, 2);
CREATE TABLE pts(w DOUBLE, x DOUBLE, y DOUBLE) AS VALUES
  (0.5, 1.0, 2.0), (0.5, 2.0, 3.5), (0.5, -1.0, -1.5), (1.5, 0.5, 1.0),
  (1.5, 3.0, 6.5), (1.5, -2.0, -3.0), (2.0, 1.0, 1.0), (2.0, 4.0, 9.0)";

/// A fresh session with [`TABLES`].
async fn context() -> SessionContext {
    let ctx = datafusion_grad::session_context();
    for statement in TABLES.split(';') {
        ctx.sql(statement).await.unwrap().collect().await.unwrap();
    }
    ctx
}

/// Queries with markers, in every shape the export must carry.
const QUERIES: &[&str] = &[
    // rules, one variable
    "SELECT x, grad(x * x * y, x) AS dx FROM t",
    "SELECT grad(sin(x) * exp(y), x) AS a, grad(sin(x) * exp(y), y) AS b FROM t",
    "SELECT grad(abs(x) * y + signum(y) * x, x) AS d FROM t",
    "SELECT grad(power(abs(x) + 1.0, y) + sqrt(abs(x) + 1.0) + ln(abs(x) + 2.0), x) AS d FROM t",
    "SELECT grad(CASE WHEN x > 1 THEN x * x ELSE -x END, x) AS d FROM t",
    "SELECT grad(CASE g WHEN 1 THEN x * y ELSE x END, x) AS d FROM t",
    "SELECT grad(log(abs(x) + 1.0) + log(2.0, abs(y) + 1.0) + atan2(y, x), x) AS d FROM t",
    // several variables
    "SELECT grad(x * x * y, x, y)['x'] AS gx, grad(x * x * y, x, y)['y'] AS gy FROM t",
    "SELECT grad(x * x * y, x, y) AS g FROM t",
    // forward and reverse mode
    "SELECT jvp(x * y + sin(x), x, 1.0, y, 2.0) AS j FROM t",
    "SELECT vjp(exp(x) * y, x, 3.0) AS v FROM t",
    // second derivatives
    "SELECT grad(grad(sin(x) * x, x), x) AS d2, grad(grad(x * x * y, x), y) AS dxy FROM t",
    // derived columns
    "WITH v AS (SELECT x, y, sin(x) AS s FROM t) SELECT grad(s * x, x) AS d FROM v",
    "SELECT grad(z * z, x) AS d FROM (SELECT x, y, x * y AS z FROM t) AS u",
    // aggregates
    "SELECT w, grad(avg((w * x - y) * (w * x - y)), w) AS dw FROM pts GROUP BY w",
    "SELECT w, grad(sqrt(avg((w * x - y) * (w * x - y))), w) AS d FROM pts GROUP BY w",
    "SELECT w, grad(avg(ln(1.0 + exp(-y * w * x))), w) AS d FROM pts GROUP BY w HAVING count(*) > 2",
    "SELECT g, count(*) AS n, sum(grad(x * x, x)) AS s FROM t GROUP BY g",
    // filters, ORDER BY, LIMIT
    "SELECT x, grad(tanh(x * y), x) AS d FROM t WHERE y > 0",
    "SELECT x, grad(x * x * x, x) AS d FROM t WHERE x IS NOT NULL ORDER BY x DESC LIMIT 4",
    "SELECT x, grad(exp(x) / (1.0 + exp(x)), x) AS d FROM t ORDER BY x LIMIT 3 OFFSET 2",
    // windows and joins (DataFusion profile only)
    "SELECT w, grad(avg(w * x) OVER (PARTITION BY w), w) AS d FROM pts",
    "SELECT t.x, grad(t.x * pts.w, t.x) AS d FROM t JOIN pts ON t.x = pts.x",
];

/// One cell as a comparable value.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Number(f64),
    Text(String),
}

/// The rows of `batches`, each cell flattened (structs into their fields),
/// sorted.
fn rows(batches: &[RecordBatch]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let mut cells = Vec::new();
            for column in batch.columns() {
                push_cells(column, row, &mut cells);
            }
            out.push(cells);
        }
    }
    out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    out
}

fn push_cells(column: &ArrayRef, row: usize, cells: &mut Vec<Cell>) {
    if let DataType::Struct(_) = column.data_type() {
        let s = column.as_struct();
        for child in s.columns() {
            if s.is_null(row) {
                cells.push(Cell::Null);
            } else {
                push_cells(child, row, cells);
            }
        }
        return;
    }
    if column.is_null(row) {
        cells.push(Cell::Null);
    } else if column.data_type().is_numeric() {
        let f = cast(column, &DataType::Float64).unwrap();
        cells.push(Cell::Number(f.as_primitive::<Float64Type>().value(row)));
    } else {
        let s = cast(column, &DataType::Utf8).unwrap();
        cells.push(Cell::Text(s.as_string::<i32>().value(row).to_string()));
    }
}

/// Asserts equal results, numbers to 1e-12 relative (NaN equals NaN).
fn assert_same(query: &str, got: &[Vec<Cell>], want: &[Vec<Cell>]) {
    assert_eq!(got.len(), want.len(), "{query}: row counts differ");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{query}: widths differ");
        for (a, b) in g.iter().zip(w) {
            let same = match (a, b) {
                (Cell::Number(a), Cell::Number(b)) => {
                    (a.is_nan() && b.is_nan())
                        || a == b
                        || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
                }
                (a, b) => a == b,
            };
            assert!(same, "{query}: {got:?} vs {want:?}");
        }
    }
}

/// The error kind of `err`, which must be a typed error.
fn kind(err: &datafusion::error::DataFusionError) -> ErrorKind {
    GradError::find(err)
        .unwrap_or_else(|| panic!("not a typed error: {err}"))
        .kind()
}

#[tokio::test]
async fn round_trip_matches_direct_execution() -> Result<()> {
    assert!(QUERIES.len() >= 15);
    let ctx = context().await;
    for query in QUERIES {
        let want = rows(&ctx.sql(query).await?.collect().await?);
        let plan = to_substrait(&ctx, query, Profile::DataFusion).await?;
        let json = plan_to_json(&plan)?;
        for marker in ["\"grad\"", "\"jvp\"", "\"vjp\""] {
            assert!(!json.contains(marker), "{query}: {marker} in {json}");
        }
        // both encodings read back to the same plan
        let bytes = plan_to_bytes(&plan);
        let from_bytes = plan_from_bytes_or_json(&bytes)?;
        assert_eq!(from_bytes, plan_from_bytes_or_json(json.as_bytes())?);
        assert_eq!(from_bytes, *plan);
        // into a fresh session
        let fresh = context().await;
        let df = from_substrait(&fresh, &from_bytes).await?;
        let got = rows(&df.collect().await?);
        assert_same(query, &got, &want);
    }
    Ok(())
}

#[tokio::test]
async fn export_is_deterministic() -> Result<()> {
    let ctx = context().await;
    let query = "SELECT grad(sin(x) * exp(y) + abs(x) * ln(abs(y) + 1.0), x) AS d FROM t";
    for profile in Profile::ALL {
        let a = plan_to_bytes(&*to_substrait(&ctx, query, profile).await?);
        let b = plan_to_bytes(&*to_substrait(&ctx, query, profile).await?);
        assert_eq!(a, b, "{profile}");
    }
    Ok(())
}

#[tokio::test]
async fn unoptimized_plan_naming_grad_is_differentiated_on_import() -> Result<()> {
    use datafusion_substrait::logical_plan::producer::to_substrait_plan;

    let ctx = context().await;
    let queries = [
        "SELECT x, grad(x * x * y, x) AS d FROM t",
        "SELECT jvp(sin(x) * y, x, 2.0) AS j, vjp(x * y, y, 0.5) AS v FROM t",
        "SELECT w, grad(avg((w * x - y) * (w * x - y)), w) AS dw FROM pts GROUP BY w",
    ];
    for query in queries {
        let df = ctx.sql(query).await?;
        // the plan as written, markers and all (as another producer could)
        let plan = to_substrait_plan(df.logical_plan(), &ctx.state())?;
        let json = plan_to_json(&plan)?;
        assert!(
            json.contains("\"grad\"") || json.contains("\"jvp\""),
            "{json}"
        );
        let want = rows(&df.collect().await?);
        let fresh = context().await;
        let imported = from_substrait(&fresh, &plan).await?;
        // re-emitted, the plan holds derivatives only
        let again =
            logical_to_substrait(&fresh.state(), imported.logical_plan(), Profile::DataFusion)
                .await?;
        assert!(!plan_to_json(&again)?.contains("\"grad\""));
        assert_same(query, &rows(&imported.collect().await?), &want);
        let reimported = from_substrait(&context().await, &again).await?;
        assert_same(query, &rows(&reimported.collect().await?), &want);
    }
    Ok(())
}

#[tokio::test]
async fn imported_grad_that_cannot_be_differentiated_is_a_typed_error() -> Result<()> {
    use datafusion_substrait::logical_plan::producer::to_substrait_plan;

    let ctx = context().await;
    // `grad` of a string function: planned fine, refused when differentiated
    let df = ctx
        .sql("SELECT grad(CAST(length(CAST(x AS VARCHAR)) AS DOUBLE) * x, x) AS d FROM t")
        .await?;
    let plan = to_substrait_plan(df.logical_plan(), &ctx.state())?;
    let err = from_substrait(&context().await, &plan).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NonDifferentiable, "{err}");
    Ok(())
}

#[tokio::test]
async fn refusals_are_typed() -> Result<()> {
    let ctx = context().await;
    let refused = [
        (
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
            "recursive CTE",
        ),
        ("INSERT INTO t VALUES (1.0, 2.0, 3)", "DML"),
        ("UPDATE t SET x = grad(x * x, x)", "DML"),
        ("DELETE FROM t WHERE x > 1", "DML"),
        (
            "CREATE TABLE u AS SELECT grad(x * x, x) AS d FROM t",
            "CREATE TABLE `u` AS SELECT",
        ),
        ("CREATE VIEW v AS SELECT x FROM t", "CREATE VIEW"),
        ("EXPLAIN SELECT grad(x * x, x) FROM t", "EXPLAIN"),
        ("SELECT 1; SELECT 2", "exactly one query"),
        // relational reverse mode: the shared loss or the gradient table's
        // group join, whichever the export meets first
        (
            "SELECT grad((SELECT sum(x * x) FROM t), x) FROM t",
            "(a gradient with respect to a table's rows",
        ),
    ];
    for (sql, what) in refused {
        let err = to_substrait(&ctx, sql, Profile::DataFusion)
            .await
            .unwrap_err();
        assert_eq!(kind(&err), ErrorKind::Unexportable, "{sql}: {err}");
        let message = err.to_string();
        assert!(message.contains("[unexportable]"), "{message}");
        assert!(message.contains(what), "{sql}: {message}");
    }
    // nothing was created or inserted
    assert!(ctx.table("u").await.is_err());
    assert_eq!(ctx.table("t").await?.count().await?, 10);

    let err = "duckdb".parse::<Profile>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unexportable);
    assert!(err.to_string().contains("duckdb"));

    for data in [
        &b"SELECT 1"[..],
        b"{\"relations\": 3}",
        b"",
        b"\x08\x96\x01",
    ] {
        let err = plan_from_bytes_or_json(data).unwrap_err();
        assert_eq!(kind(&err), ErrorKind::Unexportable, "{err}");
    }
    Ok(())
}

#[tokio::test]
async fn acero_profile_refuses_what_acero_cannot_run() -> Result<()> {
    let ctx = context().await;
    let refused = [
        ("SELECT grad(x * x, x) + x % y AS d FROM t", "`%`"),
        ("SELECT cbrt(x) AS c, grad(x * x, x) AS d FROM t", "`cbrt`"),
        ("SELECT trunc(x) AS c FROM t", "`trunc`"),
        ("SELECT degrees(x) AS c FROM t", "`degrees`"),
        ("SELECT nanvl(x, y) AS c FROM t", "`nanvl`"),
        (
            "SELECT x IS DISTINCT FROM y AS b FROM t",
            "IS DISTINCT FROM",
        ),
        ("SELECT (x > y) IS TRUE AS b FROM t", "IS TRUE"),
        ("SELECT TRY_CAST(x AS BIGINT) AS c FROM t", "TRY_CAST"),
        ("SELECT CAST(x AS VARCHAR) AS c FROM t", "CAST"),
        (
            "SELECT sum(grad(x * x, x)) FILTER (WHERE y > 0) AS s FROM t",
            "FILTER",
        ),
        ("SELECT g, sum(x) AS s FROM t GROUP BY ROLLUP(g)", "ROLLUP"),
        ("SELECT median(x) AS m FROM t", "`median`"),
        ("SELECT round(x, 1) AS r FROM t", "round"),
        (
            "SELECT w, grad(avg(w * x) OVER (PARTITION BY w), w) AS d FROM pts",
            "window",
        ),
        (
            "SELECT t.x, grad(t.x * pts.w, t.x) AS d FROM t JOIN pts ON t.x = pts.x",
            "join",
        ),
        (
            "SELECT grad(x * x, x) AS d FROM (VALUES (1.0)) AS v(x)",
            "VALUES",
        ),
        ("SELECT grad(x * x, x, y) AS g FROM t", "named_struct"),
    ];
    for (sql, what) in refused {
        // DataFusion's own profile carries all of these
        to_substrait(&ctx, sql, Profile::DataFusion).await?;
        let err = to_substrait(&ctx, sql, Profile::Acero).await.unwrap_err();
        assert_eq!(kind(&err), ErrorKind::Unexportable, "{sql}: {err}");
        let message = err.to_string();
        assert!(message.contains("acero"), "{message}");
        assert!(message.contains(what), "{sql}: {message}");
    }
    Ok(())
}

#[tokio::test]
async fn acero_profile_writes_acero_shapes() -> Result<()> {
    let ctx = context().await;
    // every query of the corpus without windows, joins or structs is exportable
    for query in QUERIES {
        if query.contains("OVER")
            || query.contains("JOIN")
            || query.contains("grad(x * x * y, x, y) AS")
        {
            continue;
        }
        let plan = to_substrait(&ctx, query, Profile::Acero).await?;
        let json = plan_to_json(&plan)?;
        for forbidden in [
            "\"projection\"",
            "\"countExpr\"",
            "\"offsetExpr\"",
            "AGGREGATION_PHASE_UNSPECIFIED",
            "\"signum\"",
        ] {
            assert!(!json.contains(forbidden), "{query}: {forbidden} in {json}");
        }
    }
    let plan = to_substrait(
        &ctx,
        "SELECT g, count(*) AS n, sum(x * y) AS s FROM t GROUP BY g * 2, g",
        Profile::Acero,
    )
    .await?;
    let json = plan_to_json(&plan)?;
    assert!(
        json.contains("AGGREGATION_PHASE_INITIAL_TO_RESULT"),
        "{json}"
    );
    let plan = to_substrait(
        &ctx,
        "SELECT round(x) AS r, signum(x) AS s, log(x) AS l FROM t",
        Profile::Acero,
    )
    .await?;
    let json = plan_to_json(&plan)?;
    for wanted in ["TIE_AWAY_FROM_ZERO", "\"sign\"", "\"log10\""] {
        assert!(json.contains(wanted), "{wanted} missing in {json}");
    }
    Ok(())
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp path is not UTF-8")
}

#[test]
fn cli_exports_imports_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "x,y\n3.0,2.0\n1.0,-1.0\n").unwrap();
    let table = format!("t={}", path_str(&csv));
    let query = "SELECT x, grad(x * x * y, x) AS dx FROM t ORDER BY x";
    let direct = dfgrad_ok(&["--table", &table, "--format", "csv", "-c", query]);
    assert_eq!(direct, "x,dx\n1.0,-2.0\n3.0,12.0\n");

    for profile in ["datafusion", "acero"] {
        let plan = dir.path().join(format!("{profile}.pb"));
        let out = dfgrad_ok(&[
            "--table",
            &table,
            "--substrait",
            path_str(&plan),
            "--substrait-profile",
            profile,
            "-c",
            query,
        ]);
        assert_eq!(out, "", "--substrait writes the file only");
        assert!(std::fs::metadata(&plan).unwrap().len() > 0);
    }
    // DataFusion reads its own plan back (bytes, and JSON)
    let plan = dir.path().join("datafusion.pb");
    let ran = dfgrad_ok(&[
        "--table",
        &table,
        "--format",
        "csv",
        "--from-substrait",
        path_str(&plan),
    ]);
    assert_eq!(ran, direct);
    let json = dfgrad_ok(&["--table", &table, "--substrait-json", "-c", query]);
    assert!(json.contains("\"relations\""), "{json}");
    let json_path = dir.path().join("plan.json");
    std::fs::write(&json_path, &json).unwrap();
    let ran = dfgrad_ok(&[
        "--table",
        &table,
        "--format",
        "csv",
        "--from-substrait",
        path_str(&json_path),
    ]);
    assert_eq!(ran, direct);
    // re-emit an imported plan as JSON
    let again = dfgrad_ok(&[
        "--table",
        &table,
        "--from-substrait",
        path_str(&plan),
        "--substrait-json",
    ]);
    assert!(again.contains("\"multiply\""), "{again}");
}

#[test]
fn cli_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "x,y\n3.0,2.0\n").unwrap();
    let table = format!("t={}", path_str(&csv));
    let plan = dir.path().join("p.pb");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--substrait-json",
                "--substrait-profile",
                "acero",
                "-c",
                "SELECT x % y FROM t",
            ],
            "[unexportable]",
        ),
        (
            &[
                "--substrait-json",
                "--substrait-profile",
                "spark",
                "-c",
                "SELECT x FROM t",
            ],
            "[unexportable]",
        ),
        (
            &[
                "--substrait-json",
                "-c",
                "SELECT x FROM t",
                "-c",
                "SELECT y FROM t",
            ],
            "exactly one query",
        ),
        (
            &[
                "--substrait",
                path_str(&plan),
                "-c",
                "INSERT INTO t VALUES (1.0, 1.0)",
            ],
            "[unexportable]",
        ),
        (&["--from-substrait", path_str(&csv)], "[unexportable]"),
        (&["--from-substrait", "/nonexistent/plan.pb"], "cannot read"),
    ];
    for (args, message) in cases {
        let mut all = vec!["--table", &table];
        all.extend_from_slice(args);
        let output = dfgrad(&all);
        assert!(!output.status.success(), "{all:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{all:?}: {stderr}");
    }
    assert!(!plan.exists());
}

/// A table that claims to apply every filter itself (as a database-backed
/// provider would).
#[derive(Debug)]
struct ExactFilters(std::sync::Arc<datafusion::datasource::MemTable>);

#[async_trait::async_trait]
impl datafusion::catalog::TableProvider for ExactFilters {
    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> datafusion::logical_expr::TableType {
        datafusion::logical_expr::TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::prelude::Expr],
        limit: Option<usize>,
    ) -> Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        self.0.scan(state, projection, filters, limit).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&datafusion::prelude::Expr],
    ) -> Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        Ok(vec![
            datafusion::logical_expr::TableProviderFilterPushDown::Exact;
            filters.len()
        ])
    }
}

#[tokio::test]
async fn acero_profile_refuses_filters_only_the_table_applies() -> Result<()> {
    let ctx = context().await;
    let t = ctx.table_provider("t").await?;
    let batches = ctx.table("t").await?.collect().await?;
    let mem = datafusion::datasource::MemTable::try_new(t.schema(), vec![batches])?;
    ctx.register_table(
        "e",
        std::sync::Arc::new(ExactFilters(std::sync::Arc::new(mem))),
    )?;
    let sql = "SELECT grad(x * x, x) AS d FROM e WHERE y > 0";
    let plan = to_substrait(&ctx, sql, Profile::DataFusion).await?;
    assert!(plan_to_json(&plan)?.contains("\"filter\""));
    let err = to_substrait(&ctx, sql, Profile::Acero).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::Unexportable, "{err}");
    assert!(err.to_string().contains("ReadRel"), "{err}");
    Ok(())
}
