//! The rows a recursive query's iterations pass on, kept in their
//! partitions instead of dealt round-robin every iteration.
//!
//! DataFusion spreads the one partition of a recursive term's work table
//! over `target_partitions` with a round-robin `RepartitionExec`, planned
//! anew for every iteration. For the small states loops usually carry (a
//! simulation's row, a training loop's parameters) that costs more than the
//! work it spreads: each iteration starts the repartition's tasks and
//! channels (measured on 2 cores: a 1,000-step simulation 3.5× slower, a
//! 200,000-row state 300 steps 3.8× slower), and DataFusion 55 keeps memory
//! of every iteration's repartition (a 64 KiB tensor state: 357 MiB after
//! 3,000 steps, 74 MiB without). [`SerialIterations`], a physical optimizer
//! rule, removes from every recursive term the round-robin repartitions of
//! rows that come from the work table; the data a loop reads (the rest of
//! the term) keeps its partitions, and hash repartitions (joins, grouping)
//! stay.
//!
//! ```sql
//! SET datafusion_grad.spread_iterations = true; -- DataFusion's plan
//! ```

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

use super::invariant::reads_iterations;
use super::iterate::IterateExec;
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
        plan.transform_up(|node| {
            let recursive = node.downcast_ref::<RecursiveQueryExec>().is_some()
                || node.downcast_ref::<IterateExec>().is_some();
            if !recursive {
                return Ok(Transformed::no(node));
            }
            let children: Vec<Arc<dyn ExecutionPlan>> =
                node.children().into_iter().cloned().collect();
            let mut changed = false;
            let mut terms = Vec::with_capacity(children.len());
            for (i, child) in children.into_iter().enumerate() {
                // Child 0 is the static term, run once.
                let term = match i {
                    0 => Transformed::no(child),
                    _ => child.transform_up(|n| {
                        Ok(match dealt_from_iterations(&n) {
                            Some(input) => Transformed::yes(input),
                            None => Transformed::no(n),
                        })
                    })?,
                };
                changed |= term.transformed;
                terms.push(term.data);
            }
            match changed {
                true => Ok(Transformed::yes(replace_children_if_necessary(
                    node, terms,
                )?)),
                false => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "SerialIterations"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The input of `plan` where it is a round-robin repartition (order not
/// preserved) of rows read from the work table.
fn dealt_from_iterations(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let r = plan.downcast_ref::<RepartitionExec>()?;
    let round_robin = matches!(r.partitioning(), Partitioning::RoundRobinBatch(_));
    (round_robin && !r.preserve_order() && reads_iterations(r.input()))
        .then(|| Arc::clone(r.input()))
}
