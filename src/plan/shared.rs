//! Shared subplans: a subplan that a rewrite reads several times, computed
//! once per query.
//!
//! Relational reverse mode ([`crate::plan::reverse`]) reads the forward
//! plan's aggregates again in its backward pass: the loss's value, and each
//! aggregate as a leaf of the block above it and as the rows its adjoints
//! join. Planned as they are, DataFusion would compute each occurrence
//! anew — the whole forward query two or three times. A rewrite marks such
//! a subplan with [`share`] (a [`Shared`] logical node, which holds the
//! subplan without making it an input: the plan stays a DAG, however many
//! blocks read the subplan). When the plan is made physical, the subplan
//! is optimized and planned once, and every [`Shared`] node over an equal
//! subplan becomes a [`SharedExec`] over it and one cache: the first of
//! them to run collects all of the subplan's partitions, and every
//! occurrence reads them. (A relational MLP's backward plan as a tree,
//! each shared subplan repeated at every read, took seconds to plan.)
//!
//! The cache is taken from the query's memory pool. A result that does not
//! fit is not kept, and every occurrence computes its input itself, as
//! without sharing. A subplan that reads the rows of a recursive query's
//! previous iteration ([`super::iterate`]) is kept for one iteration and
//! computed again in the next; any other is kept for the whole query (over
//! the iterations of a recursive query too).
//!
//! [`SharingPlanner`], the query planner installed by [`crate::register`],
//! plans the [`Shared`] nodes; a planner that does not know them gets the
//! plan from [`unshare`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DFSchemaRef, DataFusionError};
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect_partitioned, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use futures::TryStreamExt;

use super::adjoint_loop::AdjointLoopPlanner;
use super::iterate::{iterate_loops, IteratePlanner};
use super::iterations::limit_iterations;
use super::overwrite::OverwritePlanner;
use super::reverse::GroupJoinPlanner;

/// `plan`, marked to be computed once however often the query reads it
/// (see the [module docs](self)). A plan with parameters (`$1`, of a
/// `PREPARE`d statement) is left as it is, read anew where it is read: the
/// node hides its subplan from DataFusion, whose `EXECUTE` would not give
/// them their values there.
pub(crate) fn share(plan: LogicalPlan) -> LogicalPlan {
    if shared_input(&plan).is_some() || has_parameters(&plan) {
        return plan;
    }
    LogicalPlan::Extension(Extension {
        node: Arc::new(Shared {
            schema: Arc::clone(plan.schema()),
            input: Arc::new(plan),
        }),
    })
}

/// Whether `plan` (its subqueries and shared subplans too) has a
/// parameter placeholder (`$1`).
fn has_parameters(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let searched = plan.apply_with_subqueries(|node| {
        found = match shared_input(node) {
            Some(input) => has_parameters(input),
            None => node.expressions().iter().any(|e| {
                e.exists(|e| Ok(matches!(e, Expr::Placeholder(_))))
                    .unwrap_or(true)
            }),
        };
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    found || searched.is_err()
}

/// The subplan `plan` holds if it is a [`Shared`] node.
pub(crate) fn shared_input(plan: &LogicalPlan) -> Option<&LogicalPlan> {
    match plan {
        LogicalPlan::Extension(e) => e
            .node
            .as_any()
            .downcast_ref::<Shared>()
            .map(|s| s.input.as_ref()),
        _ => None,
    }
}

/// The subplan of `plan` if it is a [`Shared`] node, else `plan`.
pub(crate) fn unshared(plan: &LogicalPlan) -> &LogicalPlan {
    shared_input(plan).unwrap_or(plan)
}

/// `plan` with every [`Shared`] node replaced by its input: the same
/// results, for a planner (Ballista's, an exporter) that does not know the
/// node.
pub fn unshare(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|p| match shared_input(&p) {
        // Its subplan is not a child of the node: unshared on its own.
        Some(input) => Ok(Transformed::yes(unshare(input.clone())?)),
        None => Ok(Transformed::no(p)),
    })
    .map(|t| t.data)
}

/// A subplan computed once per query: the logical node of [`share`].
///
/// The subplan is not an input of the node (a leaf to DataFusion's
/// optimizer): the plan of a backward pass reads one shared subplan from
/// many places, and as a child it would be optimized and planned once per
/// read. [`SharingPlanner`] optimizes and plans it once per query.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shared {
    input: Arc<LogicalPlan>,
    /// The input's schema.
    schema: DFSchemaRef,
}

impl PartialOrd for Shared {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for Shared {
    fn name(&self) -> &str {
        "Shared"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Shared")
    }

    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        match exprs.is_empty() && inputs.is_empty() {
            true => Ok(self.clone()),
            false => internal_err!("Shared has no inputs and no expressions"),
        }
    }
}

/// The query planner installed by [`crate::register`]: DataFusion's, with
/// [`Shared`] nodes planned as [`SharedExec`]s, one cache per equal input
/// in each plan, and recursive queries that read their work table more
/// than once run by [`super::iterate`].
#[derive(Debug, Default)]
pub struct SharingPlanner;

#[async_trait]
impl QueryPlanner for SharingPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let caches = Arc::new(Caches::default());
        let plan = iterate_loops(logical_plan.clone())?;
        let plan = DefaultPhysicalPlanner::with_extension_planners(vec![
            caches,
            Arc::new(IteratePlanner),
            Arc::new(AdjointLoopPlanner),
            Arc::new(OverwritePlanner),
            Arc::new(GroupJoinPlanner),
        ])
        .create_physical_plan(&plan, session)
        .await?;
        limit_iterations(plan)
    }
}

/// The shared subplans of one physical plan, by their logical plan: each
/// optimized and planned once, with its cache.
#[derive(Debug, Default)]
struct Caches(Mutex<HashMap<LogicalPlan, Planned>>);

/// A shared subplan, planned, and its cache.
type Planned = (Arc<dyn ExecutionPlan>, Arc<Cache>);

#[async_trait]
impl ExtensionPlanner for Caches {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(shared) = node.as_any().downcast_ref::<Shared>() else {
            return Ok(None);
        };
        let known = self
            .0
            .lock()
            .expect("caches lock")
            .get(&shared.input)
            .cloned();
        let (input, cache) = match known {
            Some(known) => known,
            None => {
                // Planned with `planner`, so that the shared subplans in it
                // are planned into these caches too.
                let optimized = iterate_loops(session.optimize(&shared.input)?)?;
                let input = planner.create_physical_plan(&optimized, session).await?;
                let mut caches = self.0.lock().expect("caches lock");
                let entry = caches
                    .entry(shared.input.as_ref().clone())
                    .or_insert_with(|| (input, Arc::default()));
                (Arc::clone(&entry.0), Arc::clone(&entry.1))
            }
        };
        Ok(Some(Arc::new(SharedExec::new(input, cache))))
    }
}

/// The batches of every partition of a shared input, and the memory they
/// hold in the pool (`None`: too large to keep).
type Cached = Option<(Vec<Vec<RecordBatch>>, MemoryReservation)>;

/// A shared input's result, computed by the first occurrence that runs.
type Pending =
    SharedFuture<BoxFuture<'static, std::result::Result<Arc<Cached>, Arc<DataFusionError>>>>;

/// What the occurrences of one shared input have in common: its result,
/// and the iteration it was computed in (see [`SharedExec::per_iteration`]).
#[derive(Debug, Default)]
struct Cache(Mutex<Option<(u64, Pending)>>);

impl Cache {
    /// The result of `input` in `iteration`, computed on its first call; an
    /// input computed in an earlier iteration is reset and computed again.
    fn get(
        &self,
        input: &Arc<dyn ExecutionPlan>,
        context: &Arc<TaskContext>,
        iteration: u64,
    ) -> Result<Pending> {
        let mut slot = self.0.lock().expect("cache lock");
        if let Some((computed_in, pending)) = slot.as_ref() {
            if *computed_in == iteration {
                return Ok(pending.clone());
            }
        }
        let input = match iteration {
            0 => Arc::clone(input),
            // A join's build side and the like are kept in the plan's
            // state: reset, as the recursion resets its own term.
            _ => reset_plan_states(Arc::clone(input))?,
        };
        let context = Arc::clone(context);
        let pending = async move {
            let partitions = collect_partitioned(input, Arc::clone(&context)).await?;
            let size = partitions
                .iter()
                .flatten()
                .map(RecordBatch::get_array_memory_size)
                .sum();
            let reservation = MemoryConsumer::new("SharedExec").register(context.memory_pool());
            Ok(Arc::new(match reservation.try_grow(size) {
                Ok(()) => Some((partitions, reservation)),
                Err(_) => None,
            }))
        }
        .map(|r: Result<Arc<Cached>>| r.map_err(Arc::new))
        .boxed()
        .shared();
        *slot = Some((iteration, pending.clone()));
        Ok(pending)
    }
}

/// One occurrence of a shared input: its input's partitions as the first
/// occurrence to run computed them (see the [module docs](self)). The
/// input, optimized and planned once per query, is not a child of the
/// node, so that the optimizers of the plan around it do not walk it again
/// at every occurrence; EXPLAIN names its root ([`SharedExec::input`] is
/// the whole of it).
#[derive(Debug)]
pub struct SharedExec {
    input: Arc<dyn ExecutionPlan>,
    cache: Arc<Cache>,
    /// The iteration counters of the recursive queries whose previous rows
    /// the input reads: it is computed again in each iteration.
    iterations: Vec<Arc<AtomicU64>>,
}

impl SharedExec {
    fn new(input: Arc<dyn ExecutionPlan>, cache: Arc<Cache>) -> Self {
        Self {
            input,
            cache,
            iterations: Vec::new(),
        }
    }

    /// The shared input (the same plan at every occurrence).
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// This occurrence over `input`, the same subplan reading the rows of a
    /// recursive query's previous iteration, which `iteration` counts: kept
    /// for one iteration, shared by the occurrences that read it then (the
    /// same cache as this one's).
    pub(crate) fn per_iteration(
        &self,
        input: Arc<dyn ExecutionPlan>,
        iteration: &Arc<AtomicU64>,
    ) -> Self {
        let mut iterations = self.iterations.clone();
        iterations.push(Arc::clone(iteration));
        Self {
            input,
            cache: Arc::clone(&self.cache),
            iterations,
        }
    }

    /// Whether the input reads the rows of a recursive query's previous
    /// iteration (and is computed again in each iteration).
    pub(crate) fn reads_iterations(&self) -> bool {
        !self.iterations.is_empty()
    }

    /// The iteration the recursive queries around are in (0 outside any).
    fn iteration(&self) -> u64 {
        let counts = self.iterations.iter().map(|i| i.load(Ordering::Acquire));
        counts.fold(0, u64::wrapping_add)
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedExec: input={}", self.input.name())
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => internal_err!("SharedExec has no children"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let iteration = self.iteration();
        let pending = self.cache.get(&self.input, &context, iteration)?;
        let input = Arc::clone(&self.input);
        let stream = futures::stream::once(async move {
            let cached = pending.await.map_err(DataFusionError::Shared)?;
            Ok::<SendableRecordBatchStream, DataFusionError>(match cached.as_ref() {
                Some((batches, _)) => {
                    let batches = batches[partition].clone();
                    let schema = input.schema();
                    Box::pin(RecordBatchStreamAdapter::new(
                        schema,
                        futures::stream::iter(batches.into_iter().map(Ok)),
                    ))
                }
                // Not kept: computed here (reset, as in Cache::get).
                None if iteration > 0 => reset_plan_states(input)?.execute(partition, context)?,
                None => input.execute(partition, context)?,
            })
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Float64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::error::Result;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::execution::TaskContext;
    use datafusion::physical_plan::{collect, ExecutionPlan};

    use super::{Cache, SharedExec};

    /// Two occurrences of one input over `context`: each one's rows, and
    /// whether the cache kept them.
    async fn both(context: TaskContext) -> Result<(Vec<usize>, bool)> {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Float64, false)]));
        let values = Float64Array::from_iter_values((0..1000).map(f64::from));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)])?;
        let input: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[vec![batch.clone()], vec![batch]], schema, None)?;
        let cache = Arc::new(Cache::default());
        let context = Arc::new(context);
        let mut rows = Vec::new();
        for _ in 0..2 {
            let exec = Arc::new(SharedExec::new(Arc::clone(&input), Arc::clone(&cache)));
            let batches = collect(exec, Arc::clone(&context)).await?;
            rows.push(batches.iter().map(RecordBatch::num_rows).sum());
        }
        let (_, pending) = cache.0.lock().unwrap().clone().expect("computed");
        let kept = pending
            .await
            .map_err(datafusion::error::DataFusionError::Shared)?;
        Ok((rows, kept.is_some()))
    }

    #[tokio::test]
    async fn every_occurrence_reads_the_input_computed_once() -> Result<()> {
        let (rows, kept) = both(TaskContext::default()).await?;
        assert_eq!(rows, [2000, 2000]);
        assert!(kept);
        Ok(())
    }

    #[tokio::test]
    async fn an_input_too_large_for_the_memory_pool_is_computed_by_each_occurrence() -> Result<()> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(1024, 1.0)
            .build_arc()?;
        let (rows, kept) = both(TaskContext::default().with_runtime(runtime)).await?;
        assert_eq!(rows, [2000, 2000]);
        assert!(!kept);
        Ok(())
    }
}
