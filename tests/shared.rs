//! Shared subplans (`datafusion_grad::exec::shared`): relational reverse mode
//! computes each forward aggregate once, however often its backward pass
//! reads it. (A result too large for the memory pool: the unit tests of
//! `src/exec/shared.rs`, `tests/unit/exec_shared.rs`.)

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array};
use datafusion::error::Result;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan};
use datafusion::prelude::*;
use datafusion_grad::exec::shared::SharedExec;

/// X (6 x 3) · W (3 x 2) as join + SUM; loss sum(Y²); ∂loss/∂W = 2 XᵀY.
pub(crate) const SETUP: &[&str] = &[
    "CREATE TABLE x AS SELECT n, d, sin(n * 0.37 + d) AS v
       FROM (SELECT value AS n FROM generate_series(0, 5))
       CROSS JOIN (SELECT value AS d FROM generate_series(0, 2))",
    "CREATE TABLE w AS SELECT d, h, cos(d * 1.3 + h) AS val
       FROM (SELECT value AS d FROM generate_series(0, 2))
       CROSS JOIN (SELECT value AS h FROM generate_series(0, 1))",
    "CREATE VIEW mm_loss AS SELECT sum(y * y) AS loss
       FROM (SELECT x.n, w.h, sum(x.v * w.val) AS y FROM x JOIN w ON x.d = w.d
             GROUP BY x.n, w.h)",
];

const GRAD_W: &str = "SELECT d, h, grad((SELECT loss FROM mm_loss), val) AS g FROM w ORDER BY d, h";

/// `2 XᵀY`, in the order of `GRAD_W`.
fn expected() -> Vec<f64> {
    let x = |n: usize, d: usize| (n as f64 * 0.37 + d as f64).sin();
    let w = |d: usize, h: usize| (d as f64 * 1.3 + h as f64).cos();
    let y = |n: usize, h: usize| (0..3).map(|d| x(n, d) * w(d, h)).sum::<f64>();
    let mut g = Vec::new();
    for d in 0..3 {
        for h in 0..2 {
            g.push((0..6).map(|n| 2.0 * x(n, d) * y(n, h)).sum());
        }
    }
    g
}

async fn session() -> Result<SessionContext> {
    let ctx = datafusion_grad::session_context_with_config(
        SessionConfig::new().with_target_partitions(4),
    );
    for sql in SETUP {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(ctx)
}

/// The gradient column of `GRAD_W`'s result.
fn gradients(batches: &[datafusion::arrow::array::RecordBatch]) -> Vec<f64> {
    let mut g = Vec::new();
    for b in batches {
        let col = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap();
        g.extend(col.values().iter().copied());
        assert!(b.column(0).as_any().downcast_ref::<Int64Array>().is_some());
    }
    g
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

/// Per input of a `SharedExec` (told apart by its plan text): how many
/// occurrences read it and how many rows it produced, over all its runs.
fn shared(plan: &Arc<dyn ExecutionPlan>, found: &mut HashMap<String, (usize, usize)>) {
    let mut inputs = plan.children().into_iter().cloned().collect::<Vec<_>>();
    if let Some(s) = plan.downcast_ref::<SharedExec>() {
        let input = s.input();
        let text = displayable(input.as_ref()).indent(false).to_string();
        let rows = input.metrics().and_then(|m| m.output_rows()).unwrap_or(0);
        let entry = found.entry(text).or_insert((0, rows));
        entry.0 += 1;
        if entry.0 == 1 {
            inputs.push(Arc::clone(input));
        }
    }
    for child in &inputs {
        shared(child, found);
    }
}

#[tokio::test]
async fn each_forward_aggregate_is_computed_once() -> Result<()> {
    let ctx = session().await?;
    let plan = ctx.sql(GRAD_W).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    assert_close(&gradients(&batches), &expected());
    let mut found = HashMap::new();
    shared(&plan, &mut found);
    // The loss's aggregate (its value, and the top of the backward pass:
    // one row) and the product's (read by the pass above it and below it:
    // 6 x 2 groups), each computed once: its rows counted once.
    let mut rows: Vec<(usize, usize)> = found
        .iter()
        .filter(|(text, _)| !text.contains("__dfgrad"))
        .map(|(_, &r)| r)
        .collect();
    rows.sort();
    assert!(rows.iter().all(|&(n, _)| n >= 2), "{found:?}");
    let mut produced: Vec<usize> = rows.iter().map(|&(_, r)| r).collect();
    produced.sort();
    assert_eq!(produced, [1, 12], "{found:?}");
    Ok(())
}

/// Two gradient relations of one loss in one statement: the second pass
/// reads the group adjoints the first computed (the product's 6 x 2
/// groups), not its own.
#[tokio::test]
async fn gradients_of_one_loss_share_their_adjoints() -> Result<()> {
    let ctx = session().await?;
    let sql = "SELECT 'w' AS t, d AS i, h AS j, val AS g FROM grad(mm_loss, w.val) \
               UNION ALL SELECT 'x', n, d, v FROM grad(mm_loss, x.v)";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 6 + 18);
    let mut found = HashMap::new();
    shared(&plan, &mut found);
    let adjoints: Vec<(usize, usize)> = found
        .iter()
        .filter(|(text, _)| text.contains("__dfgrad_adj"))
        .map(|(_, &r)| r)
        .collect();
    assert!(adjoints.contains(&(2, 12)), "{found:?}");
    Ok(())
}

/// An average over all rows as the loss (`avg(y²)`, no groups): its
/// count, one row, meets the loss's adjoint by a cross join, not by a
/// left join without keys (a nested loop, in a shared subplan); the
/// gradient is `2 XᵀY / 12`.
#[tokio::test]
async fn an_average_meets_its_count_by_a_cross_join() -> Result<()> {
    let ctx = session().await?;
    let sql = "SELECT d, h, grad((SELECT avg(y * y) FROM (SELECT x.n, w.h, sum(x.v * w.val) AS y \
               FROM x JOIN w ON x.d = w.d GROUP BY x.n, w.h)), val) AS g FROM w ORDER BY d, h";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    // every operator, the shared subplans' outlined on their nodes' lines
    let shown = displayable(plan.as_ref()).indent(false).to_string();
    assert!(!shown.contains("NestedLoopJoinExec"), "{shown}");
    let batches = collect(plan, ctx.task_ctx()).await?;
    let want: Vec<f64> = expected().iter().map(|g| g / 12.0).collect();
    assert_close(&gradients(&batches), &want);
    Ok(())
}

/// `EXPLAIN ANALYZE` outlines a shared subplan with what each of its
/// operators did: the forward product's contraction made the 6 × 2 groups
/// of `Y`; plain `EXPLAIN` (nothing ran) names the operators only.
#[tokio::test]
async fn explain_analyze_shows_what_a_shared_subplans_operators_did() -> Result<()> {
    let ctx = session().await?;
    let text = |batches: &[datafusion::arrow::array::RecordBatch]| {
        datafusion::arrow::util::pretty::pretty_format_batches(batches).map(|t| t.to_string())
    };
    let explained = text(
        &ctx.sql(&format!("EXPLAIN {GRAD_W}"))
            .await?
            .collect()
            .await?,
    )?;
    assert!(explained.contains("(ContractionExec("), "{explained}");
    assert!(!explained.contains("[rows="), "{explained}");
    let analyzed = ctx.sql(&format!("EXPLAIN ANALYZE {GRAD_W}")).await?;
    let analyzed = text(&analyzed.collect().await?)?;
    assert!(
        analyzed.contains("(ContractionExec[rows=12, "),
        "{analyzed}"
    );
    Ok(())
}

/// `EXPLAIN ANALYZE` of a training loop shows the figures of what every
/// iteration ran (each runs a fresh copy of the recursive term, as
/// DataFusion's recursive query does), summed: the group join of the
/// gradients into the loop's rows kept (`WHERE step < 3`) 6 rows in each
/// of three iterations and none in the fourth, which ends the loop; the
/// forward product, a shared subplan over the rows, made its 12 groups in
/// each of the four.
#[tokio::test]
async fn explain_analyze_sums_a_loops_iterations() -> Result<()> {
    let ctx = session().await?;
    let sql = "EXPLAIN ANALYZE WITH RECURSIVE train(step, d, h, val) AS (
          SELECT 0, d, h, val FROM w
          UNION ALL
          SELECT step + 1, d, h, val - 0.1 * grad((
            WITH p AS (SELECT d, h, val FROM train)
            SELECT sum(y * y) FROM (SELECT x.n, p.h, sum(x.v * p.val) AS y
              FROM x JOIN p ON x.d = p.d GROUP BY x.n, p.h)), val)
          FROM train WHERE step < 3)
        SELECT d, h, val FROM train WHERE step = 3";
    let batches = ctx.sql(sql).await?.collect().await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
    assert!(
        text.contains("GroupJoinExec: keep=step@0 < 3, metrics=[output_rows=18, "),
        "{text}"
    );
    assert!(text.contains("(ContractionExec[rows=48, "), "{text}");
    Ok(())
}

/// A loop reads each iteration's rows compacted: a table made by a `CROSS
/// JOIN` of series comes as 100 batches of two rows, and the self-join of
/// the loop's rows took them one by one in each iteration; its probe side
/// now reads one batch per iteration (two iterations join rows).
#[tokio::test]
async fn a_loop_reads_its_rows_compacted() -> Result<()> {
    let config = SessionConfig::new().with_target_partitions(1);
    let ctx = datafusion_grad::session_context_with_config(config);
    ctx.sql(
        "CREATE TABLE p AS SELECT d, h, cos(d * 1.3 + h) AS val
           FROM (SELECT value AS d FROM generate_series(0, 99))
           CROSS JOIN (SELECT value AS h FROM generate_series(0, 1))",
    )
    .await?
    .collect()
    .await?;
    let sql = "EXPLAIN ANALYZE WITH RECURSIVE t(k, d, h, v) AS (
          SELECT 0, d, h, val FROM p
          UNION ALL
          SELECT a.k + 1, a.d, a.h, a.v + b.v FROM t a JOIN t b ON a.d = b.d AND a.h = b.h
          WHERE a.k < 2)
        SELECT count(*) FROM t";
    let batches = ctx.sql(sql).await?.collect().await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
    assert!(text.contains(" input_batches=2, input_rows=400,"), "{text}");
    Ok(())
}
