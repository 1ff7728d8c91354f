//! A training loop's rows kept as checkpoints for reverse mode, executed
//! ([`crate::plan::history`]): [`HistoryExec`] passes the loop's rows on
//! and keeps every `checkpoint_every`-th iteration's; [`PreviousRowExec`]
//! gives each row of a backward step its trajectory's row of the iteration
//! before, replaying the iterations after the nearest kept one where that
//! row was not kept.
//!
//! With `datafusion_grad.checkpoint_every = 0` (the default) every
//! iteration is kept up to 64; beyond, the spacing doubles whenever more
//! than twice as many iterations as the spacing (and more than 64) are
//! kept, the kept ones thinned to its multiples: after T iterations about
//! max(64, √(2T)) are kept, about √(2T) apart. The backward
//! recursion asks for the iterations from the last down to 0, so each
//! stretch between two kept iterations is replayed once, as a whole (held
//! until the next is replayed): about 2√(2T) states in memory, and one more
//! run of the loop's T steps. `1` keeps every iteration (nothing replayed),
//! `k` every k-th. A loop that keeps only rows it has not produced before
//! (`UNION`) cannot be replayed from one iteration and keeps every one.
//!
//! Replays run the loop's recursive term again (its own copy of the loop's
//! plan, [`IterateExec::step`]): the data it reads is read again (kept
//! across the replays by the loop's own loop-invariant caches).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, concat_batches, take, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::iterate::{single_partition, IterateExec};
use super::kit;

/// The kept rows of one loop, shared by the [`HistoryExec`]s that read the
/// loop and the [`PreviousRowExec`]s that look rows up in it (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct Checkpoints {
    /// The loop planned for replays (`None`: nothing is replayed, every
    /// iteration is kept).
    replay: Option<Arc<dyn ExecutionPlan>>,
    /// `checkpoint_every` (0: about every √T-th).
    every: u64,
    /// The column of the loop's rows that holds their iteration.
    iteration: usize,
    /// The loop's rows' schema.
    schema: SchemaRef,
    kept: Mutex<Kept>,
    replayed: tokio::sync::Mutex<Stretch>,
    /// The number of the next execution of a [`HistoryExec`].
    executions: AtomicU64,
    /// `kept_iterations` (how many are kept now) and `replayed_iterations`
    /// (steps run again), shown by both operators.
    metrics: ExecutionPlanMetricsSet,
    kept_iterations: Gauge,
    replayed_iterations: Count,
}

/// The iterations kept as the loop's rows passed.
#[derive(Debug, Default)]
struct Kept {
    /// The execution recording them: the first to pass rows on.
    recorder: Option<u64>,
    /// Every how many iterations one is kept now.
    spacing: u64,
    /// The kept iterations' rows, by iteration.
    rows: BTreeMap<u64, Vec<RecordBatch>>,
    /// The kept iterations whose rows are batches of their own, not yet
    /// slices of one batch of many iterations' (see [`Kept::coalesce`]).
    loose: Vec<u64>,
    /// The last iteration passed on.
    last: Option<u64>,
    reservation: Option<MemoryReservation>,
}

/// By default, every iteration is kept until this many are: a short loop
/// is not replayed (its states cost little), a long one keeps about √(2T).
const KEPT_AT_LEAST: u64 = 64;

/// How many kept iterations' rows are put in one batch: a loop keeping
/// every iteration's few rows as batches of their own would hold many
/// small allocations (and the allocator slows down with them).
const COALESCED: usize = 512;

impl Kept {
    /// The loose iterations' rows as slices of one batch.
    fn coalesce(&mut self) -> Result<()> {
        let loose = std::mem::take(&mut self.loose);
        let batches: Vec<&RecordBatch> = loose.iter().flat_map(|i| &self.rows[i]).collect();
        let Some(first) = batches.first() else {
            return Ok(());
        };
        let all = concat_batches(&first.schema(), batches.iter().copied())?;
        let mut offset = 0;
        for i in loose {
            let n = self.rows[&i].iter().map(RecordBatch::num_rows).sum();
            self.rows.insert(i, vec![all.slice(offset, n)]);
            offset += n;
        }
        Ok(())
    }
}

/// The iterations replayed last: the stretch after a kept iteration.
#[derive(Debug, Default)]
struct Stretch {
    rows: BTreeMap<u64, Vec<RecordBatch>>,
    reservation: Option<MemoryReservation>,
}

impl Checkpoints {
    /// The checkpoints of a loop whose rows have `schema` (their iteration
    /// in column `iteration`), replayed with `replay` — an [`IterateExec`]
    /// of the loop, else every iteration is kept — keeping every
    /// `every`-th (0: about every √T-th).
    pub fn new(
        replay: Option<Arc<dyn ExecutionPlan>>,
        every: u64,
        schema: SchemaRef,
        iteration: usize,
    ) -> Self {
        let replay = replay.filter(|p| {
            p.downcast_ref::<IterateExec>()
                .is_some_and(|loop_| !loop_.distinct())
        });
        let every = match replay {
            None => 1,
            Some(_) => every,
        };
        let metrics = ExecutionPlanMetricsSet::new();
        Self {
            replay,
            every,
            iteration,
            schema,
            kept: Mutex::new(Kept {
                spacing: every.max(1),
                ..Kept::default()
            }),
            replayed: tokio::sync::Mutex::default(),
            executions: AtomicU64::new(0),
            kept_iterations: MetricBuilder::new(&metrics).global_gauge("kept_iterations"),
            replayed_iterations: MetricBuilder::new(&metrics).global_counter("replayed_iterations"),
            metrics,
        }
    }

    /// Keeps the rows of `batch` (of execution `execution`) whose iteration
    /// is kept: see the [module docs](self).
    fn record(&self, execution: u64, batch: &RecordBatch, context: &TaskContext) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let iterations = batch.column(self.iteration);
        let Some(iterations) = iterations.as_primitive_opt::<Int64Type>() else {
            return internal_err!("a loop's iteration is an Int64");
        };
        let mut guard = self.kept.lock().expect("checkpoints lock");
        let kept = &mut *guard;
        if *kept.recorder.get_or_insert(execution) != execution {
            return Ok(());
        }
        let mut start = 0;
        while start < batch.num_rows() {
            let i = iterations.value(start);
            let mut end = start + 1;
            while end < batch.num_rows() && iterations.value(end) == i {
                end += 1;
            }
            let Ok(i) = u64::try_from(i) else {
                return internal_err!("a loop's iteration is not negative");
            };
            kept.last = Some(kept.last.map_or(i, |l| l.max(i)));
            if i % kept.spacing == 0 {
                let rows = compacted(batch, start, end)?;
                let reservation = kept.reservation.get_or_insert_with(|| {
                    MemoryConsumer::new("HistoryExec").register(context.memory_pool())
                });
                reservation.try_grow(rows.get_array_memory_size())?;
                let new = !kept.rows.contains_key(&i);
                kept.rows.entry(i).or_default().push(rows);
                if new && self.every != 0 {
                    kept.loose.push(i);
                    if kept.loose.len() >= COALESCED {
                        kept.coalesce()?;
                    }
                }
                if self.every == 0 && kept.rows.len() as u64 > (2 * kept.spacing).max(KEPT_AT_LEAST)
                {
                    kept.spacing *= 2;
                    let spacing = kept.spacing;
                    kept.rows.retain(|i, _| i % spacing == 0);
                    let size = kept
                        .rows
                        .values()
                        .flatten()
                        .map(RecordBatch::get_array_memory_size)
                        .sum();
                    if let Some(r) = kept.reservation.as_mut() {
                        r.resize(size)
                    }
                }
                self.kept_iterations.set(kept.rows.len());
            }
            start = end;
        }
        Ok(())
    }

    /// The loop's rows of iteration `i` (none where the loop stopped
    /// before it): kept, or replayed from the nearest kept iteration before
    /// it with the whole stretch up to the next kept one.
    async fn rows_at(&self, i: u64, context: &Arc<TaskContext>) -> Result<Vec<RecordBatch>> {
        let mut guard = self.replayed.lock().await;
        let stretch = &mut *guard;
        if let Some(rows) = stretch.rows.get(&i) {
            return Ok(rows.clone());
        }
        let (mut rows, from, to) = {
            let kept = self.kept.lock().expect("checkpoints lock");
            if let Some(rows) = kept.rows.get(&i) {
                return Ok(rows.clone());
            }
            let Some((&from, rows)) = kept.rows.range(..=i).next_back() else {
                return internal_err!("the loop's rows before iteration {i} were not kept");
            };
            // The backward recursion asks for the iterations downwards:
            // the whole stretch before the next kept one (or up to `i`).
            let to = match kept.rows.range(i + 1..).next() {
                Some((&next, _)) => next - 1,
                None => i,
            };
            (rows.clone(), from, to)
        };
        let Some(loop_) = self
            .replay
            .as_ref()
            .and_then(|p| p.downcast_ref::<IterateExec>())
        else {
            return internal_err!("the loop's rows of iteration {i} were not kept");
        };
        stretch.rows.clear();
        let reservation = stretch.reservation.get_or_insert_with(|| {
            MemoryConsumer::new("PreviousRowExec").register(context.memory_pool())
        });
        reservation.free();
        for at in from + 1..=to {
            rows = loop_
                .step(rows, context)
                .await?
                .iter()
                .map(|b| compacted(b, 0, b.num_rows()))
                .collect::<Result<_>>()?;
            if rows.is_empty() {
                break;
            }
            self.replayed_iterations.add(1);
            reservation.try_grow(rows.iter().map(RecordBatch::get_array_memory_size).sum())?;
            stretch.rows.insert(at, rows.clone());
        }
        Ok(stretch.rows.get(&i).cloned().unwrap_or_default())
    }

    /// How `EXPLAIN` shows which iterations are kept.
    fn kept_as(&self) -> String {
        match self.every {
            0 => "about every √T-th".to_string(),
            1 => "every".to_string(),
            k => format!("every {k}th"),
        }
    }
}

/// Rows `start..end` of `batch` in arrays of their own: an iteration's
/// rows are often a few rows of arrays made with room for many, which a
/// slice would keep whole.
fn compacted(batch: &RecordBatch, start: usize, end: usize) -> Result<RecordBatch> {
    let rows = UInt32Array::from_iter_values(start as u32..end as u32);
    Ok(take_record_batch(batch, &rows)?)
}

/// A loop's rows passed on, the kept iterations recorded in its
/// [`Checkpoints`] (see the [module docs](self)). One partition.
#[derive(Debug)]
pub struct HistoryExec {
    input: Arc<dyn ExecutionPlan>,
    checkpoints: Arc<Checkpoints>,
    properties: Arc<PlanProperties>,
}

impl HistoryExec {
    /// The rows of `input` (the loop), recorded in `checkpoints`.
    pub fn new(input: Arc<dyn ExecutionPlan>, checkpoints: Arc<Checkpoints>) -> Self {
        let properties = Arc::new(single_partition(input.schema()));
        Self {
            input,
            checkpoints,
            properties,
        }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self::new(input, Arc::clone(&self.checkpoints)))
    }
}

impl DisplayAs for HistoryExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "HistoryExec: kept={}", self.checkpoints.kept_as())
    }
}

impl ExecutionPlan for HistoryExec {
    kit::one_input!("HistoryExec");
    kit::own_properties!();
    kit::no_expressions!();

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.checkpoints.metrics.clone_inner())
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("HistoryExec has one partition, asked for {partition}");
        }
        let checkpoints = Arc::clone(&self.checkpoints);
        let execution = checkpoints.executions.fetch_add(1, Ordering::AcqRel);
        let stream = self.input.execute(0, Arc::clone(&context))?;
        let passed = stream.map(move |batch| {
            let batch = batch?;
            checkpoints.record(execution, &batch, &context)?;
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            passed,
        )))
    }
}

/// Each row of its input beside its trajectory's row of the loop's
/// iteration before, from the loop's [`Checkpoints`] (an inner join: a row
/// of iteration 0, or of a trajectory the loop has no row of then, has
/// none).
#[derive(Debug)]
pub struct PreviousRowExec {
    input: Arc<dyn ExecutionPlan>,
    checkpoints: Arc<Checkpoints>,
    /// The input's columns of the trajectory and the iteration.
    at: [usize; 2],
    /// The loop's column of the trajectory.
    trajectory: usize,
    properties: Arc<PlanProperties>,
}

impl PreviousRowExec {
    /// The rows of `input` (their trajectory and iteration in the columns
    /// `at`) beside the loop's rows (their trajectory in column
    /// `trajectory`) in `checkpoints`, as `schema` (the input's columns,
    /// then the loop's).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        checkpoints: Arc<Checkpoints>,
        at: [usize; 2],
        trajectory: usize,
        schema: SchemaRef,
    ) -> Result<Self> {
        let width = input.schema().fields().len() + checkpoints.schema.fields().len();
        if schema.fields().len() != width {
            return internal_err!("PreviousRowExec's rows are its input's and the loop's");
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            checkpoints,
            at,
            trajectory,
            properties,
        })
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Self::try_new(
            input,
            Arc::clone(&self.checkpoints),
            self.at,
            self.trajectory,
            self.schema(),
        )
    }
}

impl DisplayAs for PreviousRowExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PreviousRowExec: kept={}", self.checkpoints.kept_as())
    }
}

impl ExecutionPlan for PreviousRowExec {
    kit::one_input!("PreviousRowExec");
    kit::own_properties!();
    kit::no_expressions!();

    /// A backward step's rows are few: not dealt over the cores first.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.checkpoints.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let lookup = Arc::new(Lookup {
            checkpoints: Arc::clone(&self.checkpoints),
            at: self.at,
            trajectory: self.trajectory,
            schema: self.schema(),
            context: Arc::clone(&context),
        });
        let rows = self.input.execute(partition, context)?.then(move |batch| {
            let lookup = Arc::clone(&lookup);
            async move { lookup.beside(batch?).await }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), rows)))
    }
}

/// What one execution of a [`PreviousRowExec`] looks rows up with.
struct Lookup {
    checkpoints: Arc<Checkpoints>,
    at: [usize; 2],
    trajectory: usize,
    schema: SchemaRef,
    context: Arc<TaskContext>,
}

impl Lookup {
    /// The rows of `batch` beside their rows of the iteration before.
    async fn beside(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let [trajectory, iteration] = self.at.map(|c| as_i64(batch.column(c)));
        let (trajectory, iteration) = (trajectory?, iteration?);
        let (trajectory, iteration) = (
            trajectory.as_primitive::<Int64Type>(),
            iteration.as_primitive::<Int64Type>(),
        );
        // The rows asking for each iteration.
        let mut asking: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for row in 0..batch.num_rows() {
            if trajectory.is_null(row) || iteration.is_null(row) || iteration.value(row) < 1 {
                continue;
            }
            let before = (iteration.value(row) - 1) as u64;
            asking.entry(before).or_default().push(row);
        }
        let mut out = Vec::with_capacity(asking.len());
        for (i, rows) in asking {
            let past = self.checkpoints.rows_at(i, &self.context).await?;
            let past = match &past[..] {
                [] => RecordBatch::new_empty(Arc::clone(&self.checkpoints.schema)),
                [one, ..] => concat_batches(&one.schema(), &past)?,
            };
            let theirs = as_i64(past.column(self.trajectory))?;
            let theirs = theirs.as_primitive::<Int64Type>();
            let mut of: HashMap<i64, Vec<u32>> = HashMap::new();
            for j in 0..past.num_rows() {
                if theirs.is_valid(j) {
                    of.entry(theirs.value(j)).or_default().push(j as u32);
                }
            }
            let (mut here, mut there) = (Vec::new(), Vec::new());
            for row in rows {
                for &j in of.get(&trajectory.value(row)).into_iter().flatten() {
                    here.push(row as u32);
                    there.push(j);
                }
            }
            let (here, there) = (UInt32Array::from(here), UInt32Array::from(there));
            let mut columns = Vec::with_capacity(self.schema.fields().len());
            for c in batch.columns() {
                columns.push(take(c.as_ref(), &here, None)?);
            }
            for c in past.columns() {
                columns.push(take(c.as_ref(), &there, None)?);
            }
            out.push(RecordBatch::try_new(Arc::clone(&self.schema), columns)?);
        }
        match out.len() {
            1 => Ok(out.pop().expect("one")),
            _ => Ok(concat_batches(&self.schema, &out)?),
        }
    }
}

/// `array` (an integer column) as Int64.
fn as_i64(array: &Arc<dyn Array>) -> Result<Arc<dyn Array>> {
    if !array.data_type().is_integer() {
        return Err(internal_datafusion_err!(
            "a loop's trajectory and iteration are integers, not {}",
            array.data_type()
        ));
    }
    Ok(cast(array, &DataType::Int64)?)
}
