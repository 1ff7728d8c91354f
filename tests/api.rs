//! The Rust API: the DataFrame API, deep expressions, typed errors and
//! user-registered derivative rules.

use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::*;
use datafusion_grad::engine::call::{Marker, MarkerKind};
use datafusion_grad::engine::{differentiate, Seed};
use datafusion_grad::{Call, ErrorKind, GradError, Partial};

use crate::common::on_big_stack;

async fn context() -> SessionContext {
    let ctx = datafusion_grad::session_context();
    ctx.sql("CREATE TABLE t(x DOUBLE, y DOUBLE) AS VALUES (0.5, 2.0), (-1.0, 3.0), (2.0, -0.5)")
        .await
        .unwrap();
    ctx
}

/// The single Float64 column of `df`'s result.
async fn values(df: DataFrame) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for batch in df.collect().await? {
        let a = batch
            .column(0)
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("a DOUBLE column");
        out.extend((0..a.len()).map(|i| a.value(i)));
    }
    Ok(out)
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[tokio::test]
async fn dataframe_select_filter_aggregate() {
    let ctx = context().await;
    let grad = ctx.udf("grad").unwrap();
    let t = ctx
        .table("t")
        .await
        .unwrap()
        .sort(vec![col("x").sort(true, true)])
        .unwrap();

    // d(x² y)/dx = 2xy
    let df = t
        .clone()
        .select(vec![grad
            .call(vec![col("x") * col("x") * col("y"), col("x")])
            .alias("d")])
        .unwrap();
    assert_close(&values(df).await.unwrap(), &[-6.0, 2.0, -2.0]);

    // in a filter: 2xy > 0
    let df = t
        .clone()
        .filter(
            grad.call(vec![col("x") * col("x") * col("y"), col("x")])
                .gt(lit(0.0)),
        )
        .unwrap()
        .select(vec![col("x")])
        .unwrap();
    assert_close(&values(df).await.unwrap(), &[0.5]);

    // inside an aggregate: avg(d(sin(x) y)/dx) = avg(cos(x) y)
    let df = t
        .clone()
        .aggregate(
            vec![],
            vec![datafusion::functions_aggregate::expr_fn::avg(
                grad.call(vec![sin(col("x")) * col("y"), col("x")]),
            )],
        )
        .unwrap();
    let want = (1.0f64.cos() * 3.0 + 0.5f64.cos() * 2.0 - 2.0f64.cos() * 0.5) / 3.0;
    assert_close(&values(df).await.unwrap(), &[want]);

    // with_column, and the multi-variable struct
    let df = t
        .with_column(
            "g",
            grad.call(vec![col("x") * col("y"), col("x"), col("y")]),
        )
        .unwrap()
        .select(vec![get_field(col("g"), "y")])
        .unwrap();
    assert_close(&values(df).await.unwrap(), &[-1.0, 0.5, 2.0]);
}

/// 4,000 nested operators built through the DataFrame API: the engine walks
/// the DAG with loops, so only DataFusion's own recursion needs a big stack.
/// (DataFusion's typing of the input is quadratic in its depth: 10,000
/// operators took 230-390 s of CI, 4,000 prove the same.)
#[test]
fn deep_expression() {
    const STEPS: usize = 2_000;
    let run = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async {
                let ctx = context().await;
                let grad = ctx.udf("grad").unwrap();
                // e ← e · 0.9999 + sin(x) · y, two operators per step
                let mut f = col("x");
                for _ in 0..STEPS {
                    f = f * lit(0.9999) + sin(col("x")) * col("y");
                }
                let df = ctx
                    .table("t")
                    .await
                    .unwrap()
                    .sort(vec![col("x").sort(true, true)])
                    .unwrap()
                    .select(vec![grad.call(vec![f, col("x")])])
                    .unwrap();
                let got = values(df).await.unwrap();
                let want: Vec<f64> = [(-1.0f64, 3.0f64), (0.5, 2.0), (2.0, -0.5)]
                    .iter()
                    .map(|&(x, y)| {
                        let mut d = 1.0;
                        for _ in 0..STEPS {
                            d = d * 0.9999 + x.cos() * y;
                        }
                        d
                    })
                    .collect();
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                        "{got:?} vs {want:?}"
                    );
                }
            })
    };
    on_big_stack(1 << 30, run);
}

/// Issue 21 (11): a 300-deep composition and a 300-factor product are
/// differentiated through SQL (the product was refused as too large, the
/// composition took ~40 s, with at most 2 binding layers), with the right
/// values; 700 factors are refused with the typed error.
#[test]
fn deep_compositions_and_long_products() {
    // DataFusion recurses over the expressions: a big stack, as dfgrad has.
    on_big_stack(1 << 28, || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(deep_compositions_and_long_products_on_a_big_stack())
    });
}

async fn deep_compositions_and_long_products_on_a_big_stack() {
    let ctx = datafusion_grad::session_context();
    ctx.sql("SET datafusion.sql_parser.recursion_limit = 5000")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let (n, x) = (300, 0.5f64);
    let sql = format!(
        "SELECT grad({}x{}, x) FROM (VALUES ({x:?})) t(x)",
        "sin(".repeat(n),
        ")".repeat(n)
    );
    let (mut s, mut d) = (x, 1.0);
    for _ in 0..n {
        d *= s.cos();
        s = s.sin();
    }
    assert_close(&values(ctx.sql(&sql).await.unwrap()).await.unwrap(), &[d]);

    let product = |n: usize| {
        format!(
            "SELECT grad({}, x) FROM (VALUES (1.0001)) t(x)",
            vec!["x"; n].join(" * ")
        )
    };
    assert_close(
        &values(ctx.sql(&product(300)).await.unwrap()).await.unwrap(),
        &[300.0 * 1.0001f64.powi(299)],
    );
    let (got, message) = error_kind(&ctx, &product(700)).await;
    assert_eq!(got, ErrorKind::DerivativeTooLarge, "{message}");
}

/// The kind of the error `sql` fails with.
async fn error_kind(ctx: &SessionContext, sql: &str) -> (ErrorKind, String) {
    let result = match ctx.sql(sql).await {
        Ok(df) => df.collect().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = result.expect_err(sql);
    let grad_err = GradError::find(&err).unwrap_or_else(|| panic!("not a GradError: {err}"));
    (grad_err.kind(), err.to_string())
}

#[tokio::test]
async fn every_error_kind_is_typed() {
    let ctx = context().await;
    let cases = [
        (
            "SELECT grad(x * random(), x) FROM t",
            ErrorKind::NonDifferentiable,
            "random",
        ),
        (
            "SELECT grad(x * x, x + 1) FROM t",
            ErrorKind::InvalidWrt,
            "t.x + ",
        ),
        (
            "SELECT grad(x) FROM t",
            ErrorKind::WrongArity,
            "got 1 argument",
        ),
        (
            "SELECT grad(avg(x) OVER (ORDER BY y) * y, y) FROM t",
            ErrorKind::NeedsPlanContext,
            "varies within the groups of avg",
        ),
        (
            "SELECT grad(x * x, CAST(x AS VARCHAR)) FROM t",
            ErrorKind::InvalidWrt,
            "argument 2",
        ),
        (
            "SELECT jvp(x * x, x, 'a') FROM t",
            ErrorKind::UnsupportedType,
            "Utf8",
        ),
    ];
    for (sql, kind, piece) in cases {
        let (got, message) = error_kind(&ctx, sql).await;
        assert_eq!(got, kind, "{sql}: {message}");
        assert!(message.contains(piece), "{sql}: `{piece}` not in {message}");
        assert!(message.contains(&format!("[{}]", kind.name())), "{message}");
    }

    // Markers without the analyzer rule rely on `simplify`; when that fails
    // and failed rules are skipped, the marker reaches execution.
    let bare = SessionContext::new();
    let rules = Arc::new(std::sync::RwLock::new(datafusion_grad::Rules::builtin()));
    bare.register_udf(ScalarUDF::new_from_impl(Marker::new(
        MarkerKind::Grad,
        rules,
    )));
    for sql in [
        "CREATE TABLE t(x DOUBLE) AS VALUES (0.5)",
        "SET datafusion.optimizer.skip_failed_rules = true",
    ] {
        bare.sql(sql).await.unwrap().collect().await.unwrap();
    }
    assert_eq!(
        values(bare.sql("SELECT grad(x * x, x) FROM t").await.unwrap())
            .await
            .unwrap(),
        vec![1.0],
        "simplify rewrites a marker without the analyzer rule"
    );
    let (got, message) = error_kind(&bare, "SELECT grad(x * x, 2.0) FROM t").await;
    assert_eq!(got, ErrorKind::MarkerReachedExecution, "{message}");
    assert!(message.contains("grad() reached execution"), "{message}");

    // Written out as plain expression trees, all 700 partials of a
    // 700-factor product have ~490,000 nodes: refused, naming the limit.
    let names: Vec<String> = (0..700).map(|i| format!("x{i}")).collect();
    let fields: Vec<_> = names
        .iter()
        .map(|n| datafusion::arrow::datatypes::Field::new(n, DataType::Float64, false))
        .collect();
    let schema =
        datafusion::common::DFSchema::try_from(datafusion::arrow::datatypes::Schema::new(fields))
            .unwrap();
    let f = names.iter().map(col).reduce(|a, b| a * b).unwrap();
    let wrt: Vec<_> = names
        .iter()
        .map(datafusion::common::Column::from_name)
        .collect();
    let err = differentiate(
        &f,
        &wrt,
        Seed::Grad,
        &schema,
        &datafusion_grad::Rules::builtin(),
    )
    .expect_err("too large to write out");
    let grad_err = GradError::find(&err).expect("a GradError");
    assert_eq!(grad_err.kind(), ErrorKind::DerivativeTooLarge, "{err}");
    assert!(err.to_string().contains("limit 50000"), "{err}");
}

/// `softplus(u) = ln(1 + exp(u))`, a UDF without a built-in derivative rule.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Softplus {
    signature: Signature,
}

impl ScalarUDFImpl for Softplus {
    fn name(&self) -> &str {
        "softplus"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = args.args[0].to_array(args.number_rows)?;
        let a = a.as_any().downcast_ref::<Float64Array>().unwrap();
        let out: Float64Array = a.unary(|u| (1.0 + u.exp()).ln());
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[tokio::test]
async fn user_rule_for_own_udf() {
    let ctx = context().await;
    ctx.register_udf(ScalarUDF::new_from_impl(Softplus {
        signature: Signature::exact(vec![DataType::Float64], Volatility::Immutable),
    }));
    let sql = "SELECT grad(softplus(x * y), x) FROM t ORDER BY x";
    let (kind, message) = error_kind(&ctx, sql).await;
    assert_eq!(kind, ErrorKind::NonDifferentiable);
    assert!(message.contains("softplus"), "{message}");

    // d/du softplus(u) = 1 / (1 + exp(-u)); chain rule gives y / (1 + exp(-xy))
    datafusion_grad::register_rule(&ctx, "softplus", |c: &Call| {
        Ok(vec![Partial::Value(lit(1.0) / (lit(1.0) + exp(-c.arg(0))))])
    })
    .unwrap();
    let got = values(ctx.sql(sql).await.unwrap()).await.unwrap();
    let want: Vec<f64> = [(-1.0f64, 3.0f64), (0.5, 2.0), (2.0, -0.5)]
        .iter()
        .map(|&(x, y)| y / (1.0 + (-x * y).exp()))
        .collect();
    assert_close(&got, &want);
}

/// The iterations a session's `IterationProgress` saw while `sql` ran.
async fn progress_of(sql: &str) -> Result<Vec<(u64, u64)>> {
    use datafusion_grad::exec::iterations::{Iteration, IterationProgress};
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let watch = IterationProgress(Arc::new(move |i: Iteration| {
        log.lock().unwrap().push((i.number, i.rows));
    }));
    let config = SessionConfig::new().with_extension(Arc::new(watch));
    let ctx = datafusion_grad::session_context_with_config(config);
    ctx.sql(sql).await?.collect().await?;
    let seen = seen.lock().unwrap().clone();
    Ok(seen)
}

#[tokio::test]
async fn progress_reports_each_iteration_and_the_rows_before_it() -> Result<()> {
    // two rows per iteration, three iterations with rows, a fourth that ends
    let once = "WITH RECURSIVE s(i, v) AS (
          SELECT 0, 1.0 UNION ALL SELECT 0, 2.0
          UNION ALL
          SELECT i + 1, v * 2 FROM s WHERE i < 3)
        SELECT * FROM s";
    // the same, the work table read twice (our own iteration)
    let twice = "WITH RECURSIVE s(i, v) AS (
          SELECT 0, 1.0 UNION ALL SELECT 0, 2.0
          UNION ALL
          SELECT i + 1, v + (SELECT max(v) FROM s) FROM s WHERE i < 3)
        SELECT * FROM s";
    let expected = vec![(1, 0), (2, 2), (3, 4), (4, 6)];
    assert_eq!(progress_of(once).await?, expected);
    assert_eq!(progress_of(twice).await?, expected);
    Ok(())
}

/// A gradient-descent step as `UPDATE` over an in-memory parameter table
/// (relational reverse mode): the count, and each row moved against the
/// gradient of the loss before the step; a file-backed table is refused.
#[tokio::test]
async fn update_steps_a_parameter_table() -> Result<()> {
    let ctx = datafusion_grad::session_context();
    for sql in [
        "CREATE TABLE p(g INT, val DOUBLE) AS VALUES (1, 2.0), (2, 3.0), (3, 7.0)",
        "CREATE TABLE d(g INT, x DOUBLE) AS VALUES (1, 1.0), (1, 2.0), (2, 5.0)",
        "CREATE VIEW l AS SELECT sum(d.x * p.val * p.val) AS loss FROM d JOIN p ON p.g = d.g",
    ] {
        ctx.sql(sql).await?.collect().await?;
    }
    let step = "UPDATE p SET val = val - 0.01 * grad((SELECT loss FROM l), val)";
    let mut want = [2.0, 3.0, 7.0];
    for _ in 0..3 {
        let counts = ctx.sql(step).await?.collect().await?;
        let count = counts[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::UInt64Array>()
            .expect("a count")
            .value(0);
        assert_eq!(count, 3);
        // ∂/∂val_g = 2 val_g Σ x over g's data rows (3, 5, none)
        for (v, s) in want.iter_mut().zip([3.0, 5.0, 0.0]) {
            *v -= 0.01 * 2.0 * *v * s;
        }
    }
    let got = values(ctx.sql("SELECT val FROM p ORDER BY g").await?).await?;
    assert_close(&got, &want);

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("w.csv");
    std::fs::write(&path, "g,val\n1,2.0\n2,3.0\n")?;
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE w STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        path.display()
    ))
    .await?
    .collect()
    .await?;
    ctx.sql("CREATE VIEW lw AS SELECT sum(d.x * w.val * w.val) AS loss FROM d JOIN w ON w.g = d.g")
        .await?
        .collect()
        .await?;
    let (kind, message) = error_kind(
        &ctx,
        "UPDATE w SET val = val - 0.01 * grad((SELECT loss FROM lw), val)",
    )
    .await;
    assert_eq!(kind, ErrorKind::NeedsPlanContext, "{message}");
    assert!(message.contains("in-memory tables only"), "{message}");
    Ok(())
}

/// A recursive CTE whose first row builds the state from a Parquet table's
/// column and the variable (`tensor_add(init.w0, scale(dir, s))`, issue 48):
/// forward mode follows it, `init.w0` does not depend on `s` (jax.grad of
/// the unrolled loop: 13.478965302991233).
#[tokio::test]
async fn first_row_from_a_parquet_table() -> Result<()> {
    let ctx = context().await;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("init.parquet");
    ctx.sql(&format!(
        "COPY (SELECT tensor([0.5, -0.25, 1.0], 3) AS w0) TO '{}' STORED AS PARQUET",
        file.display()
    ))
    .await?
    .collect()
    .await?;
    ctx.register_parquet(
        "init",
        file.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await?;
    let sql = "WITH RECURSIVE train(step, w, s) AS (
          SELECT 0, tensor_add(init.w0, scale(tensor([1.0, 2.0, 3.0], 3), s)), s
          FROM init CROSS JOIN (SELECT 0.1 AS s) h
          UNION ALL
          SELECT step + 1, tensor_add(w, scale(tensor_tanh(w), 0.1)), s FROM train WHERE step < 5)
        SELECT grad(tensor_total(tensor_mul(w, w)), s) FROM train WHERE step = 5";
    assert_close(&values(ctx.sql(sql).await?).await?, &[13.478965302991233]);
    // The same in the DataFrame API: the marker over the CTE's columns.
    let df = ctx
        .sql(
            "WITH RECURSIVE train(step, w, s) AS (
                SELECT 0, tensor_add(init.w0, scale(tensor([1.0, 2.0, 3.0], 3), s)), s
                FROM init CROSS JOIN (SELECT 0.1 AS s) h
                UNION ALL
                SELECT step + 1, tensor_add(w, scale(tensor_tanh(w), 0.1)), s
                FROM train WHERE step < 5)
              SELECT w, s FROM train WHERE step = 5",
        )
        .await?;
    let grad = ctx.udf("grad")?;
    let total = ctx.udf("tensor_total")?;
    let mul = ctx.udf("tensor_mul")?;
    let f = total.call(vec![mul.call(vec![col("w"), col("w")])]);
    let df = df.select(vec![grad.call(vec![f, col("s")])])?;
    assert_close(&values(df).await?, &[13.478965302991233]);
    Ok(())
}

/// Reverse mode through a training loop whose step averages the fields of
/// one `grad(loss, w, b)` (a tensor and a number): one reverse sweep pulls
/// both aggregates' cotangents back (one contribution set in the backward
/// plan, not one per aggregate), with forward mode's numbers.
#[tokio::test]
async fn reverse_mode_pulls_the_fields_of_one_grad_back_in_one_sweep() -> Result<()> {
    let ctx = datafusion_grad::session_context();
    ctx.sql(
        "CREATE TABLE tr AS SELECT tensor([sin(value * 1.0), cos(value * 0.7)], 2) AS x, \
         sin(value * 0.3) AS y FROM generate_series(1, 20)",
    )
    .await?
    .collect()
    .await?;
    let query = "WITH RECURSIVE train(step, w, b, w0) AS ( \
        SELECT 0, w0 AS w, CAST(0.1 AS DOUBLE), w0 FROM (SELECT tensor([0.2, -0.1], 2) AS w0) i \
        UNION ALL \
        SELECT step + 1, tensor_sub(w, scale(tensor_avg(g['w']), 0.5)), b - 0.5 * avg(g['b']), w0 \
        FROM (SELECT step, w, b, w0, grad(power(tanh(dot(w, x) + b) - y, 2), w, b) AS g \
              FROM train CROSS JOIN tr WHERE step < 5) \
        GROUP BY step, w, b, w0) \
      SELECT tensor_total(grad(tensor_total(tensor_mul(w, w)) + b * b, w0)) AS g, \
             tensor_total(tensor_mul(grad(tensor_total(tensor_mul(w, w)) + b * b, w0), tensor([1.0, -2.0], 2))) AS h \
      FROM train WHERE step = 5";
    let mut got = Vec::new();
    for mode in ["forward", "reverse"] {
        ctx.sql(&format!("SET datafusion_grad.recursion_mode = '{mode}'"))
            .await?
            .collect()
            .await?;
        let df = ctx.sql(query).await?;
        let batches = df.collect().await?;
        let col = |i: usize| -> f64 {
            let a = batches[0].column(i).as_any().downcast_ref::<Float64Array>();
            a.expect("a DOUBLE column").value(0)
        };
        got.push((col(0), col(1)));
    }
    let (forward, reverse) = (got[0], got[1]);
    assert!(forward.0 != 0.0 && forward.1 != 0.0, "{forward:?}");
    assert_close(&[reverse.0, reverse.1], &[forward.0, forward.1]);
    let explain = ctx
        .sql(&format!("EXPLAIN VERBOSE {query}"))
        .await?
        .collect()
        .await?;
    let text: String = explain
        .iter()
        .map(|b| format!("{:?}", b.column(1)))
        .collect();
    assert!(text.contains("__dfgrad_contribution0_"), "no backward step");
    assert!(
        !text.contains("__dfgrad_contribution1_"),
        "a sweep per aggregate"
    );
    Ok(())
}
