//! Relational reverse mode through a training loop: the gradient of a loss
//! with respect to every row of a table that a recursive CTE's step
//! aggregates over — the value of each training row to a model trained by
//! the loop (data valuation), in one query.
//!
//! The loss reads the rows of the table through the loop's iterations:
//! `train`'s step aggregates over `d` (`SELECT … FROM train CROSS JOIN d
//! GROUP BY step, w`), and the loss reads `train`. Its derivative with
//! respect to one row's value is, by the chain rule through the iterations,
//!
//! - the loss's own derivative where it reads the table directly, plus
//! - per iteration `k ≥ 1`, the pull-back of the state's adjoint `ā_k`
//!   through the step's aggregates: with `ḡ_j` the cotangent of aggregate
//!   `j` at iteration `k` (as the loop's reverse mode computes it, see the
//!   sibling module `backward_recursion`), the derivative of `Σ_j ⟨ḡ_j,
//!   g_j⟩` with respect to the row, where `g_j` is the aggregate over the
//!   step's rows at iteration `k - 1`.
//!
//! So the rewrite computes the CTE once with its history, the adjoints of
//! its rows as the loss reads them (relational reverse mode with the CTE as
//! the parameter relation, its rows told apart by trajectory and
//! iteration), runs the loop's backward recursion from them, and then makes
//! one pass over the step's rows of every iteration at once (the data joined
//! with the loop's rows, each row carrying the cotangents of the aggregates
//! it feeds — divided by the row count for an average): the derivative of
//! `Σ_j ⟨ḡ_j, h_j⟩` at each row with respect to the table's column, summed
//! per row of the table by relational reverse mode's group join.
//!
//! ```sql
//! -- The value of each training row: the derivative of the validation loss
//! -- after 20 steps of weighted least squares with respect to its weight.
//! WITH RECURSIVE train(step, w) AS (
//!   SELECT 0, 0.0
//!   UNION ALL
//!   SELECT step + 1, w - 0.1 * sum(d.wt * grad(power(w * d.x - d.y, 2), w)) / sum(d.wt)
//!   FROM train CROSS JOIN d WHERE step < 20 GROUP BY step, w),
//! loss AS (SELECT avg(power(w * v.x - v.y, 2)) AS loss FROM train CROSS JOIN v WHERE step = 20)
//! SELECT d.i, grad((SELECT loss FROM loss), d.wt) FROM d;
//! ```
//!
//! Refused with typed errors: a loss that reads the table through several
//! recursive CTEs, a CTE whose step is not an aggregating step of the
//! loop's reverse mode (`UNION` distinct, a row-wise step, an aggregate
//! other than sum, avg, tensor_sum, tensor_avg and count), a first row that
//! reads the table; the rest as relational reverse mode refuses it.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::coalesce;
use datafusion::logical_expr::{
    lit, Aggregate, Expr, JoinType, LogicalPlan, LogicalPlanBuilder, Projection, SubqueryAlias,
};

use super::backward_recursion::{total_of, with_history, zero, AggregatingStep, Transpose};
use super::recursion::work_table_reads;
use super::rereading_transpose;
use super::reverse_recursion::differentiable_columns;
use crate::engine::call::SharedRules;
use crate::error::{fail, ErrorKind};
use crate::plan::refuse_volatile;
use crate::plan::reverse::{
    self, loss_contributions, reads, share_aggregates, weighted_contributions, GroupJoin, Parameter,
};
use crate::plan::shared::{share, shared_input};
use crate::reserved::{
    adjoint_column, aggregate_column, Placeholder, FORWARD, GRADIENT, ITERATION_COLUMN,
    TRAJECTORY_COLUMN,
};

/// The gradient table of `loss` with respect to `parameter`, as
/// [`reverse::gradient_table`] gives it, where the loss may read the
/// parameter rows through one recursive CTE whose step aggregates over
/// them: see the [module docs](self).
pub(super) fn gradient_table(
    loss: &LogicalPlan,
    parameter: Parameter,
    rules: &SharedRules,
) -> Result<LogicalPlan> {
    refuse_volatile(
        loss,
        "relational reverse mode evaluates the loss's plan again (its values, then the \
         backward pass over its rows)",
    )?;
    let mut loops = Vec::new();
    loops_reading(loss, parameter.relation, &mut loops)?;
    let cte = match loops.as_slice() {
        [] => {
            let rules = rules.read().expect("rule table lock");
            return reverse::gradient_table(loss, parameter, &rules);
        }
        [cte] => cte.clone(),
        _ => {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "the loss reads the rows of `{}` through several recursive CTEs; relational \
                     reverse mode follows one loop",
                    parameter.names.0
                ),
            )
        }
    };
    let LogicalPlan::RecursiveQuery(r) = &cte else {
        unreachable!("a recursive CTE")
    };
    let refuse = |why: &str| -> Result<LogicalPlan> {
        fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "the loss reads the rows of `{}` through the recursive CTE `{}`: {why}",
                parameter.names.0, r.name
            ),
        )
    };
    if r.is_distinct {
        return refuse(
            "it is a UNION (distinct), which drops rows by their values; write UNION ALL",
        );
    }
    if reads(&r.static_term, parameter.relation)?
        && names_column(
            &r.static_term,
            parameter.relation.schema().field(parameter.column).name(),
        )?
    {
        return refuse(
            "its first row reads the table's column; relational reverse mode follows the \
             table's rows into the loop's steps, not into its first row",
        );
    }
    // The relation as the passes read it (as reverse::gradient_table does).
    let relation = share_aggregates(parameter.relation)?;
    let parameter = Parameter {
        relation: &relation,
        ..parameter
    };
    let Some(step) = AggregatingStep::of(r)? else {
        if work_table_reads(r)? < 2 {
            return refuse(
                "relational reverse mode follows a loop whose step aggregates over the table \
                 grouped by every column of the previous row (SELECT … FROM cte CROSS JOIN data \
                 GROUP BY every column of cte), or a step that reads its work table again (a \
                 loss subquery over the rows it updates)",
            );
        }
        let contributions = rereading_transpose::contributions(loss, &cte, r, parameter, rules)?;
        return GroupJoin::plan(
            parameter.relation,
            parameter.identity,
            contributions,
            parameter.names,
        );
    };
    let state = DFSchema::try_from(r.static_term.schema().as_arrow().clone())?;
    let differentiable = differentiable_columns(&state);
    let fwd = share(with_history(r, &step, true)?);
    let loss = over_history(loss, &cte, &fwd)?;
    let table_rules = rules.read().expect("rule table lock").clone();

    // Where the loss reads the table itself.
    let constants = [fwd.clone()];
    let mut contributions = loss_contributions(&loss, parameter, &constants, &table_rules)?;

    // The adjoints of the CTE's rows as the loss reads them, from
    // iteration 1 on (a first row's adjoint reaches no step).
    let seeds = match differentiable.is_empty() {
        true => None,
        false => row_adjoints(&loss, &fwd, &state, &differentiable, &table_rules)?,
    };
    if let Some(seeds) = seeds {
        let transpose = Transpose::new(r, &step, &state, &differentiable, Arc::clone(rules))?;
        let first = first_rows(seeds, &fwd, &state, &differentiable, &step)?;
        // Computed once, and a constant to the pass over the data.
        let back = share(transpose.backward(0, first, &fwd)?);
        let cotangents = transpose.aggregate_cotangents(back.clone(), &fwd)?;
        let (rows, terms) = transpose.data_rows(&fwd, cotangents)?;
        let constants = [fwd, back];
        contributions.extend(weighted_contributions(
            &rows,
            terms,
            parameter,
            &constants,
            &table_rules,
        )?);
    }
    GroupJoin::plan(
        parameter.relation,
        parameter.identity,
        contributions,
        parameter.names,
    )
}

/// Whether an expression of `plan` (its subqueries too) reads a column
/// named `name`: a first row that reads the table only by its other
/// columns (`SELECT DISTINCT g FROM d`) does not move with the variable.
fn names_column(plan: &LogicalPlan, name: &str) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            found |= e.column_refs().iter().any(|c| c.name == name);
        }
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(found)
}

/// The recursive CTEs in `plan` (its subqueries and shared subplans too)
/// that read the rows of `relation`, each once.
fn loops_reading(
    plan: &LogicalPlan,
    relation: &LogicalPlan,
    found: &mut Vec<LogicalPlan>,
) -> Result<()> {
    plan.apply_with_subqueries(|node| {
        if let Some(input) = shared_input(node) {
            loops_reading(input, relation, found)?;
            return Ok(TreeNodeRecursion::Jump);
        }
        if matches!(node, LogicalPlan::RecursiveQuery(_)) && reads(node, relation)? {
            if !found.contains(node) {
                found.push(node.clone());
            }
            return Ok(TreeNodeRecursion::Jump);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// `loss` with the recursive CTE `cte` read from `fwd` (the CTE with its
/// history): the same rows and values, each row now told apart by its
/// trajectory and iteration.
pub(super) fn over_history(
    loss: &LogicalPlan,
    cte: &LogicalPlan,
    fwd: &LogicalPlan,
) -> Result<LogicalPlan> {
    let exprs = cte
        .schema()
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| Expr::Column(Column::from(fwd.schema().qualified_field(i))).alias(f.name()))
        .collect();
    let seen = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(fwd.clone()))?);
    Ok(loss
        .clone()
        .transform_down_with_subqueries(|node| match node == *cte {
            true => Ok(Transformed::new(
                seen.clone(),
                true,
                TreeNodeRecursion::Jump,
            )),
            false => Ok(Transformed::no(node)),
        })?
        .data)
}

/// The loss's adjoints of the differentiable columns of the rows of `fwd`
/// it reads at iteration 1 or later, summed per row: columns
/// `__dfgrad_key0` (the iteration), `__dfgrad_key1` (the trajectory) and
/// `__dfgrad_adjoint{c}` per column `c` (NULL where the loss reads another
/// column only). `None` where the loss reads no differentiable column of
/// those rows.
pub(super) fn row_adjoints(
    loss: &LogicalPlan,
    fwd: &LogicalPlan,
    state: &DFSchema,
    differentiable: &[usize],
    rules: &crate::rules::Rules,
) -> Result<Option<LogicalPlan>> {
    let n = state.fields().len();
    // The iteration and the trajectory tell the rows of `fwd` apart.
    let identity = [n, n + 1];
    let identity_names = [ITERATION_COLUMN.to_string(), TRAJECTORY_COLUMN.to_string()];
    let mut reads: Option<LogicalPlan> = None;
    for &c in differentiable {
        let name = state.field(c).name().clone();
        let parameter = Parameter {
            relation: fwd,
            column: c,
            identity: &identity,
            names: (&name, &identity_names),
        };
        let contributions = loss_contributions(loss, parameter, &[], rules)?;
        for read in contributions.into_plans(fwd, &identity)? {
            let mut exprs = vec![Placeholder::Key.column(0), Placeholder::Key.column(1)];
            for &other in differentiable {
                let e = match other == c {
                    true => Expr::Column(Column::new_unqualified(GRADIENT)),
                    false => {
                        let none = ScalarValue::try_from(state.field(other).data_type())?;
                        Expr::Literal(none, None)
                    }
                };
                exprs.push(e.alias(adjoint_column(other)));
            }
            let read = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(read))?);
            reads = Some(match reads {
                None => read,
                Some(all) => LogicalPlanBuilder::from(all).union(read)?.build()?,
            });
        }
    }
    let Some(reads) = reads else {
        return Ok(None);
    };
    let from_one = LogicalPlanBuilder::from(reads)
        .filter(Placeholder::Key.column(0).gt_eq(lit(1i64)))?
        .build()?;
    let sums = differentiable
        .iter()
        .map(|&c| {
            let name = adjoint_column(c);
            total_of(Expr::Column(Column::new_unqualified(&name)), state.field(c)).alias(name)
        })
        .collect();
    let keys = vec![Placeholder::Key.column(0), Placeholder::Key.column(1)];
    Ok(Some(LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::new(from_one),
        keys,
        sums,
    )?)))
}

/// The backward recursion's first rows from the rows' adjoints `seeds`
/// ([`row_adjoints`]): per row, its trajectory, iteration, the values of
/// the step's aggregates that made it (from `fwd`) and an adjoint per
/// differentiable column (0 where the loss reads another one).
fn first_rows(
    seeds: LogicalPlan,
    fwd: &LogicalPlan,
    state: &DFSchema,
    differentiable: &[usize],
    step: &AggregatingStep,
) -> Result<LogicalPlan> {
    const SEEDS: &str = "__dfgrad_seeds";
    let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
    let joined = LogicalPlanBuilder::from(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
        Arc::new(seeds),
        SEEDS,
    )?))
    .join_on(
        LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(Arc::new(fwd.clone()), FORWARD)?),
        JoinType::Inner,
        vec![
            col(SEEDS, &Placeholder::Key.name(0)).eq(col(FORWARD, ITERATION_COLUMN)),
            col(SEEDS, &Placeholder::Key.name(1)).eq(col(FORWARD, TRAJECTORY_COLUMN)),
        ],
    )?
    .build()?;
    let mut exprs = vec![
        col(FORWARD, TRAJECTORY_COLUMN).alias(TRAJECTORY_COLUMN),
        col(FORWARD, ITERATION_COLUMN).alias(ITERATION_COLUMN),
    ];
    for j in 0..step.aggregates() {
        let name = aggregate_column(j);
        exprs.push(col(FORWARD, &name).alias(name));
    }
    for &c in differentiable {
        let name = adjoint_column(c);
        let t = state.field(c).data_type();
        exprs.push(coalesce(vec![col(SEEDS, &name), zero(t)?]).alias(name));
    }
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(joined),
    )?))
}
