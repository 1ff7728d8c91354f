//! A relational block: the part of a plan between aggregates, written as
//! one wide relation over its inputs.
//!
//! Projections, filters, aliases, sorts and joins are row-wise: each row of
//! their output is a function of one row of every input they join. So a
//! block's output rows are the rows of the join of its *leaves* (kept by the
//! filters and join conditions), and each output column is an expression
//! over the leaves' columns ([`Alternative::outputs`], with the projections
//! inlined). A `UNION ALL` is distributed: its block is several
//! alternatives, one per branch (and per combination of branches under a
//! join).
//!
//! A leaf is a subtree the backward pass treats as a whole: a scan of the
//! parameter relation, an aggregate (the next block down), an uncorrelated
//! scalar subquery, or anything that does not read the parameter rows
//! (data, constant with respect to them) other than an inner join, whose
//! inputs are leaves. Each leaf is renamed
//! `__dfgrad_leaf{k}.__dfgrad_c{i}`, so that two scans of one table never
//! clash, and carries `__dfgrad_present`, NULL where an outer join padded
//! it.
//!
//! An operator the backward pass has no transpose for (a window, a
//! `LIMIT`, `DISTINCT`, a recursive CTE, …) that reads the parameter rows is
//! refused with a typed error naming it.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::{
    lit, Expr, Filter, Join, JoinConstraint, JoinType, LogicalPlan, Projection, SubqueryAlias,
};

use crate::error::{fail, ErrorKind};
use crate::plan::same_table;
use crate::plan::shared::{share, shared_input, unshared};
use crate::plan::unalias;
use crate::reserved::{leaf_qualifier, Placeholder, PRESENT};

/// What a leaf of a block is to the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeafKind {
    /// A scan of the parameter relation.
    Parameter,
    /// An aggregate that reads the parameter rows: the next block down.
    Aggregate,
    /// An uncorrelated scalar subquery that reads the parameter rows.
    Subquery,
    /// A subtree that does not read the parameter rows.
    Data,
}

/// One input of a block.
#[derive(Debug, Clone)]
pub(super) struct Leaf {
    /// Its qualifier in the block's rows.
    pub qualifier: TableReference,
    /// The subtree, as in the forward plan.
    pub plan: Arc<LogicalPlan>,
    /// What it is to the backward pass.
    pub kind: LeafKind,
}

impl Leaf {
    /// Its column `i` in the block's rows.
    pub fn column(&self, i: usize) -> Expr {
        Expr::Column(Column::new(
            Some(self.qualifier.clone()),
            Placeholder::LeafColumn.name(i),
        ))
    }

    /// `i` where `c` is column `i` of the leaf qualified `qualifier` (as
    /// [`Leaf::column`] makes it).
    pub fn index_of(qualifier: &TableReference, c: &Column) -> Option<usize> {
        match c.relation.as_ref() == Some(qualifier) {
            true => Placeholder::LeafColumn.index(&Column::new_unqualified(c.name.clone())),
            false => None,
        }
    }

    /// Its column that is NULL where an outer join padded it.
    pub fn present(&self) -> Expr {
        Expr::Column(Column::new(Some(self.qualifier.clone()), PRESENT))
    }
}

/// The rows of one branch of a block, and its output columns over them.
#[derive(Debug, Clone)]
pub(super) struct Alternative {
    /// The join of the leaves, filtered.
    pub rows: LogicalPlan,
    /// The block's output columns, as expressions over `rows`.
    pub outputs: Vec<Expr>,
    /// The leaves joined in `rows` (indexes into [`Blocks::leaves`]).
    pub leaves: Vec<usize>,
}

/// Splits plans into blocks over the leaves it collects.
pub struct Blocks<'a> {
    parameter: &'a LogicalPlan,
    /// Subplans read as data although they read the parameter rows: the
    /// caller accounts for the derivative through them.
    constants: &'a [LogicalPlan],
    /// Every leaf met so far.
    pub(super) leaves: Vec<Leaf>,
}

impl<'a> Blocks<'a> {
    /// Blocks whose parameter relation is `parameter` (a node met again in
    /// the loss's plan wherever it scans the parameter rows).
    pub fn new(parameter: &'a LogicalPlan) -> Self {
        Self {
            parameter,
            constants: &[],
            leaves: Vec::new(),
        }
    }

    /// These blocks, reading the subplans `constants` as data (constant
    /// with respect to the parameter rows, whatever they read): a caller
    /// that differentiates through them in its own way.
    pub fn with_constants(self, constants: &'a [LogicalPlan]) -> Self {
        Self { constants, ..self }
    }

    /// Whether `plan` reads the parameter rows (in a subquery too). A scan
    /// of the parameter table that differs from the variable's (another
    /// projection or filter pushed into it) is refused: its rows could not
    /// be told to be the parameter's, and 0 through it would be wrong.
    pub fn reads(&self, plan: &LogicalPlan) -> Result<bool> {
        let mut found = false;
        plan.apply_with_subqueries(|node| {
            if self.constants.contains(node) {
                return Ok(TreeNodeRecursion::Jump);
            }
            if let (LogicalPlan::TableScan(a), LogicalPlan::TableScan(b)) = (node, self.parameter) {
                if same_table(&a.table_name, &b.table_name) && node != self.parameter {
                    return fail(
                        ErrorKind::NeedsPlanContext,
                        format!(
                            "the loss scans the variable's table `{}` differently from the \
                             variable's own scan `{}` (another projection, filter or limit in \
                             the scan, or another name for the table), so its rows cannot be \
                             matched to the parameter rows",
                            a.table_name, b.table_name
                        ),
                    );
                }
            }
            // A shared subplan is a leaf to DataFusion: looked into here.
            found = node == self.parameter
                || match shared_input(node) {
                    Some(input) => self.reads(input)?,
                    None => false,
                };
            Ok(match found {
                true => TreeNodeRecursion::Stop,
                false => TreeNodeRecursion::Continue,
            })
        })?;
        Ok(found)
    }

    /// The block whose output is `plan`'s, one alternative per `UNION ALL`
    /// branch.
    pub(super) fn flatten(&mut self, plan: &LogicalPlan) -> Result<Vec<Alternative>> {
        if plan == self.parameter {
            return Ok(vec![self.leaf(plan, LeafKind::Parameter)?]);
        }
        if !self.reads(plan)? {
            return match plan {
                // An inner join of data: its inputs are leaves of their own,
                // so that a backward pass can sum over some of them before
                // it meets the others (see `factored`).
                LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => {
                    self.join(j)
                }
                _ => Ok(vec![self.leaf(plan, LeafKind::Data)?]),
            };
        }
        match plan {
            LogicalPlan::Projection(p) => self
                .flatten(&p.input)?
                .into_iter()
                .map(|mut alt| {
                    let outputs = p
                        .expr
                        .iter()
                        .map(|e| self.substitute(unalias(e), p.input.schema(), &mut alt))
                        .collect::<Result<_>>()?;
                    alt.outputs = outputs;
                    Ok(alt)
                })
                .collect(),
            LogicalPlan::Filter(f) => self
                .flatten(&f.input)?
                .into_iter()
                .map(|mut alt| {
                    let predicate = self.substitute(&f.predicate, f.input.schema(), &mut alt)?;
                    alt.rows = LogicalPlan::Filter(Filter::try_new(predicate, Arc::new(alt.rows))?);
                    Ok(alt)
                })
                .collect(),
            LogicalPlan::SubqueryAlias(s) => self.flatten(&s.input),
            LogicalPlan::Sort(s) if s.fetch.is_none() => self.flatten(&s.input),
            LogicalPlan::Union(u) => {
                let mut all = Vec::new();
                for input in &u.inputs {
                    all.extend(self.flatten(input)?);
                }
                Ok(all)
            }
            LogicalPlan::Join(j) => self.join(j),
            LogicalPlan::Aggregate(_) => Ok(vec![self.leaf(plan, LeafKind::Aggregate)?]),
            LogicalPlan::Extension(_) if matches!(unshared(plan), LogicalPlan::Aggregate(_)) => {
                Ok(vec![self.leaf(plan, LeafKind::Aggregate)?])
            }
            other => refuse(other),
        }
    }

    /// The alternatives of a join: every pair of its sides' alternatives.
    fn join(&mut self, j: &Join) -> Result<Vec<Alternative>> {
        let (left_only, right_only) = match j.join_type {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => (false, false),
            JoinType::LeftSemi | JoinType::LeftAnti => (true, false),
            JoinType::RightSemi | JoinType::RightAnti => (false, true),
            JoinType::LeftMark | JoinType::RightMark => {
                return refuse(&LogicalPlan::Join(j.clone()))
            }
        };
        let lefts = self.flatten(&j.left)?;
        let rights = self.flatten(&j.right)?;
        let schema = j.left.schema().join(j.right.schema())?;
        let mut all = Vec::with_capacity(lefts.len() * rights.len());
        for l in &lefts {
            for r in &rights {
                let mut both = Alternative {
                    rows: l.rows.clone(),
                    outputs: [l.outputs.clone(), r.outputs.clone()].concat(),
                    leaves: [l.leaves.clone(), r.leaves.clone()].concat(),
                };
                // Subqueries in the condition join their leaf to the left side.
                let mut on = Vec::with_capacity(j.on.len());
                for (a, b) in &j.on {
                    on.push((
                        self.substitute(a, &schema, &mut both)?,
                        self.substitute(b, &schema, &mut both)?,
                    ));
                }
                let filter = match &j.filter {
                    Some(f) => Some(self.substitute(f, &schema, &mut both)?),
                    None => None,
                };
                both.rows = LogicalPlan::Join(Join::try_new(
                    Arc::new(both.rows),
                    Arc::new(r.rows.clone()),
                    on,
                    filter,
                    j.join_type,
                    JoinConstraint::On,
                    j.null_equality,
                    j.null_aware,
                )?);
                if left_only {
                    both.outputs.truncate(l.outputs.len());
                } else if right_only {
                    both.outputs.drain(..l.outputs.len());
                }
                all.push(both);
            }
        }
        Ok(all)
    }

    /// `plan` as a leaf of its own: its columns renamed, and a
    /// `__dfgrad_present` column.
    fn leaf(&mut self, plan: &LogicalPlan, kind: LeafKind) -> Result<Alternative> {
        let k = self.leaves.len();
        let qualifier = leaf_qualifier(k);
        let mut exprs: Vec<Expr> = plan
            .schema()
            .columns()
            .into_iter()
            .enumerate()
            .map(|(i, c)| Expr::Column(c).alias(Placeholder::LeafColumn.name(i)))
            .collect();
        exprs.push(lit(true).alias(PRESENT));
        // The forward plan's aggregates and subqueries are read again by
        // the pass below them: computed once.
        let input = match kind {
            LeafKind::Aggregate | LeafKind::Subquery => share(plan.clone()),
            LeafKind::Parameter | LeafKind::Data => plan.clone(),
        };
        let projected = Projection::try_new(exprs, Arc::new(input))?;
        let rows = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
            Arc::new(LogicalPlan::Projection(projected)),
            qualifier.clone(),
        )?);
        let leaf = Leaf {
            qualifier,
            plan: Arc::new(plan.clone()),
            kind,
        };
        let outputs = (0..plan.schema().fields().len())
            .map(|i| leaf.column(i))
            .collect();
        self.leaves.push(leaf);
        Ok(Alternative {
            rows,
            outputs,
            leaves: vec![k],
        })
    }

    /// `e`, an expression over `schema` (whose columns are `alt`'s outputs
    /// in order), as an expression over `alt`'s rows. An uncorrelated scalar
    /// subquery becomes a leaf left-joined to the rows (one row, or NULL).
    fn substitute(&mut self, e: &Expr, schema: &DFSchema, alt: &mut Alternative) -> Result<Expr> {
        let outputs = alt.outputs.clone();
        let mut joined = Vec::new();
        let e = e
            .clone()
            .transform_up(|e| match e {
                Expr::Column(c) => match schema.maybe_index_of_column(&c) {
                    Some(i) => Ok(Transformed::yes(outputs[i].clone())),
                    None => Ok(Transformed::no(Expr::Column(c))),
                },
                Expr::OuterReferenceColumn(_, c) => fail(
                    ErrorKind::NeedsPlanContext,
                    format!(
                        "the loss reads the outer column `{c}`; a loss whose plan is correlated \
                         with the query around it cannot be differentiated with respect to a \
                         table's rows: compute it in a CTE or view of its own"
                    ),
                ),
                Expr::ScalarSubquery(s) => {
                    let kind = match self.reads(&s.subquery)? {
                        true => LeafKind::Subquery,
                        false => LeafKind::Data,
                    };
                    let leaf = self.leaf(&s.subquery, kind)?;
                    let column = leaf.outputs[0].clone();
                    joined.push(leaf);
                    Ok(Transformed::yes(column))
                }
                e => Ok(Transformed::no(e)),
            })?
            .data;
        for leaf in joined {
            alt.rows = LogicalPlan::Join(Join::try_new(
                Arc::new(alt.rows.clone()),
                Arc::new(leaf.rows),
                vec![],
                None,
                JoinType::Left,
                JoinConstraint::On,
                datafusion::common::NullEquality::NullEqualsNothing,
                false,
            )?);
            alt.leaves.extend(leaf.leaves);
        }
        Ok(e)
    }
}

/// The error for an operator that reads the parameter rows and has no
/// transpose.
fn refuse<T>(plan: &LogicalPlan) -> Result<T> {
    let what = match plan {
        LogicalPlan::Join(j) => format!("a {} join", j.join_type),
        LogicalPlan::Sort(_) | LogicalPlan::Limit(_) => {
            "LIMIT (a selection of rows by order)".into()
        }
        LogicalPlan::Distinct(_) => "DISTINCT".into(),
        LogicalPlan::Window(_) => "a window function".into(),
        LogicalPlan::RecursiveQuery(_) => "a recursive CTE".into(),
        other => format!("the operator {}", other.display()),
    };
    fail(
        ErrorKind::NeedsPlanContext,
        format!(
            "the loss reads the parameter rows through {what}, which relational reverse mode \
             (the derivative with respect to a table's rows) does not differentiate through; \
             it goes through projections, filters, joins, UNION ALL, GROUP BY aggregates and \
             uncorrelated scalar subqueries"
        ),
    )
}
