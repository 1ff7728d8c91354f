//! The rows of a training loop that reverse mode runs backwards, kept as
//! checkpoints.
//!
//! Reverse mode through a loop whose step aggregates over data
//! ([`super::analyzer`]'s backward recursion) needs, at each backward step
//! from iteration `i`, the loop's row of iteration `i − 1`. Keeping every
//! row costs memory in proportion to the iteration count T. Here the loop
//! is a [`History`] node where the loss reads it: its rows pass through
//! once, and every `datafusion_grad.checkpoint_every`-th iteration's rows
//! are kept (by default about every √(2T)-th, every one of a loop of up
//! to 64 iterations); the backward step reads the
//! row before through a [`PreviousRow`] node, which replays the iterations
//! after the nearest checkpoint when they are not kept — each stretch once,
//! as the backward recursion walks down the iterations. Memory: about 2√T
//! states; time: about one more run of the loop.
//!
//! ```sql
//! SET datafusion_grad.recursion_mode = 'reverse';
//! SET datafusion_grad.checkpoint_every = 0;   -- about every √T-th state kept
//! WITH RECURSIVE train(step, w, w0) AS (
//!   SELECT 0, w0, w0 FROM (SELECT tensor([0.1, -0.2, 0.3], 3) AS w0) i
//!   UNION ALL
//!   SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(dot(w, x) - y, 2), w)), 0.1)), w0
//!   FROM train CROSS JOIN data WHERE step < 1000 GROUP BY step, w, w0)
//! SELECT tensor_avg(grad(power(dot(w, v.x) - v.y, 2), w0))
//! FROM train CROSS JOIN valid v WHERE step = 1000;
//! ```
//!
//! [`SharingPlanner`](crate::physical_planner::SharingPlanner) plans both
//! nodes of one loop over one record of checkpoints
//! ([`HistoryExec`](crate::exec::history::HistoryExec),
//! [`PreviousRowExec`](crate::exec::history::PreviousRowExec)); a planner
//! that does not know them gets the plain join of the rows with the loop's
//! rows from [`plain_histories`].

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{internal_err, Column, DFSchemaRef, NullEquality};
use datafusion::error::Result;
use datafusion::logical_expr::logical_plan::builder::build_join_schema;
use datafusion::logical_expr::{
    lit, Expr, Extension, Join, JoinConstraint, JoinType, LogicalPlan, SubqueryAlias,
    UserDefinedLogicalNodeCore,
};

use super::kit;
use super::shared::fingerprint;
use crate::reserved::{FORWARD, ITERATION_COLUMN, TRAJECTORY_COLUMN};

/// The rows of `lp`, a recursive query whose rows carry their iteration and
/// trajectory, read once and checkpointed (see the [module docs](self)).
pub(crate) fn history(lp: LogicalPlan) -> LogicalPlan {
    LogicalPlan::Extension(Extension {
        node: Arc::new(History {
            fingerprint: fingerprint(&lp),
            schema: Arc::clone(lp.schema()),
            input: Arc::new(lp),
        }),
    })
}

/// The loop a [`History`] node reads, if `plan` is one.
pub(crate) fn as_history(plan: &LogicalPlan) -> Option<&History> {
    match plan {
        LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<History>(),
        _ => None,
    }
}

/// Every row of `rows` (whose unqualified columns `__dfgrad_trajectory` and
/// `__dfgrad_iteration` say where it is) beside the row of the loop's rows
/// `fwd` of the same trajectory and the iteration before, qualified
/// `__dfgrad_forward`: the inner join a backward step reads the loop by,
/// through the checkpoints where `fwd` is a [`History`] node.
pub(crate) fn previous_row(rows: LogicalPlan, fwd: &LogicalPlan) -> Result<LogicalPlan> {
    match as_history(fwd) {
        Some(history) => Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(PreviousRow::try_new(rows, history)?),
        })),
        None => joined(rows, fwd.clone()),
    }
}

/// The loop's rows `fwd`, qualified `__dfgrad_forward`.
fn forward(fwd: Arc<LogicalPlan>) -> Result<LogicalPlan> {
    Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
        fwd, FORWARD,
    )?))
}

/// The inner join of [`previous_row`], written out.
fn joined(rows: LogicalPlan, fwd: LogicalPlan) -> Result<LogicalPlan> {
    let here = |n: &str| -> Result<Expr> {
        let (q, f) = rows.schema().qualified_field_with_unqualified_name(n)?;
        Ok(Expr::Column(Column::from((q, f))))
    };
    let there = |n: &str| Expr::Column(Column::new(Some(FORWARD), n));
    let on = vec![
        (here(TRAJECTORY_COLUMN)?, there(TRAJECTORY_COLUMN)),
        (here(ITERATION_COLUMN)? - lit(1i64), there(ITERATION_COLUMN)),
    ];
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(rows),
        Arc::new(forward(Arc::new(fwd))?),
        on,
        None,
        JoinType::Inner,
        JoinConstraint::On,
        NullEquality::NullEqualsNothing,
        false,
    )?))
}

/// `plan` (without [`super::shared::Shared`] nodes: see
/// [`super::shared::unshare`]) with its [`History`] and [`PreviousRow`]
/// nodes as the plain plans they stand for — the loop, and the loop joined
/// by trajectory and iteration, each computed where it is read — for a
/// planner that does not know them (Ballista's).
pub fn plain_histories(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|p| {
        let LogicalPlan::Extension(e) = &p else {
            return Ok(Transformed::no(p));
        };
        if let Some(h) = e.node.as_any().downcast_ref::<History>() {
            return Ok(Transformed::yes(plain_histories(h.input.as_ref().clone())?));
        }
        match e.node.as_any().downcast_ref::<PreviousRow>() {
            Some(p) => Ok(Transformed::yes(joined(
                p.input.clone(),
                plain_histories(p.history.as_ref().clone())?,
            )?)),
            None => Ok(Transformed::no(p)),
        }
    })
    .map(|t| t.data)
}

/// A loop's rows, read once with checkpoints kept: the logical node of
/// [`history`]. The loop is not an input of the node (a leaf to DataFusion's
/// optimizer, as [`super::shared::Shared`]'s subplan): the planner optimizes
/// and plans it for each read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    fingerprint: u64,
    /// The loop.
    pub(crate) input: Arc<LogicalPlan>,
    pub(crate) schema: DFSchemaRef,
}

/// Hashes the loop's fingerprint only (see [`super::shared::Shared`]).
impl Hash for History {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint.hash(state);
    }
}

impl PartialOrd for History {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for History {
    kit::node_without_expressions!("History", []);

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "History")
    }
}

/// Each row of `input` beside its trajectory's row of the iteration before
/// in a loop's [`History`]: the logical node of [`previous_row`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousRow {
    /// The rows, with their trajectory and iteration.
    pub(crate) input: LogicalPlan,
    /// The loop's fingerprint.
    fingerprint: u64,
    /// The loop (not an input: see [`History`]).
    pub(crate) history: Arc<LogicalPlan>,
    pub(crate) schema: DFSchemaRef,
}

impl PreviousRow {
    fn try_new(input: LogicalPlan, history: &History) -> Result<Self> {
        let schema = Arc::new(build_join_schema(
            input.schema(),
            forward(Arc::clone(&history.input))?.schema(),
            &JoinType::Inner,
        )?);
        Ok(Self {
            input,
            fingerprint: history.fingerprint,
            history: Arc::clone(&history.input),
            schema,
        })
    }
}

impl Hash for PreviousRow {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.input.hash(state);
        self.fingerprint.hash(state);
    }
}

impl PartialOrd for PreviousRow {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.input.partial_cmp(&other.input) {
            Some(Ordering::Equal) => self.history.partial_cmp(&other.history),
            order => order,
        }
    }
}

impl UserDefinedLogicalNodeCore for PreviousRow {
    fn name(&self) -> &str {
        "PreviousRow"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PreviousRow")
    }

    /// The same lookup over a new input (its schema recomputed: the
    /// optimizer may have narrowed it).
    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let Ok([input]) = <[LogicalPlan; 1]>::try_from(inputs) else {
            return internal_err!("PreviousRow takes one input plan");
        };
        if !exprs.is_empty() {
            return internal_err!("PreviousRow takes no expressions");
        }
        let history = History {
            fingerprint: self.fingerprint,
            schema: Arc::clone(self.history.schema()),
            input: Arc::clone(&self.history),
        };
        Self::try_new(input, &history)
    }
}
