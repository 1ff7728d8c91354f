//! Derivatives *through* `WITH RECURSIVE`, in forward mode: tangent columns
//! carried through the iterations.
//!
//! A row of a recursive CTE derives from a row of the previous iteration,
//! back to the static term. For a marker whose variable `v` is a column the
//! recursive term carries unchanged (a hyperparameter, a copy of the
//! initial state) and whose `f` reads columns that `v` flows into through
//! the iterations, the derivative is the total one. The CTE gets one
//! tangent column `__dfgrad_tangent{j}_{c}` = d c / d vⱼ per float or
//! float tensor column `c` (a tensor of `c`'s shape) and direction `vⱼ`: a
//! number variable, or an element of a tensor variable (its unit tensor
//! `eₖ` is the variable's tangent; at most [`MAX_DIRECTIONS`] in all):
//!
//! - static term: `d c / d v` of the first row, as the analyzer takes it
//!   over the term's output: 1 for `v` itself, and for another column the
//!   derivative of its definition where it is computed from `v`'s
//!   (`SELECT x0 AS x, x0 …`: 1), 0 where it is not;
//! - recursive term: the tangent of each update `u_c` is
//!   `jvp(u_c, w₁, t₁, …)` over the previous row's float columns `wᵢ` and
//!   their tangents `tᵢ` (through aggregates over the data too, which the
//!   analyzer differentiates as any marker);
//! - the marker: `grad(f, v)` becomes `jvp(f, c₁, t₁, …)` over the CTE's
//!   columns visible at it and their tangents; `jvp(f, v₁, s₁, …)` sums
//!   `sᵢ·tᵢ`; `vjp(f, v, u)` is `u` times the total. For a tensor
//!   variable, `grad` and `vjp` assemble `Σₖ eₖ·(df/dvₖ)` from one such
//!   `jvp` per element, and `jvp`'s tangent `t` weighs direction `k` by `tₖ`.
//!
//! Conditions (the `WHERE step < n` stop, `CASE`) are piecewise constant,
//! as JAX treats a `while_loop`'s trip count under `jvp`. A recursive term
//! that reads the work table more than once (its subqueries too) is
//! rewritten before its own markers, every node with tangents
//! ([`super::tangent_plan`]); once analyzed, such a term is refused.
//! Refused, typed: `UNION` (distinct: the
//! tangents would change which rows are duplicates), a marker mixing such
//! variables with others, tensor variables of more than [`MAX_DIRECTIONS`]
//! elements, a column of another compound type the variable flows into, and
//! the CTE's columns reaching the marker through an aggregate,
//! window or set operation (put the marker inside the aggregate:
//! `avg(grad(loss, lr))`, or group by the variable). Projections between
//! the CTE and the marker also pass its float values on
//! (`__dfgrad_value{c}_{cte}`), so a derived column of them is differentiated
//! through them.
//!
//! Where `datafusion_grad.recursion_mode = 'auto'` finds reverse mode
//! cheaper (`reverse_recursion::chosen`: tensor variables with more elements,
//! or a derivative asked for at some rows only, of a loop reverse mode
//! follows), or the setting asks for it,
//! the markers are taken in reverse mode instead (`reverse_recursion.rs`).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Aggregate, Expr, ExprSchemable, Filter, Join, JoinType, Limit, LogicalPlan, Projection,
    RecursiveQuery, ScalarUDF, Sort, SubqueryAlias, TableScanBuilder,
};
use datafusion::optimizer::AnalyzerRule;

use super::tangent_plan::Rewriter;
use super::{reverse_recursion, GradAnalyzer};
use crate::engine::call::{as_marker, has_marker, Marker, MarkerKind, SharedRules};
use crate::error::{fail, ErrorKind};
use crate::plan::lineage::{copy_of, origin_of, parts, through_iterations, Part};
use crate::plan::unalias;
use crate::reserved::{carried_value, tangent_column};
use crate::tensor::{self, Shape};

/// `node` with each marker whose variables are carried columns of a
/// recursive CTE that `f` reads through the iterations rewritten in
/// forward mode (see the [module docs](self)); unchanged otherwise.
pub(super) fn through_recursion(node: LogicalPlan) -> Result<LogicalPlan> {
    forward(node, false)
}

/// [`through_recursion`] for a node above a recursive CTE whose recursive
/// term reads its work table more than once (its subqueries too), before
/// the markers of that term are rewritten: every node of the term carries
/// tangents ([`super::tangent_plan`]). Where [`rereads_below`] holds.
pub(super) fn through_rereading_recursion(node: LogicalPlan) -> Result<LogicalPlan> {
    forward(node, true)
}

/// Whether `node`'s markers differentiate in forward mode through a
/// recursive CTE whose recursive term reads its work table more than once
/// (its subqueries too), with no other marker below `node`.
pub(super) fn rereads_below(node: &LogicalPlan) -> Result<bool> {
    let [input] = node.inputs()[..] else {
        return Ok(false);
    };
    let Some(found) = find(node, input)? else {
        return Ok(false);
    };
    let LogicalPlan::RecursiveQuery(r) = found.cte else {
        unreachable!("found a recursive CTE")
    };
    if work_table_reads(r)? < 2
        || reverse_recursion::chosen(r, &found.variables, every_row(input, found.cte)?)?
    {
        return Ok(false);
    }
    // The CTE's own markers are rewritten with its tangents; another
    // marker below would be rewritten after the node it is below.
    let mut marked_outside = false;
    input.apply_with_subqueries(|n| {
        if std::ptr::eq(n, found.cte) {
            return Ok(TreeNodeRecursion::Jump);
        }
        marked_outside |= n.expressions().iter().any(has_marker);
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(!marked_outside)
}

/// Whether an aggregate of `node`'s input reads a recursive CTE whose
/// recursive term reads its work table more than once (its subqueries too).
pub(super) fn rereading_loop_below(node: &LogicalPlan) -> Result<bool> {
    let [input] = node.inputs()[..] else {
        return Ok(false);
    };
    input.exists(|n| {
        let LogicalPlan::Aggregate(a) = n else {
            return Ok(false);
        };
        a.input.exists(|n| {
            Ok(match n {
                LogicalPlan::RecursiveQuery(r) => work_table_reads(r)? >= 2,
                _ => false,
            })
        })
    })
}

/// How many times the recursive term of `r` (its subqueries too) reads the
/// work table.
pub(super) fn work_table_reads(r: &RecursiveQuery) -> Result<usize> {
    let mut reads = 0;
    r.recursive_term.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(s) = node {
            reads += usize::from(s.table_name.table() == r.name);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(reads)
}

/// [`through_recursion`]; `rereading`: the CTE's recursive term reads the
/// work table more than once and is not analyzed yet.
fn forward(node: LogicalPlan, rereading: bool) -> Result<LogicalPlan> {
    let [input] = node.inputs()[..] else {
        return Ok(node);
    };
    let input = input.clone();
    let Some(found) = find(&node, &input)? else {
        return Ok(node);
    };
    let LogicalPlan::RecursiveQuery(r) = found.cte else {
        unreachable!("found a recursive CTE")
    };
    if !rereading && reverse_recursion::chosen(r, &found.variables, every_row(&input, found.cte)?)?
    {
        return reverse_recursion::reverse(node.clone(), input.clone(), &found);
    }
    let tangents = Tangents::new(r, &found.variables, &found.rules, rereading)?;
    let cte = tangents.cte()?;
    let input =
        carry(&input, found.cte, &cte, tangents.names())?.expect("the CTE is below the marker");
    // The CTE's float columns visible at the marker, and their tangents.
    let mut visible = Vec::new();
    for i in 0..input.schema().fields().len() {
        let (origin, at) = origin_of(&input, i)?;
        if (std::ptr::eq(origin, &cte) || *origin == cte) && tangents.floats.contains(&at) {
            visible.push((Column::from(input.schema().qualified_field(i)), at));
        }
    }
    let tangent = |j: usize, c: usize| tangents.tangent(j, c, &input);
    let names = NamePreserver::new(&node);
    let mut exprs = Vec::new();
    for e in node.expressions() {
        let saved = names.save(&e);
        let e = e
            .transform_up(|e| {
                let Some(call) = as_marker(&e) else {
                    return Ok(Transformed::no(e));
                };
                let Some(vars) = found.of(&call.wrt_columns()) else {
                    return Ok(Transformed::no(e));
                };
                let kind = call.kind();
                if kind != MarkerKind::Jvp && vars.len() != 1 {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "{}: several variables carried through the recursive CTE `{}` in \
                             one call; take one derivative per variable (e.g. grad(f, a), \
                             grad(f, x0))",
                            kind.name(),
                            r.name
                        ),
                    );
                }
                // The jvp of `f` along the tangent sets `seeds`, each
                // weighted by its seed (1, or a tangent's element).
                let directional = |seeds: &[(usize, Expr)]| -> Result<Expr> {
                    let mut args = vec![call.args[0].clone()];
                    for (column, c) in &visible {
                        let mut total: Option<Expr> = None;
                        for (j, seed) in seeds {
                            let Some(t) = tangent(*j, *c)? else {
                                continue;
                            };
                            let term = match tangents.is_tensor(*c) {
                                true => tensor::call("scale", vec![t, seed.clone()]),
                                false => seed.clone() * t,
                            };
                            total = Some(match (total, tangents.is_tensor(*c)) {
                                (Some(s), true) => tensor::call("tensor_add", vec![s, term]),
                                (Some(s), false) => s + term,
                                (None, _) => term,
                            });
                        }
                        if let Some(total) = total {
                            args.push(Expr::Column(column.clone()));
                            args.push(total);
                        }
                    }
                    if args.len() == 1 {
                        // No tangent reaches the columns `f` reads here: 0.
                        let x = call.args[1].clone();
                        let zero =
                            match Shape::is_tensor_type(&x.get_type(input.schema().as_ref())?) {
                                true => tensor::call("zeros_like", vec![x.clone()]),
                                false => lit(0.0),
                            };
                        args.extend([x, zero]);
                    }
                    let jvp = ScalarUDF::new_from_impl(Marker::new(
                        MarkerKind::Jvp,
                        Arc::clone(&found.rules),
                    ));
                    Ok(jvp.call(args))
                };
                let derivative = match kind {
                    // Σ tᵢ · (df/dvᵢ), an element of a tensor tangent for
                    // each of its directions.
                    MarkerKind::Jvp => {
                        let mut seeds = Vec::new();
                        for (&v, t) in vars.iter().zip(call.args[2..].iter().step_by(2)) {
                            for j in tangents.sets_of(v) {
                                let seed = match tangents.direction(j)? {
                                    None => t.clone(),
                                    Some(e) => tensor::call(
                                        "tensor_total",
                                        vec![tensor::call("tensor_mul", vec![t.clone(), e])],
                                    ),
                                };
                                seeds.push((j, seed));
                            }
                        }
                        directional(&seeds)?
                    }
                    // df/dv (paired with u for vjp), one direction at a
                    // time for a tensor variable: Σₖ eₖ · (df/dvₖ).
                    _ => {
                        let mut assembled: Option<Expr> = None;
                        for j in tangents.sets_of(vars[0]) {
                            let d = directional(&[(j, lit(1.0))])?;
                            let d = match kind {
                                MarkerKind::Vjp => {
                                    let u = call.args[2].clone();
                                    match Shape::is_tensor_type(
                                        &u.get_type(input.schema().as_ref())?,
                                    ) {
                                        true => tensor::call(
                                            "tensor_total",
                                            vec![tensor::call("tensor_mul", vec![u, d])],
                                        ),
                                        false => u * d,
                                    }
                                }
                                _ => d,
                            };
                            assembled = Some(match (tangents.direction(j)?, assembled) {
                                (None, _) => d,
                                (Some(e), None) => tensor::call("scale", vec![e, d]),
                                (Some(e), Some(sum)) => tensor::call(
                                    "tensor_add",
                                    vec![sum, tensor::call("scale", vec![e, d])],
                                ),
                            });
                        }
                        assembled.expect("a variable has a tangent set")
                    }
                };
                Ok(Transformed::yes(derivative))
            })?
            .data;
        exprs.push(saved.restore(e));
    }
    node.with_new_exprs(exprs, vec![input])
}

/// The recursive CTE a node's markers differentiate through, and the
/// variables (its column indexes) they do it for.
pub(super) struct Found<'p> {
    pub(super) cte: &'p LogicalPlan,
    /// The CTE's columns the markers' variables are, one tangent set each.
    pub(super) variables: Vec<usize>,
    /// The marker's column of each variable.
    columns: Vec<Column>,
    pub(super) rules: SharedRules,
}

impl Found<'_> {
    /// The tangent sets of a marker's variables `wrt` if they all are
    /// variables through the CTE; `None` if none is.
    pub(super) fn of(&self, wrt: &[Column]) -> Option<Vec<usize>> {
        let sets: Vec<usize> = wrt
            .iter()
            .filter_map(|c| self.columns.iter().position(|v| v == c))
            .collect();
        (!sets.is_empty()).then_some(sets)
    }
}

/// The first recursive CTE below `node` that one of its markers
/// differentiates through, with every variable of `node`'s markers that
/// goes through it.
fn find<'p>(node: &LogicalPlan, input: &'p LogicalPlan) -> Result<Option<Found<'p>>> {
    let mut found: Option<Found<'p>> = None;
    for e in node.expressions() {
        let mut calls = Vec::new();
        e.apply(|e| {
            if let Some(call) = as_marker(e) {
                calls.push((
                    call.args[0].clone(),
                    call.wrt_columns(),
                    call.marker.rules().clone(),
                ));
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        for (f, wrt, rules) in calls {
            let mut through = Vec::new();
            let mut here: Option<&'p LogicalPlan> = None;
            for c in &wrt {
                let Ok(idx) = input.schema().index_of_column(c) else {
                    continue;
                };
                let (cte, v) = origin_of(input, idx)?;
                let LogicalPlan::RecursiveQuery(r) = cte else {
                    continue;
                };
                // Through an aggregate, the analyzer moves the marker into
                // it first (`avg(grad(loss, lr))`), where it comes back here.
                if copy_of(r, v)? != Some(v)
                    || aggregated_above(input, cte)?
                    || !reads_through(&f, input, cte, r, v)?
                {
                    continue;
                }
                let other = found.as_ref().map(|f| f.cte).or(here);
                if other.is_some_and(|o| !std::ptr::eq(o, cte)) {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        "derivatives through two recursive CTEs in one plan node are not \
                         supported; take them in separate queries",
                    );
                }
                here = Some(cte);
                through.push((c.clone(), v));
            }
            let Some(cte) = here else {
                continue;
            };
            if through.len() != wrt.len() {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    "a derivative with respect to columns carried through a recursive CTE \
                     and other variables in one call; take them in separate calls",
                );
            }
            let found = found.get_or_insert_with(|| Found {
                cte,
                variables: Vec::new(),
                columns: Vec::new(),
                rules,
            });
            for (c, v) in through {
                if !found.columns.contains(&c) {
                    found.columns.push(c);
                    found.variables.push(v);
                }
            }
        }
    }
    Ok(found)
}

/// Whether every row of the node `cte` reaches `plan`'s output: no filter
/// or limit of `plan` reads it (a marker above asks for its derivative at
/// every row).
fn every_row(plan: &LogicalPlan, cte: &LogicalPlan) -> Result<bool> {
    Ok(!plan.exists(|node| {
        Ok(
            matches!(node, LogicalPlan::Filter(_) | LogicalPlan::Limit(_))
                && node.exists(|n| Ok(std::ptr::eq(n, cte)))?,
        )
    })?)
}

/// Whether an aggregate or window of `plan` reads the node `cte`.
fn aggregated_above(plan: &LogicalPlan, cte: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        Ok(
            matches!(node, LogicalPlan::Aggregate(_) | LogicalPlan::Window(_))
                && node.exists(|n| Ok(std::ptr::eq(n, cte)))?,
        )
    })
}

/// Whether `f` (over `input`) reads a column of the recursive CTE `cte`
/// other than `v` that `v` flows into through the iterations.
fn reads_through(
    f: &Expr,
    input: &LogicalPlan,
    cte: &LogicalPlan,
    r: &RecursiveQuery,
    v: usize,
) -> Result<bool> {
    for c in f.column_refs() {
        let Ok(idx) = input.schema().index_of_column(c) else {
            continue;
        };
        for part in parts(input, idx)? {
            if let Part::Node(node, at) = part {
                if at != v
                    && (std::ptr::eq(node, cte) || node == cte)
                    && through_iterations(r, at, v)?
                {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// Whether forward mode carries a tangent for a column of type `t`: floats
/// and float tensors (whose tangents are tensors of their shape).
fn carries_tangent(t: &DataType) -> bool {
    t.is_floating() || Shape::is_tensor_type(t)
}

/// Most scalar directions forward mode carries through a recursive CTE: the
/// elements of its variables in all (a tangent set each). Beyond it, reverse
/// mode (one backward sweep per row asked for) is the one that scales.
pub(super) const MAX_DIRECTIONS: usize = 16;

/// A recursive CTE with tangent columns for some of its columns.
struct Tangents<'r> {
    r: &'r RecursiveQuery,
    /// One tangent set per scalar direction: a variable (its column), and
    /// for a tensor variable the element its direction is the unit tensor
    /// of (`None`: a number variable).
    sets: Vec<(usize, Option<usize>)>,
    /// The first tangent set of each variable (its sets are consecutive).
    first: Vec<usize>,
    /// Its float and float tensor columns.
    floats: Vec<usize>,
    /// For each tangent set, the float columns its variable flows into
    /// (each gets a tangent column; the others' tangents are constant: the
    /// direction for the variable, 0 otherwise).
    moving: Vec<Vec<usize>>,
    rules: SharedRules,
    /// The recursive term reads the work table more than once: each of
    /// its nodes carries tangents ([`super::tangent_plan`]).
    rereading: bool,
}

impl<'r> Tangents<'r> {
    fn new(
        r: &'r RecursiveQuery,
        variables: &[usize],
        rules: &SharedRules,
        rereading: bool,
    ) -> Result<Self> {
        if r.is_distinct {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "derivatives through the recursive CTE `{}`, a UNION (distinct): its \
                     tangents would change which rows are duplicates; write UNION ALL",
                    r.name
                ),
            );
        }
        let schema = r.static_term.schema();
        let floats: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| carries_tangent(schema.field(i).data_type()))
            .collect();
        // Forward mode carries one tangent of a column's own shape per
        // direction: one per number variable, one per element of a tensor
        // variable; a column of another compound type that a variable flows
        // into would be taken as constant, silently.
        let mut sets = Vec::new();
        let mut first = Vec::new();
        for &v in variables {
            let t = schema.field(v).data_type();
            let directions = match Shape::of(t) {
                Some(Shape::Scalar) if !t.is_decimal() => vec![None],
                Some(shape) if shape.is_tensor() => (0..shape.size()).map(Some).collect(),
                _ => {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "derivatives through the recursive CTE `{}` in forward mode with \
                             respect to `{}` ({t}): forward mode takes float, integer and \
                             float tensor variables",
                            r.name,
                            schema.field(v).name()
                        ),
                    )
                }
            };
            first.push(sets.len());
            sets.extend(directions.into_iter().map(|k| (v, k)));
        }
        if sets.len() > MAX_DIRECTIONS {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "derivatives through the recursive CTE `{}` in forward mode: its variables \
                     have {} elements in all, each a tangent carried through the iterations \
                     (at most {MAX_DIRECTIONS}); take them in reverse mode (recursion_mode \
                     'reverse' or 'auto')",
                    r.name,
                    sets.len()
                ),
            );
        }
        for (i, field) in schema.fields().iter().enumerate() {
            let t = field.data_type();
            if !(t.is_nested() || t.is_decimal()) || floats.contains(&i) {
                continue;
            }
            for &v in variables {
                if through_iterations(r, i, v)? {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "derivatives through the recursive CTE `{}`: its column `{}` \
                             ({t}) is computed from the variable `{}` through the \
                             iterations; forward mode carries float and float tensor \
                             columns only",
                            r.name,
                            field.name(),
                            schema.field(v).name()
                        ),
                    );
                }
            }
        }
        let mut moving = Vec::with_capacity(sets.len());
        for (i, &v) in variables.iter().enumerate() {
            let mut columns = Vec::new();
            for &c in &floats {
                // A term that reads the work table again carries every
                // float column's tangent (0 where `v` does not flow in).
                if c != v && (rereading || through_iterations(r, c, v)?) {
                    columns.push(c);
                }
            }
            let count = first.get(i + 1).unwrap_or(&sets.len()) - first[i];
            moving.extend(std::iter::repeat_n(columns, count));
        }
        Ok(Self {
            r,
            sets,
            first,
            floats,
            moving,
            rules: Arc::clone(rules),
            rereading,
        })
    }

    /// The tangent sets of the `i`-th variable.
    fn sets_of(&self, i: usize) -> std::ops::Range<usize> {
        self.first[i]..self.first.get(i + 1).copied().unwrap_or(self.sets.len())
    }

    /// The direction of tangent set `j` when its variable is a tensor: the
    /// unit tensor of its element; `None` for a number variable (1).
    fn direction(&self, j: usize) -> Result<Option<Expr>> {
        let (v, k) = self.sets[j];
        let Some(k) = k else {
            return Ok(None);
        };
        let t = self.r.static_term.schema().field(v).data_type();
        let shape = Shape::of(t).expect("a tensor variable");
        Ok(Some(Expr::Literal(tensor::batch::unit(shape, k)?, None)))
    }

    /// The names of the tangent columns, in order: tangent-set-major.
    fn names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for (j, columns) in self.moving.iter().enumerate() {
            for &c in columns {
                names.push(tangent_column(j, c));
            }
        }
        names
    }

    /// The tangent of float (or float tensor) column `c` in the `j`-th
    /// tangent set, over `plan` (which carries the tangent columns): its
    /// direction (1, or a unit tensor) for the variable itself (carried
    /// unchanged), `None` (zero) for a column it does not flow into.
    fn tangent(&self, j: usize, c: usize, plan: &LogicalPlan) -> Result<Option<Expr>> {
        if c == self.sets[j].0 {
            Ok(Some(self.direction(j)?.unwrap_or(lit(1.0))))
        } else if self.moving[j].contains(&c) {
            Ok(Some(Expr::Column(column_named(
                plan,
                &tangent_column(j, c),
            )?)))
        } else {
            Ok(None)
        }
    }

    /// Whether column `c` is a tensor (its tangents are tensors too).
    fn is_tensor(&self, c: usize) -> bool {
        Shape::is_tensor_type(self.r.static_term.schema().field(c).data_type())
    }

    /// The CTE with its tangent columns, both terms analyzed.
    fn cte(&self) -> Result<LogicalPlan> {
        let static_term = analyzed(self.static_term()?)?;
        let recursive_term = analyzed(self.recursive_term(&static_term)?)?;
        Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
            self.r.name.clone(),
            Arc::new(static_term),
            Arc::new(recursive_term),
            false,
        )?))
    }

    fn marker(&self, kind: MarkerKind, args: Vec<Expr>) -> Expr {
        ScalarUDF::new_from_impl(Marker::new(kind, Arc::clone(&self.rules))).call(args)
    }

    /// The static term with the first row's tangents: `d c / d v` of its
    /// columns, as the analyzer takes it over the term's output (a column
    /// defined from `v`'s definition follows it; `v` itself, however it
    /// is defined, is the variable: its definition is held fixed).
    ///
    /// Where the term is a SELECT list whose variables are columns of its
    /// input (`SELECT tensor_add(init.w0, scale(dir, s)) AS w, s FROM init,
    /// h`; see [`first_row`]), the tangents are taken in that list, over its
    /// input: the other columns the definitions read (`init.w0`) are
    /// visible there, so they need not be traced to the variable. The
    /// derivative is the same as over the term's output (the variable's
    /// value is that column's).
    fn static_term(&self) -> Result<LogicalPlan> {
        let term = self.r.static_term.as_ref();
        let schema = term.schema();
        let (mut exprs, definitions, input) = match first_row(term)? {
            Some((definitions, input))
                if self
                    .sets
                    .iter()
                    .all(|&(v, _)| matches!(definitions[v], Expr::Column(_))) =>
            {
                let exprs = (definitions.iter().enumerate())
                    .map(|(i, e)| {
                        let (qualifier, field) = schema.qualified_field(i);
                        e.clone().alias_qualified(qualifier.cloned(), field.name())
                    })
                    .collect();
                (exprs, definitions, input)
            }
            _ => {
                let columns: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
                (columns.clone(), columns, term)
            }
        };
        let names = self.names();
        let mut names = names.iter();
        for (j, moving) in self.moving.iter().enumerate() {
            let variable = definitions[self.sets[j].0].clone();
            for &c in moving {
                let value = definitions[c].clone();
                let tangent = match (self.direction(j)?, self.is_tensor(c)) {
                    (Some(e), _) => self.marker(MarkerKind::Jvp, vec![value, variable.clone(), e]),
                    (None, true) => {
                        self.marker(MarkerKind::Jvp, vec![value, variable.clone(), lit(1.0)])
                    }
                    (None, false) => self.marker(MarkerKind::Grad, vec![value, variable.clone()]),
                };
                exprs.push(tangent.alias(names.next().expect("a name per tangent")));
            }
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(input.clone()),
        )?))
    }

    /// The recursive term with each tangent's update, reading the work
    /// table of `static_term`'s schema.
    fn recursive_term(&self, static_term: &LogicalPlan) -> Result<LogicalPlan> {
        if self.rereading {
            return self.rereading_term(static_term);
        }
        let names = self.names();
        let (p, input) = term_with_columns(self.r, static_term, &names)?;
        // The previous row's float columns visible at the update, by index.
        let mut previous = Vec::new();
        for i in 0..input.schema().fields().len() {
            let (origin, at) = origin_of(&input, i)?;
            if let LogicalPlan::TableScan(s) = origin {
                if s.table_name.table() == self.r.name && self.floats.contains(&at) {
                    previous.push((Column::from(input.schema().qualified_field(i)), at));
                }
            }
        }
        let mut exprs = p.expr.clone();
        let mut names = names.iter();
        for (j, moving) in self.moving.iter().enumerate() {
            for &c in moving {
                let mut args = vec![unalias(&p.expr[c]).clone()];
                for (column, at) in &previous {
                    if let Some(tangent) = self.tangent(j, *at, &input)? {
                        args.push(Expr::Column(column.clone()));
                        args.push(tangent);
                    }
                }
                let update = match (args.len(), self.is_tensor(c)) {
                    (1, false) => lit(0.0),
                    (1, true) => tensor::call("zeros_like", args),
                    _ => self.marker(MarkerKind::Jvp, args),
                };
                exprs.push(update.alias(names.next().expect("a name per tangent")));
            }
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(input),
        )?))
    }

    /// The recursive term with every node's tangents (see
    /// [`super::tangent_plan`]), reading the work table of `static_term`'s
    /// schema: its columns, then each tangent column.
    fn rereading_term(&self, static_term: &LogicalPlan) -> Result<LogicalPlan> {
        let schema = Arc::new(static_term.schema().as_arrow().clone());
        let source = provider_as_source(Arc::new(CteWorkTable::new(&self.r.name, schema)));
        let columns = self.r.static_term.schema().fields().len();
        let tangent = |j: usize, c: usize, scan: &LogicalPlan| self.tangent(j, c, scan);
        let rewriter = Rewriter::new(
            &self.r.name,
            source,
            columns,
            self.sets.len(),
            &tangent,
            Arc::clone(&self.rules),
        );
        let dual = rewriter.dual(&self.r.recursive_term)?;
        let out = Arc::clone(dual.plan.schema());
        let mut exprs: Vec<Expr> = (0..columns)
            .map(|i| Expr::Column(Column::from(out.qualified_field(i))))
            .collect();
        for (j, moving) in self.moving.iter().enumerate() {
            for &c in moving {
                let tangent = match (&dual.tangents[c][j], self.is_tensor(c)) {
                    (Some(t), _) => t.clone(),
                    (None, false) => lit(0.0),
                    (None, true) => tensor::call("zeros_like", vec![exprs[c].clone()]),
                };
                exprs.push(tangent.alias(tangent_column(j, c)));
            }
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(dual.plan),
        )?))
    }
}

/// The first row's columns as expressions over the input of the SELECT
/// list that computes them, looking through the projections (and aliases)
/// above it that only rename its columns (`WITH RECURSIVE s(step, w) AS
/// (SELECT 0, …)` renames the list's columns); `None` where the static term
/// is not a SELECT list.
fn first_row(term: &LogicalPlan) -> Result<Option<(Vec<Expr>, &LogicalPlan)>> {
    let LogicalPlan::Projection(p) = term else {
        return Ok(None);
    };
    let mut definitions: Vec<Expr> = p.expr.iter().map(|e| unalias(e).clone()).collect();
    let mut input = p.input.as_ref();
    loop {
        // The SELECT list below the renames, through aliases of it.
        let mut below = input;
        while let LogicalPlan::SubqueryAlias(a) = below {
            below = a.input.as_ref();
        }
        let LogicalPlan::Projection(q) = below else {
            break;
        };
        // Only renames are looked through, and no volatile value is
        // written twice by it.
        let renames = definitions.iter().all(|e| matches!(e, Expr::Column(_)));
        if !renames || q.expr.iter().any(|e| e.is_volatile()) {
            break;
        }
        let mut inner = Vec::with_capacity(definitions.len());
        for e in &definitions {
            let Expr::Column(c) = e else {
                unreachable!("a rename")
            };
            let i = input.schema().index_of_column(c)?;
            inner.push(unalias(&q.expr[i]).clone());
        }
        definitions = inner;
        input = q.input.as_ref();
    }
    Ok(Some((definitions, input)))
}

/// The SELECT list of `r`'s recursive term, and its input reading a work
/// table of `static_term`'s columns (the CTE's, then `names`) with the
/// columns `names` carried up to the SELECT list. Refused unless the term
/// reads the work table once, unprojected and unfiltered.
pub(super) fn term_with_columns<'r>(
    r: &'r RecursiveQuery,
    static_term: &LogicalPlan,
    names: &[String],
) -> Result<(&'r Projection, LogicalPlan)> {
    let refuse = |why: &str| {
        fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "derivatives through the recursive CTE `{}` are not supported: {why}",
                r.name
            ),
        )
    };
    let LogicalPlan::Projection(p) = r.recursive_term.as_ref() else {
        return refuse("its recursive term is not a SELECT list");
    };
    let mut scans = Vec::new();
    p.input.apply(|node| {
        if let LogicalPlan::TableScan(s) = node {
            if s.table_name.table() == r.name {
                scans.push(node);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let [scan] = scans[..] else {
        return refuse("its recursive term reads the work table more than once");
    };
    let LogicalPlan::TableScan(old) = scan else {
        unreachable!("a table scan")
    };
    if old.projection.is_some() || !old.filters.is_empty() {
        return refuse("its work table scan is projected or filtered");
    }
    let schema = Arc::new(static_term.schema().as_arrow().clone());
    let source = provider_as_source(Arc::new(CteWorkTable::new(&r.name, schema)));
    let new_scan =
        LogicalPlan::TableScan(TableScanBuilder::new(old.table_name.clone(), source).build()?);
    let input = carry(&p.input, scan, &new_scan, names.to_vec())?.expect("the work table is read");
    Ok((p, input))
}

/// `plan` analyzed by the markers' analyzer rule (the tangents' markers).
fn analyzed(plan: LogicalPlan) -> Result<LogicalPlan> {
    GradAnalyzer.analyze(plan, &Default::default())
}

/// The column of `plan`'s output named `name` (a tangent: unique).
pub(super) fn column_named(plan: &LogicalPlan, name: &str) -> Result<Column> {
    let schema = plan.schema();
    match schema.fields().iter().position(|f| f.name() == name) {
        Some(i) => Ok(Column::from(schema.qualified_field(i))),
        None => fail(
            ErrorKind::NeedsPlanContext,
            format!("the tangent `{name}` does not reach the derivative"),
        ),
    }
}

/// `plan` with the node `target` replaced by `replacement` (the same
/// columns, then the tangent columns `names`), the tangents passed up to
/// `plan`'s output; `None` if `target` is not below `plan`.
pub(super) fn carry(
    plan: &LogicalPlan,
    target: &LogicalPlan,
    replacement: &LogicalPlan,
    names: Vec<String>,
) -> Result<Option<LogicalPlan>> {
    if std::ptr::eq(plan, target) {
        return Ok(Some(replacement.clone()));
    }
    let below = |input: &Arc<LogicalPlan>| carry(input, target, replacement, names.clone());
    Ok(Some(match plan {
        LogicalPlan::SubqueryAlias(s) => match below(&s.input)? {
            Some(input) => LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(input),
                s.alias.clone(),
            )?),
            None => return Ok(None),
        },
        LogicalPlan::Filter(f) => match below(&f.input)? {
            Some(input) => {
                LogicalPlan::Filter(Filter::try_new(f.predicate.clone(), Arc::new(input))?)
            }
            None => return Ok(None),
        },
        LogicalPlan::Sort(s) => match below(&s.input)? {
            Some(input) => LogicalPlan::Sort(Sort {
                expr: s.expr.clone(),
                input: Arc::new(input),
                fetch: s.fetch,
            }),
            None => return Ok(None),
        },
        LogicalPlan::Limit(l) => match below(&l.input)? {
            Some(input) => LogicalPlan::Limit(Limit {
                skip: l.skip.clone(),
                fetch: l.fetch.clone(),
                input: Arc::new(input),
            }),
            None => return Ok(None),
        },
        LogicalPlan::Projection(p) => match below(&p.input)? {
            Some(input) => {
                let mut exprs = p.expr.clone();
                for name in &names {
                    exprs.push(Expr::Column(column_named(&input, name)?));
                }
                // The CTE's float (and float tensor) values too, under names
                // of their own: a derived column of them above is then
                // differentiated through them.
                if let LogicalPlan::RecursiveQuery(cte) = replacement {
                    let originals = replacement.schema().fields().len() - names.len();
                    for i in 0..input.schema().fields().len() {
                        let (origin, c) = origin_of(&input, i)?;
                        let t = replacement.schema().field(c).data_type();
                        let float_tensor = matches!(t, DataType::FixedSizeList(f, _)
                            if f.data_type().is_floating());
                        if c < originals
                            && (t.is_floating() || float_tensor)
                            && origin == replacement
                        {
                            let column = Column::from(input.schema().qualified_field(i));
                            let name = carried_value(&cte.name, c);
                            // Carried already (the same CTE's column is
                            // the same value): once.
                            if !exprs.iter().any(|e| e.schema_name().to_string() == name) {
                                exprs.push(Expr::Column(column).alias(name));
                            }
                        }
                    }
                }
                LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?)
            }
            None => return Ok(None),
        },
        LogicalPlan::Join(j) => {
            let (left, right) = match (below(&j.left)?, below(&j.right)?) {
                (Some(l), None) => (Arc::new(l), Arc::clone(&j.right)),
                (None, Some(r)) => (Arc::clone(&j.left), Arc::new(r)),
                (None, None) => return Ok(None),
                (Some(_), Some(_)) => return through(plan, "a join of the CTE with itself"),
            };
            let kept = match j.join_type {
                JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {
                    !Arc::ptr_eq(&left, &j.left)
                }
                JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                    !Arc::ptr_eq(&right, &j.right)
                }
                _ => true,
            };
            if !kept {
                return through(plan, "a semi or anti join that does not keep its rows");
            }
            LogicalPlan::Join(Join::try_new(
                left,
                right,
                j.on.clone(),
                j.filter.clone(),
                j.join_type,
                j.join_constraint,
                j.null_equality,
                j.null_aware,
            )?)
        }
        LogicalPlan::Aggregate(a) => match below(&a.input)? {
            Some(input) => group_by_tangents(a, input, replacement, &names)?,
            None => return Ok(None),
        },
        other => {
            let mut inside = false;
            for input in other.inputs() {
                inside |= input.exists(|n| Ok(std::ptr::eq(n, target)))?;
            }
            match inside {
                true => return through(plan, "this operator"),
                false => return Ok(None),
            }
        }
    }))
}

/// The aggregate `a` over `input` with the tangents as group keys too:
/// only where its group keys hold every column of the CTE's row (then a
/// group is one row of it, and its tangents are the group's).
fn group_by_tangents(
    a: &Aggregate,
    input: LogicalPlan,
    replacement: &LogicalPlan,
    names: &[String],
) -> Result<LogicalPlan> {
    let originals = replacement.schema().fields().len() - names.len();
    let mut keyed = vec![false; originals];
    for g in &a.group_expr {
        if let Expr::Column(c) = unalias(g) {
            let (origin, at) = origin_of(&input, input.schema().index_of_column(c)?)?;
            let same = match (origin, replacement) {
                (LogicalPlan::TableScan(s), LogicalPlan::TableScan(t)) => {
                    s.table_name == t.table_name
                }
                _ => std::ptr::eq(origin, replacement) || origin == replacement,
            };
            if same && at < originals {
                keyed[at] = true;
            }
        }
    }
    if keyed.contains(&false) {
        return through(
            &LogicalPlan::Aggregate(a.clone()),
            "an aggregate whose GROUP BY keys are not all the CTE's columns (put the marker \
             inside the aggregate, e.g. avg(grad(loss, lr)), or group by every column)",
        );
    }
    let mut group = a.group_expr.clone();
    for name in names {
        group.push(Expr::Column(column_named(&input, name)?));
    }
    Ok(LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::new(input),
        group,
        a.aggr_expr.clone(),
    )?))
}

fn through<T>(plan: &LogicalPlan, what: &str) -> Result<T> {
    let name = plan.display().to_string();
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "derivatives through a recursive CTE reach the derivative through {what} \
             (`{}`), which does not carry the tangents yet",
            name.trim()
        ),
    )
}
