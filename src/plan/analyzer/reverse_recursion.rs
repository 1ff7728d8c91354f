//! Derivatives *through* `WITH RECURSIVE` in reverse mode: for tensor
//! variables of many elements, where forward mode would carry a tangent per
//! element, and for derivatives asked for at few rows (see `recursion.rs`
//! for the semantics, which are the same).
//!
//! The CTE's rows get the iteration that produced them
//! ([`ITERATION_COLUMN`]) and a copy of the first row they derive from
//! ([`initial_column`]); at the marker, the cotangent of `f` with respect
//! to each of the CTE's columns its row holds is computed by the engine
//! (the seeds), and an [`AdjointLoop`] replays each row's iterations
//! forwards and backwards (`crate::plan::adjoint_loop`). The loop's step —
//! the recursive term's update, inlined into one expression per column over
//! the previous row — and its vector-Jacobian product are differentiated
//! once, here.
//!
//! Reverse mode follows row-wise loops: a recursive term of projections and
//! filters over the work table (each row derives from one row of the
//! previous iteration). A step that joins or aggregates, a column the
//! variable flows into that is neither a float nor a float tensor, and a
//! first row that computes a column from the variable (other than copying
//! it) are refused with a typed error (and, as a guard, an `f` still
//! reading a value derived from the CTE after derived columns are written
//! out over the values projections pass on); forward mode
//! (`SET datafusion_grad.recursion_mode = 'forward'`) covers the joins and
//! aggregates for float states.
//!
//! ```sql
//! WITH RECURSIVE s(step, v, v0) AS (
//!   SELECT 0, v0, v0 FROM (SELECT tensor([0.1, 0.2, 0.3], 3) AS v0) i
//!   UNION ALL
//!   SELECT step + 1, tensor_add(v, scale(tensor_tanh(v), 0.1)), v0 FROM s WHERE step < 30)
//! SELECT grad(tensor_total(tensor_mul(v, v)), v0) FROM s WHERE step = 30;
//! ```

use std::cell::Cell;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Expr, ExprSchemable, Extension, LogicalPlan, Projection, RecursiveQuery,
};

use super::backward_recursion::{self, AggregatingStep};
use super::recursion::{
    carry, column_named, term_with_columns, work_table_reads, Found, MAX_DIRECTIONS,
};
use crate::engine::call::{as_marker, has_marker, MarkerCall, MarkerKind};
use crate::engine::{differentiate, Seed};
use crate::error::{fail, ErrorKind};
use crate::options::RecursionMode;
use crate::plan::adjoint_loop::{AdjointLoop, LoopStep, Wanted};
use crate::plan::columns;
use crate::plan::lineage::{origin_of, overlaps, parts, through_iterations, Part, Scope};
use crate::plan::{refuse_volatile, unalias, volatile_function};
use crate::reserved::{
    adjoint_column, initial_column, reverse_column, seed_column, ITERATION_COLUMN,
};
use crate::tensor::{self, Shape};

thread_local! {
    /// The `recursion_mode` setting of the analysis under way.
    static MODE: Cell<RecursionMode> = const { Cell::new(RecursionMode::Auto) };
}

/// Runs `analysis` with `mode` as the recursion mode its markers see.
pub(super) fn with_mode<T>(mode: RecursionMode, analysis: impl FnOnce() -> T) -> T {
    let before = MODE.with(|m| m.replace(mode));
    let result = analysis();
    MODE.with(|m| m.set(before));
    result
}

/// Whether the derivatives for `variables` through `r` are taken in
/// reverse mode: as set, or (`auto`) by cost. Forward mode carries a
/// tangent per scalar direction (each number variable, each element of a
/// tensor variable) through every iteration: `d·T` for `d` directions and
/// `T` iterations, whichever rows are asked for. Reverse mode replays the
/// iterations backwards once per row asked for: `T` for the last row alone,
/// `T²/2` for every row. So `auto` takes forward mode for number variables,
/// and for tensor variables of at most [`MAX_DIRECTIONS`] elements in all
/// where the derivative is asked for at every row (`every_row`: no filter
/// or limit between the CTE and the marker) or where reverse mode does not
/// follow the loop (a step that joins or aggregates, a first row computed
/// from the variable: [`follows`]) or calls a volatile function in its step
/// (`random()`: reverse mode evaluates the steps again, and refuses it);
/// reverse mode otherwise. Both modes give the same derivative; the choice
/// is one of cost.
pub(super) fn chosen(r: &RecursiveQuery, variables: &[usize], every_row: bool) -> Result<bool> {
    Ok(match MODE.with(Cell::get) {
        RecursionMode::Forward => false,
        RecursionMode::Reverse => true,
        RecursionMode::Auto => {
            let schema = r.static_term.schema();
            let types = || variables.iter().map(|&v| schema.field(v).data_type());
            let directions: Option<usize> = types().map(|t| Shape::of(t).map(Shape::size)).sum();
            let forward_fits = directions.is_some_and(|d| d <= MAX_DIRECTIONS);
            types().any(|t| t.is_nested())
                && !(forward_fits
                    && (every_row
                        || volatile_function(&r.recursive_term)?.is_some()
                        || !follows(r, variables)?))
        }
    })
}

/// Whether reverse mode follows the loop `r` for `variables`: a row-wise
/// step, and a first row that copies each variable or does not read it.
fn follows(r: &RecursiveQuery, variables: &[usize]) -> Result<bool> {
    if row_wise_step(r).is_err() {
        return Ok(false);
    }
    let differentiable = differentiable_columns(r.static_term.schema());
    for &v in variables {
        if first_row_copies(&r.static_term, &differentiable, v)?.is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The nodes of `r`'s recursive term from its top down to the scan of the
/// work table where it is a row-wise step, the loops reverse mode replays
/// row by row: projections, aliases, filters, sorts and limits over one
/// whole scan of the work table (see [`inline_step`]); `Err` with the first
/// node of another kind otherwise.
fn row_wise_step(r: &RecursiveQuery) -> std::result::Result<Vec<&LogicalPlan>, &LogicalPlan> {
    let mut path = Vec::new();
    let mut plan = r.recursive_term.as_ref();
    loop {
        path.push(plan);
        plan = match plan {
            LogicalPlan::Projection(p) => p.input.as_ref(),
            LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
            LogicalPlan::Filter(f) => f.input.as_ref(),
            LogicalPlan::Sort(s) => s.input.as_ref(),
            LogicalPlan::Limit(l) => l.input.as_ref(),
            LogicalPlan::TableScan(s)
                if s.table_name.table() == r.name
                    && s.projection.is_none()
                    && s.filters.is_empty() =>
            {
                return Ok(path)
            }
            other => return Err(other),
        }
    }
}

/// The float and float tensor columns of `schema`: the columns that carry a
/// cotangent.
pub(super) fn differentiable_columns(schema: &DFSchema) -> Vec<usize> {
    (0..schema.fields().len())
        .filter(|&c| is_differentiable(schema.field(c).data_type()))
        .collect()
}

/// `node` (over `input`) with its markers through the CTE of `found`
/// taken in reverse mode: see the [module docs](self).
pub(super) fn reverse(node: LogicalPlan, input: LogicalPlan, found: &Found) -> Result<LogicalPlan> {
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
    if r.is_distinct {
        refuse(
            "it is a UNION (distinct), which drops rows by their values; write UNION ALL".into(),
        )?;
    }
    refuse_volatile(
        &r.recursive_term,
        &format!(
            "reverse mode through the recursive CTE `{}` evaluates its steps again (replayed \
             from checkpoints, and over the data for the steps' derivatives); forward mode \
             (SET datafusion_grad.recursion_mode = 'forward') follows the draws the loop made",
            r.name
        ),
    )?;
    let state = Arc::new(DFSchema::try_from(
        r.static_term.schema().as_arrow().clone(),
    )?);
    let differentiable = differentiable_columns(&state);
    for (c, field) in state.fields().iter().enumerate() {
        for &v in &found.variables {
            if !differentiable.contains(&c) && (c == v || through_iterations(r, c, v)?) {
                refuse(format!(
                    "its column `{}` ({}) is computed from the variable `{}` through the \
                     iterations; reverse mode follows float and float tensor columns",
                    field.name(),
                    field.data_type(),
                    state.field(v).name()
                ))?;
            }
        }
    }
    let path = match row_wise_step(r) {
        Ok(path) => path,
        Err(other) => match AggregatingStep::of(r)? {
            Some(step) => {
                return backward_recursion::reverse(
                    node,
                    input,
                    found,
                    &step,
                    &state,
                    &differentiable,
                )
            }
            None => {
                let found = match work_table_reads(r)? {
                    1 => format!(
                        "contains `{}`",
                        other
                            .display()
                            .to_string()
                            .split(':')
                            .next()
                            .unwrap_or_default()
                            .trim()
                    ),
                    _ => "reads its work table more than once".to_string(),
                };
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "derivatives through the recursive CTE `{}` in reverse mode follow \
                         row-wise loops (projections and filters over the previous row) and \
                         loops whose step aggregates over data grouped by the previous row's \
                         columns (SELECT … FROM cte CROSS JOIN data GROUP BY every column of \
                         cte); its recursive term {found}; forward mode (SET \
                         datafusion_grad.recursion_mode = 'forward' or 'auto') follows joins \
                         and aggregates, for float and float tensor states and variables of at \
                         most {MAX_DIRECTIONS} elements in all",
                        r.name,
                    ),
                );
            }
        },
    };
    let updates = inline_step(&path, &state)?;
    let rules = found.rules.read().expect("rule table lock");
    // The step's vector-Jacobian product: the gradient of Σ ⟨λ_c, u_c⟩
    // with respect to the previous row's differentiable columns.
    let mut adjoint_fields: Vec<Field> =
        state.fields().iter().map(|f| f.as_ref().clone()).collect();
    let pairing = pairing(&state, &differentiable, &updates, &mut adjoint_fields);
    let adjoint_schema = Arc::new(DFSchema::from_unqualified_fields(
        adjoint_fields.into(),
        Default::default(),
    )?);
    let wrt: Vec<Column> = differentiable
        .iter()
        .map(|&c| Column::new_unqualified(state.field(c).name()))
        .collect();
    let adjoints = differentiate(&pairing, &wrt, Seed::Grad, &adjoint_schema, &rules)?.exprs;
    let step = Arc::new(LoopStep {
        name: r.name.clone(),
        state: Arc::clone(&state),
        updates,
        differentiable: differentiable.clone(),
        adjoint_schema,
        adjoints,
    });

    // The CTE's rows with their iteration and first row.
    let n = state.fields().len();
    let mut names = vec![ITERATION_COLUMN.to_string()];
    names.extend((0..n).map(initial_column));
    let cte = with_history(r, &names)?;
    let input = carry(&input, found.cte, &cte, names)?.expect("the CTE is below the marker");

    // The CTE's differentiable columns the marker's row holds.
    let mut visible = Vec::new();
    for i in 0..input.schema().fields().len() {
        let (origin, at) = origin_of(&input, i)?;
        if (std::ptr::eq(origin, &cte) || *origin == cte) && differentiable.contains(&at) {
            visible.push((Column::from(input.schema().qualified_field(i)), at));
        }
    }

    // One derivative per marker: seeds as columns, then the loop's node.
    let mut seeds: Vec<Expr> = columns(&input);
    let mut wanted = Vec::new();
    let mut types = Vec::new();
    let mut replacements = Vec::new();
    for e in node.expressions() {
        e.apply(|e| {
            let Some(call) = as_marker(e) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            let Some(vars) = found.of(&call.wrt_columns()) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            let v = one_variable(&call, &vars, found, &r.name)?;
            // A derived column of the CTE's values in `f` is written out
            // over them (projections above the CTE pass them on).
            let columns: Vec<Column> = visible.iter().map(|(c, _)| c.clone()).collect();
            let f = &Scope::new(vec![&input])?
                .inline(call.args[0].clone(), &columns, &[])?
                .data;
            reads_the_cte_directly(f, &input, &cte, &r.name)?;
            if call.kind() == MarkerKind::Jvp && !f.get_type(input.schema())?.is_numeric() {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!(
                        "jvp through the recursive CTE `{}` in reverse mode takes a \
                         number-valued f, but `{f}` is not; use vjp(f, v, u) with a cotangent \
                         u of f's shape",
                        r.name
                    ),
                );
            }
            let seed = match call.kind() {
                MarkerKind::Vjp => Seed::Vjp(call.args[2].clone()),
                MarkerKind::Grad | MarkerKind::Jvp => Seed::Grad,
            };
            let k = wanted.len();
            let cotangents = match columns.is_empty() {
                true => vec![],
                false => differentiate(f, &columns, seed, input.schema(), &rules)?.exprs,
            };
            let mut seeded = Vec::new();
            for &c in &differentiable {
                let mut sum: Option<Expr> = None;
                for ((_, at), cot) in visible.iter().zip(&cotangents) {
                    if *at == c {
                        sum = Some(match sum {
                            Some(s) => add(s, cot.clone(), state.field(c).data_type()),
                            None => cot.clone(),
                        });
                    }
                }
                seeded.push(sum.is_some());
                if let Some(s) = sum {
                    seeds.push(s.alias(seed_column(k, c)));
                }
            }
            let copies = copies_of(&r.static_term, &differentiable, v, &r.name)?;
            let t = state.field(v).data_type().clone();
            let result = Expr::Column(Column::new_unqualified(reverse_column(k)));
            let replacement = match call.kind() {
                MarkerKind::Jvp => {
                    let tangent = call.args[2].clone();
                    match t {
                        DataType::Float64 => tangent * result,
                        _ => tensor::call(
                            "tensor_total",
                            vec![tensor::call("tensor_mul", vec![tangent, result])],
                        ),
                    }
                }
                _ => result,
            };
            replacements.push((e.clone(), replacement));
            wanted.push(Wanted { seeded, copies });
            types.push(t);
            Ok(TreeNodeRecursion::Jump)
        })?;
    }
    drop(rules);
    let seeded = LogicalPlan::Projection(Projection::try_new(seeds, Arc::new(input))?);
    let adjoint = LogicalPlan::Extension(Extension {
        node: Arc::new(AdjointLoop::try_new(seeded, step, wanted, &types)?),
    });
    let names = NamePreserver::new(&node);
    let mut exprs = Vec::new();
    for e in node.expressions() {
        let saved = names.save(&e);
        let e = e
            .transform_down(|e| match replacements.iter().find(|(m, _)| *m == e) {
                Some((_, r)) => Ok(Transformed::new(r.clone(), true, TreeNodeRecursion::Jump)),
                None => Ok(Transformed::no(e)),
            })?
            .data;
        exprs.push(saved.restore(e));
    }
    node.with_new_exprs(exprs, vec![adjoint])
}

/// `Σ_c ⟨λ_c, u_c⟩` over the `differentiable` columns `c` of `state`:
/// `λ_c` the adjoint column of `c` (its field pushed to `fields`), `u_c`
/// its update. A step's vector-Jacobian product is this pairing's
/// gradient.
pub(super) fn pairing(
    state: &DFSchema,
    differentiable: &[usize],
    updates: &[Expr],
    fields: &mut Vec<Field>,
) -> Expr {
    let mut pairing: Option<Expr> = None;
    for &c in differentiable {
        let name = adjoint_column(c);
        fields.push(Field::new(&name, state.field(c).data_type().clone(), true));
        let lambda = Expr::Column(Column::new_unqualified(name));
        let term = match state.field(c).data_type() {
            DataType::Float64 => lambda * updates[c].clone(),
            _ => tensor::call(
                "tensor_total",
                vec![tensor::call("tensor_mul", vec![lambda, updates[c].clone()])],
            ),
        };
        pairing = Some(match pairing {
            Some(p) => p + term,
            None => term,
        });
    }
    pairing.expect("a differentiable column: the variable's")
}

/// The CTE's column that is the one variable (`vars`: its tangent sets)
/// of a marker `call` taken in reverse mode; several are refused.
pub(super) fn one_variable(
    call: &MarkerCall,
    vars: &[usize],
    found: &Found,
    name: &str,
) -> Result<usize> {
    match vars {
        [j] => Ok(found.variables[*j]),
        _ => fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "{}: several variables carried through the recursive CTE `{name}` in one \
                 call; take one derivative per variable (e.g. grad(f, a), grad(f, x0))",
                call.kind().name()
            ),
        ),
    }
}

/// Floats and float tensors (vectors, matrices): the columns that carry a
/// cotangent.
pub(super) fn is_differentiable(t: &DataType) -> bool {
    *t == DataType::Float64 || tensor::Shape::is_tensor_type(t)
}

/// `a + b` for cotangents of type `t`.
pub(super) fn add(a: Expr, b: Expr, t: &DataType) -> Expr {
    match t {
        DataType::Float64 => a + b,
        _ => tensor::call("tensor_add", vec![a, b]),
    }
}

/// The row-wise recursive term of `r` (its `path` from the top down to the
/// work table's scan: [`row_wise_step`]) as one update expression per
/// column over the previous row (`state`'s unqualified columns):
/// projections inlined, filters, sorts and limits passed (they only drop
/// rows; a row that exists passed them).
fn inline_step(path: &[&LogicalPlan], state: &DFSchema) -> Result<Vec<Expr>> {
    let name = match path.last() {
        Some(LogicalPlan::TableScan(s)) => s.table_name.table().to_string(),
        _ => unreachable!("a row-wise step ends at the work table"),
    };
    let mut exprs: Vec<Expr> = columns(path[0]);
    for &plan in path {
        let below = |exprs: Vec<Expr>, with: &dyn Fn(usize) -> Expr| {
            exprs
                .into_iter()
                .map(|e| {
                    e.transform_up(|e| match e {
                        Expr::Column(c) => {
                            let i = plan.schema().index_of_column(&c)?;
                            Ok(Transformed::yes(with(i)))
                        }
                        e => Ok(Transformed::no(e)),
                    })
                    .map(|t| t.data)
                })
                .collect::<Result<Vec<_>>>()
        };
        exprs = match plan {
            LogicalPlan::Projection(p) => below(exprs, &|i| unalias(&p.expr[i]).clone())?,
            LogicalPlan::SubqueryAlias(a) => {
                let inner = a.input.schema();
                below(exprs, &|i| {
                    Expr::Column(Column::from(inner.qualified_field(i)))
                })?
            }
            LogicalPlan::TableScan(_) => below(exprs, &|i| {
                Expr::Column(Column::new_unqualified(state.field(i).name()))
            })?,
            _ => exprs,
        };
    }
    for e in &exprs {
        let mut bad = has_marker(e) || e.is_volatile();
        e.apply(|e| {
            bad |= matches!(
                e,
                Expr::ScalarSubquery(_)
                    | Expr::Exists(_)
                    | Expr::InSubquery(_)
                    | Expr::OuterReferenceColumn(..)
            );
            Ok(TreeNodeRecursion::Continue)
        })?;
        if bad {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "derivatives through the recursive CTE `{name}` in reverse mode: its update \
                     `{e}` has a subquery, a volatile function or a derivative left to \
                     simplify; reverse mode replays the update as a function of the previous row"
                ),
            );
        }
    }
    Ok(exprs)
}

/// `r` with the columns `names` after its own: the iteration (0, then one
/// more each step) and a copy of each column of the first row.
fn with_history(r: &RecursiveQuery, names: &[String]) -> Result<LogicalPlan> {
    let term = r.static_term.as_ref();
    let mut exprs: Vec<Expr> = columns(term);
    exprs.push(lit(0i64).alias(&names[0]));
    for (c, column) in term.schema().columns().into_iter().enumerate() {
        exprs.push(Expr::Column(column).alias(&names[c + 1]));
    }
    let static_term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(term.clone()))?);

    let (p, input) = term_with_columns(r, &static_term, names)?;
    let mut exprs = p.expr.clone();
    let iteration = Expr::Column(column_named(&input, &names[0])?);
    exprs.push((iteration + lit(1i64)).alias(&names[0]));
    for name in &names[1..] {
        exprs.push(Expr::Column(column_named(&input, name)?).alias(name));
    }
    let recursive_term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
    Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
        r.name.clone(),
        Arc::new(static_term),
        Arc::new(recursive_term),
        false,
    )?))
}

/// The differentiable columns (positions in `differentiable`) whose first
/// value is the variable `v`'s (itself, or a copy the static term makes of
/// the same value); a first value computed from `v`'s otherwise is refused.
pub(super) fn copies_of(
    static_term: &LogicalPlan,
    differentiable: &[usize],
    v: usize,
    name: &str,
) -> Result<Vec<usize>> {
    match first_row_copies(static_term, differentiable, v)? {
        Ok(copies) => Ok(copies),
        Err(c) => fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "derivatives through the recursive CTE `{name}` in reverse mode: its first \
                 row computes `{}` from the variable `{}`; reverse mode takes a first row \
                 that copies the variable (e.g. `SELECT v0 AS v, v0`) or does not read it",
                static_term.schema().field(c).name(),
                static_term.schema().field(v).name()
            ),
        ),
    }
}

/// The differentiable columns (positions in `differentiable`) whose first
/// value is the variable `v`'s, or `Err` with a column whose first value is
/// computed from `v`'s otherwise.
fn first_row_copies(
    static_term: &LogicalPlan,
    differentiable: &[usize],
    v: usize,
) -> Result<std::result::Result<Vec<usize>, usize>> {
    let (v_origin, v_at) = origin_of(static_term, v)?;
    let v_parts = parts(static_term, v)?;
    let mut copies = Vec::new();
    for (i, &c) in differentiable.iter().enumerate() {
        let (origin, at) = origin_of(static_term, c)?;
        let same = c == v || (at == v_at && (std::ptr::eq(origin, v_origin) || origin == v_origin));
        if same {
            copies.push(i);
        } else if overlaps(&parts(static_term, c)?, &v_parts) {
            return Ok(Err(c));
        }
    }
    Ok(Ok(copies))
}

/// Refuses an `f` that reads a value computed from the CTE's columns
/// rather than the columns themselves: its seeds would miss the path.
pub(super) fn reads_the_cte_directly(
    f: &Expr,
    input: &LogicalPlan,
    cte: &LogicalPlan,
    name: &str,
) -> Result<()> {
    for c in f.column_refs() {
        let Ok(idx) = input.schema().index_of_column(c) else {
            continue;
        };
        let (origin, _) = origin_of(input, idx)?;
        if std::ptr::eq(origin, cte) || origin == cte {
            continue;
        }
        let derived = parts(input, idx)?.iter().any(|p| match p {
            Part::Node(node, _) => std::ptr::eq(*node, cte) || *node == cte,
            _ => false,
        });
        if derived {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "derivatives through the recursive CTE `{name}` in reverse mode: `{c}` is \
                     computed from the CTE's columns; write its definition in the derivative's \
                     function, over the CTE's columns"
                ),
            );
        }
    }
    Ok(())
}
