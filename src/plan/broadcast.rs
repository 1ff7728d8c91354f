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

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{
    new_empty_array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Accumulator, EmitTo};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::group_values::new_group_values;
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateInputMode, AggregateOutputMode,
};
use datafusion::physical_plan::filter::{batch_filter, FilterExec};
use datafusion::physical_plan::joins::CrossJoinExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, InputOrderMode,
    PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use crate::options::GradOptions;

/// The physical optimizer rule that installs [`BroadcastAggregateExec`]
/// (registered by [`crate::register`]; runs after DataFusion's rules; off
/// with `SET datafusion_grad.broadcast_aggregate = false`).
#[derive(Debug, Default)]
pub struct BroadcastAggregate;

impl PhysicalOptimizerRule for BroadcastAggregate {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = config
            .extensions
            .get::<GradOptions>()
            .is_none_or(|o| o.broadcast_aggregate);
        if !enabled {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            Ok(match BroadcastAggregateExec::try_from_plan(&node)? {
                Some(exec) => Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "broadcast_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
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

/// The left side, collected once per execution and shared by all output
/// partitions, with its rows grouped by the aggregate's keys.
#[derive(Debug)]
struct Left {
    batch: RecordBatch,
    /// The group of each left row.
    group_of: Vec<usize>,
    /// The key columns, one row per group, as DataFusion's own grouping
    /// emits them (e.g. `-0.0` folded into `0.0`).
    keys: Vec<ArrayRef>,
}

type SharedLeft = Shared<BoxFuture<'static, std::result::Result<Arc<Left>, Arc<DataFusionError>>>>;

/// What every partition of a [`BroadcastAggregateExec`] computes, apart
/// from its inputs.
#[derive(Debug)]
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
    /// The left side of the current execution (reset by `reset_state`).
    left_data: Mutex<Option<SharedLeft>>,
    metrics: ExecutionPlanMetricsSet,
}

impl BroadcastAggregateExec {
    /// `Some` when `plan` is an aggregate this operator can replace.
    fn try_from_plan(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let Some(aggregate) = plan.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        let group_by = aggregate.group_expr();
        let plain = group_by.is_single()
            && !group_by.is_empty()
            && aggregate.mode().input_mode() == AggregateInputMode::Raw
            && aggregate.limit_options().is_none()
            && aggregate.dynamic_expressions_produced().is_empty()
            && *aggregate.input_order_mode() == InputOrderMode::Linear
            && aggregate.properties().output_ordering().is_none()
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
        let join = loop {
            if let Some(join) = node.downcast_ref::<CrossJoinExec>() {
                break join;
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
        Ok(Some(Self::new(
            Arc::new(pass),
            Arc::clone(join.left()),
            Arc::clone(join.right()),
        )))
    }

    fn new(pass: Arc<Pass>, left: Arc<dyn ExecutionPlan>, right: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            pass,
            left,
            right,
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
                Ok(Arc::new(Left::new(batch, &pass.keys, &pass.key_schema)?))
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
    fn new(batch: RecordBatch, keys: &[usize], key_schema: &SchemaRef) -> Result<Self> {
        let columns: Vec<ArrayRef> = keys.iter().map(|&k| Arc::clone(batch.column(k))).collect();
        let mut groups = new_group_values(Arc::clone(key_schema), &GroupOrdering::None)?;
        let mut group_of = vec![];
        groups.intern(&columns, &mut group_of)?;
        let keys = groups.emit(EmitTo::All)?;
        Ok(Self {
            batch,
            group_of,
            keys,
        })
    }

    /// Left row `row` joined with every row of `right`.
    fn join(&self, row: usize, right: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
        let rows = right.num_rows();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for column in self.batch.columns() {
            columns.push(ScalarValue::try_from_array(column, row)?.to_array_of_size(rows)?);
        }
        columns.extend(right.columns().iter().cloned());
        batch_of(Arc::clone(schema), columns, rows)
    }
}

/// One output partition's accumulators: per group, one per aggregate.
struct Groups {
    accumulators: Vec<Vec<Box<dyn Accumulator>>>,
    seen: Vec<bool>,
}

impl Groups {
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
    /// Feeds `right` joined with each left row into that row's group.
    fn update(&self, left: &Left, groups: &mut Groups, right: &RecordBatch) -> Result<()> {
        if right.num_rows() == 0 {
            return Ok(());
        }
        let filters = self.aggregate.filter_expr();
        for row in 0..left.batch.num_rows() {
            let mut batch = left.join(row, right, &self.join_schema)?;
            for step in &self.steps {
                batch = step.apply(batch)?;
            }
            if batch.num_rows() == 0 {
                continue;
            }
            let group = left.group_of[row];
            groups.seen[group] = true;
            for ((accumulator, arguments), filter) in groups.accumulators[group]
                .iter_mut()
                .zip(&self.arguments)
                .zip(filters)
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
    fn name(&self) -> &str {
        "BroadcastAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.pass.aggregate.properties()
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
            Ok([left, right]) => Ok(Arc::new(Self::new(Arc::clone(&self.pass), left, right))),
            Err(_) => internal_err!("BroadcastAggregateExec has two children"),
        }
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&self.pass),
            Arc::clone(&self.left),
            Arc::clone(&self.right),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let left = self.left(&context);
        let mut right = self.right.execute(partition, context)?;
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let pass = Arc::clone(&self.pass);
        let output = async move {
            let left = left.await.map_err(DataFusionError::Shared)?;
            let groups = left.keys.first().map_or(0, |k| k.len());
            let mut groups = Groups::new(groups, pass.aggregate.aggr_expr())?;
            while let Some(batch) = right.next().await {
                let batch = batch?;
                let _timer = metrics.elapsed_compute().timer();
                pass.update(&left, &mut groups, &batch)?;
            }
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

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
