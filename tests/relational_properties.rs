//! Relational reverse mode against central finite differences, over random
//! relational plans: a loss query over a parameter table `p(g, val)` and a
//! data table `d(g, x)`, built from random joins (inner, left, cross,
//! self-joins), filters, row-wise expressions, GROUP BY aggregates (one or
//! two levels), UNION ALL branches and L2 terms in scalar subqueries. For
//! each, `grad((SELECT loss FROM s), p.val)` at every row of `p` must match
//! the difference quotient of the loss with that row's value moved.

use datafusion::arrow::array::{Array, Float64Array, Int32Array};
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::numbers::{central, close, H};

/// Row-wise terms in the parameter `p.val` (or `{v}`) and the data `d.x`.
const TERMS: &[&str] = &[
    "{v} * d.x",
    "sin({v}) * d.x",
    "{v} * {v} * d.x",
    "exp({v} / 4) + d.x",
    "CASE WHEN d.x > 0 THEN {v} ELSE {v} * {v} END",
    "tanh({v} * d.x - 0.5)",
    // piecewise in the parameter: a partial that is 0 unless a condition
    // on the parameter's row holds
    "CASE WHEN {v} > 0.2 THEN {v} * d.x ELSE 0.0 END",
    "d.x * CASE WHEN {v} > 0 THEN {v} ELSE 0.0 END",
];

/// Aggregates of a row-wise term `{e}` within a group.
const AGGREGATES: &[&str] = &[
    "sum({e})",
    "avg({e})",
    "max({e})",
    "min({e})",
    "var_pop({e})",
    "sum({e}) FILTER (WHERE d.x > -1)",
    "avg({e}) + count(*)",
];

/// Functions of a group's value `{h}` summed into the loss.
const OUTER: &[&str] = &["{h}", "{h} * {h}", "tanh({h})", "exp({h} / 10)"];

/// The FROM clauses joining `p` (the parameter rows, maybe twice) and `d`.
const FROMS: &[(&str, &str)] = &[
    ("d JOIN p ON p.g = d.g", "p.val"),
    ("d LEFT JOIN p ON p.g = d.g", "coalesce(p.val, 1.0)"),
    ("p CROSS JOIN d", "p.val"),
    ("p JOIN d ON p.g = d.g WHERE d.x > 0", "p.val"),
    (
        "p JOIN p AS q ON q.g < p.g JOIN d ON d.g = q.g",
        "p.val * q.val",
    ),
    // three inputs, a condition on the data alone in the ON clause
    (
        "d JOIN p ON p.g = d.g JOIN d AS e ON e.g = d.g AND e.x > d.x - 1",
        "p.val * e.x",
    ),
];

/// A random loss query over `p` and `d` with one column `loss`.
fn random_loss(rng: &mut StdRng) -> String {
    let pick = |rng: &mut StdRng, xs: &[&'static str]| xs[rng.random_range(0..xs.len())];
    let (from, v) = FROMS[rng.random_range(0..FROMS.len())];
    let term = pick(rng, TERMS).replace("{v}", &format!("({v})"));
    let mut loss = match rng.random_range(0..3) {
        // a sum of row-wise terms
        0 => format!("SELECT sum({term}) AS loss FROM {from}"),
        // a GROUP BY, then a function of each group's value summed
        1 => {
            let agg = pick(rng, AGGREGATES).replace("{e}", &term);
            let outer = pick(rng, OUTER).replace("{h}", "h");
            format!("SELECT sum({outer}) AS loss FROM (SELECT d.g, {agg} AS h FROM {from} GROUP BY d.g)")
        }
        // two levels of aggregates: a mean of the groups' values
        _ => {
            let agg = pick(rng, AGGREGATES).replace("{e}", &term);
            let outer = pick(rng, OUTER).replace("{h}", "h");
            format!(
                "SELECT avg({outer}) + max(h) AS loss FROM (SELECT d.g, {agg} AS h FROM {from} \
                 GROUP BY d.g)"
            )
        }
    };
    if rng.random_bool(0.3) {
        // a second branch, through UNION ALL
        let other = pick(rng, TERMS).replace("{v}", "p.val");
        loss = format!(
            "SELECT sum(l) AS loss FROM ({loss_l} UNION ALL SELECT {other} AS l FROM p JOIN d ON \
             d.g = p.g)",
            loss_l = loss.replacen("AS loss", "AS l", 1)
        );
    }
    if rng.random_bool(0.3) {
        // an L2 term as a scalar subquery
        loss = format!("SELECT loss + 0.1 * (SELECT sum(val * val) FROM p) AS loss FROM ({loss})");
    }
    loss
}

/// The `p` table with row `moved` (if any) moved by `by`.
fn parameters(values: &[f64], moved: Option<(usize, f64)>) -> String {
    let rows: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v = match moved {
                Some((j, by)) if j == i => v + by,
                _ => *v,
            };
            format!("({}, CAST({v:?} AS DOUBLE))", i + 1)
        })
        .collect();
    format!(
        "CREATE OR REPLACE TABLE p(g INT, val DOUBLE) AS VALUES {}",
        rows.join(", ")
    )
}

async fn run(ctx: &SessionContext, sql: &str) -> Vec<datafusion::arrow::record_batch::RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn loss_at(ctx: &SessionContext, values: &[f64], moved: (usize, f64), loss: &str) -> f64 {
    run(ctx, &parameters(values, Some(moved))).await;
    let batches = run(ctx, &format!("SELECT loss FROM ({loss})")).await;
    let a = batches[0].column(0);
    let a = a
        .as_any()
        .downcast_ref::<Float64Array>()
        .expect("Float64 loss");
    a.value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_relational_plans_match_finite_differences() {
    let mut rng = StdRng::seed_from_u64(23);
    let ctx = datafusion_grad::session_context();
    run(
        &ctx,
        "CREATE TABLE d(g INT, x DOUBLE) AS VALUES (1, 0.7), (1, -0.4), (2, 1.3), (2, 0.25), \
         (2, -0.9), (3, 0.55), (5, 2.0)",
    )
    .await;
    // row 4 is never joined by key: its gradient is 0 wherever the loss reads it by key
    let values = [0.6, -0.35, 1.1, 0.8];
    let mut checked = 0;
    for case in 0..80 {
        let loss = random_loss(&mut rng);
        run(&ctx, &parameters(&values, None)).await;
        let sql = format!(
            "WITH s AS ({loss}) SELECT p.g, grad((SELECT loss FROM s), p.val) AS d FROM p ORDER BY p.g"
        );
        let batches = run(&ctx, &sql).await;
        let mut grads = Vec::new();
        for b in &batches {
            let g = b
                .column(0)
                .as_any()
                .downcast_ref::<Int32Array>()
                .expect("g");
            let d = b
                .column(1)
                .as_any()
                .downcast_ref::<Float64Array>()
                .expect("d");
            for i in 0..b.num_rows() {
                grads.push((g.value(i) as usize - 1, d.is_valid(i).then(|| d.value(i))));
            }
        }
        assert_eq!(grads.len(), values.len(), "case {case}: {sql}");
        for (row, got) in grads {
            let at = |by: f64| loss_at(&ctx, &values, (row, by), &loss);
            let (plus, minus, plus2, minus2) = (
                at(H).await,
                at(-H).await,
                at(2.0 * H).await,
                at(-2.0 * H).await,
            );
            let Some(expected) = central(plus, minus, plus2, minus2, 1e-3) else {
                continue; // a kink (max/min tie, CASE edge) at this point
            };
            let got = got.unwrap_or_else(|| {
                panic!("case {case} row {row}: NULL gradient, expected {expected}: {sql}")
            });
            assert!(
                close(got, expected, 1e-5),
                "case {case} row {}: grad {got}, finite differences {expected}: {sql}",
                row + 1
            );
            checked += 1;
        }
    }
    assert!(checked > 240, "only {checked} gradients were checked");
}
