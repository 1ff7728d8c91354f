//! `UPDATE` and `DELETE` whose expressions read computed columns.
//!
//! DataFusion 55 executes `UPDATE` and `DELETE` by reading the assignments
//! and `WHERE` predicates from the plan as expressions over the table's own
//! columns. A column computed by a projection below them — the analyzer's
//! bound derivative parts (`__dfgrad…`), or the optimizer's common
//! subexpressions (`__common_expr_…`) — is then unknown, so even
//! `UPDATE t SET y = x * y + x * y` fails in DataFusion 55 ("No field named
//! __common_expr_1"). Here such columns are written out where they are used:
//! by the analyzer rule for its own bindings, and by [`InlineUpdates`], an
//! optimizer rule installed by [`crate::register`] that runs after
//! DataFusion's common-subexpression elimination.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use crate::error::{fail, ErrorKind};
use crate::plan::bindings::inline_all;
use crate::plan::reverse::as_group_join;
use crate::reserved::is_gradient_table_qualifier;

/// `plan` with the computed columns its `UPDATE`s and `DELETE`s read
/// written out.
pub(crate) fn inline_updates(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Update | WriteOp::Delete) => {
            refuse_gradient_tables(&dml)?;
            let input = inline_all(dml.input.as_ref().clone())?;
            if input == *dml.input {
                return Ok(Transformed::no(LogicalPlan::Dml(dml)));
            }
            Ok(Transformed::yes(LogicalPlan::Dml(DmlStatement {
                input: Arc::new(input),
                ..dml
            })))
        }
        _ => Ok(Transformed::no(node)),
    })
}

/// Refuses a `DELETE` whose predicate needs a gradient with respect to a
/// table's rows: DataFusion 55 evaluates a `DELETE`'s predicates over the
/// table's own columns and drops any it cannot (every row would match), so
/// a joined gradient table must never reach it. (Such an `UPDATE` is an
/// [`super::overwrite::Overwrite`] by now.)
fn refuse_gradient_tables(dml: &DmlStatement) -> Result<()> {
    if !joins_gradient_table(&dml.input)? {
        return Ok(());
    }
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "{} {}: the derivative with respect to a table's rows in its WHERE clause is a \
             gradient table joined to the rows, which DataFusion 55's DELETE cannot read (it \
             evaluates its predicate over the table's own columns); keep the other rows with \
             `CREATE OR REPLACE TABLE … AS SELECT … WHERE NOT (…)` instead",
            dml.op, dml.table_name
        ),
    )
}

/// Whether `plan` joins a gradient table (relational reverse mode's rewrite
/// of a marker, [`crate::plan::analyzer`]'s `tables`), or sums one into
/// the parameter rows it reads (a group join).
pub(crate) fn joins_gradient_table(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        Ok(as_group_join(node).is_some()
            || matches!(node, LogicalPlan::SubqueryAlias(s)
                if is_gradient_table_qualifier(&s.alias)))
    })
}

/// The optimizer rule that writes out the common subexpressions DataFusion's
/// own optimizer extracted from `UPDATE` assignments and `DELETE` predicates.
#[derive(Debug, Default)]
pub struct InlineUpdates;

impl OptimizerRule for InlineUpdates {
    fn name(&self) -> &str {
        "datafusion_grad_inline_updates"
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        inline_updates(plan)
    }
}
