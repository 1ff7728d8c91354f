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
//!
//! It also tells what a value is made of (`parts`), so that `f` is refused
//! (never silently 0) where it reads a value the variable flows into
//! without the variable being visible as a column there:
//! - a column of a recursive CTE computed from the variable through the
//!   iterations, where the analyzer's forward mode does not follow it
//!   (`crate::plan::analyzer`: a variable the recursive term carries
//!   unchanged, the CTE's columns visible at the marker); a column
//!   the variable is itself, or one it does not flow into, keeps the
//!   partial meaning;
//! - a scalar subquery, aggregate, window or recursive CTE that reads the
//!   rows the variable comes from again: its value depends on the variable
//!   in the other rows too; a loss subquery in a SELECT list over the
//!   variable's rows is differentiated by relational reverse mode before
//!   this check (`crate::plan::reverse`), elsewhere it is refused.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Display;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::expr::BinaryExpr;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Distinct, Expr, JoinType, LogicalPlan, Operator, RecursiveQuery, Subquery, TableScan,
};

use super::free_variables::{outer_name, outer_variables, plan_reads, same_outer, subquery_reads};
use super::reverse::as_group_join;
use super::{same_table, unalias};
use crate::engine::call::as_marker;
use crate::error::{fail, ErrorKind};
use crate::reserved::Placeholder;

/// The identity of a value: the plan node that defines it, and its index there.
pub type Identity = (usize, usize);

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
        plan: &'p LogicalPlan,
    },
    /// Output `idx` of `plan`, an aggregate or window function's.
    Aggregated {
        name: String,
        plan: &'p LogicalPlan,
        idx: usize,
    },
    /// Any other value (a table column, a constant scan, a recursive CTE, …)
    /// of the node `plan`.
    Base { id: Identity, plan: &'p LogicalPlan },
    /// A column of a set operation (`UNION`): each branch may compute it differently.
    Mixed { id: Identity, plan: &'p LogicalPlan },
}

impl<'p> Origin<'p> {
    /// The node where the value is defined, and its index there.
    fn node(&self) -> (&'p LogicalPlan, usize) {
        match self {
            Origin::Derived { plan, id, .. }
            | Origin::Base { plan, id }
            | Origin::Mixed { plan, id } => (plan, id.1),
            Origin::Aggregated { plan, idx, .. } => (plan, *idx),
        }
    }

    fn id(&self) -> Option<Identity> {
        match self {
            Origin::Derived { id, .. } | Origin::Base { id, .. } | Origin::Mixed { id, .. } => {
                Some(*id)
            }
            Origin::Aggregated { plan, idx, .. } => {
                Some((*plan as *const LogicalPlan as usize, *idx))
            }
        }
    }
}

/// The node that defines the value of column `idx` of `plan` (a table
/// scan, a constant scan, the projection that computes it, an aggregate,
/// …), and the value's index there.
pub(crate) fn origin_of(plan: &LogicalPlan, idx: usize) -> Result<(&LogicalPlan, usize)> {
    Ok(trace(plan, idx)?.node())
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
                        plan,
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
                    _ => return Ok(Origin::Base { id, plan }),
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
                    _ => return Ok(Origin::Base { id, plan }),
                }
            }
            LogicalPlan::Window(w) => {
                if idx >= w.input.schema().fields().len() {
                    let name = w.schema.field(idx).name().clone();
                    return Ok(Origin::Aggregated { name, plan, idx });
                }
                &w.input
            }
            LogicalPlan::Union(_) => return Ok(Origin::Mixed { id, plan }),
            // the parameter rows a gradient table is summed into
            LogicalPlan::Extension(_) => match as_group_join(plan).and_then(|g| g.passes(idx)) {
                Some(rows) => rows,
                None => return Ok(Origin::Base { id, plan }),
            },
            _ => return Ok(Origin::Base { id, plan }),
        };
        plan = next;
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

    /// The input that column `c` of the scope comes from, and its index there.
    fn locate(&self, c: &Column) -> Result<(&'p LogicalPlan, usize)> {
        let mut idx = self.schema.index_of_column(c)?;
        for input in &self.inputs {
            let n = input.schema().fields().len();
            if idx < n {
                return Ok((input, idx));
            }
            idx -= n;
        }
        unreachable!("index within the merged schema")
    }

    /// What the value of column `c` of the scope is made of (see [`parts`]).
    pub(crate) fn parts(&self, c: &Column) -> Result<Vec<Part<'p>>> {
        let (input, idx) = self.locate(c)?;
        parts(input, idx)
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
    /// `__dfgrad_aggregate{k}` (see `crate::reserved`) for the `k`-th returned reference, instead of
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
        let mut variables = Vec::with_capacity(wrt.len());
        for c in wrt {
            if self.schema.has_column(c) {
                let (input, idx) = self.locate(c)?;
                variables.push(Variable {
                    column: c.clone(),
                    node: trace(input, idx)?.node(),
                    parts: parts(input, idx)?,
                });
            }
        }
        let inliner = Inliner {
            scope: self,
            wrt: &wrt_ids,
            variables: &variables,
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

/// A column variable of a marker, for checking what its `f` reads.
struct Variable<'p> {
    column: Column,
    /// The node that defines its value, and its index there.
    node: (&'p LogicalPlan, usize),
    /// What its value is made of.
    parts: Vec<Part<'p>>,
}

struct Inliner<'s, 'p> {
    scope: &'s Scope<'p>,
    wrt: &'s HashMap<Identity, Column>,
    variables: &'s [Variable<'p>],
    /// Variables from outside the rows (see `crate::plan::free_variables`).
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
        self.check_recursive(origin, here)?;
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
                Ok(Transformed::yes(Placeholder::Aggregate.column(k)))
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
            Origin::Derived {
                id, expr, input, ..
            } => match self.scope.visible.get(id) {
                Some(c) => Ok(Transformed::yes(Expr::Column(c.clone()))),
                None => Ok(Transformed::yes(self.inline_definition(expr, input, here)?)),
            },
            Origin::Base { id, .. } | Origin::Mixed { id, .. } => {
                match self.scope.visible.get(id) {
                    Some(c) => Ok(Transformed::yes(Expr::Column(c.clone()))),
                    None => fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "a derived column depends on the variable through `{here}`, which \
                             is not visible where the derivative is taken; select `{here}` in \
                             the subquery, view or CTE that defines the derived column"
                        ),
                    ),
                }
            }
        }
    }

    /// Whether outputs of `plan` are recorded (an Aggregate, in recording mode).
    fn recording(&self, plan: &LogicalPlan) -> bool {
        self.record.is_some() && matches!(plan, LogicalPlan::Aggregate(_) | LogicalPlan::Window(_))
    }

    /// Refuses a column of a recursive CTE (origin `origin`, shown as
    /// `here`) whose value a variable flows into through the CTE's
    /// iterations where forward mode did not follow it, or that
    /// the CTE computes from the rows a variable comes from.
    fn check_recursive(&self, origin: &Origin<'p>, here: &Column) -> Result<()> {
        let Origin::Base { plan, id } = origin else {
            return Ok(());
        };
        let LogicalPlan::RecursiveQuery(r) = plan else {
            return Ok(());
        };
        for v in self.variables {
            let (node, at) = v.node;
            let flows = match same_node(node, plan) {
                true => at != id.1 && through_iterations(r, id.1, at)?,
                false => overlaps(&v.parts, &parts(plan, id.1)?),
            };
            if flows {
                return through_recursion(here, &v.column, &r.name);
            }
        }
        for v in self.outer {
            if plan_reads(plan, v)? {
                return through_recursion(here, &outer_name(v), &r.name);
            }
        }
        Ok(())
    }

    /// Refuses the scalar subquery `s` when it reads what a variable is made
    /// of (another scan of the variable's rows).
    fn check_rereads(&self, s: &Subquery) -> Result<()> {
        let read = parts(&s.subquery, 0)?;
        match self.variables.iter().find(|v| overlaps(&v.parts, &read)) {
            Some(v) => rereads(&v.column, &subquery_description(s)),
            None => Ok(()),
        }
    }

    /// Refuses a UNION column when the variable comes from the same UNION.
    fn check_mixed(&self, origin: &Origin, here: &Column) -> Result<()> {
        if let Origin::Mixed { id, .. } = origin {
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
            if let Expr::ScalarSubquery(s) = e {
                self.check_rereads(s)?;
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
                        Origin::Derived {
                            id, expr, input, ..
                        } => Ok(self.wrt.contains_key(id) || self.depends(expr, input)?),
                        Origin::Base { id, .. } => match self.wrt.contains_key(id) {
                            true => Ok(true),
                            false => self.check_recursive(&origin, c).map(|_| false),
                        },
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
    /// this runs (`src/plan/analyzer/subqueries.rs`); one found here (in an aggregate's
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

/// Something values are computed from, to tell whether two plans read the
/// same values: a column of a table (in any scan of it), or output `idx` of
/// a plan node (that node, or one equal to it: a CTE or view is planned
/// again at each reference).
#[derive(Debug, Clone)]
pub(crate) enum Part<'p> {
    /// A table's column, by the table's and the column's names.
    Table(TableReference, String),
    /// Output `idx` of a plan node.
    Node(&'p LogicalPlan, usize),
}

impl Part<'_> {
    fn same(&self, other: &Part) -> bool {
        match (self, other) {
            (Part::Table(t, c), Part::Table(u, d)) => same_table(t, u) && c == d,
            (Part::Node(p, i), Part::Node(q, j)) => i == j && same_node(p, q),
            _ => false,
        }
    }
}

/// Whether `a` and `b` are the same node, or equal ones.
fn same_node(a: &LogicalPlan, b: &LogicalPlan) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// Whether some part of `a` is one of `b`.
pub(crate) fn overlaps(a: &[Part], b: &[Part]) -> bool {
    a.iter().any(|p| b.iter().any(|q| p.same(q)))
}

/// Everything the value of column `idx` of `plan` is computed from (see
/// [`walk`]), itself included: the table columns it reads, and the nodes
/// that define it or a value it reads. A recursive CTE's column is computed
/// from its static term's column and, through the iterations, from every
/// value its recursive term reads (the work table's columns lead back to the
/// CTE's).
pub(crate) fn parts(plan: &LogicalPlan, idx: usize) -> Result<Vec<Part<'_>>> {
    let mut parts = Vec::new();
    let mut recursive: Vec<(&LogicalPlan, &RecursiveQuery)> = Vec::new();
    walk(plan, idx, &mut |node, i| {
        match node {
            LogicalPlan::TableScan(s) => {
                if let Some((r, _)) = recursive.iter().find(|(_, r)| is_work_table(s, r)) {
                    return Ok(vec![(*r, source_index(s, i))]);
                }
                let name = s.projected_schema.field(i).name().clone();
                parts.push(Part::Table(s.table_name.clone(), name));
            }
            LogicalPlan::EmptyRelation(_) => {}
            LogicalPlan::RecursiveQuery(r) => {
                recursive.push((node, r));
                parts.push(Part::Node(node, i));
                return Ok(vec![
                    (r.static_term.as_ref(), i),
                    (r.recursive_term.as_ref(), i),
                ]);
            }
            node => parts.push(Part::Node(node, i)),
        }
        Ok(vec![])
    })?;
    Ok(parts)
}

/// Everything the value of `e` over `input` is computed from (see [`parts`]).
pub(crate) fn expr_parts<'p>(e: &'p Expr, input: &'p LogicalPlan) -> Result<Vec<Part<'p>>> {
    let mut read = Vec::new();
    follow(e, input, &mut read)?;
    let mut all = Vec::new();
    for (plan, idx) in read {
        all.extend(parts(plan, idx)?);
    }
    Ok(all)
}

/// Whether `s` scans the work table of the recursive CTE `r`.
fn is_work_table(s: &TableScan, r: &RecursiveQuery) -> bool {
    s.table_name.table() == r.name
}

/// The index in the scanned table of output `i` of the scan `s`.
fn source_index(s: &TableScan, i: usize) -> usize {
    s.projection.as_ref().map_or(i, |p| p[i])
}

/// A step of [`walk`]: the node and output index to follow next.
type Next<'p> = Vec<(&'p LogicalPlan, usize)>;

/// Calls `visit` once with each node and output index that the value of
/// column `idx` of `plan` is computed from: where [`trace`] stops (a
/// derived column's projection, an aggregate or window, a UNION, a base
/// value) and, below those, the columns their definitions read (a derived
/// column's expression, an aggregate call's arguments, each branch of a
/// UNION, the value of a scalar subquery in a definition; a node of another
/// kind is taken to read all its inputs' columns). `visit` returns more
/// columns to follow. Rows being filtered, joined or grouped by a value do
/// not count: that is piecewise constant.
fn walk<'p>(
    plan: &'p LogicalPlan,
    idx: usize,
    visit: &mut dyn FnMut(&'p LogicalPlan, usize) -> Result<Next<'p>>,
) -> Result<()> {
    let mut seen = HashSet::new();
    let mut todo = vec![(plan, idx)];
    while let Some((plan, idx)) = todo.pop() {
        let origin = trace(plan, idx)?;
        let (node, at) = origin.node();
        if !seen.insert((node as *const LogicalPlan as usize, at)) {
            continue;
        }
        todo.extend(visit(node, at)?);
        match origin {
            Origin::Derived { expr, input, .. } => follow(expr, input, &mut todo)?,
            Origin::Aggregated { plan, idx, .. } => {
                let (calls, input) = match plan {
                    LogicalPlan::Aggregate(a) => (&a.aggr_expr, &a.input),
                    LogicalPlan::Window(w) => (&w.window_expr, &w.input),
                    _ => unreachable!("aggregated values come from aggregates and windows"),
                };
                let first = plan.schema().fields().len() - calls.len();
                match calls.get(idx.wrapping_sub(first)) {
                    Some(call) => follow(call, input, &mut todo)?,
                    None => {
                        for call in calls {
                            follow(call, input, &mut todo)?;
                        }
                    }
                }
            }
            Origin::Mixed { plan, .. } => todo.extend(plan.inputs().into_iter().map(|i| (i, at))),
            Origin::Base { plan, .. } => match plan {
                LogicalPlan::TableScan(_)
                | LogicalPlan::Values(_)
                | LogicalPlan::EmptyRelation(_)
                | LogicalPlan::RecursiveQuery(_) => {}
                LogicalPlan::Aggregate(a) => {
                    for g in &a.group_expr {
                        follow(g, &a.input, &mut todo)?;
                    }
                }
                other => {
                    for input in other.inputs() {
                        todo.extend((0..input.schema().fields().len()).map(|i| (input, i)));
                    }
                }
            },
        }
    }
    Ok(())
}

/// Adds to `todo` the columns of `input` that `e` reads, and the value of
/// each scalar subquery in `e`.
fn follow<'p>(e: &'p Expr, input: &'p LogicalPlan, todo: &mut Next<'p>) -> Result<()> {
    for c in e.column_refs() {
        if let Ok(i) = input.schema().index_of_column(c) {
            todo.push((input, i));
        }
    }
    e.apply(|e| {
        if let Expr::ScalarSubquery(s) = e {
            todo.push((s.subquery.as_ref(), 0));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Whether the value of column `c` of the recursive CTE `r` in a row
/// depends on the value of its column `v` in the same row (`c != v`):
/// a column's value at iteration `k` is computed from the row of iteration
/// `k - 1`, so it depends on `v`'s only where `v`'s is one of those it is
/// computed from: `v` copies a column unchanged (a learning rate carried
/// along is the same value in every row) that flows into `c`, or the static
/// term computes `v`'s and `c`'s first values from the same values.
pub(crate) fn through_iterations(r: &RecursiveQuery, c: usize, v: usize) -> Result<bool> {
    let n = r.schema.fields().len();
    let mut reads = Vec::with_capacity(n);
    let mut copies = Vec::with_capacity(n);
    for i in 0..n {
        reads.push(work_table_reads(r, i)?);
        copies.push(copy_of(r, i)?);
    }
    // What each column's value in the first row is made of.
    let initial = (0..n)
        .map(|i| parts(&r.static_term, i))
        .collect::<Result<Vec<_>>>()?;
    // The columns `c` is computed from `j` iterations back, and the column
    // whose value `j` iterations back is `v`'s (while `v` is a copy).
    let mut from: BTreeSet<usize> = BTreeSet::from([c]);
    let mut same_as_v = v;
    let mut states = HashSet::new();
    // The state repeats within a few steps in practice; past this bound
    // the answer is unknown: refuse.
    for _ in 0..=4 * n * n + 4 {
        // The first row: both values come from the static term.
        if from
            .iter()
            .any(|d| overlaps(&initial[same_as_v], &initial[*d]))
        {
            return Ok(true);
        }
        let Some(next) = copies[same_as_v] else {
            return Ok(false);
        };
        from = from
            .iter()
            .flat_map(|d| reads[*d].iter().copied())
            .collect();
        same_as_v = next;
        if from.contains(&same_as_v) {
            return Ok(true);
        }
        if !states.insert((from.clone(), same_as_v)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The work table columns that column `i` of the recursive term of `r` is
/// computed from.
fn work_table_reads(r: &RecursiveQuery, i: usize) -> Result<BTreeSet<usize>> {
    let mut reads = BTreeSet::new();
    walk(&r.recursive_term, i, &mut |node, j| {
        if let LogicalPlan::TableScan(s) = node {
            if is_work_table(s, r) {
                reads.insert(source_index(s, j));
            }
        }
        Ok(vec![])
    })?;
    Ok(reads)
}

/// The work table column that column `i` of the recursive term of `r`
/// copies unchanged (through casts), if it does.
pub(crate) fn copy_of(r: &RecursiveQuery, i: usize) -> Result<Option<usize>> {
    let (mut plan, mut idx) = (r.recursive_term.as_ref(), i);
    loop {
        let column = match trace(plan, idx)? {
            Origin::Base {
                plan: LogicalPlan::TableScan(s),
                id,
            } if is_work_table(s, r) => return Ok(Some(source_index(s, id.1))),
            Origin::Derived { expr, input, .. } => match unalias(expr) {
                Expr::Cast(c) => (c.expr.as_ref(), input),
                Expr::TryCast(c) => (c.expr.as_ref(), input),
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        match column {
            (Expr::Column(c), input) => (plan, idx) = (input, input.schema().index_of_column(c)?),
            _ => return Ok(None),
        }
    }
}

/// The error for a column `here` that the variable `var` flows into through
/// the iterations of the recursive CTE `name`.
fn through_recursion<T>(here: &dyn Display, var: &dyn Display, name: &str) -> Result<T> {
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "`{here}` is computed from the variable `{var}` through the iterations of the \
             recursive CTE `{name}`, which the derivative cannot follow here: derivatives \
             through recursion follow a variable that the recursive term carries unchanged \
             (a hyperparameter or an initial state), where the CTE's columns that it flows \
             into are visible (select them rather than a derived column of them); or \
             differentiate inside the recursive term, where the variable is a column of the \
             current iteration's row"
        ),
    )
}

/// The error for a variable `var` whose rows `what` reads again.
pub(crate) fn rereads<T>(var: &dyn Display, what: &str) -> Result<T> {
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "{what} reads the rows that the variable `{var}` comes from, so its value depends \
             on `{var}` in the other rows too; the derivative with respect to a table's rows \
             (relational reverse mode) is computed for a loss subquery in a SELECT list over \
             the variable's rows (`SELECT key, grad((SELECT loss FROM s), {var}) FROM …`), \
             not here: compute it there (in a CTE) and aggregate or filter its result"
        ),
    )
}

/// The definition of the column `var` of `node`'s one input where it is
/// computed there or below (a derived column of a CTE or view), not a
/// stored column.
fn derived_definition(node: &LogicalPlan, var: &Column) -> Result<Option<String>> {
    let [input] = node.inputs()[..] else {
        return Ok(None);
    };
    let Some(idx) = input.schema().maybe_index_of_column(var) else {
        return Ok(None);
    };
    Ok(match trace(input, idx)? {
        Origin::Derived { expr, .. } => Some(unalias(expr).to_string()),
        _ => None,
    })
}

/// The error for a variable `var`, a derived column computed as
/// `definition`, that a loss subquery reads through its relation:
/// relational reverse mode differentiates with respect to stored columns.
fn rereads_derived<T>(var: &dyn Display, definition: &str) -> Result<T> {
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "the variable `{var}` is a derived column (computed as `{definition}`) that the \
             loss subquery reads through its relation; the derivative with respect to a \
             table's rows takes a stored column: differentiate with respect to the column it \
             is computed from (the chain rule gives the rest), or store the relation first \
             (CREATE TABLE … AS SELECT …) and differentiate with respect to its column"
        ),
    )
}

/// How an error names the scalar subquery `s`: by the value it computes.
fn subquery_description(s: &Subquery) -> String {
    let value = s.subquery.schema().field(0).name().clone();
    format!("the scalar subquery computing `{value}`")
}

/// Refuses a marker of `node` whose `f` holds a scalar subquery that reads
/// what one of its column variables is made of: the subquery's value
/// depends on the variable in other rows (a correlated subquery that reads
/// the variable only as an outer reference is differentiated inside, see
/// `src/plan/analyzer/subqueries.rs`).
pub(crate) fn refuse_rereads(node: &LogicalPlan) -> Result<()> {
    let exprs = node.expressions();
    let has_subquery = |e: &Expr| e.exists(|e| Ok(matches!(e, Expr::ScalarSubquery(_))));
    if !exprs.iter().any(|e| has_subquery(e).unwrap_or(true)) {
        return Ok(());
    }
    let scope = Scope::new(node.inputs())?;
    for e in &exprs {
        e.apply(|e| {
            let Some(call) = as_marker(e) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            for var in call.wrt_columns() {
                if !scope.schema().has_column(&var) {
                    continue;
                }
                let var_parts = scope.parts(&var)?;
                let derived = derived_definition(node, &var)?;
                call.args[0].apply(|e| {
                    if let Expr::ScalarSubquery(s) = e {
                        if overlaps(&var_parts, &parts(&s.subquery, 0)?) {
                            if let Some(definition) = &derived {
                                return rereads_derived(&var, definition);
                            }
                            return rereads(&var, &subquery_description(s));
                        }
                    }
                    Ok(TreeNodeRecursion::Continue)
                })?;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    Ok(())
}

/// Refuses a marker inside a subquery of `plan` whose variable is a column
/// of the query around it (an outer reference) when the marker's `f` reads,
/// in the subquery, what that column is made of: another scan of the
/// variable's rows.
pub(crate) fn refuse_outer_rereads(plan: &LogicalPlan) -> Result<()> {
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                let subquery = match e {
                    Expr::ScalarSubquery(s) => s,
                    Expr::Exists(x) => &x.subquery,
                    Expr::InSubquery(x) => &x.subquery,
                    _ => return Ok(TreeNodeRecursion::Continue),
                };
                refuse_outer_rereads_in(node, &subquery.subquery)?;
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// [`refuse_outer_rereads`] for the subquery `plan` of the node `holder`.
fn refuse_outer_rereads_in(holder: &LogicalPlan, plan: &LogicalPlan) -> Result<()> {
    let mut scope = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                let Some(call) = as_marker(e) else {
                    return Ok(TreeNodeRecursion::Continue);
                };
                for v in outer_variables(call.kind(), call.args) {
                    let Expr::OuterReferenceColumn(_, c) = &v else {
                        continue;
                    };
                    if scope.is_none() {
                        scope = Some(Scope::new(holder.inputs())?);
                    }
                    let outer = scope.as_ref().expect("set above");
                    if !outer.schema().has_column(c) {
                        // A column of a query further out: checked there.
                        continue;
                    }
                    let var_parts = outer.parts(c)?;
                    let inner = Scope::new(node.inputs())?;
                    for read in call.args[0].column_refs() {
                        if inner.schema().has_column(read)
                            && overlaps(&var_parts, &inner.parts(read)?)
                        {
                            return rereads(c, &format!("the subquery that holds `{e}`"));
                        }
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}
