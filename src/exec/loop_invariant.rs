//! Loop-invariant data of recursive queries, computed once.
//!
//! A training loop's recursive term joins the previous iteration's rows
//! (its parameters) with the data:
//!
//! ```sql
//! WITH RECURSIVE fit(step, w) AS (
//!   SELECT 0, 0.0
//!   UNION ALL
//!   SELECT step + 1, w - 0.5 * grad(avg(power(w * x - y, 2)), w)
//!   FROM fit CROSS JOIN points WHERE step < 20 GROUP BY step, w)
//! SELECT * FROM fit;
//! ```
//!
//! DataFusion executes the recursive term anew in every iteration, so the
//! data side — a Parquet or CSV scan, its filters and projections — is read
//! and decoded again each time (measured at 4–8× the loop over an
//! in-memory table). [`LoopInvariants`], a physical optimizer rule, finds
//! the largest parts of a recursive term that do not read the work table
//! (nor a volatile function such as `random()`, nor a dynamic filter fed by
//! the rest of the plan, nor an unbounded stream) and puts each under a
//! [`LoopInvariantExec`]: the first iteration collects its partitions into
//! memory and every later iteration reads them there.
//!
//! The rows are kept within the query's memory pool: a part that does not
//! fit is not kept, and every iteration computes it again, as without the
//! rule (never an out-of-memory failure). Where the part's rows are
//! unevenly spread over its partitions (a file written as one row group
//! arrives in one partition; so does a table made from it) and nothing
//! above depends on the partitioning, the kept rows are spread evenly over
//! the session's `target_partitions`, so that every core works on them.
//! Otherwise every partition replays exactly its batches: the same results,
//! bit for bit, as computing the part again. A Parquet file of one row group
//! is then also read by every core ([`super::split_scan`]).
//!
//! A hash join with one loop-invariant side builds its hash table over that
//! side once for all iterations too, and a contraction lists such a side
//! once ([`super::kept_join`]). The rule runs after
//! [`Contraction`](super::contraction::Contraction), which needs the joins
//! as DataFusion planned them.
//!
//! ```sql
//! SET datafusion_grad.cache_loop_invariants = false; -- read the data every iteration
//! ```

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::DataFusionError;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::CrossJoinExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use super::iterate::IterationScanExec;
use super::kept_join::keep_build_sides;
use super::kit;
use super::shared::SharedExec;
use super::split_scan::split_file_scans;
use super::{rewrite_down, rewrite_recursive_terms, Visit};
use crate::options::GradOptions;

/// The physical optimizer rule that keeps the loop-invariant parts of
/// recursive terms, and the hash tables of joins over them, across
/// iterations (see the [module docs](self);
/// registered by [`crate::register`]; off with
/// `SET datafusion_grad.cache_loop_invariants = false`).
#[derive(Debug, Default)]
pub struct LoopInvariants;

impl PhysicalOptimizerRule for LoopInvariants {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = GradOptions::setting(config, |o| o.cache_loop_invariants);
        if !enabled {
            return Ok(plan);
        }
        let cores = config.execution.target_partitions.max(1);
        let plan = rewrite_recursive_terms(plan, &move |term| keep_invariants(term, cores, false))?;
        rewrite_recursive_terms(plan, &keep_build_sides)
    }

    fn name(&self) -> &str {
        "LoopInvariants"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` (a part of a recursive term) with its largest loop-invariant
/// parts under [`LoopInvariantExec`]s; `may_widen`: whether nothing above
/// `plan` depends on its number of partitions or on which rows each holds.
fn keep_invariants(
    plan: Arc<dyn ExecutionPlan>,
    cores: usize,
    may_widen: bool,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let visit = |plan: &Arc<dyn ExecutionPlan>, may_widen: bool| {
        Ok(if plan.downcast_ref::<LoopInvariantExec>().is_some() {
            // Kept already (a recursive query inside this one's term).
            Visit::Stop
        } else if !is_invariant(plan) {
            Visit::Descend
        } else if worth_keeping(plan, cores, may_widen) {
            // A file of one row group decoded by every core, not one.
            let plan =
                split_file_scans(plan, cores, may_widen)?.unwrap_or_else(|| Arc::clone(plan));
            Visit::Replace(Arc::new(LoopInvariantExec::new(plan, cores, may_widen)))
        } else {
            Visit::Stop
        })
    };
    rewrite_down(plan, may_widen, &visit, &child_may_widen)
}

/// Whether child `i` of `parent` may get more partitions, or its rows
/// spread otherwise over them: `parent` accepts any partitioning there and
/// passes it on only to a parent that does (`may_widen`).
fn child_may_widen(parent: &Arc<dyn ExecutionPlan>, i: usize, may_widen: bool) -> bool {
    if let Some(r) = parent.downcast_ref::<RepartitionExec>() {
        return !r.preserve_order();
    }
    if parent.downcast_ref::<CoalescePartitionsExec>().is_some() {
        return true;
    }
    if let Some(a) = parent.downcast_ref::<AggregateExec>() {
        return may_widen && matches!(a.mode(), AggregateMode::Partial);
    }
    if parent.downcast_ref::<CrossJoinExec>().is_some() {
        // The left side is collected into one partition; the output has the
        // right side's partitions.
        return may_widen && i == 1;
    }
    may_widen
        && (parent.downcast_ref::<ProjectionExec>().is_some()
            || parent.downcast_ref::<FilterExec>().is_some())
}

/// Whether every iteration of the recursive query computes the same rows
/// from `plan`: it reads no work table, no volatile function and no
/// unbounded input, and each dynamic filter it applies (a join's keys
/// pushed into a scan, changing with the other side) is made within it.
pub(crate) fn is_invariant(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut invariant = true;
    let mut made = HashSet::new();
    let mut applied = HashSet::new();
    plan.apply(|node| {
        invariant = !reads_iterations_here(node) && !node.boundedness().is_unbounded();
        made.extend(
            node.dynamic_expressions_produced()
                .iter()
                .filter_map(|e| e.expression_id()),
        );
        node.apply_expressions(&mut |e| {
            invariant &= !is_volatile(e);
            e.apply(|e| {
                applied.extend(e.expression_id());
                Ok(TreeNodeRecursion::Continue)
            })?;
            Ok(match invariant {
                true => TreeNodeRecursion::Continue,
                false => TreeNodeRecursion::Stop,
            })
        })?;
        Ok(match invariant {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    })
    .expect("the visit does not fail");
    invariant && applied.is_subset(&made)
}

/// Whether `node` itself reads the rows of an iteration: a work table, an
/// iteration scan, or a subplan computed once per iteration.
pub(crate) fn reads_iterations_here(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.downcast_ref::<WorkTableExec>().is_some()
        || node.downcast_ref::<IterationScanExec>().is_some()
        || node
            .downcast_ref::<SharedExec>()
            .is_some_and(SharedExec::reads_iterations)
}

/// Whether `plan` or anything under it reads the rows of an iteration.
pub(crate) fn reads_iterations(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.exists(|node| Ok(reads_iterations_here(node)))
        .expect("the visit does not fail")
}

/// Whether keeping `plan`'s rows saves work: not for rows that are already
/// in memory (a memory table's scan, a placeholder row), unless they lie
/// unevenly over the partitions and may be spread.
fn worth_keeping(plan: &Arc<dyn ExecutionPlan>, cores: usize, may_widen: bool) -> bool {
    if plan.downcast_ref::<EmptyExec>().is_some()
        || plan.downcast_ref::<PlaceholderRowExec>().is_some()
    {
        return false;
    }
    let memory = plan
        .downcast_ref::<DataSourceExec>()
        .and_then(|d| d.data_source().downcast_ref::<MemorySourceConfig>());
    match memory {
        Some(memory) => {
            let spreadable = may_widen || spread_within(plan.properties());
            let rows: Vec<usize> = memory
                .partitions()
                .iter()
                .map(|p| p.iter().map(RecordBatch::num_rows).sum())
                .collect();
            // the partitions LoopInvariantExec::new gives it
            let outputs = match may_widen {
                true => cores.max(rows.len()),
                false => rows.len(),
            };
            spreadable && uneven(&rows, outputs)
        }
        None => true,
    }
}

/// Whether rows may move between the partitions of a plan with
/// `properties` (nothing relies on which rows each holds, nor on their
/// order).
fn spread_within(properties: &PlanProperties) -> bool {
    !matches!(properties.partitioning, Partitioning::Hash(..))
        && properties.output_ordering().is_none()
}

/// Whether `rows` (per partition) lie unevenly over `partitions`: the
/// largest holds over 1.5 times its share, and the rows are enough to be
/// worth several cores (at least two batches).
fn uneven(rows: &[usize], partitions: usize) -> bool {
    let total: usize = rows.iter().sum();
    let largest = rows.iter().copied().max().unwrap_or(0);
    partitions > 1 && total >= 2 * 8192 && largest * 2 * partitions > 3 * total
}

/// The batches of every partition, kept for the whole query, and the
/// memory they hold in the pool.
type Kept = (Arc<Vec<Vec<RecordBatch>>>, Arc<MemoryReservation>);

/// A part's rows as the first iteration collected them (`None`: too large
/// for the memory pool).
type Collected = Option<Arc<Vec<Vec<RecordBatch>>>>;

/// The collection of one execution of a [`LoopInvariantExec`].
type Pending = Shared<BoxFuture<'static, std::result::Result<Collected, Arc<DataFusionError>>>>;

/// Whether a part's rows are kept, across the copies of its node that each
/// iteration's reset makes.
#[derive(Debug, Default)]
enum Store {
    /// Not yet collected (or an earlier collection stopped early).
    #[default]
    Empty,
    /// Being collected by one execution (another one computes its input).
    Collecting,
    /// Collected: every later execution replays them.
    Kept(Kept),
    /// Too large for the memory pool: computed in every iteration.
    TooLarge,
}

/// How one execution (one iteration) of a [`LoopInvariantExec`] gets its
/// rows, decided by its first partition to run.
enum Mode {
    /// From the kept batches.
    Replay(Arc<Vec<Vec<RecordBatch>>>),
    /// From the input, computed again.
    Compute,
    /// From the input, collected by this execution and kept.
    Collect(Pending),
}

/// The loop-invariant part of a recursive term, computed in the first
/// iteration and replayed in every later one (see the
/// [module docs](self)).
pub struct LoopInvariantExec {
    input: Arc<dyn ExecutionPlan>,
    /// Shared by every copy of the node (one per iteration).
    store: Arc<Mutex<Store>>,
    /// This copy's way to its rows, decided when it first runs.
    mode: OnceLock<Mode>,
    /// The input reset for a computation after a failed collection, shared
    /// by this copy's partitions.
    recomputed: OnceLock<Arc<dyn ExecutionPlan>>,
    /// Whether the kept rows may be spread evenly over the partitions.
    spread: bool,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for LoopInvariantExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("LoopInvariantExec")
            .field("input", &self.input.name())
            .field("spread", &self.spread)
            .finish()
    }
}

impl LoopInvariantExec {
    /// The part kept across iterations.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// `input` kept across iterations; `may_widen`: whether its output may
    /// have `cores` partitions where it has fewer.
    fn new(input: Arc<dyn ExecutionPlan>, cores: usize, may_widen: bool) -> Self {
        let input_properties = input.properties();
        let partitions = input_properties.partitioning.partition_count();
        let properties = match may_widen && partitions < cores {
            true => Arc::new(PlanProperties::new(
                EquivalenceProperties::new(input.schema()),
                Partitioning::UnknownPartitioning(cores),
                input_properties.emission_type,
                input_properties.boundedness,
            )),
            false => Arc::clone(input_properties),
        };
        let spread = may_widen || spread_within(input_properties);
        Self::with_store(input, Arc::default(), spread, properties)
    }

    fn with_store(
        input: Arc<dyn ExecutionPlan>,
        store: Arc<Mutex<Store>>,
        spread: bool,
        properties: Arc<PlanProperties>,
    ) -> Self {
        Self {
            input,
            store,
            mode: OnceLock::new(),
            recomputed: OnceLock::new(),
            spread,
            properties,
        }
    }

    /// How this execution gets its rows: decided once, so that all its
    /// partitions read the same way.
    fn mode(&self, context: &Arc<TaskContext>) -> &Mode {
        self.mode.get_or_init(|| {
            let mut store = self.store.lock().expect("store lock");
            match &*store {
                Store::Kept((batches, _)) => Mode::Replay(Arc::clone(batches)),
                Store::TooLarge | Store::Collecting => Mode::Compute,
                Store::Empty => {
                    *store = Store::Collecting;
                    Mode::Collect(self.collect(context))
                }
            }
        })
    }

    /// Collects every partition of the input (each on its own task) within
    /// the memory pool, spread over the output partitions, and keeps them.
    fn collect(&self, context: &Arc<TaskContext>) -> Pending {
        let input = Arc::clone(&self.input);
        let store = Arc::clone(&self.store);
        let context = Arc::clone(context);
        let outputs = self.properties.partitioning.partition_count();
        let spread = self.spread;
        // Made now, so that a collection dropped before it first ran
        // leaves the store empty too.
        let unfinished = Unfinished(Arc::clone(&store));
        async move {
            let _unfinished = unfinished;
            let reservation =
                Arc::new(MemoryConsumer::new("LoopInvariantExec").register(context.memory_pool()));
            let tasks: Vec<_> = (0..input.output_partitioning().partition_count())
                .map(|partition| {
                    let stream = input.execute(partition, Arc::clone(&context));
                    let reservation = Arc::clone(&reservation);
                    SpawnedTask::spawn(
                        async move { collect_partition(stream?, &reservation).await },
                    )
                })
                .collect();
            let mut partitions = Vec::with_capacity(tasks.len());
            let mut fits = true;
            for task in tasks {
                let collected = task
                    .join_unwind()
                    .await
                    .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
                match collected {
                    Some(batches) => partitions.push(batches),
                    None => fits = false,
                }
            }
            let mut store = store.lock().expect("store lock");
            if !fits {
                reservation.free();
                *store = Store::TooLarge;
                return Ok(None);
            }
            let batches = Arc::new(arrange(partitions, outputs, spread)?);
            *store = Store::Kept((Arc::clone(&batches), reservation));
            Ok(Some(batches))
        }
        .map(|r: Result<Collected>| r.map_err(Arc::new))
        .boxed()
        .shared()
    }
}

/// Output partition `partition` computed from `input`: the input's
/// partition of that number (no rows past its partitions).
fn compute(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    match partition < input.output_partitioning().partition_count() {
        true => input.execute(partition, context),
        false => Ok(replay(input.schema(), Vec::new())),
    }
}

/// Held by a collection while it runs: dropped before it finished (its
/// readers stopped early), the store is empty again, for a later iteration
/// to collect.
struct Unfinished(Arc<Mutex<Store>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        let mut store = self.0.lock().expect("store lock");
        if matches!(*store, Store::Collecting) {
            *store = Store::Empty;
        }
    }
}

/// The batches of one input partition, each taken from `reservation`
/// (`None`: the pool had no room for them).
async fn collect_partition(
    mut stream: SendableRecordBatchStream,
    reservation: &MemoryReservation,
) -> Result<Option<Vec<RecordBatch>>> {
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if reservation.try_grow(batch.get_array_memory_size()).is_err() {
            return Ok(None);
        }
        batches.push(batch);
    }
    Ok(Some(batches))
}

/// The collected `partitions` as `outputs` output partitions: as they are
/// (and none past them) unless `spread` allows and they lie unevenly, then
/// their rows in order, cut into even runs (slices: no copy).
fn arrange(
    mut partitions: Vec<Vec<RecordBatch>>,
    outputs: usize,
    spread: bool,
) -> Result<Vec<Vec<RecordBatch>>> {
    let rows: Vec<usize> = partitions
        .iter()
        .map(|p| p.iter().map(RecordBatch::num_rows).sum())
        .collect();
    if !(spread && uneven(&rows, outputs)) {
        partitions.resize_with(outputs.max(partitions.len()), Vec::new);
        return Ok(partitions);
    }
    let total: usize = rows.iter().sum();
    let share = total.div_ceil(outputs);
    let mut arranged = vec![Vec::new(); outputs];
    let mut filled = 0;
    for batch in partitions.into_iter().flatten() {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let target = (filled / share).min(outputs - 1);
            let room = share * (target + 1) - filled;
            let length = room.min(batch.num_rows() - offset);
            arranged[target].push(batch.slice(offset, length));
            offset += length;
            filled += length;
        }
    }
    Ok(arranged)
}

/// A stream of `batches` with `schema`.
pub(crate) fn replay(
    schema: datafusion::arrow::datatypes::SchemaRef,
    batches: Vec<RecordBatch>,
) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(batches.into_iter().map(Ok)),
    ))
}

impl DisplayAs for LoopInvariantExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "LoopInvariantExec: partitions={}",
            self.properties.partitioning.partition_count()
        )
    }
}

impl LoopInvariantExec {
    /// A copy over `input`, sharing the kept rows: the rule inserts the
    /// node after the optimizers that would change its input, so a new
    /// input is the input reset for the next iteration.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self::with_store(
            input,
            Arc::clone(&self.store),
            self.spread,
            Arc::clone(&self.properties),
        ))
    }
}

impl ExecutionPlan for LoopInvariantExec {
    kit::one_input!("LoopInvariantExec");
    kit::own_properties!();
    kit::no_expressions!();

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_input(Arc::clone(&self.input))?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.schema();
        match self.mode(&context) {
            Mode::Replay(batches) => Ok(replay(schema, batches[partition].clone())),
            Mode::Compute => compute(&self.input, partition, context),
            Mode::Collect(pending) => {
                let pending = pending.clone();
                // After a collection that did not fit, the input is computed
                // again: reset once for all of this execution's partitions.
                let recomputed = match self.recomputed.get() {
                    Some(input) => Arc::clone(input),
                    None => {
                        let input = reset_plan_states(Arc::clone(&self.input))?;
                        Arc::clone(self.recomputed.get_or_init(|| input))
                    }
                };
                let replayed = Arc::clone(&schema);
                let stream = futures::stream::once(async move {
                    let collected = pending.await.map_err(DataFusionError::Shared)?;
                    match collected {
                        Some(batches) => Ok(replay(replayed, batches[partition].clone())),
                        None => compute(&recomputed, partition, context),
                    }
                })
                .try_flatten();
                Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
            }
        }
    }
}
