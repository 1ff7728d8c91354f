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
        "CREATE TABLE words (x DOUBLE, s VARCHAR, d DATE, ts TIMESTAMP)",
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

#[tokio::test]
async fn functions_print_under_the_engines_names() {
    // issue 21: SQLite has no `character_length` (DataFusion's name for `length`)
    let sql = "SELECT grad(x * length(s), x) FROM (VALUES (1.0, 'ab')) t(x, s)";
    let sqlite = rewrite(sql, SqlDialect::Sqlite).await.unwrap();
    assert!(
        sqlite.contains("length(") && !sqlite.contains("character_length"),
        "{sqlite}"
    );
    for dialect in [
        SqlDialect::DuckDb,
        SqlDialect::Postgres,
        SqlDialect::Generic,
    ] {
        let out = rewrite(sql, dialect).await.unwrap();
        assert!(out.contains("character_length("), "{dialect}: {out}");
    }

    let cases = [
        // (statement, dialect, text the export contains)
        (
            "SELECT grad(x * x, x), strpos(s, 'l') FROM words",
            SqlDialect::Sqlite,
            "instr(words.s, 'l')",
        ),
        (
            "SELECT grad(x * x, x), trim(s) FROM words",
            SqlDialect::Sqlite,
            ", trim(words.s) FROM",
        ),
        (
            "SELECT grad(x * x, x), trim(s) FROM words",
            SqlDialect::DuckDb,
            ", trim(words.s) FROM",
        ),
        (
            "SELECT grad(x * x, x), trim(s) FROM words",
            SqlDialect::Postgres,
            "btrim(words.s)",
        ),
        // DataFusion's concat skips NULLs
        (
            "SELECT grad(x * x, x), concat(s, '!') FROM words",
            SqlDialect::Sqlite,
            "(coalesce(words.s, '') || coalesce(",
        ),
        (
            "SELECT grad(x * x, x), concat(s, '!') FROM words",
            SqlDialect::Generic,
            "(coalesce(words.s, '') || coalesce(",
        ),
        (
            "SELECT grad(x * x, x), nvl(s, 'none') FROM words",
            SqlDialect::Postgres,
            "coalesce(words.s, CAST('none' AS VARCHAR))",
        ),
        (
            "SELECT grad(x * x, x), substr(s, 2, 3) FROM words",
            SqlDialect::Sqlite,
            "substr(words.s, 2, 3)",
        ),
        // DataFusion's LIKE escapes with a backslash, DuckDB's only when told
        (
            "SELECT grad(x * x, x) FROM words WHERE s LIKE 'a%'",
            SqlDialect::DuckDb,
            " ESCAPE '\\'",
        ),
        // round(x, n) as DataFusion computes it: round(x * 10^n) / 10^n
        (
            "SELECT grad(round(x, 2) * x, x) FROM words",
            SqlDialect::DuckDb,
            "(round((words.x * 100.0e0)) / 100.0e0)",
        ),
    ];
    for (sql, dialect, expected) in cases {
        let out = rewrite(sql, dialect).await.unwrap();
        assert!(
            out.contains(expected),
            "{dialect}: `{expected}` not in {out}"
        );
    }
}

#[tokio::test]
async fn functions_an_engine_lacks_are_refused() {
    use SqlDialect::{DataFusion, DuckDb, Generic, Postgres, Sqlite};
    let all = &SqlDialect::ALL[..];
    #[rustfmt::skip]
    let cases: [(&str, &[SqlDialect], &str, &[SqlDialect]); 17] = [
        // (statement, dialects refusing it with a message naming .., dialects exporting it)
        ("SELECT grad(x * x, x), upper(s) FROM words",
         &[DuckDb, Postgres, Sqlite, Generic], "function `upper`", &[DataFusion]),
        ("SELECT grad(x * atan2(x, 2.0), x) FROM words",
         &[Generic], "ANSI SQL has no function `atan2`", &[DataFusion, DuckDb, Postgres, Sqlite]),
        ("SELECT grad(x * x, x), reverse(s) FROM words",
         &[Sqlite, Generic], "function `reverse`", &[DataFusion, DuckDb, Postgres]),
        ("SELECT grad(x * x, x), lpad(s, 3, '*') FROM words",
         &[DuckDb, Sqlite, Generic], "function `lpad`", &[DataFusion, Postgres]),
        ("SELECT grad(x * x, x), now() FROM words",
         &[DuckDb, Postgres, Sqlite, Generic], "function `now`", &[DataFusion]),
        ("SELECT grad(x * x, x), bool_and(x > 0) OVER () FROM words",
         &[Sqlite, Generic], "has no aggregate function `bool_and`", &[DataFusion, DuckDb, Postgres]),
        ("SELECT grad(x * x, x), stddev(x) OVER () FROM words",
         &[Sqlite], "SQLite has no aggregate function `stddev`", &[DataFusion, DuckDb, Postgres, Generic]),
        // SQLite and DuckDB count a start below 1 from the end
        ("SELECT grad(x * x, x), substr(s, 0, 2) FROM words",
         &[DuckDb, Sqlite], "start below 1", &[DataFusion, Postgres]),
        // DataFusion drops the fraction of `second`
        ("SELECT grad(x * x, x), date_part('second', ts) FROM words",
         &[DuckDb, Postgres], "only the fields", &[DataFusion]),
        ("SELECT grad(x * x, x), date_part('month', ts) FROM words",
         &[Sqlite, Generic], "function `date_part`", &[DataFusion, DuckDb, Postgres]),
        ("SELECT grad(x * x, x), round(x, k) FROM (SELECT x, 2 AS k FROM words)",
         &[DuckDb, Postgres, Sqlite, Generic], "integer literal `n`", &[DataFusion]),
        // engines write floats as text differently (1e20)
        ("SELECT concat('d=', grad(x * x, x)) FROM words",
         &[DuckDb, Postgres, Sqlite, Generic], "cast of a Float64 value to text", &[DataFusion]),
        ("SELECT grad(x * x, x) FROM words WHERE s LIKE 'a%'",
         &[Sqlite], "LIKE ignores the case", &[DataFusion, DuckDb, Postgres, Generic]),
        ("SELECT grad(x * x, x) FROM words WHERE d > DATE '2024-01-01'",
         &[Sqlite], "no date or time types", &[DataFusion, DuckDb, Postgres, Generic]),
        // the unparser would drop these: refused for DataFusion too
        ("SELECT grad(x * x, x) FROM words WHERE s SIMILAR TO 'a%'",
         all, "SIMILAR TO", &[]),
        ("SELECT grad(x * x, x), (SELECT string_agg(s, ',' ORDER BY s) FROM words) FROM words",
         all, "ORDER BY inside `string_agg", &[]),
        ("SELECT grad(x * x, x), first_value(s) IGNORE NULLS OVER (ORDER BY x) FROM words",
         all, "IGNORE NULLS", &[]),
    ];
    for (sql, refusing, needle, exporting) in cases {
        for &dialect in refusing {
            assert_refused(rewrite(sql, dialect).await, ErrorKind::Unexportable, needle);
        }
        for &dialect in exporting {
            let result = rewrite(sql, dialect).await;
            assert!(result.is_ok(), "{dialect}: {sql}: {}", result.unwrap_err());
        }
    }
    // one sentence naming the function and the dialect
    let err = rewrite("SELECT grad(x * x, x), upper(s) FROM words", Sqlite)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "[unexportable] SQLite has no function `upper` known to mean what DataFusion's \
             does, so a call of it cannot be exported for sqlite"
        ),
        "{err}"
    );
}

/// What the derivative rules write (`cos`, `trunc`, `isnan`, `power`, …, and
/// `f` itself where the rule reuses it) is known to, or lowered for, every
/// dialect's table of functions.
#[test]
fn every_rule_exports_to_every_dialect() {
    let expressions = [
        "exp(x)",
        "ln(x)",
        "log(x)",
        "log(2.0, x)",
        "log(y, x)",
        "log2(x)",
        "log10(x)",
        "sqrt(x)",
        "cbrt(x)",
        "sin(x)",
        "cos(x)",
        "tan(x)",
        "cot(x)",
        "asin(x)",
        "acos(x)",
        "atan(x)",
        "atan2(x, y)",
        "sinh(x)",
        "cosh(x)",
        "tanh(x)",
        "asinh(x)",
        "acosh(x)",
        "atanh(x)",
        "degrees(x)",
        "radians(x)",
        "abs(x)",
        "signum(x) * x",
        "floor(x) * x",
        "ceil(x) * x",
        "round(x) * x",
        "round(x, 2) * x",
        "trunc(x) * x",
        "trunc(x, 1) * x",
        "greatest(x, y)",
        "least(x, y)",
        "CASE WHEN x > y THEN x ELSE y END",
        "coalesce(x, y)",
        "nvl(x, y)",
        "nvl2(x, y, x)",
        "nullif(x, y)",
        "nanvl(x, y)",
        "CAST(x AS INT) * x",
        "TRY_CAST(x AS INT) * x",
        "power(x, y)",
        "power(x, 3)",
        "x % y",
        "x / y",
        "-x * pi()",
    ];
    for dialect in SqlDialect::ALL {
        for e in expressions {
            let result = differentiate_sql(e, "x", dialect);
            assert!(result.is_ok(), "{dialect}: {e}: {}", result.unwrap_err());
        }
    }
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

/// Tables of a relational model, in `ctx`: parameters `p` (row 3 never
/// read by the losses below) and data `d`.
async fn relational_tables(ctx: &SessionContext, duplicate: bool) {
    let p = match duplicate {
        false => "CREATE TABLE p(g INT, val DOUBLE) AS VALUES (1, 2.0), (2, 3.0), (3, 7.0)",
        true => "CREATE TABLE p(g INT, val DOUBLE) AS VALUES (1, 2.0), (1, 3.0), (3, 7.0)",
    };
    for ddl in [
        p,
        "CREATE TABLE d(g INT, x DOUBLE) AS VALUES (1, 1.0), (1, 2.0), (2, 5.0), (2, NULL)",
    ] {
        ctx.sql(ddl).await.unwrap().collect().await.unwrap();
    }
}

async fn rows(ctx: &SessionContext, sql: &str) -> Result<String> {
    let batches = ctx.sql(sql).await?.collect().await?;
    Ok(datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
}

#[tokio::test]
async fn relational_reverse_mode_exports_a_chain_that_plain_datafusion_runs() {
    let cases = [
        // a join, a loss read through a CTE
        "WITH s AS (SELECT sum(d.x * p.val * p.val) AS loss FROM d JOIN p ON p.g = d.g) \
         SELECT p.g, grad((SELECT loss FROM s), p.val) AS dval FROM p ORDER BY p.g",
        // the FROM form, a max per group and an L2 scalar subquery
        "WITH z AS (SELECT d.g, max(d.x * p.val) AS m FROM d JOIN p ON p.g = d.g GROUP BY d.g), \
              s AS (SELECT sum(m * m) + 0.5 * (SELECT sum(val * val) FROM p) AS loss FROM z) \
         SELECT g, val AS dval FROM grad(s, p.val) ORDER BY g",
        // a training step as a new table
        "CREATE TABLE p2 AS SELECT g, val - 0.1 * grad((SELECT avg(d.x * p.val) FROM d \
         JOIN p ON p.g = d.g), val) AS val FROM p",
    ];
    for sql in cases {
        let grad_ctx = datafusion_grad::session_context();
        relational_tables(&grad_ctx, false).await;
        let exported = rewrite_sql(&grad_ctx, sql, SqlDialect::DataFusion)
            .await
            .unwrap();
        assert!(!exported.contains("grad("), "{exported}");
        assert!(
            exported.starts_with("WITH ") || exported.starts_with("CREATE TABLE p2 AS WITH"),
            "{exported}"
        );
        // Run back in DataFusion without datafusion-grad: the same rows.
        let plain = SessionContext::new();
        relational_tables(&plain, false).await;
        let grad_ctx = datafusion_grad::session_context();
        relational_tables(&grad_ctx, false).await;
        let (expected, actual) = match sql.starts_with("CREATE") {
            true => {
                rows(&grad_ctx, sql).await.unwrap();
                rows(&plain, &exported).await.unwrap();
                let check = "SELECT * FROM p2 ORDER BY g";
                (
                    rows(&grad_ctx, check).await.unwrap(),
                    rows(&plain, check).await.unwrap(),
                )
            }
            false => (
                rows(&grad_ctx, sql).await.unwrap(),
                rows(&plain, &exported).await.unwrap(),
            ),
        };
        assert_eq!(expected, actual, "{exported}");
    }
}

#[tokio::test]
async fn exported_gradient_tables_fail_on_duplicate_parameter_rows() {
    let sql = "WITH s AS (SELECT sum(d.x * p.val) AS loss FROM d JOIN p ON p.g = d.g) \
               SELECT p.g, grad((SELECT loss FROM s), p.val) FROM p";
    let grad_ctx = datafusion_grad::session_context();
    relational_tables(&grad_ctx, true).await;
    let exported = rewrite_sql(&grad_ctx, sql, SqlDialect::DataFusion)
        .await
        .unwrap();
    let plain = SessionContext::new();
    relational_tables(&plain, true).await;
    let err = rows(&plain, &exported)
        .await
        .expect_err("duplicates must fail");
    assert!(
        err.to_string()
            .contains("several rows with the same other columns (`p.g`)"),
        "{err}"
    );
}

#[tokio::test]
async fn relational_reverse_mode_export_refusals_are_typed() {
    let ctx = datafusion_grad::session_context();
    relational_tables(&ctx, false).await;
    let sql = "SELECT g, grad((SELECT sum(d.x * p.val) FROM d JOIN p ON p.g = d.g), val) FROM p";
    assert_refused(
        rewrite_sql(&ctx, sql, SqlDialect::Sqlite).await,
        ErrorKind::Unexportable,
        "SQLite has no way to fail a query",
    );
    // A training loop: the gradient table reads the work table.
    let looped = "WITH RECURSIVE train(step, g, val) AS (SELECT 0, g, val FROM p UNION ALL \
                  SELECT step + 1, g, val - 0.1 * grad((SELECT sum(d.x * q.val) FROM d \
                  JOIN train q ON q.g = d.g), val) FROM train WHERE step < 3) \
                  SELECT * FROM train";
    for dialect in [
        SqlDialect::DuckDb,
        SqlDialect::Postgres,
        SqlDialect::DataFusion,
    ] {
        assert_refused(
            rewrite_sql(&ctx, looped, dialect).await,
            ErrorKind::Unexportable,
            "a recursive query",
        );
    }
}

#[tokio::test]
async fn derivatives_through_recursion_export_their_tangent_columns() {
    let sql = "WITH RECURSIVE s(step, x, a, x0) AS (\
               SELECT 0 AS step, x0 AS x, a, x0 FROM (SELECT 0.3 AS x0, 2.7 AS a) i \
               UNION ALL SELECT step + 1, x + 0.05 * a * x * (1 - x), a, x0 FROM s WHERE step < 50) \
               SELECT grad(x, a) AS da, grad(x, x0) AS dx0 FROM s WHERE step = 50";
    let grad_ctx = datafusion_grad::session_context();
    let exported = rewrite_sql(&grad_ctx, sql, SqlDialect::DataFusion)
        .await
        .unwrap();
    assert!(exported.contains("__dfgrad_tangent0_1"), "{exported}");
    let plain = SessionContext::new();
    assert_eq!(
        rows(&grad_ctx, sql).await.unwrap(),
        rows(&plain, &exported).await.unwrap(),
        "{exported}"
    );
    assert_refused(
        rewrite_sql(&grad_ctx, sql, SqlDialect::Sqlite).await,
        ErrorKind::Unexportable,
        "tangents of a derivative through its iterations for sqlite",
    );
    // a loop whose steps aggregate is not printed yet
    let looped = "WITH RECURSIVE p(step, w, lr) AS (\
                  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.1 AS DOUBLE) AS lr UNION ALL \
                  SELECT p.step + 1, p.w - p.lr * avg(grad(power(p.w * d.x - d.y, 2), p.w)), p.lr \
                  FROM p CROSS JOIN (VALUES (1.0, 2.0), (2.0, 4.0)) AS d(x, y) WHERE p.step < 3 \
                  GROUP BY p.step, p.w, p.lr) SELECT grad(power(w - 2, 2), lr) FROM p WHERE step = 3";
    assert_refused(
        rewrite_sql(&grad_ctx, looped, SqlDialect::DuckDb).await,
        ErrorKind::Unexportable,
        "exported where its steps do not aggregate",
    );
    // reverse mode through a loop that aggregates (20 weights: `auto` takes
    // it): the backward recursive query is not printed
    let reverse = "WITH RECURSIVE train(step, w, w0) AS (\
                   SELECT 0, w0 AS w, w0 FROM (SELECT random_tensor(5, 20) AS w0) i UNION ALL \
                   SELECT step + 1, tensor_sub(w, scale(w, 0.1 * avg(d.y))), w0 \
                   FROM train CROSS JOIN (VALUES (1.0), (2.0)) AS d(y) WHERE step < 3 \
                   GROUP BY step, w, w0) \
                   SELECT grad(tensor_total(tensor_mul(w, w)), w0) FROM train WHERE step = 3";
    assert_refused(
        rewrite_sql(&grad_ctx, reverse, SqlDialect::DataFusion).await,
        ErrorKind::Unexportable,
        "cannot export this statement as SQL text",
    );
    // relational reverse mode through such a loop (each data row's weight):
    // not printed either
    let valued =
        "WITH RECURSIVE d(i, x, y, wt) AS (VALUES (1, 0.5, 1.0, 1.0), (2, 1.0, 1.8, 0.5)), \
                  train(step, w) AS (SELECT 0, CAST(0.0 AS DOUBLE) UNION ALL \
                  SELECT step + 1, w - 0.1 * sum(d.wt * (w * d.x - d.y)) \
                  FROM train CROSS JOIN d WHERE step < 3 GROUP BY step, w), \
                  loss AS (SELECT w * w AS loss FROM train WHERE step = 3) \
                  SELECT d.i, grad((SELECT loss FROM loss), d.wt) FROM d";
    rows(&grad_ctx, valued).await.unwrap();
    assert_refused(
        rewrite_sql(&grad_ctx, valued, SqlDialect::DataFusion).await,
        ErrorKind::Unexportable,
        "cannot export a recursive query (WITH RECURSIVE) in a statement that differentiates \
         with respect to a table's rows",
    );
}
