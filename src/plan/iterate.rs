//! Recursive queries whose recursive term reads the work table more than
//! once, run by an iteration of our own.
//!
//! DataFusion 55 runs a recursive CTE whose recursive term scans the work
//! table once, and refuses any other ("Multiple recursive references to the
//! same CTE are not supported"). A training step over parameters held in the
//! work table reads it at least twice: the rows it updates and the loss it
//! differentiates (and relational reverse mode reads it again in its backward
//! pass), as does any self-join of the previous iteration's rows.
//!
//! Before a plan is made physical, [`iterate_loops`] turns every such
//! `RecursiveQuery` into an [`Iterate`] node, planned as an [`IterateExec`](crate::exec::iterate::IterateExec)
//! ([`IteratePlanner`](crate::physical_planner::IteratePlanner)): DataFusion's algorithm — the static term, then the
//! recursive term again and again over the rows the previous iteration
//! produced, until one produces none; `UNION` (distinct) keeps only rows not
//! produced before — with the recursive term reading those rows through
//! [`IterationScanExec`](crate::exec::iterate::IterationScanExec)s, as many as it has. A recursive term with one scan
//! keeps DataFusion's `RecursiveQueryExec`.
//!
//! A scalar subquery of the recursive term that reads the work table is
//! first written as a join: DataFusion 55 computes an uncorrelated scalar
//! subquery once, before the recursion runs ("Unexpected empty work table").
//!
//! ```sql
//! -- the previous iteration's rows read twice (a self-join)
//! WITH RECURSIVE s(n, v) AS (
//!   SELECT 1, 1.0
//!   UNION ALL
//!   SELECT a.n + 1, a.v + b.v FROM s a JOIN s b ON a.n = b.n WHERE a.n < 5)
//! SELECT * FROM s;
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchemaRef;
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, LogicalPlanBuilder, RecursiveQuery, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::scalar_subquery_to_join::ScalarSubqueryToJoin;
use datafusion::optimizer::{Optimizer, OptimizerContext};

use super::kit;
use super::shared::shared_input;

/// `plan` with every recursive query whose recursive term reads the work
/// table more than once as an [`Iterate`] node (see the [module docs](self)).
pub(crate) fn iterate_loops(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|p| {
        let LogicalPlan::RecursiveQuery(q) = p else {
            return Ok(Transformed::no(p));
        };
        let q = with_subqueries_as_joins(q)?;
        if work_table_reads(&q.recursive_term, &q.name)? < 2 {
            return Ok(Transformed::yes(LogicalPlan::RecursiveQuery(q)));
        }
        Ok(Transformed::yes(iterate(q)))
    })
    .map(|t| t.data)
}

/// `plan` as an [`Iterate`] node if it is a recursive query, however often
/// its recursive term reads the work table: run by our iteration, which
/// can also replay one iteration from given rows (a loop whose rows
/// reverse mode checkpoints, [`super::history`]). Any other plan as it is.
pub(crate) fn iterated(plan: LogicalPlan) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::RecursiveQuery(q) => Ok(iterate(with_subqueries_as_joins(q)?)),
        other => Ok(other),
    }
}

/// `q` with the scalar subqueries of its recursive term that read the work
/// table written as joins.
fn with_subqueries_as_joins(mut q: RecursiveQuery) -> Result<RecursiveQuery> {
    if subquery_reads(&q.recursive_term, &q.name)? {
        q.recursive_term = Arc::new(subqueries_as_joins(&q.recursive_term)?);
    }
    Ok(q)
}

/// `q` as an [`Iterate`] node.
fn iterate(q: RecursiveQuery) -> LogicalPlan {
    let RecursiveQuery {
        name,
        static_term,
        recursive_term,
        is_distinct,
        schema,
    } = q;
    LogicalPlan::Extension(Extension {
        node: Arc::new(Iterate {
            name,
            static_term: Arc::unwrap_or_clone(static_term),
            recursive_term: Arc::unwrap_or_clone(recursive_term),
            distinct: is_distinct,
            schema,
        }),
    })
}

/// Whether a scalar subquery in `plan` reads the work table `name`.
fn subquery_reads(plan: &LogicalPlan, name: &str) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|p| {
        for e in p.expressions() {
            e.apply(|e| {
                if let Expr::ScalarSubquery(sq) = e {
                    found |= work_table_reads(&sq.subquery, name)? > 0;
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// `plan` with its scalar subqueries written as joins. DataFusion 55
/// computes an uncorrelated scalar subquery once per query, before any
/// recursion starts (its work-table scan would find no rows); as a join it
/// is computed in every iteration.
fn subqueries_as_joins(plan: &LogicalPlan) -> Result<LogicalPlan> {
    let mut options = ConfigOptions::new();
    options
        .optimizer
        .enable_physical_uncorrelated_scalar_subquery = false;
    let context = OptimizerContext::new_with_config_options(Arc::new(options));
    Optimizer::with_rules(vec![Arc::new(ScalarSubqueryToJoin::new())]).optimize(
        projected_subqueries(plan.clone())?,
        &context,
        |_, _| {},
    )
}

/// `plan` with a projection of its columns over every scalar subquery whose
/// plan does not start with one (e.g. a [`super::shared::Shared`] node),
/// the form DataFusion's `ScalarSubqueryToJoin` reads the value from.
fn projected_subqueries(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|p| {
        p.map_expressions(|e| {
            e.transform(|e| match e {
                Expr::ScalarSubquery(mut sq) if sq.subquery.head_output_expr()?.is_none() => {
                    let input = Arc::unwrap_or_clone(sq.subquery);
                    let columns: Vec<Expr> = input
                        .schema()
                        .columns()
                        .into_iter()
                        .map(Expr::Column)
                        .collect();
                    sq.subquery =
                        Arc::new(LogicalPlanBuilder::from(input).project(columns)?.build()?);
                    Ok(Transformed::yes(Expr::ScalarSubquery(sq)))
                }
                e => Ok(Transformed::no(e)),
            })
        })
    })
    .map(|t| t.data)
}

/// How many times `plan` scans the work table of the recursive CTE `name`
/// (in subqueries too). A scan in a shared subplan counts twice: it is read
/// by the subplan's cache, which only [`IterateExec`](crate::exec::iterate::IterateExec) refreshes.
fn work_table_reads(plan: &LogicalPlan, name: &str) -> Result<usize> {
    let mut reads = 0;
    plan.apply_with_subqueries(|p| {
        if let Some(input) = shared_input(p) {
            reads += 2 * work_table_reads(input, name)?;
        }
        if let LogicalPlan::TableScan(scan) = p {
            let provider = source_as_provider(&scan.source)?;
            if scan.table_name.table() == name && provider.is::<CteWorkTable>() {
                reads += 1;
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(reads)
}

/// A recursive CTE run by [`IterateExec`](crate::exec::iterate::IterateExec): the logical node of
/// [`iterate_loops`], with `RecursiveQuery`'s fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Iterate {
    pub(crate) name: String,
    pub(crate) static_term: LogicalPlan,
    pub(crate) recursive_term: LogicalPlan,
    /// `UNION` (rows produced before are dropped) rather than `UNION ALL`.
    pub(crate) distinct: bool,
    /// The rows' schema (both terms', nullable where either is).
    pub(crate) schema: DFSchemaRef,
}

impl PartialOrd for Iterate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (
            &self.name,
            &self.static_term,
            &self.recursive_term,
            self.distinct,
        )
            .partial_cmp(&(
                &other.name,
                &other.static_term,
                &other.recursive_term,
                other.distinct,
            ))
    }
}

impl UserDefinedLogicalNodeCore for Iterate {
    kit::node_without_expressions!("Iterate", [static_term, recursive_term]);

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let union = if self.distinct { "UNION" } else { "UNION ALL" };
        write!(f, "Iterate: name={}, {union}", self.name)
    }
}
