//! A bound on the iterations of a recursive query.
//!
//! A recursive query whose recursive term never stops producing rows (a
//! stop condition that is never met) runs until memory is exhausted. With
//! `datafusion_grad.max_iterations` (default 100,000; `0`: no bound) it
//! fails with a typed [`ErrorKind::IterationLimit`] error once an iteration
//! past the bound produces a row:
//!
//! ```sql
//! SET datafusion_grad.max_iterations = 1000000;
//! ```
//!
//! A session may also watch the iterations: an [`IterationProgress`] in its
//! config's extensions is called as each iteration starts (`dfgrad` shows
//! them on stderr when it is a terminal).
//!
//! DataFusion's `RecursiveQueryExec` executes its recursive term once per
//! iteration (after resetting its state): [`limit_iterations`] wraps that
//! term in a [`CountedTermExec`], which counts the executions.
//! [`super::iterate::IterateExec`] and Ballista's client-driven recursion
//! check the same bound with [`IterationLimit`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;

use super::kit;
use crate::error::{ErrorKind, GradError};
use crate::options::GradOptions;

/// The most iterations of a recursive query that may produce rows (`0`:
/// no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationLimit(pub u64);

impl IterationLimit {
    /// The bound set for the session running `context`.
    pub fn of(context: &TaskContext) -> Self {
        Self::from_options(context.session_config().options())
    }

    /// The bound `options` set.
    pub fn from_options(options: &ConfigOptions) -> Self {
        Self(
            options
                .extensions
                .get::<GradOptions>()
                .map_or(GradOptions::default().max_iterations, |o| o.max_iterations),
        )
    }

    /// Fails when iteration `n` (from 1) produced rows past the bound.
    pub fn check(self, n: u64) -> Result<()> {
        match self.0 != 0 && n > self.0 {
            true => Err(GradError::new(
                ErrorKind::IterationLimit,
                format!(
                    "the recursive query was still producing rows after {} iterations \
                     (datafusion_grad.max_iterations); check its stop condition, or raise \
                     the bound with SET datafusion_grad.max_iterations = N (0: no bound)",
                    self.0
                ),
            )
            .into()),
            false => Ok(()),
        }
    }
}

/// What an [`IterationProgress`] is told as an iteration of a recursive
/// query starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iteration {
    /// The iteration's number, from 1.
    pub number: u64,
    /// The rows the iterations before it produced, in all (the static
    /// term's rows not counted).
    pub rows: u64,
}

/// A watcher of recursive queries, set as a session config extension
/// (`SessionConfig::with_extension`): called as each iteration of a
/// recursive query starts.
#[derive(Clone)]
pub struct IterationProgress(pub Arc<dyn Fn(Iteration) + Send + Sync>);

impl fmt::Debug for IterationProgress {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("IterationProgress")
    }
}

impl IterationProgress {
    /// Tells the watcher of the session running `context`, if it has one,
    /// that `iteration` starts.
    pub fn report(context: &TaskContext, iteration: Iteration) {
        if let Some(progress) = context
            .session_config()
            .get_extension::<IterationProgress>()
        {
            (progress.0)(iteration);
        }
    }
}

/// `plan` with the recursive term of every `RecursiveQueryExec` in it
/// counted against the session's bound.
pub fn limit_iterations(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if node.downcast_ref::<RecursiveQueryExec>().is_none() {
            return Ok(Transformed::no(node));
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        let [static_term, recursive_term] = <[_; 2]>::try_from(children)
            .or_else(|_| internal_err!("RecursiveQueryExec has two children"))?;
        let counted = Arc::new(CountedTermExec {
            input: recursive_term,
            executions: Arc::new(AtomicU64::new(0)),
            rows: Arc::new(AtomicU64::new(0)),
        });
        Ok(Transformed::yes(replace_children_if_necessary(
            node,
            vec![static_term, counted],
        )?))
    })
    .map(|t| t.data)
}

/// A recursive term that counts its executions (one per iteration; the
/// count is shared by the copies made when its state is reset) and their
/// rows, and fails the first one past the session's bound that produces a
/// row.
#[derive(Debug)]
pub struct CountedTermExec {
    input: Arc<dyn ExecutionPlan>,
    executions: Arc<AtomicU64>,
    rows: Arc<AtomicU64>,
}

impl CountedTermExec {
    /// The same count over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            input,
            executions: Arc::clone(&self.executions),
            rows: Arc::clone(&self.rows),
        })
    }
}

kit::display_name!(CountedTermExec);

impl ExecutionPlan for CountedTermExec {
    kit::one_input!("CountedTermExec");
    kit::input_properties!();
    kit::no_expressions!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let limit = IterationLimit::of(&context);
        let n = self.executions.fetch_add(1, Ordering::AcqRel) + 1;
        let rows = Arc::clone(&self.rows);
        let iteration = Iteration {
            number: n,
            rows: rows.load(Ordering::Acquire),
        };
        IterationProgress::report(&context, iteration);
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let stream = input.map(move |batch| {
            let batch = batch?;
            if batch.num_rows() > 0 {
                // Past the bound: fine if this iteration ends the recursion
                // (no rows).
                limit.check(n)?;
                rows.fetch_add(batch.num_rows() as u64, Ordering::AcqRel);
            }
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
