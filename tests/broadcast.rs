//! Broadcast aggregation (`datafusion_grad::exec::broadcast_aggregate`): every query gives the
//! same rows with the rule (our session) as in a stock DataFusion session,
//! and the rule replaces exactly the aggregates whose keys are left columns
//! of a cross join.

use datafusion::arrow::array::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::prelude::*;

const SETUP: &[&str] = &[
    // The broadcast side: duplicate keys, NULL keys, a string key.
    "CREATE TABLE l(k INT, w DOUBLE, s VARCHAR) AS VALUES
        (1, 0.5, 'a'), (1, 0.5, 'a'), (2, -1.5, NULL), (NULL, 2.0, 'b'),
        (3, 0.25, NULL), (NULL, 2.0, 'b'), (4, -0.0, 'a')",
    // The data side: 20,000 rows over several partitions.
    "CREATE TABLE r AS SELECT
        CAST(value % 97 AS DOUBLE) / 50.0 - 1.0 AS x,
        sin(value * 1.7) AS y,
        CAST(value % 3 AS INT) AS g
     FROM generate_series(1, 20000)",
];

/// (query, whether the rule must replace an aggregate in it)
const QUERIES: &[(&str, bool)] = &[
    // the aggregate read by a join (its final step stays DataFusion's)
    (
        "SELECT a.k, a.s, l.w FROM (SELECT k, sum(x) AS s FROM l CROSS JOIN r GROUP BY k) a
         JOIN l ON a.k = l.k",
        true,
    ),
    // tensor keys (grouped by their row encoding, given back as they are)
    (
        "SELECT v, k, sum(x * w), count(*) FROM (SELECT k, w, make_array(w, -w) AS v FROM l)
         CROSS JOIN r GROUP BY v, k",
        true,
    ),
    (
        "SELECT v, s, sum(x * w) FROM (SELECT s, w,
             arrow_cast(make_array(w, w * w, k), 'FixedSizeList(3, Float64)') AS v FROM l)
         CROSS JOIN r GROUP BY v, s",
        true,
    ),
    (
        "SELECT k, w, sum(w * x), avg(y - w), count(*), min(x * w), max(y),
                var_samp(x * w), stddev_pop(y), median(x)
         FROM l CROSS JOIN r GROUP BY k, w",
        true,
    ),
    (
        "SELECT k, sum(x) FILTER (WHERE y > w), count(*) FILTER (WHERE g = 1), avg(w)
         FROM l CROSS JOIN r GROUP BY k",
        true,
    ),
    (
        "SELECT s, k, sum(x * y * w) FROM l CROSS JOIN r WHERE r.g <> 2 GROUP BY s, k",
        true,
    ),
    (
        "SELECT w, sum(x) FROM l CROSS JOIN r WHERE l.w > 0 GROUP BY w HAVING sum(x) > -1e9",
        true,
    ),
    (
        "SELECT k, sum((w * x - y) * (w * x - y)), avg((w * x - y) * x)
         FROM l CROSS JOIN r GROUP BY k",
        true,
    ),
    // Constant keys (one parameter row: DataFusion aggregates in sorted
    // mode), scalar and tensor, also with a filter that drops every row.
    (
        "SELECT w, b, sum(x * w + b), avg(y), count(*)
         FROM (SELECT CAST(0.5 AS DOUBLE) AS w, CAST(-1.0 AS DOUBLE) AS b) p
         CROSS JOIN r GROUP BY w, b",
        true,
    ),
    (
        "SELECT v, sum(x), max(y) FROM (SELECT make_array(0.5, 1.5) AS v) p
         CROSS JOIN r GROUP BY v",
        true,
    ),
    (
        "SELECT w, sum(x) FROM (SELECT 2.0 AS w) p CROSS JOIN r WHERE x > 1e9 GROUP BY w",
        true,
    ),
    // With no column of `r` needed, DataFusion puts the side it estimates
    // smaller on the left, so the key comes from the right: not replaced.
    (
        "SELECT k, count(*) FROM l CROSS JOIN (SELECT * FROM r WHERE x > 1e9) AS e GROUP BY k",
        false,
    ),
    (
        "SELECT k, count(*), sum(x) FROM l CROSS JOIN (SELECT * FROM r WHERE x > 1e9) AS e
         GROUP BY k",
        true,
    ),
    (
        "SELECT k, sum(x) FROM l CROSS JOIN r WHERE l.w > 1e9 GROUP BY k",
        true,
    ),
    (
        "SELECT k, count(*) FROM (SELECT * FROM l WHERE w > 1e9) AS e CROSS JOIN r GROUP BY k",
        false,
    ),
    // Not replaced: a key computed from the left side, a key from the right
    // side, no keys at all.
    (
        "SELECT k + 1, sum(x) FROM l CROSS JOIN r GROUP BY k + 1",
        false,
    ),
    ("SELECT g, sum(x * w) FROM l CROSS JOIN r GROUP BY g", false),
    ("SELECT sum(x * w) FROM l CROSS JOIN r", false),
    // Values computed from the left row alone (computed once per row), a
    // volatile function beside them (computed per joined row), NULL left
    // values, and a left-only value that fails to compute for some rows
    // but is never read by them.
    (
        "SELECT k, sum(x * ww), avg(ww + y), count(*) FILTER (WHERE random() < 2.0),
                sum(x) FILTER (WHERE wk > 0)
         FROM (SELECT k, w * w + 1.0 AS ww, CAST(k AS DOUBLE) * w AS wk, x, y
               FROM l CROSS JOIN r)
         GROUP BY k",
        true,
    ),
    (
        "SELECT s, k, sum(CASE WHEN k = 2 THEN x ELSE 10 / (k - 2) END)
         FROM l CROSS JOIN r GROUP BY s, k",
        true,
    ),
    // A gradient-descent loop written by hand: the training-loop shape.
    (
        "WITH RECURSIVE fit(step, w, b) AS (
           SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b
           UNION ALL
           SELECT step + 1, w - 0.3 * avg(2 * (w * x + b - y) * x),
                  b - 0.3 * avg(2 * (w * x + b - y))
           FROM fit CROSS JOIN r WHERE step < 30 GROUP BY step, w, b)
         SELECT * FROM fit",
        true,
    ),
];

async fn session(with_rule: bool, partitions: usize) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let ctx = if with_rule {
        datafusion_grad::session_context_with_config(config)
    } else {
        SessionContext::new_with_config(config)
    };
    for sql in SETUP {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(ctx)
}

/// The rows of `batches`, sorted (by their cells with floats to 6 digits).
fn rows(batches: &[RecordBatch]) -> Result<Vec<Vec<ScalarValue>>> {
    let mut out = vec![];
    for batch in batches {
        for i in 0..batch.num_rows() {
            let row = batch
                .columns()
                .iter()
                .map(|c| ScalarValue::try_from_array(c, i))
                .collect::<Result<Vec<_>>>()?;
            out.push(row);
        }
    }
    let key = |row: &Vec<ScalarValue>| -> String {
        let cells: Vec<String> = row
            .iter()
            .map(|v| match v {
                ScalarValue::Float64(Some(x)) => format!("{:.5e}", x + 0.0),
                other => other.to_string(),
            })
            .collect();
        cells.join(" | ")
    };
    out.sort_by_cached_key(key);
    Ok(out)
}

/// Same rows; floats equal to 1e-10 relative (summation order differs
/// between DataFusion's grouped and ungrouped accumulators).
fn assert_same(got: &[Vec<ScalarValue>], want: &[Vec<ScalarValue>], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        let same = g.len() == w.len()
            && g.iter().zip(w).all(|(a, b)| match (a, b) {
                (ScalarValue::Float64(Some(a)), ScalarValue::Float64(Some(b))) => {
                    (a - b).abs() <= 1e-10 * a.abs().max(b.abs()) || a == b
                }
                _ => a == b,
            });
        assert!(same, "{context}: row {g:?} vs {w:?}");
    }
}

async fn plan_text(ctx: &SessionContext, sql: &str) -> Result<String> {
    let batches = ctx.sql(&format!("EXPLAIN {sql}")).await?.collect().await?;
    Ok(datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
}

#[tokio::test]
async fn same_rows_as_stock_datafusion() -> Result<()> {
    for partitions in [1, 3] {
        let ours = session(true, partitions).await?;
        let stock = session(false, partitions).await?;
        for (sql, replaced) in QUERIES {
            let plan = plan_text(&ours, sql).await?;
            assert_eq!(
                plan.contains("BroadcastAggregateExec"),
                *replaced,
                "{partitions} partitions, {sql}\n{plan}"
            );
            let got = rows(&ours.sql(sql).await?.collect().await?)?;
            let want = rows(&stock.sql(sql).await?.collect().await?)?;
            assert_same(&got, &want, &format!("{partitions} partitions: {sql}"));
        }
    }
    Ok(())
}

/// `corr` keeps a different intermediate state in its ungrouped and its
/// groups accumulator (DataFusion's final `GROUP BY` merges the groups one),
/// so a partial aggregate with it is left to DataFusion; computed whole
/// (one partition, mode `Single`) it is replaced. Same rows either way.
#[tokio::test]
async fn aggregates_with_a_groups_state_of_their_own() -> Result<()> {
    let sql = "SELECT k, corr(x * w, y), covar_pop(x, y * w), approx_distinct(g), bool_and(x > w),
                      bit_xor(g), sum(x)
               FROM l CROSS JOIN r GROUP BY k";
    for (partitions, replaced) in [(1, true), (3, false)] {
        let ours = session(true, partitions).await?;
        let stock = session(false, partitions).await?;
        let plan = plan_text(&ours, sql).await?;
        assert_eq!(
            plan.contains("BroadcastAggregateExec"),
            replaced,
            "{partitions} partitions\n{plan}"
        );
        let got = rows(&ours.sql(sql).await?.collect().await?)?;
        let want = rows(&stock.sql(sql).await?.collect().await?)?;
        assert_same(&got, &want, &format!("{partitions} partitions: {sql}"));
    }
    Ok(())
}

#[tokio::test]
async fn partial_and_single_modes() -> Result<()> {
    let sql = "SELECT k, sum(x) FROM l CROSS JOIN r GROUP BY k";
    // several partitions: the partial and the final aggregate in one
    // operator, which merges its partitions' accumulators
    let many = plan_text(&session(true, 3).await?, sql).await?;
    assert!(
        many.contains("BroadcastAggregateExec: mode=Single")
            && many.contains("merging 3 partitions")
            && !many.contains("AggregateExec: mode=Final"),
        "{many}"
    );
    let one = plan_text(&session(true, 1).await?, sql).await?;
    assert!(one.contains("BroadcastAggregateExec: mode=Single"), "{one}");
    // under a join, which reads the final aggregate's partitions as they
    // are: only the partial aggregate is replaced
    let joined =
        "SELECT a.k, a.s, l.w FROM (SELECT k, sum(x) AS s FROM l CROSS JOIN r GROUP BY k) a
                  JOIN l ON a.k = l.k";
    let plan = plan_text(&session(true, 3).await?, joined).await?;
    assert!(
        plan.contains("BroadcastAggregateExec: mode=Partial")
            && plan.contains("AggregateExec: mode=FinalPartitioned"),
        "{plan}"
    );
    Ok(())
}

#[tokio::test]
async fn gradient_through_the_aggregate_uses_the_broadcast_plan() -> Result<()> {
    let ctx = session(true, 2).await?;
    let sql = "SELECT w, grad(avg(power(w * x - y, 2)), w) AS g, avg(2 * (w * x - y) * x) AS h
               FROM l CROSS JOIN r GROUP BY w";
    let plan = plan_text(&ctx, sql).await?;
    assert!(plan.contains("BroadcastAggregateExec"), "{plan}");
    let got = rows(&ctx.sql(sql).await?.collect().await?)?;
    assert_eq!(got.len(), 5);
    for row in got {
        assert_same(
            &[vec![row[1].clone()]],
            &[vec![row[2].clone()]],
            "grad vs hand",
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_setting_turns_it_off() -> Result<()> {
    let ctx = session(true, 2).await?;
    let sql = "SELECT k, sum(x) FROM l CROSS JOIN r GROUP BY k";
    assert!(plan_text(&ctx, sql)
        .await?
        .contains("BroadcastAggregateExec"));
    ctx.sql("SET datafusion_grad.broadcast_aggregate = false")
        .await?
        .collect()
        .await?;
    let plan = plan_text(&ctx, sql).await?;
    assert!(!plan.contains("BroadcastAggregateExec"), "{plan}");
    assert!(plan.contains("AggregateExec: mode=Partial"), "{plan}");
    Ok(())
}

#[tokio::test]
async fn explain_analyze_reports_rows() -> Result<()> {
    let ctx = session(true, 2).await?;
    let batches = ctx
        .sql("EXPLAIN ANALYZE SELECT k, sum(x) FROM l CROSS JOIN r GROUP BY k")
        .await?
        .collect()
        .await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
    let line = text
        .lines()
        .find(|l| l.contains("BroadcastAggregateExec"))
        .expect("the operator is in the plan");
    assert!(line.contains("output_rows="), "{line}");
    Ok(())
}
