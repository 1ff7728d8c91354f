//! Broadcast aggregation: `GROUP BY` keys of the small side of a cross join
//! without hashing every joined row.
//!
//! A training loop groups by its parameters, which come from the work table
//! of a recursive CTE (one row per iteration) cross-joined with the data:
//!
//! ```sql
//! SELECT step + 1, w - 0.5 * grad(avg(power(w * x + b - y, 2)), w), ...
//! FROM fit CROSS JOIN points GROUP BY step, w, b
//! ```
//!
//! DataFusion plans this as a hash aggregate over the cross join, so every
//! joined row is hashed and compared against the groups although the key is
//! the same on all of them — measured at about 70% of an iteration. When
//! every key is a column of the cross join's left (broadcast) side,
//! [`BroadcastAggregate`] replaces the aggregate (mode `Partial`, `Single`)
//! and its cross join by [`BroadcastAggregateExec`], which groups the left
//! rows once and feeds each left row's joined batches into ungrouped
//! accumulators of that row's group. The result is the same: each group's
//! accumulators see exactly the rows the hash aggregate would have given it,
//! one left row's copy of the right batch after the other (the operators
//! between the aggregate and the join — projections, filters — run on the
//! joined batch as before), and a group is emitted only when it received a
//! row.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{
    new_empty_array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Accumulator, EmitTo};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::group_values::new_group_values;
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateInputMode, AggregateMode, AggregateOutputMode,
};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::{batch_filter, FilterExec};
use datafusion::physical_plan::joins::CrossJoinExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, Time};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    InputOrderMode, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use super::{aggregate_as, at_join, dealt, kit, rewrite_down, Visit};
use row_pass::RowPass;

mod row_pass;
use crate::options::GradOptions;

/// The physical optimizer rule that installs [`BroadcastAggregateExec`]
/// (registered by [`crate::register`]; runs after DataFusion's rules; off
/// with `SET datafusion_grad.broadcast_aggregate = false`).
#[derive(Debug, Default)]
pub struct BroadcastAggregate {
    /// Planning for a Ballista scheduler (see [`Self::distributed`]).
    distributed: bool,
}

impl BroadcastAggregate {
    /// The rule for a Ballista scheduler, whose stages run each partition
    /// as a task of its own: every partition aggregates its own rows (the
    /// final aggregate, after Ballista's exchange, is not merged into the
    /// operator, which would run all partitions in one task), and only
    /// where no repartition lies between the aggregate and its cross join
    /// (an exchange there ends a stage).
    pub fn distributed() -> Self {
        Self { distributed: true }
    }
}

impl PhysicalOptimizerRule for BroadcastAggregate {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = GradOptions::setting(config, |o| o.broadcast_aggregate);
        if !enabled {
            return Ok(plan);
        }
        let spreads = !self.distributed;
        let plan = plan
            .transform_up(|node| {
                Ok(
                    match BroadcastAggregateExec::try_from_plan(&node, spreads)? {
                        Some(exec) => Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>),
                        None => Transformed::no(node),
                    },
                )
            })
            .data()?;
        match self.distributed {
            true => Ok(plan),
            false => merge_finals(plan, true).data(),
        }
    }

    fn name(&self) -> &str {
        "broadcast_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with each final aggregate over a [`BroadcastAggregateExec`] (a
/// partial one) merged into it, where nothing above depends on the final
/// aggregate's partitions (`may_merge`: the plan's root, or under a
/// coalesce, through projections and filters): the merged operator has one.
fn merge_finals(
    plan: Arc<dyn ExecutionPlan>,
    may_merge: bool,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let visit = |plan: &Arc<dyn ExecutionPlan>, may_merge: bool| {
        let merged = match may_merge {
            true => BroadcastAggregateExec::try_merge_final(plan)?,
            false => None,
        };
        Ok(match merged {
            Some(exec) => Visit::Replace(Arc::new(exec)),
            None => Visit::Descend,
        })
    };
    let pass_on = |plan: &Arc<dyn ExecutionPlan>, _: usize, may_merge: bool| {
        let passes = plan.downcast_ref::<ProjectionExec>().is_some()
            || plan.downcast_ref::<FilterExec>().is_some();
        plan.downcast_ref::<CoalescePartitionsExec>().is_some() || (may_merge && passes)
    };
    rewrite_down(plan, may_merge, &visit, &pass_on)
}

/// Aggregates whose ungrouped accumulator has the same intermediate state
/// as their groups accumulator.
const SAME_STATE: &[&str] = &[
    "sum",
    "avg",
    "count",
    "min",
    "max",
    "var",
    "var_pop",
    "stddev",
    "stddev_pop",
    "median",
];

/// Whether the partial state this operator emits for `a` (its ungrouped
/// accumulator's) is what DataFusion's final aggregate reads: a final
/// `GROUP BY` merges with the groups accumulator where the function has one,
/// and some functions' groups state differs (`corr`'s is sums of products,
/// its ungrouped state means and moments), so only functions known to agree,
/// or without a groups accumulator, are computed here.
fn same_state(a: &AggregateFunctionExpr) -> bool {
    !a.groups_accumulator_supported() || SAME_STATE.contains(&a.fun().name())
}

/// An operator between the aggregate and the cross join, applied to each
/// joined batch in the order the plan had it.
#[derive(Debug, Clone)]
enum Step {
    Project(Vec<Arc<dyn PhysicalExpr>>, SchemaRef),
    Filter(Arc<dyn PhysicalExpr>),
}

impl Step {
    fn apply(&self, batch: RecordBatch) -> Result<RecordBatch> {
        match self {
            Step::Project(exprs, schema) => {
                let rows = batch.num_rows();
                let columns = exprs
                    .iter()
                    .map(|e| e.evaluate(&batch)?.into_array(rows))
                    .collect::<Result<Vec<_>>>()?;
                batch_of(Arc::clone(schema), columns, rows)
            }
            Step::Filter(predicate) => batch_filter(&batch, predicate),
        }
    }
}

/// A batch of `rows` rows (also when it has no columns).
fn batch_of(schema: SchemaRef, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema, columns, &options,
    )?)
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Project(exprs, schema) => {
                let items: Vec<String> = exprs
                    .iter()
                    .zip(schema.fields())
                    .map(|(e, field)| format!("{e} as {}", field.name()))
                    .collect();
                write!(f, "project({})", items.join(", "))
            }
            Step::Filter(predicate) => write!(f, "filter({predicate})"),
        }
    }
}

/// A number for each row of `columns`, equal where the rows' values are
/// (by their row encoding, DataFusion's equality for nested values), and
/// the first row of each number.
fn number_values(columns: &[ArrayRef]) -> Result<(UInt32Array, Vec<u32>)> {
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let encoded = RowConverter::new(fields)?.convert_columns(columns)?;
    let mut numbers = HashMap::new();
    let mut first_row = vec![];
    let number = (0..encoded.num_rows())
        .map(|row| {
            *numbers.entry(encoded.row(row)).or_insert_with(|| {
                first_row.push(row as u32);
                first_row.len() as u32 - 1
            })
        })
        .collect();
    Ok((number, first_row))
}

/// The left side, collected once per execution and shared by all output
/// partitions, with its rows grouped by the aggregate's keys.
#[derive(Debug)]
struct Left {
    /// The group of each left row.
    group_of: Vec<usize>,
    /// The key columns, one row per group, as DataFusion's own grouping
    /// emits them (e.g. `-0.0` folded into `0.0`).
    keys: Vec<ArrayRef>,
    /// Each row's pass over the right batches (`None`: it passes no row).
    passes: Vec<Option<RowPass>>,
}

type SharedLeft = Shared<BoxFuture<'static, std::result::Result<Arc<Left>, Arc<DataFusionError>>>>;

/// What every partition of a [`BroadcastAggregateExec`] computes, apart
/// from its inputs.
#[derive(Debug, Clone)]
struct Pass {
    /// The aggregate it replaces: schema, expressions, mode.
    aggregate: AggregateExec,
    /// The schema of the cross join's output.
    join_schema: SchemaRef,
    /// The operators between join and aggregate, bottom-up.
    steps: Vec<Step>,
    /// The left column of each group key.
    keys: Vec<usize>,
    /// The schema of the group keys.
    key_schema: SchemaRef,
    /// Each aggregate's argument expressions.
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
}

/// A `Partial` or `Single` hash aggregate over a cross join whose group keys
/// all come from the join's left side, computed with one set of ungrouped
/// accumulators per distinct left key (see the [module docs](self)).
#[derive(Debug)]
pub struct BroadcastAggregateExec {
    pass: Arc<Pass>,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    /// The aggregate's (one partition where it merges a final aggregate).
    properties: Arc<PlanProperties>,
    /// The left side of the current execution (reset by `reset_state`).
    left_data: Mutex<Option<SharedLeft>>,
    metrics: ExecutionPlanMetricsSet,
}

impl BroadcastAggregateExec {
    /// `Some` when `plan` is an aggregate this operator can replace (with
    /// `spreads`, also over a round-robin repartition of the joined rows).
    fn try_from_plan(plan: &Arc<dyn ExecutionPlan>, spreads: bool) -> Result<Option<Self>> {
        let Some(aggregate) = plan.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        let group_by = aggregate.group_expr();
        // Keys of one value in each partition (one parameter row): DataFusion
        // aggregates them as sorted, and one group per partition is ordered
        // whichever way.
        let constant = group_by.expr().iter().all(|(e, _)| {
            aggregate
                .input()
                .equivalence_properties()
                .is_expr_constant(e)
                .is_some()
        });
        let plain = group_by.is_single()
            && !group_by.is_empty()
            && aggregate.mode().input_mode() == AggregateInputMode::Raw
            && aggregate.limit_options().is_none()
            && aggregate.dynamic_expressions_produced().is_empty()
            && (constant
                || (*aggregate.input_order_mode() == InputOrderMode::Linear
                    && aggregate.properties().output_ordering().is_none()))
            && aggregate
                .aggr_expr()
                .iter()
                .all(|a| !a.is_distinct() && a.order_bys().is_empty())
            && (aggregate.mode().output_mode() != AggregateOutputMode::Partial
                || aggregate.aggr_expr().iter().all(|a| same_state(a)));
        if !plain {
            return Ok(None);
        }
        // Walk down to the cross join, collecting the operators on the way.
        let mut steps = vec![];
        let mut node = aggregate.input();
        // A round-robin repartition on the way spreads the joined batches:
        // the same as spreading the right side's batches (one left row's
        // copy of a right batch stays in one batch either way).
        let mut spread = None;
        let join = loop {
            if let Some(join) = node.downcast_ref::<CrossJoinExec>() {
                break join;
            } else if let Some(r) = dealt(node).filter(|_| spreads && spread.is_none()) {
                spread = Some(r.partitioning().clone());
                node = r.input();
            } else if let Some(p) = node.downcast_ref::<ProjectionExec>() {
                let exprs = p.expr().iter().map(|e| Arc::clone(&e.expr)).collect();
                steps.push(Step::Project(exprs, p.schema()));
                node = p.input();
            } else if let Some(f) = node.downcast_ref::<FilterExec>() {
                if f.projection().is_some() || f.fetch().is_some() {
                    return Ok(None);
                }
                steps.push(Step::Filter(Arc::clone(f.predicate())));
                node = f.input();
            } else {
                return Ok(None);
            }
        };
        // Every key must be a left column, passed through unchanged.
        let left_width = join.left().schema().fields().len();
        let mut keys = vec![];
        for (expr, _) in group_by.expr() {
            let Some(mut index) = expr.downcast_ref::<Column>().map(Column::index) else {
                return Ok(None);
            };
            for step in &steps {
                if let Step::Project(exprs, _) = step {
                    match exprs[index].downcast_ref::<Column>() {
                        Some(c) => index = c.index(),
                        None => return Ok(None),
                    }
                }
            }
            if index >= left_width {
                return Ok(None);
            }
            keys.push(index);
        }
        let left_schema = join.left().schema();
        let key_schema = Arc::new(Schema::new(
            keys.iter()
                .map(|&k| left_schema.field(k).clone())
                .collect::<Vec<_>>(),
        ));
        if new_group_values(Arc::clone(&key_schema), &GroupOrdering::None).is_err() {
            return Ok(None);
        }
        steps.reverse();
        let pass = Pass {
            aggregate: aggregate.clone(),
            join_schema: join.schema(),
            steps,
            keys,
            key_schema,
            arguments: aggregate
                .aggr_expr()
                .iter()
                .map(|a| a.expressions())
                .collect(),
        };
        let right = match spread {
            Some(partitioning) => Arc::new(RepartitionExec::try_new(
                Arc::clone(join.right()),
                partitioning,
            )?) as Arc<dyn ExecutionPlan>,
            None => Arc::clone(join.right()),
        };
        let properties = Arc::clone(aggregate.properties());
        Ok(Some(Self::new(
            Arc::new(pass),
            Arc::clone(join.left()),
            right,
            properties,
        )))
    }

    /// `Some` when `plan` is the final aggregate over a partial one this
    /// operator computes (through the repartition between them): one
    /// operator for both, which merges its right partitions' accumulators
    /// itself, so the group keys (a training loop's parameters, tensors
    /// among them) are never hashed or encoded again.
    fn try_merge_final(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let Some(last) = plan.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        if !matches!(
            last.mode(),
            AggregateMode::Final | AggregateMode::FinalPartitioned
        ) || last.limit_options().is_some()
            || last.properties().output_ordering().is_some()
        {
            return Ok(None);
        }
        let mut input = last.input();
        if let Some(r) = input.downcast_ref::<RepartitionExec>() {
            input = r.input();
        } else if let Some(c) = input.downcast_ref::<CoalescePartitionsExec>() {
            input = c.input();
        }
        let Some(partial) = input.downcast_ref::<BroadcastAggregateExec>() else {
            return Ok(None);
        };
        let first = &partial.pass.aggregate;
        if first.mode().output_mode() != AggregateOutputMode::Partial {
            return Ok(None);
        }
        let single = aggregate_as(
            first,
            AggregateMode::Single,
            first.group_expr().clone(),
            Arc::clone(first.input()),
        )?;
        if single.schema().fields() != last.schema().fields() {
            return Ok(None);
        }
        let pass = Pass {
            aggregate: single,
            ..partial.pass.as_ref().clone()
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(last.schema()),
            Partitioning::UnknownPartitioning(1),
            last.properties().emission_type,
            last.properties().boundedness,
        ));
        Ok(Some(Self::new(
            Arc::new(pass),
            Arc::clone(&partial.left),
            Arc::clone(&partial.right),
            properties,
        )))
    }

    /// The aggregate this operator replaces, over `left` and `right` at its
    /// cross join: with [`Self::from_replaced`], how the operator travels to
    /// Ballista's executors (`crate::ballista::codec`: placeholders here,
    /// its own inputs travelling as its children). `None` where it merges
    /// its partitions or spreads its right side itself, which only the
    /// local planning does.
    pub fn replaced(
        &self,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let partitions = self
            .pass
            .aggregate
            .properties()
            .partitioning
            .partition_count();
        let own = partitions == self.properties.partitioning.partition_count()
            && self.right.downcast_ref::<RepartitionExec>().is_none();
        match own {
            true => Ok(Some(at_join::<CrossJoinExec>(
                Arc::new(self.pass.aggregate.clone()),
                left,
                right,
            )?)),
            false => Ok(None),
        }
    }

    /// The operator for `replaced` (a plan of [`Self::replaced`]) over
    /// `left` and `right`.
    pub fn from_replaced(
        replaced: Arc<dyn ExecutionPlan>,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let plan = at_join::<CrossJoinExec>(replaced, left, right)?;
        match Self::try_from_plan(&plan, false)? {
            Some(exec) => Ok(exec),
            None => internal_err!("not a broadcast aggregation: {}", plan.name()),
        }
    }

    /// Whether this operator merges all right partitions into one output.
    fn merges(&self) -> bool {
        self.pass.aggregate.mode().output_mode() != AggregateOutputMode::Partial
            && self.properties.partitioning.partition_count() == 1
            && self.right.output_partitioning().partition_count() > 1
    }

    fn new(
        pass: Arc<Pass>,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        properties: Arc<PlanProperties>,
    ) -> Self {
        Self {
            pass,
            left,
            right,
            properties,
            left_data: Mutex::new(None),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The left side of this execution, collected by the first partition
    /// that asks for it.
    fn left(&self, context: &Arc<TaskContext>) -> SharedLeft {
        let mut slot = self.left_data.lock().expect("left side lock");
        slot.get_or_insert_with(|| {
            let plan = Arc::clone(&self.left);
            let pass = Arc::clone(&self.pass);
            let context = Arc::clone(context);
            async move {
                let schema = plan.schema();
                let batches = collect(plan, context).await?;
                let batch = concat_batches(&schema, &batches)?;
                Ok(Arc::new(Left::new(batch, &pass)?))
            }
            .map(|r: Result<Arc<Left>>| r.map_err(Arc::new))
            .boxed()
            .shared()
        })
        .clone()
    }
}

impl Left {
    /// Groups the rows of `batch` by its columns `keys` with DataFusion's
    /// group values (the same equality and key normalisation as `GROUP BY`).
    /// Nested keys (tensors) are grouped by their row encoding, DataFusion's
    /// equality for them, and given back as they are in `batch`: decoding
    /// them from that encoding (what `GROUP BY` does) takes a call per
    /// element, and a training loop's parameters are tensors.
    fn new(batch: RecordBatch, pass: &Pass) -> Result<Self> {
        let (keys, key_schema) = (&pass.keys, &pass.key_schema);
        let columns: Vec<ArrayRef> = keys.iter().map(|&k| Arc::clone(batch.column(k))).collect();
        let nested = |i: &usize| columns[*i].data_type().is_nested();
        // The plain keys, and a number per distinct value of the nested
        // ones, grouped by DataFusion.
        let plain: Vec<usize> = (0..columns.len()).filter(|i| !nested(i)).collect();
        let mut fields: Vec<Field> = plain.iter().map(|&i| key_schema.field(i).clone()).collect();
        let mut grouped: Vec<ArrayRef> = plain.iter().map(|&i| Arc::clone(&columns[i])).collect();
        let numbered = match plain.len() < columns.len() {
            true => {
                let nested: Vec<ArrayRef> = (0..columns.len())
                    .filter(nested)
                    .map(|i| Arc::clone(&columns[i]))
                    .collect();
                let (number, first_row) = number_values(&nested)?;
                fields.push(Field::new("__nested", DataType::UInt32, false));
                grouped.push(Arc::new(number));
                Some(first_row)
            }
            false => None,
        };
        let mut groups = new_group_values(Arc::new(Schema::new(fields)), &GroupOrdering::None)?;
        let mut group_of = vec![];
        groups.intern(&grouped, &mut group_of)?;
        let mut emitted = groups.emit(EmitTo::All)?.into_iter();
        // Each group's first left row, where nested keys are taken from it.
        let rows = match numbered {
            Some(first_row) => {
                let numbers = emitted.next_back().expect("the number column");
                let numbers = numbers
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .expect("the number column is UInt32")
                    .clone();
                Some(UInt32Array::from_iter_values(
                    numbers.values().iter().map(|&n| first_row[n as usize]),
                ))
            }
            None => None,
        };
        let keys = (0..columns.len())
            .map(|i| match &rows {
                Some(rows) if nested(&i) => Ok(take(&columns[i], rows, None)?),
                _ => Ok(emitted.next().expect("a plain key column")),
            })
            .collect::<Result<Vec<_>>>()?;
        let passes = (0..batch.num_rows())
            .map(|row| RowPass::new(pass, &batch, row))
            .collect::<Result<_>>()?;
        Ok(Self {
            group_of,
            keys,
            passes,
        })
    }

    /// Feeds `right` joined with each of these rows into that row's group.
    fn update(&self, groups: &mut Groups, right: &RecordBatch) -> Result<()> {
        if right.num_rows() == 0 {
            return Ok(());
        }
        for (row, pass) in self.passes.iter().enumerate() {
            let Some(pass) = pass else { continue };
            let mut batch = pass.joined(right)?;
            for step in &pass.steps {
                batch = step.apply(batch)?;
            }
            if batch.num_rows() == 0 {
                continue;
            }
            let group = self.group_of[row];
            groups.seen[group] = true;
            for ((accumulator, arguments), filter) in groups.accumulators[group]
                .iter_mut()
                .zip(&pass.arguments)
                .zip(&pass.filters)
            {
                let input = match filter {
                    Some(filter) => batch_filter(&batch, filter)?,
                    None => batch.clone(),
                };
                let values = arguments
                    .iter()
                    .map(|e| e.evaluate(&input)?.into_array(input.num_rows()))
                    .collect::<Result<Vec<_>>>()?;
                accumulator.update_batch(&values)?;
            }
        }
        Ok(())
    }
}

/// One output partition's accumulators: per group, one per aggregate.
struct Groups {
    accumulators: Vec<Vec<Box<dyn Accumulator>>>,
    seen: Vec<bool>,
}

impl Groups {
    /// These groups with `other`'s (of another right partition) merged in.
    fn merge(mut self, other: Groups) -> Result<Self> {
        for (g, accumulators) in other.accumulators.into_iter().enumerate() {
            if !other.seen[g] {
                continue;
            }
            self.seen[g] = true;
            for (into, mut from) in self.accumulators[g].iter_mut().zip(accumulators) {
                let state = from
                    .state()?
                    .iter()
                    .map(ScalarValue::to_array)
                    .collect::<Result<Vec<_>>>()?;
                into.merge_batch(&state)?;
            }
        }
        Ok(self)
    }

    fn new(count: usize, aggregates: &[Arc<AggregateFunctionExpr>]) -> Result<Self> {
        let accumulators = (0..count)
            .map(|_| aggregates.iter().map(|a| a.create_accumulator()).collect())
            .collect::<Result<_>>()?;
        Ok(Self {
            accumulators,
            seen: vec![false; count],
        })
    }
}

impl Pass {
    /// The groups that received rows: their keys, then each aggregate's
    /// state (`Partial`) or value (`Single`).
    fn finish(&self, left: &Left, mut groups: Groups) -> Result<RecordBatch> {
        let emitted: Vec<usize> = (0..groups.seen.len()).filter(|&g| groups.seen[g]).collect();
        let rows = UInt32Array::from_iter_values(emitted.iter().map(|&g| g as u32));
        let mut columns = left
            .keys
            .iter()
            .map(|k| Ok(take(k, &rows, None)?))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let partial = self.aggregate.mode().output_mode() == AggregateOutputMode::Partial;
        for a in 0..self.aggregate.aggr_expr().len() {
            let mut values: Vec<Vec<ScalarValue>> = vec![];
            for &g in &emitted {
                let accumulator = &mut groups.accumulators[g][a];
                values.push(if partial {
                    accumulator.state()?
                } else {
                    vec![accumulator.evaluate()?]
                });
            }
            let width = if partial {
                self.aggregate.aggr_expr()[a].state_fields()?.len()
            } else {
                1
            };
            for field in 0..width {
                let column = values.iter().map(|v| v[field].clone());
                columns.push(if emitted.is_empty() {
                    let index = columns.len();
                    new_empty_array(self.aggregate.schema().field(index).data_type())
                } else {
                    ScalarValue::iter_to_array(column)?
                });
            }
        }
        batch_of(self.aggregate.schema(), columns, emitted.len())
    }
}

/// The groups of one right partition: every batch of `right` fed in.
async fn accumulate(
    pass: &Pass,
    left: &Left,
    mut right: SendableRecordBatchStream,
    time: &Time,
) -> Result<Groups> {
    let groups = left.keys.first().map_or(0, |k| k.len());
    let mut groups = Groups::new(groups, pass.aggregate.aggr_expr())?;
    while let Some(batch) = right.next().await {
        let batch = batch?;
        let _timer = time.timer();
        left.update(&mut groups, &batch)?;
    }
    Ok(groups)
}

impl DisplayAs for BroadcastAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self
            .pass
            .aggregate
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| e.to_string())
            .collect();
        let aggregates: Vec<&str> = self
            .pass
            .aggregate
            .aggr_expr()
            .iter()
            .map(|a| a.name())
            .collect();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "BroadcastAggregateExec: mode={:?}, gby=[{}], aggr=[{}]",
                    self.pass.aggregate.mode(),
                    keys.join(", "),
                    aggregates.join(", ")
                )?;
                if self.merges() {
                    let partitions = self.right.output_partitioning().partition_count();
                    write!(f, ", merging {partitions} partitions")?;
                }
                if !self.pass.steps.is_empty() {
                    let steps: Vec<String> =
                        self.pass.steps.iter().map(|s| s.to_string()).collect();
                    write!(f, ", per joined batch: [{}]", steps.join(", "))?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "gby={}", keys.join(", ")),
        }
    }
}

impl ExecutionPlan for BroadcastAggregateExec {
    kit::own_properties!();
    kit::own_metrics!();

    fn name(&self) -> &str {
        "BroadcastAggregateExec"
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left, &self.right]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![
            Distribution::SinglePartition,
            Distribution::UnspecifiedDistribution,
        ]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let steps = self.pass.steps.iter().flat_map(|s| match s {
            Step::Project(exprs, _) => exprs.clone(),
            Step::Filter(p) => vec![Arc::clone(p)],
        });
        let aggregates = self
            .pass
            .aggregate
            .aggr_expr()
            .iter()
            .flat_map(|a| a.expressions());
        let filters = self.pass.aggregate.filter_expr().iter().flatten().cloned();
        for e in steps.chain(aggregates).chain(filters) {
            if f(&e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 2]>::try_from(children) {
            Ok([left, right]) => Ok(Arc::new(Self::new(
                Arc::clone(&self.pass),
                left,
                right,
                Arc::clone(&self.properties),
            ))),
            Err(_) => internal_err!("BroadcastAggregateExec has two children"),
        }
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&self.pass),
            Arc::clone(&self.left),
            Arc::clone(&self.right),
            Arc::clone(&self.properties),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let left = self.left(&context);
        // The right partitions this output reads: all of them where it
        // merges a final aggregate.
        let partitions = match self.merges() {
            true => (0..self.right.output_partitioning().partition_count()).collect(),
            false => vec![partition],
        };
        let mut streams = partitions
            .into_iter()
            .map(|p| self.right.execute(p, Arc::clone(&context)))
            .collect::<Result<Vec<_>>>()?;
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let pass = Arc::clone(&self.pass);
        let output = async move {
            let left = left.await.map_err(DataFusionError::Shared)?;
            let time = metrics.elapsed_compute().clone();
            let groups = match streams.len() {
                1 => accumulate(&pass, &left, streams.remove(0), &time).await?,
                _ => {
                    // each right partition on its own task, merged after
                    let tasks: Vec<_> = streams
                        .into_iter()
                        .map(|stream| {
                            let (pass, left, time) =
                                (Arc::clone(&pass), Arc::clone(&left), time.clone());
                            SpawnedTask::spawn(async move {
                                accumulate(&pass, &left, stream, &time).await
                            })
                        })
                        .collect();
                    let mut merged: Option<Groups> = None;
                    for task in tasks {
                        let groups = task
                            .join_unwind()
                            .await
                            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
                        merged = Some(match merged {
                            Some(merged) => merged.merge(groups)?,
                            None => groups,
                        });
                    }
                    merged.expect("a right partition")
                }
            };
            let batch = pass.finish(&left, groups)?;
            metrics.record_output(batch.num_rows());
            metrics.done();
            Ok(batch)
        };
        let stream =
            futures::stream::once(output).try_filter(|b| std::future::ready(b.num_rows() > 0));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}
