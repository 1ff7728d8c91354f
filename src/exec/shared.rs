//! Shared subplans computed once per query ([`crate::plan::shared`]): each
//! [`SharedExec`] over one input reads the partitions the first occurrence
//! to run computed, kept in the memory pool (or computed again where they
//! do not fit, or in each iteration where the input reads one).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::DataFusionError;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use futures::{StreamExt, TryStreamExt};

use super::runs::Runs;
use super::{compactor, kit};

/// The batches of every partition of a shared input, and the memory they
/// hold in the pool (`None`: too large to keep).
type Cached = Option<(Vec<Vec<RecordBatch>>, MemoryReservation)>;

/// A shared input's result, computed by the first occurrence that runs.
type Pending =
    SharedFuture<BoxFuture<'static, std::result::Result<Arc<Cached>, Arc<DataFusionError>>>>;

/// What the occurrences of one shared input have in common: its result,
/// and the iteration it was computed in (see [`SharedExec::per_iteration`]).
#[derive(Debug, Default)]
pub struct Cache(
    /// The iteration the result was computed in, and the result.
    Mutex<Option<(u64, Pending)>>,
    /// The copies of the input computed again in later iterations, for
    /// `EXPLAIN ANALYZE` ([`super::runs`]).
    Arc<Runs>,
);

impl Cache {
    /// Whether the result computed last is kept in memory (`None`: none
    /// computed yet); waits for it.
    // pub for the tests in tests/unit/exec_shared.rs
    #[doc(hidden)]
    pub async fn kept(&self) -> Result<Option<bool>> {
        let pending = self
            .0
            .lock()
            .expect("cache lock")
            .as_ref()
            .map(|(_, p)| p.clone());
        match pending {
            None => Ok(None),
            Some(p) => Ok(Some(p.await.map_err(DataFusionError::Shared)?.is_some())),
        }
    }

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
        let (input, runs) = match iteration {
            0 => (Arc::clone(input), None),
            // A join's build side and the like are kept in the plan's
            // state: reset, as the recursion resets its own term.
            _ => (
                reset_plan_states(Arc::clone(input))?,
                Some(Arc::clone(&self.1)),
            ),
        };
        let context = Arc::clone(context);
        let pending = async move {
            let size = context.session_config().batch_size();
            let tasks: Vec<_> = (0..input.output_partitioning().partition_count())
                .map(|p| {
                    let stream = input.execute(p, Arc::clone(&context));
                    SpawnedTask::spawn(async move {
                        let mut stream = stream?;
                        // Kept compacted: a loop's history arrives as one
                        // small batch per iteration (several KB of buffers
                        // and headers for a one-row batch).
                        let mut kept = compactor(stream.schema(), size);
                        let mut batches = Vec::new();
                        while let Some(batch) = stream.next().await {
                            kept.push_batch(batch?)?;
                            batches.extend(std::iter::from_fn(|| kept.next_completed_batch()));
                        }
                        kept.finish_buffered_batch()?;
                        batches.extend(std::iter::from_fn(|| kept.next_completed_batch()));
                        Ok::<_, DataFusionError>(batches)
                    })
                })
                .collect();
            let mut partitions = Vec::with_capacity(tasks.len());
            for task in tasks {
                let batches = task
                    .join_unwind()
                    .await
                    .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
                partitions.push(batches);
            }
            if let Some(runs) = runs {
                runs.ran(&input);
            }
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
    /// An occurrence of `input` that shares `cache` with the other
    /// occurrences of the same input.
    pub fn new(input: Arc<dyn ExecutionPlan>, cache: Arc<Cache>) -> Self {
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

    /// The copies of the input computed in later iterations
    /// ([`super::runs`]).
    pub(crate) fn runs(&self) -> &Runs {
        &self.cache.1
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
        let mut shared = self.with_input(input);
        shared.iterations.push(Arc::clone(iteration));
        shared
    }

    /// This occurrence over `input`, which computes the same rows as its
    /// input (a rewrite of it): the same cache and iterations.
    pub(crate) fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            input,
            cache: Arc::clone(&self.cache),
            iterations: self.iterations.clone(),
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
    /// `SharedExec: input=` and the input's outline: each operator's name,
    /// its inputs in parentheses, so that EXPLAIN names every operator that
    /// runs (the input is not a child of the node). A shared input within
    /// it is outlined the first time it occurs there.
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedExec: input=")?;
        let input = self.runs().shown(&self.input);
        outline(input, &mut vec![Arc::as_ptr(&self.cache)], f)
    }
}

/// `plan`'s operators, each followed by its inputs in parentheses; a
/// [`SharedExec`] whose cache is in `seen` by its name only. An operator
/// that ran (`EXPLAIN ANALYZE`) shows the rows it produced and its compute
/// time in brackets, summed over its partitions:
/// `ContractionExec[rows=10000, 1.2ms](…)`.
fn outline(
    plan: &Arc<dyn ExecutionPlan>,
    seen: &mut Vec<*const Cache>,
    f: &mut fmt::Formatter,
) -> fmt::Result {
    write!(f, "{}", plan.name())?;
    if let Some(metrics) = plan.metrics() {
        if let Some(rows) = metrics.output_rows() {
            let time = metrics.elapsed_compute().unwrap_or(0) as u64;
            write!(f, "[rows={rows}, {:.1?}]", Duration::from_nanos(time))?;
        }
    }
    let inputs = match plan.downcast_ref::<SharedExec>() {
        Some(shared) if seen.contains(&Arc::as_ptr(&shared.cache)) => vec![],
        Some(shared) => {
            seen.push(Arc::as_ptr(&shared.cache));
            vec![shared.runs().shown(&shared.input)]
        }
        None => plan.children(),
    };
    if inputs.is_empty() {
        return Ok(());
    }
    for (i, input) in inputs.into_iter().enumerate() {
        write!(f, "{}", if i == 0 { "(" } else { ", " })?;
        outline(input, seen, f)?;
    }
    write!(f, ")")
}

impl ExecutionPlan for SharedExec {
    kit::no_input!("SharedExec");
    kit::input_properties!();
    kit::no_expressions!();

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
}
