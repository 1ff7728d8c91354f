//! Reverse mode through training loops with checkpoints
//! (`datafusion_grad::exec::history`): the derivative is the same whichever
//! iterations are kept (`checkpoint_every` 0, 1, k), the same as forward
//! mode's, over several trajectories, at one iteration or several, on one
//! partition or several; by default about √(2T) iterations are kept and
//! each is replayed at most once for a derivative at one iteration.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::error::Result;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::*;

/// Our session with `partitions` target partitions and the data: `d`
/// (training) and `v` (validation), each row a 3-element tensor and a
/// target.
async fn session(partitions: usize) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let ctx = datafusion_grad::session_context_with_config(config);
    for (name, rows, phase) in [("d", 90, 0.0), ("v", 25, 0.5)] {
        ctx.sql(&format!(
            "CREATE TABLE {name} AS SELECT
               tensor([sin(value * 0.7 + {phase}), cos(value * 1.3), sin(value * 0.11)], 3) AS x,
               sin(value * 0.37 + {phase}) AS y
             FROM generate_series(1, {rows})"
        ))
        .await?
        .collect()
        .await?;
    }
    Ok(ctx)
}

/// A loop of `steps` steps from two initial weights (two trajectories).
fn training(steps: usize) -> String {
    format!(
        "WITH RECURSIVE train(step, w, w0) AS (
           SELECT 0, w0 AS w, w0 FROM (
             SELECT tensor([0.1, 0.2, -0.1], 3) AS w0
             UNION ALL SELECT tensor([-0.3, 0.05, 0.2], 3)) i
           UNION ALL
           SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)), 0.4)), w0
           FROM train CROSS JOIN d WHERE step < {steps} GROUP BY step, w, w0)"
    )
}

/// The gradients of the validation loss after `steps` steps (and, with
/// `also`, after `also` steps: each its own backward pass), per trajectory.
fn gradients(steps: usize, also: Option<usize>) -> String {
    let at = match also {
        Some(a) => format!("step IN ({a}, {steps})"),
        None => format!("step = {steps}"),
    };
    format!(
        "{} SELECT step, w0, grad(avg(power(tanh(dot(w, v.x)) - v.y, 2)), w0) AS g
         FROM train CROSS JOIN v WHERE {at} GROUP BY step, w0",
        training(steps)
    )
}

async fn set(ctx: &SessionContext, setting: &str, value: &str) -> Result<()> {
    ctx.sql(&format!("SET datafusion_grad.{setting} = {value}"))
        .await?
        .collect()
        .await?;
    Ok(())
}

/// The rows of `sql`: (step, first element of w0, the gradient), sorted.
async fn rows(ctx: &SessionContext, sql: &str) -> Result<Vec<(i64, f64, Vec<f64>)>> {
    let mut rows = Vec::new();
    for batch in ctx.sql(sql).await?.collect().await? {
        let step = datafusion::arrow::compute::cast(batch.column(0), &DataType::Int64)?;
        let step = step.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let w0 = batch.column(1).as_fixed_size_list();
        let g = batch.column(2).as_fixed_size_list();
        for r in 0..batch.num_rows() {
            let first = w0.value(r).as_primitive::<Float64Type>().value(0);
            let values = g.value(r);
            let values = values.as_primitive::<Float64Type>();
            assert_eq!(values.null_count(), 0, "{sql}");
            rows.push((step.value(r), first, values.values().to_vec()));
        }
    }
    rows.sort_by(|a, b| (a.0, a.1).partial_cmp(&(b.0, b.1)).unwrap());
    Ok(rows)
}

fn close(a: &[(i64, f64, Vec<f64>)], b: &[(i64, f64, Vec<f64>)], tolerance: f64) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(r, s)| {
            r.0 == s.0
                && r.1 == s.1
                && r.2
                    .iter()
                    .zip(&s.2)
                    .all(|(x, y)| (x - y).abs() <= tolerance * x.abs().max(y.abs()).max(1e-3))
        })
}

/// `EXPLAIN ANALYZE` of `sql`, as text.
async fn analyzed(ctx: &SessionContext, sql: &str) -> Result<String> {
    let plan: Arc<dyn ExecutionPlan> = ctx.sql(sql).await?.create_physical_plan().await?;
    datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let shown = DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(false)
        .to_string();
    Ok(shown
        .lines()
        .map(|l| l.trim().to_string())
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The value of metric `name` in the line of `operator` in `shown`, where
/// the metrics are shown with the plan.
fn metric(shown: &str, operator: &str, name: &str) -> Option<usize> {
    let line = shown.lines().find(|l| l.starts_with(operator))?;
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[tokio::test]
async fn every_spacing_of_checkpoints_gives_the_same_derivative() -> Result<()> {
    for partitions in [1, 3] {
        let ctx = session(partitions).await?;
        for (steps, also) in [(150, None), (97, Some(40)), (1, None)] {
            let sql = gradients(steps, also);
            set(&ctx, "recursion_mode", "'forward'").await?;
            let forward = rows(&ctx, &sql).await?;
            assert_eq!(forward.len(), 2 * (1 + also.is_some() as usize), "{sql}");
            set(&ctx, "recursion_mode", "'reverse'").await?;
            set(&ctx, "checkpoint_every", "1").await?;
            let every_state = rows(&ctx, &sql).await?;
            assert!(
                close(&forward, &every_state, 1e-10),
                "{sql}\n{forward:?}\n{every_state:?}"
            );
            for every in [0, 2, 5, 13, 100] {
                set(&ctx, "checkpoint_every", &every.to_string()).await?;
                let got = rows(&ctx, &sql).await?;
                assert!(
                    close(&every_state, &got, 1e-12),
                    "checkpoint_every = {every}, {partitions} partitions\n{sql}\n{every_state:?}\n{got:?}"
                );
            }
        }
    }
    Ok(())
}

/// What the plan shows: the loop's rows kept every k-th iteration and the
/// backward steps' rows looked up; by default about max(64, √(2T))
/// iterations kept and, for a derivative at one iteration, each replayed at
/// most once.
#[tokio::test]
async fn checkpoints_keep_about_the_square_root_of_the_iterations() -> Result<()> {
    let ctx = session(2).await?;
    set(&ctx, "recursion_mode", "'reverse'").await?;
    let steps = 1000;
    let sql = gradients(steps, None);
    let shown = analyzed(&ctx, &sql).await?;
    // (the loop's rows are read inside the loss's shared rows, which the
    // plan does not show: the lookup shows the checkpoints' metrics too)
    assert!(
        shown.contains("PreviousRowExec: kept=about every √T-th"),
        "{shown}"
    );
    let kept = metric(&shown, "PreviousRowExec", "kept_iterations").expect("kept");
    let replayed = metric(&shown, "PreviousRowExec", "replayed_iterations").expect("replayed");
    let root = (2.0 * steps as f64).sqrt();
    assert!(
        kept as f64 <= (2.0 * root).max(64.0) && kept as f64 >= 0.5 * root,
        "{kept} of {steps} kept\n{shown}"
    );
    assert!(replayed < steps, "{replayed} replayed\n{shown}");
    // (EXPLAIN shows 1,000 as "1.00 K": a shorter loop for exact counts)
    let steps = 200;
    let sql = gradients(steps, None);
    set(&ctx, "checkpoint_every", "1").await?;
    let shown = analyzed(&ctx, &sql).await?;
    assert!(shown.contains("PreviousRowExec: kept=every"), "{shown}");
    assert_eq!(
        metric(&shown, "PreviousRowExec", "kept_iterations"),
        Some(steps + 1),
        "{shown}"
    );
    assert_eq!(
        metric(&shown, "PreviousRowExec", "replayed_iterations"),
        Some(0),
        "{shown}"
    );
    set(&ctx, "checkpoint_every", "10").await?;
    let shown = analyzed(&ctx, &sql).await?;
    assert!(
        shown.contains("PreviousRowExec: kept=every 10th"),
        "{shown}"
    );
    assert_eq!(
        metric(&shown, "PreviousRowExec", "kept_iterations"),
        Some(steps / 10 + 1),
        "{shown}"
    );
    Ok(())
}
