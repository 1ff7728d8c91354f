//! Planning time of higher-order derivatives (issue 45, "second derivatives
//! that take minutes to plan"): the derivative tests each guard once, so
//! DataFusion plans it, and its exported text, in time linear in its size.
//! `benches/planning.rs` measures the same over many more expressions.

use std::time::Duration;

use datafusion::arrow::array::{Array, Float64Array};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Case, Expr, LogicalPlan};
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use datafusion_grad::{ErrorKind, GradError};

use crate::common::numbers::close;
use crate::common::on_big_stack;
use crate::expressions::{nested_grad, random_expression, time_query, FROM};

/// `f` of the two queries of the issue: 29 s and 232 s to plan before.
const ISSUE: [&str; 2] = [
    "asinh(x / least(power(1.0 + y * y, x), atan(x)))",
    "asinh(power(0.5 + x * x, y - y) / least(power(1.0 + y * y, x), atan(x)))",
];

/// The points the values are checked at: at all but the last, `least`
/// selects the `power`.
const POINTS: &str = "(3.0, 0.1), (2.0, 0.2), (1.8, 0.05), (4.0, -0.2), (0.3, 0.7)";

/// Runs an async test body on a big stack.
fn run<F: std::future::Future<Output = ()> + Send + 'static>(
    body: impl FnOnce() -> F + Send + 'static,
) {
    on_big_stack(256 << 20, move || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(body())
    });
}

/// The values of the columns `cols` over `POINTS`, one vector per column (NaN for NULL).
async fn values(ctx: &SessionContext, cols: &[String]) -> Vec<Vec<f64>> {
    let sql = format!(
        "SELECT {} FROM (VALUES {POINTS}) AS t(x, y)",
        cols.join(", ")
    );
    let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
    let mut out = vec![Vec::new(); cols.len()];
    for b in &batches {
        for (i, c) in b.columns().iter().enumerate() {
            let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
            out[i].extend((0..c.len()).map(|r| if c.is_null(r) { f64::NAN } else { c.value(r) }));
        }
    }
    out
}

#[test]
fn the_issue_queries_plan_in_well_under_a_second() {
    run(|| async {
        let ctx = datafusion_grad::session_context();
        // Their third derivatives still take 0.5 s and 1.8 s (see
        // `benches/planning.rs`).
        for f in ISSUE {
            for order in 1..=2 {
                let wrt = ["x", "y"];
                let sql = format!("SELECT {} {FROM}", nested_grad(f, &wrt[..order]));
                let t = time_query(&ctx, &sql).await.unwrap();
                // second order: 0.03 s and 0.1 s (29 s and 232 s before)
                assert!(
                    t.dfgrad < Duration::from_secs(1) && t.stock < Duration::from_secs(1),
                    "{sql}: planned in {:?} by dfgrad, exported in {:?}, the text ({} characters) \
                     planned in {:?} by stock DataFusion",
                    t.dfgrad,
                    t.export,
                    t.text_len,
                    t.stock
                );
            }
        }
    });
}

/// `∂²f/∂x∂y` of the issue's queries: the values printed before the change
/// (at `POINTS`), and the central difference in `y` of `∂f/∂x`.
#[test]
fn the_issue_queries_keep_their_values() {
    run(|| async {
        let ctx = datafusion_grad::session_context();
        let before: [[f64; 5]; 2] = EXPECTED;
        for (f, expected) in ISSUE.iter().zip(before) {
            let h = 1e-5;
            let shifted = |d: f64| f.replace('y', &format!("(y + {d:e})"));
            let cols = vec![
                nested_grad(f, &["x", "y"]),
                nested_grad(&shifted(h), &["x"]),
                nested_grad(&shifted(-h), &["x"]),
            ];
            let c = values(&ctx, &cols).await;
            for (k, &d) in c[0].iter().enumerate() {
                assert!(
                    close(d, expected[k], 1e-12),
                    "{f} at point {k}: {d}, before {}",
                    expected[k]
                );
                let fd = (c[1][k] - c[2][k]) / (2.0 * h);
                assert!(
                    close(d, fd, 1e-5),
                    "{f} at point {k}: {d}, central difference {fd}"
                );
            }
        }
    });
}

/// The values of `∂²f/∂x∂y` for `ISSUE` at `POINTS` before the change.
const EXPECTED: [[f64; 5]; 2] = [
    [
        -0.20645195377641234,
        -0.4088615983519745,
        -0.10769715362435484,
        0.3936757091590667,
        0.0,
    ],
    [
        -0.13579616163451227,
        -0.25006017556022814,
        -0.07021680220872716,
        0.22725626311296263,
        0.0,
    ],
];

/// The atoms of a condition as the engine reads guards: `CASE WHEN a THEN b
/// ELSE false END` is `a` and `b`, `(CASE WHEN c THEN v END) IS NOT NULL` is `c`.
fn atoms(c: &Expr) -> Vec<&Expr> {
    match c {
        Expr::Case(Case {
            expr: None,
            when_then_expr,
            else_expr: Some(e),
        }) if when_then_expr.len() == 1
            && matches!(
                e.as_ref(),
                Expr::Literal(ScalarValue::Boolean(Some(false)), _)
            ) =>
        {
            let (a, b) = &when_then_expr[0];
            let mut out = atoms(a);
            out.extend(atoms(b));
            out
        }
        Expr::IsNotNull(inner) => match inner.as_ref() {
            Expr::Case(Case {
                expr: None,
                when_then_expr,
                else_expr: None,
            }) if when_then_expr.len() == 1
                && matches!(when_then_expr[0].1.as_ref(), Expr::Literal(v, _) if !v.is_null()) =>
            {
                atoms(&when_then_expr[0].0)
            }
            _ => vec![c],
        },
        _ => vec![c],
    }
}

/// The guards `e` tests again under themselves: a `CASE` whose `THEN`
/// branch is a `CASE` with a condition its own implies (`CASE WHEN g THEN
/// (CASE WHEN g THEN …) END`), and a chain of conditions that tests an atom
/// twice.
fn retested(e: &Expr, found: &mut Vec<String>) {
    e.apply(|e| {
        let Expr::Case(Case {
            expr: None,
            when_then_expr,
            ..
        }) = e
        else {
            return Ok(TreeNodeRecursion::Continue);
        };
        for (when, then) in when_then_expr {
            let known = atoms(when);
            if known
                .iter()
                .enumerate()
                .any(|(i, a)| known[..i].contains(a))
            {
                found.push(format!("an atom twice in `{when}`"));
            }
            if let Expr::Case(Case {
                expr: None,
                when_then_expr: inner,
                ..
            }) = then.as_ref()
            {
                if atoms(&inner[0].0).iter().all(|a| known.contains(a)) {
                    found.push(format!("`{}` under `{when}`", inner[0].0));
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
}

/// The conditions tested again under themselves in the derivative `sql` asks
/// for, as the analyzer writes it (none when it is refused as too large).
async fn retested_in(ctx: &SessionContext, sql: &str) -> Vec<String> {
    let state = ctx.state();
    let plan = state.create_logical_plan(sql).await.unwrap();
    let analyzed: LogicalPlan =
        match state
            .analyzer()
            .execute_and_check(plan, state.config_options(), |_, _| {})
        {
            Ok(plan) => plan,
            Err(e)
                if GradError::find(&e)
                    .is_some_and(|g| g.kind() == ErrorKind::DerivativeTooLarge) =>
            {
                return vec![]
            }
            Err(e) => panic!("{sql}: {e}"),
        };
    let mut found = Vec::new();
    analyzed
        .apply_with_subqueries(|node| {
            for e in node.expressions() {
                retested(&e, &mut found);
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
    found
}

#[test]
fn no_guard_is_tested_again_under_itself() {
    run(|| async {
        let ctx = datafusion_grad::session_context();
        let mut rng = StdRng::seed_from_u64(4511);
        let mut fs: Vec<String> = ISSUE.iter().map(|f| f.to_string()).collect();
        fs.extend((0..40).map(|_| random_expression(&mut rng, 40).0));
        for f in &fs {
            let wrt: Vec<&str> = (0..3)
                .map(|_| if rng.random_bool(0.5) { "x" } else { "y" })
                .collect();
            for order in 1..=3 {
                let sql = format!("SELECT {} {FROM}", nested_grad(f, &wrt[..order]));
                let found = retested_in(&ctx, &sql).await;
                assert!(
                    found.is_empty(),
                    "{sql}: {} guards are tested again under themselves, e.g. {}",
                    found.len(),
                    found[0]
                );
            }
        }
    });
}

#[test]
fn derivatives_of_random_expressions_plan_quickly() {
    run(|| async {
        let ctx = datafusion_grad::session_context();
        let mut rng = StdRng::seed_from_u64(4512);
        for _ in 0..15 {
            let (f, _) = random_expression(&mut rng, 40);
            let wrt: Vec<&str> = (0..3)
                .map(|_| if rng.random_bool(0.5) { "x" } else { "y" })
                .collect();
            for order in 1..=3 {
                let sql = format!("SELECT {} {FROM}", nested_grad(&f, &wrt[..order]));
                let t = time_query(&ctx, &sql).await.unwrap();
                // 1 s in `benches/planning.rs`; here with room for the
                // tests running in parallel
                assert!(
                    t.dfgrad < Duration::from_secs(2) && t.stock < Duration::from_secs(2),
                    "{sql}: planned in {:?} by dfgrad, its exported text in {:?} by stock \
                     DataFusion",
                    t.dfgrad,
                    t.stock
                );
            }
        }
    });
}
