//! Differentiating with respect to a table's rows, in the scalar form:
//! `grad((SELECT loss FROM s), p.val)` over the rows of `p`, where the loss
//! query `s` reads `p` itself.
//!
//! The loss is then a function of the variable in *every* row of `p`, and
//! `grad` at a row is the total derivative of the loss with respect to that
//! row's value: relational reverse mode ([`crate::plan::reverse`]). The
//! rewrite computes the loss's gradient table once, joins it to the node's
//! input by the variable's row identity (the other columns of its
//! relation), joins the loss's value as a column `__dfgrad_loss{k}` (its
//! one row's; a loss query of several rows fails when it is computed, as
//! the scalar subquery would), and the marker
//! becomes `jvp(f, loss, gradient, x, 1)`: the chain rule through the loss,
//! plus `f`'s own dependence on the row's `x`.
//!
//! ```sql
//! -- a training step: each weight moved against its gradient
//! UPDATE weight SET val = val - 0.1 * grad((SELECT loss FROM loss_view), val);
//! ```
//!
//! The loss subquery must be uncorrelated (a loss correlated with the row
//! is differentiated inside, see the sibling module `subqueries`). Where
//! the variable is NULL, the derivative is NULL.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Column, NullEquality};
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::sum;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{
    lit, Expr, Join, JoinConstraint, JoinType, LogicalPlan, Projection, Subquery, SubqueryAlias,
};

use super::chain_total;
use super::loop_tables::gradient_table;
use crate::engine::call::as_marker;
use crate::error::{fail, ErrorKind};
use crate::plan::lineage::{origin_of, overlaps, parts, Scope};
use crate::plan::reverse::{reads, shared_loss, GroupJoin, Parameter, RowCheck};
use crate::plan::{columns, left_join_by_identity};
use crate::reserved::{gradient_table_qualifier, Placeholder, GRADIENT};
use crate::tensor::Shape;

/// The gradient tables and loss values a node's markers need.
#[derive(Default)]
struct Found {
    /// The loss subqueries, bound to `__dfgrad_loss{k}`.
    losses: Vec<Subquery>,
    /// `(loss k, variable, gradient table, the input's identity columns,
    /// the variable's relation)`.
    tables: Vec<(usize, Column, LogicalPlan, Vec<Expr>, LogicalPlan)>,
}

/// `node` with each marker whose `f` reads a loss subquery over the
/// variable's own rows rewritten by relational reverse mode; see the
/// [module docs](self).
pub(crate) fn through_tables(node: LogicalPlan) -> Result<LogicalPlan> {
    let LogicalPlan::Projection(projection) = &node else {
        return Ok(node);
    };
    let input = Arc::clone(&projection.input);
    let names = NamePreserver::new(&node);
    let mut found = Found::default();
    let mut changed = false;
    let mut exprs = Vec::new();
    for e in node.expressions() {
        let saved = names.save(&e);
        let t = e.transform_down(|e| rewrite_marker(e, &input, &mut found))?;
        changed |= t.transformed;
        exprs.push(saved.restore(t.data));
    }
    if !changed {
        return Ok(node);
    }
    let mut plan = input.as_ref().clone();
    let mut passed = columns(&input);
    for (t, (_, _, table, identity, relation)) in found.tables.into_iter().enumerate() {
        let qualifier = gradient_table_qualifier(t);
        passed.push(Expr::Column(Column::new(Some(qualifier.clone()), GRADIENT)));
        // The rows are the parameter relation's own (maybe filtered: a
        // training loop's `WHERE step < n`): summed into them.
        if let Some(keep) = filtering(&plan, &relation) {
            let positions = identity
                .iter()
                .map(|e| match e {
                    Expr::Column(c) => relation.schema().index_of_column(c),
                    _ => internal_err!("an identity column"),
                })
                .collect::<Result<Vec<_>>>()?;
            let joined = GroupJoin::joined(&table, &relation, positions, qualifier.clone(), keep)?;
            if let Some(joined) = joined {
                plan = joined;
                continue;
            }
        }
        let on = identity
            .into_iter()
            .enumerate()
            .map(|(j, e)| {
                let key = Column::new(Some(qualifier.clone()), Placeholder::Key.name(j));
                (e, Expr::Column(key))
            })
            .collect();
        let table = SubqueryAlias::try_new(Arc::new(table), qualifier.clone())?;
        plan = left_join_by_identity(plan, LogicalPlan::SubqueryAlias(table), on)?;
    }
    // Each loss joined as a one-row relation (a scalar subquery expression
    // cannot run everywhere a marker can, e.g. in UPDATE): its one row's
    // value, or the typed error of a loss query with several rows. The
    // relation always has that one row (an aggregate without groups), so
    // the rows are paired with it by a cross join that holds the loss row
    // and streams the rows (a left join would collect every row first).
    for (k, s) in found.losses.into_iter().enumerate() {
        // Its one row's value (NULL for none, as the scalar subquery's).
        let value = sum(Expr::Column(s.subquery.schema().columns()[0].clone()));
        let loss =
            RowCheck::one_loss_row(shared_loss(&s.subquery)?, value, &Placeholder::Loss.name(k))?;
        plan = LogicalPlan::Join(Join::try_new(
            Arc::new(loss),
            Arc::new(plan),
            vec![],
            None,
            JoinType::Inner,
            JoinConstraint::On,
            NullEquality::NullEqualsNothing,
            false,
        )?);
        passed.push(Placeholder::Loss.column(k));
    }
    let plan = LogicalPlan::Projection(Projection::try_new(passed, Arc::new(plan))?);
    node.with_new_exprs(exprs, vec![plan])
}

/// Where `plan` is `relation` under filters (none or several, none
/// volatile, none with a subquery, an outer column or a parameter, which
/// DataFusion plans only in a filter): `Some` of their conditions (`None`
/// for no filter); else `None`.
fn filtering(plan: &LogicalPlan, relation: &LogicalPlan) -> Option<Option<Expr>> {
    let (mut plan, mut conditions) = (plan, vec![]);
    while plan != relation {
        let LogicalPlan::Filter(f) = plan else {
            return None;
        };
        let planned_in_filters = f.predicate.exists(|e| {
            Ok(matches!(
                e,
                Expr::ScalarSubquery(_)
                    | Expr::Exists(_)
                    | Expr::InSubquery(_)
                    | Expr::SetComparison(_)
                    | Expr::OuterReferenceColumn(..)
                    | Expr::Placeholder(_)
            ))
        });
        if f.predicate.is_volatile() || planned_in_filters.unwrap_or(true) {
            return None;
        }
        conditions.push(f.predicate.clone());
        plan = &f.input;
    }
    Some(conjunction(conditions))
}

/// A `WHERE` clause or aggregate whose derivatives need gradient tables,
/// moved onto a projection below the node (the gradient tables are joined
/// to the rows there): see [`hoist_markers`].
pub(crate) struct Hoisted {
    /// The node's input with the markers as columns `__dfgrad_where{k}`
    /// (to be differentiated).
    pub below: LogicalPlan,
    /// The node, its markers replaced by those columns.
    node: LogicalPlan,
    /// Its expressions so rewritten.
    exprs: Vec<Expr>,
    /// How many columns the node's input has.
    width: usize,
}

impl Hoisted {
    /// The node over `below` (differentiated), with the columns it had.
    pub fn over(self, below: LogicalPlan) -> Result<LogicalPlan> {
        let node = self.node.with_new_exprs(self.exprs, vec![below])?;
        if !matches!(node, LogicalPlan::Filter(_)) {
            return Ok(node);
        }
        let kept: Vec<Expr> = node.schema().columns()[..self.width]
            .iter()
            .cloned()
            .map(Expr::Column)
            .collect();
        Ok(LogicalPlan::Projection(Projection::try_new(
            kept,
            Arc::new(node),
        )?))
    }
}

/// `node` as a [`Hoisted`] when it is a filter whose predicate, or an
/// aggregate whose aggregate calls' arguments, hold markers with respect
/// to a table's rows (`WHERE grad((SELECT loss FROM s), p.val) > 1`,
/// `sum(power(grad((SELECT loss FROM s), p.val), 2))`); `None` for any
/// other node. (A marker *over* aggregates, `grad(avg(f), w)`, is the
/// sibling module `aggregates`'s.)
pub(crate) fn hoist_markers(node: &LogicalPlan) -> Result<Option<Hoisted>> {
    let input = match node {
        LogicalPlan::Filter(f) => &f.input,
        LogicalPlan::Aggregate(a) => &a.input,
        _ => return Ok(None),
    };
    let exprs = node.expressions();
    let mut markers: Vec<Expr> = Vec::new();
    for e in &exprs {
        match node {
            LogicalPlan::Filter(_) => collect_markers(e, &mut markers)?,
            _ => {
                e.apply(|e| {
                    let Expr::AggregateFunction(call) = e else {
                        return Ok(TreeNodeRecursion::Continue);
                    };
                    for arg in &call.params.args {
                        collect_markers(arg, &mut markers)?;
                    }
                    Ok(TreeNodeRecursion::Jump)
                })?;
            }
        }
    }
    if markers.is_empty() {
        return Ok(None);
    }
    let mut columns_below = columns(input);
    let width = columns_below.len();
    for (k, m) in markers.iter().enumerate() {
        columns_below.push(m.clone().alias(Placeholder::Where.name(k)));
    }
    let below = LogicalPlan::Projection(Projection::try_new(columns_below, Arc::clone(input))?);
    if through_tables(below.clone())? == below {
        return Ok(None);
    }
    let names = NamePreserver::new(node);
    let mut rewritten = Vec::with_capacity(exprs.len());
    for e in exprs {
        let saved = names.save(&e);
        let e = e
            .transform_down(|e| match markers.iter().position(|m| *m == e) {
                Some(k) => Ok(Transformed::new(
                    Placeholder::Where.column(k),
                    true,
                    TreeNodeRecursion::Jump,
                )),
                None => Ok(Transformed::no(e)),
            })?
            .data;
        rewritten.push(saved.restore(e));
    }
    Ok(Some(Hoisted {
        below,
        node: node.clone(),
        exprs: rewritten,
        width,
    }))
}

/// Adds to `markers` each marker of `e` (outermost, once).
fn collect_markers(e: &Expr, markers: &mut Vec<Expr>) -> Result<()> {
    e.apply(|e| {
        if as_marker(e).is_none() {
            return Ok(TreeNodeRecursion::Continue);
        }
        if !markers.contains(e) {
            markers.push(e.clone());
        }
        Ok(TreeNodeRecursion::Jump)
    })?;
    Ok(())
}

/// One marker: when its `f` reads a loss subquery over a variable's rows,
/// the `jvp` form over the bound loss and its gradient table.
fn rewrite_marker(e: Expr, input: &LogicalPlan, found: &mut Found) -> Result<Transformed<Expr>> {
    let Some(call) = as_marker(&e) else {
        return Ok(Transformed::no(e));
    };
    let (kind, rules) = (call.kind(), Arc::clone(call.marker.rules()));
    let wrt = call.wrt_columns();
    if wrt.len() != kind.wrt_positions(call.args.len())?.len() {
        // Some variable is not a column: the marker itself refuses it.
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    let mut origins = Vec::with_capacity(wrt.len());
    for c in &wrt {
        let Some(idx) = input.schema().maybe_index_of_column(c) else {
            return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
        };
        origins.push(origin_of(input, idx)?);
    }
    let scope = Scope::new(vec![input])?;
    let var_parts = wrt
        .iter()
        .map(|c| scope.parts(c))
        .collect::<Result<Vec<_>>>()?;
    // Whether the loss subquery `s` reads variable `v`'s values in its
    // relation's rows (a subquery over other columns of the rows is a
    // constant to it).
    let relational = |s: &Subquery, v: usize| -> Result<bool> {
        Ok(reads(&s.subquery, origins[v].0)? && overlaps(&var_parts[v], &parts(&s.subquery, 0)?))
    };
    // The uncorrelated subqueries of f (outside nested markers) that read
    // a variable's rows.
    let mut losses: Vec<Subquery> = Vec::new();
    call.args[0].apply(|e| {
        if as_marker(e).is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        if let Expr::ScalarSubquery(s) = e {
            if s.outer_ref_columns.is_empty() && !losses.contains(s) {
                for v in 0..origins.len() {
                    if relational(s, v)? {
                        losses.push(s.clone());
                        break;
                    }
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if losses.is_empty() {
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    let mut bound = Vec::with_capacity(losses.len());
    for s in &losses {
        let k = match found.losses.iter().position(|l| l == s) {
            Some(k) => k,
            None => {
                found.losses.push(s.clone());
                found.losses.len() - 1
            }
        };
        bound.push(k);
    }
    let f = call.args[0]
        .clone()
        .transform_up(|e| match &e {
            Expr::ScalarSubquery(s) => match losses.iter().position(|l| l == s) {
                Some(i) => Ok(Transformed::yes(Placeholder::Loss.column(bound[i]))),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data;
    let mut totals = Vec::with_capacity(wrt.len());
    for (v, (c, &(relation, column))) in wrt.iter().zip(&origins).enumerate() {
        let field = input.schema().qualified_field_from_column(c)?.1;
        if Shape::is_tensor_type(field.data_type()) {
            return fail(
                ErrorKind::UnsupportedType,
                format!(
                    "`{c}` is a tensor column; the derivative with respect to a table's rows \
                     (relational reverse mode) takes a numeric column"
                ),
            );
        }
        let identity: Vec<usize> = (0..relation.schema().fields().len())
            .filter(|&i| i != column && scope.column_of(relation, i).is_some())
            .collect();
        let on: Vec<Expr> = identity
            .iter()
            .map(|&i| Expr::Column(scope.column_of(relation, i).expect("visible").clone()))
            .collect();
        let mut args = vec![f.clone()];
        for (s, &k) in losses.iter().zip(&bound) {
            args.push(Placeholder::Loss.column(k));
            if !relational(s, v)? {
                args.push(lit(0.0));
                continue;
            }
            let t = match found
                .tables
                .iter()
                .position(|(l, v, _, _, _)| *l == k && v == c)
            {
                Some(t) => t,
                None => {
                    let name = c
                        .relation
                        .as_ref()
                        .map_or(c.name.clone(), |r| r.to_string());
                    let identity_names: Vec<String> = on.iter().map(|e| e.to_string()).collect();
                    let parameter = Parameter {
                        relation,
                        column,
                        identity: &identity,
                        names: (&name, &identity_names),
                    };
                    let table = gradient_table(&s.subquery, parameter, &rules)?;
                    found
                        .tables
                        .push((k, c.clone(), table, on.clone(), relation.clone()));
                    found.tables.len() - 1
                }
            };
            let gradient = Column::new(Some(gradient_table_qualifier(t)), GRADIENT);
            args.push(datafusion::functions::core::expr_fn::coalesce(vec![
                Expr::Column(gradient),
                lit(0.0),
            ]));
        }
        totals.push(chain_total(&rules, args, vec![], c, field.is_nullable())?);
    }
    let names = wrt.iter().map(|c| c.name.as_str());
    let result = kind.assemble(call.args, names, totals)?;
    Ok(Transformed::new(result, true, TreeNodeRecursion::Jump))
}
