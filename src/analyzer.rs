//! The analyzer rule installed with the markers.
//!
//! It runs on every plan (also with the optimizer disabled, and inside
//! subqueries, recursive CTEs, DML, CTAS and views) and handles what a marker's
//! `simplify` cannot see from its arguments alone:
//! - derived columns: `f` is rewritten to differentiate through definitions
//!   below (see [`crate::lineage`]);
//! - a marker whose `f` depends on an aggregate or window output, or on a
//!   subquery correlated with the variable, is refused with a typed error
//!   (never treated as an independent column, which would silently give 0);
//! - when the optimizer will not run (`datafusion.optimizer.max_passes = 0`),
//!   markers are rewritten here into their derivatives.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Column;
use datafusion::error::Result;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::lineage::Scope;
use crate::marker::{as_marker, expand_markers, MarkerKind};

/// Differentiates through plan context; see the [module docs](self).
#[derive(Debug, Default)]
pub struct GradAnalyzer;

impl AnalyzerRule for GradAnalyzer {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        let expand = config.optimizer.max_passes == 0;
        plan.transform_up_with_subqueries(|node| rewrite_node(node, expand))
            .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "datafusion_grad"
    }
}

fn has_marker(e: &Expr) -> bool {
    e.exists(|e| Ok(as_marker(e).is_some())).unwrap_or(false)
}

fn rewrite_node(node: LogicalPlan, expand: bool) -> Result<Transformed<LogicalPlan>> {
    if !node.expressions().iter().any(has_marker) {
        return Ok(Transformed::no(node));
    }
    let inputs: Vec<LogicalPlan> = node.inputs().into_iter().cloned().collect();
    let scope = Scope::new(inputs.iter().collect())?;
    let names = NamePreserver::new(&node);
    let rewritten = node.map_expressions(|e| {
        let saved = names.save(&e);
        let t = e.transform_up(|e| rewrite_marker(e, &scope))?;
        let t = if expand {
            t.transform_data(|e| expand_markers(e, scope.schema()))?
        } else {
            t
        };
        Ok(t.update_data(|e| saved.restore(e)))
    })?;
    if rewritten.transformed {
        rewritten.map_data(|plan| plan.recompute_schema())
    } else {
        Ok(rewritten)
    }
}

/// Inlines derived columns into a marker's `f` (its first argument).
fn rewrite_marker(e: Expr, scope: &Scope) -> Result<Transformed<Expr>> {
    let Some(marker) = as_marker(&e) else {
        return Ok(Transformed::no(e));
    };
    let kind = marker.kind();
    let Expr::ScalarFunction(ScalarFunction { func, mut args }) = e else {
        unreachable!("as_marker matched a scalar function")
    };
    let wrt: Vec<Column> = wrt_columns(kind, &args);
    let f = args.remove(0);
    let f = scope.inline(f, &wrt)?;
    args.insert(0, f.data);
    let call = Expr::ScalarFunction(ScalarFunction { func, args });
    Ok(Transformed::new_transformed(call, f.transformed))
}

/// The variables of a marker call (none when its arity is wrong: the marker
/// itself reports that).
fn wrt_columns(kind: MarkerKind, args: &[Expr]) -> Vec<Column> {
    kind.wrt_positions(args.len())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| match args.get(p) {
            Some(Expr::Column(c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}
