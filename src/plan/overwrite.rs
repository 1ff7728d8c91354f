//! `UPDATE` whose assignments need a gradient with respect to the table's
//! own rows (relational reverse mode).
//!
//! DataFusion 55 executes `UPDATE` by evaluating the assignments over the
//! table's own columns, batch by batch, and such a gradient is a gradient
//! table joined to the rows ([`crate::plan::analyzer`]'s `tables`). So the
//! statement is planned here as an [`Overwrite`]: its input computes every
//! row of the table — the rows the `WHERE` clause selects with their new
//! values, the others as they are — and [`OverwriteExec`](crate::exec::overwrite::OverwriteExec) replaces the
//! contents of the (in-memory) table with them once all are computed, so
//! every row's gradient is of the loss *before* the step, as in one step of
//! gradient descent. It returns the number of rows updated, as `UPDATE`
//! does. Other tables (views, files, remote catalogs) are refused with a
//! typed error.
//!
//! ```sql
//! -- one gradient-descent step over a parameter table
//! UPDATE weight SET val = val - 0.1 * grad((SELECT loss FROM loss_view), val);
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{internal_err, DFSchemaRef, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::{
    lit, DmlStatement, Expr, Extension, LogicalPlan, LogicalPlanBuilder, TableSource,
    UserDefinedLogicalNodeCore, WriteOp,
};

use crate::error::{fail, ErrorKind};
use crate::plan::dml::joins_gradient_table;
use crate::plan::{columns, kit};
use crate::reserved::UPDATED;

/// Whether `plan` holds an `UPDATE` whose input joins a gradient table.
pub(crate) fn updates_gradient_table(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| match node {
        LogicalPlan::Dml(dml) if dml.op == WriteOp::Update => joins_gradient_table(&dml.input),
        _ => Ok(false),
    })
}

/// `plan` (not yet differentiated) with each `UPDATE` planned as an
/// [`Overwrite`] of every row; see the [module docs](self).
pub(crate) fn overwrite_updates(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if dml.op == WriteOp::Update => {
            Ok(Transformed::yes(Overwrite::of_update(dml)?.into_plan()))
        }
        node => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}

/// Every row of a table, computed by `input` (the table's columns, then
/// whether the row was updated, `__dfgrad_updated`), written as its new
/// contents; one row out, the number of rows updated.
#[derive(Clone)]
pub struct Overwrite {
    pub(crate) table_name: TableReference,
    pub(crate) target: Arc<dyn TableSource>,
    pub(crate) input: LogicalPlan,
    pub(crate) schema: DFSchemaRef,
}

impl Overwrite {
    /// The overwrite doing what the `UPDATE` `dml` does: DataFusion plans
    /// it as the assignments projected over the rows `WHERE` selects
    /// (`Projection(Filter(scan))`); here those rows are followed by the
    /// rows it does not select (`p IS NOT TRUE`), unchanged.
    fn of_update(dml: DmlStatement) -> Result<Self> {
        let LogicalPlan::Projection(assigned) = dml.input.as_ref() else {
            return internal_err!("an UPDATE's input is a projection");
        };
        let (predicate, rows) = match assigned.input.as_ref() {
            LogicalPlan::Filter(f) => (Some(f.predicate.clone()), f.input.as_ref()),
            rows => (None, rows),
        };
        let scan = match rows {
            LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
            rows => rows,
        };
        if !matches!(scan, LogicalPlan::TableScan(_)) {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "UPDATE {} with a derivative with respect to a table's rows: the rows to \
                     update are not read straight from an in-memory table (a view?); write the \
                     step as `CREATE OR REPLACE TABLE … AS SELECT` instead",
                    dml.table_name
                ),
            );
        }
        let mut updated: Vec<Expr> = assigned.expr.clone();
        updated.push(lit(true).alias(UPDATED));
        let updated = LogicalPlanBuilder::from(assigned.input.as_ref().clone()).project(updated)?;
        let input = match predicate {
            None => updated.build()?,
            Some(p) => {
                let mut kept = columns(rows);
                kept.push(lit(false).alias(UPDATED));
                let kept = LogicalPlanBuilder::from(rows.clone())
                    .filter(Expr::IsNotTrue(Box::new(p)))?
                    .project(kept)?
                    .build()?;
                updated.union(kept)?.build()?
            }
        };
        Ok(Self {
            table_name: dml.table_name,
            target: dml.target,
            input,
            schema: dml.output_schema,
        })
    }

    fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(Extension {
            node: Arc::new(self),
        })
    }
}

impl fmt::Debug for Overwrite {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Overwrite")
            .field("table_name", &self.table_name)
            .field("input", &self.input)
            .finish()
    }
}

impl PartialEq for Overwrite {
    fn eq(&self, other: &Self) -> bool {
        self.table_name == other.table_name && self.input == other.input
    }
}

impl Eq for Overwrite {}

impl std::hash::Hash for Overwrite {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.table_name.hash(state);
        self.input.hash(state);
    }
}

impl PartialOrd for Overwrite {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.table_name, &self.input).partial_cmp(&(&other.table_name, &other.input))
    }
}

impl UserDefinedLogicalNodeCore for Overwrite {
    kit::node_without_expressions!("Overwrite", [input]);

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Overwrite: {}", self.table_name)
    }
}
