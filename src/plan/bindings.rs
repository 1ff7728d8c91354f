//! Undoing the analyzer's binding projections where they cannot stay.
//!
//! The analyzer computes a derivative's shared parts in projections it
//! inserts below the node that uses them (`__dfgrad…` columns, see
//! [`crate::engine::share`]); each passes its input's columns on, still
//! qualified (`t.x`). Two consumers need them changed:
//!
//! - Export ([`printable`]): DataFusion's unparser prints such a projection
//!   as a derived table named `derived_projection`, under which `t.x` no
//!   longer resolves. Each binding projection (and the projection that drops
//!   the bound columns again above a filter, sort or window) becomes a derived
//!   table that keeps the qualifier of the columns it passes on (`FROM
//!   (SELECT t.x AS x, … AS __dfgrad0_7 FROM t) AS t`), so the SQL above it
//!   stays valid and the shared parts are still computed once. Where the
//!   passed columns come from several tables (a join) no single name fits:
//!   the bound columns are written out in the node that uses them.
//! - `UPDATE` and `DELETE` ([`inline_all`]): DataFusion 55 executes them by
//!   reading the assignments and the `WHERE` predicates as expressions over
//!   the table's own columns, so every bound column is written out.
//!
//! Written-out derivatives are limited to the engine's size limit.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::TableReference;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, SubqueryAlias};

use crate::engine::MAX_TREE_NODES;
use crate::error::{ErrorKind, GradError};
use crate::reserved::{is_bound_name, INPUT_ALIAS};

/// `plan` with every binding projection printable (see the module docs).
pub(crate) fn printable(plan: LogicalPlan) -> Result<LogicalPlan> {
    unbind(plan, true)
}

/// `plan` with every bound column written out where it is used.
pub(crate) fn inline_all(plan: LogicalPlan) -> Result<LogicalPlan> {
    unbind(plan, false)
}

/// `plan` with the common subexpressions DataFusion's optimizer extracted
/// (`__common_expr_N` columns of a projection) written out where they are
/// used, and the projection removed: a plan optimized *before*
/// differentiation (as stock datafusion-python hands one to a query planner)
/// then shows the analyzer the base columns a derivative through those
/// subexpressions needs. Sharing is restored by the optimizer that runs after
/// the analyzer.
pub fn inline_common_subexpressions(plan: LogicalPlan) -> Result<LogicalPlan> {
    inline_all(plan)
}

/// `plan` with its binding projections turned into derived tables where
/// `derived_tables` allows and a single qualifier fits, written out
/// otherwise.
fn unbind(plan: LogicalPlan, derived_tables: bool) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        // The unparser also prints a projection under a projection as a
        // derived table with the same flaw, and prints a window's functions
        // only into the projection right above it (a Window under an
        // Aggregate, the extreme of each group for `max`'s derivative, would
        // lose them).
        let under_projection = matches!(node, LogicalPlan::Projection(_));
        let under_select = matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Window(_));
        let undone = |input: &LogicalPlan| match derived_tables {
            true => {
                is_binding(input)
                    || is_unbinding(input)
                    || (under_projection && matches!(input, LogicalPlan::Projection(_)))
                    || (!under_select && matches!(input, LogicalPlan::Window(_)))
            }
            false => is_binding(input),
        };
        if !node.inputs().into_iter().any(undone) {
            return Ok(Transformed::no(node));
        }
        let mut defs = HashMap::new();
        let inputs = node
            .inputs()
            .into_iter()
            .map(|input| match undone(input) {
                true => derived_table(input, derived_tables, &mut defs),
                false => Ok(input.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        let exprs = match defs.is_empty() {
            true => node.expressions(),
            false => node
                .expressions()
                .into_iter()
                .map(|e| inline(e, &defs))
                .collect::<Result<_>>()?,
        };
        Ok(Transformed::yes(node.with_new_exprs(exprs, inputs)?))
    })
    .map(|t| t.data)
}

/// Whether `plan` is a projection the analyzer inserted to bind shared
/// parts: it passes its input's columns on and defines `__dfgrad` columns.
fn is_binding(plan: &LogicalPlan) -> bool {
    let LogicalPlan::Projection(p) = plan else {
        return false;
    };
    let input = p.input.schema();
    let mut binds = false;
    for e in &p.expr {
        let bound = is_bound_name(&e.schema_name().to_string());
        binds |= bound;
        if !bound && !matches!(e, Expr::Column(c) if input.has_column(c)) {
            return false;
        }
    }
    binds
}

/// Whether `plan` is the projection the analyzer puts above a filter, sort
/// or window whose input it bound: it passes on all but the bound columns.
fn is_unbinding(plan: &LogicalPlan) -> bool {
    let LogicalPlan::Projection(p) = plan else {
        return false;
    };
    let input = p.input.schema();
    input.fields().iter().any(|f| is_bound_name(f.name()))
        && p.expr
            .iter()
            .all(|e| matches!(e, Expr::Column(c) if input.has_column(c)))
}

/// The binding projection (or window) `plan` as a derived table named after
/// the qualifier of the columns it passes on; or, when they have several,
/// the plan below it, with its definitions (in terms of that plan's columns)
/// added to `defs` (a window is then refused).
fn derived_table(
    plan: &LogicalPlan,
    derived_tables: bool,
    defs: &mut HashMap<String, Expr>,
) -> Result<LogicalPlan> {
    if let LogicalPlan::Window(w) = plan {
        // A window passing all its columns on, as a projection over it.
        let columns = w.schema.columns().into_iter().map(Expr::Column).collect();
        let p = Projection::try_new(columns, Arc::new(plan.clone()))?;
        return match derived_table(&LogicalPlan::Projection(p), derived_tables, defs)? {
            LogicalPlan::SubqueryAlias(s) => Ok(LogicalPlan::SubqueryAlias(s)),
            _ => Err(GradError::new(
                ErrorKind::Unexportable,
                "cannot export a window function read by an aggregate over columns of several \
                 tables as SQL text",
            )
            .into()),
        };
    }
    let LogicalPlan::Projection(p) = plan else {
        unreachable!("is_binding checked it is a projection")
    };
    let mut qualifiers: Vec<&TableReference> = Vec::new();
    for (q, _) in p.schema.iter() {
        if let Some(q) = q.filter(|q| !qualifiers.contains(q)) {
            qualifiers.push(q);
        }
    }
    let alias = match qualifiers.as_slice() {
        _ if !derived_tables => None,
        [] => Some(INPUT_ALIAS.to_string()),
        [TableReference::Bare { table }] => Some(table.to_string()),
        _ => None,
    };
    let Some(alias) = alias else {
        if !is_binding(plan) {
            // a projection dropping bound columns over a join: left as it is
            return Ok(plan.clone());
        }
        let below = match is_binding(&p.input) {
            true => derived_table(&p.input, derived_tables, defs)?,
            false => p.input.as_ref().clone(),
        };
        for e in &p.expr {
            if let Expr::Alias(a) = e {
                defs.insert(a.name.clone(), inline(a.expr.as_ref().clone(), defs)?);
            }
        }
        return Ok(below);
    };
    // Name every passed column in the derived table, so the names are the
    // same in every engine (an aggregate's output column otherwise gets an
    // engine-specific name).
    let exprs = p
        .expr
        .iter()
        .map(|e| match e {
            Expr::Column(c) if !is_bound_name(&c.name) => e.clone().alias(c.name.clone()),
            _ => e.clone(),
        })
        .collect();
    let projection = Projection::try_new(exprs, Arc::clone(&p.input))?;
    Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
        Arc::new(LogicalPlan::Projection(projection)),
        alias,
    )?))
}

/// `e` with each bound column replaced by its definition in `defs`; refused
/// when the result exceeds the engine's size limit.
fn inline(e: Expr, defs: &HashMap<String, Expr>) -> Result<Expr> {
    let e = e
        .transform(|e| match &e {
            Expr::Column(c) if c.relation.is_none() => match defs.get(&c.name) {
                Some(def) => Ok(Transformed::new(def.clone(), true, TreeNodeRecursion::Jump)),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data;
    let mut size = 0u64;
    e.apply(|_| {
        size += 1;
        Ok(TreeNodeRecursion::Continue)
    })?;
    if size > MAX_TREE_NODES {
        return Err(GradError::new(
            ErrorKind::DerivativeTooLarge,
            format!(
                "the derivative, with its shared parts written out (UPDATE, DELETE, or an \
                 export over a join), has {size} expression nodes; the limit is {MAX_TREE_NODES}"
            ),
        )
        .into());
    }
    Ok(e)
}
