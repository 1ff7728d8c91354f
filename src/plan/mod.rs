//! The plan-level rewrites: what differentiating a query needs beyond one
//! expression, built on the engine ([`crate::engine`]).
//!
//! - [`analyzer`]: the analyzer rule installed with the markers, and its
//!   rewrites through aggregates and scalar subqueries (child modules);
//! - [`lineage`]: where a column a marker reads comes from (derived columns
//!   inlined, re-reads of the variable's rows refused);
//! - [`reverse`]: relational reverse mode, the gradient of a loss query
//!   with respect to every row of a parameter relation (a backward pass
//!   over the loss's plan, one transpose per relational operator);
//! - [`free_variables`]: variables from outside the rows (outer references,
//!   `PREPARE` parameters) localized as columns;
//! - [`expand`]: one marker call as self-contained expressions (what
//!   `simplify` returns);
//! - [`bindings`]: the projections that bind shared parts, written back
//!   inline for the text export and DML;
//! - [`dml`]: `UPDATE`/`DELETE` over computed columns;
//! - [`overwrite`]: `UPDATE` with a gradient with respect to the table's
//!   own rows, as a replacement of its contents;
//! - [`scans`]: the scans an optimized plan narrowed, written back whole
//!   (a plan handed over optimized, as a stock session's planner gets it);
//! - [`shared`]: subplans read several times (the forward aggregates a
//!   backward pass reads again), marked to be computed once per query;
//! - [`iterate`]: recursive queries whose recursive term reads the work
//!   table more than once (a training step's loss over its parameters), as
//!   a node of their own;
//! - [`adjoint_loop`]: reverse mode through a recursive query's iterations
//!   (each row's iterations replayed forwards, then backwards), as a node;
//! - [`cross_joins`]: DataFusion's `eliminate_cross_join`, kept from
//!   merging joins that match NULL keys differently (the backward passes'
//!   joins of group adjoints with a loss's joins).
//!
//! This layer says what a derivative *is*, as logical plans and logical
//! nodes (what every node writes alike is written once, in `kit`); how
//! they run is [`crate::exec`]'s, and
//! [`crate::physical_planner`] joins the two.
//!
//! ```sql
//! -- through an aggregate: d/dw avg((w·x − y)²), one value per group
//! SELECT g, grad(avg(power(w * x - y, 2)), w) FROM t GROUP BY g, w;
//! ```

pub mod adjoint_loop;
pub mod analyzer;
pub mod bindings;
pub mod cross_joins;
pub mod dml;
pub mod expand;
pub mod free_variables;
pub mod history;
pub mod iterate;
pub(crate) mod kit;
pub mod lineage;
pub mod overwrite;
pub mod reverse;
pub mod scans;
pub mod shared;

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{NullEquality, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Join, JoinConstraint, JoinType, LogicalPlan, Volatility};

use crate::error::GradError;

/// Every column of `plan`'s output, as column expressions (a projection
/// passing its input on).
pub(crate) fn columns(plan: &LogicalPlan) -> Vec<Expr> {
    plan.schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect()
}

/// Every row of `rows` with the row of `table` whose columns equal its own
/// `on` (NULLs equal; none: NULLs): how a gradient table is joined to the
/// rows it is of.
pub(crate) fn left_join_by_identity(
    rows: LogicalPlan,
    table: LogicalPlan,
    on: Vec<(Expr, Expr)>,
) -> Result<LogicalPlan> {
    join_nulls_equal(rows, table, on, JoinType::Left)
}

/// `left` joined to `right` by the key pairs `(l, r)`: exact equality,
/// NULL equal to NULL, as GROUP BY groups them (a group's rows joined back
/// to the group find exactly it: two distinct keys, however close, or
/// infinite, are two groups).
pub(crate) fn join_nulls_equal(
    left: LogicalPlan,
    right: LogicalPlan,
    on: Vec<(Expr, Expr)>,
    join_type: JoinType,
) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(left),
        Arc::new(right),
        on,
        None,
        join_type,
        JoinConstraint::On,
        NullEquality::NullEqualsNull,
        false,
    )?))
}

/// Whether `t` and `u` may name the same table: `p`, `public.p` and
/// `datafusion.public.p` do (a name without a schema is taken to be of any
/// schema: a re-read is refused rather than missed).
pub(crate) fn same_table(t: &TableReference, u: &TableReference) -> bool {
    t.resolved_eq(u) || u.resolved_eq(t)
}

/// `plan` refused, typed (`non_differentiable`), where one of its
/// expressions (in its subqueries and shared subplans too) calls a volatile
/// function (`random()`, `uuid()`): a derivative that evaluates `plan`
/// again — the backward pass of relational reverse mode over the loss's
/// rows, a loop's steps replayed in reverse mode — would pair the values
/// of one draw with the derivatives of another. `why` says which
/// evaluations there are.
pub(crate) fn refuse_volatile(plan: &LogicalPlan, why: &str) -> Result<()> {
    match volatile_function(plan)? {
        Some(name) => Err(GradError::non_differentiable(
            &name,
            &format!("it is volatile, and {why}: each evaluation would draw anew"),
        )
        .into()),
        None => Ok(()),
    }
}

/// The name of the first volatile function `plan` calls (in its subqueries
/// and shared subplans too), if any; relational reverse mode's row checks
/// are not counted.
pub(crate) fn volatile_function(plan: &LogicalPlan) -> Result<Option<String>> {
    let mut volatile = None;
    plan.apply_with_subqueries(|node| {
        if let Some(input) = shared::shared_input(node) {
            volatile = volatile_function(input)?;
        }
        for e in node.expressions() {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    // Our row checks are volatile so that DataFusion never
                    // evaluates them ahead of the CASE that guards them;
                    // they draw nothing.
                    let check = f.func.inner().downcast_ref::<reverse::RowCheck>().is_some();
                    if f.func.signature().volatility == Volatility::Volatile && !check {
                        volatile = Some(f.func.name().to_string());
                    }
                }
                Ok(match volatile {
                    Some(_) => TreeNodeRecursion::Stop,
                    None => TreeNodeRecursion::Continue,
                })
            })?;
        }
        Ok(match volatile {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(volatile)
}

/// `e` without its top-level aliases.
pub(crate) fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}
