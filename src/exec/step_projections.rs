//! A recursive term's stacked projections evaluated by one operator.
//!
//! DataFusion's `RecursiveQueryExec` executes its recursive term anew for
//! every iteration, and DataFusion 55's `ProjectionExec::execute` names a
//! metric after every expression it evaluates (each expression formatted as
//! SQL, twice) before it evaluates anything. A loop's step is often one row
//! and a few expressions, so naming them costs more than evaluating them;
//! forward mode through a loop stacks several projections (the shared
//! subexpressions of the tangents' updates, bound one projection at a time,
//! see [`crate::engine::share`]) with long expressions, and the naming came to
//! 30% of a 1,000-step simulation with one tangent (measured with `perf`).
//!
//! [`StepProjections`], a physical optimizer rule, replaces every chain of
//! `ProjectionExec`s in a recursive term by one [`StepProjectionExec`], which
//! evaluates the chain's stages on each batch in turn: the same expressions
//! on the same arrays, so the same results, bit for bit.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::kit;
use super::rewrite_recursive_terms;

/// The physical optimizer rule (see the [module docs](self); registered by
/// [`crate::register`], after DataFusion's rules and ours).
#[derive(Debug, Default)]
pub struct StepProjections;

impl PhysicalOptimizerRule for StepProjections {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        rewrite_recursive_terms(plan, &|term| {
            term.transform_down(|node| {
                Ok(match StepProjectionExec::fuse(&node) {
                    Some(fused) => Transformed::yes(fused),
                    None => Transformed::no(node),
                })
            })
        })
    }

    fn name(&self) -> &str {
        "StepProjections"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// One projection of a chain: its expressions and the schema of its rows.
#[derive(Debug)]
struct Stage {
    exprs: Vec<ProjectionExpr>,
    schema: SchemaRef,
}

impl Stage {
    /// The stage's rows computed from `batch`.
    fn project(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let n = batch.num_rows();
        let arrays = self
            .exprs
            .iter()
            .map(|e| e.expr.evaluate(batch)?.into_array(n))
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            arrays,
            &options,
        )?)
    }
}

/// A chain of projections evaluated in one operator, innermost stage first
/// (see the [module docs](self)).
#[derive(Debug)]
pub struct StepProjectionExec {
    input: Arc<dyn ExecutionPlan>,
    stages: Arc<[Stage]>,
    /// The outermost projection's properties.
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StepProjectionExec {
    /// The chain of projections that starts at `node`, as one operator.
    fn fuse(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        let top = node.downcast_ref::<ProjectionExec>()?;
        let mut stages = Vec::new();
        let mut input = node;
        while let Some(p) = input.downcast_ref::<ProjectionExec>() {
            stages.push(Stage {
                exprs: p.expr().to_vec(),
                schema: p.schema(),
            });
            input = p.input();
        }
        stages.reverse();
        Some(Arc::new(Self {
            input: Arc::clone(input),
            stages: stages.into(),
            properties: Arc::clone(top.properties()),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    /// The properties of this chain of projections over `input`.
    fn properties_over(&self, input: &Arc<dyn ExecutionPlan>) -> Result<Arc<PlanProperties>> {
        let mut plan = Arc::clone(input);
        for stage in self.stages.iter() {
            plan = Arc::new(ProjectionExec::try_new(stage.exprs.clone(), plan)?);
        }
        Ok(Arc::clone(plan.properties()))
    }
}

impl DisplayAs for StepProjectionExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StepProjectionExec: ")?;
        for (i, stage) in self.stages.iter().enumerate() {
            let exprs = stage.exprs.iter();
            let exprs: Vec<String> = exprs
                .map(|e| format!("{} as {}", e.expr, e.alias))
                .collect();
            let separator = if i == 0 { "" } else { ", then " };
            write!(f, "{separator}[{}]", exprs.join(", "))?;
        }
        Ok(())
    }
}

impl StepProjectionExec {
    /// The same stages over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        // The properties stay where the input's did (a reset for
        // the next iteration); otherwise the chain computes them.
        let properties = match Arc::ptr_eq(input.properties(), self.input.properties()) {
            true => Arc::clone(&self.properties),
            false => self.properties_over(&input)?,
        };
        Ok(Self {
            input,
            stages: Arc::clone(&self.stages),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl ExecutionPlan for StepProjectionExec {
    kit::one_input!("StepProjectionExec");
    kit::own_properties!();
    kit::own_metrics!();

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let mut recursion = TreeNodeRecursion::Continue;
        for e in self.stages.iter().flat_map(|s| &s.exprs) {
            recursion = recursion.visit_sibling(|| f(&e.expr))?;
        }
        Ok(recursion)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let stages = Arc::clone(&self.stages);
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let stream = input.map(move |batch| {
            let timer = metrics.elapsed_compute().timer();
            let mut batch = batch?;
            for stage in stages.iter() {
                batch = stage.project(&batch)?;
            }
            timer.done();
            metrics.record_output(batch.num_rows());
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}
