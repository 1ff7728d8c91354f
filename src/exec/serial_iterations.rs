//! The rows a recursive query's iterations pass on, kept in their
//! partitions instead of dealt round-robin every iteration.
//!
//! DataFusion spreads the one partition of a recursive term's work table
//! over `target_partitions` with a round-robin `RepartitionExec`, planned
//! anew for every iteration. For the small states loops usually carry (a
//! simulation's row, a training loop's parameters) that costs more than the
//! work it spreads: each iteration starts the repartition's tasks and
//! channels (measured on 2 cores: a 1,000-step simulation 2.6× slower, a
//! 64 KiB tensor state 3,000 steps 2.7× slower, and in plain DataFusion 55 a
//! 200,000-row state 300 steps 3.8× slower). [`SerialIterations`], a physical optimizer
//! rule, removes the round-robin repartitions of the work table's rows from
//! every recursive term that reads nothing else (a simulation, a row-wise
//! loop); a loop that also reads data (a training loop over a table) keeps
//! DataFusion's plan, where its steps measured 1.2-1.4× faster with them —
//! except the rows of a backward recursion's step beside their loop's rows
//! ([`super::history`]'s `PreviousRowExec`): a few wide rows per step.
//! Hash repartitions (joins, grouping) always stay.
//!
//! The rule also removes the round-robin repartition DataFusion puts *above*
//! a recursive query, dealing its output rows to the operators over it:
//! with it, a loop's memory grew with its iteration count however few rows
//! the query returned (measured on 2 cores, a 10,000-element tensor state:
//! 235 MiB peak at 1,000 steps and 393 MiB at 2,000 for the loop alone, 478
//! and 869 MiB for its reverse-mode gradient, against 79-91 MiB at either
//! count in one partition). Without it the operators over the loop read its
//! rows as they come, and a loop's peak memory is its states (and, in
//! reverse mode, about √T kept states), not its iterations.
//!
//! ```sql
//! SET datafusion_grad.spread_iterations = true; -- DataFusion's plan
//! ```

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::ExecutionPlan;

use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;

use super::history::PreviousRowExec;
use super::iterate::IterateExec;
use super::loop_invariant::{reads_iterations, reads_iterations_here};
use super::{dealt, rewrite_recursive_terms};
use crate::options::GradOptions;

/// The physical optimizer rule (see the [module docs](self); registered by
/// [`crate::register`]; off with
/// `SET datafusion_grad.spread_iterations = true`).
#[derive(Debug, Default)]
pub struct SerialIterations;

impl PhysicalOptimizerRule for SerialIterations {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = plan
            .transform_up(|n| {
                Ok(match dealt_loop_output(&n) {
                    Some(input) => Transformed::yes(input),
                    None => Transformed::no(n),
                })
            })?
            .data;
        let spread = GradOptions::setting(config, |o| o.spread_iterations);
        if spread {
            return Ok(plan);
        }
        rewrite_recursive_terms(plan, &|term| {
            let reads_data = reads_other_data(&term);
            term.transform_up(|n| {
                Ok(match dealt_from_iterations(&n) {
                    Some(input) if !reads_data || looks_up_loop_rows(&input) => {
                        Transformed::yes(input)
                    }
                    _ => Transformed::no(n),
                })
            })
        })
    }

    fn name(&self) -> &str {
        "SerialIterations"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether the recursive term `term` reads data besides the previous
/// iteration's rows (a table, a file): a training loop over its data, whose
/// repartitions stay (measured: its steps ran 1.2-1.4x slower without).
fn reads_other_data(term: &Arc<dyn ExecutionPlan>) -> bool {
    term.exists(|n| {
        Ok(n.children().is_empty()
            && !reads_iterations_here(n)
            && n.downcast_ref::<PlaceholderRowExec>().is_none()
            && n.downcast_ref::<EmptyExec>().is_none())
    })
    .expect("the visit does not fail")
}

/// Whether `plan` reads a loop's rows through a [`PreviousRowExec`]: a
/// backward step's few rows, each beside its row of the loop (measured:
/// dealing them round-robin made a backward recursion of 3,000 steps 1.25x
/// slower).
fn looks_up_loop_rows(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.exists(|n| Ok(n.downcast_ref::<PreviousRowExec>().is_some()))
        .expect("the visit does not fail")
}

/// The input of `plan` where it is a round-robin repartition (order not
/// preserved) of a recursive query's output rows (through projections and
/// filters).
fn dealt_loop_output(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let input = dealt(plan)?.input();
    let mut below = input;
    loop {
        if below.downcast_ref::<RecursiveQueryExec>().is_some()
            || below.downcast_ref::<IterateExec>().is_some()
        {
            return Some(Arc::clone(input));
        }
        let row_wise = below.downcast_ref::<ProjectionExec>().is_some()
            || below.downcast_ref::<FilterExec>().is_some();
        match below.children().as_slice() {
            [child] if row_wise => below = child,
            _ => return None,
        }
    }
}

/// The input of `plan` where it is a round-robin repartition (order not
/// preserved) of rows read from the work table.
fn dealt_from_iterations(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let r = dealt(plan)?;
    reads_iterations(r.input()).then(|| Arc::clone(r.input()))
}
