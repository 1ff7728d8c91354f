//! Scans as written, for a plan handed over optimized.
//!
//! DataFusion's optimizer narrows each scan to the columns read above it
//! and pushes filters into it, so a query that reads one table twice — the
//! rows a gradient is of, and the loss subquery over those same rows —
//! holds two *different* scans of it once optimized, and the rows a
//! gradient is of have lost the columns that tell them apart. Relational
//! reverse mode matches the loss's reads of the parameter rows by their
//! scan, and identifies the rows by the table's other columns.
//! [`widen_scans`] writes each narrowed scan back as the whole table under
//! the filter the optimizer folded into it, and lets the extra columns flow
//! up through the operators that pass on whatever their input has
//! (projections, filters, joins, aggregates, windows, sorts, limits,
//! aliases); any other operator, a subquery and the plan's root get exactly
//! the columns they had. So the plan computes what it did, with one scan
//! node per table again (the optimizer that runs after the analyzer
//! narrows them anew).
//!
//! ```sql
//! -- optimized, `p` is scanned for (val) outside and for (val) inside;
//! -- its rows are told apart by `g`, which neither reads
//! SELECT grad((SELECT sum(val * val) FROM p), p.val) FROM p;
//! ```

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Filter, LogicalPlan, Projection, TableScanBuilder};

use crate::plan::columns;

/// `plan` with every scan that the optimizer narrowed (a projection or
/// filters in the scan) written as a scan of the whole table, filtered
/// above it, the extra columns passed up where an operator passes them
/// on; the same output columns. A scan with a row limit in it is kept as
/// it is: its rows are not the table's.
pub fn widen_scans(plan: LogicalPlan) -> Result<LogicalPlan> {
    as_before(plan)
}

/// `plan` widened, with the columns it had (a projection over it where
/// widening added some).
fn as_before(plan: LogicalPlan) -> Result<LogicalPlan> {
    let before = Arc::clone(plan.schema());
    let exprs = columns(&plan);
    let widened = widen(plan)?;
    if widened.schema() == &before {
        return Ok(widened);
    }
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(widened),
    )?))
}

/// `plan` widened: its own output may have more columns.
fn widen(plan: LogicalPlan) -> Result<LogicalPlan> {
    let plan = plan
        .map_subqueries(|s| match s {
            LogicalPlan::Subquery(mut s) => {
                s.subquery = Arc::new(as_before(Arc::unwrap_or_clone(s.subquery))?);
                Ok(Transformed::yes(LogicalPlan::Subquery(s)))
            }
            s => Ok(Transformed::no(s)),
        })?
        .data;
    match plan {
        LogicalPlan::TableScan(scan)
            if scan.fetch.is_none() && (scan.projection.is_some() || !scan.filters.is_empty()) =>
        {
            let whole = TableScanBuilder::new(scan.table_name.clone(), Arc::clone(&scan.source));
            let rows = LogicalPlan::TableScan(whole.build()?);
            Ok(match conjunction(scan.filters.clone()) {
                Some(predicate) => LogicalPlan::Filter(Filter::try_new(predicate, Arc::new(rows))?),
                None => rows,
            })
        }
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Join(_)
        | LogicalPlan::Aggregate(_)
        | LogicalPlan::Window(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_) => plan
            .map_children(|child| widen(child).map(Transformed::yes))?
            .data
            .recompute_schema(),
        _ => Ok(plan
            .map_children(|child| as_before(child).map(Transformed::yes))?
            .data),
    }
}
