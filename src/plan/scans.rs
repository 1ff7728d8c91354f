//! Scans as written, for a plan handed over optimized.
//!
//! DataFusion's optimizer narrows each scan to the columns read above it
//! and pushes filters into it, so a query that reads one table twice — the
//! rows a gradient is of, and the loss subquery over those same rows —
//! holds two *different* scans of it once optimized. Relational reverse
//! mode matches the loss's reads of the parameter rows by their scan, and
//! refuses a scan of the table it cannot match (a derivative of 0 through
//! it would be wrong). [`widen_scans`] writes each narrowed scan back as the
//! whole table under the filter and the projection the optimizer folded
//! into it: the same rows and columns, and one scan node per table again
//! (the optimizer that runs after the analyzer narrows them anew).
//!
//! ```sql
//! -- optimized, `p` is scanned for (g, val) outside and for (val) inside
//! SELECT p.g, grad((SELECT sum(val * val) FROM p), p.val) FROM p;
//! ```

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Filter, LogicalPlan, Projection, TableScanBuilder};

use crate::plan::columns;

/// `plan` with every scan that the optimizer narrowed (a projection or
/// filters in the scan) written as a scan of the whole table, filtered and
/// projected above it. A scan with a row limit in it is kept as it is: its
/// rows are not the table's.
pub fn widen_scans(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::TableScan(scan) = &node else {
            return Ok(Transformed::no(node));
        };
        if scan.fetch.is_some() || (scan.projection.is_none() && scan.filters.is_empty()) {
            return Ok(Transformed::no(node));
        }
        let whole = TableScanBuilder::new(scan.table_name.clone(), Arc::clone(&scan.source));
        let mut rows = LogicalPlan::TableScan(whole.build()?);
        if let Some(predicate) = conjunction(scan.filters.clone()) {
            rows = LogicalPlan::Filter(Filter::try_new(predicate, Arc::new(rows))?);
        }
        let narrowed = Projection::try_new(columns(&node), Arc::new(rows))?;
        Ok(Transformed::yes(LogicalPlan::Projection(narrowed)))
    })
    .map(|t| t.data)
}
