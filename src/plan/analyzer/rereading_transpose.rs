//! Relational reverse mode through a loop whose step reads its work table
//! again: the value of each row of a data table to a model trained by the
//! README's relational loop, whose parameter rows are the CTE's rows and
//! whose step takes a loss's gradient over them all.
//!
//! The step is a SELECT list over the work table (filtered), row by row:
//! `s' = U(s, G)` where each `G = grad((SELECT L …), c)` is a relational
//! gradient of a loss `L` that reads the work table's rows `S` and the data
//! `D` (see [`super::tangent_plan`] for the same loop in forward mode).
//! With `Ā` the adjoints of the rows after a step and `ḡ = Σ_c Ā_c·∂U_c/∂G`
//! the cotangent of each row's `G`, the step's transpose is
//!
//! - `∂/∂s (Σ_c Ā_c·U_c)` with `G` held (the row's own path), plus
//! - `∂L̇/∂s`, where `L̇ = Σ_rows ḡ·∂L/∂c` is the loss's tangent along `ḡ`
//!   ([`super::tangent_plan::Rewriter`], `ḡ` read as data): the
//!   Hessian-vector product, a relational gradient again;
//!
//! and the step's derivative with respect to the data is `∂L̇/∂D`. So the
//! rewrite runs the loop once with its history (each row's iteration, its
//! trajectory and the `G` that made it), takes the adjoints of its rows as
//! the loss reads them, and runs the loop backwards as a recursive query
//! of its own (`__dfgrad_backward_rows`: per iteration, from the last, each
//! row's state, the adjoint of the row it made, and `ḡ`); a trajectory that
//! ends early joins where it ends. The data's gradient is then the loss's
//! own reads of the table plus `Σ_k ∂L̇_k/∂D`, one relational gradient of
//! `L̇`'s plan over the backward rows of every iteration at once (scans of
//! the work table read all of them, joins of two of them match iterations,
//! aggregates group by it).
//!
//! ```sql
//! -- d(i, g, x, y): the value of each row's y to the loop's final loss
//! WITH RECURSIVE train(step, g, w, lr) AS (
//!   SELECT 0, g, 0.0, 0.04 FROM (VALUES (1), (2)) t(g)
//!   UNION ALL
//!   SELECT step + 1, g, w - lr * grad((SELECT sum(power(d.x * p.w - d.y, 2))
//!                                     FROM d JOIN train p ON p.g = d.g), w), lr
//!   FROM train WHERE step < 5),
//! loss AS (SELECT sum(power(w - 2, 2)) AS loss FROM train WHERE step = 5)
//! SELECT d.i, grad((SELECT loss FROM loss), d.y) FROM d;
//! ```
//!
//! Refused, typed: a step that reads its work table otherwise than as its
//! FROM (filtered) and in the losses of `grad((SELECT loss …), column)` —
//! a join of it, an aggregate, a subquery over it outside such a gradient;
//! a gradient with respect to several columns or a correlated loss; a loss
//! whose plan reads the work table through a window, a union, a limit, or
//! an outer join on its nullable side.

use std::sync::Arc;

use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue, TableReference};
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::coalesce;
use datafusion::functions_aggregate::expr_fn::{max, min};
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    lit, Aggregate, Expr, ExprSchemable, Filter, Join, JoinType, LogicalPlan, LogicalPlanBuilder,
    Projection, RecursiveQuery, ScalarUDF, Subquery, SubqueryAlias, TableScanBuilder, TableSource,
};
use datafusion::optimizer::AnalyzerRule;

use super::backward_recursion::zero;
use super::loop_tables::{over_history, row_adjoints};
use super::recursion::{column_named, work_table_reads};
use super::reverse_recursion::{add, differentiable_columns, is_differentiable};
use super::tangent_plan::Rewriter;
use super::GradAnalyzer;
use crate::engine::call::{as_marker, Marker, MarkerKind, SharedRules};
use crate::error::{fail, ErrorKind};
use crate::plan::expand::expand_markers;
use crate::plan::reverse::{loss_contributions, weighted_contributions, Contributions, Parameter};
use crate::plan::shared::share;
use crate::plan::{columns, unalias};
use crate::reserved::{
    adjoint_column, cotangent_column, lifted_value, ADJOINTS, BACKWARD_ROWS, FORWARD,
    ITERATION_COLUMN, LEVEL, NEXT, SEED, TRAJECTORY_COLUMN,
};
use crate::tensor::{self, Shape};

/// The contributions (as [`loss_contributions`]'s) to the gradient of
/// `loss` with respect to `parameter`, where the loss reads the parameter
/// rows through the recursive CTE `cte` (`r`), whose step reads its work
/// table again: see the [module docs](self).
pub(super) fn contributions(
    loss: &LogicalPlan,
    cte: &LogicalPlan,
    r: &RecursiveQuery,
    parameter: Parameter,
    rules: &SharedRules,
) -> Result<Contributions> {
    let step = Step::of(r, parameter.names.0)?;
    let state = DFSchema::try_from(r.static_term.schema().as_arrow().clone())?;
    let differentiable = differentiable_columns(&state);
    let fwd = share(analyzed(step.with_history()?)?);
    let loss = over_history(loss, cte, &fwd)?;
    let table_rules = rules.read().expect("rule table lock").clone();
    let mut contributions =
        loss_contributions(&loss, parameter, std::slice::from_ref(&fwd), &table_rules)?;
    let Some(seeds) = row_adjoints(&loss, &fwd, &state, &differentiable, &table_rules)? else {
        return Ok(contributions);
    };
    let history = share(step.history(&fwd, seeds, &differentiable)?);
    let back = step.backward(&history, &differentiable, rules)?;
    let back = share(analyzed(back)?);
    let constants = [fwd, history, back.clone()];
    for m in 0..step.gradients.len() {
        let Some(tangent) = step.loss_tangent(m, &back_scan(&back)?, rules)? else {
            continue;
        };
        let (plan, value) = Batched::over(&back, &step).plan(&tangent)?;
        contributions.extend(weighted_contributions(
            &plan,
            vec![(value, lit(1.0))],
            parameter,
            &constants,
            &table_rules,
        )?);
    }
    Ok(contributions)
}

/// `plan` analyzed by the markers' analyzer rule (the loop's own
/// relational gradients, and the backward step's).
fn analyzed(plan: LogicalPlan) -> Result<LogicalPlan> {
    GradAnalyzer.analyze(plan, &Default::default())
}

/// A relational gradient in the step: `grad((SELECT loss …), c)`, its loss
/// reading the work table.
struct Gradient {
    /// The marker as the step writes it.
    marker: Expr,
    /// The loss's plan.
    loss: LogicalPlan,
    /// The column of the CTE it is taken with respect to.
    column: usize,
}

/// The step of a loop `SELECT u₁, … FROM cte WHERE …` whose expressions
/// take relational gradients over the work table.
struct Step<'r> {
    r: &'r RecursiveQuery,
    select: &'r Projection,
    gradients: Vec<Gradient>,
    /// The parameter relation's name (for messages).
    relation: &'r str,
}

impl<'r> Step<'r> {
    fn of(r: &'r RecursiveQuery, relation: &'r str) -> Result<Self> {
        let refuse = |why: String| -> Result<Self> {
            fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "the loss reads the rows of `{relation}` through the recursive CTE `{}`, \
                     whose step reads its work table more than once: {why}",
                    r.name
                ),
            )
        };
        let LogicalPlan::Projection(select) = r.recursive_term.as_ref() else {
            return refuse("its recursive term is not a SELECT list".into());
        };
        let mut node = select.input.as_ref();
        loop {
            match node {
                LogicalPlan::Filter(f) => {
                    if expr_reads(&f.predicate, &r.name)? {
                        return refuse(format!("its WHERE `{}` reads the work table", f.predicate));
                    }
                    node = f.input.as_ref();
                }
                LogicalPlan::SubqueryAlias(a) => node = a.input.as_ref(),
                LogicalPlan::TableScan(s) if s.table_name.table() == r.name => {
                    if s.projection.is_some() || !s.filters.is_empty() {
                        return refuse(
                            "its scan of the work table is projected or filtered".into(),
                        );
                    }
                    break;
                }
                other => {
                    let shown = other.display().to_string();
                    return refuse(format!(
                        "its step reads `{}`; relational reverse mode follows a step that is a \
                         SELECT list over the work table (filtered) whose other reads of it are \
                         the losses of `grad((SELECT loss …), column)`",
                        shown.trim()
                    ));
                }
            }
        }
        let gradients = match relational_gradients(&r.name, select)? {
            Ok(g) => g,
            Err(why) => return refuse(why),
        };
        Ok(Self {
            r,
            select,
            gradients,
            relation,
        })
    }

    fn name(&self) -> &str {
        &self.r.name
    }

    /// The step's expression for the CTE's column `c`, its relational
    /// gradients read from the columns [`lifted_value`] and its columns
    /// from `qualifier`'s (unqualified where `None`).
    fn update(&self, c: usize, qualifier: Option<&TableReference>) -> Result<Expr> {
        let e = lifted(unalias(&self.select.expr[c]), &self.gradients)?;
        Ok(e.transform_up(|x| match x {
            Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new(
                qualifier.cloned(),
                c.name,
            )))),
            x => Ok(Transformed::no(x)),
        })?
        .data)
    }

    /// `Σ_c ⟨adjoint_c, U_c⟩` over `schema`, the columns read from
    /// `qualifier` (see [`Self::update`]).
    fn paired(
        &self,
        differentiable: &[usize],
        schema: &DFSchema,
        qualifier: Option<&TableReference>,
    ) -> Result<Expr> {
        let mut total: Option<Expr> = None;
        for &c in differentiable {
            let u = self.update(c, qualifier)?;
            let a = Expr::Column(Column::new(qualifier.cloned(), adjoint_column(c)));
            let t = u.get_type(schema)?;
            let term = match Shape::is_tensor_type(&t) {
                true => tensor::call("tensor_total", vec![tensor::call("tensor_mul", vec![a, u])]),
                false => a * u,
            };
            total = Some(match total {
                Some(s) => s + term,
                None => term,
            });
        }
        Ok(total.expect("a differentiable column"))
    }

    /// `grad(f, x)` written out over `schema`.
    fn derivative(&self, f: Expr, x: Expr, schema: &DFSchema, rules: &SharedRules) -> Result<Expr> {
        let marker = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, Arc::clone(rules)));
        Ok(expand_markers(marker.call(vec![f, x]), schema)?.data)
    }

    /// The loop with, after each row's columns, its iteration, its
    /// trajectory (its first row's number) and the relational gradients
    /// that made it (NULL in the first rows).
    fn with_history(&self) -> Result<LogicalPlan> {
        let r = self.r;
        let windowed = LogicalPlanBuilder::from(r.static_term.as_ref().clone())
            .window(vec![row_number()])?
            .build()?;
        let mut exprs = columns(&windowed);
        let numbered = exprs.pop().expect("the row number");
        exprs.push(lit(0i64).alias(ITERATION_COLUMN));
        exprs.push(numbered.alias(TRAJECTORY_COLUMN));
        for (m, g) in self.gradients.iter().enumerate() {
            let t = r.static_term.schema().field(g.column).data_type();
            exprs.push(Expr::Literal(ScalarValue::try_from(t)?, None).alias(lifted_value(m)));
        }
        let static_term = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(windowed))?);
        let schema = Arc::new(static_term.schema().as_arrow().clone());
        let source = provider_as_source(Arc::new(CteWorkTable::new(&r.name, schema)));
        let term = with_scans(&r.recursive_term, &r.name, &source)?;
        let LogicalPlan::Projection(p) = &term else {
            unreachable!("a SELECT list, as Step::of found")
        };
        let gradients = match relational_gradients(&r.name, p)? {
            Ok(g) => g,
            Err(why) => unreachable!("the same step, read again: {why}"),
        };
        let input = p.input.as_ref().clone();
        // The row's columns but the gradients that made it, then those it
        // makes.
        let made: Vec<String> = (0..gradients.len()).map(lifted_value).collect();
        let mut below: Vec<Expr> = input
            .schema()
            .columns()
            .into_iter()
            .filter(|c| !made.contains(&c.name))
            .map(Expr::Column)
            .collect();
        for (m, g) in gradients.iter().enumerate() {
            below.push(g.marker.clone().alias(lifted_value(m)));
        }
        let below = LogicalPlan::Projection(Projection::try_new(below, Arc::new(input))?);
        let names = NamePreserver::new_for_projection();
        let mut top = Vec::with_capacity(p.expr.len() + 2 + gradients.len());
        for e in &p.expr {
            let saved = names.save(e);
            top.push(saved.restore(lifted(e, &gradients)?));
        }
        let iteration = Expr::Column(column_named(&below, ITERATION_COLUMN)?);
        top.push((iteration + lit(1i64)).alias(ITERATION_COLUMN));
        top.push(Expr::Column(column_named(&below, TRAJECTORY_COLUMN)?).alias(TRAJECTORY_COLUMN));
        for m in 0..gradients.len() {
            let lifted = Column::new_unqualified(lifted_value(m));
            top.push(Expr::Column(lifted).alias(lifted_value(m)));
        }
        let recursive_term = LogicalPlan::Projection(Projection::try_new(top, Arc::new(below))?);
        Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
            r.name.clone(),
            Arc::new(static_term),
            Arc::new(recursive_term),
            false,
        )?))
    }

    /// The rows of `fwd` that made a step: per row (iteration `k`,
    /// trajectory), its columns, the relational gradients of the step it
    /// made (from the row it made) and the loss's adjoint of that row
    /// (`seeds`, 0 where the loss does not read it), all unqualified.
    fn history(
        &self,
        fwd: &LogicalPlan,
        seeds: LogicalPlan,
        differentiable: &[usize],
    ) -> Result<LogicalPlan> {
        let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
        let alias = |p: &LogicalPlan, q: &str| -> Result<LogicalPlan> {
            Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(p.clone()),
                q,
            )?))
        };
        let key = |k: usize| crate::reserved::Placeholder::Key.name(k);
        let joined = LogicalPlanBuilder::from(alias(fwd, FORWARD)?)
            .join_on(
                alias(fwd, NEXT)?,
                JoinType::Inner,
                vec![
                    col(NEXT, TRAJECTORY_COLUMN).eq(col(FORWARD, TRAJECTORY_COLUMN)),
                    col(NEXT, ITERATION_COLUMN).eq(col(FORWARD, ITERATION_COLUMN) + lit(1i64)),
                ],
            )?
            .join_on(
                alias(&seeds, SEED)?,
                JoinType::Left,
                vec![
                    col(SEED, &key(1)).eq(col(FORWARD, TRAJECTORY_COLUMN)),
                    col(SEED, &key(0)).eq(col(FORWARD, ITERATION_COLUMN) + lit(1i64)),
                ],
            )?
            .build()?;
        let state = self.r.static_term.schema();
        let mut exprs = vec![
            col(FORWARD, ITERATION_COLUMN).alias(ITERATION_COLUMN),
            col(FORWARD, TRAJECTORY_COLUMN).alias(TRAJECTORY_COLUMN),
        ];
        for f in state.fields() {
            exprs.push(col(FORWARD, f.name()).alias(f.name()));
        }
        for m in 0..self.gradients.len() {
            exprs.push(col(NEXT, &lifted_value(m)).alias(lifted_value(m)));
        }
        for &c in differentiable {
            let name = adjoint_column(c);
            let z = zero(state.field(c).data_type())?;
            exprs.push(coalesce(vec![col(SEED, &name), z]).alias(name));
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(joined),
        )?))
    }

    /// `mid` (a row's iteration, trajectory, columns, relational gradients
    /// and the adjoints of the row it made) with the cotangent of each
    /// relational gradient after.
    fn with_cotangents(
        &self,
        mid: LogicalPlan,
        differentiable: &[usize],
        rules: &SharedRules,
    ) -> Result<LogicalPlan> {
        let schema = Arc::clone(mid.schema());
        let paired = self.paired(differentiable, &schema, None)?;
        let mut exprs = columns(&mid);
        for m in 0..self.gradients.len() {
            let g = Expr::Column(Column::new_unqualified(lifted_value(m)));
            let d = self.derivative(paired.clone(), g, &schema, rules)?;
            exprs.push(d.alias(cotangent_column(m)));
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(mid),
        )?))
    }

    /// The loop run backwards ([`BACKWARD_ROWS`]): per iteration `k` from
    /// the last step, each row that made a step, its relational gradients,
    /// the adjoints of the row it made and their cotangents.
    fn backward(
        &self,
        history: &LogicalPlan,
        differentiable: &[usize],
        rules: &SharedRules,
    ) -> Result<LogicalPlan> {
        let unqualified = |n: &str| Expr::Column(Column::new_unqualified(n));
        // The first rows: the last step's.
        let last = at_level(history, history, max(unqualified(ITERATION_COLUMN)), 0)?;
        let mut exprs = Vec::new();
        for f in history.schema().fields() {
            let name = f.name();
            exprs.push(Expr::Column(Column::new(Some(FORWARD), name)).alias(name));
        }
        let first = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(last))?);
        let first = self.with_cotangents(first, differentiable, rules)?;

        // A step back: the adjoints of the rows at iteration k …
        let schema = Arc::new(first.schema().as_arrow().clone());
        let source = provider_as_source(Arc::new(CteWorkTable::new(BACKWARD_ROWS, schema)));
        let scan = LogicalPlan::TableScan(TableScanBuilder::new(BACKWARD_ROWS, source).build()?);
        let rows = TableReference::bare(BACKWARD_ROWS);
        let at = |n: &str| Expr::Column(Column::new(Some(rows.clone()), n));
        let stepped = LogicalPlan::Filter(Filter::try_new(
            at(ITERATION_COLUMN).gt_eq(lit(1i64)),
            Arc::new(scan.clone()),
        )?);
        let paired = self.paired(differentiable, stepped.schema(), Some(&rows))?;
        let tangents = (0..self.gradients.len())
            .map(|m| self.loss_tangent(m, &scan, rules))
            .collect::<Result<Vec<_>>>()?;
        let mut exprs = vec![at(TRAJECTORY_COLUMN).alias(TRAJECTORY_COLUMN)];
        for &c in differentiable {
            let name = self.r.static_term.schema().field(c).name();
            let mut adjoint = self.derivative(paired.clone(), at(name), stepped.schema(), rules)?;
            for tangent in tangents.iter().flatten() {
                let marker =
                    ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, Arc::clone(rules)));
                let hvp = marker.call(vec![
                    Expr::ScalarSubquery(Subquery {
                        subquery: Arc::new(tangent.clone()),
                        outer_ref_columns: vec![],
                        spans: Default::default(),
                    }),
                    at(name),
                ]);
                adjoint = add(
                    adjoint,
                    hvp,
                    self.r.static_term.schema().field(c).data_type(),
                );
            }
            exprs.push(adjoint.alias(adjoint_column(c)));
        }
        let adjoints = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
            Arc::new(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(stepped),
            )?)),
            ADJOINTS,
        )?);
        // … with the rows at iteration k − 1 (every one, a trajectory that
        // ends at k too).
        let col = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
        let before = at_level(history, &scan, min(at(ITERATION_COLUMN)), -1)?;
        let joined = LogicalPlanBuilder::from(before)
            .join_on(
                adjoints,
                JoinType::Left,
                vec![col(ADJOINTS, TRAJECTORY_COLUMN).eq(col(FORWARD, TRAJECTORY_COLUMN))],
            )?
            .build()?;
        let state = self.r.static_term.schema();
        let mut exprs = Vec::new();
        for f in history.schema().fields() {
            let name = f.name();
            let value = col(FORWARD, name);
            let value = match differentiable.iter().find(|&&c| adjoint_column(c) == *name) {
                Some(&c) => {
                    let t = state.field(c).data_type();
                    let made = coalesce(vec![col(ADJOINTS, name), zero(t)?]);
                    add(made, value, t)
                }
                None => value,
            };
            exprs.push(value.alias(name));
        }
        let mid = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(joined))?);
        let term = self.with_cotangents(mid, differentiable, rules)?;
        Ok(LogicalPlan::RecursiveQuery(RecursiveQuery::try_new(
            BACKWARD_ROWS.to_string(),
            Arc::new(first),
            Arc::new(term),
            false,
        )?))
    }

    /// The tangent of the `m`-th relational gradient's loss along the
    /// cotangents of its gradient, over the rows `scan` (a scan of the
    /// backward rows, as the work table): a plan of one column, `L̇`.
    /// `None` where the loss does not read its column.
    fn loss_tangent(
        &self,
        m: usize,
        scan: &LogicalPlan,
        rules: &SharedRules,
    ) -> Result<Option<LogicalPlan>> {
        let LogicalPlan::TableScan(s) = scan else {
            unreachable!("a scan of the backward rows")
        };
        let g = &self.gradients[m];
        let name = self.r.static_term.schema().field(g.column).name().clone();
        // The loss over the backward rows, as its plan names the work table.
        let loss = g
            .loss
            .clone()
            .transform_up(|node| match &node {
                LogicalPlan::TableScan(t) if t.table_name.table() == self.name() => {
                    Ok(Transformed::yes(LogicalPlan::SubqueryAlias(
                        SubqueryAlias::try_new(Arc::new(scan.clone()), t.table_name.clone())?,
                    )))
                }
                _ => Ok(Transformed::yes(node.recompute_schema()?)),
            })?
            .data;
        let columns = s.projected_schema.fields().len();
        let target = s
            .projected_schema
            .index_of_column_by_name(None, &name)
            .expect("the column");
        let cotangent = cotangent_column(m);
        let tangent = |_: usize, c: usize, scan: &LogicalPlan| -> Result<Option<Expr>> {
            Ok((c == target).then(|| {
                Expr::Column(Column::from(
                    scan.schema()
                        .qualified_field_with_unqualified_name(&cotangent)
                        .expect("the cotangent"),
                ))
            }))
        };
        let rewriter = Rewriter::new(
            BACKWARD_ROWS,
            Arc::clone(&s.source),
            columns,
            1,
            &tangent,
            Arc::clone(rules),
        )
        .refusing_as(format!(
            "the loss reads the rows of `{}` through the recursive CTE `{}`, whose step reads \
             its work table more than once: the tangent of its loss `{}`",
            self.relation,
            self.name(),
            g.marker
        ));
        let dual = rewriter.dual(&loss)?;
        let Some(t) = &dual.tangents[0][0] else {
            return Ok(None);
        };
        let name = dual.plan.schema().field(0).name().clone();
        Ok(Some(LogicalPlan::Projection(Projection::try_new(
            vec![t.clone().alias(name)],
            Arc::new(dual.plan),
        )?)))
    }
}

/// The rows of `rows` (as [`FORWARD`]) whose iteration is `offset` after
/// `level`, an aggregate of `of`'s (a join, not a subquery: Ballista's
/// client-driven recursion runs the loops it reads).
fn at_level(rows: &LogicalPlan, of: &LogicalPlan, level: Expr, offset: i64) -> Result<LogicalPlan> {
    let level = LogicalPlanBuilder::from(of.clone())
        .aggregate(Vec::<Expr>::new(), vec![level.alias(LEVEL)])?
        .alias(LEVEL)?
        .build()?;
    let at = |q: &str, n: &str| Expr::Column(Column::new(Some(q), n));
    LogicalPlanBuilder::from(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
        Arc::new(rows.clone()),
        FORWARD,
    )?))
    .join_on(
        level,
        JoinType::Inner,
        vec![at(FORWARD, ITERATION_COLUMN).eq(at(LEVEL, LEVEL) + lit(offset))],
    )?
    .build()
}

/// `e` with the step's relational gradients `gradients` read from the
/// columns [`lifted_value`] that hold them.
fn lifted(e: &Expr, gradients: &[Gradient]) -> Result<Expr> {
    Ok(e.clone()
        .transform_down(|x| {
            if let Some(m) = gradients.iter().position(|g| g.marker == x) {
                let lifted = Column::new_unqualified(lifted_value(m));
                return Ok(Transformed::new(
                    Expr::Column(lifted),
                    true,
                    TreeNodeRecursion::Jump,
                ));
            }
            Ok(Transformed::no(x))
        })?
        .data)
}

/// The relational gradients over the work table `name` in the SELECT list
/// `select`, or why the step is refused.
fn relational_gradients(
    name: &str,
    select: &Projection,
) -> Result<std::result::Result<Vec<Gradient>, String>> {
    let mut found = Vec::new();
    let mut refused = None;
    for e in &select.expr {
        e.apply(|x| {
            if let Some(call) = as_marker(x) {
                if let Expr::ScalarSubquery(s) = unalias(&call.args[0]) {
                    if reads(&s.subquery, name)? {
                        let wrt = call.wrt_columns();
                        let column = match wrt.as_slice() {
                            [c] if call.kind() == MarkerKind::Grad && call.args.len() == 2 => {
                                select.input.schema().index_of_column(c).ok()
                            }
                            _ => None,
                        };
                        let Some(column) = column.filter(|&c| {
                            is_differentiable(select.input.schema().field(c).data_type())
                        }) else {
                            refused = Some(format!(
                                "`{x}` is not `grad((SELECT loss …), column)` of one float \
                                 column of the work table"
                            ));
                            return Ok(TreeNodeRecursion::Stop);
                        };
                        if !s.outer_ref_columns.is_empty() {
                            refused = Some(format!("`{x}` differentiates a correlated subquery"));
                            return Ok(TreeNodeRecursion::Stop);
                        }
                        found.push(Gradient {
                            marker: x.clone(),
                            loss: s.subquery.as_ref().clone(),
                            column,
                        });
                        return Ok(TreeNodeRecursion::Jump);
                    }
                }
                if expr_reads(x, name)? {
                    refused = Some(format!(
                        "`{x}` differentiates an expression over a subquery that reads the \
                         work table; relational reverse mode follows `grad((SELECT loss …), \
                         column)` there"
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
                return Ok(TreeNodeRecursion::Jump);
            }
            if matches!(
                x,
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
            ) && expr_reads(x, name)?
            {
                refused = Some(format!(
                    "`{x}` reads the work table outside a relational gradient `grad((SELECT \
                     loss …), column)`"
                ));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if let Some(why) = refused {
            return Ok(Err(why));
        }
    }
    Ok(Ok(found))
}

/// Whether `plan` (its subqueries too) scans the table `name`.
fn reads(plan: &LogicalPlan, name: &str) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        found |= matches!(node, LogicalPlan::TableScan(s) if s.table_name.table() == name);
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(found)
}

/// Whether `node` takes a relational gradient (`grad((SELECT loss …),
/// t.c)`) whose loss reads a recursive CTE whose step reads its work table
/// more than once and a relation that `node`'s input reads (a table or a
/// CTE, by name): the markers of that step are to be rewritten by this
/// module, not before.
pub(super) fn valued_below(node: &LogicalPlan) -> Result<bool> {
    let LogicalPlan::Projection(p) = node else {
        return Ok(false);
    };
    let read = relations(&p.input)?;
    let mut found = false;
    for e in &p.expr {
        e.apply(|x| {
            let Some(call) = as_marker(x) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            let Expr::ScalarSubquery(s) = unalias(&call.args[0]) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            s.subquery.apply_with_subqueries(|n| {
                if let LogicalPlan::RecursiveQuery(r) = n {
                    if work_table_reads(r)? >= 2 {
                        found |= relations(&r.recursive_term)?
                            .iter()
                            .any(|t| *t != r.name && read.contains(t));
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    Ok(found)
}

/// The names of the tables and aliased relations (CTEs) `plan` reads, its
/// subqueries too.
fn relations(plan: &LogicalPlan) -> Result<Vec<String>> {
    let mut names = Vec::new();
    plan.apply_with_subqueries(|n| {
        match n {
            LogicalPlan::TableScan(s) => names.push(s.table_name.table().to_string()),
            LogicalPlan::SubqueryAlias(a) => names.push(a.alias.table().to_string()),
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(names)
}

/// Whether a subquery in `e` reads the table `name`.
fn expr_reads(e: &Expr, name: &str) -> Result<bool> {
    let mut found = false;
    e.apply(|x| {
        let plan = match x {
            Expr::ScalarSubquery(s) => Some(&s.subquery),
            Expr::Exists(s) => Some(&s.subquery.subquery),
            Expr::InSubquery(s) => Some(&s.subquery.subquery),
            _ => None,
        };
        if let Some(plan) = plan {
            found |= reads(plan, name)?;
        }
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(found)
}

/// `term` with every scan of the work table `name` (its subqueries' too)
/// reading `source`.
fn with_scans(
    term: &LogicalPlan,
    name: &str,
    source: &Arc<dyn TableSource>,
) -> Result<LogicalPlan> {
    Ok(term
        .clone()
        .transform_up_with_subqueries(|node| match &node {
            LogicalPlan::TableScan(s) if s.table_name.table() == name => {
                Ok(Transformed::yes(LogicalPlan::TableScan(
                    TableScanBuilder::new(s.table_name.clone(), Arc::clone(source)).build()?,
                )))
            }
            _ => Ok(Transformed::yes(node.recompute_schema()?)),
        })?
        .data)
}

/// A scan of the backward rows `back` (a shared recursive CTE), as its
/// work table.
fn back_scan(back: &LogicalPlan) -> Result<LogicalPlan> {
    let schema = Arc::new(back.schema().as_arrow().clone());
    let source = provider_as_source(Arc::new(CteWorkTable::new(BACKWARD_ROWS, schema)));
    Ok(LogicalPlan::TableScan(
        TableScanBuilder::new(BACKWARD_ROWS, source).build()?,
    ))
}

/// A loss's tangent plan over the backward rows, rewritten to read the
/// rows of every iteration at once: each node's rows carry their iteration
/// ([`LEVEL`]).
struct Batched<'a> {
    back: &'a LogicalPlan,
    step: &'a Step<'a>,
}

impl<'a> Batched<'a> {
    fn over(back: &'a LogicalPlan, step: &'a Step<'a>) -> Self {
        Self { back, step }
    }

    fn refuse<T>(&self, why: impl std::fmt::Display) -> Result<T> {
        fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "the loss reads the rows of `{}` through the recursive CTE `{}`, whose step \
                 reads its work table more than once: its loss `grad((SELECT loss …), …)` reads \
                 the work table through {why}; relational reverse mode follows projections, \
                 filters, inner joins and aggregates there",
                self.step.relation,
                self.step.name()
            ),
        )
    }

    /// `tangent` (one column, `L̇`) summed per iteration: the plan and its
    /// value's expression.
    fn plan(&self, tangent: &LogicalPlan) -> Result<(LogicalPlan, Expr)> {
        let (plan, _) = self.rows(tangent)?;
        let value = Expr::Column(Column::from(plan.schema().qualified_field(0)));
        Ok((plan, value))
    }

    /// `plan` over every iteration's rows, and its column holding a row's
    /// iteration (`None` where it reads no backward rows).
    fn rows(&self, plan: &LogicalPlan) -> Result<(LogicalPlan, Option<Column>)> {
        let reads_rows = |p: &LogicalPlan| reads(p, BACKWARD_ROWS);
        if !reads_rows(plan)? {
            return Ok((plan.clone(), None));
        }
        for e in plan.expressions() {
            if expr_reads(&e, BACKWARD_ROWS)? {
                return self.refuse(format!("a subquery (`{e}`)"));
            }
        }
        let level_of = |p: &LogicalPlan, c: &Column| -> Column {
            let i = p.schema().index_of_column(c).expect("the level column");
            Column::from(p.schema().qualified_field(i))
        };
        Ok(match plan {
            LogicalPlan::TableScan(s) if s.table_name.table() == BACKWARD_ROWS => {
                let rows = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(self.back.clone()),
                    s.table_name.clone(),
                )?);
                let level = Column::new(Some(s.table_name.clone()), ITERATION_COLUMN);
                (rows, Some(level))
            }
            LogicalPlan::SubqueryAlias(a) => {
                let (input, level) = self.rows(&a.input)?;
                let level = level.expect("reads the rows");
                let i = input.schema().index_of_column(&level)?;
                let plan = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(input),
                    a.alias.clone(),
                )?);
                let level = Column::from(plan.schema().qualified_field(i));
                (plan, Some(level))
            }
            LogicalPlan::Filter(f) => {
                let (input, level) = self.rows(&f.input)?;
                let plan =
                    LogicalPlan::Filter(Filter::try_new(f.predicate.clone(), Arc::new(input))?);
                (plan, level)
            }
            LogicalPlan::Projection(p) => {
                let (input, level) = self.rows(&p.input)?;
                let level = level.expect("reads the rows");
                let mut exprs = p.expr.clone();
                exprs.push(Expr::Column(level).alias(LEVEL));
                let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
                let level = level_of(&plan, &Column::new_unqualified(LEVEL));
                (plan, Some(level))
            }
            LogicalPlan::Join(j) => {
                let (left, l) = self.rows(&j.left)?;
                let (right, r) = self.rows(&j.right)?;
                let mut on = j.on.clone();
                let kept = match (&l, &r, j.join_type) {
                    (Some(l), Some(r), JoinType::Inner) => {
                        on.push((Expr::Column(l.clone()), Expr::Column(r.clone())));
                        true
                    }
                    (Some(_), Some(_), _) => false,
                    (Some(_), None, t) => matches!(
                        t,
                        JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti
                    ),
                    (None, Some(_), t) => matches!(
                        t,
                        JoinType::Inner
                            | JoinType::Right
                            | JoinType::RightSemi
                            | JoinType::RightAnti
                    ),
                    (None, None, _) => unreachable!("reads the rows"),
                };
                if !kept {
                    return self.refuse(format!("a {} join", j.join_type));
                }
                let plan = LogicalPlan::Join(Join::try_new(
                    Arc::new(left),
                    Arc::new(right),
                    on,
                    j.filter.clone(),
                    j.join_type,
                    j.join_constraint,
                    j.null_equality,
                    j.null_aware,
                )?);
                let right_only = matches!(j.join_type, JoinType::RightSemi | JoinType::RightAnti);
                let level = match (l, r) {
                    (Some(l), _) if !right_only => l,
                    (_, r) => r.expect("a kept side's iteration"),
                };
                let level = level_of(&plan, &level);
                (plan, Some(level))
            }
            LogicalPlan::Aggregate(a) => {
                let (input, level) = self.rows(&a.input)?;
                let level = level.expect("reads the rows");
                let mut group = a.group_expr.clone();
                group.push(Expr::Column(level.clone()));
                let plan = LogicalPlan::Aggregate(Aggregate::try_new(
                    Arc::new(input),
                    group,
                    a.aggr_expr.clone(),
                )?);
                let level = level_of(&plan, &level);
                (plan, Some(level))
            }
            LogicalPlan::Extension(_) => {
                // A shared subplan (the aggregates the rewrite shares):
                // batched as its input is.
                let inputs = plan.inputs();
                let [input] = inputs[..] else {
                    return self.refuse(plan.display().to_string().trim());
                };
                self.rows(input)?
            }
            other => return self.refuse(format!("`{}`", other.display().to_string().trim())),
        })
    }
}
