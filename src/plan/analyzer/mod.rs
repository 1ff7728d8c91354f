//! The analyzer rule installed with the markers.
//!
//! It runs on every plan (also with the optimizer disabled, and inside
//! subqueries, recursive CTEs, DML, CTAS and views) and rewrites each marker
//! with the plan around it in view:
//! - derived columns: `f` is rewritten to differentiate through definitions
//!   below (see [`super::lineage`]);
//! - through aggregates: a marker whose `f` reads aggregate outputs is
//!   rewritten by the chain rule across the Aggregate node (child module
//!   `aggregates`);
//! - with respect to a table's rows: a loss subquery in `f` that reads the
//!   variable's own rows is differentiated by relational reverse mode, its
//!   gradient table joined by the row (child module `tables`);
//! - through scalar subqueries: a subquery in `f` that reads the variable is
//!   differentiated inside (child module `subqueries`), and a marker inside
//!   a subquery may differentiate with respect to an outer column or a
//!   parameter (see [`super::free_variables`]); a result DataFusion 55 cannot execute is refused
//!   with a typed error, never treated as an independent column (which
//!   would silently give 0);
//! - through a recursive CTE's iterations: a variable the recursive term
//!   carries unchanged (a hyperparameter, an initial state) is followed in
//!   forward mode, by tangent columns added to the CTE (child module
//!   `recursion`);
//! - `f` reading a value that the variable flows into where the rewrite
//!   cannot follow (through a recursive CTE's iterations otherwise, or another scan of
//!   the variable's rows in a subquery, aggregate or window) is refused with
//!   a typed error (see [`super::lineage`]);
//! - the markers of one plan node are differentiated together in one DAG
//!   ([`Workspace`]), and the subexpressions their derivatives share are
//!   computed once, by projections inserted below the node ([`share`]): the
//!   derivative stays `O(n)` for an `n`-node `f` instead of growing as a tree.
//!   This applies to projections, aggregates, filters, sorts and windows;
//!   markers elsewhere (e.g. a join condition) become self-contained
//!   expressions, like the markers' own `simplify` produces.

use std::cell::Cell;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, when, Expr, LogicalPlan, Operator, Projection, ScalarUDF, Subquery,
};
use datafusion::optimizer::optimize_projections::OptimizeProjections;
use datafusion::optimizer::{AnalyzerRule, OptimizerConfig, OptimizerContext, OptimizerRule};

mod aggregates;
mod backward_recursion;
mod loop_tables;
mod recursion;
mod rereading_transpose;
mod reverse_recursion;
mod subqueries;
mod tables;
mod tangent_plan;
mod visible;

use aggregates::through_aggregates;
use recursion::{
    rereading_loop_below, rereads_below, through_recursion, through_rereading_recursion,
};
use subqueries::through_subqueries;
use tables::{hoist_markers, through_tables};
use visible::widen_aggregate_inputs;

use super::columns;
use super::cross_joins::CrossJoinsKeepingNulls;
use super::dml::inline_updates;
use super::expand::expand_markers;
use super::free_variables::{has_outer_variable, outer_variables};
use super::lineage::{correlated_value_use, refuse_outer_rereads, refuse_rereads, Scope};
use super::overwrite::{overwrite_updates, updates_gradient_table};
use crate::engine::call::{as_marker, has_marker, into_marker, Marker, SharedRules};
use crate::engine::{share, Layer, Workspace};
use crate::error::{fail, ErrorKind};
use crate::options::RecursionMode;
use crate::reserved::{binding_prefix, Placeholder};

/// Differentiates with the plan in view; see the [module docs](self).
#[derive(Debug, Default)]
pub struct GradAnalyzer;

impl AnalyzerRule for GradAnalyzer {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        refuse_outer_rereads(&plan)?;
        let analyzed = differentiate(plan.clone(), config)?;
        // An UPDATE that needs a gradient table overwrites its table instead
        // (see `crate::plan::overwrite`): planned again in that form.
        let analyzed = match updates_gradient_table(&analyzed)? {
            true => differentiate(overwrite_updates(plan)?, config)?,
            false => analyzed,
        };
        inline_updates(analyzed).map(|t| t.data)
    }

    fn name(&self) -> &str {
        "datafusion_grad"
    }
}

/// `state` with the rewrite installed: [`GradAnalyzer`] after its analyzer
/// rules and [`GradBeforeOptimizing`] before its optimizer rules, and
/// DataFusion's `eliminate_cross_join` kept from merging joins that match
/// NULL keys differently ([`CrossJoinsKeepingNulls`]) (by
/// `crate::register`, and in a Ballista scheduler's state).
pub fn with_rewrite_rules(state: SessionState) -> SessionState {
    let mut optimizer_rules: Vec<Arc<dyn OptimizerRule + Send + Sync>> =
        vec![Arc::new(GradBeforeOptimizing)];
    let cross_joins: Arc<dyn OptimizerRule + Send + Sync> =
        Arc::new(CrossJoinsKeepingNulls::default());
    optimizer_rules.extend(state.optimizers().iter().map(|rule| {
        match rule.name() == cross_joins.name() {
            true => Arc::clone(&cross_joins),
            false => Arc::clone(rule),
        }
    }));
    SessionStateBuilder::new_from_existing(state)
        .with_analyzer_rule(Arc::new(GradAnalyzer))
        .with_optimizer_rules(optimizer_rules)
        .build()
}

/// The analyzer's rewrite as the first optimizer rule. DataFusion 55's
/// `PREPARE` optimizes the statement without analyzing it, and a marker left
/// to its own `simplify` has no plan context (a derived column or an
/// aggregate output would count as independent of the variable: silently
/// 0). Plans without markers are left alone.
#[derive(Debug, Default)]
pub struct GradBeforeOptimizing;

impl OptimizerRule for GradBeforeOptimizing {
    fn name(&self) -> &str {
        "datafusion_grad_before_optimizing"
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !holds_markers(&plan)? {
            return Ok(Transformed::no(plan));
        }
        Ok(Transformed::yes(
            GradAnalyzer.analyze(plan, config.options().as_ref())?,
        ))
    }
}

/// Whether a node of `plan` (or of its subqueries) holds a marker.
fn holds_markers(plan: &LogicalPlan) -> Result<bool> {
    let mut marked = false;
    plan.apply_with_subqueries(|node| {
        marked = node.expressions().iter().any(has_marker);
        Ok(match marked {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(marked)
}

/// `plan` with its markers rewritten, node by node from the leaves up.
fn differentiate(plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
    if !holds_markers(&plan)? {
        return Ok(plan);
    }
    let plan = widen_aggregate_inputs(plan)?;
    let plan = reverse_recursion::with_mode(RecursionMode::of(config), || {
        // Markers through a loop whose step reads its work table again
        // first, while that step's own markers are as written.
        plan.transform_up_with_subqueries(rewrite_rereading_loops)?
            .transform_parent(|plan| plan.transform_up_with_subqueries(rewrite_node))
    })?;
    match plan.transformed {
        true => refresh_outer_references(plan.data),
        false => Ok(plan.data),
    }
}

/// `plan` with each subquery expression listing the outer columns its plan
/// reads now: a derivative may read fewer than the expression it replaced
/// (`d/dx avg(g.w · x) = avg(g.w)` is uncorrelated), and DataFusion
/// decorrelates by that list.
fn refresh_outer_references(plan: LogicalPlan) -> Result<LogicalPlan> {
    let refresh = |s: &mut Subquery| -> Result<bool> {
        if correlated_value_use(&s.subquery)?.is_some() {
            // A value the derivative no longer reads (the aggregate a
            // derivative replaced) may be all that keeps it correlated.
            s.subquery = Arc::new(prune(Arc::unwrap_or_clone(Arc::clone(&s.subquery)))?);
        }
        let now = s.subquery.all_out_ref_exprs();
        let changed = now != s.outer_ref_columns;
        s.outer_ref_columns = now;
        Ok(changed)
    };
    Ok(plan
        .transform_up_with_subqueries(|node| {
            node.map_expressions(|e| {
                e.transform_up(|e| {
                    Ok(match e {
                        Expr::ScalarSubquery(mut s) => {
                            let changed = refresh(&mut s)?;
                            Transformed::new_transformed(Expr::ScalarSubquery(s), changed)
                        }
                        Expr::Exists(mut x) => {
                            let changed = refresh(&mut x.subquery)?;
                            Transformed::new_transformed(Expr::Exists(x), changed)
                        }
                        Expr::InSubquery(mut x) => {
                            let changed = refresh(&mut x.subquery)?;
                            Transformed::new_transformed(Expr::InSubquery(x), changed)
                        }
                        e => Transformed::no(e),
                    })
                })
            })
        })?
        .data)
}

/// `plan` without the expressions nothing reads (DataFusion's
/// `optimize_projections`).
fn prune(plan: LogicalPlan) -> Result<LogicalPlan> {
    let config = OptimizerContext::new();
    Ok(OptimizeProjections::new().rewrite(plan, &config)?.data)
}

/// The total derivative with respect to the variable `c` by the chain rule
/// through bound values: `jvp(f, v₁, t₁, …, c, 1)` over `args` (`f` and the
/// value/tangent pairs), NULL where a `nullable` `c` is.
fn chain_total(
    rules: &SharedRules,
    mut args: Vec<Expr>,
    nulls_like: Vec<(usize, usize)>,
    c: &Column,
    nullable: bool,
) -> Result<Expr> {
    args.extend([Expr::Column(c.clone()), lit(1.0)]);
    let jvp = Marker::jvp_with_nulls_like(Arc::clone(rules), nulls_like);
    let total = Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(ScalarUDF::new_from_impl(jvp)),
        args,
    ));
    match nullable {
        true => when(
            Expr::Column(c.clone()).is_null(),
            lit(ScalarValue::Float64(None)),
        )
        .otherwise(total),
        false => Ok(total),
    }
}

/// How the markers of one plan node are rewritten: [`rewrite_node`], or
/// the pre-pass's rewrite of a node whose markers go through a loop that
/// reads its work table again.
type RewriteNode<'a> = dyn Fn(LogicalPlan) -> Result<Transformed<LogicalPlan>> + 'a;

/// Rewrites the markers of one plan node.
fn rewrite_node(node: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    if !node.expressions().iter().any(has_marker) {
        return Ok(Transformed::no(node));
    }
    if let Some(hoisted) = hoist_markers(&node)? {
        let below = rewrite_node(hoisted.below.clone())?.data;
        return Ok(Transformed::yes(hoisted.over(below)?));
    }
    rewrite_markers(through_recursion(node)?, &rewrite_node)
}

/// Rewrites the markers of a node above a recursive CTE whose recursive
/// term reads its work table more than once, in forward mode through it
/// (see `recursion::through_rereading_recursion`), and of a node whose
/// markers go through such a loop inside an aggregate they read
/// (`grad(avg(loss), lr) … GROUP BY lr` moves into the aggregate, which is
/// rewritten so); other nodes unchanged.
fn rewrite_rereading_loops(node: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    if !node.expressions().iter().any(has_marker) || hoist_markers(&node)?.is_some() {
        return Ok(Transformed::no(node));
    }
    if rereads_below(&node)? {
        return rewrite_markers(through_rereading_recursion(node)?, &rewrite_node);
    }
    if rereading_transpose::valued_below(&node)? {
        return rewrite_markers(node, &rewrite_node);
    }
    if !rereading_loop_below(&node)? {
        return Ok(Transformed::no(node));
    }
    // Taken only if every aggregate a marker moves into goes through such
    // a loop: the main pass rewrites the rest, the nodes below first.
    let (through, other) = (Cell::new(false), Cell::new(false));
    let into_aggregate = |below: LogicalPlan| {
        if rereads_below(&below)? {
            through.set(true);
            return rewrite_markers(through_rereading_recursion(below)?, &rewrite_node);
        }
        other.set(true);
        Ok(Transformed::no(below))
    };
    let moved = rewrite_markers(node.clone(), &into_aggregate)?;
    match through.get() && !other.get() {
        true => Ok(moved),
        false => Ok(Transformed::no(node)),
    }
}

/// Rewrites the markers of one plan node, those through a recursive CTE
/// done; `into_aggregate` rewrites the markers moved into an aggregate
/// below.
fn rewrite_markers(
    node: LogicalPlan,
    into_aggregate: &RewriteNode,
) -> Result<Transformed<LogicalPlan>> {
    let node = through_tables(node)?;
    refuse_rereads(&node)?;
    let (node, subqueries) = through_subqueries(node)?;
    let node = through_aggregates(node, into_aggregate)?;
    let node = inline_derived(node)?;
    // Variables that are outer references are differentiated marker by
    // marker, each localized (see `crate::plan::free_variables`).
    let outer: Vec<bool> = node.expressions().iter().map(has_outer_variable).collect();
    let plan = match node {
        node if outer.contains(&true) => refuse_correlated(expand(node)?, &outer)?,
        LogicalPlan::Projection(_)
        | LogicalPlan::Aggregate(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Window(_) => differentiate_shared(node)?,
        node => expand(node)?,
    };
    Ok(Transformed::yes(subqueries.finish(plan)?))
}

/// `node` (its markers with outer-reference variables differentiated, in
/// the expressions flagged in `marked`) refused when such an expression
/// still reads an outer column as a value: DataFusion 55 cannot execute
/// that subquery.
fn refuse_correlated(node: LogicalPlan, marked: &[bool]) -> Result<LogicalPlan> {
    if matches!(node, LogicalPlan::Filter(_)) {
        return Ok(node);
    }
    for (e, _) in node.expressions().iter().zip(marked).filter(|(_, m)| **m) {
        let mut outer = None;
        e.apply(|e| {
            if let Expr::OuterReferenceColumn(field, c) = e {
                outer = Some((c.clone(), field.is_nullable()));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if let Some((c, nullable)) = outer {
            let null_test = match nullable {
                true => format!(
                    " (`{c}` can be NULL, and the derivative is NULL where f is, so it tests \
                     `{c}`: declare the column NOT NULL if it has no NULLs)"
                ),
                false => String::new(),
            };
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "the derivative with respect to the outer column `{c}` is `{e}`, which still \
                     reads `{c}`{null_test}; DataFusion 55 cannot execute a correlated subquery \
                     that uses an outer column anywhere but in an equality predicate (`WHERE \
                     inner = outer`); write it as a join grouped by the variable instead, e.g. \
                     `SELECT {n}, grad(avg(f), {n}) FROM outer_table CROSS JOIN inner_table \
                     GROUP BY {n}`",
                    n = c.name
                ),
            );
        }
    }
    Ok(node)
}

/// `node` with each marker rewritten into a self-contained derivative.
fn expand(node: LogicalPlan) -> Result<LogicalPlan> {
    let schema = Scope::new(node.inputs())?.schema().clone();
    let names = NamePreserver::new(&node);
    node.map_expressions(|e| {
        let saved = names.save(&e);
        Ok(expand_markers(e, &schema)?.update_data(|e| saved.restore(e)))
    })?
    .data
    .recompute_schema()
}

/// `node` with derived columns inlined into its markers' `f`.
fn inline_derived(node: LogicalPlan) -> Result<LogicalPlan> {
    let inputs: Vec<LogicalPlan> = node.inputs().into_iter().cloned().collect();
    let scope = Scope::new(inputs.iter().collect())?;
    let names = NamePreserver::new(&node);
    let rewritten = node.map_expressions(|e| {
        let saved = names.save(&e);
        let t = e.transform_up(|e| rewrite_marker(e, &scope))?;
        Ok(t.update_data(|e| saved.restore(e)))
    })?;
    if rewritten.transformed {
        rewritten.data.recompute_schema()
    } else {
        Ok(rewritten.data)
    }
}

/// Differentiates the markers of a single-input `node` together, binding
/// their shared parts to columns of projections inserted below it.
fn differentiate_shared(node: LogicalPlan) -> Result<LogicalPlan> {
    let input = node.inputs()[0].clone();
    let schema = Arc::clone(input.schema());
    let exprs = node.expressions();
    let Some(rules) = exprs.iter().find_map(|e| {
        let mut found = None;
        e.apply(|e| {
            found = as_marker(e).map(|call| Arc::clone(call.marker.rules()));
            Ok(match found {
                Some(_) => TreeNodeRecursion::Stop,
                None => TreeNodeRecursion::Continue,
            })
        })
        .ok()?;
        found
    }) else {
        return Ok(node);
    };
    let rules = rules.read().expect("rule table lock");
    let mut ws = Workspace::new(&schema, &rules);
    let names = NamePreserver::new(&node);
    let mut roots = Vec::new();
    let mut always = Vec::new();
    let mut replaced = Vec::with_capacity(exprs.len());
    for e in exprs {
        let saved = names.save(&e);
        let unconditional = !has_conditional(&e)?;
        let e = ws.differentiate_markers(e, Placeholder::Root, &mut roots)?;
        always.resize(roots.len(), unconditional);
        replaced.push((saved, e));
    }
    let shared = share(&mut ws, &roots, &always, &binding_prefix(&schema))?;
    let mut new_exprs = Vec::with_capacity(replaced.len());
    for (saved, e) in replaced {
        new_exprs.push(saved.restore(Placeholder::Root.fill(e, &shared.exprs)?));
    }
    let adds_columns = !shared.layers.is_empty()
        && matches!(
            node,
            LogicalPlan::Filter(_) | LogicalPlan::Sort(_) | LogicalPlan::Window(_)
        );
    let output = columns(&node);
    let plan = node.with_new_exprs(new_exprs, vec![bind(input, shared.layers)?])?;
    if adds_columns {
        // These nodes pass their input's columns on: drop the bound ones.
        Ok(LogicalPlan::Projection(Projection::try_new(
            output,
            Arc::new(plan),
        )?))
    } else {
        Ok(plan)
    }
}

/// Whether `e` evaluates some part only on some rows (`CASE`, `AND`/`OR`,
/// `coalesce`) outside its markers: a marker there is not evaluated on every row.
fn has_conditional(e: &Expr) -> Result<bool> {
    let mut found = false;
    e.apply(|e| {
        if as_marker(e).is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        found |= match e {
            Expr::Case(_) => true,
            Expr::BinaryExpr(b) => matches!(b.op, Operator::And | Operator::Or),
            Expr::ScalarFunction(f) => (1..f.args.len()).any(|i| !share::is_unconditional(e, i)),
            _ => false,
        };
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}

/// `input` under one projection per layer, each passing `input`'s columns on.
fn bind(input: LogicalPlan, layers: Vec<Layer>) -> Result<LogicalPlan> {
    let passed = columns(&input);
    let mut plan = input;
    for layer in layers {
        let mut exprs = passed.clone();
        exprs.extend(
            layer
                .carried
                .into_iter()
                .map(|n| Expr::Column(Column::new_unqualified(n))),
        );
        exprs.extend(layer.defined.into_iter().map(|(n, e)| e.alias(n)));
        plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(plan))?);
    }
    Ok(plan)
}

/// Inlines derived columns into a marker's `f` (its first argument).
fn rewrite_marker(e: Expr, scope: &Scope) -> Result<Transformed<Expr>> {
    let (kind, ScalarFunction { func, mut args }) = match into_marker(e) {
        Ok(call) => call,
        Err(e) => return Ok(Transformed::no(e)),
    };
    let wrt: Vec<Column> = kind.wrt_columns(&args);
    let outer = outer_variables(kind, &args);
    if kind.wrt_positions(args.len())?.len() != wrt.len() + outer.len() {
        // Some variable is neither a column nor an outer reference: the
        // marker itself refuses it.
        let call = Expr::ScalarFunction(ScalarFunction { func, args });
        return Ok(Transformed::no(call));
    }
    let f = args.remove(0);
    let f = scope.inline(f, &wrt, &outer)?;
    args.insert(0, f.data);
    let call = Expr::ScalarFunction(ScalarFunction { func, args });
    Ok(Transformed::new_transformed(call, f.transformed))
}
