//! Column lineage: where the value of a column visible at a plan node comes
//! from, looking down through projections, aliases, filters, sorts, limits,
//! joins and group keys.
//!
//! The analyzer rule uses it to differentiate through *derived columns*: in
//! `WITH v AS (SELECT x, sin(x) AS s FROM t) SELECT grad(s * x, x) FROM v`, the
//! column `s` is replaced by its definition `sin(x)` (written in the columns
//! visible at the marker), so the result is the total derivative
//! `cos(x)·x + sin(x)`. When the variable is itself a derived column it is
//! the variable: its definition is held fixed (a partial derivative).

use std::cell::RefCell;
use std::collections::HashMap;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::logical_expr::expr::BinaryExpr;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Distinct, Expr, JoinType, LogicalPlan, Operator, Subquery};

use crate::error::{fail, ErrorKind};
use crate::outer::{same_outer, subquery_reads};

/// The identity of a value: the plan node that defines it, and its index there.
pub type Identity = (usize, usize);

/// Prefix of the placeholder columns that stand for aggregate outputs in an
/// expression inlined by [`Scope::inline_through_aggregates`].
pub(crate) const AGGREGATE_PREFIX: &str = "__dfgrad_aggregate";

/// An aggregate output that a differentiated expression reads: output `idx`
/// (an aggregate expression, after the group keys) of the Aggregate `plan`.
#[derive(Debug, Clone, Copy)]
pub struct AggregateRef<'p> {
    /// The Aggregate node.
    pub plan: &'p LogicalPlan,
    /// The output's index in its schema.
    pub idx: usize,
}

/// Where a column's value comes from.
enum Origin<'p> {
    /// Computed by `expr` over `input` in a projection.
    Derived {
        id: Identity,
        expr: &'p Expr,
        input: &'p LogicalPlan,
    },
    /// Output `idx` of `plan`, an aggregate or window function's.
    Aggregated {
        name: String,
        plan: &'p LogicalPlan,
        idx: usize,
    },
    /// Any other value (a table column, a constant scan, a recursive CTE, …).
    Base { id: Identity },
    /// A column of a set operation (`UNION`): each branch may compute it differently.
    Mixed { id: Identity },
}

impl Origin<'_> {
    fn id(&self) -> Option<Identity> {
        match self {
            Origin::Derived { id, .. } | Origin::Base { id } | Origin::Mixed { id } => Some(*id),
            Origin::Aggregated { plan, idx, .. } => {
                Some((*plan as *const LogicalPlan as usize, *idx))
            }
        }
    }
}

/// The identity of the value of column `idx` of `plan`.
pub fn identity_of(plan: &LogicalPlan, idx: usize) -> Result<Option<Identity>> {
    Ok(trace(plan, idx)?.id())
}

/// Follows column `idx` of `plan` down to its origin.
fn trace(mut plan: &LogicalPlan, mut idx: usize) -> Result<Origin<'_>> {
    loop {
        let id = (plan as *const LogicalPlan as usize, idx);
        let next: &LogicalPlan = match plan {
            LogicalPlan::Projection(p) => match unalias(&p.expr[idx]) {
                Expr::Column(c) => {
                    idx = p.input.schema().index_of_column(c)?;
                    &p.input
                }
                expr => {
                    return Ok(Origin::Derived {
                        id,
                        expr,
                        input: &p.input,
                    })
                }
            },
            LogicalPlan::SubqueryAlias(s) => &s.input,
            LogicalPlan::Filter(f) => &f.input,
            LogicalPlan::Sort(s) => &s.input,
            LogicalPlan::Limit(l) => &l.input,
            LogicalPlan::Repartition(r) => &r.input,
            LogicalPlan::Distinct(Distinct::All(input)) => input,
            LogicalPlan::Join(j) => {
                let left = j.left.schema().fields().len();
                match j.join_type {
                    JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                        if idx < left {
                            &j.left
                        } else {
                            idx -= left;
                            &j.right
                        }
                    }
                    JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark if idx < left => {
                        &j.left
                    }
                    JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
                        if idx < j.right.schema().fields().len() =>
                    {
                        &j.right
                    }
                    _ => return Ok(Origin::Base { id }),
                }
            }
            LogicalPlan::Aggregate(a) => {
                if idx >= a.group_expr.len() {
                    let name = a.schema.field(idx).name().clone();
                    return Ok(Origin::Aggregated { name, plan, idx });
                }
                match unalias(&a.group_expr[idx]) {
                    Expr::Column(c) => {
                        idx = a.input.schema().index_of_column(c)?;
                        &a.input
                    }
                    _ => return Ok(Origin::Base { id }),
                }
            }
            LogicalPlan::Window(w) => {
                if idx >= w.input.schema().fields().len() {
                    let name = w.schema.field(idx).name().clone();
                    return Ok(Origin::Aggregated { name, plan, idx });
                }
                &w.input
            }
            LogicalPlan::Union(_) => return Ok(Origin::Mixed { id }),
            _ => return Ok(Origin::Base { id }),
        };
        plan = next;
    }
}

fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}

/// The inputs of one plan node, seen as one schema (a join's two sides side by side).
pub struct Scope<'p> {
    inputs: Vec<&'p LogicalPlan>,
    schema: DFSchema,
    visible: HashMap<Identity, Column>,
}

impl<'p> Scope<'p> {
    /// The scope of the expressions of a node with these inputs.
    pub fn new(inputs: Vec<&'p LogicalPlan>) -> Result<Self> {
        let mut schema = DFSchema::empty();
        for input in &inputs {
            schema = if schema.fields().is_empty() {
                input.schema().as_ref().clone()
            } else {
                schema.join(input.schema())?
            };
        }
        let mut scope = Self {
            inputs,
            schema,
            visible: HashMap::new(),
        };
        for i in 0..scope.schema.fields().len() {
            if let Some(id) = scope.origin(i)?.id() {
                let column = Column::from(scope.schema.qualified_field(i));
                scope.visible.entry(id).or_insert(column);
            }
        }
        Ok(scope)
    }

    /// The merged schema of the inputs.
    pub fn schema(&self) -> &DFSchema {
        &self.schema
    }

    fn origin(&self, mut idx: usize) -> Result<Origin<'p>> {
        for input in &self.inputs {
            let n = input.schema().fields().len();
            if idx < n {
                return trace(input, idx);
            }
            idx -= n;
        }
        unreachable!("index within the merged schema")
    }

    /// The identity of the value of column `c` of the scope.
    pub fn identity(&self, c: &Column) -> Result<Option<Identity>> {
        Ok(self.origin(self.schema.index_of_column(c)?)?.id())
    }

    /// Whether a value of identity `id` is visible at the scope.
    pub fn sees(&self, id: Identity) -> bool {
        self.visible.contains_key(&id)
    }

    /// The column that shows output `idx` of `plan` at the scope, if one does.
    pub fn column_of(&self, plan: &LogicalPlan, idx: usize) -> Option<&Column> {
        self.visible
            .get(&(plan as *const LogicalPlan as usize, idx))
    }

    /// Like [`Scope::inline`], but an aggregate output that `f` reads (in
    /// itself or through derived columns) is replaced by a placeholder column
    /// `{AGGREGATE_PREFIX}{k}` for the `k`-th returned reference, instead of
    /// being refused.
    pub fn inline_through_aggregates(
        &self,
        f: Expr,
        wrt: &[Column],
        outer: &[Expr],
    ) -> Result<(Expr, Vec<AggregateRef<'p>>)> {
        let record = RefCell::new(Vec::new());
        let f = self.inline_with(f, wrt, outer, Some(&record))?.data;
        Ok((f, record.into_inner()))
    }

    /// `f` with every derived column that depends on a variable replaced by
    /// its definition: a column in `wrt`, or an outer variable in `outer`
    /// (an outer reference of a marker inside a subquery, or a parameter).
    /// Refuses `f` when it depends on an aggregate or window output (that
    /// needs the aggregate rule).
    pub fn inline(&self, f: Expr, wrt: &[Column], outer: &[Expr]) -> Result<Transformed<Expr>> {
        self.inline_with(f, wrt, outer, None)
    }

    fn inline_with(
        &self,
        f: Expr,
        wrt: &[Column],
        outer: &[Expr],
        record: Option<&RefCell<Vec<AggregateRef<'p>>>>,
    ) -> Result<Transformed<Expr>> {
        let mut wrt_ids = HashMap::new();
        for c in wrt {
            if let Ok(idx) = self.schema.index_of_column(c) {
                if let Some(id) = self.origin(idx)?.id() {
                    wrt_ids.insert(id, c.clone());
                }
            }
        }
        let inliner = Inliner {
            scope: self,
            wrt: &wrt_ids,
            outer,
            record,
        };
        f.transform_up(|e| match &e {
            Expr::Column(c) => {
                let origin = self.origin(self.schema.index_of_column(c)?)?;
                inliner.resolve(&origin, c, true)
            }
            Expr::ScalarSubquery(sq) => {
                inliner.check_subquery(sq)?;
                Ok(Transformed::no(e))
            }
            _ => Ok(Transformed::no(e)),
        })
    }
}

struct Inliner<'s, 'p> {
    scope: &'s Scope<'p>,
    wrt: &'s HashMap<Identity, Column>,
    /// Variables from outside the rows (see `crate::outer`).
    outer: &'s [Expr],
    /// Where aggregate outputs are recorded, when they are differentiated through.
    record: Option<&'s RefCell<Vec<AggregateRef<'p>>>>,
}

impl<'p> Inliner<'_, 'p> {
    /// The expression that stands for a column of origin `origin` at the scope;
    /// `here` is the column if it is itself visible at the scope.
    fn resolve(
        &self,
        origin: &Origin<'p>,
        here: &Column,
        at_top: bool,
    ) -> Result<Transformed<Expr>> {
        if let Some(id) = origin.id() {
            if let Some(w) = self.wrt.get(&id) {
                return Ok(Transformed::new_transformed(
                    Expr::Column(w.clone()),
                    !at_top,
                ));
            }
        }
        self.check_mixed(origin, here)?;
        match origin {
            Origin::Aggregated { plan, idx, .. } if self.recording(plan) => {
                let mut refs = self.record.expect("recording").borrow_mut();
                let k = match refs
                    .iter()
                    .position(|r| std::ptr::eq(r.plan, *plan) && r.idx == *idx)
                {
                    Some(k) => k,
                    None => {
                        refs.push(AggregateRef { plan, idx: *idx });
                        refs.len() - 1
                    }
                };
                Ok(Transformed::yes(crate::engine::placeholder(
                    AGGREGATE_PREFIX,
                    k,
                )))
            }
            Origin::Aggregated { name, .. } => fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "the differentiated expression depends on `{name}`, an aggregate or \
                     window function output that cannot be differentiated through here: put \
                     the marker inside the function's argument instead, e.g. avg(grad(f, x)) \
                     or avg(grad(f, x)) OVER (…)"
                ),
            ),
            Origin::Derived { expr, input, .. } if self.depends(expr, input)? => {
                Ok(Transformed::yes(self.inline_definition(expr, input, here)?))
            }
            _ if at_top => Ok(Transformed::no(Expr::Column(here.clone()))),
            Origin::Derived { id, expr, input } => match self.scope.visible.get(id) {
                Some(c) => Ok(Transformed::yes(Expr::Column(c.clone()))),
                None => Ok(Transformed::yes(self.inline_definition(expr, input, here)?)),
            },
            Origin::Base { id } | Origin::Mixed { id } => match self.scope.visible.get(id) {
                Some(c) => Ok(Transformed::yes(Expr::Column(c.clone()))),
                None => fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "a derived column depends on the variable through `{here}`, which is \
                         not visible where the derivative is taken; select `{here}` in the \
                         subquery, view or CTE that defines the derived column"
                    ),
                ),
            },
        }
    }

    /// Whether outputs of `plan` are recorded (an Aggregate, in recording mode).
    fn recording(&self, plan: &LogicalPlan) -> bool {
        self.record.is_some() && matches!(plan, LogicalPlan::Aggregate(_) | LogicalPlan::Window(_))
    }

    /// Refuses a UNION column when the variable comes from the same UNION.
    fn check_mixed(&self, origin: &Origin, here: &Column) -> Result<()> {
        if let Origin::Mixed { id } = origin {
            if self.wrt.keys().any(|w| w.0 == id.0) {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "`{here}` and the variable come from the same UNION, whose branches may \
                         compute `{here}` from the variable differently; differentiate inside \
                         each branch of the UNION instead"
                    ),
                );
            }
        }
        Ok(())
    }

    /// `expr` (a definition over `input`) written in the scope's columns.
    fn inline_definition(
        &self,
        expr: &'p Expr,
        input: &'p LogicalPlan,
        name: &Column,
    ) -> Result<Expr> {
        let mut has_subquery = false;
        expr.apply(|e| {
            has_subquery |= matches!(
                e,
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
            );
            Ok(TreeNodeRecursion::Continue)
        })?;
        if has_subquery {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!("the derived column `{name}` contains a subquery and cannot be moved"),
            );
        }
        Ok(expr
            .clone()
            .transform_up(|e| match &e {
                Expr::Column(c) => {
                    let origin = trace(input, input.schema().index_of_column(c)?)?;
                    self.resolve(&origin, c, false)
                }
                _ => Ok(Transformed::no(e)),
            })?
            .data)
    }

    /// Whether `expr` over `input` depends on a variable; refuses aggregate outputs.
    fn depends(&self, expr: &'p Expr, input: &'p LogicalPlan) -> Result<bool> {
        let mut found = false;
        let mut failure = None;
        expr.apply(|e| {
            for v in self.outer {
                // A subquery reading a parameter: found, and refused where
                // the definition would be moved.
                if same_outer(e, v) || (matches!(v, Expr::Placeholder(_)) && subquery_reads(e, v)?)
                {
                    found = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            if let Expr::Column(c) = e {
                let result = input
                    .schema()
                    .index_of_column(c)
                    .and_then(|i| trace(input, i))
                    .and_then(|origin| match &origin {
                        Origin::Aggregated { plan, idx, .. }
                            if self
                                .wrt
                                .contains_key(&(*plan as *const LogicalPlan as usize, *idx)) =>
                        {
                            Ok(true)
                        }
                        Origin::Aggregated { plan, .. } if self.recording(plan) => Ok(true),
                        Origin::Aggregated { .. } => self.resolve(&origin, c, false).map(|_| false),
                        Origin::Mixed { .. } => self.check_mixed(&origin, c).map(|_| false),
                        Origin::Derived { id, expr, input } => {
                            Ok(self.wrt.contains_key(id) || self.depends(expr, input)?)
                        }
                        Origin::Base { id } => Ok(self.wrt.contains_key(id)),
                    });
                match result {
                    Ok(true) => found = true,
                    Ok(false) => {}
                    Err(e) => {
                        failure = Some(e);
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    /// Checks a scalar subquery correlated with a variable. DataFusion 55
    /// executes a correlated scalar subquery only when each outer reference
    /// is one side of an equality in a filter (it becomes a join key); there
    /// the result is piecewise constant in the variable (a lookup by key,
    /// like a `CASE` condition), so its derivative is 0 and the subquery is
    /// a constant. A subquery that uses the variable as a value in the `f`
    /// of a projection's or filter's marker is differentiated inside before
    /// this runs (`src/subqueries.rs`); one found here (in an aggregate's
    /// marker, a derived column, a nested marker) is refused, saying that
    /// DataFusion 55 cannot run that shape.
    fn check_subquery(&self, subquery: &Subquery) -> Result<()> {
        for r in &subquery.outer_ref_columns {
            let Expr::OuterReferenceColumn(_, c) = r else {
                continue;
            };
            if !self.wrt.values().any(|w| w == c) {
                // A column derived from the variable, read inside as a value:
                // the subquery is differentiated inside only with respect to
                // the variable itself.
                let derived = match self.scope.schema.index_of_column(c) {
                    Ok(i) => match self.scope.origin(i)? {
                        Origin::Derived { expr, input, .. } => self.depends(expr, input)?,
                        _ => false,
                    },
                    Err(_) => false,
                };
                if derived {
                    if let Some(used) = value_use_of_outer(&subquery.subquery, c)? {
                        return fail(
                            ErrorKind::NeedsPlanContext,
                            format!(
                                "a scalar subquery uses `{c}`, a column derived from the \
                                 variable, through an outer reference in `{used}`; write the \
                                 subquery over the variable itself (its definition inlined)"
                            ),
                        );
                    }
                }
                continue;
            }
            if let Some(used) = value_use_of_outer(&subquery.subquery, c)? {
                return fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "a scalar subquery uses the variable `{c}` through an outer reference in \
                         `{used}`; DataFusion 55 cannot execute a correlated scalar subquery \
                         that uses an outer column anywhere but in an equality predicate \
                         (`WHERE inner = outer`), with or without grad; write it as a join \
                         grouped by the variable instead, e.g. \
                         `SELECT {name}, grad(avg(f), {name}) FROM outer_table CROSS JOIN \
                         inner_table GROUP BY {name}`",
                        name = c.name
                    ),
                );
            }
        }
        Ok(())
    }
}

/// The first outer column the subquery `plan` uses as a value (not as an
/// equality key of a filter), with the expression that uses it: `None` when
/// DataFusion 55 can decorrelate it.
pub(crate) fn correlated_value_use(plan: &LogicalPlan) -> Result<Option<(Column, Expr)>> {
    for r in plan.all_out_ref_exprs() {
        if let Expr::OuterReferenceColumn(_, c) = &r {
            if let Some(used) = value_use_of_outer(plan, c)? {
                return Ok(Some((c.clone(), used)));
            }
        }
    }
    Ok(None)
}

/// The first expression in `plan` (or its subqueries) that uses the outer
/// column `c` other than as one side of an equality conjunct of a filter.
pub(crate) fn value_use_of_outer(plan: &LogicalPlan, c: &Column) -> Result<Option<Expr>> {
    let is_outer = |e: &Expr| matches!(e, Expr::OuterReferenceColumn(_, o) if o == c);
    let uses = |e: &Expr| e.exists(|n| Ok(is_outer(n)));
    let mut offending = None;
    plan.apply_with_subqueries(|node| {
        let exprs: Vec<Expr> = match node {
            LogicalPlan::Filter(filter) => split_conjunction(&filter.predicate)
                .into_iter()
                .filter(|conjunct| {
                    // `outer = e` with `e` free of the outer reference: a key
                    let key = |outer: &Expr, e: &Expr| is_outer(outer) && !uses(e).unwrap_or(true);
                    !matches!(conjunct, Expr::BinaryExpr(BinaryExpr { left, op: Operator::Eq, right })
                        if key(left, right) || key(right, left))
                })
                .cloned()
                .collect(),
            other => other.expressions(),
        };
        for e in exprs {
            if uses(&e)? {
                offending = Some(e);
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(offending)
}
