//! A gradient table computed as a group join: the parameter rows as the
//! groups, each the sum of the contributions whose identity matches it.
//!
//! The backward pass ends in contributions `(identity, partial)`: many per
//! parameter row (a matrix product's `X` row gets one per output column).
//! Written as relational operators, the gradient table is a `UNION ALL` of
//! every parameter row (with 0, so that rows the loss never reads get 0)
//! and the contributions, a `GROUP BY` of the identity and a check that no
//! identity stands for two parameter rows ([`GroupJoin::plain`]: what the
//! exported SQL and Ballista run). Hash-aggregating all those rows into as
//! many groups as the relation has rows cost more than the forward query.
//!
//! [`GroupJoinExec`](crate::exec::group_join::GroupJoinExec) does it the way a hash join does: it builds a hash
//! table over the parameter rows' identities (failing, typed, on a
//! repeated one), probes it with every partition of the contributions on
//! its own task, each adding into its own vector of sums, and adds those
//! up. Linear in the contributions, no row format, no repartitioning.
//!
//! Where the backward pass summed a partial per parameter row as a
//! contraction whose keys are the rows' identity (a matrix product's
//! `∂/∂X = 2·Y·Wᵀ`: sums keyed by `(n, d)`, each row of `x` meeting one),
//! the sums come with the factor of the row they meet ([`Scaled`](super::Scaled)): the
//! group join looks each sum's row up by its identity, as it looks up any
//! contribution, and adds `factor · sum` — the rows are not joined to the
//! sums first. The factors are columns of the rows it reads
//! (`__dfgrad_factor{i}`, not in its output); the plain form ([`met`])
//! is the join.
//!
//! Where the rows a marker is over are the parameter rows themselves, maybe
//! filtered (a training loop's `FROM train WHERE step < n`), the group
//! join's output is those rows with their gradients ([`GroupJoin::joined`]),
//! not the gradient table joined back to them: the table is still over
//! every parameter row (a repeated identity fails, even one the filter
//! drops), the rows where the filter holds are output, and where it holds
//! on none nothing is summed, as the join of no rows would not read the
//! table.
//!
//! ```sql
//! -- the gradient table of mm_loss with respect to x's rows: one group per row of x
//! SELECT n, d, grad((SELECT loss FROM mm_loss), v) FROM x;
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{internal_err, Column, DFSchema, DFSchemaRef, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::{
    cast, lit, Expr, ExprSchemable, Extension, JoinType, LogicalPlan, LogicalPlanBuilder,
    UserDefinedLogicalNodeCore,
};

use super::backward::{aggregate, rename, sum};
use super::row_check::RowCheck;
use super::Contributions;
use crate::plan::{columns, join_nulls_equal, left_join_by_identity};
use crate::reserved::{Placeholder, GRADIENT};
use crate::rules::num;

/// The gradient table over `rows` (the parameter rows) summed from
/// `contributions` (identity columns `__dfgrad_key{j}`, then
/// `__dfgrad_gradient`) and `scaled`: every row of `rows` with the sum of
/// the non-NULL contributions of its identity (0 if none); see the [module
/// docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GroupJoin {
    /// The rows, then one factor column `__dfgrad_factor{i}` per scaled
    /// sums (not in the output).
    pub(crate) rows: LogicalPlan,
    /// The columns of `rows` that are the identity, in the keys' order.
    pub(crate) identity: Vec<usize>,
    pub(crate) contributions: LogicalPlan,
    /// Sums keyed by the identity (as the contributions are, at most one
    /// row per identity): each row of `rows` that one names gets the
    /// contribution `__dfgrad_factor{i} · sum` (none where either is NULL),
    /// as if met by a join ([`met`]) but without it.
    pub(crate) scaled: Vec<LogicalPlan>,
    /// The factors of `scaled`, over the parameter relation's columns.
    pub(crate) factors: Vec<Expr>,
    /// `None`: `rows` are the identities alone and the output is the
    /// gradient table; else the output is `rows` with the gradient as a
    /// column of this relation, as if joined to the gradient table.
    pub(crate) joined_as: Option<TableReference>,
    /// With `joined_as`, a condition on the rows: only the rows where it
    /// holds are output, as if they were filtered before the join — and
    /// where it holds on none, the gradient table is not computed (as a
    /// join whose rows are none does not read the other side).
    pub(crate) keep: Option<Expr>,
    /// The parameter relation and its identity columns, as messages name them.
    pub(crate) names: (String, Vec<String>),
    pub(crate) schema: DFSchemaRef,
}

impl GroupJoin {
    /// The gradient table of the parameter rows `relation`, told apart by
    /// its columns `identity`, from the `contributions` (none: every row
    /// gets 0), as a logical plan.
    pub fn plan(
        relation: &LogicalPlan,
        identity: &[usize],
        contributions: Contributions,
        names: (&str, &[String]),
    ) -> Result<LogicalPlan> {
        let Contributions { plans, scaled } = contributions;
        let factors: Vec<Expr> = scaled.iter().map(|s| s.factor.clone()).collect();
        let rows = with_factors(relation, keys(relation, identity), &factors)?;
        // the first `width` columns of `rows` are the keys
        let width = identity.len();
        let mut union: Option<LogicalPlanBuilder> = None;
        for c in plans {
            // the keys as the rows have them, the partial as a double
            let mut exprs = Vec::with_capacity(width + 1);
            for (j, e) in columns(&c).into_iter().enumerate() {
                let to = match j < width {
                    true => rows.schema().field(j).data_type().clone(),
                    false => DataType::Float64,
                };
                let name = c.schema().field(j).name().clone();
                exprs.push(match e.get_type(c.schema())? == to {
                    true => e,
                    false => cast(e, to).alias(name),
                });
            }
            let c = LogicalPlanBuilder::from(c).project(exprs)?.build()?;
            union = Some(match union {
                Some(u) => u.union(c)?,
                None => LogicalPlanBuilder::from(c),
            });
        }
        let contributions = match union {
            Some(u) => u.build()?,
            // no contribution: a relation of none
            None => {
                let mut exprs: Vec<Expr> = columns(&rows).into_iter().take(width).collect();
                exprs.push(num(0.0).alias(GRADIENT));
                LogicalPlanBuilder::from(rows.clone())
                    .project(exprs)?
                    .limit(0, Some(0))?
                    .build()?
            }
        };
        let (relation, identity) = names;
        Self {
            identity: (0..width).collect(),
            rows,
            contributions,
            scaled: scaled.into_iter().map(|s| s.sums).collect(),
            factors,
            joined_as: None,
            keep: None,
            names: (relation.to_string(), identity.to_vec()),
            schema: Arc::new(DFSchema::empty()),
        }
        .into_plan()
    }

    /// When `table` is a [`GroupJoin`]'s gradient table and `rows` are the
    /// parameter rows themselves (with the identity in columns
    /// `identity`): `rows` left-joined to the table under the name
    /// `joined_as`, as one group join (no join, no second hash table);
    /// with `keep`, the rows where it holds, as `rows` filtered by it and
    /// left-joined to the table.
    pub fn joined(
        table: &LogicalPlan,
        rows: &LogicalPlan,
        identity: Vec<usize>,
        joined_as: TableReference,
        keep: Option<Expr>,
    ) -> Result<Option<LogicalPlan>> {
        let Some(g) = as_group_join(table) else {
            return Ok(None);
        };
        if g.joined_as.is_some() || identity.len() != g.identity.len() {
            return Ok(None);
        }
        Self {
            rows: with_factors(rows, columns(rows), &g.factors)?,
            identity,
            joined_as: Some(joined_as),
            keep,
            ..g.clone()
        }
        .into_plan()
        .map(Some)
    }

    /// The node as a plan, its schema made from its fields.
    fn into_plan(mut self) -> Result<LogicalPlan> {
        let field = Arc::new(Field::new(GRADIENT, DataType::Float64, false));
        let rows = self.rows.schema();
        let mut fields: Vec<_> = (rows.iter().take(self.visible()))
            .map(|(q, f)| (q.cloned(), Arc::clone(f)))
            .collect();
        fields.push((self.joined_as.clone(), field));
        self.schema = Arc::new(DFSchema::new_with_metadata(
            fields,
            rows.metadata().clone(),
        )?);
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(self),
        }))
    }

    /// The same as plain relational operators: every parameter row with 0
    /// and a row count, `UNION ALL` the contributions, summed per identity,
    /// with the duplicate-rows check where a count is above 1 (and the rows
    /// left-joined to that, when they are joined).
    pub fn plain(&self) -> Result<LogicalPlan> {
        let count = Placeholder::Stat.name(0);
        let mut exprs = keys(&self.rows, &self.identity);
        exprs.extend([num(0.0).alias(GRADIENT), lit(1i64).alias(&count)]);
        let all = LogicalPlanBuilder::from(self.rows.clone()).project(exprs)?;
        let mut all = all;
        let mut contributions = vec![self.contributions.clone()];
        for (i, sums) in self.scaled.iter().enumerate() {
            let factor = Placeholder::Factor.column(i);
            contributions.push(met(&self.rows, &self.identity, sums, factor)?);
        }
        for c in contributions {
            let mut exprs = columns(&c);
            exprs.push(lit(0i64).alias(&count));
            all = all.union(LogicalPlanBuilder::from(c).project(exprs)?.build()?)?;
        }
        let nkeys = self.identity.len();
        let key_columns: Vec<Expr> = (0..nkeys).map(|j| Placeholder::Key.column(j)).collect();
        let summed = aggregate(
            all.build()?,
            key_columns.clone(),
            vec![
                sum(Expr::Column(Column::new_unqualified(GRADIENT))),
                sum(Placeholder::Stat.column(0)),
            ],
        )?;
        let summed = rename(&summed, nkeys, &[GRADIENT, &count])?;
        let mut exprs = key_columns;
        exprs.push(
            self.check()
                .guard(
                    Placeholder::Stat.column(0),
                    Expr::Column(Column::new_unqualified(GRADIENT)),
                    &DataType::Float64,
                )?
                .alias(GRADIENT),
        );
        let table = LogicalPlanBuilder::from(summed).project(exprs)?;
        let Some(joined_as) = &self.joined_as else {
            return table.build();
        };
        let table = table.alias(joined_as.clone())?.build()?;
        let on = keys(&self.rows, &self.identity)
            .into_iter()
            .enumerate()
            .map(|(j, key)| {
                let table_key = Column::new(Some(joined_as.clone()), Placeholder::Key.name(j));
                (key.unalias(), Expr::Column(table_key))
            })
            .collect();
        let rows = match &self.keep {
            Some(keep) => LogicalPlanBuilder::from(self.rows.clone())
                .filter(keep.clone())?
                .build()?,
            None => self.rows.clone(),
        };
        let joined = left_join_by_identity(rows, table, on)?;
        let mut exprs = columns(&self.rows);
        exprs.truncate(self.visible());
        exprs.push(Expr::Column(Column::new(Some(joined_as.clone()), GRADIENT)));
        LogicalPlanBuilder::from(joined).project(exprs)?.build()
    }

    /// The input that output column `idx` is passed on from unchanged (the
    /// same column of the rows), if it is.
    pub fn passes(&self, idx: usize) -> Option<&LogicalPlan> {
        (idx < self.visible()).then_some(&self.rows)
    }

    /// How many of the columns of `rows` are in the output: all but the
    /// factors.
    pub(crate) fn visible(&self) -> usize {
        self.rows.schema().fields().len() - self.scaled.len()
    }

    /// The check that fails on a repeated identity.
    pub(crate) fn check(&self) -> RowCheck {
        RowCheck::identity(&self.names.0, &self.names.1)
    }
}

/// `relation` projected to `exprs` and the factors `factors` (over its
/// columns) as `__dfgrad_factor{i}`; `relation` itself where that is all
/// of it.
fn with_factors(relation: &LogicalPlan, exprs: Vec<Expr>, factors: &[Expr]) -> Result<LogicalPlan> {
    if factors.is_empty() && exprs == columns(relation) {
        return Ok(relation.clone());
    }
    let factors =
        (factors.iter().enumerate()).map(|(i, f)| f.clone().alias(Placeholder::Factor.name(i)));
    LogicalPlanBuilder::from(relation.clone())
        .project(exprs.into_iter().chain(factors))?
        .build()
}

/// The contributions of the sums `sums` (columns `__dfgrad_key{j}`, then
/// `__dfgrad_gradient`) to the rows `rows` told apart by their columns
/// `identity`: each row joined to the sum of its identity (NULL equal to
/// NULL), `factor` (over the rows) times the sum, keyed by the identity.
pub(super) fn met(
    rows: &LogicalPlan,
    identity: &[usize],
    sums: &LogicalPlan,
    factor: Expr,
) -> Result<LogicalPlan> {
    let mut exprs: Vec<Expr> = (0..identity.len())
        .map(|j| {
            Placeholder::Key
                .column(j)
                .alias(Placeholder::JoinKey.name(j))
        })
        .collect();
    exprs.push(
        Expr::Column(Column::new_unqualified(GRADIENT)).alias(Placeholder::Contracted.name(0)),
    );
    let sums = LogicalPlanBuilder::from(sums.clone())
        .project(exprs)?
        .build()?;
    let on = (keys(rows, identity).into_iter().enumerate())
        .map(|(j, key)| (key.unalias(), Placeholder::JoinKey.column(j)))
        .collect();
    let joined = join_nulls_equal(rows.clone(), sums, on, JoinType::Inner)?;
    let mut exprs = keys(rows, identity);
    exprs.push((factor * Placeholder::Contracted.column(0)).alias(GRADIENT));
    LogicalPlanBuilder::from(joined).project(exprs)?.build()
}

/// The identity columns `identity` of `rows` as the keys
/// `__dfgrad_key{j}`.
fn keys(rows: &LogicalPlan, identity: &[usize]) -> Vec<Expr> {
    let schema = rows.schema();
    identity
        .iter()
        .enumerate()
        .map(|(j, &i)| {
            Expr::Column(Column::from(schema.qualified_field(i))).alias(Placeholder::Key.name(j))
        })
        .collect()
}

impl PartialOrd for GroupJoin {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (
            &self.rows,
            &self.identity,
            &self.contributions,
            &self.scaled,
        )
            .partial_cmp(&(
                &other.rows,
                &other.identity,
                &other.contributions,
                &other.scaled,
            ))
    }
}

/// The [`GroupJoin`] node `plan` is, if it is one.
pub(crate) fn as_group_join(plan: &LogicalPlan) -> Option<&GroupJoin> {
    match plan {
        LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<GroupJoin>(),
        _ => None,
    }
}

/// `plan` with every [`GroupJoin`] written as plain operators
/// ([`GroupJoin::plain`]), for a planner (Ballista's) that does not know it.
#[cfg(feature = "ballista")]
pub fn plain_group_joins(plan: LogicalPlan) -> Result<LogicalPlan> {
    use datafusion::common::tree_node::Transformed;
    plan.transform_up_with_subqueries(|p| match as_group_join(&p) {
        Some(g) => Ok(Transformed::yes(g.plain()?)),
        None => Ok(Transformed::no(p)),
    })
    .map(|t| t.data)
}

impl UserDefinedLogicalNodeCore for GroupJoin {
    fn name(&self) -> &str {
        "GroupJoin"
    }

    /// The rows, the contributions, then the scaled sums.
    fn inputs(&self) -> Vec<&LogicalPlan> {
        let mut inputs = vec![&self.rows, &self.contributions];
        inputs.extend(&self.scaled);
        inputs
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    /// The condition on the rows, if any.
    fn expressions(&self) -> Vec<Expr> {
        self.keep.iter().cloned().collect()
    }

    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        if exprs.len() != self.keep.iter().len() || inputs.len() != 2 + self.scaled.len() {
            return internal_err!(
                "GroupJoin takes {} input plans and {} expressions",
                2 + self.scaled.len(),
                self.keep.iter().len()
            );
        }
        let mut inputs = inputs.into_iter();
        Ok(Self {
            rows: inputs.next().expect("rows"),
            contributions: inputs.next().expect("contributions"),
            scaled: inputs.collect(),
            // (An optimizer's rewrite may alias it to its old name.)
            keep: exprs.into_iter().next().map(Expr::unalias),
            ..self.clone()
        })
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GroupJoin: gradient of `{}`'s rows", self.names.0)?;
        match &self.keep {
            Some(keep) => write!(f, ", where {keep}"),
            None => Ok(()),
        }
    }
}
