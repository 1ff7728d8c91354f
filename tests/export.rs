//! `rewrite_sql` and `differentiate_sql`: statement shapes, quoting of hostile
//! names, statements passed through unchanged, and every refusal's typed
//! error. (The exported text is run on DuckDB, PostgreSQL and SQLite by
//! `tests/engines/check_engines.py`.)

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::dialect::{DuckDbDialect, PostgreSqlDialect, SQLiteDialect};
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_grad::export::{differentiate_sql, rewrite_sql, SqlDialect};
use datafusion_grad::{ErrorKind, GradError};

async fn context() -> SessionContext {
    let ctx = datafusion_grad::session_context();
    for ddl in [
        "CREATE TABLE t (x DOUBLE, y DOUBLE, k INT)",
        "CREATE TABLE d (w DOUBLE, b DOUBLE, x DOUBLE, y DOUBLE)",
        "CREATE TABLE sink (x DOUBLE, g DOUBLE)",
    ] {
        ctx.sql(ddl).await.unwrap().collect().await.unwrap();
    }
    ctx
}

async fn rewrite(sql: &str, dialect: SqlDialect) -> Result<String> {
    rewrite_sql(&context().await, sql, dialect).await
}

/// Asserts that `result` failed with a [`GradError`] of `kind` whose message
/// contains `needle`.
fn assert_refused<T: std::fmt::Debug>(result: Result<T>, kind: ErrorKind, needle: &str) {
    let err: DataFusionError = result.expect_err("expected a refusal");
    let grad = GradError::find(&err).unwrap_or_else(|| panic!("not a GradError: {err}"));
    assert_eq!(grad.kind(), kind, "{err}");
    assert!(
        grad.message().contains(needle),
        "message `{}` does not mention `{needle}`",
        grad.message()
    );
}

/// The number of statements `sql` parses into for `dialect`'s parser.
fn statement_count(sql: &str, dialect: SqlDialect) -> usize {
    let parsed = match dialect {
        SqlDialect::DuckDb => Parser::parse_sql(&DuckDbDialect {}, sql),
        SqlDialect::Sqlite => Parser::parse_sql(&SQLiteDialect {}, sql),
        _ => Parser::parse_sql(&PostgreSqlDialect {}, sql),
    };
    parsed
        .unwrap_or_else(|e| panic!("exported SQL does not parse: {e}\n{sql}"))
        .len()
}

#[tokio::test]
async fn statements_without_markers_come_back_byte_for_byte() {
    let sql = "select  x,\n  y -- a comment\nFROM t WHERE x > 1.50";
    for dialect in SqlDialect::ALL {
        assert_eq!(rewrite(sql, dialect).await.unwrap(), sql);
    }
}

#[tokio::test]
async fn every_dialect_prints_one_statement_without_markers() {
    let sql = "SELECT x, grad(sin(x) * cos(x) * exp(x * y), x) AS g FROM t ORDER BY x";
    for dialect in SqlDialect::ALL {
        let out = rewrite(sql, dialect).await.unwrap();
        assert!(!out.to_lowercase().contains("grad("), "{dialect}: {out}");
        assert!(!out.contains("derived_projection"), "{dialect}: {out}");
        assert_eq!(statement_count(&out, dialect), 1, "{dialect}: {out}");
    }
}

#[tokio::test]
async fn dml_and_recursive_queries_are_printed() {
    let insert = rewrite(
        "INSERT INTO sink SELECT x, grad(x * x * y, x) FROM t",
        SqlDialect::Postgres,
    )
    .await
    .unwrap();
    assert!(
        insert.starts_with("INSERT INTO sink (x, g) SELECT"),
        "{insert}"
    );

    let update = rewrite(
        "UPDATE t SET y = grad(x * x * y, x) WHERE x > 0",
        SqlDialect::Sqlite,
    )
    .await
    .unwrap();
    assert!(update.starts_with("UPDATE t SET y = "), "{update}");
    assert!(update.contains(" WHERE "), "{update}");

    let newton = rewrite(
        "WITH RECURSIVE n(i, x) AS (SELECT 0 AS i, 1.0 AS x UNION ALL \
         SELECT i + 1, x - (x * x - 2) / grad(x * x - 2, x) FROM n WHERE i < 6) \
         SELECT x FROM n WHERE i = 6",
        SqlDialect::Postgres,
    )
    .await
    .unwrap();
    assert!(
        newton.starts_with("WITH RECURSIVE n(i, x) AS ("),
        "{newton}"
    );
    assert_eq!(
        statement_count(&newton, SqlDialect::Postgres),
        1,
        "{newton}"
    );
}

#[tokio::test]
async fn hostile_names_stay_identifiers() {
    let ctx = datafusion_grad::session_context();
    ctx.sql(r#"CREATE TABLE "t; DROP TABLE t; --" ("x""y" DOUBLE, "select" DOUBLE, "Z" DOUBLE)"#)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let sql = r#"SELECT grad(sin("x""y") * "select" * "Z", "x""y") AS "g'); DROP TABLE t; --" FROM "t; DROP TABLE t; --""#;
    for dialect in SqlDialect::ALL {
        let out = rewrite_sql(&ctx, sql, dialect).await.unwrap();
        assert_eq!(statement_count(&out, dialect), 1, "{dialect}: {out}");
        for quoted in [
            r#""x""y""#,
            r#""select""#,
            r#""Z""#,
            r#""t; DROP TABLE t; --""#,
            r#""g'); DROP TABLE t; --""#,
        ] {
            assert!(out.contains(quoted), "{dialect}: {quoted} not in {out}");
        }
    }
}

#[tokio::test]
async fn refusals_are_typed() {
    // PostgreSQL and SQLite forbid aggregates in a recursive term
    let training = "WITH RECURSIVE p(step, w, b) AS ( \
        SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b UNION ALL \
        SELECT step + 1, w - 0.1 * grad(avg(power(w * x + b - y, 2)), w), \
        b - 0.1 * grad(avg(power(w * x + b - y, 2)), b) \
        FROM p CROSS JOIN t WHERE step < 5 GROUP BY step, w, b) SELECT step, w, b FROM p";
    for dialect in [SqlDialect::Postgres, SqlDialect::Sqlite] {
        assert_refused(
            rewrite(training, dialect).await,
            ErrorKind::Unexportable,
            "no aggregate or window functions in the recursive term",
        );
    }
    // ... which DuckDB and DataFusion run
    for dialect in [SqlDialect::DuckDb, SqlDialect::DataFusion] {
        assert!(rewrite(training, dialect).await.is_ok());
    }

    // a struct needs struct literals
    for dialect in [
        SqlDialect::Postgres,
        SqlDialect::Sqlite,
        SqlDialect::Generic,
    ] {
        assert_refused(
            rewrite("SELECT grad(x * y, x, y) FROM t", dialect).await,
            ErrorKind::Unexportable,
            "struct value",
        );
    }
    assert!(
        rewrite("SELECT grad(x * y, x, y) FROM t", SqlDialect::DuckDb)
            .await
            .is_ok()
    );

    // SQLite has no NaN
    assert_refused(
        rewrite(
            "SELECT grad(x * CAST('NaN' AS DOUBLE), x) FROM t",
            SqlDialect::Sqlite,
        )
        .await,
        ErrorKind::Unexportable,
        "NaN",
    );

    // statements that are not queries or DML
    for sql in [
        "EXPLAIN SELECT grad(x * x, x) FROM t",
        "PREPARE q(DOUBLE) AS SELECT grad(x * $1, x) FROM t",
    ] {
        assert_refused(
            rewrite(sql, SqlDialect::DuckDb).await,
            ErrorKind::Unexportable,
            "this kind of statement",
        );
    }

    // tensor functions exist only in DataFusion with datafusion-grad
    let tensor = "SELECT grad(dot(w, w), w) FROM (SELECT tensor([1.0, 2.0], 2) AS w)";
    for dialect in [
        SqlDialect::Postgres,
        SqlDialect::Sqlite,
        SqlDialect::Generic,
        SqlDialect::DuckDb,
    ] {
        assert_refused(
            rewrite(tensor, dialect).await,
            ErrorKind::Unexportable,
            "tensor function",
        );
    }
    assert!(rewrite(tensor, SqlDialect::DataFusion).await.is_ok());

    // an unknown dialect
    let err = "oracle".parse::<SqlDialect>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unexportable);
    assert!(err.message().contains("oracle"));
}

#[test]
fn differentiate_sql_refusals_are_typed() {
    assert_refused(
        differentiate_sql("x x", "x", SqlDialect::DuckDb),
        ErrorKind::InvalidWrt,
        "not one SQL expression",
    );
    assert_refused(
        differentiate_sql("x * x", "1.0", SqlDialect::DuckDb),
        ErrorKind::InvalidWrt,
        "must be a column",
    );
    assert_refused(
        differentiate_sql("random() * x", "x", SqlDialect::DuckDb),
        ErrorKind::NonDifferentiable,
        "random",
    );
    assert_refused(
        differentiate_sql("x * CAST('NaN' AS DOUBLE)", "x", SqlDialect::Sqlite),
        ErrorKind::Unexportable,
        "NaN",
    );
}
