//! Gradients through aggregates and window aggregates against central finite
//! differences: every aggregate rule (sum, avg, count, var/stddev both kinds,
//! covar both kinds, corr, min, max, tensor_sum, tensor_avg), nonlinear
//! functions of aggregates, and window aggregates, each over several
//! row-wise arguments and evaluation points, with respect to a GROUP BY key
//! and to a prepared statement's parameter.

use datafusion::arrow::array::{Array, Float64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;

use crate::common::numbers::{central, close, H};

/// Aggregates of the row-wise argument `{e}`, grouped by `g` (and `w`).
const AGGREGATES: &[&str] = &[
    "sum({e})",
    "avg({e})",
    "count({e})",
    "var_samp({e})",
    "var_pop({e})",
    "stddev({e})",
    "stddev_pop({e})",
    "covar_samp({e}, x)",
    "covar_pop(y, {e})",
    "corr({e}, y)",
    "corr(x, {e})",
    "corr({e}, {e} * {e})",
    "min({e})",
    "max({e})",
    "sqrt(avg({e} * {e}))",
    "ln(sum(exp({e})))",
    "avg({e}) / avg(x + 3)",
    "var_pop({e}) * avg({e})",
    "sum({e}) FILTER (WHERE x > 0)",
    "tensor_total(tensor_mul(tensor_sum(tensor_add(scale(tensor([1.0, -0.5], 2), {e}), \
     scale(tensor([0.3, 2.0], 2), x * {e}))), tensor_avg(scale(tensor([1.5, 0.25], 2), \
     sin({e}) + y))))",
];

/// Window aggregates of `{e}`; the variable is constant within each partition.
const WINDOWS: &[&str] = &[
    "avg({e}) OVER (PARTITION BY g, w)",
    "sum({e}) OVER (PARTITION BY g, w ORDER BY x)",
    "stddev({e}) OVER (PARTITION BY g, w)",
    "exp(avg({e}) OVER (PARTITION BY g, w)) * w",
];

/// Row-wise arguments in the variable `w` and the columns `x`, `y`.
const ARGUMENTS: &[&str] = &[
    "w * x",
    "sin(w * x) + w",
    "power(w - x, 2)",
    "exp(w * x / 4) - y",
    "w * w * x - y",
];

/// Evaluation points.
const POINTS: &[f64] = &[-0.7, 0.45, 1.3];

fn column(batches: &[RecordBatch], name: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for batch in batches {
        let array = batch.column_by_name(name).expect("column");
        let values = array
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("Float64");
        out.extend((0..values.len()).map(|i| values.is_valid(i).then(|| values.value(i))));
    }
    out
}

/// Column `name` of the last of the `;`-separated statements `sql`.
async fn rows(ctx: &SessionContext, sql: &str, name: &str) -> Vec<Option<f64>> {
    let mut batches = Vec::new();
    for statement in sql.split("; ") {
        batches = ctx
            .sql(statement)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    column(&batches, name)
}

/// `f` with the identifier `w` replaced by `by`.
fn replace_w(f: &str, by: &str) -> String {
    let chars: Vec<char> = f.chars().collect();
    let word = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric() || *c == '_');
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        let alone = !word(i.checked_sub(1).and_then(|j| chars.get(j))) && !word(chars.get(i + 1));
        match (c, alone) {
            ('w', true) => out.push_str(by),
            _ => out.push(*c),
        }
    }
    out
}

/// Checks `grad(f, w)` against finite differences of `f` for each template
/// and argument; `query(f, with_grad, w)` is the SQL. Returns the number of
/// values compared.
async fn check(
    ctx: &SessionContext,
    templates: &[&str],
    query: impl Fn(&str, bool, f64) -> String,
) -> usize {
    let mut compared = 0;
    let mut failures = Vec::new();
    for template in templates {
        for arg in ARGUMENTS {
            let f = template.replace("{e}", &format!("({arg})"));
            for &w in POINTS {
                let d = rows(ctx, &query(&f, true, w), "d").await;
                let at = |w| {
                    let sql = query(&f, false, w);
                    async move { rows(ctx, &sql, "f").await }
                };
                let (p, m) = (at(w + H).await, at(w - H).await);
                let (p2, m2) = (at(w + 2.0 * H).await, at(w - 2.0 * H).await);
                for i in 0..d.len() {
                    let (Some(d), Some(p), Some(m), Some(p2), Some(m2)) =
                        (d[i], p[i], m[i], p2[i], m2[i])
                    else {
                        // NULL derivative exactly where f is NULL
                        assert_eq!(
                            d[i].is_none(),
                            p[i].is_none() && m[i].is_none(),
                            "{f} at w={w}"
                        );
                        continue;
                    };
                    let Some(fd) = central(p, m, p2, m2, 1e-5) else {
                        continue;
                    };
                    compared += 1;
                    if !close(d, fd, 1e-5) {
                        failures.push(format!(
                            "{f} at w={w}, row {i}: grad {d}, finite difference {fd}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    compared
}

async fn context() -> SessionContext {
    let ctx = datafusion_grad::session_context();
    ctx.sql(
        "CREATE TABLE t AS SELECT CAST(value % 3 AS INT) AS g, \
         sin(value * 1.7) * 2 AS x, \
         CASE WHEN value % 7 = 0 THEN NULL ELSE cos(value * 0.9) END AS y \
         FROM generate_series(1, 15)",
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    ctx
}

/// `f` (and `grad(f, w)` if `with_grad`) per group `g`, with `w` a GROUP BY key.
fn grouped_query(f: &str, with_grad: bool, w: f64) -> String {
    let d = if with_grad {
        format!(", grad({f}, w) AS d")
    } else {
        String::new()
    };
    format!(
        "SELECT g, CAST({f} AS DOUBLE) AS f{d} FROM t CROSS JOIN (SELECT CAST({w:?} AS DOUBLE) AS w) p \
         GROUP BY g, w ORDER BY g"
    )
}

/// `f` (and `grad(f, w)` if `with_grad`) per row, `w` a column of every row.
fn window_query(f: &str, with_grad: bool, w: f64) -> String {
    let d = if with_grad {
        format!(", grad({f}, w) AS d")
    } else {
        String::new()
    };
    format!(
        "SELECT g, x, CAST({f} AS DOUBLE) AS f{d} FROM t CROSS JOIN (SELECT CAST({w:?} AS DOUBLE) AS w) p \
         ORDER BY g, x"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregates_match_finite_differences() {
    let ctx = context().await;
    let compared = check(&ctx, AGGREGATES, grouped_query).await;
    // 19 templates x 5 arguments x 3 points x 3 groups, less kinks and NULLs
    assert!(compared >= 500, "only {compared} values compared");
}

#[tokio::test(flavor = "multi_thread")]
async fn window_aggregates_match_finite_differences() {
    let ctx = context().await;
    let compared = check(&ctx, WINDOWS, window_query).await;
    // 4 templates x 5 arguments x 3 points x 15 rows
    assert!(compared >= 700, "only {compared} values compared");
}

/// The aggregate and window templates differentiated with respect to a
/// prepared statement's parameter `$1` (`EXECUTE`d at each point), against
/// finite differences of `f` with the parameter's value as a column.
#[tokio::test(flavor = "multi_thread")]
async fn parameters_match_finite_differences() {
    let ctx = context().await;
    let statement = std::sync::atomic::AtomicUsize::new(0);
    let prepared = |select: String, w: f64| {
        let n = statement.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("PREPARE q{n}(DOUBLE) AS {select}; EXECUTE q{n}({w:?})")
    };
    let compared = check(&ctx, AGGREGATES, |f, with_grad, w| match with_grad {
        true => prepared(
            format!(
                "SELECT g, grad({}, $1) AS d FROM t GROUP BY g ORDER BY g",
                replace_w(f, "$1")
            ),
            w,
        ),
        false => grouped_query(f, false, w),
    })
    .await;
    assert!(compared >= 500, "only {compared} values compared");
    let windows: Vec<String> = WINDOWS
        .iter()
        .map(|t| t.replace("PARTITION BY g, w", "PARTITION BY g"))
        .collect();
    let windows: Vec<&str> = windows.iter().map(String::as_str).collect();
    let compared = check(&ctx, &windows, |f, with_grad, w| match with_grad {
        true => prepared(
            format!(
                "SELECT g, x, grad({}, $1) AS d FROM t ORDER BY g, x",
                replace_w(f, "$1")
            ),
            w,
        ),
        false => window_query(f, false, w),
    })
    .await;
    assert!(compared >= 700, "only {compared} values compared");
}

/// Scalar subqueries that use the variable `v` (an outer column) as a value,
/// in `f` around them.
const SUBQUERIES: &[&str] = &[
    "(SELECT avg(x * {v}) FROM t)",
    "3 * (SELECT sum(x * {v} + y) FROM t) + sin({v})",
    "(SELECT avg(x) * {v} FROM t) - exp({v})",
    "(SELECT sum(y * {v}) FROM t WHERE g = 1) * 2 + {v} * {v}",
    "(SELECT var_pop(x + y) * {v} FROM t) + {v}",
    "(SELECT sum(x * {v}) FROM t) / 4 + {v} * {v} * {v}",
];

/// Gradients through scalar subqueries (differentiated inside) against
/// finite differences of `f` with the variable written as a literal (an
/// uncorrelated subquery DataFusion runs; the correlated `f` itself is a
/// shape DataFusion 55 cannot execute).
#[tokio::test(flavor = "multi_thread")]
async fn subqueries_match_finite_differences() {
    let ctx = &context().await;
    let mut compared = 0;
    let mut failures = Vec::new();
    for template in SUBQUERIES {
        for &v in POINTS {
            let f = template.replace("{v}", "p.v");
            let sql =
                format!("SELECT grad({f}, p.v) AS d FROM (SELECT CAST({v:?} AS DOUBLE) AS v) AS p");
            let d = rows(ctx, &sql, "d").await[0].expect("a derivative");
            let at = |v: f64| {
                let sql = format!(
                    "SELECT CAST({} AS DOUBLE) AS f",
                    template.replace("{v}", &format!("CAST({v:?} AS DOUBLE)"))
                );
                async move { rows(ctx, &sql, "f").await[0].expect("a value") }
            };
            let (p, m) = (at(v + H).await, at(v - H).await);
            let (p2, m2) = (at(v + 2.0 * H).await, at(v - 2.0 * H).await);
            let Some(fd) = central(p, m, p2, m2, 1e-5) else {
                continue;
            };
            compared += 1;
            if !close(d, fd, 1e-5) {
                failures.push(format!(
                    "{template} at v={v}: grad {d}, finite difference {fd}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // 6 templates x 3 points
    assert!(compared >= 17, "only {compared} values compared");
}
