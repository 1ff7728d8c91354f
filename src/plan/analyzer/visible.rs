//! The columns a derived column reads, made visible where it is aggregated.
//!
//! A derivative through an aggregate (a training loop's `tensor_avg(g)`
//! over a subquery whose `g` is a `grad(…)` of the data and the weights)
//! differentiates the definition of the derived column at the aggregate,
//! so the columns that definition reads must be columns of the aggregate's
//! input. Users select the weights next to `g` (they group by them) but
//! rarely the data. Before differentiating, each projection directly under
//! an aggregate (or under the alias of a derived table) passes on, after
//! its own columns, the input columns its computed columns read that it
//! does not already output. The aggregate's results are the same; columns
//! that nothing reads after differentiation are pruned by DataFusion's
//! optimizer.
//!
//! ```sql
//! -- g reads x and y: they are passed on to the aggregate's input
//! SELECT step, tensor_sub(w, scale(tensor_avg(g), lr)) ...
//! FROM (SELECT step, w, lr, grad(cross_entropy(matmul(x, w), y), w) AS g FROM train CROSS JOIN batches)
//! GROUP BY step, w, lr
//! ```

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Projection, SubqueryAlias};

use crate::plan::unalias;

/// `plan` with the input of every aggregate widened; see the
/// [module docs](self).
pub(crate) fn widen_aggregate_inputs(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Aggregate(a) = &node else {
            return Ok(Transformed::no(node));
        };
        let Some(input) = widened(&a.input)? else {
            return Ok(Transformed::no(node));
        };
        Ok(Transformed::yes(LogicalPlan::Aggregate(
            Aggregate::try_new(Arc::new(input), a.group_expr.clone(), a.aggr_expr.clone())?,
        )))
    })
    .map(|t| t.data)
}

/// `input` (a projection, maybe under a derived table's alias) passing on
/// the input columns its computed columns read; `None` if it has none to add.
fn widened(input: &LogicalPlan) -> Result<Option<LogicalPlan>> {
    match input {
        LogicalPlan::SubqueryAlias(s) => match widened(&s.input)? {
            Some(p) => Ok(Some(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(p),
                s.alias.clone(),
            )?))),
            None => Ok(None),
        },
        LogicalPlan::Projection(p) => {
            let mut names: HashSet<String> =
                p.schema.fields().iter().map(|f| f.name().clone()).collect();
            let mut exprs = p.expr.clone();
            for e in &p.expr {
                if matches!(unalias(e), Expr::Column(_)) {
                    continue;
                }
                let mut read: Vec<_> = e.column_refs().into_iter().collect();
                read.sort_by_key(|c| c.flat_name());
                for c in read {
                    // a name the output has (or two inputs share) is left
                    // out: the output's names stay unique
                    if p.input.schema().has_column(c) && names.insert(c.name.clone()) {
                        exprs.push(Expr::Column(c.clone()));
                    }
                }
            }
            if exprs.len() == p.expr.len() {
                return Ok(None);
            }
            Ok(Some(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::clone(&p.input),
            )?)))
        }
        _ => Ok(None),
    }
}
