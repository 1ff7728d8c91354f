//! The scheduler's rule that keeps loop-invariant data on the executors
//! ([`super::kept`]).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::ExecutionPlan;

use super::kept::KeptOnExecutorsExec;
use crate::exec::loop_invariant::is_invariant;
use crate::options::GradOptions;

/// In a query the client runs for one iteration of a recursive query (the
/// setting `datafusion_grad.ballista_loop_run` names the run), puts each
/// largest part that reads a file, no in-memory rows (the work table
/// arrives as `VALUES`) and nothing that changes between iterations, and
/// that lies within one Ballista stage, under a [`KeptOnExecutorsExec`]
/// (see [`super::kept`]). Installed in the scheduler's sessions by
/// [`super::session_state`] and [`super::standalone`]; off with
/// `SET datafusion_grad.cache_loop_invariants = false`.
#[derive(Debug, Default)]
pub struct KeepOnExecutors;

impl PhysicalOptimizerRule for KeepOnExecutors {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(options) = config.extensions.get::<GradOptions>() else {
            return Ok(plan);
        };
        if options.ballista_loop_run.is_empty() || !options.cache_loop_invariants {
            return Ok(plan);
        }
        let run = &options.ballista_loop_run;
        plan.transform_down(|node| {
            if !keepable(&node) {
                return Ok(Transformed::no(node));
            }
            let kept = Arc::new(KeptOnExecutorsExec::new(node, run.clone()));
            Ok(Transformed::new(kept, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "KeepOnExecutors"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `plan` reads files only, and computes the same rows in every
/// iteration within one stage: every leaf a file scan (in-memory rows may
/// be the work table), no exchange (a stage boundary), nothing volatile, no
/// dynamic filter made outside it.
fn keepable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut reads_file = false;
    let mut within = true;
    plan.apply(|node| {
        let file = node.downcast_ref::<DataSourceExec>().is_some_and(|source| {
            source
                .data_source()
                .downcast_ref::<MemorySourceConfig>()
                .is_none()
        });
        let exchange = node.downcast_ref::<RepartitionExec>().is_some()
            || node.downcast_ref::<CoalescePartitionsExec>().is_some()
            || node.downcast_ref::<SortPreservingMergeExec>().is_some();
        // every leaf a file scan: in-memory rows may be the work table
        within &= !exchange && (file || !node.children().is_empty());
        reads_file |= file;
        Ok(match within {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    })
    .expect("the visit does not fail");
    reads_file && within && is_invariant(plan)
}
