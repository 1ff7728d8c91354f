//! Runs recursive queries whose recursive term reads the work table more
//! than once ([`crate::plan::iterate`]): [`IterateExec`] iterates, its
//! [`IterationScanExec`]s read the previous iteration's rows.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::common::project_plan_to_schema;
use datafusion::physical_plan::execution_plan::{reset_plan_states, Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::iterations::{Iteration, IterationLimit, IterationProgress};
use super::runs::Runs;
use super::shared::SharedExec;
use super::{compactor, kit};

/// The rows of the previous iteration, which the [`IterationScanExec`]s of
/// the recursive term read (`None` before the first), and the number of
/// the iteration reading them (from 1), which tells the shared subplans
/// over them when to compute again.
#[derive(Debug, Default)]
struct IterationRows {
    rows: Mutex<Option<Vec<RecordBatch>>>,
    iteration: Arc<AtomicU64>,
}

/// A recursive query run iteration by iteration, its recursive term reading
/// the previous iteration's rows any number of times (see the
/// [module docs](self)). One output partition; both terms run on one.
#[derive(Debug)]
pub struct IterateExec {
    name: String,
    static_term: Arc<dyn ExecutionPlan>,
    recursive_term: Arc<dyn ExecutionPlan>,
    rows: Arc<IterationRows>,
    distinct: bool,
    properties: Arc<PlanProperties>,
    /// The copies of the recursive term that ran, for `EXPLAIN ANALYZE`.
    runs: Arc<Runs>,
}

impl IterateExec {
    /// The recursive query `name` with output `schema`: its terms, the
    /// recursive one's work-table scans replaced by scans of the previous
    /// iteration's rows.
    pub(crate) fn try_new(
        name: &str,
        schema: SchemaRef,
        static_term: Arc<dyn ExecutionPlan>,
        recursive_term: Arc<dyn ExecutionPlan>,
        distinct: bool,
    ) -> Result<Self> {
        let rows = Arc::new(IterationRows::default());
        let scans = Scans {
            name,
            rows: &rows,
            schema: &schema,
        };
        let recursive_term = scans.replace(recursive_term, &mut HashMap::new())?;
        Ok(Self {
            name: name.to_string(),
            static_term: project_plan_to_schema(static_term, &schema)?,
            recursive_term: project_plan_to_schema(recursive_term, &schema)?,
            rows,
            distinct,
            properties: Arc::new(single_partition(schema)),
            runs: Arc::default(),
        })
    }
}

impl IterateExec {
    /// The copies of the recursive term that ran ([`super::runs`]).
    pub(crate) fn runs(&self) -> &Runs {
        &self.runs
    }

    /// Whether the recursion keeps only rows it has not produced before
    /// (`UNION`): an iteration's rows then depend on all the rows before.
    pub(crate) fn distinct(&self) -> bool {
        self.distinct
    }

    /// The rows one iteration makes from `rows` (rows of this recursive
    /// query, as an iteration produced them): the recursive term run once
    /// over them, to replay iterations from a kept state
    /// ([`super::history`]). Not while this plan is being iterated: its
    /// scans read `rows` in its place.
    pub(crate) async fn step(
        &self,
        rows: Vec<RecordBatch>,
        context: &Arc<TaskContext>,
    ) -> Result<Vec<RecordBatch>> {
        *self.rows.rows.lock().expect("iteration rows lock") = Some(rows);
        // A new iteration to the shared subplans over the rows.
        self.rows.iteration.fetch_add(1, Ordering::AcqRel);
        let term = reset_plan_states(Arc::clone(&self.recursive_term))?;
        let mut stream = term.execute(0, Arc::clone(context))?;
        let mut made = Vec::new();
        while let Some(batch) = stream.next().await.transpose()? {
            if batch.num_rows() > 0 {
                made.push(batch);
            }
        }
        self.runs.ran(&term);
        *self.rows.rows.lock().expect("iteration rows lock") = None;
        Ok(made)
    }
}

/// The work-table scans of one recursive query, to replace.
struct Scans<'a> {
    name: &'a str,
    rows: &'a Arc<IterationRows>,
    /// The recursive query's rows.
    schema: &'a SchemaRef,
}

impl Scans<'_> {
    /// `plan` with its scans of the work table replaced by scans of the
    /// previous iteration's rows, in the inputs of shared subplans too
    /// (each input replaced once: `done`, by the input's address).
    fn replace(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        done: &mut HashMap<usize, Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|p| {
            if let Some(scan) = p.downcast_ref::<WorkTableExec>() {
                if scan.name() == self.name {
                    let scan = IterationScanExec::try_new(self.rows, self.schema, scan.schema())?;
                    return Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>));
                }
            }
            let Some(shared) = p.downcast_ref::<SharedExec>() else {
                return Ok(Transformed::no(p));
            };
            if !self.read_by(shared.input())? {
                return Ok(Transformed::no(p));
            }
            let key = Arc::as_ptr(shared.input()) as *const () as usize;
            let input = match done.get(&key) {
                Some(input) => Arc::clone(input),
                None => {
                    let input = self.replace(Arc::clone(shared.input()), done)?;
                    done.insert(key, Arc::clone(&input));
                    input
                }
            };
            let shared = shared.per_iteration(input, &self.rows.iteration);
            Ok(Transformed::yes(Arc::new(shared) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    /// Whether `plan` scans the work table (in shared subplans too).
    fn read_by(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<bool> {
        let mut found = false;
        plan.apply(|p| {
            if let Some(scan) = p.downcast_ref::<WorkTableExec>() {
                found |= scan.name() == self.name;
            } else if let Some(shared) = p.downcast_ref::<SharedExec>() {
                found |= self.read_by(shared.input())?;
            }
            Ok(match found {
                true => TreeNodeRecursion::Stop,
                false => TreeNodeRecursion::Continue,
            })
        })?;
        Ok(found)
    }
}

/// The properties of an unordered plan of one partition.
pub(crate) fn single_partition(schema: SchemaRef) -> PlanProperties {
    PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Incremental,
        Boundedness::Bounded,
    )
}

impl DisplayAs for IterateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let union = if self.distinct { "UNION" } else { "UNION ALL" };
        write!(f, "IterateExec: name={}, {union}", self.name)
    }
}

impl ExecutionPlan for IterateExec {
    fn name(&self) -> &str {
        "IterateExec"
    }

    kit::own_properties!();
    kit::no_expressions!();

    /// The recursive term shown is the first copy that ran, under `EXPLAIN
    /// ANALYZE` ([`super::runs`]).
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.static_term, self.runs.shown(&self.recursive_term)]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition; 2]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; 2]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false; 2]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([static_term, recursive_term]) = <[_; 2]>::try_from(children) else {
            return internal_err!("IterateExec has two children");
        };
        // The recursive term's scans keep reading `self.rows`.
        Ok(Arc::new(Self {
            name: self.name.clone(),
            static_term,
            recursive_term,
            rows: Arc::clone(&self.rows),
            distinct: self.distinct,
            properties: Arc::clone(&self.properties),
            runs: Arc::new(Runs::like(&self.runs)),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("IterateExec has one partition, asked for {partition}");
        }
        let schema = self.schema();
        let seen = match self.distinct {
            true => Some(Seen::new(&schema)?),
            false => None,
        };
        let run = Run {
            limit: IterationLimit::of(&context),
            current: self.static_term.execute(0, Arc::clone(&context))?,
            term: None,
            recursive_term: Arc::clone(&self.recursive_term),
            runs: Arc::clone(&self.runs),
            rows: Arc::clone(&self.rows),
            produced: Vec::new(),
            reservation: MemoryConsumer::new("IterateExec").register(context.memory_pool()),
            seen,
            iterated: 0,
            context,
        };
        let batches = futures::stream::unfold(Some(run), |run| async move {
            let mut run = run?;
            match run.next().await {
                Ok(Some(batch)) => Some((Ok(batch), Some(run))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

/// One execution of an [`IterateExec`].
struct Run {
    /// The most iterations that may produce rows.
    limit: IterationLimit,
    /// The term running now.
    current: SendableRecordBatchStream,
    /// The copy of the recursive term running now (`None`: the static term).
    term: Option<Arc<dyn ExecutionPlan>>,
    recursive_term: Arc<dyn ExecutionPlan>,
    runs: Arc<Runs>,
    rows: Arc<IterationRows>,
    /// What the running term has produced so far: the next iteration's rows.
    produced: Vec<RecordBatch>,
    /// The memory of `produced` and of the rows the recursive term reads.
    reservation: MemoryReservation,
    /// Every row produced so far, for `UNION`.
    seen: Option<Seen>,
    /// The rows the iterations (not the static term) produced so far.
    iterated: u64,
    context: Arc<TaskContext>,
}

impl Run {
    /// The next batch of output, or `None` after an iteration that produced
    /// no rows.
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match self.current.next().await.transpose()? {
                Some(batch) => {
                    let batch = match &mut self.seen {
                        Some(seen) => seen.new_rows(&batch)?,
                        None => batch,
                    };
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    self.limit
                        .check(self.rows.iteration.load(Ordering::Acquire))?;
                    self.reservation.try_grow(batch.get_array_memory_size())?;
                    self.produced.push(batch.clone());
                    return Ok(Some(batch));
                }
                None if self.produced.is_empty() => {
                    self.ran();
                    return Ok(None);
                }
                None => {
                    self.ran();
                    // The next iteration reads what this one produced; the
                    // rows this one read are released.
                    let produced = std::mem::take(&mut self.produced);
                    let rows = self.compacted(produced)?;
                    let size = rows.iter().map(RecordBatch::get_array_memory_size).sum();
                    let count: u64 = rows.iter().map(|b| b.num_rows() as u64).sum();
                    self.reservation.resize(size);
                    *self.rows.rows.lock().expect("iteration rows lock") = Some(rows);
                    let n = self.rows.iteration.fetch_add(1, Ordering::AcqRel) + 1;
                    if n > 1 {
                        // the rows of the iteration that just ended
                        self.iterated += count;
                    }
                    let iteration = Iteration {
                        number: n,
                        rows: self.iterated,
                    };
                    IterationProgress::report(&self.context, iteration);
                    let term = reset_plan_states(Arc::clone(&self.recursive_term))?;
                    self.current = term.execute(0, Arc::clone(&self.context))?;
                    self.term = Some(term);
                }
            }
        }
    }

    /// `rows`, an iteration's, compacted for the next iteration to read
    /// (the static term's may be hundreds of small batches, which every
    /// operator reading them would take one by one, in every iteration's
    /// several reads).
    fn compacted(&self, rows: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let size = self.context.session_config().batch_size();
        let mut compacted = compactor(rows[0].schema(), size);
        for batch in rows {
            compacted.push_batch(batch)?;
        }
        compacted.finish_buffered_batch()?;
        Ok(std::iter::from_fn(|| compacted.next_completed_batch()).collect())
    }

    /// The running term has ended.
    fn ran(&mut self) {
        if let Some(term) = self.term.take() {
            self.runs.ran(&term);
        }
    }
}

/// The rows a `UNION` recursion has produced, in the row format (for
/// [`IterateExec`] and Ballista's client-driven recursion).
pub(crate) struct Seen {
    converter: RowConverter,
    rows: HashSet<OwnedRow>,
}

impl Seen {
    /// No rows yet, of `schema`.
    pub(crate) fn new(schema: &SchemaRef) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            converter: RowConverter::new(fields)?,
            rows: HashSet::new(),
        })
    }

    /// The rows of `batch` not produced before (nor earlier in `batch`),
    /// which are then recorded as produced.
    pub(crate) fn new_rows(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = self.converter.convert_columns(batch.columns())?;
        let keep: Vec<bool> = rows.iter().map(|r| self.rows.insert(r.owned())).collect();
        Ok(filter_record_batch(batch, &keep.into())?)
    }
}

/// A scan of the rows of the previous iteration of an [`IterateExec`] (in
/// place of DataFusion's `WorkTableExec`, which one scan empties).
#[derive(Debug)]
pub struct IterationScanExec {
    rows: Arc<IterationRows>,
    /// The columns read, as positions in the recursive query's rows.
    columns: Vec<usize>,
    properties: Arc<PlanProperties>,
}

impl IterationScanExec {
    /// A scan of `rows` (of the recursive query's `table` schema) giving the
    /// columns of `schema`, the work-table scan's output.
    fn try_new(rows: &Arc<IterationRows>, table: &SchemaRef, schema: SchemaRef) -> Result<Self> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                table.index_of(f.name()).map_err(|_| {
                    internal_datafusion_err!("the work table has no column {}", f.name())
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            rows: Arc::clone(rows),
            columns,
            properties: Arc::new(single_partition(schema)),
        })
    }
}

impl DisplayAs for IterationScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "IterationScanExec: columns={:?}", self.columns)
    }
}

impl ExecutionPlan for IterationScanExec {
    kit::no_input!("IterationScanExec");
    kit::own_properties!();
    kit::no_expressions!();

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("IterationScanExec has one partition, asked for {partition}");
        }
        let rows = self.rows.rows.lock().expect("iteration rows lock").clone();
        let Some(rows) = rows else {
            return internal_err!("the previous iteration's rows were read before the first");
        };
        let schema = self.schema();
        let batches = rows
            .iter()
            .map(|b| {
                Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    b.project(&self.columns)?.columns().to_vec(),
                )?)
            })
            .collect::<Vec<Result<_>>>();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches),
        )))
    }
}
