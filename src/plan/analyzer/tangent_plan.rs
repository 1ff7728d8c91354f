//! Forward mode through a recursive term that reads its work table more
//! than once: every node of the term carries the tangents of its float
//! columns beside them.
//!
//! [`super::recursion`] carries tangent columns from a term's one scan of
//! the work table up to its SELECT list, where the analyzer differentiates
//! each update with the plan in view. A term that reads the work table
//! again — a training step whose loss subquery reads the parameter rows,
//! the rows it updates being read too — needs more: the tangent of the
//! loss's gradient, the Hessian of the loss applied to the rows' tangents.
//! So each node of such a term is rewritten here with tangent columns (its
//! value columns unchanged; `tangents[i][j]` is column `i`'s tangent in the
//! `j`-th direction):
//!
//! - a scan of the work table reads the CTE's tangent columns (the
//!   variable's own tangent is its direction); other scans have none;
//! - a projection adds `jvp(e, c₁, ċ₁, …)` of each expression over its
//!   input's columns and their tangents. A scalar subquery that reads the
//!   work table is computed by a projection below, with its tangent (its
//!   plan rewritten the same way), and so is `grad((SELECT loss …), w)` —
//!   relational reverse mode, the loss's gradient with respect to the
//!   row's `w` — whose tangent is `grad((SELECT losṡ …), w)`: the same
//!   gradient of the loss's tangent `L̇ = Σₕ Σ_c ∂L/∂cₕ·ċₕ` over the rows `h`
//!   it reads, the tangents taken as data (`∂L̇/∂w = Σₕ Σ_c ∂²L/∂w∂cₕ·ċₕ`,
//!   the Hessian-vector product);
//! - filters, sorts, limits and aliases pass the tangents on, joins those of
//!   both sides; an aggregate adds its outputs' tangents as the aggregate
//!   rules write them ([`crate::rules::aggregate`]: `sum(ẋ)` for `sum`,
//!   the tangent at the rows that attain a `max`, …; a group's extreme is
//!   an aggregate joined back on the group, not a window, so that
//!   relational reverse mode follows it in a loss's tangent), and groups
//!   by a key's tangent too (a group is then rows of one tangent);
//! - anything else — a window, a union, an aggregate without a rule or
//!   `DISTINCT`, a derivative whose `f` reads a column computed from the
//!   work table below it, a correlated subquery over the work table — is
//!   refused, typed.
//!
//! ```sql
//! -- the hypergradient of the learning rate of the README's relational loop
//! WITH RECURSIVE train(step, g, w, lr) AS (
//!   SELECT 0, g, 0.0, 0.05 FROM (VALUES (1), (2)) t(g)
//!   UNION ALL
//!   SELECT step + 1, g, w - lr * grad((SELECT sum(power(d.x * p.w - d.y, 2))
//!                                     FROM d JOIN train p ON p.g = d.g), w), lr
//!   FROM train WHERE step < 50)
//! SELECT g, grad(w, lr) FROM train WHERE step = 50;
//! ```

use std::cell::Cell;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::error::Result;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Aggregate, Expr, ExprSchemable, Filter, Join, JoinType, Limit, LogicalPlan, Projection,
    ScalarUDF, Sort, Subquery, SubqueryAlias, TableScan, TableScanBuilder, TableSource,
    WindowFunctionDefinition,
};

use crate::engine::call::{as_marker, Marker, MarkerKind, SharedRules};
use crate::error::{fail, ErrorKind};
use crate::plan::expand::expand_markers;
use crate::plan::lineage::origin_of;
use crate::plan::{columns, join_nulls_equal, unalias};
use crate::reserved::{aggregate_part, group_key, lifted_tangent, lifted_value, node_tangent};
use crate::rules::aggregate::{aggregate_rule, AggregateCall};
use crate::tensor::Shape;

/// A plan and the tangents of its output columns: `tangents[i][j]`, the
/// tangent of column `i` in the `j`-th direction (a column of `plan`, or a
/// constant); `None` where it is 0.
pub(super) struct Dual {
    pub(super) plan: LogicalPlan,
    pub(super) tangents: Vec<Vec<Option<Expr>>>,
}

/// A value computed below a projection (its number, the value, its
/// tangents).
type Lifted = (usize, Expr, Vec<Option<Expr>>);

/// The tangent of the work table's column `c` in direction `j` over a scan
/// of it (with its tangent columns).
pub(super) type ScanTangent<'a> = dyn Fn(usize, usize, &LogicalPlan) -> Result<Option<Expr>> + 'a;

/// Rewrites the nodes of a recursive term with their tangents; see the
/// [module docs](self).
pub(super) struct Rewriter<'a> {
    /// The CTE's name (its work table's).
    cte: &'a str,
    /// The work table with the tangent columns.
    source: Arc<dyn TableSource>,
    /// How many of the work table's columns are the CTE's own (the tangent
    /// columns follow).
    columns: usize,
    directions: usize,
    tangent: &'a ScanTangent<'a>,
    rules: SharedRules,
    /// Lifted subqueries so far (their columns are numbered in the term).
    lifted: Cell<usize>,
    /// What a refusal says first, where not forward mode through `cte`.
    context: Option<String>,
}

impl<'a> Rewriter<'a> {
    pub(super) fn new(
        cte: &'a str,
        source: Arc<dyn TableSource>,
        columns: usize,
        directions: usize,
        tangent: &'a ScanTangent<'a>,
        rules: SharedRules,
    ) -> Self {
        Self {
            cte,
            source,
            columns,
            directions,
            tangent,
            rules,
            lifted: Cell::new(0),
            context: None,
        }
    }

    /// The rewriter whose refusals start with `context` (a caller other
    /// than forward mode through the loop).
    pub(super) fn refusing_as(mut self, context: String) -> Self {
        self.context = Some(context);
        self
    }

    fn refuse<T>(&self, why: impl std::fmt::Display) -> Result<T> {
        if let Some(context) = &self.context {
            return fail(ErrorKind::NeedsPlanContext, format!("{context}: {why}"));
        }
        fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "derivatives through the recursive CTE `{}`, whose recursive term reads its work \
                 table more than once, in forward mode: {why}",
                self.cte
            ),
        )
    }

    fn is_work_table(&self, s: &TableScan) -> bool {
        s.table_name.table() == self.cte
    }

    /// A scan of the work table with its tangent columns, as `s` names it.
    fn scan(&self, s: &TableScan) -> Result<LogicalPlan> {
        if s.projection.is_some() || !s.filters.is_empty() {
            return self.refuse("a scan of its work table is projected or filtered");
        }
        Ok(LogicalPlan::TableScan(
            TableScanBuilder::new(s.table_name.clone(), Arc::clone(&self.source)).build()?,
        ))
    }

    /// Whether `plan` (its subqueries too) reads the work table.
    fn reads_work_table(&self, plan: &LogicalPlan) -> Result<bool> {
        let mut reads = false;
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(s) = node {
                reads |= self.is_work_table(s);
            }
            Ok(match reads {
                true => TreeNodeRecursion::Stop,
                false => TreeNodeRecursion::Continue,
            })
        })?;
        Ok(reads)
    }

    /// `plan` with its scans of the work table (in subqueries too) reading
    /// the tangent columns as well: the same values.
    fn swapped(&self, plan: &LogicalPlan) -> Result<LogicalPlan> {
        Ok(plan
            .clone()
            .transform_up_with_subqueries(|node| match &node {
                LogicalPlan::TableScan(s) if self.is_work_table(s) => {
                    Ok(Transformed::yes(self.scan(s)?))
                }
                _ => Ok(Transformed::yes(node.recompute_schema()?)),
            })?
            .data)
    }

    /// `e` with the plans of its subqueries swapped (see [`Self::swapped`]).
    fn swapped_expr(&self, e: &Expr) -> Result<Expr> {
        Ok(e.clone()
            .transform_up(|e| {
                Ok(match e {
                    Expr::ScalarSubquery(s) => {
                        Transformed::yes(Expr::ScalarSubquery(self.swapped_subquery(&s)?))
                    }
                    Expr::Exists(mut x) => {
                        x.subquery = self.swapped_subquery(&x.subquery)?;
                        Transformed::yes(Expr::Exists(x))
                    }
                    Expr::InSubquery(mut x) => {
                        x.subquery = self.swapped_subquery(&x.subquery)?;
                        Transformed::yes(Expr::InSubquery(x))
                    }
                    e => Transformed::no(e),
                })
            })?
            .data)
    }

    fn swapped_subquery(&self, s: &Subquery) -> Result<Subquery> {
        Ok(Subquery {
            subquery: Arc::new(self.swapped(&s.subquery)?),
            outer_ref_columns: s.outer_ref_columns.clone(),
            spans: s.spans.clone(),
        })
    }

    /// `plan` with the tangents of its columns.
    pub(super) fn dual(&self, plan: &LogicalPlan) -> Result<Dual> {
        let none = |p: &LogicalPlan| vec![vec![None; self.directions]; p.schema().fields().len()];
        Ok(match plan {
            LogicalPlan::TableScan(s) if self.is_work_table(s) => {
                let scan = self.scan(s)?;
                let mut tangents = none(&scan);
                for (c, row) in tangents.iter_mut().enumerate().take(self.columns) {
                    for (j, t) in row.iter_mut().enumerate() {
                        *t = (self.tangent)(j, c, &scan)?;
                    }
                }
                Dual {
                    plan: scan,
                    tangents,
                }
            }
            LogicalPlan::TableScan(_) | LogicalPlan::Values(_) | LogicalPlan::EmptyRelation(_) => {
                Dual {
                    plan: plan.clone(),
                    tangents: none(plan),
                }
            }
            LogicalPlan::SubqueryAlias(a) => {
                let input = self.dual(&a.input)?;
                let plan = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(input.plan.clone()),
                    a.alias.clone(),
                )?);
                // The same columns, qualified by the alias.
                let tangents = input
                    .tangents
                    .iter()
                    .map(|row| {
                        row.iter()
                            .map(|t| match t {
                                Some(Expr::Column(c)) => {
                                    let i = input.plan.schema().index_of_column(c)?;
                                    Ok(Some(Expr::Column(Column::from(
                                        plan.schema().qualified_field(i),
                                    ))))
                                }
                                t => Ok(t.clone()),
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                    .collect::<Result<Vec<_>>>()?;
                Dual { plan, tangents }
            }
            LogicalPlan::Filter(f) => {
                let input = self.dual(&f.input)?;
                let plan = LogicalPlan::Filter(Filter::try_new(
                    self.swapped_expr(&f.predicate)?,
                    Arc::new(input.plan),
                )?);
                Dual {
                    plan,
                    tangents: input.tangents,
                }
            }
            LogicalPlan::Sort(s) => {
                let input = self.dual(&s.input)?;
                let mut expr = s.expr.clone();
                for e in &mut expr {
                    e.expr = self.swapped_expr(&e.expr)?;
                }
                let plan = LogicalPlan::Sort(Sort {
                    expr,
                    input: Arc::new(input.plan),
                    fetch: s.fetch,
                });
                Dual {
                    plan,
                    tangents: input.tangents,
                }
            }
            LogicalPlan::Limit(l) => {
                let input = self.dual(&l.input)?;
                let plan = LogicalPlan::Limit(Limit {
                    skip: l.skip.clone(),
                    fetch: l.fetch.clone(),
                    input: Arc::new(input.plan),
                });
                Dual {
                    plan,
                    tangents: input.tangents,
                }
            }
            LogicalPlan::Join(j) => {
                let left = self.dual(&j.left)?;
                let right = self.dual(&j.right)?;
                let tangents = match j.join_type {
                    JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                        left.tangents.into_iter().chain(right.tangents).collect()
                    }
                    JoinType::LeftSemi | JoinType::LeftAnti => left.tangents,
                    JoinType::RightSemi | JoinType::RightAnti => right.tangents,
                    JoinType::LeftMark | JoinType::RightMark => {
                        return self.refuse(format!("a {} join", j.join_type))
                    }
                };
                let filter = match &j.filter {
                    Some(f) => Some(self.swapped_expr(f)?),
                    None => None,
                };
                let plan = LogicalPlan::Join(Join::try_new(
                    Arc::new(left.plan),
                    Arc::new(right.plan),
                    j.on.clone(),
                    filter,
                    j.join_type,
                    j.join_constraint,
                    j.null_equality,
                    j.null_aware,
                )?);
                Dual { plan, tangents }
            }
            LogicalPlan::Subquery(s) => {
                let input = self.dual(&s.subquery)?;
                let plan = LogicalPlan::Subquery(Subquery {
                    subquery: Arc::new(input.plan),
                    outer_ref_columns: s.outer_ref_columns.clone(),
                    spans: s.spans.clone(),
                });
                Dual {
                    plan,
                    tangents: input.tangents,
                }
            }
            LogicalPlan::Projection(p) => self.projection(p)?,
            LogicalPlan::Aggregate(a) => self.aggregate(a)?,
            other => {
                if !self.reads_work_table(other)? {
                    // Constant: the same rows whatever the variables.
                    return Ok(Dual {
                        plan: other.clone(),
                        tangents: none(other),
                    });
                }
                let shown = other.display().to_string();
                return self.refuse(format!(
                    "its recursive term reads it through `{}`; forward mode follows \
                     projections, filters, joins, aggregates (sum, avg, tensor_sum, tensor_avg, \
                     count), sorts and limits there",
                    shown.trim()
                ));
            }
        })
    }

    /// The tangent of `e` over `input` in direction `j`: `jvp(e, c₁, ċ₁, …)`
    /// over the columns `e` reads that have one, written out; `None` where
    /// none has one or `e` is not a float (tensor) value.
    fn tangent_of(&self, e: &Expr, input: &Dual, j: usize) -> Result<Option<Expr>> {
        let schema = input.plan.schema();
        let t = e.get_type(schema.as_ref())?;
        if !(t.is_floating() || Shape::is_tensor_type(&t)) {
            return Ok(None);
        }
        let mut args = vec![e.clone()];
        let mut read: Vec<&Column> = e.column_refs().into_iter().collect();
        read.sort();
        for c in read {
            let i = schema.index_of_column(c)?;
            if let Some(t) = &input.tangents[i][j] {
                args.push(Expr::Column(c.clone()));
                args.push(t.clone());
            }
        }
        if args.len() == 1 {
            return Ok(None);
        }
        let jvp = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Jvp, Arc::clone(&self.rules)))
            .call(args);
        Ok(Some(expand_markers(jvp, schema)?.data))
    }

    /// Whether column `c` of `input` has a tangent in some direction.
    fn moves(&self, c: &Column, input: &Dual) -> Result<bool> {
        let i = input.plan.schema().index_of_column(c)?;
        Ok(input.tangents[i].iter().any(Option::is_some))
    }

    /// Refuses a derivative (the marker `e` of `f`, over `input`) that the
    /// analyzer would take with more plan context than the written-out
    /// tangent sees: of a subquery over the work table, or reading a column
    /// with a tangent computed below (the analyzer differentiates through
    /// its definition; the tangent would take it as independent).
    fn check_derivative(&self, e: &Expr, f: &Expr, input: &Dual) -> Result<()> {
        let mut subquery = false;
        f.apply(|x| {
            if let Some(s) = subquery_of(x) {
                subquery |= self.reads_work_table(&s.subquery)?;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if subquery {
            return self.refuse(format!(
                "`{e}` differentiates an expression over a subquery that reads the work \
                 table; forward mode follows `grad((SELECT loss …), column)` there"
            ));
        }
        for c in f.column_refs() {
            let i = input.plan.schema().index_of_column(c)?;
            let base = matches!(
                origin_of(&input.plan, i)?.0,
                LogicalPlan::TableScan(_) | LogicalPlan::Values(_)
            );
            if !base && self.moves(c, input)? {
                return self.refuse(format!(
                    "`{e}` reads `{c}`, computed from the work table below it; write the \
                     derivative over the work table's columns"
                ));
            }
        }
        Ok(())
    }

    /// [`Self::check_derivative`] for every derivative in `e` (an
    /// aggregate's argument).
    fn check_derivatives(&self, e: &Expr, input: &Dual) -> Result<()> {
        e.apply(|x| {
            if let Some(call) = as_marker(x) {
                self.check_derivative(x, &call.args[0], input)?;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(())
    }

    /// `e` (over `input`) with the subqueries that read the work table, and
    /// the relational gradients of such subqueries, replaced by columns of
    /// a projection below (`lifted`: each value, and its tangents); its other
    /// derivatives checked to read columns with tangents straight from a
    /// scan (the derivative written out here is then the analyzer's).
    fn lift(&self, e: &Expr, input: &Dual, lifted: &mut Vec<Lifted>) -> Result<Expr> {
        let e = e.clone().transform_down(|e| {
            if let Some(call) = as_marker(&e) {
                let f = unalias(&call.args[0]);
                if let Expr::ScalarSubquery(s) = f {
                    if self.reads_work_table(&s.subquery)? {
                        let (value, tangents) = self.relational(&e, s, input)?;
                        return Ok(Transformed::new(
                            self.lifted(value, tangents, lifted),
                            true,
                            TreeNodeRecursion::Jump,
                        ));
                    }
                }
                self.check_derivative(&e, &call.args[0], input)?;
                return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
            }
            match e {
                Expr::ScalarSubquery(s) if self.reads_work_table(&s.subquery)? => {
                    if !s.outer_ref_columns.is_empty() {
                        return self.refuse(format!(
                            "a correlated subquery reads it (`{}`)",
                            s.subquery.display().to_string().trim()
                        ));
                    }
                    let dual = self.dual(&s.subquery)?;
                    let value = Expr::ScalarSubquery(self.swapped_subquery(&s)?);
                    let tangents = (0..self.directions)
                        .map(|j| self.scalar(&dual, j, &s))
                        .collect::<Result<Vec<_>>>()?;
                    Ok(Transformed::new(
                        self.lifted(value, tangents, lifted),
                        true,
                        TreeNodeRecursion::Jump,
                    ))
                }
                e @ (Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)) => Ok(
                    Transformed::new(self.swapped_expr(&e)?, true, TreeNodeRecursion::Jump),
                ),
                e => Ok(Transformed::no(e)),
            }
        })?;
        Ok(e.data)
    }

    /// The column a lifted value is read by, noting it in `lifted`.
    fn lifted(&self, value: Expr, tangents: Vec<Option<Expr>>, lifted: &mut Vec<Lifted>) -> Expr {
        let k = self.lifted.get();
        self.lifted.set(k + 1);
        lifted.push((k, value, tangents));
        Expr::Column(Column::new_unqualified(lifted_value(k)))
    }

    /// The tangent of the scalar subquery `s` (`dual` its plan with
    /// tangents) in direction `j`: a scalar subquery of it.
    fn scalar(&self, dual: &Dual, j: usize, s: &Subquery) -> Result<Option<Expr>> {
        let Some(t) = &dual.tangents[0][j] else {
            return Ok(None);
        };
        let name = dual.plan.schema().field(0).name().clone();
        let plan = LogicalPlan::Projection(Projection::try_new(
            vec![t.clone().alias(name)],
            Arc::new(dual.plan.clone()),
        )?);
        Ok(Some(Expr::ScalarSubquery(Subquery {
            subquery: Arc::new(plan),
            outer_ref_columns: vec![],
            spans: s.spans.clone(),
        })))
    }

    /// `grad((SELECT loss …), w)` with `w` a column of the work table (the
    /// marker `e` over `input`): its value (the subquery reading the work
    /// table with its tangents) and its tangents, `grad((SELECT losṡ …), w)`
    /// in each direction.
    fn relational(
        &self,
        e: &Expr,
        s: &Subquery,
        input: &Dual,
    ) -> Result<(Expr, Vec<Option<Expr>>)> {
        let call = as_marker(e).expect("a marker");
        let wrt = call.wrt_columns();
        if call.kind() != MarkerKind::Grad || wrt.len() != 1 || call.args.len() != 2 {
            return self.refuse(format!(
                "`{e}` differentiates a subquery over it; forward mode follows `grad((SELECT \
                 loss …), column)` there, one column"
            ));
        }
        let i = input.plan.schema().index_of_column(&wrt[0])?;
        let from_work_table = matches!(
            origin_of(&input.plan, i)?.0,
            LogicalPlan::TableScan(t) if self.is_work_table(t)
        );
        if !from_work_table {
            return self.refuse(format!(
                "`{e}` takes a gradient with respect to `{}`, which is not a column of the work \
                 table",
                wrt[0]
            ));
        }
        if !s.outer_ref_columns.is_empty() {
            return self.refuse(format!("`{e}` differentiates a correlated subquery"));
        }
        let marker = |f: Expr| -> Expr {
            Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
                Arc::new(ScalarUDF::new_from_impl(Marker::new(
                    MarkerKind::Grad,
                    Arc::clone(call.marker.rules()),
                ))),
                vec![f, call.args[1].clone()],
            ))
        };
        let value = marker(Expr::ScalarSubquery(self.swapped_subquery(s)?));
        let dual = self.dual(&s.subquery)?;
        let tangents = (0..self.directions)
            .map(|j| Ok(self.scalar(&dual, j, s)?.map(&marker)))
            .collect::<Result<Vec<_>>>()?;
        Ok((value, tangents))
    }

    /// A projection with the tangents of its expressions.
    fn projection(&self, p: &Projection) -> Result<Dual> {
        let input = self.dual(&p.input)?;
        let mut lifted = Vec::new();
        // The same names: a projection above reads the columns by name.
        let names = NamePreserver::new_for_projection();
        let exprs = p
            .expr
            .iter()
            .map(|e| Ok(names.save(e).restore(self.lift(e, &input, &mut lifted)?)))
            .collect::<Result<Vec<_>>>()?;
        let input = match lifted.is_empty() {
            true => input,
            false => self.below(input, lifted)?,
        };
        let mut out = exprs.clone();
        let mut tangents = Vec::with_capacity(exprs.len());
        for (i, e) in exprs.iter().enumerate() {
            let mut row = Vec::with_capacity(self.directions);
            for j in 0..self.directions {
                row.push(match self.tangent_of(unalias(e), &input, j)? {
                    Some(t) => {
                        out.push(t.alias(node_tangent(j, i)));
                        Some(Expr::Column(Column::new_unqualified(node_tangent(j, i))))
                    }
                    None => None,
                });
            }
            tangents.push(row);
        }
        tangents.resize(out.len(), vec![None; self.directions]);
        let plan = LogicalPlan::Projection(Projection::try_new(out, Arc::new(input.plan))?);
        Ok(Dual { plan, tangents })
    }

    /// `input` with the lifted values and their tangents as columns.
    fn below(&self, input: Dual, lifted: Vec<Lifted>) -> Result<Dual> {
        let schema = Arc::clone(input.plan.schema());
        let mut exprs: Vec<Expr> = (0..schema.fields().len())
            .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
            .collect();
        let mut tangents = input.tangents;
        let mut tangent_columns = Vec::new();
        for (k, value, value_tangents) in lifted {
            let mut row = Vec::with_capacity(self.directions);
            for (j, t) in value_tangents.into_iter().enumerate() {
                row.push(t.map(|t| {
                    let name = lifted_tangent(j, k);
                    tangent_columns.push(t.alias(&name));
                    Expr::Column(Column::new_unqualified(name))
                }));
            }
            exprs.push(value.alias(lifted_value(k)));
            tangents.push(row);
        }
        tangents.resize(
            exprs.len() + tangent_columns.len(),
            vec![None; self.directions],
        );
        exprs.extend(tangent_columns);
        let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input.plan))?);
        Ok(Dual { plan, tangents })
    }

    /// An aggregate with the tangents of its keys and aggregates.
    fn aggregate(&self, a: &Aggregate) -> Result<Dual> {
        let input = self.dual(&a.input)?;
        let n = a.group_expr.len();
        let mut group = Vec::with_capacity(n);
        let mut keys = Vec::new();
        let mut tangents = Vec::new();
        for g in &a.group_expr {
            if matches!(g, Expr::GroupingSet(_)) {
                return self.refuse(format!("it groups by `{g}`"));
            }
            let row = match unalias(g) {
                Expr::Column(c) => {
                    let i = input.plan.schema().index_of_column(c)?;
                    input.tangents[i].clone()
                }
                other => {
                    if (0..self.directions)
                        .map(|j| self.tangent_of(other, &input, j))
                        .collect::<Result<Vec<_>>>()?
                        .iter()
                        .any(Option::is_some)
                    {
                        return self.refuse(format!(
                            "it groups by `{g}`, which has a derivative; group by a column"
                        ));
                    }
                    vec![None; self.directions]
                }
            };
            // A group is then the rows of one value and one tangent.
            for t in row.iter().flatten() {
                if matches!(t, Expr::Column(_)) && !keys.contains(t) {
                    keys.push(t.clone());
                }
            }
            group.push(self.swapped_expr(g)?);
            tangents.push(row);
        }
        tangents.resize(n + keys.len(), vec![None; self.directions]);
        group.extend(keys);
        let mut aggregates = Vec::with_capacity(a.aggr_expr.len());
        let mut parts = AggregateParts::default();
        for (i, e) in a.aggr_expr.iter().enumerate() {
            let Expr::AggregateFunction(f) = unalias(e) else {
                return self.refuse(format!("it aggregates with `{e}`"));
            };
            for arg in &f.params.args {
                self.check_derivatives(arg, &input)?;
            }
            let output = a.schema.field(n + i).data_type();
            let mut row = vec![None; self.directions];
            if output.is_floating() || Shape::is_tensor_type(output) {
                let Expr::AggregateFunction(call) = unalias(&self.swapped_expr(e)?).clone() else {
                    unreachable!("an aggregate function, as above")
                };
                for (j, slot) in row.iter_mut().enumerate() {
                    let mut derivatives = Vec::with_capacity(call.params.args.len());
                    let mut moving = false;
                    for arg in &call.params.args {
                        let t = self.tangent_of(arg, &input, j)?;
                        moving |= t.is_some();
                        derivatives.push(t.unwrap_or_else(|| lit(0.0)));
                    }
                    if !moving {
                        continue;
                    }
                    let rule = aggregate_rule(call.func.as_ref()).map(|(_, rule)| rule);
                    let (Some(rule), false) = (rule, call.params.distinct) else {
                        return self.refuse(format!(
                            "it aggregates with `{e}`, which has no derivative rule here (DISTINCT, \
                             or an aggregate without one)"
                        ));
                    };
                    let tangent = rule(&AggregateCall::new(&call, &group, derivatives))?;
                    *slot = Some(parts.add(tangent, node_tangent(j, n + i))?);
                }
            }
            aggregates.push(self.swapped_expr(e)?);
            tangents.push(row);
        }
        parts.over(input.plan, group, aggregates, tangents)
    }
}

/// The tangents of an aggregate's outputs, as the aggregate rules write
/// them: aggregates of the rows (with a value of each row's group where a
/// rule needs the group's extreme next to each row) combined by a
/// projection above, where a tangent is not one aggregate.
#[derive(Default)]
struct AggregateParts {
    /// Window functions over the groups, computed below the aggregate.
    windows: Vec<Expr>,
    /// Aggregates added to it.
    aggregates: Vec<Expr>,
    /// Tangents computed above it from its columns.
    combined: Vec<Expr>,
}

impl AggregateParts {
    /// The column of the tangent `t` (an expression of aggregates), named
    /// `name`.
    fn add(&mut self, t: Expr, name: String) -> Result<Expr> {
        let t = self.parted(t, true)?;
        if let Expr::AggregateFunction(_) = t {
            self.aggregates.push(t.alias(&name));
            return Ok(Expr::Column(Column::new_unqualified(name)));
        }
        let t = self.parted(t, false)?;
        self.combined.push(t.alias(&name));
        Ok(Expr::Column(Column::new_unqualified(name)))
    }

    /// `t` with each of its window functions (`windows`) or else its
    /// aggregates made a part, read as its column.
    fn parted(&mut self, t: Expr, windows: bool) -> Result<Expr> {
        Ok(t.transform_up(|e| {
            let picked = match &e {
                Expr::WindowFunction(_) => windows,
                Expr::AggregateFunction(_) => !windows,
                _ => false,
            };
            if !picked {
                return Ok(Transformed::no(e));
            }
            let column = aggregate_part(self.windows.len() + self.aggregates.len());
            match windows {
                true => self.windows.push(e.alias(&column)),
                false => self.aggregates.push(e.alias(&column)),
            }
            Ok(Transformed::yes(Expr::Column(Column::new_unqualified(
                column,
            ))))
        })?
        .data)
    }

    /// The aggregate over `input` grouped by `group` with `aggregates` (the
    /// node's own) and the parts, and the tangents of its outputs
    /// (`tangents`, of the group keys and `aggregates`).
    fn over(
        self,
        input: LogicalPlan,
        group: Vec<Expr>,
        mut aggregates: Vec<Expr>,
        mut tangents: Vec<Vec<Option<Expr>>>,
    ) -> Result<Dual> {
        let directions = tangents.first().map_or(0, Vec::len);
        let input = match self.windows.is_empty() {
            true => input,
            false => with_group_values(input, &group, self.windows)?,
        };
        aggregates.extend(self.aggregates);
        let mut plan =
            LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(input), group, aggregates)?);
        tangents.resize(plan.schema().fields().len(), vec![None; directions]);
        if !self.combined.is_empty() {
            let mut exprs = columns(&plan);
            exprs.extend(self.combined);
            plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(plan))?);
            tangents.resize(plan.schema().fields().len(), vec![None; directions]);
        }
        Ok(Dual { plan, tangents })
    }
}

/// `input` with the value of each window function of `windows` (an
/// aggregate over the rows of its group, `max(x) OVER (PARTITION BY
/// group)`, named by its alias) next to each row: computed by an aggregate
/// grouped by `group` and joined back on the group (NULL keys equal), which
/// relational reverse mode follows where the term is a loss's tangent (it
/// does not follow windows).
fn with_group_values(
    input: LogicalPlan,
    group: &[Expr],
    windows: Vec<Expr>,
) -> Result<LogicalPlan> {
    let mut aggregates = Vec::with_capacity(windows.len());
    for w in windows {
        let Expr::Alias(alias) = w else {
            unreachable!("an aliased window function")
        };
        let Expr::WindowFunction(f) = *alias.expr else {
            unreachable!("a window function")
        };
        let WindowFunctionDefinition::AggregateUDF(udaf) = f.fun else {
            unreachable!("an aggregate over the group, as the aggregate rules write it")
        };
        aggregates.push(
            Expr::AggregateFunction(AggregateFunction::new_udf(
                udaf,
                f.params.args,
                false,
                None,
                vec![],
                None,
            ))
            .alias(alias.name),
        );
    }
    let per_group = LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::new(input.clone()),
        group.to_vec(),
        aggregates,
    )?);
    let keys: Vec<String> = (0..group.len()).map(group_key).collect();
    let exprs = per_group
        .schema()
        .columns()
        .into_iter()
        .enumerate()
        .map(|(i, c)| match keys.get(i) {
            Some(key) => Expr::Column(c).alias(key),
            None => Expr::Column(c),
        })
        .collect();
    let per_group = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(per_group))?);
    let on = group
        .iter()
        .zip(&keys)
        .map(|(g, k)| (g.clone(), Expr::Column(Column::new_unqualified(k))))
        .collect();
    join_nulls_equal(input, per_group, on, JoinType::Inner)
}

/// The subquery of a subquery expression.
fn subquery_of(e: &Expr) -> Option<&Subquery> {
    match e {
        Expr::ScalarSubquery(s) => Some(s),
        Expr::Exists(x) => Some(&x.subquery),
        Expr::InSubquery(x) => Some(&x.subquery),
        _ => None,
    }
}
