//! Differentiating *through* a scalar subquery correlated with the variable:
//! `grad((SELECT avg(g.w * t.x) FROM g), t.x)`.
//!
//! The subquery `S` reads the variable `x` as an outer reference, so it is a
//! function of `x`, and `d/dx f(S, x) = ∂f/∂S · dS/dx + ∂f/∂x`. `dS/dx` is
//! the subquery differentiated *inside*: the same plan under
//! `grad(S's column, outer x)`, which the analyzer rewrites like any marker
//! in a subquery (through its aggregates, with the outer reference constant
//! within every group; see [`crate::plan::free_variables`]). `S` is bound to a column below
//! the marker's node and the marker becomes
//! `jvp(f, S, dS/dx, x, 1)`.
//!
//! ```sql
//! -- d/dx (SELECT avg(g.w * x) FROM g) = (SELECT avg(g.w) FROM g)
//! SELECT t.x, grad((SELECT avg(g.w * t.x) FROM g), t.x) FROM t;
//! ```
//!
//! Inside `dS/dx` the variable is taken as not NULL (a NULL test of it
//! would keep the subquery correlated); where `x` is NULL the derivative is
//! NULL by a test outside. For a non-NULL `x`, `dS/dx` is NULL exactly where
//! `S` is (the derivative's own NULL contract), which the `jvp` is told, so
//! it tests no value of `S`.
//!
//! DataFusion 55 executes a correlated scalar subquery only when each outer
//! reference is one side of an equality in a filter (a join key); `S` itself
//! is not such a subquery (that case is piecewise constant, derivative 0,
//! see [`crate::plan::lineage`]). So the rewrite succeeds only where the result
//! can run: `dS/dx` must be uncorrelated or keyed by equalities, and the
//! derivative must not need the value of `S`. Otherwise it is refused with
//! a typed error saying that DataFusion 55 cannot execute the shape.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Expr, ExprSchemable, LogicalPlan, Projection, ScalarUDF, Subquery,
};

use super::{chain_total, prune, rewrite_node};
use crate::engine::call::{as_marker, Marker, MarkerKind, SharedRules};
use crate::error::{fail, ErrorKind};
use crate::plan::lineage::{correlated_value_use, value_use_of_outer};
use crate::reserved::Placeholder;
use crate::tensor::Shape;

/// The subqueries bound below a node by [`through_subqueries`], checked by
/// [`Bound::finish`] once the node's markers are differentiated.
#[derive(Default)]
pub(crate) struct Bound {
    /// Each bound column's name, its subquery, and the outer use that makes
    /// it impossible for DataFusion 55 to execute.
    subqueries: Vec<(String, Expr, Expr)>,
    /// The node's output columns, when it passes its input's columns on.
    output: Option<Vec<Column>>,
}

/// `node` with each marker whose `f` reads a scalar subquery correlated with
/// a variable rewritten into `jvp` form over the subquery's value (bound to
/// a column below) and its derivative subquery; see the [module docs](self).
pub(crate) fn through_subqueries(node: LogicalPlan) -> Result<(LogicalPlan, Bound)> {
    let mut bound = Bound::default();
    if !matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Filter(_)) {
        return Ok((node, bound));
    }
    let input = node.inputs()[0].clone();
    let names = NamePreserver::new(&node);
    let mut changed = false;
    let mut exprs = Vec::new();
    for e in node.expressions() {
        let saved = names.save(&e);
        let t = e.transform_down(|e| rewrite_marker(e, &input, &mut bound))?;
        changed |= t.transformed;
        exprs.push(saved.restore(t.data));
    }
    if !changed {
        return Ok((node, bound));
    }
    if matches!(node, LogicalPlan::Filter(_)) {
        bound.output = Some(node.schema().columns());
    }
    let mut columns = crate::plan::columns(&input);
    columns.extend(
        bound
            .subqueries
            .iter()
            .map(|(name, s, _)| s.clone().alias(name)),
    );
    let input = LogicalPlan::Projection(Projection::try_new(columns, Arc::new(input))?);
    Ok((node.with_new_exprs(exprs, vec![input])?, bound))
}

/// One marker: when its `f` reads a subquery correlated with a variable, the
/// `jvp` form over the subquery's bound column.
fn rewrite_marker(e: Expr, input: &LogicalPlan, bound: &mut Bound) -> Result<Transformed<Expr>> {
    let Some(call) = as_marker(&e) else {
        return Ok(Transformed::no(e));
    };
    let (kind, rules) = (call.kind(), Arc::clone(call.marker.rules()));
    let wrt = call.wrt_columns();
    if wrt.len() != kind.wrt_positions(call.args.len())?.len() {
        // Some variable is not a column: the marker itself refuses it.
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    // The subqueries of f (outside nested markers) that use a variable as a value.
    let mut found: Vec<(Subquery, Expr)> = Vec::new();
    call.args[0].apply(|e| {
        if as_marker(e).is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        if let Expr::ScalarSubquery(s) = e {
            for c in &wrt {
                if let Some(used) = value_use_of_outer(&s.subquery, c)? {
                    if !found.iter().any(|(f, _)| f == s) {
                        found.push((s.clone(), used));
                    }
                    break;
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if found.is_empty() {
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    let mut columns = Vec::with_capacity(found.len());
    for (s, used) in &found {
        let value = Expr::ScalarSubquery(s.clone());
        let name = match bound.subqueries.iter().find(|(_, v, _)| *v == value) {
            Some((name, _, _)) => name.clone(),
            None => {
                let name = Placeholder::Subquery.name(bound.subqueries.len());
                bound.subqueries.push((name.clone(), value, used.clone()));
                name
            }
        };
        columns.push(Expr::Column(Column::new_unqualified(name)));
    }
    let f = call.args[0]
        .clone()
        .transform_up(|e| match &e {
            Expr::ScalarSubquery(s) => match found.iter().position(|(f, _)| f == s) {
                Some(k) => Ok(Transformed::yes(columns[k].clone())),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data;
    let mut totals = Vec::with_capacity(wrt.len());
    for c in &wrt {
        let field = input.schema().qualified_field_from_column(c)?.1;
        if Shape::is_tensor_type(field.data_type()) {
            return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
        }
        let mut args = vec![f.clone()];
        let mut nulls_like = Vec::new();
        for ((s, _), column) in found.iter().zip(&columns) {
            args.push(column.clone());
            let tangent = derivative_subquery(s, c, input, &rules)?;
            if matches!(tangent, Expr::ScalarSubquery(_)) {
                // NULL exactly where the subquery is, for a non-NULL variable.
                nulls_like.push((args.len(), args.len() - 1));
            }
            args.push(tangent);
        }
        // The derivative subqueries take the variable as not NULL (a test
        // of it inside would keep them correlated): NULL is tested here.
        totals.push(chain_total(
            &rules,
            args,
            nulls_like,
            c,
            field.is_nullable(),
        )?);
    }
    let names = wrt.iter().map(|c| c.name.as_str());
    let result = kind.assemble(call.args, names, totals)?;
    Ok(Transformed::new(result, true, TreeNodeRecursion::Jump))
}

/// `dS/dc` for the scalar subquery `s` as a scalar subquery: `s`'s plan
/// under `grad(its column, outer c)`, analyzed. 0 where `s` reads `c` at
/// most as an equality key (piecewise constant).
fn derivative_subquery(
    s: &Subquery,
    c: &Column,
    input: &LogicalPlan,
    rules: &SharedRules,
) -> Result<Expr> {
    if value_use_of_outer(&s.subquery, c)?.is_none() {
        return Ok(lit(0.0));
    }
    let (qualifier, field) = input.schema().qualified_field_from_column(c)?;
    let outer = Expr::OuterReferenceColumn(
        Arc::new(field.as_ref().clone().with_nullable(false)),
        Column::from((qualifier, field.as_ref())),
    );
    let value = Expr::Column(s.subquery.schema().columns()[0].clone());
    let grad = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, Arc::clone(rules)));
    let plan = LogicalPlan::Projection(Projection::try_new(
        vec![grad.call(vec![value, outer]).alias("derivative")],
        Arc::clone(&s.subquery),
    )?);
    let plan = prune(plan.transform_up_with_subqueries(rewrite_node)?.data)?;
    if let Some((o, used)) = correlated_value_use(&plan)? {
        return fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "the derivative of the subquery `{}` with respect to `{c}` is a subquery \
                     that still uses `{o}` through an outer reference in `{used}`; DataFusion 55 \
                     cannot execute a correlated scalar subquery that uses an outer column \
                     anywhere but in an equality predicate (`WHERE inner = outer`); write it \
                     as a join grouped by the variable instead, e.g. `SELECT {n}, \
                     grad(avg(f), {n}) FROM outer_table CROSS JOIN inner_table GROUP BY {n}`",
                Expr::ScalarSubquery(s.clone()),
                n = c.name
            ),
        );
    }
    Ok(Expr::ScalarSubquery(Subquery {
        outer_ref_columns: plan.all_out_ref_exprs(),
        subquery: Arc::new(plan),
        spans: s.spans.clone(),
    }))
}

impl Bound {
    /// `plan` (the node rewritten) checked: a derivative that needs the value
    /// of a bound subquery is refused (DataFusion 55 cannot execute it); an
    /// unneeded one is replaced by a NULL so it is never planned.
    pub(crate) fn finish(self, plan: LogicalPlan) -> Result<LogicalPlan> {
        if self.subqueries.is_empty() {
            return Ok(plan);
        }
        let names: Vec<&str> = self.subqueries.iter().map(|(n, _, _)| n.as_str()).collect();
        // The node and the projections the rewrite put between it and the
        // binding projection: does any compute with a bound column?
        let mut node = &plan;
        loop {
            if let Some(k) = names.iter().position(|n| reads(node, n)) {
                let (_, s, used) = &self.subqueries[k];
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "the derivative needs the value of the subquery `{s}`, which uses the \
                         variable through an outer reference in `{used}`; DataFusion 55 cannot \
                         execute a correlated scalar subquery that uses an outer column \
                         anywhere but in an equality predicate (`WHERE inner = outer`), with \
                         or without grad; write it as a join grouped by the variable instead"
                    ),
                );
            }
            match node.inputs().first() {
                Some(input) if !defines(input, names[0]) => node = input,
                _ => break,
            }
        }
        let plan = plan.transform_down(|node| match &node {
            LogicalPlan::Projection(p) if defines(&node, names[0]) => {
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| match e {
                        Expr::Alias(a) if names.contains(&a.name.as_str()) => {
                            let t = a.expr.get_type(p.input.schema())?;
                            Ok(lit(ScalarValue::try_from(&t)?).alias(&a.name))
                        }
                        e => Ok(e.clone()),
                    })
                    .collect::<Result<_>>()?;
                let p = Projection::try_new(exprs, Arc::clone(&p.input))?;
                Ok(Transformed::new(
                    LogicalPlan::Projection(p),
                    true,
                    TreeNodeRecursion::Stop,
                ))
            }
            _ => Ok(Transformed::no(node)),
        })?;
        let plan = plan.data;
        match self.output {
            Some(columns) => Ok(LogicalPlan::Projection(Projection::try_new(
                columns.into_iter().map(Expr::Column).collect(),
                Arc::new(plan),
            )?)),
            None => Ok(plan),
        }
    }
}

/// Whether `node` computes with the column `name` (passing it on as a bare
/// column does not count).
fn reads(node: &LogicalPlan, name: &str) -> bool {
    node.expressions().iter().any(|e| {
        !matches!(e, Expr::Column(c) if c.name == name)
            && e.exists(|e| Ok(matches!(e, Expr::Column(c) if c.name == name)))
                .unwrap_or(false)
    })
}

/// Whether `node` is the projection that binds the column `name`.
fn defines(node: &LogicalPlan, name: &str) -> bool {
    matches!(node, LogicalPlan::Projection(p)
        if p.expr.iter().any(|e| matches!(e, Expr::Alias(a) if a.name == name)))
}
