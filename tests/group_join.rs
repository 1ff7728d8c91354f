//! The group join of a gradient table (`datafusion_grad::plan::reverse`'s
//! `GroupJoinExec`): every parameter row gets the sum of its contributions,
//! from every partition, through either lookup (numbered integer
//! identities, hashed others), and the relation's own rows are summed into
//! without a join back.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use datafusion::error::Result;
use datafusion::physical_plan::{collect, displayable};
use datafusion::prelude::*;

async fn session(partitions: usize, setup: &[&str]) -> Result<SessionContext> {
    let ctx = datafusion_grad::session_context_with_config(
        SessionConfig::new().with_target_partitions(partitions),
    );
    for sql in setup {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(ctx)
}

/// Column `i` of `batches`, as doubles.
fn doubles(batches: &[RecordBatch], i: usize) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column(i).as_primitive::<Float64Type>();
            assert_eq!(c.null_count(), 0);
            c.values().to_vec()
        })
        .collect()
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

/// X (6 x 3) · W (3 x 2) as join + SUM (the setup of `shared`), loss
/// sum(Y²): ∂loss/∂X = 2 Y Wᵀ, over x's own rows: one group join, and no
/// join of x to its gradients.
#[tokio::test]
async fn the_relations_own_rows_are_summed_into_without_a_join() -> Result<()> {
    let ctx = session(3, crate::shared::SETUP).await?;
    let sql = "SELECT n, d, grad((SELECT loss FROM mm_loss), v) AS g FROM x ORDER BY n, d";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let text = displayable(plan.as_ref()).indent(false).to_string();
    assert_eq!(text.matches("GroupJoinExec").count(), 1, "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.contains("JoinExec: ") && l.contains("n@0, __dfgrad_key0")),
        "{text}"
    );
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let x = |n: usize, d: usize| (n as f64 * 0.37 + d as f64).sin();
    let w = |d: usize, h: usize| (d as f64 * 1.3 + h as f64).cos();
    let y = |n: usize, h: usize| (0..3).map(|d| x(n, d) * w(d, h)).sum::<f64>();
    let mut want = Vec::new();
    for n in 0..6 {
        for d in 0..3 {
            want.push((0..2).map(|h| 2.0 * y(n, h) * w(d, h)).sum());
        }
    }
    assert_close(&doubles(&batches, 2), &want);
    Ok(())
}

/// String identities (hashed), each row read by several data rows that
/// arrive in four partitions: loss Σ x·val² over d ⋈ p, so ∂loss/∂val =
/// 2·val·Σx over the row's data rows (0 for a row no data row reads).
#[tokio::test]
async fn contributions_from_every_partition_add_up() -> Result<()> {
    let ctx = session(
        4,
        &[
            "CREATE TABLE p AS SELECT 'k' || value AS name, 1.0 + value * 0.01 AS val
               FROM generate_series(0, 499)",
            "CREATE TABLE d AS SELECT 'k' || (value % 400) AS name, (value % 7) * 0.5 AS x
               FROM generate_series(0, 2999)",
        ],
    )
    .await?;
    let sql =
        "SELECT grad((SELECT sum(d.x * p.val * p.val) FROM d JOIN p ON d.name = p.name), val) \
               AS g FROM p ORDER BY CAST(substr(name, 2) AS INT)";
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut xs = vec![0.0; 500];
    for v in 0..3000 {
        xs[v % 400] += (v % 7) as f64 * 0.5;
    }
    let want: Vec<f64> = (0..500)
        .map(|i| 2.0 * (1.0 + i as f64 * 0.01) * xs[i])
        .collect();
    assert_close(&doubles(&batches, 0), &want);
    Ok(())
}

/// ∂loss/∂X = 2·Y·Wᵀ for X of 2,000 rows read in batches of 64 over 3
/// partitions: the contraction's sums are keyed by x's identity (n, d),
/// and each row of x looks its sum up in the group join (times its factor,
/// 1 or NULL), without a join of x to the sums. A NULL value gets NULL, a
/// row whose d no row of w has gets 0.
#[tokio::test]
async fn sums_keyed_by_the_identity_are_looked_up_without_a_join() -> Result<()> {
    let (n, d, h) = (250i64, 8i64, 3i64);
    let ctx = datafusion_grad::session_context_with_config(
        SessionConfig::new()
            .with_target_partitions(3)
            .with_batch_size(64),
    );
    for sql in [
        format!(
            "CREATE TABLE x AS SELECT n, d, CASE WHEN n = 7 AND d = 2 THEN NULL \
               ELSE sin(n * 0.37 + d) END AS v
             FROM (SELECT value / {d} AS n, value % {d} AS d FROM generate_series(0, {}))
             UNION ALL SELECT 1000 AS n, 99 AS d, 1.5 AS v",
            n * d - 1
        ),
        format!(
            "CREATE TABLE w AS SELECT d, h, cos(d * 1.3 + h) AS val
             FROM (SELECT value / {h} AS d, value % {h} AS h FROM generate_series(0, {}))",
            d * h - 1
        ),
        "CREATE VIEW mm_loss AS SELECT sum(y * y) AS loss FROM (SELECT x.n, w.h, \
           sum(x.v * w.val) AS y FROM x JOIN w ON x.d = w.d GROUP BY x.n, w.h)"
            .to_string(),
    ] {
        ctx.sql(&sql).await?.collect().await?;
    }
    let sql = "SELECT n, d, grad((SELECT loss FROM mm_loss), v) AS g FROM x ORDER BY n, d";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let text = displayable(plan.as_ref()).indent(false).to_string();
    assert_eq!(text.matches("GroupJoinExec").count(), 1, "{text}");
    assert!(text.contains("__dfgrad_factor0"), "{text}");
    assert!(!text.contains("HashJoinExec"), "{text}");
    let batches = collect(plan, ctx.task_ctx()).await?;
    // The NULL value adds nothing to its y.
    let x = |i: i64, k: i64| match (i, k) {
        (7, 2) => 0.0,
        _ => (i as f64 * 0.37 + k as f64).sin(),
    };
    let w = |k: i64, j: i64| (k as f64 * 1.3 + j as f64).cos();
    let mut want = vec![];
    for i in 0..n {
        let y: Vec<f64> = (0..h)
            .map(|j| (0..d).map(|k| x(i, k) * w(k, j)).sum())
            .collect();
        for k in 0..d {
            want.push(2.0 * (0..h).map(|j| y[j as usize] * w(k, j)).sum::<f64>());
        }
    }
    want.push(0.0);
    let got: Vec<Option<f64>> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column(2).as_primitive::<Float64Type>();
            (0..c.len())
                .map(|i| c.is_valid(i).then(|| c.value(i)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(got.len(), want.len());
    let null_at = (7 * d + 2) as usize;
    assert_eq!(got[null_at], None);
    let (got, want): (Vec<f64>, Vec<f64>) = (got.iter().enumerate())
        .filter(|&(i, _)| i != null_at)
        .map(|(i, g)| (g.expect("a gradient"), want[i]))
        .unzip();
    assert_close(&got, &want);
    Ok(())
}
