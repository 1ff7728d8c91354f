//! Derivatives *through* `WITH RECURSIVE` in reverse mode for loops whose
//! step aggregates over data — a training loop's
//! `GROUP BY step, w` over `train CROSS JOIN data` — as a second recursive
//! query that runs the iterations backwards (the transpose of a recursive
//! query is a recursive query).
//!
//! The step is recognised as a SELECT list `P` over an aggregate `A` whose
//! group keys are the work table's columns (one next row per row), over
//! joins and filters of the work table with other tables; `A`'s aggregates
//! are `sum`, `avg`, `tensor_sum`, `tensor_avg` (of anything) and `count`.
//! With the aggregates' values `g_j` as variables of `P`'s update `U`, the
//! vector-Jacobian product of one step at the cotangent `ā` is
//!
//! - `∂⟨ā, U⟩/∂s` — the update's own dependence on the previous row `s`,
//! - plus, per aggregate `g_j = AGG_j(h_j)`, `AGG_j(vjp(h_j, s, ḡ_j))` over
//!   the same joined rows, with `ḡ_j = ∂⟨ā, U⟩/∂g_j`.
//!
//! The CTE is computed once with each row's iteration and first row (its
//! trajectory), checkpointed ([`crate::plan::history`]: about √T of its
//! T iterations kept, the others replayed where a backward step reads
//! them); the backward recursion's first rows are the
//! cotangents of `f` at the rows the derivative is asked for, summed per
//! key (the group of the aggregate asking for it, or the row of the SELECT
//! list) and row of the CTE — the backward pass is linear, so
//! `avg(grad(loss, w0))` over many rows of one iteration costs one
//! backward pass; each step joins its rows with the CTE's row of the
//! iteration before and with the data, and aggregates. The derivative is
//! the sum of the cotangents that reach iteration 0 at the columns the
//! first row copies the variable into.
//!
//! ```sql
//! SET datafusion_grad.recursion_mode = 'reverse';
//! WITH RECURSIVE train(step, w, w0) AS (
//!   SELECT 0, w0, w0 FROM (SELECT tensor([0.1, -0.2, 0.3], 3) AS w0) i
//!   UNION ALL
//!   SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(dot(w, x) - y, 2), w)), 0.1)), w0
//!   FROM train CROSS JOIN data WHERE step < 20 GROUP BY step, w, w0)
//! SELECT tensor_avg(grad(power(dot(w, v.x) - v.y, 2), w0))
//! FROM train CROSS JOIN valid v WHERE step = 20;
//! ```
//!
//! Refused with typed errors, in this mode: a step whose update reads an
//! aggregate's value in its derivative (a step nonlinear in its
//! aggregates, e.g. Adam's, or one that scales by `count(*)`: the forward
//! values of the aggregates are not kept), an aggregate other than the
//! ones above or with `FILTER`/`DISTINCT`/`ORDER BY`, group keys other than
//! the work table's columns, `jvp` markers, and a derivative inside an
//! aggregate other than `sum`/`avg`/`tensor_sum`/`tensor_avg` of it. A
//! derivative asked for at rows of several iterations runs one backward
//! pass from each.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Column, DFSchema, ScalarValue};
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::functions_aggregate::expr_fn::{avg, count, sum};
use datafusion::functions_window::expr_fn::{dense_rank, row_number};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    cast, lit, Aggregate, Expr, ExprFunctionExt, ExprSchemable, JoinType, LogicalPlan,
    LogicalPlanBuilder, Projection, RecursiveQuery, ScalarUDF, SubqueryAlias, TableScanBuilder,
};
use datafusion::optimizer::AnalyzerRule;

use super::recursion::{carry, column_named, term_with_columns, Found};
use super::reverse_recursion::{
    add, copies_of, is_differentiable, one_variable, pairing, reads_the_cte_directly,
};
use super::GradAnalyzer;
use crate::engine::call::{as_marker, Marker, MarkerKind, SharedRules};
use crate::engine::{differentiate, Seed};
use crate::error::{fail, ErrorKind};
use crate::plan::history::{history, previous_row};
use crate::plan::lineage::{origin_of, Scope};
use crate::plan::reverse::inner;
use crate::plan::shared::{share, unshared};
use crate::plan::{columns, left_join_by_identity, unalias};
use crate::reserved::{
    adjoint_column, aggregate_column, backward_cte, contribution_column, count_column, key_column,
    previous_aggregate_column, reverse_column, Placeholder, FORWARD, ITERATION_COLUMN, ROW_COLUMN,
    TRAJECTORY_COLUMN,
};
use crate::tensor::{self, batch, Shape};

/// A recursive term that aggregates: `projection` over `aggregate`, whose
/// group key `keys[c]` is the work table's column `c`.
pub(super) struct AggregatingStep<'r> {
    projection: &'r Projection,
    aggregate: &'r Aggregate,
    keys: Vec<usize>,
    /// The work table's column each group key is.
    columns: Vec<usize>,
}

/// How an aggregate of the step sums its rows.
#[derive(Clone, Copy, PartialEq)]
enum Sums {
    /// `sum`, `tensor_sum`.
    Total,
    /// `avg`, `tensor_avg`.
    Mean,
    /// `count`: not differentiable.
    Count,
}

impl<'r> AggregatingStep<'r> {
    /// `r`'s recursive term as an aggregating step, or `None` where it is
    /// not one (see the [module docs](self)).
    pub(super) fn of(r: &'r RecursiveQuery) -> Result<Option<Self>> {
        let LogicalPlan::Projection(projection) = r.recursive_term.as_ref() else {
            return Ok(None);
        };
        let LogicalPlan::Aggregate(aggregate) = projection.input.as_ref() else {
            return Ok(None);
        };
        let n = r.static_term.schema().fields().len();
        let mut keys = vec![usize::MAX; n];
        let mut columns = Vec::new();
        for (i, g) in aggregate.group_expr.iter().enumerate() {
            let Expr::Column(c) = unalias(g) else {
                return Ok(None);
            };
            let idx = aggregate.input.schema().index_of_column(c)?;
            match origin_of(&aggregate.input, idx)? {
                (LogicalPlan::TableScan(s), at)
                    if s.table_name.table() == r.name
                        && s.projection.is_none()
                        && s.filters.is_empty()
                        && at < n =>
                {
                    if keys[at] == usize::MAX {
                        keys[at] = i;
                    }
                    columns.push(at);
                }
                _ => return Ok(None),
            }
        }
        if keys.contains(&usize::MAX) {
            return Ok(None);
        }
        Ok(Some(Self {
            projection,
            aggregate,
            keys,
            columns,
        }))
    }

    /// How many aggregates the step computes.
    pub(super) fn aggregates(&self) -> usize {
        self.aggregate.aggr_expr.len()
    }

    /// The `j`-th aggregate's argument and how it sums, refused where it
    /// is not one the backward step transposes.
    fn aggregate(&self, j: usize, name: &str) -> Result<(&'r Expr, Sums)> {
        let e = &self.aggregate.aggr_expr[j];
        match sums_of(e) {
            Some((sums, arg)) => Ok((arg, sums)),
            None => fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "derivatives through the recursive CTE `{name}` in reverse mode: its step \
                     aggregates with `{}`; reverse mode transposes sum, avg, tensor_sum and \
                     tensor_avg (and count), without FILTER, DISTINCT or ORDER BY",
                    unalias(e)
                ),
            ),
        }
    }
}

/// How the aggregate `e` sums its one argument, and the argument; `None`
/// for another aggregate, or one with `FILTER`, `DISTINCT` or `ORDER BY`.
fn sums_of(e: &Expr) -> Option<(Sums, &Expr)> {
    let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(e) else {
        return None;
    };
    let sums = match func.name() {
        "sum" | "tensor_sum" => Sums::Total,
        "avg" | "tensor_avg" => Sums::Mean,
        "count" => Sums::Count,
        _ => return None,
    };
    match &params.args[..] {
        [arg] if !params.distinct && params.filter.is_none() && params.order_by.is_empty() => {
            Some((sums, arg))
        }
        _ => None,
    }
}

/// `node` (over `input`) with its markers through the CTE of `found`, whose
/// recursive term is the aggregating `step`, taken in reverse mode: see the
/// [module docs](self). `state` is the CTE's row, unqualified;
/// `differentiable` its float and float tensor columns.
pub(super) fn reverse(
    node: LogicalPlan,
    input: LogicalPlan,
    found: &Found,
    step: &AggregatingStep,
    state: &DFSchema,
    differentiable: &[usize],
) -> Result<LogicalPlan> {
    let LogicalPlan::RecursiveQuery(r) = found.cte else {
        unreachable!("found a recursive CTE")
    };
    let refuse = |why: String| -> Result<()> {
        fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "derivatives through the recursive CTE `{}` in reverse mode: {why}",
                r.name
            ),
        )
    };
    let transpose = Transpose::new(r, step, state, differentiable, Arc::clone(&found.rules))?;
    // The loop's rows pass once where the loss reads them; the backward
    // recursion reads each row before from their checkpoints.
    let fwd = history(with_history(r, step, false)?);
    let mut carried = vec![ITERATION_COLUMN.to_string(), TRAJECTORY_COLUMN.to_string()];
    carried.extend((0..step.aggregate.aggr_expr.len()).map(aggregate_column));
    let input = carry(&input, found.cte, &fwd, carried)?.expect("the CTE is below the marker");

    // The rows the derivatives are taken for: the groups of an aggregate,
    // the numbered rows of a SELECT list (read twice: shared).
    let (input, keys): (LogicalPlan, Vec<Expr>) = match &node {
        // read twice: by the backward recursion's first rows and by the
        // aggregate without the derivatives
        LogicalPlan::Aggregate(a) => (share(input), a.group_expr.clone()),
        LogicalPlan::Projection(_) => {
            let windowed = LogicalPlanBuilder::from(input)
                .window(vec![row_number()])?
                .build()?;
            let mut exprs = columns(&windowed);
            let numbered = exprs.pop().expect("the row number");
            exprs.push(numbered.alias(ROW_COLUMN));
            let rows = share(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(windowed),
            )?));
            let row = Expr::Column(column_named(&rows, ROW_COLUMN)?);
            (rows, vec![row])
        }
        other => {
            refuse(format!(
                "it follows a loop that aggregates for a derivative in a SELECT list or an \
                 aggregate, not in `{}`",
                other.display()
            ))?;
            unreachable!("refused")
        }
    };

    // The CTE's differentiable columns the marker's row holds (seen
    // through the numbered rows' sharing).
    let seen = unshared(&input);
    let mut visible = Vec::new();
    for i in 0..seen.schema().fields().len() {
        let (origin, at) = origin_of(seen, i)?;
        if (std::ptr::eq(origin, &fwd) || *origin == fwd) && differentiable.contains(&at) {
            visible.push((Column::from(seen.schema().qualified_field(i)), at));
        }
    }
    if visible.is_empty() {
        return internal_err!(
            "derivatives through the recursive CTE `{}` in reverse mode: none of its columns \
             reaches the derivative",
            r.name
        );
    }
    let columns_visible: Vec<Column> = visible.iter().map(|(c, _)| c.clone()).collect();
    let iteration = Expr::Column(column_named(&input, ITERATION_COLUMN)?);
    let trajectory = Expr::Column(column_named(&input, TRAJECTORY_COLUMN)?);
    let values: Vec<Expr> = (0..step.aggregate.aggr_expr.len())
        .map(|j| Ok(Expr::Column(column_named(&input, &aggregate_column(j))?)))
        .collect::<Result<_>>()?;

    // Each marker: its backward recursion and the derivative per key.
    let mut derivatives: Vec<(Expr, LogicalPlan, Sums)> = Vec::new();
    let rules = found.rules.read().expect("rule table lock").clone();
    let mut markers: Vec<(Expr, Sums)> = Vec::new();
    let in_aggregate = matches!(node, LogicalPlan::Aggregate(_));
    for e in node.expressions() {
        e.apply(|x| {
            let Some(call) = as_marker(x) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            if found.of(&call.wrt_columns()).is_none() {
                return Ok(TreeNodeRecursion::Jump);
            }
            let sums = match in_aggregate {
                true => match sums_of(&e) {
                    Some((sums, m)) if sums != Sums::Count && m == x => sums,
                    _ => {
                        return fail(
                            ErrorKind::NeedsPlanContext,
                            format!(
                                "derivatives through the recursive CTE `{}` in reverse mode \
                                 through a loop that aggregates: `{e}` aggregates a derivative \
                                 other than as sum, avg, tensor_sum or tensor_avg of it \
                                 (e.g. tensor_avg(grad(loss, w0)))",
                                r.name
                            ),
                        )
                    }
                },
                false => Sums::Total,
            };
            markers.push((x.clone(), sums));
            Ok(TreeNodeRecursion::Jump)
        })?;
    }
    for (k, (marker, sums)) in markers.iter().enumerate() {
        let call = as_marker(marker).expect("a marker");
        let vars = found.of(&call.wrt_columns()).expect("through the CTE");
        let v = one_variable(&call, &vars, found, &r.name)?;
        let seed = match call.kind() {
            MarkerKind::Grad => Seed::Grad,
            MarkerKind::Vjp => Seed::Vjp(call.args[2].clone()),
            MarkerKind::Jvp => {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "jvp through the recursive CTE `{}` in reverse mode through a loop that \
                         aggregates: write grad(f, v) and pair it with the tangent \
                         (tensor_total(tensor_mul(t, grad(f, v))))",
                        r.name
                    ),
                )
            }
        };
        let f = Scope::new(vec![seen])?
            .inline(call.args[0].clone(), &columns_visible, &[])?
            .data;
        reads_the_cte_directly(&f, seen, &fwd, &r.name)?;
        let cotangents = differentiate(&f, &columns_visible, seed, input.schema(), &rules)?.exprs;
        // The backward recursion's first rows: the cotangents summed per
        // key, trajectory and iteration.
        let mut exprs: Vec<Expr> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| key.clone().alias(key_column(i)))
            .collect();
        exprs.push(trajectory.clone().alias(TRAJECTORY_COLUMN));
        exprs.push(iteration.clone().alias(ITERATION_COLUMN));
        for (j, value) in values.iter().enumerate() {
            exprs.push(value.clone().alias(aggregate_column(j)));
        }
        for &c in differentiable {
            let t = state.field(c).data_type();
            let mut total: Option<Expr> = None;
            for ((_, at), cot) in visible.iter().zip(&cotangents) {
                if *at == c {
                    total = Some(match total {
                        Some(s) => add(s, cot.clone(), t),
                        None => cot.clone(),
                    });
                }
            }
            let total = match total {
                Some(total) => total,
                None => zero(t)?,
            };
            exprs.push(total.alias(adjoint_column(c)));
        }
        let seeds = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input.clone()))?);
        let group: Vec<Expr> = (0..keys.len() + 2 + values.len())
            .map(|i| Expr::Column(Column::from(seeds.schema().qualified_field(i))))
            .collect();
        let sums_of: Vec<Expr> = differentiable
            .iter()
            .map(|&c| {
                let name = adjoint_column(c);
                total_of(Expr::Column(Column::new_unqualified(&name)), state.field(c)).alias(name)
            })
            .collect();
        let first = LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(seeds), group, sums_of)?);
        let back = transpose.backward(k, first, &fwd)?;

        // The derivative per key: the cotangents at iteration 0 of the
        // columns the first row copies the variable into, summed.
        let copies = copies_of(&r.static_term, differentiable, v, &r.name)?;
        let t = state.field(v).data_type();
        let mut d: Option<Expr> = None;
        for i in copies {
            let a = Expr::Column(Column::new_unqualified(adjoint_column(differentiable[i])));
            d = Some(match d {
                Some(s) => add(s, a, t),
                None => a,
            });
        }
        let d = d.expect("the variable is a column the first row holds");
        let at_start = LogicalPlanBuilder::from(back)
            .filter(Expr::Column(Column::new_unqualified(ITERATION_COLUMN)).eq(lit(0i64)))?
            .build()?;
        let key_columns: Vec<Expr> = (0..keys.len())
            .map(|i| Expr::Column(Column::new_unqualified(key_column(i))))
            .collect();
        let field = Field::new("d", t.clone(), true);
        let result = LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(at_start),
            key_columns,
            vec![total_of(d, &field).alias(reverse_column(k))],
        )?);
        let result = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
            Arc::new(result),
            format!("{}_{k}", backward_cte(k)),
        )?);
        derivatives.push((marker.clone(), result, *sums));
    }
    drop(rules);
    finish(node, input, derivatives)
}

/// `node` over `input` with each marker replaced by its derivative, whose
/// table (keys, then the derivative) is joined to the rows or groups.
fn finish(
    node: LogicalPlan,
    input: LogicalPlan,
    derivatives: Vec<(Expr, LogicalPlan, Sums)>,
) -> Result<LogicalPlan> {
    let keyed = |plan: LogicalPlan, keys: &[Expr], result: LogicalPlan| -> Result<LogicalPlan> {
        let on: Vec<(Expr, Expr)> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let right = Expr::Column(Column::from(result.schema().qualified_field(i)));
                (key.clone(), right)
            })
            .collect();
        match on.is_empty() {
            true => LogicalPlanBuilder::from(plan).cross_join(result)?.build(),
            false => left_join_by_identity(plan, result, on),
        }
    };
    let value = |result: &LogicalPlan| {
        let n = result.schema().fields().len();
        Expr::Column(Column::from(result.schema().qualified_field(n - 1)))
    };
    match node {
        LogicalPlan::Projection(p) => {
            let row = Expr::Column(column_named(&input, ROW_COLUMN)?);
            let mut plan = input;
            let mut replacements = Vec::new();
            for (marker, result, _) in derivatives {
                replacements.push((marker, value(&result)));
                plan = keyed(plan, std::slice::from_ref(&row), result)?;
            }
            let names = NamePreserver::new_for_projection();
            let mut exprs = Vec::new();
            for e in p.expr {
                let saved = names.save(&e);
                let e = e
                    .transform_down(|e| match replacements.iter().find(|(m, _)| *m == e) {
                        Some((_, r)) => {
                            Ok(Transformed::new(r.clone(), true, TreeNodeRecursion::Jump))
                        }
                        None => Ok(Transformed::no(e)),
                    })?
                    .data;
                exprs.push(saved.restore(e));
            }
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(plan),
            )?))
        }
        LogicalPlan::Aggregate(a) => {
            // The aggregate without the derivatives (the count of the rows
            // each `avg` of one averages over in its place); the markers
            // come in the order of the aggregates holding them.
            let mut aggregates = Vec::new();
            let mut holds = Vec::new();
            for e in &a.aggr_expr {
                let k = holds.iter().flatten().count();
                let marker = derivatives.get(k).map(|(m, _, _)| m);
                match marker.filter(|m| e.exists(|x| Ok(x == *m)).unwrap_or(false)) {
                    None => {
                        aggregates.push(e.clone());
                        holds.push(None);
                    }
                    Some(m) => {
                        let f = as_marker(m).expect("a marker").args[0].clone();
                        aggregates.push(count(f).alias(count_column(k)));
                        holds.push(Some(k));
                    }
                }
            }
            let groups = a.group_expr.len();
            let without = LogicalPlan::Aggregate(Aggregate::try_new(
                Arc::new(input),
                a.group_expr.clone(),
                aggregates,
            )?);
            let keys: Vec<Expr> = (0..groups)
                .map(|i| Expr::Column(Column::from(without.schema().qualified_field(i))))
                .collect();
            let mut plan = without.clone();
            let mut values = Vec::new();
            for (_, result, sums) in derivatives {
                values.push((value(&result), sums));
                plan = keyed(plan, &keys, result)?;
            }
            let mut exprs = keys;
            for (i, held) in holds.into_iter().enumerate() {
                let (qualifier, field) = a.schema.qualified_field(groups + i);
                let out = Expr::Column(Column::from(without.schema().qualified_field(groups + i)));
                let e = match held {
                    None => out,
                    Some(k) => {
                        let (d, sums) = values[k].clone();
                        match sums {
                            Sums::Mean => {
                                let n = cast(out, DataType::Float64);
                                match field.data_type() {
                                    DataType::Float64 => d / n,
                                    _ => tensor::call("scale", vec![d, lit(1.0) / n]),
                                }
                            }
                            _ => d,
                        }
                    }
                };
                exprs.push(e.alias_qualified(qualifier.cloned(), field.name()));
            }
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(plan),
            )?))
        }
        _ => unreachable!("refused before"),
    }
}

/// The backward step of an aggregating loop, differentiated once.
pub(super) struct Transpose<'r> {
    r: &'r RecursiveQuery,
    step: &'r AggregatingStep<'r>,
    state: &'r DFSchema,
    differentiable: &'r [usize],
    /// Each aggregate's argument and how it sums.
    aggregates: Vec<(&'r Expr, Sums)>,
    /// `∂⟨ā, U⟩/∂s_c` per differentiable column, over the state's and the
    /// adjoints' unqualified columns.
    direct: Vec<Expr>,
    /// `∂⟨ā, U⟩/∂g_j` per differentiable aggregate (`None`: `count`).
    through: Vec<Option<Expr>>,
    rules: crate::engine::call::SharedRules,
}

impl<'r> Transpose<'r> {
    pub(super) fn new(
        r: &'r RecursiveQuery,
        step: &'r AggregatingStep<'r>,
        state: &'r DFSchema,
        differentiable: &'r [usize],
        rules: SharedRules,
    ) -> Result<Self> {
        let a = step.aggregate;
        let groups = a.group_expr.len();
        let mut aggregates = Vec::new();
        for j in 0..a.aggr_expr.len() {
            aggregates.push(step.aggregate(j, &r.name)?);
        }
        // The update of each column over the previous row (the state's
        // unqualified columns) and the aggregates' values.
        let mut updates = Vec::new();
        for e in &step.projection.expr {
            let e = unalias(e).clone().transform_up(|e| match e {
                Expr::Column(c) => {
                    let i = a.schema.index_of_column(&c)?;
                    Ok(Transformed::yes(match i < groups {
                        true => state_column(state, step.columns[i]),
                        false => {
                            Expr::Column(Column::new_unqualified(aggregate_column(i - groups)))
                        }
                    }))
                }
                e => Ok(Transformed::no(e)),
            })?;
            updates.push(e.data);
        }
        // ⟨ā, U⟩ and its gradient.
        let mut fields: Vec<Field> = state.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut wrt: Vec<Column> = differentiable
            .iter()
            .map(|&c| Column::new_unqualified(state.field(c).name()))
            .collect();
        let mut differentiable_aggregates = Vec::new();
        for (j, field) in a.schema.fields().iter().skip(groups).enumerate() {
            let name = aggregate_column(j);
            fields.push(Field::new(&name, field.data_type().clone(), true));
            if aggregates[j].1 != Sums::Count && is_differentiable(field.data_type()) {
                wrt.push(Column::new_unqualified(name));
                differentiable_aggregates.push(j);
            }
        }
        let pairing = pairing(state, differentiable, &updates, &mut fields);
        let schema = DFSchema::from_unqualified_fields(fields.into(), Default::default())?;
        let gradient = differentiate(
            &pairing,
            &wrt,
            Seed::Grad,
            &schema,
            &rules.read().expect("rule table lock"),
        )?
        .exprs;
        let direct = gradient[..differentiable.len()].to_vec();
        let mut through = vec![None; a.aggr_expr.len()];
        for (j, e) in differentiable_aggregates
            .iter()
            .zip(&gradient[differentiable.len()..])
        {
            through[*j] = Some(e.clone());
        }
        Ok(Self {
            r,
            step,
            state,
            differentiable,
            aggregates,
            direct,
            through,
            rules,
        })
    }

    /// The backward recursion `backward_cte(k)` from its first rows
    /// `first` (keys, trajectory, iteration, then an adjoint per
    /// differentiable column; unqualified): each step joins its rows with the
    /// CTE's row of the iteration before and the step's data, and pulls the
    /// adjoints back through the step.
    pub(super) fn backward(
        &self,
        k: usize,
        first: LogicalPlan,
        fwd: &LogicalPlan,
    ) -> Result<LogicalPlan> {
        let name = backward_cte(k);
        let schema = Arc::new(first.schema().as_arrow().clone());
        let source = provider_as_source(Arc::new(CteWorkTable::new(&name, schema)));
        let back = LogicalPlan::TableScan(TableScanBuilder::new(name.as_str(), source).build()?);
        let mut carried: Vec<String> = back
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
        let joined = previous_row(back, fwd)?;
        // The work table's rows in its place: the CTE's row of the
        // iteration before, with the backward row's columns after them.
        let mut exprs: Vec<Expr> = carried.iter().map(|n| col(&name, n).alias(n)).collect();
        let aggregates = self.aggregates.len();
        for j in 0..aggregates {
            let previous = previous_aggregate_column(j);
            exprs.push(col(FORWARD, &aggregate_column(j)).alias(&previous));
            carried.push(previous);
        }
        let a = self.step.aggregate;
        let rows = self.step_input(exprs, joined, &carried)?;

        // Each aggregate's contribution to each adjoint:
        // AGG_j(vjp(h_j, s_c, ḡ_j)) over the same rows.
        let state_in_rows = |c: usize| -> Expr { a.group_expr[self.step.keys[c]].clone() };
        let in_rows = |e: &Expr| -> Result<Expr> {
            Ok(e.clone()
                .transform_up(|e| match e {
                    Expr::Column(c) if c.relation.is_none() => {
                        if let Ok(i) = self.state.index_of_column(&c) {
                            return Ok(Transformed::yes(unalias(&state_in_rows(i)).clone()));
                        }
                        Ok(Transformed::yes(Expr::Column(column_named(
                            &rows, &c.name,
                        )?)))
                    }
                    e => Ok(Transformed::no(e)),
                })?
                .data)
        };
        let mut group: Vec<Expr> = carried
            .iter()
            .map(|n| Ok(Expr::Column(column_named(&rows, n)?)))
            .collect::<Result<_>>()?;
        group.extend(a.group_expr.iter().cloned());
        let vjp = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Vjp, Arc::clone(&self.rules)));
        let grad = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, Arc::clone(&self.rules)));
        let ws: Vec<Expr> = self
            .differentiable
            .iter()
            .map(|&c| unalias(&state_in_rows(c)).clone())
            .collect();
        let mut contributions = Vec::new();
        let mut sums_into: Vec<Vec<String>> = vec![Vec::new(); self.differentiable.len()];
        for sweep in self.sweeps()? {
            let (j, sums) = (sweep[0], self.aggregates[sweep[0]].1);
            // One reverse sweep with respect to every column (a struct of
            // them where there are several): the vector-Jacobian product
            // of one aggregate's argument, or the gradient of the sum of
            // several arguments' inner products with their cotangents.
            let vjps = match &sweep[..] {
                [j] => {
                    let cotangent = in_rows(self.through[*j].as_ref().expect("differentiable"))?;
                    let mut args = vec![self.aggregates[*j].0.clone(), ws[0].clone(), cotangent];
                    args.extend(ws[1..].iter().cloned());
                    vjp.call(args)
                }
                _ => {
                    let mut f = Vec::with_capacity(sweep.len());
                    for &k in &sweep {
                        let h = self.aggregates[k].0;
                        let cotangent = in_rows(self.through[k].as_ref().expect("differentiable"))?;
                        f.push(inner(h.clone(), cotangent, &h.get_type(a.input.schema())?));
                    }
                    let f = f.into_iter().reduce(|x, y| x + y).expect("several");
                    grad.call(std::iter::once(f).chain(ws.iter().cloned()).collect())
                }
            };
            for (i, &c) in self.differentiable.iter().enumerate() {
                let field = self.state.field(c);
                let pulled = match (&ws[..], &ws[i]) {
                    ([_], _) => vjps.clone(),
                    (_, Expr::Column(w)) => get_field(vjps.clone(), w.name.as_str()),
                    _ => unreachable!("a group key of the step is a column"),
                };
                let name = contribution_column(j, c);
                let summed = match sums {
                    Sums::Mean => mean_of(pulled, field),
                    _ => total_of(pulled, field),
                };
                contributions.push(summed.alias(&name));
                sums_into[i].push(name);
            }
        }
        let aggregated =
            LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(rows), group, contributions)?);
        let out = |n: &str| column_named(&aggregated, n).map(Expr::Column);
        let mut exprs: Vec<Expr> = Vec::new();
        // The keys and the trajectory as they are, the iteration before
        // and the aggregates that made its row, and the adjoints pulled
        // back.
        let kept = carried.len() - aggregates - self.differentiable.len();
        for n in &carried[..kept] {
            let e = match n.as_str() {
                ITERATION_COLUMN => out(n)? - lit(1i64),
                _ => match (0..aggregates).find(|&j| *n == aggregate_column(j)) {
                    Some(j) => out(&previous_aggregate_column(j))?,
                    None => out(n)?,
                },
            };
            exprs.push(e.alias(n));
        }
        let groups = carried.len();
        for (i, &c) in self.differentiable.iter().enumerate() {
            let t = self.state.field(c).data_type();
            let direct = self.direct[i].clone().transform_up(|e| match e {
                Expr::Column(x) if x.relation.is_none() => {
                    if let Ok(s) = self.state.index_of_column(&x) {
                        let key = self.step.keys[s];
                        return Ok(Transformed::yes(Expr::Column(Column::from(
                            aggregated.schema().qualified_field(groups + key),
                        ))));
                    }
                    Ok(Transformed::yes(out(&x.name)?))
                }
                e => Ok(Transformed::no(e)),
            })?;
            let mut total = direct.data;
            for n in &sums_into[i] {
                total = add(total, out(n)?, t);
            }
            exprs.push(total.alias(adjoint_column(c)));
        }
        let term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(aggregated))?);
        let term = analyzed(term)?;
        Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
            name,
            Arc::new(first),
            Arc::new(term),
            false,
        )?))
    }
}

impl Transpose<'_> {
    /// The step's input with its work table's rows replaced by the
    /// state's columns of the CTE's rows in `rows` (aliased `FORWARD`),
    /// then `exprs` (the columns `carried`), the columns `carried` passed
    /// up to the aggregate's input.
    fn step_input(
        &self,
        exprs: Vec<Expr>,
        rows: LogicalPlan,
        carried: &[String],
    ) -> Result<LogicalPlan> {
        let scan = self.work_table()?;
        let LogicalPlan::TableScan(old) = scan else {
            unreachable!("a table scan")
        };
        let state = self
            .state
            .fields()
            .iter()
            .map(|f| Expr::Column(Column::new(Some(FORWARD), f.name())).alias(f.name()));
        let replacement = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
            Arc::new(LogicalPlan::Projection(Projection::try_new(
                state.chain(exprs).collect(),
                Arc::new(rows),
            )?)),
            old.table_name.clone(),
        )?);
        let input = &self.step.aggregate.input;
        Ok(carry(input, scan, &replacement, carried.to_vec())?.expect("the work table is read"))
    }

    /// The step's scan of the work table (the previous row).
    fn work_table(&self) -> Result<&LogicalPlan> {
        let mut scan = None;
        self.step.aggregate.input.apply(|node| {
            if let LogicalPlan::TableScan(s) = node {
                if s.table_name.table() == self.r.name {
                    scan = Some(node);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(scan.expect("the step reads the work table"))
    }

    /// The step's rows of every iteration at once, each with the
    /// cotangents of the aggregates it feeds (`cotangents`, from
    /// [`Self::aggregate_cotangents`]): the step's input with the work
    /// table's rows in place (from `fwd`, the CTE with its history,
    /// [`with_history`]) joined with the cotangents of their trajectory
    /// and iteration; and per differentiable aggregate `j`, its argument
    /// `h_j` paired with its cotangent column. The derivative of
    /// `Σ_j ⟨ḡ_j, h_j⟩` summed over these rows is the pull-back of the
    /// backward recursion through the data.
    pub(super) fn data_rows(
        &self,
        fwd: &LogicalPlan,
        cotangents: LogicalPlan,
    ) -> Result<(LogicalPlan, Vec<(Expr, Expr)>)> {
        const COTANGENTS: &str = "__dfgrad_cotangents";
        let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
        let joined = LogicalPlanBuilder::from(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
            Arc::new(fwd.clone()),
            FORWARD,
        )?))
        .join_on(
            LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(Arc::new(cotangents), COTANGENTS)?),
            JoinType::Inner,
            vec![
                col(FORWARD, TRAJECTORY_COLUMN).eq(col(COTANGENTS, &Placeholder::Key.name(0))),
                col(FORWARD, ITERATION_COLUMN).eq(col(COTANGENTS, &Placeholder::Key.name(1))),
            ],
        )?
        .build()?;
        let mut exprs = Vec::new();
        let mut carried = Vec::new();
        for j in self.differentiable_aggregates() {
            let name = Placeholder::Adjoint.name(j);
            exprs.push(col(COTANGENTS, &name).alias(&name));
            carried.push(name);
        }
        let rows = self.step_input(exprs, joined, &carried)?;
        let terms = self
            .differentiable_aggregates()
            .into_iter()
            .zip(&carried)
            .map(|(j, name)| {
                let (h, _) = self.aggregates[j];
                Ok((h.clone(), Expr::Column(column_named(&rows, name)?)))
            })
            .collect::<Result<_>>()?;
        Ok((rows, terms))
    }

    /// The cotangents `ḡ_j` of the step's differentiable aggregates at each
    /// row of the backward recursion `back` (an `ā` at iteration `k`, with
    /// the aggregates' values `g_k` that made the row) and the CTE's row of
    /// the iteration before (from `fwd`, with counts: [`with_history`]),
    /// divided by the row count for an average, summed per trajectory and
    /// iteration `k - 1` (the backward pass is linear): columns
    /// `__dfgrad_key0` (the trajectory), `__dfgrad_key1` (the iteration of
    /// the step's input row) and `__dfgrad_adj{j}` per aggregate `j` of
    /// [`Self::differentiable_aggregates`].
    pub(super) fn aggregate_cotangents(
        &self,
        back: LogicalPlan,
        fwd: &LogicalPlan,
    ) -> Result<LogicalPlan> {
        const BACK: &str = "__dfgrad_back";
        // The CTE's row that the backward row's adjoints are of (its
        // averaging aggregates' counts).
        const NEXT: &str = "__dfgrad_next";
        let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
        let alias = |plan: LogicalPlan, name: &str| -> Result<LogicalPlan> {
            Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(plan),
                name,
            )?))
        };
        let joined = LogicalPlanBuilder::from(alias(back, BACK)?)
            .join_on(
                alias(fwd.clone(), FORWARD)?,
                JoinType::Inner,
                vec![
                    col(BACK, TRAJECTORY_COLUMN).eq(col(FORWARD, TRAJECTORY_COLUMN)),
                    (col(BACK, ITERATION_COLUMN) - lit(1i64)).eq(col(FORWARD, ITERATION_COLUMN)),
                ],
            )?
            .join_on(
                alias(fwd.clone(), NEXT)?,
                JoinType::Inner,
                vec![
                    col(BACK, TRAJECTORY_COLUMN).eq(col(NEXT, TRAJECTORY_COLUMN)),
                    col(BACK, ITERATION_COLUMN).eq(col(NEXT, ITERATION_COLUMN)),
                ],
            )?
            .build()?;
        let mut exprs = vec![
            col(FORWARD, TRAJECTORY_COLUMN).alias(Placeholder::Key.name(0)),
            col(FORWARD, ITERATION_COLUMN).alias(Placeholder::Key.name(1)),
        ];
        let mut sums = Vec::new();
        for j in self.differentiable_aggregates() {
            let through = self.through[j].clone().expect("differentiable");
            // The previous row's columns from the CTE, the rest (the
            // aggregates' values, the adjoints) from the backward row.
            let e = through
                .transform_up(|e| match e {
                    Expr::Column(c) if c.relation.is_none() => {
                        Ok(Transformed::yes(match self.state.index_of_column(&c) {
                            Ok(_) => col(FORWARD, &c.name),
                            Err(_) => col(BACK, &c.name),
                        }))
                    }
                    e => Ok(Transformed::no(e)),
                })?
                .data;
            let field =
                &self.step.aggregate.schema.fields()[self.step.aggregate.group_expr.len() + j];
            // An average sends each row its share.
            let e = match self.aggregates[j].1 {
                Sums::Mean => {
                    let share = lit(1.0) / cast(col(NEXT, &count_column(j)), DataType::Float64);
                    match field.data_type() {
                        DataType::Float64 => e * share,
                        _ => tensor::call("scale", vec![e, share]),
                    }
                }
                _ => e,
            };
            let name = Placeholder::Adjoint.name(j);
            exprs.push(e.alias(&name));
            sums.push(total_of(Expr::Column(Column::new_unqualified(&name)), field).alias(name));
        }
        let cotangents = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(joined))?);
        let keys = (0..2).map(|j| Placeholder::Key.column(j)).collect();
        Ok(LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(cotangents),
            keys,
            sums,
        )?))
    }

    /// The step's aggregates a cotangent flows to (not `count`s, nor
    /// values that are not floats or float tensors).
    pub(super) fn differentiable_aggregates(&self) -> Vec<usize> {
        (0..self.through.len())
            .filter(|&j| self.through[j].is_some())
            .collect()
    }

    /// The differentiable aggregates, grouped by the reverse sweep that
    /// pulls their cotangents back through the step's rows. Aggregates
    /// that sum alike, whose arguments are fields of one struct (the
    /// parameters' gradients of one `grad(f, w1, b1, …)`, NULL on the same
    /// rows) and whose cotangents' values read no state column (constants
    /// to the sweep, see [`value_reads`]) share one:
    /// `Σ_j AGG(vjp(h_j, s, ḡ_j)) = AGG(∂/∂s Σ_j ⟨h_j, ḡ_j⟩)` over the same
    /// rows. Each other aggregate has a sweep of its own.
    fn sweeps(&self) -> Result<Vec<Vec<usize>>> {
        let mut sweeps: Vec<(Vec<usize>, Option<&Expr>)> = Vec::new();
        let is_state = |c: &Column| c.relation.is_none() && self.state.index_of_column(c).is_ok();
        for j in self.differentiable_aggregates() {
            let (h, sums) = self.aggregates[j];
            let reads_state =
                value_reads(self.through[j].as_ref().expect("differentiable"), &is_state)?;
            let base = match (unalias(h), reads_state) {
                (Expr::ScalarFunction(f), false) if f.name() == "get_field" => f.args.first(),
                _ => None,
            };
            let shared = sweeps
                .iter_mut()
                .find(|(js, b)| base.is_some() && *b == base && self.aggregates[js[0]].1 == sums);
            match shared {
                Some((js, _)) => js.push(j),
                None => sweeps.push((vec![j], base)),
            }
        }
        Ok(sweeps.into_iter().map(|(js, _)| js).collect())
    }
}

/// Whether the value of `e` reads a column `is_column` accepts, where it
/// can change `e` by more than its NULLs and shapes: the engine's NULL
/// guards (`CASE WHEN w IS NULL … THEN NULL ELSE … END`) and the tensors it
/// shapes like another (`fill_like(w, 1)`, `zeros_like(w)`) read a column
/// for its NULLs or its shape alone, which no derivative sees.
fn value_reads(e: &Expr, is_column: &impl Fn(&Column) -> bool) -> Result<bool> {
    Ok(match e {
        Expr::IsNull(_) | Expr::IsNotNull(_) => false,
        Expr::Column(c) => is_column(c),
        Expr::ScalarFunction(f) if matches!(f.name(), "fill_like" | "zeros_like") => {
            let mut reads = false;
            for a in f.args.iter().skip(1) {
                reads |= value_reads(a, is_column)?;
            }
            reads
        }
        _ => {
            let mut reads = false;
            e.apply_children(|child| {
                reads |= value_reads(child, is_column)?;
                Ok(match reads {
                    true => TreeNodeRecursion::Stop,
                    false => TreeNodeRecursion::Continue,
                })
            })?;
            reads
        }
    })
}

/// `r` (whose recursive term is the aggregating `step`) with each row's
/// iteration (0, then one more each step), first row (its rank among the
/// distinct first rows: the trajectory it belongs to) and the values of the step's aggregates that
/// made it (NULL in the first row) after its own columns.
///
/// With `counts`, also, per averaging aggregate `j` (`avg`, `tensor_avg`),
/// the number of rows it averaged (`count` of its argument) as
/// `__dfgrad_count{j}` (NULL in the first row), after those.
pub(super) fn with_history(
    r: &RecursiveQuery,
    step: &AggregatingStep,
    counts: bool,
) -> Result<LogicalPlan> {
    // Equal first rows are one trajectory, as the step's GROUP BY merges
    // them after the first iteration.
    let term = r.static_term.as_ref().clone();
    let order = columns(&term)
        .into_iter()
        .map(|c| c.sort(true, true))
        .collect();
    let windowed = LogicalPlanBuilder::from(term)
        .window(vec![dense_rank().order_by(order).build()?])?
        .build()?;
    let mut exprs = columns(&windowed);
    let numbered = exprs.pop().expect("the first row's rank");
    exprs.push(lit(0i64).alias(ITERATION_COLUMN));
    exprs.push(numbered.alias(TRAJECTORY_COLUMN));
    let a = step.aggregate;
    let groups = a.group_expr.len();
    let mut names = vec![ITERATION_COLUMN.to_string(), TRAJECTORY_COLUMN.to_string()];
    for (j, field) in a.schema.fields().iter().skip(groups).enumerate() {
        let none = ScalarValue::try_from(field.data_type())?;
        exprs.push(Expr::Literal(none, None).alias(aggregate_column(j)));
        names.push(aggregate_column(j));
    }
    // The averaging aggregates' arguments, counted.
    let averaged: Vec<(usize, Expr)> = match counts {
        true => (0..a.aggr_expr.len())
            .filter_map(|j| match sums_of(&a.aggr_expr[j]) {
                Some((Sums::Mean, arg)) => Some((j, count(arg.clone()))),
                _ => None,
            })
            .collect(),
        false => Vec::new(),
    };
    for (j, _) in &averaged {
        exprs.push(Expr::Literal(ScalarValue::Int64(None), None).alias(count_column(*j)));
        names.push(count_column(*j));
    }
    let static_term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(windowed))?);
    let (p, input) = term_with_columns(r, &static_term, &names)?;
    let input = match averaged.is_empty() {
        true => input,
        false => {
            let LogicalPlan::Aggregate(with_keys) = &input else {
                unreachable!("the step's aggregate, grouping by the new columns too")
            };
            let mut aggregates = with_keys.aggr_expr.clone();
            aggregates.extend(averaged.iter().map(|(_, n)| n.clone()));
            LogicalPlan::Aggregate(Aggregate::try_new(
                Arc::clone(&with_keys.input),
                with_keys.group_expr.clone(),
                aggregates,
            )?)
        }
    };
    let mut exprs = p.expr.clone();
    let iteration = Expr::Column(column_named(&input, ITERATION_COLUMN)?);
    exprs.push((iteration + lit(1i64)).alias(ITERATION_COLUMN));
    exprs.push(Expr::Column(column_named(&input, TRAJECTORY_COLUMN)?).alias(TRAJECTORY_COLUMN));
    let LogicalPlan::Aggregate(with_keys) = &input else {
        unreachable!("the step's aggregate, grouping by the new columns too")
    };
    let keys = with_keys.group_expr.len();
    for j in 0..a.aggr_expr.len() {
        let value = Column::from(input.schema().qualified_field(keys + j));
        exprs.push(Expr::Column(value).alias(aggregate_column(j)));
    }
    // The new counts after the step's own aggregates (the previous row's
    // were carried as group keys, as its aggregates' values).
    for (i, (j, _)) in averaged.iter().enumerate() {
        let n = a.aggr_expr.len() + i;
        let value = Column::from(input.schema().qualified_field(keys + n));
        exprs.push(Expr::Column(value).alias(count_column(*j)));
    }
    let recursive_term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
    Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
        r.name.clone(),
        Arc::new(static_term),
        Arc::new(recursive_term),
        false,
    )?))
}

/// The column `c` of the previous row, unqualified.
fn state_column(state: &DFSchema, c: usize) -> Expr {
    Expr::Column(Column::new_unqualified(state.field(c).name()))
}

/// `sum` (or `tensor_sum`) of `e`, a value of `field`'s type.
pub(super) fn total_of(e: Expr, field: &Field) -> Expr {
    match field.data_type() {
        DataType::Float64 => sum(e),
        _ => tensor::aggregate_call("tensor_sum", e),
    }
}

/// `avg` (or `tensor_avg`) of `e`, a value of `field`'s type.
fn mean_of(e: Expr, field: &Field) -> Expr {
    match field.data_type() {
        DataType::Float64 => avg(e),
        _ => tensor::aggregate_call("tensor_avg", e),
    }
}

/// The zero of a differentiable column's type `t`.
pub(super) fn zero(t: &DataType) -> Result<Expr> {
    let shape = Shape::of(t).expect("a float or float tensor");
    let value =
        ScalarValue::try_from_array(&batch::build(shape, vec![0.0; shape.size()], None), 0)?;
    Ok(Expr::Literal(value, None))
}

/// `plan` analyzed by the markers' analyzer rule (the backward step's
/// vector-Jacobian products).
fn analyzed(plan: LogicalPlan) -> Result<LogicalPlan> {
    GradAnalyzer.analyze(plan, &Default::default())
}
