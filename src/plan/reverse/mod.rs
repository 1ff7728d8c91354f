//! Relational reverse mode: the gradient of a loss query with respect to
//! every row of a parameter relation.
//!
//! The loss is a scalar computed by a query: the first column of its one
//! row (a loss query of several rows fails when it is computed, as a
//! scalar subquery does; never an implicit sum). The variable is a column of a relation (a
//! table, CTE or view: the *parameter relation*) that the loss reads, maybe
//! several times and through any plan. The derivative with respect to one
//! row's value is the total derivative of the loss with respect to that
//! value: one backward pass over the loss's plan (child module `backward`), over its
//! blocks of row-wise operators (child module `block`), each relational operator
//! replaced by its transpose (projection: the engine's per-row reverse
//! sweep; filter: the kept rows; join: the partials summed per side's row;
//! GROUP BY aggregates: the group's adjoint sent to its rows by the
//! transpose rules of [`crate::rules::transpose`]; `UNION ALL`: split; a
//! relation read several times: summed). Where a block is two inputs
//! joined and a partial is a product of one factor per input, the partials
//! are summed over the other input first, as a contraction (child module
//! `factored`), without the joined rows.
//!
//! Conditions (`WHERE`, `JOIN … ON`, `CASE`, group keys as groupings) are
//! piecewise constant, as in the scalar rules. A NULL contribution sends no
//! gradient. Parameter rows the loss never reads get 0.
//!
//! The result is a *gradient table*: one row per parameter row, keyed by
//! the row's identity (its other columns, `__dfgrad_key{j}`), with the
//! derivative in `__dfgrad_gradient`, summed from the backward pass's
//! contributions by a group join (child module `group_join`, over the
//! lookup of child module `row_index`). Two parameter rows with the same
//! identity cannot be told apart: the table fails with a typed
//! `invalid_wrt` error when it is computed.
//!
//! ```sql
//! -- ∂loss/∂val for each row of p: 12 and 30
//! WITH p(g, val) AS (VALUES (1, 2.0), (2, 3.0)),
//!      d(g, x) AS (VALUES (1, 1.0), (1, 2.0), (2, 5.0)),
//!      s AS (SELECT sum(d.x * p.val * p.val) AS loss FROM d JOIN p ON p.g = d.g)
//! SELECT p.g, grad((SELECT loss FROM s), p.val) FROM p;
//! ```

mod backward;
mod factored;
// pub for the tests in tests/unit/plan_reverse_block.rs
#[doc(hidden)]
pub mod block;
mod group_join;
mod row_check;

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::decorrelate_predicate_subquery::DecorrelatePredicateSubquery;
use datafusion::optimizer::scalar_subquery_to_join::ScalarSubqueryToJoin;
use datafusion::optimizer::{Optimizer, OptimizerContext, OptimizerRule};

#[cfg(feature = "ballista")]
pub(crate) use backward::inner;
use backward::{Backward, Seed};
pub(crate) use factored::Scaled;
pub(crate) use group_join::plain_group_joins;
pub(crate) use group_join::{as_group_join, GroupJoin};
pub(crate) use row_check::plain_check;
#[cfg(feature = "ballista")]
pub(crate) use row_check::plain_checks;

pub(crate) use row_check::RowCheck;

use crate::error::{fail, ErrorKind};
use crate::plan::shared::share;
use crate::reserved::Placeholder;
use crate::rules::{num, Rules};

/// A column of a parameter relation, differentiated with respect to at
/// every row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parameter<'a> {
    /// The relation (a node the loss's plan holds wherever it reads it).
    pub relation: &'a LogicalPlan,
    /// The variable's column in it.
    pub column: usize,
    /// The columns that tell its rows apart.
    pub identity: &'a [usize],
    /// How messages name the relation and the identity columns.
    pub names: (&'a str, &'a [String]),
}

/// The gradient table of the loss `loss` (its first column; a typed
/// `shape_mismatch` error when it is computed if `loss` has several rows)
/// with respect to `parameter`: columns `__dfgrad_key{j}` (the
/// identity columns, in order) and `__dfgrad_gradient`, one row per
/// parameter row; see the [module docs](self).
pub(crate) fn gradient_table(
    loss: &LogicalPlan,
    parameter: Parameter,
    rules: &Rules,
) -> Result<LogicalPlan> {
    let relation = &share_aggregates(parameter.relation)?;
    let parameter = Parameter {
        relation,
        ..parameter
    };
    let contributions = loss_contributions(loss, parameter, &[], rules)?;
    GroupJoin::plan(
        parameter.relation,
        parameter.identity,
        contributions,
        parameter.names,
    )
}

/// The contributions to a gradient table, whose sums per parameter row
/// are the gradient: relations of columns `__dfgrad_key{j}` (the identity
/// columns) and `__dfgrad_gradient`, a row per read of a parameter row;
/// and sums keyed by the identity that the rows meet, each times a factor
/// of its row ([`Scaled`]).
#[derive(Debug, Default)]
pub(crate) struct Contributions {
    pub plans: Vec<LogicalPlan>,
    pub scaled: Vec<Scaled>,
}

impl Contributions {
    /// Both kinds of `other`'s added.
    pub fn extend(&mut self, other: Contributions) {
        self.plans.extend(other.plans);
        self.scaled.extend(other.scaled);
    }

    /// Every contribution as a relation of rows: the scaled sums met by
    /// the rows of `relation` (the parameter relation, told apart by its
    /// columns `identity`).
    pub fn into_plans(
        self,
        relation: &LogicalPlan,
        identity: &[usize],
    ) -> Result<Vec<LogicalPlan>> {
        let mut plans = self.plans;
        for s in self.scaled {
            plans.push(group_join::met(relation, identity, &s.sums, s.factor)?);
        }
        Ok(plans)
    }
}

/// The contributions to the gradient of the loss `loss` (as for
/// [`gradient_table`]) with respect to `parameter` (its aggregates shared,
/// see [`share_aggregates`]), whose sums per identity are the gradient.
/// `constants` are subplans read as data although they read the parameter
/// rows (the caller adds the derivative through them).
pub(crate) fn loss_contributions(
    loss: &LogicalPlan,
    parameter: Parameter,
    constants: &[LogicalPlan],
    rules: &Rules,
) -> Result<Contributions> {
    let value = loss.schema().field(0);
    if !value.data_type().is_numeric() {
        return fail(
            ErrorKind::UnsupportedType,
            format!(
                "the loss `{}` is of type {}; a loss differentiated with respect to a table's \
                 rows must be numeric",
                value.name(),
                value.data_type()
            ),
        );
    }
    let loss = &shared_loss(loss)?;
    // The loss's adjoint, 1, in a one-row relation that counts the loss's
    // rows and fails on more than one: every contribution reads it, so no
    // gradient of several rows' sum comes out.
    let relation = RowCheck::one_loss_row(loss.clone(), num(1.0), &Placeholder::Adjoint.name(0))?;
    let seed = Seed {
        relation: Some((relation, vec![])),
        terms: vec![(
            Expr::Column(loss.schema().columns()[0].clone()),
            Placeholder::Adjoint.column(0),
        )],
    };
    contributions(loss, &seed, parameter, constants, rules)
}

/// The contributions (as [`loss_contributions`]'s) to the gradient of
/// `Σ ⟨āᵢ, vᵢ⟩` summed over the rows of `plan`, with respect to
/// `parameter`: `terms` are the pairs `(vᵢ, āᵢ)` of expressions over
/// `plan`'s output (each `āᵢ` a constant to the derivative; a tensor pair's
/// product is the sum of the elementwise one).
pub(crate) fn weighted_contributions(
    plan: &LogicalPlan,
    terms: Vec<(Expr, Expr)>,
    parameter: Parameter,
    constants: &[LogicalPlan],
    rules: &Rules,
) -> Result<Contributions> {
    let seed = Seed {
        relation: None,
        terms,
    };
    contributions(&share_aggregates(plan)?, &seed, parameter, constants, rules)
}

/// One backward pass over `plan` from `seed`, its contributions.
fn contributions(
    plan: &LogicalPlan,
    seed: &Seed,
    parameter: Parameter,
    constants: &[LogicalPlan],
    rules: &Rules,
) -> Result<Contributions> {
    let mut backward = Backward::new(
        parameter.relation,
        parameter.column,
        parameter.identity,
        constants,
        rules,
    );
    backward.run(plan, seed)?;
    Ok(backward.contributions)
}

/// The loss query `loss` as the backward pass reads it, and its value is
/// computed from: decorrelated, its aggregates shared (so the value and
/// the gradient tables of one loss read each aggregate once).
pub(crate) fn shared_loss(loss: &LogicalPlan) -> Result<LogicalPlan> {
    share_aggregates(&decorrelated(loss)?)
}

/// `plan` with its correlated subqueries (`EXISTS`, `IN`, scalar ones in
/// a `WHERE`) made into the joins DataFusion's optimizer makes of them:
/// semi and anti joins, and joins to aggregates, which the backward pass
/// transposes. (A correlated subquery's outer columns name the rows of the
/// plan around it, which the backward pass renames.) The rest of `plan`,
/// the parameter relation's scans included, is unchanged.
fn decorrelated(plan: &LogicalPlan) -> Result<LogicalPlan> {
    let rules: Vec<Arc<dyn OptimizerRule + Send + Sync>> = vec![
        Arc::new(DecorrelatePredicateSubquery::new()),
        Arc::new(ScalarSubqueryToJoin::new()),
    ];
    Optimizer::with_rules(rules).optimize(plan.clone(), &OptimizerContext::new(), |_, _| {})
}

/// `plan` with every aggregate in it (in subqueries too) shared
/// ([`crate::plan::shared`]): the backward pass reads the forward plan's
/// aggregates again, and a loss's value, its gradient tables and the
/// statistics of its aggregates are computed from one evaluation of each.
/// The same plan in this form wherever it is met (the rewrite works from
/// the leaves up), so a parameter relation is found in a loss when both are.
pub(crate) fn share_aggregates(plan: &LogicalPlan) -> Result<LogicalPlan> {
    plan.clone()
        .transform_up_with_subqueries(|p| match p {
            LogicalPlan::Aggregate(_) => Ok(Transformed::yes(share(p))),
            p => Ok(Transformed::no(p)),
        })
        .map(|t| t.data)
}

/// Whether `loss` reads the rows of `relation` (a node equal to it).
pub(crate) fn reads(loss: &LogicalPlan, relation: &LogicalPlan) -> Result<bool> {
    block::Blocks::new(relation).reads(loss)
}
