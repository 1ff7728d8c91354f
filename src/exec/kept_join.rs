//! Hash joins of a recursive term whose one side is loop-invariant: the hash
//! table built once.
//!
//! DataFusion executes a recursive term anew in every iteration, and its
//! `HashJoinExec` builds its hash table anew each time. Where one side of
//! the join does not change from one iteration to the next (the data of a
//! training loop, the edges of a graph traversal, the kept history of a
//! loop that reverse mode runs backwards), that is the same table built
//! `T` times; and where the optimizer put the iteration's rows on the build
//! side (they are few), every iteration probes *all* the invariant rows:
//! `O(T · rows)` work for `T` iterations of one row each. The reverse pass
//! through a training loop joins each backward iteration's row with the
//! loop's history of `T` states, so it took `O(T²)`.
//!
//! [`keep_build_sides`] (run by [`super::loop_invariant::LoopInvariants`],
//! under the same switch, `datafusion_grad.cache_loop_invariants`) finds
//! the hash joins of recursive terms with exactly one loop-invariant side
//! ([`super::loop_invariant::is_invariant`]: no work table, no volatile
//! function, no dynamic filter fed from outside) and replaces each with a
//! [`KeptHashJoinExec`]: the invariant side is its build side, numbered
//! once per query by its keys (the contraction's
//! [`Numbering`](super::contraction::numbering::Numbering): integer keys
//! through a hash table of their values or directly, others through their
//! row encoding), and every copy of the operator that an iteration's reset
//! makes shares that table and only probes it with its own rows; the
//! side's rows are kept by the table alone (no `LoopInvariantExec` keeps
//! them a second time). A [`ContractionExec`] whose collected sides are
//! loop-invariant and whose probe side is not is kept the same way: one
//! listing of those sides serves every iteration (`kept: true` in
//! `EXPLAIN`; [`ContractionExec::kept`]). (Not
//! DataFusion's `HashJoinExec` kept across iterations: it registers new
//! metrics at every execution, which then grew with the iterations.)
//!
//! Only equijoins without a join filter or a row limit, on keys of the same
//! integer or string types on both sides, qualify, and only those whose
//! build side gives no rows of its own at the end once the invariant side
//! is on the left: inner, right, right semi and right anti joins (the
//! others mark the build rows an iteration matched, which a table kept
//! across iterations cannot). A null-aware anti join, or a join whose
//! output is ordered, is left as it is. `NULL` keys match as the join says
//! (`=`: never; `IS NOT DISTINCT FROM`: each other). The join's output
//! keeps its partitioning (a repartition is added where the new join's
//! differs), so nothing above changes.
//!
//! ```sql
//! -- a graph traversal: `edges` is numbered once, each iteration probes it
//! WITH RECURSIVE reach(node, depth) AS (
//!   SELECT 1, 0
//!   UNION ALL
//!   SELECT e.dst, r.depth + 1 FROM reach r JOIN edges e ON e.src = r.node
//!   WHERE r.depth < 10)
//! SELECT count(*) FROM reach;
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, not_impl_err, JoinType, NullEquality};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{Column, UnKnownColumn};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::contraction::numbering::{supported, Nulls, Numbering, NONE};
use super::contraction::ContractionExec;
use super::loop_invariant::{is_invariant, LoopInvariantExec};

/// `term` (a recursive term) with each hash join of exactly one
/// loop-invariant side that qualifies replaced by a [`KeptHashJoinExec`],
/// and each contraction whose collected sides are loop-invariant kept
/// ([`ContractionExec::kept`]; see the [module docs](self)).
pub(crate) fn keep_build_sides(
    term: Arc<dyn ExecutionPlan>,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    term.transform_up(|node| {
        if let Some(contraction) = node.downcast_ref::<ContractionExec>() {
            return Ok(match contraction.kept()? {
                Some(kept) => Transformed::yes(Arc::new(kept) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            });
        }
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match kept(join, &node)? {
            Some(kept) => Transformed::new(kept, true, TreeNodeRecursion::Continue),
            None => Transformed::no(node),
        })
    })
}

/// `join` (the node `node`) as a [`KeptHashJoinExec`] with its invariant
/// side on the left, under what restores its output's partitioning; `None`
/// where it does not qualify.
fn kept(
    join: &HashJoinExec,
    node: &Arc<dyn ExecutionPlan>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let (left, right) = (is_invariant(join.left()), is_invariant(join.right()));
    let qualifies = left != right
        && !join.null_aware
        && join.filter().is_none()
        && node.fetch().is_none()
        && node.output_ordering().is_none()
        && keys_numbered(join)?;
    let join_type = match left {
        true => *join.join_type(),
        false => join.join_type().swap(),
    };
    if !qualifies || !builds_nothing_at_the_end(join_type) {
        return Ok(None);
    }
    // Without its dynamic filter (which may not be swapped, and would be
    // fed by nothing): the probe side's copy stays `true`, filtering nothing.
    let fresh = join.builder().reset_state().build()?;
    let oriented: Arc<dyn ExecutionPlan> = match left {
        true => fresh
            .builder()
            .with_partition_mode(PartitionMode::CollectLeft)
            .recompute_properties()
            .build_exec()?,
        false => fresh.swap_inputs(PartitionMode::CollectLeft)?,
    };
    // The swap may have put a projection (the columns' order) over the join.
    let new = oriented
        .transform_down(|n| {
            let Some(j) = n.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(n));
            };
            let j = j
                .builder()
                .with_new_children(vec![read_once(j.left()), Arc::clone(j.right())])?
                .build()?;
            Ok(Transformed::new(
                Arc::new(KeptHashJoinExec::new(j)) as Arc<dyn ExecutionPlan>,
                true,
                TreeNodeRecursion::Jump,
            ))
        })?
        .data;
    let (was, is) = (node.output_partitioning(), new.output_partitioning());
    Ok(Some(if was == is {
        new
    } else if hashed_by_columns_of(was, &new.schema()) {
        Arc::new(RepartitionExec::try_new(new, was.clone())?)
    } else if was.partition_count() != is.partition_count() {
        Arc::new(RepartitionExec::try_new(
            new,
            Partitioning::RoundRobinBatch(was.partition_count()),
        )?)
    } else {
        new
    }))
}

/// A kept join's build side (or a kept contraction's), which it reads
/// once, collected into one partition: without a [`LoopInvariantExec`] at
/// its top (the join's table keeps its rows; kept twice, they would take
/// twice the memory), nor a repartition below it (its partitions are
/// merged).
pub(super) fn read_once(build: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let build = match build.downcast_ref::<LoopInvariantExec>() {
        Some(kept) => Arc::clone(kept.input()),
        None => Arc::clone(build),
    };
    let build = match build.downcast_ref::<RepartitionExec>() {
        Some(r) if !r.preserve_order() => Arc::clone(r.input()),
        _ => build,
    };
    match build.output_partitioning().partition_count() {
        1 => build,
        _ => Arc::new(CoalescePartitionsExec::new(build)),
    }
}

/// Whether `join`'s keys have the same types on both sides, each one that a
/// [`Numbering`] numbers (equality of the numbers is SQL equality).
fn keys_numbered(join: &HashJoinExec) -> Result<bool> {
    let (left, right) = (join.left().schema(), join.right().schema());
    for (l, r) in join.on() {
        let t = l.data_type(&left)?;
        if t != r.data_type(&right)? || !supported(&t) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `partitioning` hashes rows by expressions of `schema`'s columns
/// (a join's partitioning by a key it does not output names an unknown
/// column: nothing above can rely on it).
fn hashed_by_columns_of(partitioning: &Partitioning, schema: &SchemaRef) -> bool {
    let Partitioning::Hash(exprs, _) = partitioning else {
        return false;
    };
    exprs.iter().all(|e| {
        let mut known = true;
        e.apply(|e| {
            if e.downcast_ref::<UnKnownColumn>().is_some() {
                known = false;
            } else if let Some(c) = e.downcast_ref::<Column>() {
                known &= schema
                    .fields()
                    .get(c.index())
                    .is_some_and(|f| f.name() == c.name());
            }
            Ok(match known {
                true => TreeNodeRecursion::Continue,
                false => TreeNodeRecursion::Stop,
            })
        })
        .expect("the visit does not fail");
        known
    })
}

/// Whether a hash join of `join_type` gives no rows of its build (left)
/// side once the probe side is done (it marks no build rows): its table is
/// only read, and may serve every iteration.
fn builds_nothing_at_the_end(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti
    )
}

/// The build side's rows, numbered by their keys: built once per query.
struct Table {
    rows: RecordBatch,
    numbering: Numbering,
    /// For each number, its first row (in the rows' order).
    first: Vec<u32>,
    /// For each row, the next row of its number ([`NONE`]: the last).
    next: Vec<u32>,
    _memory: MemoryReservation,
}

/// The metrics of every copy of one [`KeptHashJoinExec`], registered once.
#[derive(Debug)]
struct Metrics {
    set: ExecutionPlanMetricsSet,
    output_rows: Count,
    elapsed_compute: Time,
    build_input_rows: Count,
    build_time: Time,
}

/// A hash join (inner, right, right semi or right anti) whose build side
/// is loop-invariant: every copy of it that an iteration's reset makes
/// shares one table of the build side's rows (see the [module docs](self)).
pub struct KeptHashJoinExec {
    /// The join as planned with the invariant side on the left
    /// (`CollectLeft`): its keys, type, projection, properties and display.
    join: Arc<HashJoinExec>,
    /// The build side's table, shared by the copies.
    table: Arc<OnceCell<Arc<Table>>>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for KeptHashJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("KeptHashJoinExec")
            .field("join", &self.join)
            .finish()
    }
}

impl KeptHashJoinExec {
    fn new(join: HashJoinExec) -> Self {
        let set = ExecutionPlanMetricsSet::new();
        let metrics = Metrics {
            output_rows: MetricBuilder::new(&set).output_rows(0),
            elapsed_compute: MetricBuilder::new(&set).elapsed_compute(0),
            build_input_rows: MetricBuilder::new(&set).counter("build_input_rows", 0),
            build_time: MetricBuilder::new(&set).subset_time("build_time", 0),
            set,
        };
        Self {
            join: Arc::new(join),
            table: Arc::default(),
            metrics: Arc::new(metrics),
        }
    }
}

impl DisplayAs for KeptHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // "KeptHashJoinExec: mode=CollectLeft, …"
        f.write_str("Kept")?;
        self.join.fmt_as(t, f)
    }
}

impl ExecutionPlan for KeptHashJoinExec {
    fn name(&self) -> &str {
        "KeptHashJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.join.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.join.children()
    }

    /// The same join over `children`, sharing the table (built by the
    /// first copy to run).
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 2 {
            return internal_err!("KeptHashJoinExec has two children");
        }
        let join = self.join.builder().with_new_children(children)?.build()?;
        Ok(Arc::new(Self {
            join: Arc::new(join),
            table: Arc::clone(&self.table),
            metrics: Arc::clone(&self.metrics),
        }))
    }

    /// Kept: the table serves the next iteration too.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.join.apply_expressions(f)
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.join.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.join.maintains_input_order()
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.set.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let probe = self.join.right().execute(partition, Arc::clone(&context))?;
        let (join, table, metrics) = (
            Arc::clone(&self.join),
            Arc::clone(&self.table),
            Arc::clone(&self.metrics),
        );
        let schema = self.schema();
        let joined = futures::stream::once(async move {
            let table = table
                .get_or_try_init(|| build(&join, &metrics, context))
                .await?;
            let table = Arc::clone(table);
            Ok::<_, DataFusionError>(probe.map(move |batch| {
                let _timer = metrics.elapsed_compute.timer();
                let out = join_batch(&join, &table, &batch?)?;
                metrics.output_rows.add(out.num_rows());
                Ok(out)
            }))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, joined)))
    }
}

/// The values of `exprs` over `batch`.
fn keys<'a>(
    exprs: impl Iterator<Item = &'a Arc<dyn PhysicalExpr>>,
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    exprs
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// The build side of `join` collected into one batch and numbered by its
/// keys, its memory in the pool.
async fn build(
    join: &HashJoinExec,
    metrics: &Metrics,
    context: Arc<TaskContext>,
) -> Result<Arc<Table>> {
    // Within the pool as the rows arrive (no `LoopInvariantExec` below
    // accounts for them: see `read_once`), and for their one-batch copy.
    let memory = MemoryConsumer::new("KeptHashJoinExec").register(context.memory_pool());
    let left = join.left();
    if left.output_partitioning().partition_count() != 1 {
        return internal_err!("a kept hash join's build side is one partition");
    }
    let mut stream = left.execute(0, context)?;
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        memory.try_grow(batch.get_array_memory_size())?;
        batches.push(batch);
    }
    let _timer = metrics.build_time.timer();
    memory.try_grow(memory.size())?;
    let rows = concat_batches(&left.schema(), &batches)?;
    drop(batches);
    if rows.num_rows() >= NONE as usize {
        return not_impl_err!(
            "a kept hash join's build side of {} rows (at most {} are numbered)",
            rows.num_rows(),
            NONE - 1
        );
    }
    metrics.build_input_rows.add(rows.num_rows());
    let keys = keys(join.on().iter().map(|(l, _)| l), &rows)?;
    let types: Vec<_> = keys.iter().map(|k| k.data_type().clone()).collect();
    let nulls = match join.null_equality() {
        NullEquality::NullEqualsNothing => Nulls::Unmatched,
        NullEquality::NullEqualsNull => Nulls::Grouped,
    };
    let mut numbering = Numbering::new(&types, nulls)?;
    let mut numbers = Vec::with_capacity(rows.num_rows());
    numbering.number(&keys, &mut numbers)?;
    numbering.freeze();
    let mut first = vec![NONE; numbering.len()];
    let mut next = vec![NONE; rows.num_rows()];
    for (row, &number) in numbers.iter().enumerate().rev() {
        if number != NONE {
            next[row] = first[number as usize];
            first[number as usize] = row as u32;
        }
    }
    memory.try_resize(
        rows.get_array_memory_size() + numbering.size() + 4 * (first.len() + next.len()),
    )?;
    Ok(Arc::new(Table {
        rows,
        numbering,
        first,
        next,
        _memory: memory,
    }))
}

/// The rows `join` gives for one batch of its probe (right) side.
fn join_batch(join: &HashJoinExec, table: &Table, probe: &RecordBatch) -> Result<RecordBatch> {
    let keys = keys(join.on().iter().map(|(_, r)| r), probe)?;
    let mut numbers = Vec::with_capacity(probe.num_rows());
    table.numbering.find(&keys, &mut numbers)?;
    let (rows, columns): (usize, Vec<ArrayRef>) = match join.join_type() {
        JoinType::RightSemi | JoinType::RightAnti => {
            let semi = *join.join_type() == JoinType::RightSemi;
            let keep: BooleanArray = numbers.iter().map(|&n| Some((n != NONE) == semi)).collect();
            let kept = filter_record_batch(probe, &keep)?;
            (kept.num_rows(), kept.columns().to_vec())
        }
        JoinType::Inner | JoinType::Right => {
            let unmatched = *join.join_type() == JoinType::Right;
            let (mut build, mut probed) = (Vec::new(), Vec::new());
            for (p, &number) in numbers.iter().enumerate() {
                let mut row = match number {
                    NONE => NONE,
                    n => table.first[n as usize],
                };
                if row == NONE && unmatched {
                    build.push(None);
                    probed.push(p as u32);
                }
                while row != NONE {
                    build.push(Some(row));
                    probed.push(p as u32);
                    row = table.next[row as usize];
                }
            }
            let (build, probed) = (UInt32Array::from(build), UInt32Array::from(probed));
            let mut columns = Vec::with_capacity(table.rows.num_columns() + probe.num_columns());
            for c in table.rows.columns() {
                columns.push(take(c, &build, None)?);
            }
            for c in probe.columns() {
                columns.push(take(c, &probed, None)?);
            }
            (probed.len(), columns)
        }
        other => return internal_err!("KeptHashJoinExec does not run a {other} join"),
    };
    let columns = match &join.projection {
        Some(projection) => projection
            .iter()
            .map(|&i| Arc::clone(&columns[i]))
            .collect(),
        None => columns,
    };
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        join.schema(),
        columns,
        &options,
    )?)
}
