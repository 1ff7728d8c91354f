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
//! DataFusion's plan, where its steps measured 1.2-1.4× faster with them.
//! Hash repartitions (joins, grouping) always stay.
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

use super::invariant::{reads_iterations, reads_iterations_here};
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
        let spread = config
            .extensions
            .get::<GradOptions>()
            .is_some_and(|o| o.spread_iterations);
        if spread {
            return Ok(plan);
        }
        rewrite_recursive_terms(plan, &|term| {
            if reads_other_data(&term) {
                return Ok(Transformed::no(term));
            }
            term.transform_up(|n| {
                Ok(match dealt_from_iterations(&n) {
                    Some(input) => Transformed::yes(input),
                    None => Transformed::no(n),
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

/// The input of `plan` where it is a round-robin repartition (order not
/// preserved) of rows read from the work table.
fn dealt_from_iterations(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let r = dealt(plan)?;
    reads_iterations(r.input()).then(|| Arc::clone(r.input()))
}
