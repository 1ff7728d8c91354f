//! Differentiating *through* aggregates: `grad(avg(loss), w)`,
//! `grad(sqrt(avg(e * e)), w)`, `grad(ln(sum(exp(z))), w)` where `w` is a
//! GROUP BY key (constant within each group), or an outer reference in a
//! subquery (constant over all its rows).
//!
//! For a marker whose `f` reads aggregate outputs `A₁ … Aₘ` (directly or
//! through derived columns), the chain rule gives
//! `df/dw = Σⱼ ∂f/∂Aⱼ · dAⱼ/dw + ∂f/∂w`. Each `dAⱼ/dw` is an aggregate of the
//! row-wise derivatives of `Aⱼ`'s arguments ([`crate::rules::aggregate`]),
//! added to the same Aggregate node, so it is computed in the same pass over
//! the rows. Those columns (and a copy of each `Aⱼ`) are carried up to the
//! marker's node, and the marker becomes the forward-mode
//! `jvp(f, A₁, dA₁/dw, …, Aₘ, dAₘ/dw, w, 1)`, which the analyzer then
//! differentiates like any other marker. A `jvp` whose tangents are
//! constant within the groups (literals, outer variables, GROUP BY keys)
//! takes one aggregate per `Aⱼ` along all its variables at once,
//! `dAⱼ = agg(jvp(g, w₁, t₁, …))`, and becomes `jvp(f, A₁, dA₁, …, w₁, t₁, …)`:
//! fewer aggregates, and tensor variables (whose `dA/dw` would be a
//! Jacobian) are followed.
//!
//! Refused with a typed error: `w` varying within a group (it must be a GROUP
//! BY key, or the marker goes inside the aggregate), a tensor `w` outside
//! such a `jvp` except in `grad` through `sum`, `avg` and `count` of
//! numbers (`∂f/∂w + Σⱼ ∂f/∂Aⱼ · agg(grad(gⱼ, w))`; otherwise
//! `tensor_avg(grad(loss, w))` is the per-row form), `DISTINCT` aggregates,
//! aggregates without a rule (`median`, `first_value`, …), window outputs,
//! and a marker nested inside another marker that reads aggregates.
//!
//! `max` and `min` need the group's extreme next to each row: a Window node
//! (`max(g) OVER (PARTITION BY keys)`) is inserted below the Aggregate.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Aggregate, Expr, ExprSchemable, JoinType, LogicalPlan, Projection, ScalarUDF, Window,
    WindowFunctionDefinition,
};

use super::RewriteNode;
use crate::engine::call::{as_marker, has_marker, Marker, MarkerKind, SharedRules};
use crate::error::{fail, ErrorKind, GradError};
use crate::plan::free_variables::{
    is_outer_variable, outer_name, outer_variables, plan_reads, same_outer, subquery_reads,
};
use crate::plan::lineage::{
    expr_parts, identity_of, overlaps, parts, rereads, value_use_of_outer, AggregateRef, Identity,
    Scope,
};
use crate::plan::unalias;
use crate::reserved::Placeholder;
use crate::rules::aggregate::{aggregate_rule, tensor_key_rule, AggregateCall, SAME_NULLS};
use crate::tensor::{self, Shape};

/// Rewrites the markers of `node` that read aggregate outputs, adding their
/// derivative aggregates below, where `rewrite` differentiates them; `node`
/// unchanged when none does.
pub(super) fn through_aggregates(node: LogicalPlan, rewrite: &RewriteNode) -> Result<LogicalPlan> {
    let inputs: Vec<LogicalPlan> = node.inputs().into_iter().cloned().collect();
    let scope = Scope::new(inputs.iter().collect())?;
    // Numbered past the columns an earlier rewrite added below (a derivative
    // of a derivative through aggregates: a tangent of a recursive CTE).
    let mut added = Added {
        count: first_free_number(&inputs)?,
        ..Added::default()
    };
    let names = NamePreserver::new(&node);
    let mut changed = false;
    let mut exprs = Vec::new();
    for e in node.expressions() {
        let saved = names.save(&e);
        let t = e.transform_down(|e| rewrite_marker(e, &scope, &mut added))?;
        changed |= t.transformed;
        exprs.push(saved.restore(t.data));
    }
    if !changed {
        return Ok(node);
    }
    let mut new_inputs = Vec::with_capacity(inputs.len());
    for input in &inputs {
        new_inputs.push(match carry(input, &added, rewrite)? {
            Some((plan, _)) => plan,
            None => input.clone(),
        });
    }
    node.with_new_exprs(exprs, new_inputs)
}

/// The aggregate expressions to add to each Aggregate node (by address),
/// with the names of their columns.
#[derive(Default)]
struct Added {
    by_node: HashMap<usize, Vec<(String, Expr)>>,
    /// Window functions over each Aggregate node's groups, computed below it
    /// (a group's maximum for the derivative of `max`).
    windows: HashMap<usize, Vec<(String, Expr)>>,
    count: usize,
}

impl Added {
    /// A column `agg` of the Aggregate (or Window) `plan`, reusing an equal one.
    fn column(&mut self, plan: &LogicalPlan, agg: Expr) -> Expr {
        let list = self.by_node.entry(address(plan)).or_default();
        named(list, &mut self.count, Placeholder::AddedAggregate, agg)
    }

    /// A column of a window function `w` computed below the Aggregate `plan`.
    fn window(&mut self, plan: &LogicalPlan, w: Expr) -> Expr {
        let list = self.windows.entry(address(plan)).or_default();
        named(list, &mut self.count, Placeholder::AddedWindow, w)
    }
}

/// The column of `e` in `list`, added under a new name (item `count` of
/// `family`) if no equal expression is there.
fn named(list: &mut Vec<(String, Expr)>, count: &mut usize, family: Placeholder, e: Expr) -> Expr {
    let name = match list.iter().find(|(_, x)| *x == e) {
        Some((name, _)) => name.clone(),
        None => {
            let name = family.name(*count);
            *count += 1;
            list.push((name.clone(), e));
            name
        }
    };
    Expr::Column(Column::new_unqualified(name))
}

/// The first item number above every added aggregate or window column in
/// the schemas of `plans` and the nodes below them.
fn first_free_number(plans: &[LogicalPlan]) -> Result<usize> {
    let mut next = 0;
    for plan in plans {
        plan.apply(|node| {
            for field in node.schema().fields() {
                let column = Column::new_unqualified(field.name());
                for family in [Placeholder::AddedAggregate, Placeholder::AddedWindow] {
                    if let Some(k) = family.index(&column) {
                        next = next.max(k + 1);
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    Ok(next)
}

fn address(plan: &LogicalPlan) -> usize {
    plan as *const LogicalPlan as usize
}

/// One marker: when its `f` reads aggregate outputs, the equivalent `jvp`
/// form over columns carried up from the aggregates.
fn rewrite_marker(e: Expr, scope: &Scope, added: &mut Added) -> Result<Transformed<Expr>> {
    let Some(call) = as_marker(&e) else {
        return Ok(Transformed::no(e));
    };
    let (kind, rules) = (call.kind(), Arc::clone(call.marker.rules()));
    // The variables: columns, or outer variables (outer references in a
    // subquery, parameters: constant within every group). Any other variable
    // is refused by the marker itself.
    let variables: Vec<(Expr, String)> = kind
        .wrt_positions(call.args.len())?
        .into_iter()
        .filter_map(|p| match &call.args[p] {
            e @ Expr::Column(c) => Some((e.clone(), c.name.clone())),
            e if is_outer_variable(e) => Some((e.clone(), outer_name(e))),
            _ => None,
        })
        .collect();
    let (wrt, outer) = (call.wrt_columns(), outer_variables(kind, call.args));
    if variables.len() != kind.wrt_positions(call.args.len())?.len() {
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    let (f, refs) = scope.inline_through_aggregates(call.args[0].clone(), &wrt, &outer)?;
    if refs.is_empty() {
        return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
    }
    // A jvp whose tangents are constant within the aggregates' groups
    // (literals, outer variables, keys) is taken in one pass: each
    // aggregate's derivative along the tangent, `agg(jvp(g, w₁, t₁, …))`,
    // instead of one derivative aggregate per variable. Tensor variables
    // need it (their per-variable derivative would be a Jacobian).
    let tangents: Vec<Expr> = match kind {
        MarkerKind::Jvp => call.args[2..].iter().step_by(2).cloned().collect(),
        _ => vec![],
    };
    let mut fused = kind == MarkerKind::Jvp;
    for r in &refs {
        for t in &tangents {
            fused &= tangent_below(t, r, scope)?.is_some();
        }
    }
    let mut tensors = Vec::new();
    for (v, _) in &variables {
        if fused {
            break;
        }
        let t = match v {
            Expr::Column(c) => scope
                .schema()
                .qualified_field_from_column(c)?
                .1
                .data_type()
                .clone(),
            Expr::OuterReferenceColumn(field, _) => field.data_type().clone(),
            Expr::Placeholder(p) => p
                .field
                .as_ref()
                .map_or(DataType::Null, |f| f.data_type().clone()),
            _ => unreachable!("variables are columns and outer variables"),
        };
        let numbers_only = refs
            .iter()
            .all(|r| !r.plan.schema().field(r.idx).data_type().is_nested());
        if Shape::is_tensor_type(&t) && (kind != MarkerKind::Grad || !numbers_only) {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "{}: differentiating through an aggregate with respect to the tensor `{v}` \
                     is supported for grad through aggregates with number values; aggregate \
                     the per-row derivative instead, e.g. tensor_avg(grad(loss, {v})) for \
                     grad(avg(loss), {v})",
                    kind.name()
                ),
            );
        }
        tensors.push(Shape::is_tensor_type(&t));
    }
    if has_marker(&f) {
        return fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "{}: a nested marker reads an aggregate output; higher derivatives through \
                 aggregates are not supported",
                kind.name()
            ),
        );
    }
    for r in &refs {
        if let LogicalPlan::Aggregate(a) = r.plan {
            if a.group_expr
                .iter()
                .any(|g| matches!(g, Expr::GroupingSet(_)))
            {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "{}: differentiating through an aggregate with GROUPING SETS, ROLLUP or \
                         CUBE is not supported; use a plain GROUP BY",
                        kind.name()
                    ),
                );
            }
        }
    }
    // f over copies of the aggregate outputs, carried up under new names.
    // (A window output visible here is read where it is: DataFusion 55's
    // common subexpression elimination breaks plans that compute one window
    // expression in two stacked Window nodes.)
    let values: Vec<Expr> = refs
        .iter()
        .map(|r| match (r.plan, scope.column_of(r.plan, r.idx)) {
            (LogicalPlan::Window(_), Some(c)) => Expr::Column(c.clone()),
            _ => added.column(r.plan, aggregate_call(r).clone()),
        })
        .collect();
    let f = Placeholder::Aggregate.fill(f, &values)?;
    let identity = |v: &Expr| match v {
        Expr::Column(c) => scope.identity(c),
        _ => Ok(None),
    };
    // `jvp(f, A₁, dA₁, …, Aₘ, dAₘ, w₁, t₁, …)` along `directions`.
    let along = |directions: &[Direction], tail: Vec<Expr>, added: &mut Added| -> Result<Expr> {
        let mut args = vec![f.clone()];
        let mut nulls_like = Vec::new();
        for (r, value) in refs.iter().zip(&values) {
            args.push(value.clone());
            let (tangent, same_nulls) =
                derivative_aggregate(r, directions, false, &rules, scope, added)?;
            if same_nulls {
                nulls_like.push((args.len(), args.len() - 1));
            }
            args.push(tangent);
        }
        args.extend(tail);
        let jvp = Marker::jvp_with_nulls_like(Arc::clone(&rules), nulls_like);
        Ok(Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(ScalarUDF::new_from_impl(jvp)),
            args,
        )))
    };
    if fused {
        let mut directions = Vec::new();
        let mut tail = Vec::new();
        for ((v, _), t) in variables.iter().zip(&tangents) {
            directions.push(Direction {
                id: identity(v)?,
                w: v,
                tangent: Some(t.clone()),
            });
            tail.extend([v.clone(), t.clone()]);
        }
        let result = along(&directions, tail, added)?;
        return Ok(Transformed::new(result, true, TreeNodeRecursion::Jump));
    }
    // The total derivative with respect to each variable.
    let mut totals = Vec::with_capacity(variables.len());
    for ((v, _), &tensor) in variables.iter().zip(&tensors) {
        let direction = Direction {
            id: identity(v)?,
            w: v,
            tangent: None,
        };
        if !tensor {
            totals.push(along(&[direction], vec![v.clone(), lit(1.0)], added)?);
            continue;
        }
        // A tensor key: `∂f/∂w + Σⱼ (∂f/∂Aⱼ) · dAⱼ/dw`, the partials from
        // one gradient of `f` with respect to `w` and the `Aⱼ`, each
        // `dAⱼ/dw` the aggregate of the rows' gradients (a tensor of `w`'s
        // shape).
        // (`∂f/∂w` only where `f` reads `w` itself.)
        let direct = matches!(v, Expr::Column(c) if f.column_refs().contains(c));
        let mut wrt = vec![f.clone()];
        wrt.extend(direct.then(|| v.clone()));
        wrt.extend(values.iter().cloned());
        let wrt_count = wrt.len() - 1;
        let partials =
            ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, Arc::clone(&rules))).call(wrt);
        let one = wrt_count == 1;
        let partial = |x: &Expr| match x {
            _ if one => partials.clone(),
            Expr::Column(c) => get_field(partials.clone(), c.name.clone()),
            _ => unreachable!("a tensor variable is a column"),
        };
        let mut total = direct.then(|| partial(v));
        for (r, value) in refs.iter().zip(&values) {
            let (d, _) = derivative_aggregate(
                r,
                std::slice::from_ref(&direction),
                true,
                &rules,
                scope,
                added,
            )?;
            if !matches!(d, Expr::Literal(..)) {
                let term = tensor::call("scale", vec![d, partial(value)]);
                total = Some(match total {
                    Some(t) => tensor::call("tensor_add", vec![t, term]),
                    None => term,
                });
            }
        }
        totals.push(total.unwrap_or_else(|| tensor::call("zeros_like", vec![v.clone()])));
    }
    let names = variables.iter().map(|(_, name)| name.as_str());
    let result = kind.assemble(call.args, names, totals)?;
    Ok(Transformed::new(result, true, TreeNodeRecursion::Jump))
}

/// A variable of a marker, its identity (`None` for an outer variable),
/// and its tangent over the marker's input (`None`: seed 1, one variable).
struct Direction<'a> {
    id: Option<Identity>,
    w: &'a Expr,
    tangent: Option<Expr>,
}

/// The GROUP BY (or PARTITION BY) keys of the aggregate output `r`, and
/// the input they are computed over.
fn keys_of<'p>(r: &AggregateRef<'p>) -> (&'p [Expr], &'p Arc<LogicalPlan>) {
    match (r.plan, aggregate_call(r)) {
        (LogicalPlan::Window(win), Expr::WindowFunction(call)) => {
            (&call.params.partition_by, &win.input)
        }
        (LogicalPlan::Aggregate(a), _) => (&a.group_expr, &a.input),
        _ => unreachable!("aggregate references point at Aggregate and Window nodes"),
    }
}

/// The key of `r`'s groups whose value has identity `id`, if one has.
fn key_with<'p>(r: &AggregateRef<'p>, id: Option<Identity>) -> Result<Option<&'p Expr>> {
    let Some(id) = id else {
        return Ok(None);
    };
    let (keys, input) = keys_of(r);
    for (i, k) in keys.iter().enumerate() {
        let identity = match (r.plan, unalias(k)) {
            // A group key is output `i` of the Aggregate.
            (LogicalPlan::Aggregate(_), _) => identity_of(r.plan, i)?,
            (_, Expr::Column(c)) => identity_of(input, input.schema().index_of_column(c)?)?,
            _ => None,
        };
        if identity == Some(id) {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

/// The tangent `t` (over the marker's input) as the rows of the aggregate
/// output `r` see it: each column it reads replaced by the key of `r`'s
/// groups holding the same value; `None` if one is not a key (the tangent
/// may then vary within a group).
fn tangent_below(t: &Expr, r: &AggregateRef, scope: &Scope) -> Result<Option<Expr>> {
    let mut visible = true;
    let below = t.clone().transform_up(|e| match &e {
        Expr::Column(c) => match key_with(r, scope.identity(c)?)? {
            Some(k) => Ok(Transformed::yes(unalias(k).clone())),
            None => {
                visible = false;
                Ok(Transformed::no(e))
            }
        },
        _ => Ok(Transformed::no(e)),
    })?;
    Ok(visible.then_some(below.data))
}

/// The aggregate (or window function) expression behind an output.
fn aggregate_call<'p>(r: &AggregateRef<'p>) -> &'p Expr {
    match r.plan {
        LogicalPlan::Aggregate(a) => unalias(&a.aggr_expr[r.idx - a.group_expr.len()]),
        LogicalPlan::Window(w) => unalias(&w.window_expr[r.idx - w.input.schema().fields().len()]),
        _ => unreachable!("aggregate references point at Aggregate and Window nodes"),
    }
}

/// The derivative of the aggregate (or window) output `r` along
/// `directions` (`dA/dw` for one variable seeded 1) as an expression over
/// new aggregate (window) columns of its node, and whether it is SQL NULL
/// exactly where `A` is.
fn derivative_aggregate(
    r: &AggregateRef,
    directions: &[Direction],
    tensor_key: bool,
    rules: &SharedRules,
    scope: &Scope,
    added: &mut Added,
) -> Result<(Expr, bool)> {
    // The aggregate's name, arguments, DISTINCT flag, and the keys that are
    // constant within its groups (GROUP BY / PARTITION BY) with their input.
    let (udaf, args, distinct, keys, input) = match (r.plan, aggregate_call(r)) {
        (LogicalPlan::Aggregate(a), Expr::AggregateFunction(call)) => (
            &call.func,
            &call.params.args,
            call.params.distinct,
            &a.group_expr,
            &a.input,
        ),
        (LogicalPlan::Window(win), Expr::WindowFunction(call)) => match &call.fun {
            WindowFunctionDefinition::AggregateUDF(f) => (
                f,
                &call.params.args,
                call.params.distinct,
                &call.params.partition_by,
                &win.input,
            ),
            WindowFunctionDefinition::WindowUDF(f) => {
                // Piecewise constant in what it partitions and orders by
                // (`row_number`, `rank`, …), so it contributes 0 unless a
                // variable flows into its arguments (`lag(x)`).
                let mut read = None;
                for d in directions {
                    if reads_variable(&call.params.args, &win.input, d.w, scope)? {
                        read = Some(d.w);
                    }
                }
                let Some(w) = read else {
                    return Ok((lit(0.0), false));
                };
                return Err(GradError::non_differentiable(
                    f.name(),
                    &format!(
                        "a ranking or navigation window function has no derivative with \
                         respect to `{w}`, which its arguments read (it is piecewise constant \
                         only in what it partitions and orders by)"
                    ),
                )
                .into());
            }
        },
        (_, e) => {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!("`{e}` is not an aggregate call"),
            )
        }
    };
    let name = udaf.name();
    let keyword = match r.plan {
        LogicalPlan::Window(_) => "PARTITION BY",
        _ => "GROUP BY",
    };
    // Each variable below the aggregate (one of its keys, or an outer
    // variable) with its tangent there; variables its rows do not depend
    // on are left out.
    let mut below: Vec<(Expr, Option<Expr>)> = Vec::new();
    for Direction { id, w, tangent } in directions {
        let (id, w) = (*id, *w);
        let key = key_with(r, id)?;
        let w_in = match (w, key.map(unalias)) {
            (Expr::OuterReferenceColumn(_, c), _) => {
                let is_c = |e: &Expr| Ok(matches!(e, Expr::OuterReferenceColumn(_, o) if o == c));
                if value_use_of_outer(input, c)?.is_none()
                    && !args.iter().any(|a| a.exists(is_c).unwrap_or(true))
                {
                    // Neither the aggregate nor its input reads the outer column
                    // as a value (an equality key selects rows: piecewise constant).
                    continue;
                }
                w.clone()
            }
            (Expr::Placeholder(_), _) => {
                let reads = |e: &Expr| e.exists(|n| Ok(same_outer(n, w) || subquery_reads(n, w)?));
                if !args.iter().any(|a| reads(a).unwrap_or(true)) && !plan_reads(input, w)? {
                    // The aggregate's rows do not depend on the parameter.
                    continue;
                }
                w.clone()
            }
            (_, Some(Expr::Column(c))) => Expr::Column(c.clone()),
            (_, Some(other)) => {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "the variable `{w}` is the key `{other}`, an expression; use the column \
                         itself in {keyword} to differentiate {name}(…) with respect to it"
                    ),
                )
            }
            (_, None) => {
                let below = Scope::new(vec![input.as_ref()])?;
                if id.is_some_and(|id| below.sees(id)) {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "the variable `{w}` varies within the groups of {name}(…): add it to \
                             the {keyword} (it is then constant within each group), or put the \
                             marker inside the aggregate, e.g. avg(grad(f, {w}))"
                        ),
                    );
                }
                if let Expr::Column(c) = w {
                    // Another scan of the variable's rows: the aggregate depends
                    // on the variable in the other rows.
                    if overlaps(&scope.parts(c)?, &parts(r.plan, r.idx)?) {
                        let what = match r.plan {
                            LogicalPlan::Window(_) => "window function",
                            _ => "aggregate",
                        };
                        return rereads(c, &format!("the {what} `{}`", aggregate_call(r)));
                    }
                    if input.schema().has_column(c) || keys.iter().any(|k| unalias(k) == w) {
                        // The same name below, but not traced to the same value:
                        // never guess 0 (seen with a prepared statement's
                        // parameter, substituted before the plan is analyzed).
                        return fail(
                            ErrorKind::NeedsPlanContext,
                            format!(
                                "the variable `{w}` is visible below {name}(…) but could not \
                                 be traced to the same value there; put the marker inside \
                                 the aggregate instead, e.g. avg(grad(f, {w}))"
                            ),
                        );
                    }
                }
                // The aggregate's input does not see the variable at all.
                continue;
            }
        };
        let tangent = match tangent {
            Some(t) => Some(tangent_below(t, r, scope)?.expect("checked visible below")),
            None => None,
        };
        below.push((w_in, tangent));
    }
    if below.is_empty() {
        return Ok((lit(0.0), false));
    }
    if distinct {
        return fail(
            ErrorKind::NonDifferentiable,
            format!("{name}(DISTINCT …) has no derivative: equal values are merged"),
        );
    }
    let (rule_name, rule) = match tensor_key {
        false => aggregate_rule(udaf).ok_or_else(|| {
            GradError::non_differentiable(
                name,
                "no derivative rule is registered for this aggregate (supported: sum, avg, \
                 count, tensor_sum, tensor_avg, var_samp, var_pop, stddev, stddev_pop, \
                 covar_samp, covar_pop, corr, min, max)",
            )
        })?,
        true => tensor_key_rule(udaf).ok_or_else(|| {
            GradError::non_differentiable(
                name,
                "its gradient with respect to a tensor GROUP BY key is not supported (supported: \
                 sum, avg, count); aggregate the per-row derivative instead, e.g. \
                 tensor_avg(grad(loss, w))",
            )
        })?,
    };
    let marker = |kind| ScalarUDF::new_from_impl(Marker::new(kind, Arc::clone(rules)));
    let derivatives = args
        .iter()
        .map(|g| match &below[..] {
            // (A tensor argument's derivative is `jvp(g, w, 1)`, of its shape.)
            [(w_in, None)] if !is_tensor(g, input)? => {
                Ok(marker(MarkerKind::Grad).call(vec![g.clone(), w_in.clone()]))
            }
            _ => {
                let mut jvp = vec![g.clone()];
                for (w_in, t) in &below {
                    jvp.extend([w_in.clone(), t.clone().unwrap_or(lit(1.0))]);
                }
                Ok(marker(MarkerKind::Jvp).call(jvp))
            }
        })
        .collect::<Result<_>>()?;
    let derivative = match (r.plan, aggregate_call(r)) {
        (LogicalPlan::Aggregate(a), Expr::AggregateFunction(call)) => {
            rule(&AggregateCall::new(call, &a.group_expr, derivatives))?
        }
        (_, Expr::WindowFunction(call)) => rule(&AggregateCall::window(call, derivatives))?,
        _ => unreachable!("matched above"),
    };
    // Under an Aggregate, each aggregate call of the rule's result becomes a
    // column of the node and each window function a column below it; under a
    // Window, each window function becomes a column of the node.
    let is_window = matches!(r.plan, LogicalPlan::Window(_));
    let original = scope
        .column_of(r.plan, r.idx)
        .map(|c| (aggregate_call(r), Expr::Column(c.clone())));
    let derivative = derivative
        .transform_down(|e| match (e, &original) {
            // The window output itself (the stddev rule divides by it).
            (e, Some((call, column))) if is_window && e == **call => Ok(Transformed::new(
                column.clone(),
                true,
                TreeNodeRecursion::Jump,
            )),
            (e, _) => Ok(Transformed::no(e)),
        })?
        .data
        .transform_up(|e| match e {
            Expr::WindowFunction(_) if is_window => Ok(Transformed::yes(added.column(r.plan, e))),
            Expr::WindowFunction(_) => Ok(Transformed::yes(added.window(r.plan, e))),
            e => Ok(Transformed::no(e)),
        })?
        .data
        .transform_down(|e| match e {
            Expr::AggregateFunction(_) => Ok(Transformed::new(
                added.column(r.plan, e),
                true,
                TreeNodeRecursion::Jump,
            )),
            e => Ok(Transformed::no(e)),
        })?
        .data;
    Ok((derivative, SAME_NULLS.contains(&rule_name)))
}

/// Whether `e` (over `input`) is tensor-valued.
fn is_tensor(e: &Expr, input: &LogicalPlan) -> Result<bool> {
    Ok(Shape::is_tensor_type(&e.get_type(input.schema().as_ref())?))
}

/// Whether the arguments `args` (over `input`) of an aggregate or window
/// function read the variable `w` (a column of `scope`, or an outer
/// variable), or what it is made of.
fn reads_variable(args: &[Expr], input: &LogicalPlan, w: &Expr, scope: &Scope) -> Result<bool> {
    match w {
        Expr::Column(c) => {
            let variable = scope.parts(c)?;
            for a in args {
                if overlaps(&variable, &expr_parts(a, input)?) {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        w => {
            let reads = |e: &Expr| e.exists(|n| Ok(same_outer(n, w) || subquery_reads(n, w)?));
            for a in args {
                if reads(a)? {
                    return Ok(true);
                }
            }
            plan_reads(input, w)
        }
    }
}

/// `plan` with the added aggregate columns computed in their Aggregate nodes
/// and passed up to `plan`'s output, and their names; `None` when no added
/// column is below `plan`.
fn carry(
    plan: &LogicalPlan,
    added: &Added,
    rewrite: &RewriteNode,
) -> Result<Option<(LogicalPlan, Vec<String>)>> {
    if let (Some(columns), LogicalPlan::Window(w)) = (added.by_node.get(&address(plan)), plan) {
        // Window nodes stack (one per distinct window): carry from below first.
        let (input, mut names) = match carry(&w.input, added, rewrite)? {
            Some((input, names)) => (Arc::new(input), names),
            None => (Arc::clone(&w.input), vec![]),
        };
        let mut exprs = w.window_expr.clone();
        exprs.extend(columns.iter().map(|(n, e)| e.clone().alias(n)));
        let node = LogicalPlan::Window(Window::try_new(exprs, input)?);
        // The new window functions hold markers: differentiate them now.
        let node = rewrite(node)?.data;
        names.extend(columns.iter().map(|(n, _)| n.clone()));
        return Ok(Some((node, names)));
    }
    if let Some(columns) = added.by_node.get(&address(plan)) {
        let LogicalPlan::Aggregate(a) = plan else {
            unreachable!("columns are added to Aggregate and Window nodes")
        };
        let mut aggr = a.aggr_expr.clone();
        aggr.extend(columns.iter().map(|(n, e)| e.clone().alias(n)));
        let input = match added.windows.get(&address(plan)) {
            Some(windows) => Arc::new(LogicalPlan::Window(Window::try_new(
                windows.iter().map(|(n, e)| e.clone().alias(n)).collect(),
                Arc::clone(&a.input),
            )?)),
            None => Arc::clone(&a.input),
        };
        let node = LogicalPlan::Aggregate(Aggregate::try_new(input, a.group_expr.clone(), aggr)?);
        // The new aggregates hold markers: differentiate them now.
        let node = rewrite(node)?.data;
        return Ok(Some((
            node,
            columns.iter().map(|(n, _)| n.clone()).collect(),
        )));
    }
    let mut inputs = Vec::new();
    let mut names = Vec::new();
    let mut changed = false;
    for input in plan.inputs() {
        match carry(input, added, rewrite)? {
            Some((p, n)) => {
                changed = true;
                inputs.push(p);
                names.extend(n);
            }
            None => inputs.push(input.clone()),
        }
    }
    if !changed {
        return Ok(None);
    }
    let node = match plan {
        LogicalPlan::Projection(p) => {
            let mut exprs = p.expr.clone();
            exprs.extend(
                names
                    .iter()
                    .map(|n| Expr::Column(Column::new_unqualified(n))),
            );
            let input = inputs.pop().expect("one input");
            LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?)
        }
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Window(_) => plan.with_new_exprs(plan.expressions(), inputs)?,
        LogicalPlan::Join(j)
            if matches!(
                j.join_type,
                JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
            ) =>
        {
            plan.with_new_exprs(plan.expressions(), inputs)?
        }
        other => {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "the derivative of an aggregate cannot be carried up through this plan \
                     node: {}",
                    other.display()
                ),
            )
        }
    };
    Ok(Some((node, names)))
}
